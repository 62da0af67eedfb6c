"""`jaxspec generate`: chat with a model (by default the embedded preset and its shipped EAGLE head, if any) and
report throughput and, with a head, its acceptance length."""

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


def head_config(args: argparse.Namespace) -> dict | None:
    """The speculative config: --speculative-config, else the preset's shipped head, else none."""
    if args.no_spec:
        return None
    if args.speculative_config:
        return read_json_arg(args.speculative_config, "--speculative-config")
    from jaxspec import presets
    if args.model in presets.list_presets():
        head = presets.load_preset(args.model).eagle
        if head:
            return {**head, "model": str(presets.ROOT / head["model"])}
    return None


def run(args: argparse.Namespace) -> None:
    from jaxspec import LLM, SamplingParams

    spec = head_config(args)
    llm = LLM(args.model, speculative_config=spec, max_model_len=args.max_model_len, warmup=False,
              max_num_seqs=max(len(args.prompt or EXAMPLE_PROMPTS), 1))
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    prompts = args.prompt or EXAMPLE_PROMPTS
    llm.chat([[{"role": "user", "content": p}] for p in prompts[:1]], SamplingParams(max_tokens=2),
             use_tqdm=False)  # compile outside the timed run
    before = llm.get_metrics()
    start = time.perf_counter()
    outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    for p, out in zip(prompts, outs):
        print(f"\n### {p}\n{out.outputs[0].text.strip()}  [{out.outputs[0].finish_reason}]")
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    print(f"\n{len(outs)} requests, {tokens} output tokens in {elapsed:.2f} s: {tokens / elapsed:.1f} output tokens/s")
    if spec is None:
        print("no draft head: plain decoding (pass --speculative-config to use one)")
        return
    m = llm.get_metrics()
    drafts = m["num_drafts"] - before["num_drafts"]
    accepted = m["num_accepted_tokens"] - before["num_accepted_tokens"]
    per_pos = [(a - b) / max(drafts, 1) for a, b in zip(m["accepted_per_position"], before["accepted_per_position"])]
    print(f"{spec['method']} head, k={spec['num_speculative_tokens']}: mean acceptance length "
          f"{1 + accepted / max(drafts, 1):.2f}, per-position acceptance {[round(r, 3) for r in per_pos]}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from jaxspec.presets import DEFAULT_PRESET

    p.add_argument("--model", default=DEFAULT_PRESET, help="preset name, jaxspec checkpoint or HF Llama directory")
    p.add_argument("--speculative-config", help='JSON or a .json file, e.g. {"method": "eagle", "model": DIR, '
                                                '"num_speculative_tokens": 3}; default: the preset\'s head')
    p.add_argument("--no-spec", action="store_true", help="plain decoding even if the preset ships a head")
    p.add_argument("--prompt", action="append", help="a user message (repeatable); default: four math questions")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
