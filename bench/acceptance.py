"""A draft head's mean acceptance length on held-out prompts (greedy), with per-position acceptance.

    python bench/acceptance.py --model smollm2-135m-instruct --dataset gsm8k_test.jsonl --num-prompts 200 \
        --speculative-config '{"method": "eagle3", "model": "weights/eagle3-smollm2-135m-instruct", \
                               "num_speculative_tokens": 3}' --max-tokens 256
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxspec import LLM, SamplingParams, compile_cache  # noqa: E402
from jaxspec.bench.data import dataset_prompts  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="preset name, a preset's weights directory, jaxspec checkpoint or HF Llama directory")
    ap.add_argument("--speculative-config", required=True, help="JSON: method, model, num_speculative_tokens")
    ap.add_argument("--dataset-path", "--dataset", dest="dataset", required=True,
                    help="JSONL with question / prompt / turns / messages")
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--layer-loop", default="auto", help="LLM layer_loop: auto (unroll on GPU), unroll, scan")
    ap.add_argument("--decode-buckets", help="comma-separated padded batch sizes to compile (default: powers of 2)")
    ap.add_argument("--output-json")
    compile_cache.add_argument(ap)
    args = ap.parse_args(argv)

    spec = json.loads(args.speculative_config)
    buckets = [int(b) for b in args.decode_buckets.split(",")] if args.decode_buckets else None
    llm = LLM(args.model, speculative_config=spec, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
              layer_loop=args.layer_loop, decode_buckets=buckets, warmup=False,
              compilation_cache_dir=args.compilation_cache_dir)
    prompts = dataset_prompts(args.dataset, args.num_prompts, llm.tokenizer)
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=args.max_tokens), use_tqdm=False)
    elapsed = time.perf_counter() - start
    m = llm.get_metrics()
    result = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "speculative_config": spec,
              "num_prompts": len(prompts), "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
              "wall_s": elapsed, **{k: m[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens",
                                                       "acceptance_rate_per_position", "mean_acceptance_length")}}
    print(f"{spec['method']} k={spec['num_speculative_tokens']} on {len(prompts)} prompts: mean acceptance length "
          f"{result['mean_acceptance_length']:.3f}, per position "
          f"{[round(r, 3) for r in result['acceptance_rate_per_position']]}")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
