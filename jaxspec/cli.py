"""`jaxspec <command>`: each command registers its own subparser in COMMANDS, so new ones are one entry.

A failure (bad input, a missing or corrupt file, a download that did not happen) prints one line to stderr,
`jaxspec <command>: error: <file>: <problem>`, and exits with status 1; `jaxspec --debug <command> ...` lets the
exception through with its traceback instead. Usage errors exit with status 2 (argparse).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from jaxspec import compile_cache
from jaxspec.presets import FetchError

# What a command's failure on bad input looks like (json.JSONDecodeError is a ValueError, FileNotFoundError an
# OSError); anything else is a bug and keeps its traceback.
FAILURES = (ValueError, OSError, FetchError)


def _convert(args: argparse.Namespace) -> None:
    from jaxspec.convert.checkpoint import save_checkpoint
    from jaxspec.convert.gguf_llama import convert_gguf
    from jaxspec.convert.hf_llama import load_hf_llama

    src, dst = Path(args.src), Path(args.dst)
    if src.suffix == ".gguf":
        src = convert_gguf(src, args.hf_dir or dst.with_name(dst.name + "-hf"))
        print(f"wrote Hugging Face directory {src}")
    save_checkpoint(dst, *load_hf_llama(src, args.dtype))
    print(f"wrote jaxspec checkpoint {dst}")


def add_convert(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="HF Llama directory or GGUF file -> jaxspec checkpoint")
    p.add_argument("src", help="Hugging Face Llama directory or a .gguf file")
    p.add_argument("dst", help="jaxspec checkpoint directory to write")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--hf-dir", help="for a .gguf source: where to keep the HF directory (default DST-hf)")
    p.set_defaults(func=_convert)


def _fetch(args: argparse.Namespace) -> None:
    from jaxspec.presets import fetch_preset

    print(fetch_preset(args.preset, args.weights_dir))


def add_fetch(sub: argparse._SubParsersAction) -> None:
    from jaxspec.presets import DEFAULT_PRESET

    p = sub.add_parser("fetch", help="download and convert a preset model into <weights>/<preset>/")
    p.add_argument("preset", nargs="?", default=DEFAULT_PRESET)
    p.add_argument("--weights-dir", help="where converted weights go (default: $JAXSPEC_WEIGHTS_DIR, else weights/ "
                                         "in a checkout, ~/.cache/jaxspec/weights from an installed wheel)")
    p.set_defaults(func=_fetch)


def _bench_throughput(args: argparse.Namespace) -> None:
    from jaxspec.bench.throughput import run

    run(args)


def _bench_serve(args: argparse.Namespace) -> None:
    from jaxspec.bench.serve import run

    try:
        run(args)
    except RuntimeError as exc:  # a server that cannot serve: one line, as for bad input (main)
        raise ValueError(str(exc)) from None


def add_bench(sub: argparse._SubParsersAction) -> None:
    from jaxspec.bench import serve, throughput

    p = sub.add_parser("bench", help="benchmarks (throughput, serve: as `vllm bench throughput`, `vllm bench serve`)")
    bench_sub = p.add_subparsers(dest="bench", required=True)
    t = bench_sub.add_parser("throughput", help="offline throughput; --sweep: async x sync x EAGLE x prompt counts")
    throughput.add_arguments(t)
    t.set_defaults(func=_bench_throughput, command="bench throughput")
    s = bench_sub.add_parser("serve", help="online serving latency (TTFT, TPOT, ITL) against an OpenAI-compatible "
                                           "server, Poisson arrivals")
    serve.add_arguments(s)
    s.set_defaults(func=_bench_serve, command="bench serve")


def _train_eagle(args: argparse.Namespace) -> None:
    from jaxspec.train.command import train_from_args

    train_from_args(args)


def add_train_eagle(sub: argparse._SubParsersAction) -> None:
    from jaxspec.train import magpie

    p = sub.add_parser("train-eagle", help="train an EAGLE-1/EAGLE-3 draft head on the model's own answers")
    p.add_argument("--model", required=True, help="jaxspec checkpoint, HF Llama directory or preset name")
    p.add_argument("--method", default="eagle3", choices=["eagle", "eagle3"])
    p.add_argument("--data", action="append", default=[],
                   help="JSONL prompts (prompt/question/turns), or self:N for N prompts the model writes itself "
                   "(Magpie, see make-prompts); repeatable, deduplicated together")
    p.add_argument("--num-prompts", type=int, default=None, help="first N prompts of the files (default all)")
    p.add_argument("--prompts-out", help="with --data self:N: directory for its train / held-out prompt files "
                   "(reused when it already holds them)")
    p.add_argument("--max-tokens", type=int, default=512, help="longest regenerated answer")
    p.add_argument("--seq-len", type=int, default=512, help="training row length (prompt + answer, padded)")
    p.add_argument("--dataset-cache", help=".npz of the token dataset: loaded if it exists, else written")
    p.add_argument("--gen-batch", type=int, default=256, help="max_num_seqs of the engine while regenerating")
    p.add_argument("--gen-time-budget-s", type=float, default=None,
                   help="wall-clock seconds for regenerating answers: prompts that no longer fit are left out")
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup-steps", type=int, default=None, help="default 5%% of --steps")
    p.add_argument("--ttt-steps", type=int, default=None, help="unrolled head steps (default 1 eagle, 7 eagle3)")
    p.add_argument("--noise", type=float, default=None,
                   help="width of the uniform noise on the target's features (default 0.2 eagle, 0 eagle3)")
    p.add_argument("--soft-labels", action="store_true",
                   help="EAGLE-3: cross-entropy against the target's distribution over the draft vocabulary (the "
                   "EAGLE-3 reference trainer's and SpecForge's loss), not its greedy token; EAGLE-1's always is")
    p.add_argument("--draft-vocab-size", type=int, default=32000, help="EAGLE-3 draft vocabulary")
    p.add_argument("--aux-layers", help="EAGLE-3 feature layers (inputs of), e.g. 2,15,27 (default 2,L//2,L-3)")
    p.add_argument("--target-dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--compute-dtype", default="bfloat16", choices=["float32", "bfloat16"],
                   help="the head's matmuls (parameters and optimizer stay fp32)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"], help="dtype of the exported head")
    p.add_argument("--out", help="directory for the exported head (config.json, model.safetensors); required "
                   "unless --data-only")
    p.add_argument("--data-only", action="store_true",
                   help="only regenerate the data into --dataset-cache (e.g. once, before training heads in parallel)")
    p.add_argument("--init-from", help="an earlier head (directory or shipped name) to fine-tune instead of a fresh "
                   "one: same method and shapes; EAGLE-3 draft vocabularies are matched by token")
    p.add_argument("--ckpt-dir", help="orbax checkpoints of the training state")
    p.add_argument("--ckpt-every", type=int, default=1000)
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --ckpt-dir")
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="wall-clock seconds for the training loop: the schedule shrinks to the steps that fit")
    p.add_argument("--seed", type=int, default=0)
    compile_cache.add_argument(p)
    magpie.add_arguments(p)
    p.set_defaults(func=_train_eagle)


def add_make_prompts(sub: argparse._SubParsersAction) -> None:
    from jaxspec.train import magpie

    p = sub.add_parser("make-prompts", help="have a chat model write user prompts itself (Magpie), screened, with "
                       "a held-out split")
    p.add_argument("--model", required=True, help="jaxspec checkpoint, HF Llama directory or preset name")
    p.add_argument("--num-prompts", type=int, required=True, help="prompts to keep (train + held out)")
    p.add_argument("--out", required=True, help="directory for train.jsonl, held_out.jsonl and meta.json")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gen-batch", type=int, default=256, help="max_num_seqs of the engine")
    p.add_argument("--target-dtype", default="bfloat16", choices=["float32", "bfloat16"])
    magpie.add_arguments(p)
    p.set_defaults(func=magpie.run)


def add_serve(sub: argparse._SubParsersAction) -> None:
    from jaxspec.serve import cli

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (as `vllm serve`)")
    cli.add_arguments(p)
    p.set_defaults(func=cli.run)


def add_generate(sub: argparse._SubParsersAction) -> None:
    from jaxspec import generate

    p = sub.add_parser("generate", help="chat with a model (default: the embedded preset and its EAGLE head)")
    generate.add_arguments(p)
    p.set_defaults(func=generate.run)


# Subcommand name -> function that registers its parser (and sets `func`).
COMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "generate": add_generate,
    "convert": add_convert,
    "fetch": add_fetch,
    "train-eagle": add_train_eagle,
    "make-prompts": add_make_prompts,
    "bench": add_bench,
    "serve": add_serve,
}


def describe(e: BaseException) -> str:
    """One line: the file and the problem (an OSError's own text puts the file last)."""
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        text = f"{e.filename}: {e.strerror}" + (f" (and {e.filename2})" if e.filename2 else "")
    else:
        text = str(e) or type(e).__name__
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="jaxspec", epilog="On a failure: one line 'jaxspec COMMAND: error: FILE: "
                                     "PROBLEM' on stderr and exit status 1 (2 for a usage error).")
    parser.add_argument("--debug", action="store_true", help="show a failure's full traceback instead of one line")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS.values():
        add(sub)
    args = parser.parse_args(argv)
    if args.debug:
        args.func(args)
        return
    try:
        args.func(args)
    except FAILURES as e:
        print(f"jaxspec {args.command}: error: {describe(e)}", file=sys.stderr)
        raise SystemExit(1) from None
