"""Time one EAGLE training step (the trainer's `train_step`) on random weights, and where its device time goes.

    python bench/train_step_time.py --hf-config smollm2-135m --method eagle --ttt-steps 3 --batch-size 32 \
        --seq-len 512 --iters 20 --profile-dir /tmp/prof

The target is random (the same kernels as the checkpoint), so no weights are needed; tokens are random ids with
every position a response token. Prints ms per step (steps back to back, the trainer's loop without its data
reads) and, with --profile-dir, device time per kernel over the traced steps, most first.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxspec.bench.data import load_hf_config  # noqa: E402
from jaxspec.models import eagle, llama  # noqa: E402
from jaxspec.train.losses import Frozen, LossConfig  # noqa: E402
from jaxspec.train.trainer import (OptConfig, init_head, initial_state, target_config,  # noqa: E402
                                    train_step)


def setup(args: argparse.Namespace):
    """(state, frozen, tokens, mask, tcfg, hcfg, lc, oc) for random weights and tokens."""
    tcfg = target_config(llama.Config.from_hf(load_hf_config(args.hf_config)[1], dtype=args.target_dtype))
    tcfg = tcfg.replace(layer_loop=args.layer_loop, attn_impl=args.attn_impl or tcfg.attn_impl)
    tw = llama.init(tcfg, jax.random.key(0))
    e3 = args.method == "eagle3"
    aux = tuple(int(i) for i in args.aux_layers.split(",")) if e3 and args.aux_layers else None
    hcfg = eagle.EagleConfig.from_target(tcfg, args.method, draft_vocab_size=args.draft_vocab_size if e3 else None,
                                         aux_layers=aux).replace(dtype="float32", attn_impl="xla")
    d2t = t2d = None
    if e3:  # the first draft_V target ids
        d2t = np.zeros(hcfg.draft_vocab_size, np.int32)
        t2d = np.full(tcfg.vocab_size, -1, np.int32)
        t2d[:hcfg.draft_vocab_size] = np.arange(hcfg.draft_vocab_size)
    frozen = Frozen(target=tw, d2t=None if d2t is None else jnp.asarray(d2t),
                    t2d=None if t2d is None else jnp.asarray(t2d))
    w = init_head(hcfg, tw, 0, d2t)
    lc = LossConfig(ttt_steps=args.ttt_steps, noise=0.0 if e3 else 0.2, compute_dtype=args.compute_dtype)
    oc = OptConfig(lr=3e-4)
    state = initial_state(w, oc, 0)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, tcfg.vocab_size, (args.batch_size, args.seq_len), dtype=np.int32)
    mask = np.ones((args.batch_size, args.seq_len), np.int32)
    return state, frozen, tokens, mask, tcfg, hcfg, lc, oc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf-config", default="smollm2-135m", help="a config.json path or a built-in name")
    ap.add_argument("--method", default="eagle", choices=["eagle", "eagle3"])
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--draft-vocab-size", type=int, default=8192)
    ap.add_argument("--aux-layers", help="EAGLE-3's feature layers, e.g. 2,15,27 (default: the paper's choice)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--target-dtype", default="bfloat16")
    ap.add_argument("--compute-dtype", default="bfloat16")
    ap.add_argument("--layer-loop", default="scan", choices=["scan", "unroll"])
    ap.add_argument("--attn-impl", help="the target pass's attention (default: the trainer's choice)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--profile-dir")
    ap.add_argument("--top", type=int, default=25, help="kernels to print from the profile")
    ap.add_argument("--output-json")
    args = ap.parse_args()

    state, frozen, tokens, mask, tcfg, hcfg, lc, oc = setup(args)
    total = jnp.int32(10 ** 6)
    run = lambda s: train_step(s, frozen, tokens, mask, total, tcfg, hcfg, lc, oc)
    t = time.perf_counter()
    state, m = run(state)
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t
    for _ in range(3):
        state, m = run(state)
    jax.block_until_ready(m)
    t = time.perf_counter()
    for _ in range(args.iters):
        state, m = run(state)
    jax.block_until_ready(m)
    step_ms = (time.perf_counter() - t) / args.iters * 1e3
    tokens_per_s = args.batch_size * args.seq_len / step_ms * 1e3
    print(f"{args.method} ttt={args.ttt_steps} B={args.batch_size} T={args.seq_len}: {step_ms:.2f} ms/step "
          f"({tokens_per_s / 1e3:.0f}k tokens/s; first step with compile {compile_s:.1f} s)", flush=True)
    result = {"machine": jax.devices()[0].device_kind, "date": time.strftime("%Y-%m-%d"), "command": sys.argv,
              "args": vars(args), "step_ms": step_ms, "compile_s": compile_s, "loss": float(m["total"])}
    if args.profile_dir:
        from jaxspec.bench.profile import find_trace, kernel_totals, load_trace

        n = max(3, args.iters // 4)
        with jax.profiler.trace(args.profile_dir):
            for _ in range(n):
                state, m = run(state)
            jax.block_until_ready(m)
        totals = kernel_totals(load_trace(find_trace(args.profile_dir)))
        per_step = sum(k["ms"] for k in totals) / n
        print(f"kernel sum {per_step:.2f} ms/step over {n} traced steps; top {args.top}:")
        for k in totals[:args.top]:
            print(f"  {k['ms'] / n:8.3f} ms  x{k['count'] // n:<4d} {k['name'][:110]}")
        result["kernels_ms_per_step"] = [{**k, "ms": k["ms"] / n, "count": k["count"] / n} for k in totals]
        result["kernel_sum_ms"] = per_step
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
