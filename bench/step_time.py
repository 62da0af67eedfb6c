"""Decode-step time against the roofline floor, at fixed batch sizes and context length.

    python bench/step_time.py --hf-config llama-3-8b --batches 1,2,4,8,16,32 --context 512

Random weights of the given shape (bf16), every slot at `--context` tokens, plain decoding (k = 0) or the fused
verify+draft step with an EAGLE-1 head (`--k`). `--sampling` gives every row the same SamplingParams (JSON, e.g.
'{"logprobs": 5, "presence_penalty": 0.5}'), so the step runs the variant such a batch runs (default greedy).
Steps are dispatched back to back (the engine's async mode keeps the device this busy), each output read once the
next dispatch is queued as the engine reads it, and timed over `--iters` after a warm-up. The floor is the
throughput roofline's (jaxspec/bench/report.py), the larger of the bytes a step reads (every weight it multiplies
by, not the embedding table: a lookup reads B rows; every cached K/V once) over the measured copy bandwidth and the
FLOPs it computes over the measured bf16 matmul rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxspec.bench.data import load_hf_config  # noqa: E402
from jaxspec.bench.engine import (decode_step_time, dispatch_breakdown, env_knobs, step_costs,  # noqa: E402
                                  timing_rounds)
from jaxspec.bench.report import floors, measure_bandwidth, measure_matmul, step_bytes, step_flops  # noqa: E402
from jaxspec.config import EngineConfig, SpeculativeConfig  # noqa: E402
from jaxspec.engine.model_runner import ModelRunner  # noqa: E402
from jaxspec.models import eagle, llama  # noqa: E402
from jaxspec.models.kernel_config import KernelConfig  # noqa: E402
from jaxspec.sampling_params import SamplingParams  # noqa: E402


def time_batch(cfg: llama.Config, w, dcfg, dw, B: int, context: int, k: int, iters: int,
               max_model_len: int | None = None, pool_scale: float = 1.0, profile_dir: str | None = None,
               page_size: int = 16, sampling: SamplingParams | None = None, num_steps: int = 1,
               breakdown: bool = False) -> dict:
    # each timing call starts every row at `context` again: the most steps one runs (decode_step_time's rounds;
    # the breakdown's three dispatches a round)
    steps = max(sum(timing_rounds(iters, num_steps)) * num_steps, 3 * (iters + 2) * num_steps if breakdown else 0)
    need = context + steps * (k + 1) + 2 * k + 16
    ec = EngineConfig(max_model_len=max(need, max_model_len or 0), max_num_seqs=B, page_size=page_size,
                      decode_buckets=[B], prefill_buckets=[16], max_num_batched_tokens=16,
                      speculative=SpeculativeConfig("eagle", "-", k) if k else None, num_scheduler_steps=num_steps)
    ec.num_pages = int(B * ec.pages_per_seq * pool_scale)
    runner = ModelRunner(ec, cfg, w, dcfg, dw)
    for slot in range(B):  # every row's params; the processor state stays the initial one (timing only)
        runner.sampling.set(slot, sampling or SamplingParams(temperature=0.0), slot, context // 2)
    multi = num_steps > 1
    timing = decode_step_time(runner, B, context, iters, multi)
    parts = dispatch_breakdown(runner, B, context, iters, multi) if breakdown else None
    kernels = profile_steps(runner, B, context, iters, profile_dir, multi) if profile_dir else None
    costs = step_costs(cfg, w, dcfg, dw, k)
    mean_context = context + iters * (k + 1) / 2  # iters steps, whatever the steps a dispatch
    # per step: a dispatch of num_steps steps counts num_steps times
    return {"batch": B, "k": k, "context": context, "num_steps": num_steps, "pool_pages": ec.num_pages,
            "step_s": timing.pipelined_s / num_steps, "step_blocking_s": timing.blocking_s / num_steps,
            "dispatch_s": timing.dispatch_s, "busy_dispatch_s": timing.busy_dispatch_s,
            "dispatch_breakdown_ms": parts,
            "bytes": step_bytes(costs, B, mean_context), "flops": step_flops(costs, B, mean_context),
            "kernels_per_step": kernels}


def profile_steps(runner, B: int, context: int, iters: int, log_dir: str, multi: bool = False,
                  top: int = 25) -> list[dict]:
    """Device time per step by kernel name, from a jax.profiler trace of the pipelined steps."""
    from jaxspec.bench.profile import find_trace, kernel_totals, load_trace

    with jax.profiler.trace(log_dir):
        steps = decode_step_time(runner, B, context, iters, multi).num_steps * runner.cfg.num_scheduler_steps
    totals = kernel_totals(load_trace(find_trace(log_dir)))
    rows = [r | {"count": r["count"] / steps, "ms": r["ms"] / steps} for r in totals]
    print(f"B={B}: device ms per step {sum(r['ms'] for r in rows):.3f}, by kernel:")
    for r in rows[:top]:
        print(f"  {r['ms']:8.3f} ms  x{r['count']:5.1f}  {r['name'][:110]}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf-config", default="llama-3-8b", help="a config.json path or a built-in name")
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--k", type=int, default=0, help="speculative tokens (an EAGLE-1 head shaped like one layer)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--attn-impl", default="auto", help="auto (pallas on GPU, xla elsewhere), xla, pallas")
    ap.add_argument("--layer-loop", default="auto", help="auto (unroll on GPU, scan elsewhere), unroll, scan")
    ap.add_argument("--max-model-len", type=int, help="block-table width as the engine would size it "
                                                        "(default: just what the timed steps need)")
    ap.add_argument("--page-size", type=int, default=16, help="tokens per KV-cache page")
    ap.add_argument("--pool-scale", type=float, default=1.0,
                    help="KV pool size as a multiple of what the batch needs (the engine's pool is larger)")
    ap.add_argument("--pallas-programs", type=int, help="override KernelConfig.attn_programs (the kernel's "
                                                          "table splits), to compare settings")
    ap.add_argument("--profile-dir", help="also trace --iters pipelined steps at the first batch size and print "
                                          "device time per step by kernel")
    ap.add_argument("--sampling", type=json.loads, default={"temperature": 0.0},
                    help="SamplingParams of every row, as JSON (default greedy)")
    ap.add_argument("--num-steps", type=int, default=1,
                    help="decode steps per dispatch (multi-step decoding, no row stops); times are per step")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time the parts of one dispatch (host arrays, copy, launch, JAX's argument floor)")
    ap.add_argument("--output-json")
    args = ap.parse_args()
    sampling = SamplingParams(**({"temperature": 0.0} | args.sampling))

    kernel = KernelConfig.from_env()
    if args.pallas_programs:
        kernel = dataclasses.replace(kernel, attn_programs=args.pallas_programs)
    gpu = jax.default_backend() == "gpu"
    cfg = llama.Config.from_hf(load_hf_config(args.hf_config)[1], dtype=args.dtype).replace(
        attn_impl=("pallas" if gpu else "xla") if args.attn_impl == "auto" else args.attn_impl, kernel=kernel,
        layer_loop=("unroll" if gpu else "scan") if args.layer_loop == "auto" else args.layer_loop)
    w = llama.init(cfg, jax.random.key(0))
    dcfg = dw = None
    if args.k:
        dcfg = eagle.EagleConfig.from_target(cfg, "eagle")
        dw = eagle.init(dcfg, jax.random.key(1))
    bw, mm = measure_bandwidth(), measure_matmul()
    rows = []
    for i, B in enumerate(int(b) for b in args.batches.split(",")):
        r = time_batch(cfg, w, dcfg, dw, B, args.context, args.k, args.iters, args.max_model_len,
                       args.pool_scale, args.profile_dir if i == 0 else None, args.page_size, sampling,
                       args.num_steps, args.breakdown)
        r |= floors(r["bytes"], r["flops"], bw["tb_s"], mm["tflop_s"])
        r["over_floor"] = r["step_s"] * 1e3 / r["floor_ms"]
        rows.append(r)
        print(f"B={B:4d} k={args.k} step {r['step_s'] * 1e3:7.3f} ms (blocking {r['step_blocking_s'] * 1e3:7.3f}, "
              f"dispatch {r['dispatch_s'] * 1e3:6.3f}, while busy {r['busy_dispatch_s'] * 1e3:6.3f})  "
              f"floor {r['floor_ms']:7.3f} ms (bytes "
              f"{r['bytes_floor_ms']:.3f}, FLOPs {r['flops_floor_ms']:.3f}: {r['bound']})  x{r['over_floor']:.2f}",
              flush=True)
        if r["dispatch_breakdown_ms"]:
            print("       dispatch parts (ms, median): " + ", ".join(f"{name} {ms:.3f}"
                                                                  for name, ms in r["dispatch_breakdown_ms"].items()),
                  flush=True)
    result = {"machine": jax.devices()[0].device_kind, "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(sys.argv), "layer_loop": cfg.layer_loop, "attn_impl": cfg.attn_impl,
              "sampling": args.sampling,
              "kernel": dataclasses.asdict(kernel), "pool_scale": args.pool_scale, "page_size": args.page_size,
              "env": env_knobs(), "bandwidth": bw, "matmul": mm, "rows": rows}
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
