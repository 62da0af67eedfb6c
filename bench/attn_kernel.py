"""Paged attention kernels on decode and verify shapes: JAX's one-query kernel (a sequence's T queries run as T
sequences, each re-reading the context) against jaxspec's (all T queries of a sequence in one program), and a
grid of jaxspec's launch parameters.

    python bench/attn_kernel.py --shapes llama-3-8b:96:3:640,smollm2-135m:96:4:300

Each shape is config:batch:queries per sequence:context. A timed call runs the kernel over --reps layers of one
pool (as a step does), so per-layer times leave out dispatch; median of --iters. Prints, per shape, the one-query
kernel and each variant, then the variant with the least mean time relative to each shape's best, as the
environment variables that select it (JAXSPEC_ATTN_*; paged_kernel.py and attention.py read them).
"""

from __future__ import annotations

import argparse
import itertools
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


def over_layers(kernel, reps: int, layer_pages: int):
    """One jitted call running `kernel` on each of `reps` layers (tables offset by the layer's first page)."""
    def run(q, k, v, tables, q_pos):
        return sum(kernel(q, k, v, tables + i * layer_pages, q_pos).astype(jnp.float32) for i in range(reps))
    return jax.jit(run)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="llama-3-8b:24:3:640,llama-3-8b:96:3:640,llama-3-8b:32:1:512,"
                                        "smollm2-135m:96:4:300")
    ap.add_argument("--pages-per-block", default="8,16")
    ap.add_argument("--num-warps", default="4,8")
    ap.add_argument("--num-stages", default="2,3")
    ap.add_argument("--programs", default="512,2048", help="PALLAS_PROGRAMS values (they set the table splits)")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--output-json")
    ap.add_argument("--interpret", action="store_true", help=argparse.SUPPRESS)  # CPU smoke test
    args = ap.parse_args()
    from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention as one_query

    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    variants = list(itertools.product(ints(args.pages_per_block), ints(args.num_warps), ints(args.num_stages),
                                      ints(args.programs)))
    rows = []
    for shape in args.shapes.split(","):
        name, B, T, context = shape.split(":")
        B, T, context = int(B), int(T), int(context)
        cfg = llama.Config.from_hf(load_hf_config(name)[1])
        H, kvh, D, S = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 16
        pages = 1 << (-(-(context + T) // S) - 1).bit_length()
        pool = (kvh, args.reps * B * pages, S, D)
        k, v, q = (jax.random.normal(jax.random.key(i), s, jnp.bfloat16)
                   for i, s in enumerate((pool, pool, (B, T, H, D))))
        tables = jnp.asarray(np.random.default_rng(0).permutation(B * pages).reshape(B, pages), jnp.int32)
        q_pos = jnp.asarray(context + np.arange(T)[None].repeat(B, 0), jnp.int32)
        kv_bytes = B * (context + T) * 2 * kvh * D * 2
        row = {"shape": shape, "kv_bytes": kv_bytes, "variants": {}}

        def stock(q, k, v, t, p):
            splits = attention.pallas_splits(B * T, kvh, pages // 8)
            return one_query(q.reshape(B * T, H, D), k, v, jnp.repeat(t, T, axis=0), p.reshape(-1) + 1,
                             pages_per_compute_block=8, k_splits=splits, interpret=args.interpret).reshape(q.shape)

        timed = lambda f: median_time(over_layers(f, args.reps, B * pages), q, k, v, tables, q_pos,  # noqa: E731
                                      iters=args.iters) / args.reps
        row["one_query_s"] = timed(stock)
        ref = stock(q, k, v, tables, q_pos).astype(jnp.float32)
        for asked, warps, stages, programs in variants:
            per_block = min(asked, pages)
            splits = attention.pallas_splits(B, kvh, pages // per_block, programs)
            ours = lambda q, k, v, t, p, a=(per_block, splits, warps, stages): paged_kernel.paged_attention(  # noqa
                q, k, v, t, p, pages_per_block=a[0], splits=a[1], num_warps=a[2], num_stages=a[3],
                interpret=args.interpret)
            err = float(jnp.max(jnp.abs(ours(q, k, v, tables, q_pos).astype(jnp.float32) - ref)))
            row["variants"][f"{asked},{warps},{stages},{programs}"] = {"s": timed(ours), "max_abs_diff": err,
                                                                          "splits": splits}
        best = min(row["variants"].items(), key=lambda kv: kv[1]["s"])
        print(f"{shape}: one-query {row['one_query_s'] * 1e6:7.1f} us ({kv_bytes * T / row['one_query_s'] / 1e12:.2f}"
              f" TB/s read); ours best {best[1]['s'] * 1e6:7.1f} us ({kv_bytes / best[1]['s'] / 1e12:.2f} TB/s) with "
              f"pages/block,warps,stages,programs = {best[0]}, max |diff| {best[1]['max_abs_diff']:.1e}", flush=True)
        rows.append(row)
    keys = list(rows[0]["variants"])
    score = {key: float(np.mean([r["variants"][key]["s"] / min(v["s"] for v in r["variants"].values())
                                 for r in rows])) for key in keys}
    for key in sorted(keys, key=score.get):
        print(f"  {key:>14}: mean {score[key]:.3f}x the best; " + "  ".join(
            f"{r['variants'][key]['s'] * 1e6:7.1f}" for r in rows) + " us")
    pb, nw, ns, pr = min(keys, key=score.get).split(",")
    print(f"BEST JAXSPEC_ATTN_PAGES_PER_BLOCK={pb} JAXSPEC_ATTN_NUM_WARPS={nw} JAXSPEC_ATTN_NUM_STAGES={ns} "
          f"JAXSPEC_ATTN_PROGRAMS={pr}")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps({"machine": jax.devices()[0].device_kind,
                                                      "command": " ".join(sys.argv), "rows": rows,
                                                      "score": score}, indent=2))


if __name__ == "__main__":
    main()
