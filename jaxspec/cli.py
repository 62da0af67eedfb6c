"""`jaxspec <command>`: each command registers its own subparser in COMMANDS, so new ones are one entry."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


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

    print(fetch_preset(args.preset))


def add_fetch(sub: argparse._SubParsersAction) -> None:
    from jaxspec.presets import DEFAULT_PRESET

    p = sub.add_parser("fetch", help="download and convert a preset model into weights/<preset>/")
    p.add_argument("preset", nargs="?", default=DEFAULT_PRESET)
    p.set_defaults(func=_fetch)


def _bench_throughput(args: argparse.Namespace) -> None:
    from jaxspec.bench.throughput import run

    run(args)


def add_bench(sub: argparse._SubParsersAction) -> None:
    from jaxspec.bench.throughput import add_arguments

    p = sub.add_parser("bench", help="benchmarks (throughput: as `vllm bench throughput`)")
    bench_sub = p.add_subparsers(dest="bench", required=True)
    t = bench_sub.add_parser("throughput", help="offline throughput; --sweep: async x sync x EAGLE x prompt counts")
    add_arguments(t)
    t.set_defaults(func=_bench_throughput)


# Subcommand name -> function that registers its parser (and sets `func`).
COMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "convert": add_convert,
    "fetch": add_fetch,
    "bench": add_bench,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="jaxspec")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS.values():
        add(sub)
    args = parser.parse_args(argv)
    args.func(args)
