"""N-gram speculation (vLLM's `method: "ngram"`, prompt lookup decoding) on the device.

Every slot keeps its sequence's tokens in a history row, [S + 1, max_model_len] int32 in the slot state, written by
prefill (the prompt) and by each step (its emitted tokens). The drafts of a sequence of T tokens follow vLLM's
NgramProposer: the longest n-gram, n in [prompt_lookup_min, prompt_lookup_max], that ends the sequence and occurs
earlier in it (an occurrence ending before the last token; of equally long ones the earliest); the tokens after
that occurrence are the drafts, at most k, at most up to the sequence's end and T + k <= max_model_len. No match:
no drafts. As a device computation it is one comparison of the history with each of its last n tokens, so the
step that verified the tokens drafts for the next one without the host.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def write(history: jax.Array, slots: jax.Array, positions: jax.Array, tokens: jax.Array,
          valid: jax.Array) -> jax.Array:
    """history with tokens [...] written at (slots [...], positions [...]) where valid (elsewhere dropped)."""
    rows, width = history.shape
    rows_ok = valid & (positions >= 0) & (positions < width)
    return history.at[jnp.where(rows_ok, slots, rows), positions].set(tokens, mode="drop")


def propose(history: jax.Array, slots: jax.Array, total: jax.Array, k: int, min_n: int, max_n: int,
            max_model_len: int) -> tuple[jax.Array, jax.Array]:
    """Drafts [B, k] (0 past each row's count) and their count [B] for sequences of `total` [B] tokens whose
    history rows are history[slots]."""
    H = history[slots]  # [B, L]
    B, L = H.shape
    ends = jnp.arange(L, dtype=jnp.int32)[None, :]  # e: the last position of an occurrence
    matched = jnp.zeros((B, L), jnp.int32)  # n-gram length ending at e that ends the sequence too (up to max_n)
    alive = jnp.ones((B, L), bool)
    for v in range(max_n):
        last = total - 1 - v  # [B]: the sequence's token v before its end
        suffix = jnp.take_along_axis(H, jnp.clip(last, 0, L - 1)[:, None], axis=1)  # [B, 1]
        shifted = jnp.pad(H, ((0, 0), (v, 0)))[:, :L]  # shifted[:, e] = H[:, e - v]
        alive &= (ends >= v) & (shifted == suffix) & (last >= 0)[:, None]
        matched += alive
    matched = jnp.where(ends <= total[:, None] - 2, matched, 0)  # occurrences end before the last token
    best = jnp.max(matched, axis=1)  # [B]
    end = jnp.argmax(matched == best[:, None], axis=1).astype(jnp.int32)  # the earliest of the longest
    start = end + 1
    count = jnp.minimum(jnp.minimum(k, total - start), max_model_len - total)
    count = jnp.where(best >= min_n, jnp.maximum(count, 0), 0)
    j = jnp.arange(k, dtype=jnp.int32)[None, :]
    drafts = jnp.take_along_axis(H, jnp.clip(start[:, None] + j, 0, L - 1), axis=1)
    return jnp.where(j < count[:, None], drafts, 0), count.astype(jnp.int32)
