"""Device time of the sampling stages of a verify step, one jitted function per stage: the plain greedy
rejection sampler against the extended step's (processors + logprobs) stages, and ways to take the top-N logprobs
(lax.top_k over the vocabulary, processors.top_n, N argmax passes), on a GPU the one-kernel greedy pass, and sampled
rows (temperature 0.8) with and without the top-k / top-p filter, which sorts every row's vocabulary, against the
same filter by a multi-section search on the probabilities' bits (`top_k_top_p_search`, no sort).

    python bench/sampler_cost.py --batch 96 --k 3 --vocab 49152 --num-logprobs 5,20

Each stage is timed alone (median of --iters calls, each waited on), so fusion across stages is left out: the
figures say which stage dominates, not the step's exact total. Random logits (fp32 scale of real ones), greedy
rows, presence penalty on, counts from a random history. Writes JSON with --output-json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxspec.bench.timing import median_time  # noqa: E402
from jaxspec.engine import greedy_pass, processors, sampler  # noqa: E402


def median_ms(f, *args, iters: int) -> float:
    return 1e3 * median_time(f, *args, iters=iters)


def inputs(B: int, T: int, V: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(rng.normal(0, 3, (B, T, V)), jnp.bfloat16)
    tokens = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    q0 = jnp.asarray(rng.integers(200, 600, B), jnp.int32)
    num_valid = jnp.full((B,), T - 1, jnp.int32)
    state = processors.ProcessorState.init(B, V)
    history = rng.integers(0, V, (B + 1, 300))
    counts = np.zeros((B + 1, V), np.int32)
    np.add.at(counts, (np.arange(B + 1)[:, None], history), 1)
    state = dataclasses.replace(state, counts=jnp.asarray(counts))
    packed = jnp.asarray(sampler.pack_params([0.0] * B, [0] * B, [1.0] * B, list(range(B)),
                                             presence_penalty=[0.5] * B, repetition_penalty=[1.0] * B,
                                             prompt_len=[100] * B, extended=[1] * B))
    slots = jnp.arange(B, dtype=jnp.int32)
    return logits, tokens, q0, num_valid, state, packed, slots


def top_n_argmax(lp: jax.Array, num: int) -> tuple[jax.Array, jax.Array]:
    """Exact top-N by N argmax passes, masking each winner."""
    vals, ids = [], []
    x = lp
    for _ in range(num):
        i = jnp.argmax(x, axis=-1)
        vals.append(jnp.take_along_axis(x, i[..., None], axis=-1)[..., 0])
        ids.append(i)
        x = jnp.where(jnp.arange(x.shape[-1]) == i[..., None], -jnp.inf, x)
    return jnp.stack(vals, -1), jnp.stack(ids, -1)


def _first_true(pred, lo: jax.Array, hi: jax.Array, n: int = 16) -> jax.Array:
    """The smallest b in [lo, hi] (int32 arrays) where pred(b) holds, for pred monotone in b (false, then true) and
    true at hi: each pass tests n points at once (pred maps [..., n] -> [..., n] bool), narrowing the interval n
    times; 8 passes of 16 points cover any non-negative int32 range."""
    j = jnp.arange(n, dtype=jnp.int32)
    for _ in range(-(-31 // (n.bit_length() - 1))):
        q, r = (hi - lo) // n, (hi - lo) % n
        t = lo[..., None] + q[..., None] * j + jnp.minimum(j, r[..., None])  # left ends of n parts of [lo, hi)
        ok = pred(t)
        first = jnp.where(ok.any(-1), jnp.argmax(ok, axis=-1), n)  # the answer lies in (t[first - 1], t[first]]
        ends = jnp.concatenate([t, hi[..., None]], axis=-1)
        take = lambda i: jnp.take_along_axis(ends, i[..., None], axis=-1)[..., 0]  # noqa: E731
        lo, hi = jnp.where(first == 0, lo, take(jnp.maximum(first - 1, 0)) + 1), take(first)
    return hi


def top_k_top_p_search(probs: jax.Array, top_k: jax.Array, top_p: jax.Array, n: int = 16,
                       vocab_minor: bool = False) -> jax.Array:
    """sampler._top_k_top_p without the sort: the top-k and nucleus thresholds found by multi-section search on the
    probabilities' float bits (ordered as ints, probs >= 0), one pass over the vocabulary per step. The k-th largest
    value is the smallest v with fewer than k tokens above it; the nucleus threshold the smallest v whose mass
    above it is under top_p times the top-k mass (the mass before its first sorted entry). `vocab_minor` lays the
    n tests of a pass out as [..., n, V] (n row reductions) instead of [..., V, n] (one column reduction)."""
    V = probs.shape[-1]
    bits = jax.lax.bitcast_convert_type(probs, jnp.int32)  # [B, T, V]
    top = jnp.max(bits, axis=-1)  # [B, T]
    zero = jnp.zeros_like(top)
    k = jnp.broadcast_to(jnp.where((top_k <= 0) | (top_k > V), V, top_k)[:, None], top.shape)
    ax = -1 if vocab_minor else -2  # the vocabulary's axis in the [B, T, V, n] or [B, T, n, V] tests

    def above(t: jax.Array) -> jax.Array:  # t [B, T, n] -> bits above each point
        return bits[..., None, :] > t[..., :, None] if vocab_minor else bits[..., :, None] > t[..., None, :]

    p_ = probs[..., None, :] if vocab_minor else probs[..., :, None]
    tk = _first_true(lambda t: jnp.sum(above(t), axis=ax) < k[..., None], zero, top, n)
    tk = jnp.where(k >= V, 0, tk)
    over = bits > tk[..., None]
    mass_k = (jnp.sum(jnp.where(over, probs, 0.0), axis=-1)
              + (k - jnp.sum(over, axis=-1)) * jax.lax.bitcast_convert_type(tk, jnp.float32))
    p = top_p[:, None] * mass_k  # [B, T]
    tp = _first_true(lambda t: (jnp.sum(jnp.where(above(t), p_, 0.0), axis=ax) < p[..., None])
                     | (t >= top[..., None]), zero, top, n)
    tp = jnp.where((top_p >= 1.0)[:, None], 0, tp)
    kept = jnp.where(bits >= jnp.maximum(tk, tp)[..., None], probs, 0.0)
    return kept / jnp.sum(kept, axis=-1, keepdims=True)


def filter_probs_search(logits: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
                        vocab_minor: bool = False) -> jax.Array:
    """sampler.filter_probs (filtered, no min_p) with top_k_top_p_search in place of the sort: the unfiltered
    distribution, then the search (a greedy row's one-hot keeps its one token)."""
    probs = sampler.filter_probs(logits, temperature, top_k, top_p, False)
    return top_k_top_p_search(probs, top_k, top_p, vocab_minor=vocab_minor)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--num-logprobs", default="5,20")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--output-json")
    args = ap.parse_args()
    B, T, V = args.batch, args.k + 1, args.vocab
    logits, tokens, q0, num_valid, state, packed, slots = inputs(B, T, V)
    temperature, top_k, top_p, seeds = sampler.unpack_params(packed)
    p = processors.Params.unpack(packed)
    processed = jax.jit(processors.apply)(logits, tokens, q0, state, slots, p)
    probs = jax.jit(sampler.filter_probs, static_argnums=4)(processed, temperature, top_k, top_p, False, p.min_p)
    scores = jax.jit(processors.distribution_scores)(processed, probs, temperature)
    emitted = jnp.where(jnp.arange(T) < 2, tokens, -1)
    it = dict(iters=args.iters)
    stages: dict[str, float] = {}
    stages["plain greedy rejection_sample"] = median_ms(
        jax.jit(lambda l, t, n, s, q: sampler.rejection_sample(l, t[:, 1:], n, temperature, top_k, top_p, s, q,
                                                               True, False)), logits, tokens, num_valid, seeds, q0,
        **it)
    stages["apply (processors)"] = median_ms(jax.jit(processors.apply), logits, tokens, q0, state, slots, p, **it)
    stages["filter_probs (min_p on)"] = median_ms(jax.jit(sampler.filter_probs, static_argnums=4),
                                                  processed, temperature, top_k, top_p, False, p.min_p, **it)
    stages["accept"] = median_ms(jax.jit(sampler.accept), probs, tokens[:, 1:], num_valid, seeds, q0 + 1, **it)
    stages["distribution_scores"] = median_ms(jax.jit(processors.distribution_scores), processed, probs,
                                                temperature, **it)
    stages["log_softmax alone"] = median_ms(jax.jit(lambda x: jax.nn.log_softmax(x, axis=-1)), processed, **it)
    for num in [int(n) for n in args.num_logprobs.split(",")]:
        stages[f"pack_logprobs N={num}"] = median_ms(jax.jit(processors.pack_logprobs, static_argnums=2),
                                                     scores, emitted, num, **it)
        stages[f"lax.top_k N={num}"] = median_ms(jax.jit(jax.lax.top_k, static_argnums=1), scores, num, **it)
        stages[f"processors.top_n N={num}"] = median_ms(jax.jit(processors.top_n, static_argnums=1), scores, num, **it)
        stages[f"argmax passes N={num}"] = median_ms(jax.jit(top_n_argmax, static_argnums=1), scores, num, **it)
        for greedy in (False, True):
            stages[f"processors.sample N={num}{' all_greedy' if greedy else ''}"] = median_ms(
                jax.jit(processors.sample, static_argnums=(7, 8, 9)), logits, tokens, num_valid, q0, state, slots,
                packed, False, num, greedy, **it)
        if jax.default_backend() == "gpu" and greedy_pass.supported(V):
            stages[f"greedy_pass.sample N={num}"] = median_ms(
                jax.jit(greedy_pass.sample, static_argnums=7), logits, tokens, num_valid, q0, state, slots, packed,
                num, **it)
    # sampled rows (vLLM's quickstart settings): the top-k / top-p filter sorts each row's vocabulary
    t8, k0, p95 = jnp.full((B,), 0.8, jnp.float32), jnp.zeros((B,), jnp.int32), jnp.full((B,), 0.95, jnp.float32)
    for name, k_, p_, filtered in (("temperature 0.8", k0, p95, False), ("top_p 0.95", k0, p95, True),
                                   ("top_k 50, top_p 0.95", jnp.full((B,), 50, jnp.int32), p95, True)):
        stages[f"filter_probs {name}"] = median_ms(jax.jit(sampler.filter_probs, static_argnums=4),
                                                   logits, t8, k_, p_, filtered, **it)
        for minor in (False, True) if filtered else ():
            stages[f"filter_probs {name}, search{' (vocab minor)' if minor else ''}"] = median_ms(
                jax.jit(filter_probs_search, static_argnums=4), logits, t8, k_, p_, minor, **it)
        stages[f"rejection_sample {name}"] = median_ms(
            jax.jit(lambda l, t, n, s, q, k_=k_, p_=p_, f=filtered: sampler.rejection_sample(
                l, t[:, 1:], n, t8, k_, p_, s, q, False, f)), logits, tokens, num_valid, seeds, q0, **it)
    stages["rank (sum scores >= token)"] = median_ms(
        jax.jit(lambda x, t: jnp.sum(x >= jnp.take_along_axis(x, jnp.maximum(t, 0)[..., None], -1), -1)),
        scores, emitted, **it)
    result = dict(device=str(jax.devices()[0].device_kind), jax=jax.__version__, host=platform.node(),
                  date=time.strftime("%Y-%m-%d %H:%M:%S"), command=" ".join(sys.argv), batch=B, tokens=T, vocab=V,
                  median_ms=stages)
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result, indent=1))
    width = max(map(len, stages))
    print(f"{B} rows x {T} positions x {V} vocab on {result['device']}, median of {args.iters}")
    for name, ms in stages.items():
        print(f"  {name:<{width}}  {ms:8.3f} ms")


if __name__ == "__main__":
    main()
