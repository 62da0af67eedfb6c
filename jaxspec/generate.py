"""`jaxspec generate`: chat with a model (by default the embedded preset and its shipped EAGLE head, if any) and
report its steady-state throughput and, with a head, its acceptance length.

Honest on a first run: before anything is timed it compiles exactly the programs the run uses (the decode buckets
the batch passes through as requests finish, one prefill bucket that holds every prompt, in the run's sampling
mode), prints that compile time on its own line, and launches each once in a short untimed warm-up; the timed
run then compiles nothing (a warning says so if it ever does). With the persistent compilation cache a second run
loads those programs from disk.
"""

from __future__ import annotations

import argparse
import time

from jaxspec.json_config import read_json_arg

# GSM8K-style questions of our own (the README's command must run without ../shared/data)
EXAMPLE_PROMPTS = [
    "A baker makes 24 muffins and sells them in boxes of 4. Each box costs $6. How much money does he make?",
    "Tom reads 15 pages a day. How many days does he need to finish a 240-page book?",
    "A train travels at 80 km/h for 3 hours and then at 60 km/h for 2 hours. How far does it go in total?",
    "Sara has 3 times as many marbles as Ben. Together they have 48 marbles. How many does Sara have?",
]
WARMUP_TOKENS = 4  # per request and step of the stagger: enough to launch every program once


def head_config(args: argparse.Namespace) -> dict | None:
    """The speculative config: --speculative-config, else the preset's shipped head, else none."""
    if args.no_spec:
        return None
    if args.speculative_config:
        return read_json_arg(args.speculative_config, "--speculative-config")
    from jaxspec.resolve import resolve_model
    return resolve_model(args.model).head


def chat_prompts(model: str, prompts: list[str]) -> list[list[int]]:
    """Each user message through the model's chat template, as `LLM.chat` formats it."""
    from jaxspec.chat import encode_chat
    from jaxspec.tokenizer import load_tokenizer
    from jaxspec.resolve import resolve_model

    tokenizer = load_tokenizer(resolve_model(model).weights)
    if tokenizer is None:
        raise ValueError(f"--model {model}: no tokenizer, so text prompts cannot be encoded")
    return [encode_chat(tokenizer, [{"role": "user", "content": p}]) for p in prompts]


def run(args: argparse.Namespace) -> dict:
    from jaxspec import LLM, SamplingParams, compile_cache
    from jaxspec.bench.engine import compile_buckets, num_compiled
    from jaxspec.engine.llm_engine import metrics_delta
    from jaxspec.config import buckets_up_to
    from jaxspec.engine import sampler

    cache = compile_cache.configure(args.compilation_cache_dir)
    spec = head_config(args)
    texts = args.prompt or EXAMPLE_PROMPTS
    prompts = chat_prompts(args.model, texts)
    n = len(prompts)
    prefill = -(-sum(map(len, prompts)) // 16) * 16  # every prefill step fits one bucket of all prompt tokens
    llm = LLM(args.model, speculative_config=spec, max_model_len=args.max_model_len, max_num_seqs=n,
              max_num_batched_tokens=prefill, max_prefill_seqs=n, decode_buckets=buckets_up_to(n),
              prefill_buckets=[prefill], warmup=False, compilation_cache_dir=args.compilation_cache_dir)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    mode = sampler.batch_flags([params.temperature], [params.top_k], [params.top_p], llm.model_config.vocab_size)

    start = time.perf_counter()
    programs = compile_buckets(llm, *mode, log=lambda msg: print(msg, flush=True))
    compile_s = time.perf_counter() - start
    c = llm.engine_config
    print(f"compiled {programs} programs in {compile_s:.1f} s (decode buckets {c.decode_buckets}, prefill bucket "
          f"{prefill}, {'greedy' if mode[0] else 'sampling'}; compilation cache {cache or 'off'})", flush=True)
    compiled = num_compiled()
    # untimed: every request a different length, so the batch shrinks through each decode bucket once
    llm.generate([{"prompt_token_ids": p} for p in prompts],
                 [SamplingParams(temperature=args.temperature, max_tokens=WARMUP_TOKENS * (i + 1), ignore_eos=True,
                                 seed=args.seed) for i in range(n)], use_tqdm=False)

    before = llm.stats()
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    m = metrics_delta(before, llm.stats())
    recompiles = None if compiled is None else num_compiled() - compiled
    for text, out in zip(texts, outs):
        print(f"\n### {text}\n{out.outputs[0].text.strip()}  [{out.outputs[0].finish_reason}]")
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    print(f"\n{n} requests, {tokens} output tokens in {elapsed:.2f} s: {tokens / elapsed:.1f} output tokens/s "
          f"(steady state: compiled and warmed up beforehand)")
    if recompiles:
        print(f"WARNING: {recompiles} program(s) compiled after the warm-up: the figure above includes them")
    if spec is None:
        print("no draft head: plain decoding (pass --speculative-config to use one)")
    else:
        from jaxspec.config import NGRAM_METHODS, has_lookup_fallback  # imports jax: not at the module's import
        drafter = "ngram lookup" if spec["method"] in NGRAM_METHODS else f"{spec['method']} head"
        if has_lookup_fallback(spec):
            drafter += " + prompt lookup"
        print(f"{drafter}, k={spec['num_speculative_tokens']}: mean acceptance length "
              f"{m['mean_acceptance_length']:.2f}, per-position acceptance "
              f"{[round(r, 3) for r in m['acceptance_rate_per_position']]}")
    return {"compile_s": compile_s, "num_compiled": programs, "recompiles": recompiles, "output_tokens": tokens,
            "elapsed_s": elapsed, "output_tokens_per_s": tokens / elapsed,
            "mean_acceptance_length": m["mean_acceptance_length"] if spec else None}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from jaxspec import compile_cache
    from jaxspec.presets import DEFAULT_PRESET

    p.add_argument("--model", default=DEFAULT_PRESET,
                   help="preset name, a preset's weights directory, jaxspec checkpoint or HF Llama directory")
    p.add_argument("--speculative-config", help='JSON or a .json file, e.g. {"method": "eagle", "model": DIR, '
                                                '"num_speculative_tokens": 3}; default: the preset\'s head')
    p.add_argument("--no-spec", action="store_true", help="plain decoding even if the preset ships a head")
    p.add_argument("--prompt", action="append", help="a user message (repeatable); default: four math questions")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    compile_cache.add_argument(p)
