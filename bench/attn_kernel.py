"""Paged attention kernels on the verify step's shapes: JAX's one-query kernel (a sequence's T queries run as T
sequences, each re-reading the context) against jaxspec's kernel (all T queries of a sequence in one program).

    python bench/attn_kernel.py --hf-config llama-3-8b --batches 24,96 --t 3 --context 640

Times one layer's attention (median of --iters after a warm-up) and reports the KV bytes each reads over that
time: the context is read T times by the first and once by the second.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxspec.bench.data import load_hf_config  # noqa: E402
from jaxspec.models import attention, llama, paged_kernel  # noqa: E402


def median_time(f, *args, iters: int) -> float:
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf-config", default="llama-3-8b")
    ap.add_argument("--batches", default="24,96")
    ap.add_argument("--t", type=int, default=3, help="queries per sequence (k + 1 in verify)")
    ap.add_argument("--context", type=int, default=640)
    ap.add_argument("--layers", type=int, default=4, help="layers in the pool (the kernel reads one)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--output-json")
    ap.add_argument("--interpret", action="store_true", help=argparse.SUPPRESS)  # CPU smoke test
    args = ap.parse_args()
    from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention as one_query

    cfg = llama.Config.from_hf(load_hf_config(args.hf_config)[1])
    H, kvh, D, S, T = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 16, args.t
    rows = []
    for B in map(int, args.batches.split(",")):
        pages = 1 << (-(-(args.context + T) // S) - 1).bit_length()
        rng = np.random.default_rng(0)
        pool = (kvh, args.layers * B * pages, S, D)
        k, v, q = (jax.random.normal(jax.random.key(i), shape, jnp.bfloat16)
                   for i, shape in enumerate((pool, pool, (B, T, H, D))))
        tables = jnp.asarray(rng.permutation(B * pages).reshape(B, pages), jnp.int32)
        q_pos = jnp.asarray(args.context + np.arange(T)[None].repeat(B, 0), jnp.int32)
        kv_bytes = B * (args.context + T) * 2 * kvh * D * 2
        per_block = min(8, pages)
        flat_splits = attention.pallas_splits(B * T, kvh, pages // per_block)
        ours_splits = attention.pallas_splits(B, kvh, pages // per_block)
        flat = jax.jit(lambda q, k, v, t, p: one_query(
            q.reshape(B * T, H, D), k, v, jnp.repeat(t, T, axis=0), (p.reshape(-1) + 1),
            pages_per_compute_block=per_block, k_splits=flat_splits, interpret=args.interpret))
        r = {"batch": B, "t": T, "context": args.context, "kv_bytes": kv_bytes,
             "one_query_s": median_time(flat, q, k, v, tables, q_pos, iters=args.iters)}
        for warps in (4, 8):
            ours = jax.jit(lambda q, k, v, t, p, w=warps: paged_kernel.paged_attention(
                q, k, v, t, p, pages_per_block=per_block, splits=ours_splits, num_warps=w, interpret=args.interpret))
            r[f"ours_w{warps}_s"] = median_time(ours, q, k, v, tables, q_pos, iters=args.iters)
        ref = flat(q, k, v, tables, q_pos).reshape(B, T, H, D).astype(jnp.float32)
        r["max_abs_diff"] = float(jnp.max(jnp.abs(ours(q, k, v, tables, q_pos).astype(jnp.float32) - ref)))
        rows.append(r)
        print(f"B={B:4d} T={T} ctx={args.context}: one-query {r['one_query_s'] * 1e6:8.1f} us "
              f"({kv_bytes * T / r['one_query_s'] / 1e12:.2f} TB/s read)  ours w4 {r['ours_w4_s'] * 1e6:8.1f} us  "
              f"w8 {r['ours_w8_s'] * 1e6:8.1f} us ({kv_bytes / min(r['ours_w4_s'], r['ours_w8_s']) / 1e12:.2f} TB/s)"
              f"  max |diff| {r['max_abs_diff']:.2e}", flush=True)
    if args.output_json:
        Path(args.output_json).write_text(json.dumps({"machine": jax.devices()[0].device_kind,
                                                      "command": " ".join(sys.argv), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
