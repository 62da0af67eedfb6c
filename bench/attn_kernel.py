"""Paged attention kernels on decode and verify shapes: JAX's one-query kernel (a sequence's T queries run as T
sequences, each re-reading the context) against jaxspec's (all T queries of a sequence in one program), and a
grid of jaxspec's launch parameters and of the cache's page size.

    python bench/attn_kernel.py --shapes llama-3-8b:96:3:640,smollm2-135m:96:4:300 --page-sizes 16,64

Each shape is config:batch:queries per sequence:context. A timed call runs the kernel over --reps layers of one
pool (as a step does), so per-layer times leave out dispatch; median of --iters. Prints, per shape, the one-query
kernel and jaxspec's best variant, then every variant's mean time relative to each shape's best, and last the
best as the page size and the environment variables that select it (JAXSPEC_ATTN_*; paged_kernel.py and
attention.py read them).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxspec.bench.data import load_hf_config  # noqa: E402
from jaxspec.bench.timing import median_time  # noqa: E402
from jaxspec.models import attention, llama, paged_kernel  # noqa: E402
from jaxspec.models.kernel_config import KernelConfig  # noqa: E402

FIELDS = ("page_size", "block_tokens", "num_warps", "num_stages", "programs")


def over_layers(kernel, reps: int, layer_pages: int):
    """One jitted call running `kernel` on each of `reps` layers (tables offset by the layer's first page)."""
    def run(q, k, v, tables, q_pos):
        return sum(kernel(q, k, v, tables + i * layer_pages, q_pos).astype(jnp.float32) for i in range(reps))
    return jax.jit(run)


def time_shape(shape: str, variants: list[tuple], args) -> dict:
    from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention as one_query

    name, B, T, context = shape.split(":")
    B, T, context = int(B), int(T), int(context)
    cfg = llama.Config.from_hf(load_hf_config(name)[1])
    H, kvh, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    kv_bytes = B * (context + T) * 2 * kvh * D * 2
    row = {"shape": shape, "kv_bytes": kv_bytes, "one_query_s": {}, "variants": {}}
    q = jax.random.normal(jax.random.key(2), (B, T, H, D), jnp.bfloat16)
    q_pos = jnp.asarray(context + np.arange(T)[None].repeat(B, 0), jnp.int32)
    for S in sorted({v[0] for v in variants}):
        pages = 1 << (-(-(context + T) // S) - 1).bit_length()
        pool = (kvh, args.reps * B * pages, S, D)
        k, v = (jax.random.normal(jax.random.key(i), pool, jnp.bfloat16) for i in range(2))
        tables = jnp.asarray(np.random.default_rng(0).permutation(B * pages).reshape(B, pages), jnp.int32)
        timed = lambda f: median_time(over_layers(f, args.reps, B * pages), q, k, v, tables, q_pos,  # noqa: E731
                                      iters=args.iters) / args.reps
        stock_block = max(1, min(pages, 128 // S))

        def stock(q, k, v, t, p):
            splits = attention.pallas_splits(B * T, kvh, pages // stock_block, KernelConfig().attn_programs)
            return one_query(q.reshape(B * T, H, D), k, v, jnp.repeat(t, T, axis=0), p.reshape(-1) + 1,
                             pages_per_compute_block=stock_block, k_splits=splits,
                             interpret=args.interpret).reshape(q.shape)

        row["one_query_s"][S] = timed(stock)
        ref = stock(q, k, v, tables, q_pos).astype(jnp.float32)
        for variant in (v for v in variants if v[0] == S):
            _, block_tokens, warps, stages, programs = variant
            per_block = min(max(1, block_tokens // S), pages)
            splits = attention.pallas_splits(B, kvh, pages // per_block, programs)
            ours = partial_kernel(per_block, splits, warps, stages, args.interpret)
            err = float(jnp.max(jnp.abs(ours(q, k, v, tables, q_pos).astype(jnp.float32) - ref)))
            row["variants"][",".join(map(str, variant))] = {"s": timed(ours), "max_abs_diff": err, "splits": splits}
    best = min(row["variants"].items(), key=lambda kv: kv[1]["s"])
    stock_s = row["one_query_s"][min(row["one_query_s"])]
    print(f"{shape}: one-query {stock_s * 1e6:7.1f} us ({kv_bytes * T / stock_s / 1e12:.2f} TB/s read); ours best "
          f"{best[1]['s'] * 1e6:7.1f} us ({kv_bytes / best[1]['s'] / 1e12:.2f} TB/s) with {','.join(FIELDS)} = "
          f"{best[0]}, max |diff| {best[1]['max_abs_diff']:.1e}", flush=True)
    return row


def partial_kernel(per_block: int, splits: int, warps: int, stages: int, interpret: bool):
    def run(q, k, v, t, p):
        return paged_kernel.paged_attention(q, k, v, t, p, pages_per_block=per_block, splits=splits,
                                            num_warps=warps, num_stages=stages, interpret=interpret)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="llama-3-8b:24:3:640,llama-3-8b:96:3:640,llama-3-8b:32:1:512,"
                                        "smollm2-135m:96:4:300")
    ap.add_argument("--page-sizes", default="16", help="tokens per cache page (the engine's page_size)")
    ap.add_argument("--block-tokens", default="128", help="keys per loop iteration (JAXSPEC_ATTN_BLOCK_TOKENS)")
    ap.add_argument("--num-warps", default="4")
    ap.add_argument("--num-stages", default="2,3")
    ap.add_argument("--programs", default="512", help="PALLAS_PROGRAMS values (they set the table splits)")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--output-json")
    ap.add_argument("--interpret", action="store_true", help=argparse.SUPPRESS)  # CPU smoke test
    args = ap.parse_args()

    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    variants = list(itertools.product(ints(args.page_sizes), ints(args.block_tokens), ints(args.num_warps),
                                      ints(args.num_stages), ints(args.programs)))
    rows = [time_shape(shape, variants, args) for shape in args.shapes.split(",")]
    keys = list(rows[0]["variants"])
    score = {key: float(np.mean([r["variants"][key]["s"] / min(v["s"] for v in r["variants"].values())
                                 for r in rows])) for key in keys}
    for key in sorted(keys, key=score.get):
        print(f"  {key:>24}: mean {score[key]:.3f}x the best; " + "  ".join(
            f"{r['variants'][key]['s'] * 1e6:7.1f}" for r in rows) + " us")
    best = dict(zip(FIELDS, min(keys, key=score.get).split(",")))
    print(f"BEST page_size={best['page_size']} " + " ".join(
        f"JAXSPEC_ATTN_{f.upper()}={best[f]}" for f in FIELDS[1:]))
    if args.output_json:
        Path(args.output_json).write_text(json.dumps({"machine": jax.devices()[0].device_kind,
                                                      "command": " ".join(sys.argv), "fields": FIELDS,
                                                      "rows": rows, "score": score}, indent=2))


if __name__ == "__main__":
    main()
