"""Sampling and speculative accept/reject: pure, jittable functions with no host syncs.

Randomness: every token position of every request has its own key, fold_in(PRNGKey(seed), position). Position
P's key is used only in the step that emits the token at P, so outputs do not depend on batch composition, on
async vs sync, or on how many steps a token took. Two independent streams are folded out of it: _ACCEPT (the
uniform that accepts or rejects the draft at P) and _SAMPLE (the Gumbel noise that samples the token at P).
"""

import jax
import jax.numpy as jnp
import numpy as np

_ACCEPT, _SAMPLE = 0, 1  # fold_in data that splits a position's key into its two independent streams


def token_keys(seeds: jax.Array, positions: jax.Array) -> jax.Array:
    """seeds [B] uint32, positions [B, T] int32 -> typed PRNG keys [B, T]: the key of the token AT each position."""
    base = jax.vmap(jax.random.key)(seeds)  # [B]
    return jax.vmap(jax.vmap(jax.random.fold_in, (None, 0)), (0, 0))(base, positions)


def greedy(logits: jax.Array) -> jax.Array:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def filter_probs(logits: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
                 filtered: bool = True, min_p: jax.Array | None = None) -> jax.Array:
    """The target's sampling distribution p [B, T, V] fp32 for logits [B, T, V].

    softmax(logits / temperature), restricted to the tokens with at least min_p times the most likely one's
    probability (min_p [B] fp32, None: off), then to the top_k tokens (0 or >= V: off), then to the nucleus (the
    smallest set whose renormalized mass is >= top_p; 1.0: off), renormalized (vLLM's order). Rows with
    temperature 0 get a one-hot at the argmax. temperature/top_p [B] fp32, top_k [B] int32. `filtered` is
    static: False when no row uses top-k/top-p, which skips the sort over the vocabulary (the expensive part at
    V = 128k).
    """
    is_greedy = (temperature <= 0)[:, None, None]  # [B, 1, 1]
    t = jnp.where(temperature > 0, temperature, 1.0)[:, None, None]
    probs = jax.nn.softmax(logits.astype(jnp.float32) / t, axis=-1)  # [B, T, V]
    if min_p is not None:
        kept = jnp.where(probs >= min_p[:, None, None] * jnp.max(probs, axis=-1, keepdims=True), probs, 0.0)
        probs = kept / jnp.sum(kept, axis=-1, keepdims=True)
    if filtered:
        probs = _top_k_top_p(probs, top_k, top_p)
    one_hot = jax.nn.one_hot(greedy(logits), logits.shape[-1], dtype=jnp.float32)
    return jnp.where(is_greedy, one_hot, probs)


