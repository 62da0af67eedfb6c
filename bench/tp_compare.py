"""Tensor parallelism on one host: decode step time and generation tokens/s at several TP degrees.

    python bench/tp_compare.py --hf-config llama-3-8b --tp 1,2 --batches 1,32 --num-prompts 64

Random weights of the given shape (`LLM(load_format="dummy")`, bf16; the same weights at every degree), plain
decoding, or with `--k` an EAGLE-1 head shaped like one layer at `--synthetic-acceptance` (drafts accepted at that
rate, all the work still done). Per degree: the decode step at each batch with every slot at `--context` tokens,
dispatched back to back (the async engine keeps the device this busy); then greedy `generate` of `--num-prompts`
random prompts (`--input-len` in, `--max-tokens` out, EOS ignored), timed after an untimed run. One JSON line each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxspec import LLM, SamplingParams, parallel  # noqa: E402
from jaxspec.bench.data import load_hf_config  # noqa: E402
from jaxspec.bench.engine import decode_step_time  # noqa: E402
from jaxspec.models import llama  # noqa: E402


def step_time(llm: LLM, B: int, context: int, iters: int) -> float:
    """Seconds per decode step at batch B, every slot at `context` tokens, steps dispatched back to back."""
    return decode_step_time(llm.llm_engine.runner, B, context, iters).pipelined_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf-config", default="llama-3-8b", help="a config.json path or a built-in name")
    ap.add_argument("--tp", default="1,2", help="tensor-parallel degrees to compare")
    ap.add_argument("--batches", default="1,32", help="batch sizes for the decode step time")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--k", type=int, default=0, help="speculative tokens (a random EAGLE-1 head)")
    ap.add_argument("--synthetic-acceptance", type=float, default=0.7)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--layer-loop", default="auto", help="LLM layer_loop: auto (unroll on GPU), unroll, scan")
    args = ap.parse_args()

    batches = [int(b) for b in args.batches.split(",")]
    label, hf = load_hf_config(args.hf_config)
    cfg = llama.Config.from_hf(hf, dtype=args.dtype, source=label)
    max_num_seqs = max(batches + [args.num_prompts])
    max_model_len = max(args.context + (args.iters + 8) * (args.k + 1), args.input_len + args.max_tokens) + 64
    extra = {}
    if args.k:
        extra = dict(speculative_config={"method": "eagle", "model": "-", "num_speculative_tokens": args.k},
                     synthetic_acceptance=args.synthetic_acceptance)
    prompts = np.random.default_rng(0).integers(0, hf["vocab_size"], (args.num_prompts, args.input_len)).tolist()
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    for tp in [int(t) for t in args.tp.split(",")]:
        t0 = time.perf_counter()
        llm = LLM.from_weights(cfg, None, load_format="dummy", tensor_parallel_size=tp, max_model_len=max_model_len,
                               max_num_seqs=max_num_seqs, max_num_batched_tokens=2048,
                               decode_buckets=sorted(set(batches + [max_num_seqs])), prefill_buckets=[256, 2048],
                               warmup=False, layer_loop=args.layer_loop, **extra)
        row = {"model": label, "tp": tp, "k": args.k, "devices": [d.device_kind for d in jax.devices()[:tp]],
               "attn_impl": llm.model_config.attn_impl,
               "layer_loop": llm.model_config.layer_loop, "xla_flags": os.environ.get("XLA_FLAGS", ""),
               "num_pages": llm.engine_config.num_pages,
               "weight_bytes_per_device": parallel.bytes_per_device(llama.abstract(llm.model_config), tp),
               "build_s": round(time.perf_counter() - t0, 1)}
        for B in batches:
            row[f"step_ms_b{B}_ctx{args.context}"] = round(step_time(llm, B, args.context, args.iters) * 1e3, 3)
        llm.generate(prompts, params, use_tqdm=False)  # compiles what generation uses
        before = llm.stats()
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        after = llm.stats()
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        steps = after["num_steps"] - before["num_steps"]
        row |= {"prompts": args.num_prompts, "output_tokens": tokens, "wall_s": round(wall, 3),
                "tokens_per_s": round(tokens / wall, 1), "engine_steps": steps,
                "ms_per_engine_step": round(wall / steps * 1e3, 3)}
        print(json.dumps(row), flush=True)
        del llm


if __name__ == "__main__":
    main()