def _top_k_top_p(probs: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    # Work out how many tokens each row keeps in sorted order, then keep every token whose prob is >= the last
    # kept one (a threshold, so no scatter back from sorted order; tokens tied with it are all kept, as in vLLM).
    V = probs.shape[-1]
    sorted_p = -jnp.sort(-probs, axis=-1)  # [B, T, V] descending
    cum = jnp.cumsum(sorted_p, axis=-1)  # [B, T, V]
    k = jnp.where((top_k <= 0) | (top_k > V), V, top_k)[:, None, None]  # [B, 1, 1]
    mass_k = jnp.take_along_axis(cum, jnp.broadcast_to(k - 1, cum.shape[:-1] + (1,)), axis=-1)  # [B, T, 1]
    # nucleus of the top-k distribution: sorted token i stays iff the mass before it is < top_p (renormalized),
    # i.e. cum[i] - p[i] < top_p * mass_k. The argmax always stays (mass before it is 0; n_keep >= 1).
    p = top_p[:, None, None]
    n_nucleus = jnp.sum(cum - sorted_p < p * mass_k, axis=-1, keepdims=True)  # [B, T, 1]
    n_nucleus = jnp.where(p >= 1.0, V, n_nucleus)  # off exactly, whatever the fp32 rounding of the cumsum
    n_keep = jnp.clip(jnp.minimum(k, n_nucleus), 1, V)
    threshold = jnp.take_along_axis(sorted_p, n_keep - 1, axis=-1)  # [B, T, 1]
    kept = jnp.where(probs >= threshold, probs, 0.0)
    return kept / jnp.sum(kept, axis=-1, keepdims=True)


def rejection_sample(target_logits: jax.Array, drafts: jax.Array, num_valid: jax.Array,
                     temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
                     seeds: jax.Array, positions: jax.Array,
                     all_greedy: bool, filtered: bool = True) -> tuple[jax.Array, jax.Array]:
    """Accept/reject k drafts against the target and emit n_acc + 1 tokens per row.

    target_logits [B, k+1, V]: position j scores the token after input j (input 0: the last committed token,
    inputs 1..k: the drafts). drafts [B, k] int32. num_valid [B] in [0, k]: the most drafts a row may accept.
    positions [B]: sequence position of the token target_logits[:, 0] predicts. all_greedy, filtered: static.
    Returns tokens [B, k+1] int32 (accepted drafts, then one corrected or bonus token, then -1) and n_acc [B].

    The math (q: draft prob, p: target prob, x: the draft token):
      p(x) >= q(x): always accept x
      p(x) < q(x): accept x with prob p(x) / q(x)
      rejected: sample from the residual norm(max(p - q, 0))
    EAGLE drafts greedily, so q is one-hot at x: accept with prob p(x); the residual is p with x zeroed. Then
      P(emit y) = p(x) [y = x] + (1 - p(x)) p(y) [y != x] / (1 - p(x)) = p(y): the target's distribution exactly.
    If every allowed draft is accepted, the bonus token is sampled from p at the next position.
    Greedy rows have p one-hot at the argmax, so the same rule accepts iff draft == argmax and emits the argmax.
    """
    if not all_greedy:
        probs = filter_probs(target_logits, temperature, top_k, top_p, filtered)  # [B, k+1, V]
        return accept(probs, drafts, num_valid, seeds, positions)
    return greedy_accept(greedy(target_logits), drafts, num_valid)


def greedy_accept(target: jax.Array, drafts: jax.Array, num_valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`rejection_sample` of greedy rows from the target's argmax tokens [B, k+1]: a draft is accepted iff it is
    the argmax; the first wrong draft is replaced by the argmax, or the bonus token is the last argmax."""
    k = drafts.shape[1]
    num_valid = jnp.clip(num_valid, 0, k)
    drafts = drafts.astype(jnp.int32)  # padding drafts are never accepted (num_valid)
    accepted = (drafts == target[:, :k]) & (jnp.arange(k) < num_valid[:, None])  # [B, k]
    n_acc = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1), axis=1)  # leading run of accepts
    last = jnp.take_along_axis(target, n_acc[:, None], axis=1)[:, 0]
    return _emit(jnp.maximum(drafts, 0), n_acc, last), n_acc


def accept(probs: jax.Array, drafts: jax.Array, num_valid: jax.Array, seeds: jax.Array,
           positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`rejection_sample` against the target distribution p = probs [B, k+1, V] (filter_probs' output: one-hot
    rows are greedy rows). Same arguments and results."""
    B, K1, V = probs.shape
    k = K1 - 1
    num_valid = jnp.clip(num_valid, 0, k)
    drafts = jnp.clip(drafts.astype(jnp.int32), 0, V - 1)  # padding drafts are never accepted (num_valid)
    keys = token_keys(seeds, positions[:, None] + jnp.arange(K1, dtype=jnp.int32))  # [B, k+1]
    p_draft = jnp.take_along_axis(probs[:, :k], drafts[..., None], axis=-1)[..., 0]  # [B, k]: p(x)
    u = _uniform(keys[:, :k])  # [B, k] in [0, 1), from the key at the draft's own position
    accepted = (u < p_draft) & (jnp.arange(k) < num_valid[:, None])  # p(x) = 1 always accepts, 0 never does
    n_acc = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1), axis=1)  # leading run of accepts
    last = _sample_last(probs, drafts, n_acc, num_valid, keys)
    return _emit(drafts, n_acc, last), n_acc


def _uniform(keys: jax.Array) -> jax.Array:
    draw = lambda key: jax.random.uniform(jax.random.fold_in(key, _ACCEPT), (), jnp.float32)
    return jax.vmap(jax.vmap(draw))(keys)


def _sample_last(probs, drafts, n_acc, num_valid, keys) -> jax.Array:
    # The token at position n_acc: the correction (draft n_acc was rejected) or the bonus (all allowed drafts
    # accepted). Only these B rows of [V] get Gumbel noise, not all B * (k+1).
    V = probs.shape[-1]
    p = jnp.take_along_axis(probs, n_acc[:, None, None], axis=1)[:, 0]  # [B, V]
    rejected = n_acc < num_valid  # [B]
    x = jnp.take_along_axis(jnp.pad(drafts, ((0, 0), (0, 1))), n_acc[:, None], axis=1)  # [B, 1] rejected draft
    residual = jnp.where(rejected[:, None] & (jnp.arange(V) == x), 0.0, p)  # max(p - q, 0) for one-hot q
    # fp32 guard: a rejected draft with p(x) rounding to all the mass would leave nothing; fall back to p.
    residual = jnp.where(jnp.sum(residual, axis=-1, keepdims=True) > 0, residual, p)
    key = jnp.take_along_axis(keys, n_acc[:, None], axis=1)[:, 0]  # [B] key at the emitted position
    draw = lambda key, w: jax.random.categorical(jax.random.fold_in(key, _SAMPLE), jnp.log(w))  # Gumbel-max
    return jax.vmap(draw)(key, residual).astype(jnp.int32)  # norm() not needed: argmax ignores the scale


def _emit(drafts, n_acc, last) -> jax.Array:
    j = jnp.arange(drafts.shape[1] + 1)  # [k+1]
    padded = jnp.pad(drafts, ((0, 0), (0, 1)))  # [B, k+1]
    n = n_acc[:, None]
    return jnp.where(j < n, padded, jnp.where(j == n, last[:, None], -1)).astype(jnp.int32)


# Per-row sampling params travel as one [B, C] uint32 array (each jit argument leaf costs host time): the host
# keeps each slot's row packed (SamplingTable; ROW_DTYPE gives the bytes), and the device bitcasts each
# column back. COLUMNS is the one definition of the layout. The columns after seed are read only by the extended
# step (engine/processors.py); `extended` is 1 for a request whose slot's processor state is its own.
COLUMNS: tuple[tuple[str, type], ...] = (("temperature", np.float32), ("top_k", np.int32), ("top_p", np.float32),
                                         ("seed", np.uint32), ("presence_penalty", np.float32),
                                         ("frequency_penalty", np.float32), ("repetition_penalty", np.float32),
                                         ("min_p", np.float32), ("min_tokens", np.int32), ("prompt_len", np.int32),
                                         ("extended", np.uint32))
ROW_DTYPE = np.dtype(list(COLUMNS))


def pack_params(temperature, top_k, top_p, seeds, **columns) -> np.ndarray:
    """Per-row params (sequences of length B) -> [B, C] uint32, the layout of COLUMNS; columns not given are 0
    (tests and tools)."""
    rows = np.zeros(len(seeds), ROW_DTYPE)
    rows["temperature"], rows["top_k"], rows["top_p"], rows["seed"] = temperature, top_k, top_p, seeds
    for name, values in columns.items():
        rows[name] = values
    return rows.view(np.uint32).reshape(len(rows), -1)


def column(packed: jax.Array, name: str) -> jax.Array:
    """One column of a packed [B, C] array as its own dtype [B] (jittable)."""
    i = [n for n, _ in COLUMNS].index(name)
    return jax.lax.bitcast_convert_type(packed[:, i], jnp.dtype(COLUMNS[i][1]))


def unpack_params(packed: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """[B, C] uint32 -> temperature [B] fp32, top_k [B] int32, top_p [B] fp32, seeds [B] uint32 (jittable)."""
    return tuple(column(packed, name) for name in ("temperature", "top_k", "top_p", "seed"))


def batch_flags(temperature, top_k, top_p, vocab_size: int) -> tuple[bool, bool]:
    """Host: the static (all_greedy, filtered) for a batch, from its per-row params."""
    t, k, p = np.asarray(temperature), np.asarray(top_k), np.asarray(top_p)
    random_rows = t > 0
    filters = ((k > 0) & (k < vocab_size)) | (p < 1.0)
    return bool(not random_rows.any()), bool((random_rows & filters).any())


# SamplingTable's per-slot flag bits, OR-ed over a batch for its static kind
_RANDOM, _RANDOM_FILTERED, _EXTENDED, _PROCESSORS, _GRAMMAR = 1, 2, 4, 8, 16


class SamplingTable:
    """Host: every slot's sampling params as its packed [C] uint32 row (set when its request's prefill is planned),
    plus a greedy all-zero row for padding (index num_slots), and the slot's flag bits. A step's array is one
    gather of a plain uint32 table and its kind one OR over the flags: this runs at every step, and gathering
    structured rows and reading their fields cost ~60 us at 96 rows on the CPU machine, this ~5 us."""

    def __init__(self, num_slots: int, vocab_size: int):
        self.packed = np.zeros((num_slots + 1, len(COLUMNS)), np.uint32)
        self.flags = np.zeros(num_slots + 1, np.uint8)
        self.vocab_size = vocab_size

    def set(self, slot: int, params, seed: int, prompt_len: int) -> None:
        row = np.array((params.temperature, params.top_k, params.top_p, seed, params.presence_penalty,
                        params.frequency_penalty, params.repetition_penalty, params.min_p, params.min_tokens,
                        prompt_len, params.needs_extended_step), ROW_DTYPE)
        self.packed[slot] = row.reshape(1).view(np.uint32)
        all_greedy, filtered = batch_flags([params.temperature], [params.top_k], [params.top_p], self.vocab_size)
        self.flags[slot] = ((0 if all_greedy else _RANDOM) | (_RANDOM_FILTERED if filtered else 0)
                            | (_EXTENDED if params.needs_extended_step else 0)
                            | (_PROCESSORS if params.needs_processors else 0)
                            | (_GRAMMAR if params.structured_outputs is not None else 0))

    def batch(self, slots: np.ndarray) -> tuple[np.ndarray, tuple[bool, bool, bool, bool, bool]]:
        """([B, C] uint32 for these slots, the batch's static (all_greedy, filtered, extended, processors,
        grammar))."""
        bits = int(np.bitwise_or.reduce(self.flags[slots]))
        return self.packed[slots], (not bits & _RANDOM, bool(bits & _RANDOM_FILTERED), bool(bits & _EXTENDED),
                                    bool(bits & _PROCESSORS), bool(bits & _GRAMMAR))
