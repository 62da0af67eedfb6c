"""Logits processors and log-probabilities for the extended step, applied at every verified position.

The extended step runs when any row of a batch needs a processor or logprobs (SamplingParams.needs_extended_step);
other batches run the plain sampler, untouched. A batch whose rows want logprobs alone (no row has a processor)
runs the extended step without the processors: the raw target, no state read or committed. At verify position j
(logits[:, j] scores the token at sequence position q0 + 1 + j, where q0 is the position of inputs[:, 0], the last
committed token) every processor sees the history up to that position: the committed tokens plus the drafts
inputs[:, 1..j] it would follow if accepted. So rejection sampling compares each draft with exactly the
distribution plain decoding would sample there, and the output distribution stays the processed target's
(tests/test_processors.py checks it by chi-square).

"Processed", in vLLM's order:
  1. + logit_bias; -inf outside allowed_token_ids, at the last token of a bad word whose other tokens end the
     output so far, and at EOS / stop_token_ids while the output is shorter than min_tokens;
  2. penalties on the output so far (prompt too for repetition_penalty): repetition (CTRL: logit / r where the
     logit is > 0, logit * r otherwise), then - frequency_penalty * count - presence_penalty * [count > 0];
  3. / temperature (1 for greedy rows), then min_p, top-k and top-p remove tokens (-inf), renormalized.
A structured-output constraint (engine/grammar.py) masks what its automaton refuses at the position after steps 1
and 2 (-inf: the order does not matter), whatever else applies; where that leaves nothing, the constraint's
tokens keep their raw logits.
Logprobs are log-softmax of that final distribution: for greedy rows the processed logits' log_softmax (what
transformers' log_softmax of the same logits gives), for random rows the log of the distribution sampled from.

A position where the bans leave no token at all (allowed_token_ids all banned by bad words or min_tokens) gets the
unprocessed logits. Whether one does is worked out from small arrays before the pass over the vocabulary (a row's
number of allowed tokens and of allowed stop tokens, counted at admission, against the distinct allowed tokens
its matched bad words ban), so no reduction over [B, T, V] is spent on a case that almost never happens.

Cost: one fused elementwise pass for steps 1 and 2 (the count at position j is the slot's committed count plus
one compare per earlier draft), then one scatter of the bad words' bans. Bad words compare a window of the
recent history (a per-slot ring of HISTORY tokens, committed on device) with each word: [B, k+1, W, L]. The
consumers (the greedy argmax, the logprobs' logsumexp, rank and top-N) read the result in two passes: block
maxima (the row max, the argmax's block and top-N's blocks come from them), then the sum of exponentials and
the rank together. On a GPU an all-greedy batch runs all of that as one kernel instead (greedy_pass.py), which
never writes the processed logits out.

The draft head drafts from its logits processed the same way (process_draft: steps 1 and 2 with the rollout's
earlier drafts counted; bad words left out): a raw draft misses what a penalty or a bias moved the target to, and
is rejected there. Which token is drafted never changes the output distribution, only how many drafts are accepted.

Device state per slot (ProcessorState, in step.SlotState; memory (S+1) * V * 10 bytes): output counts and the
prompt's token mask (set in prefill, counted in every extended commit), the bias row, the min_tokens stop mask
and their allowed counts (set at admission by `admit`), the bad words, the recent-token ring. None of it goes to
the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxspec.config import MAX_SPECULATIVE_TOKENS
from jaxspec.engine import grammar, sampler
from jaxspec.engine.slot_spec import MAX_BAD_WORD_TOKENS, MAX_BAD_WORDS

HISTORY = 32  # ring of recent tokens: holds a bad word's prefix and one step's k+1 new tokens without collision
assert HISTORY >= max(MAX_BAD_WORD_TOKENS - 1, MAX_SPECULATIVE_TOKENS + 1)
_BEFORE_OUTPUT = -2  # history entries that are prompt (or before it): no bad word matches them; -1 is "any"


@partial(jax.tree_util.register_dataclass,
         data_fields=["counts", "prompt_mask", "bias", "stop_mask", "bad_words", "history", "num_allowed",
                      "num_allowed_stops"], meta_fields=[])
@dataclass
class ProcessorState:
    """Per slot (S + 1 rows, the last absorbs padding rows' writes); a request's rows are reset at admission."""
    counts: jax.Array  # [S+1, V] int32: times each token occurs in the output
    prompt_mask: jax.Array  # [S+1, V] bool: tokens of the prompt (repetition_penalty)
    bias: jax.Array  # [S+1, V] fp32: logit_bias, -inf outside allowed_token_ids
    stop_mask: jax.Array  # [S+1, V] bool: EOS and stop_token_ids (banned below min_tokens)
    bad_words: jax.Array  # [S+1, W, L] int32: each right-aligned, prefix -1 = any, last token -1 = no word
    history: jax.Array  # [S+1, HISTORY] int32: the token at position p in column p % HISTORY
    num_allowed: jax.Array  # [S+1] int32: tokens whose bias is finite (V without allowed_token_ids)
    num_allowed_stops: jax.Array  # [S+1] int32: of those, the ones in stop_mask

    @classmethod
    def init(cls, num_slots: int, vocab_size: int) -> "ProcessorState":
        S1, V = num_slots + 1, vocab_size
        return cls(counts=jnp.zeros((S1, V), jnp.int32), prompt_mask=jnp.zeros((S1, V), bool),
                   bias=jnp.zeros((S1, V), jnp.float32), stop_mask=jnp.zeros((S1, V), bool),
                   bad_words=jnp.full((S1, MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS), -1, jnp.int32),
                   history=jnp.zeros((S1, HISTORY), jnp.int32), num_allowed=jnp.full((S1,), V, jnp.int32),
                   num_allowed_stops=jnp.zeros((S1,), jnp.int32))


class Params(NamedTuple):
    """The processor columns of the packed sampling params, [B] each."""
    presence: jax.Array
    frequency: jax.Array
    repetition: jax.Array
    min_p: jax.Array
    min_tokens: jax.Array
    prompt_len: jax.Array
    extended: jax.Array  # bool: the slot's processor state belongs to this row's request

    @classmethod
    def unpack(cls, packed: jax.Array) -> "Params":
        col = partial(sampler.column, packed)
        return cls(col("presence_penalty"), col("frequency_penalty"), col("repetition_penalty"), col("min_p"),
                   col("min_tokens"), col("prompt_len"), col("extended") > 0)


def _penalize(x: jax.Array, count: jax.Array, seen: jax.Array, p: Params) -> jax.Array:
    """Step 2 on logits x with output counts `count` and `seen` (prompt or output); p broadcast to x's rank."""
    x = jnp.where(seen, jnp.where(x > 0, x / p.repetition, x * p.repetition), x)
    return x - p.frequency * count - p.presence * (count > 0)


def process(raw: jax.Array, bias: jax.Array, stop: jax.Array, count: jax.Array, prompt: jax.Array, short: jax.Array,
            keep: jax.Array, p: Params) -> jax.Array:
    """Steps 1 and 2 but the bad words' bans, elementwise on broadcastable arrays: raw logits (fp32), the slot's
    bias, stop mask and prompt mask, the output counts at this position, whether EOS is banned (`short`) and
    whether the position is processed (`keep`); the same code for the XLA pass, the greedy kernel's tiles
    (greedy_pass.py) and the top-N candidates it re-reads."""
    x = jnp.where(short & stop, -jnp.inf, raw + bias)
    return jnp.where(keep, _penalize(x, count, prompt | (count > 0), p), raw)


def count_drafts(count: jax.Array, ids: jax.Array, inputs: jax.Array) -> jax.Array:
    """Output counts at each verify position [B, T, ...] of token ids `ids` (broadcast against [B, T, ...]): the
    committed counts `count` plus the drafts before the position (inputs[:, 1 + i], i < j), one elementwise term
    per draft so that XLA fuses it into the pass that reads it (no [B, T, V] scatter)."""
    T = inputs.shape[1]
    tail = (1,) * (ids.ndim - 2)
    for i in range(T - 1):
        later = (jnp.arange(T) > i).reshape((1, T) + tail)  # positions after draft i
        count = count + ((inputs[:, 1 + i].reshape((-1, 1) + tail) == ids) & later).astype(jnp.int32)
    return count


def process_draft(logits: jax.Array, ids: jax.Array | None, drafts: list[jax.Array], position: jax.Array,
                  state: ProcessorState, slots: jax.Array, p: Params,
                  g: grammar.GrammarState | None = None) -> jax.Array:
    """The draft head's logits [B, Vd] fp32 for the token at `position` [B], processed as the target's are (steps 1
    and 2; bad words left out), the rollout's earlier drafts (each [B]) counted after the committed output. A raw
    draft misses what penalties, logit_bias and allowed_token_ids move the target to; drafting the processed
    argmax keeps acceptance where they apply. Any draft is lossless (the next step verifies it against the
    processed target): this only makes drafts better guesses. ids: the target ids of the draft vocabulary [Vd]
    (EAGLE-3), or None (the target's vocabulary). With the grammar state g, tokens the constraint refuses after
    the committed output and the earlier drafts are left out too."""
    B, Vd = logits.shape
    if ids is None:  # whole rows
        vocab, row = jnp.arange(Vd, dtype=jnp.int32), lambda table: table[slots]
    else:
        vocab, row = ids, lambda table: slot_values(table, slots, jnp.broadcast_to(ids, (B, Vd)))
    count = row(state.counts)
    for d in drafts:
        count = count + (d[:, None] == vocab[None]).astype(jnp.int32)
    short = (position - p.prompt_len < p.min_tokens)[:, None]
    pb = jax.tree.map(lambda a: a[:, None], p)
    out = process(logits, row(state.bias), row(state.stop_mask), count, row(state.prompt_mask), short,
                  p.extended[:, None], pb)
    if g is None:
        return out
    at = grammar.row_states(g, slots, p.extended)
    for d in drafts:
        at = grammar.step(g.tables, at, d)
    return jnp.where(grammar.allowed(g.tables, at[:, None], vocab[None]), out, -jnp.inf)


class Bans(NamedTuple):
    """What the pass over the vocabulary needs beyond the slots' rows, [B, T] or [B, T, W] (small arrays)."""
    short: jax.Array  # EOS and the stop ids are banned here (output shorter than min_tokens)
    keep: jax.Array  # the position is processed: the row's own state, and the bans leave some token
    words: jax.Array  # [B, T, W]: each bad word's last token where the word bans it at the position, else -1
    grammar: jax.Array | None = None  # [B, T]: the constraint's state at the position (grammar.NONE: none)


def bans(inputs: jax.Array, q0: jax.Array, state: ProcessorState, slots: jax.Array, p: Params,
         g: grammar.GrammarState | None = None) -> Bans:
    """The positions' bans and whether each is processed (see apply); no pass over the vocabulary. With the
    grammar state g, each position's constraint state (the committed one walked through the drafts before it);
    where it allows only end tokens, min_tokens yields (the constraint ends the answer)."""
    T = inputs.shape[1]
    out_index = q0[:, None] + 1 + jnp.arange(T) - p.prompt_len[:, None]  # [B, T]: output index of each token
    short = out_index < p.min_tokens[:, None]  # [B, T]
    states = None
    if g is not None:
        states = grammar.walk(g.tables, grammar.row_states(g, slots, p.extended), inputs[:, 1:])  # [B, T]
        short = short & ~grammar.only_end(g.tables, states)
    banned, match = _bad_word_bans(inputs, q0, state.history[slots], state.bad_words[slots], p.prompt_len)
    # a stale slot's state never reaches a plain row; a position the bans would leave empty is unprocessed
    keep = p.extended[:, None] & ~_nothing_left(state, slots, short, banned, match)  # [B, T]
    return Bans(short, keep, jnp.where(match & keep[..., None], banned, -1), states)


def slot_values(table: jax.Array, slots: jax.Array, ids: jax.Array) -> jax.Array:
    """table [S+1, V] at these slots [B] and token ids [B, ...] (each < V) -> [B, ...]."""
    B = slots.shape[0]
    return table[slots[:, None], ids.reshape(B, -1)].reshape(ids.shape)


def apply(logits: jax.Array, inputs: jax.Array, q0: jax.Array, state: ProcessorState, slots: jax.Array,
          p: Params, g: grammar.GrammarState | None = None) -> jax.Array:
    """Processed logits [B, T, V] fp32 (steps 1 and 2, and the constraint's mask with the grammar state g): logits
    [B, T, V] at the positions after inputs [B, T] (inputs[:, 0] at position q0 [B]; its count and history are
    already in the state of its slot, slots [B], the rest are drafts)."""
    B, T, V = logits.shape
    ban = bans(inputs, q0, state, slots, p, g)
    raw = logits.astype(jnp.float32)
    row = lambda table: table[slots][:, None]  # noqa: E731  [B, 1, V]
    count = count_drafts(row(state.counts), jnp.arange(V, dtype=jnp.int32)[None, None], inputs)
    pb = jax.tree.map(lambda a: a[:, None, None], p)  # [B, 1, 1]
    out = process(raw, row(state.bias), row(state.stop_mask), count, row(state.prompt_mask), ban.short[..., None],
                  ban.keep[..., None], pb)
    # the bans last (-inf stays -inf under each step), as a scatter into the pass's output: [B, T, W] updates
    b, t = jnp.arange(B)[:, None, None], jnp.arange(T)[None, :, None]
    out = out.at[b, t, jnp.maximum(ban.words, 0)].min(jnp.where(ban.words >= 0, -jnp.inf, jnp.inf))
    if g is None:
        return out
    allowed = grammar.allowed_rows(g.tables, ban.grammar, V)
    out = jnp.where(allowed, out, -jnp.inf)
    # where the processors leave nothing the constraint allows (allowed_token_ids or bad words disjoint from it),
    # the constraint wins: its tokens on the raw logits (an automaton's state always allows some token)
    empty = jnp.all(out == -jnp.inf, axis=-1, keepdims=True)
    return jnp.where(empty & allowed, raw, out)


def processed_at(logits: jax.Array, inputs: jax.Array, state: ProcessorState | None, slots: jax.Array,
                 p: Params, ban: Bans | None, ids: jax.Array) -> jax.Array:
    """apply's output (or the raw logits, state None) at token ids [B, T, K] (each < V), from gathers: the values
    of a few candidates without the pass over the vocabulary."""
    raw = jnp.take_along_axis(logits, ids, axis=-1).astype(jnp.float32)
    if state is None:
        return raw
    at = lambda table: slot_values(table, slots, ids)  # noqa: E731
    pb = jax.tree.map(lambda a: a[:, None, None], p)
    x = process(raw, at(state.bias), at(state.stop_mask), count_drafts(at(state.counts), ids, inputs),
                at(state.prompt_mask), ban.short[..., None], ban.keep[..., None], pb)
    return jnp.where(jnp.any(ids[..., :, None] == ban.words[..., None, :], axis=-1), -jnp.inf, x)


def _bad_word_bans(inputs: jax.Array, q0: jax.Array, history: jax.Array, bad_words: jax.Array,
                   prompt_len: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Each bad word's last token [B, T, W] (0 where there is no word) and whether the word bans it at each
    position [B, T, W]: its other tokens end the history there. history, bad_words: the rows' [B, ...]."""
    T = inputs.shape[1]
    L = bad_words.shape[-1]
    # tokens at positions q0-L+2 .. q0 from the ring, then the drafts: position j's prefix is window[:, j:j+L-1]
    pos = q0[:, None] + jnp.arange(-(L - 2), 1)  # [B, L-1]
    past = jnp.take_along_axis(history, pos % HISTORY, axis=1)
    past = jnp.where(pos >= prompt_len[:, None], past, _BEFORE_OUTPUT)
    window = jnp.concatenate([past, inputs[:, 1:]], axis=1)  # [B, L-1 + T-1]
    prefixes = jnp.stack([window[:, j:j + L - 1] for j in range(T)], axis=1)  # [B, T, L-1]
    word_prefix, last = bad_words[:, None, :, :-1], bad_words[:, None, :, -1]  # [B,1,W,L-1], [B,1,W]
    match = jnp.all((word_prefix == -1) | (word_prefix == prefixes[:, :, None]), axis=-1) & (last >= 0)
    return jnp.broadcast_to(jnp.maximum(last, 0), match.shape), match


def _nothing_left(state: ProcessorState, slots: jax.Array, short: jax.Array, banned: jax.Array,
                  match: jax.Array) -> jax.Array:
    """[B, T]: the bans leave no token. A token survives step 1 iff its bias is finite, it is not a stop token
    while the output is short, and no matched bad word bans it: count those from the admission-time counts and
    the distinct allowed tokens that the matched words ban beyond the stops (W x W compares, no pass over V)."""
    B, T, W = banned.shape
    at = lambda table: slot_values(table, slots, banned)  # noqa: E731
    new = match & (at(state.bias) > -jnp.inf) & ~(short[..., None] & at(state.stop_mask))
    earlier = jnp.arange(W)[None, :] < jnp.arange(W)[:, None]  # [w, w']: w' comes before w
    repeat = jnp.any(new[..., None, :] & (banned[..., :, None] == banned[..., None, :]) & earlier, axis=-1)
    left = (state.num_allowed[slots][:, None] - jnp.where(short, state.num_allowed_stops[slots][:, None], 0)
            - jnp.sum(new & ~repeat, axis=-1, dtype=jnp.int32))
    return left <= 0


def distribution_scores(processed: jax.Array, probs: jax.Array, temperature: jax.Array) -> jax.Array:
    """Scores [B, T, V] whose log-softmax is the log-probability of the distribution sampled from: `probs`
    (filter_probs' output) for random rows, from the processed logits / temperature (log-softmax, not log(probs):
    exact far into the tail), -inf where probs is 0; greedy rows get the processed logits (temperature 1)."""
    greedy = (temperature <= 0)[:, None, None]
    t = jnp.where(temperature > 0, temperature, 1.0)[:, None, None]
    kept = jnp.where(greedy, processed > -jnp.inf, probs > 0)
    return jnp.where(kept, processed / t, -jnp.inf)


def pack_logprobs(scores: jax.Array, tokens: jax.Array, num: int, block_max: jax.Array | None = None) -> jax.Array:
    """[B, T, 2 + 2 num] int32 for tokens [B, T] (-1: none) under log_softmax(scores [B, T, V]): per position the
    token's logprob (fp32 bits) and rank (1 = most likely; ties count), then the top `num` logprobs (fp32 bits)
    and their ids (host: logprob_output.py). Rank and top-N are taken on the scores (the log-softmax only
    subtracts a per-row constant), so the [B, T, V] log-softmax is never written out: the row max comes from the
    block maxima (`block_max`, computed here unless the caller has them) and one pass sums the exponentials and
    counts the rank."""
    if block_max is None:
        block_max = _block_maxima(_blocks(scores))
    top = jnp.max(block_max, axis=-1, keepdims=True)  # [B, T, 1]
    top = jnp.where(top > -jnp.inf, top, 0.0)  # no finite score (never for a distribution): lse -inf
    token_score = jnp.take_along_axis(scores, jnp.maximum(tokens, 0)[..., None], axis=-1)  # [B, T, 1]
    # one variadic reduction: the sum of exponentials and the rank's count in the same pass over the scores
    total, rank = jax.lax.reduce((jnp.exp(scores - top), (scores >= token_score).astype(jnp.int32)),
                                 (jnp.float32(0), jnp.int32(0)), lambda a, b: (a[0] + b[0], a[1] + b[1]),
                                 (scores.ndim - 1,))
    lse = top + jnp.log(total)[..., None]  # [B, T, 1]
    # XLA:CPU's top_k is a fast selection (5x quicker than top_n there); XLA:GPU's is not (top_n's docstring)
    gpu = jax.default_backend() == "gpu"
    return pack_columns(token_score - lse, rank[..., None], lse, num,
                        lambda n: top_n(scores, n, block_max) if gpu else jax.lax.top_k(scores, n))


def pack_columns(token_logprob: jax.Array, rank: jax.Array, lse: jax.Array, num: int,
                 select: Callable[[int], tuple[jax.Array, jax.Array]]) -> jax.Array:
    """pack_logprobs' columns from the token's logprob, its rank and the log-sum-exp of the scores [B, T, 1] each,
    and a function giving the top `num` scores and their ids [B, T, num]."""
    bits = partial(jax.lax.bitcast_convert_type, new_dtype=jnp.int32)
    cols = [bits(token_logprob), rank]
    if num:
        values, ids = select(num)
        cols += [bits(values - lse), ids.astype(jnp.int32)]
    return jnp.concatenate(cols, axis=-1)


# ids per block of the block maxima (greedy_from_blocks, top_n), and the widest top_k top_n runs: with num = 20
# (the engine's max_logprobs) every selection stays at most 20 x 16 = 320 wide (XLA:GPU sorted 384 rows of 640
# keys in 13 us, of 320 in 7 us, on the H200)
BLOCK, SELECT_WIDTH = 16, 1024


def _blocks(x: jax.Array) -> jax.Array:
    """[..., V] -> [..., ceil(V / BLOCK), BLOCK], padded with -inf."""
    *lead, V = x.shape
    pad = [(0, 0)] * len(lead) + [(0, (-V) % BLOCK)]
    return jnp.pad(x, pad, constant_values=-jnp.inf).reshape(*lead, -1, BLOCK)


def _block_maxima(blocks: jax.Array) -> jax.Array:
    """_blocks(x) [..., n, BLOCK] -> the maximum of each block, [..., n]. Behind an optimization barrier: XLA folds
    a max over these into one reduce over x itself, so the row max taken from them re-read all of x (a 20 us pass
    over the [96, 4, 49152] fp32 scores on the H200, 2026-12-04) instead of 1 / BLOCK of it."""
    return jax.lax.optimization_barrier(jnp.max(blocks, axis=-1))


def _order_key(x: jax.Array) -> jax.Array:
    """fp32 -> int32 keys in the same order (-inf included), so that padding can sit below every float."""
    key = jax.lax.bitcast_convert_type(x, jnp.int32)
    return jnp.where(key < 0, key ^ jnp.int32(0x7FFFFFFF), key)


def greedy_from_blocks(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(argmax of x [..., V] over the last axis, int32, the first id among ties as jnp.argmax; the block maxima
    [..., ceil(V / BLOCK)]), from one plain max-reduction over x: the first block holding the row max is the
    argmax's, and the argmax inside it reads only that block."""
    blocks = _blocks(x)
    block_max = _block_maxima(blocks)
    best = jnp.argmax(block_max, axis=-1)[..., None]  # [..., 1]
    inside = jnp.argmax(jnp.take_along_axis(blocks, best[..., None], axis=-2)[..., 0, :], axis=-1)  # [...]
    return (best[..., 0] * BLOCK + inside).astype(jnp.int32), block_max


def top_n(x: jax.Array, num: int, block_max: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """`jax.lax.top_k(x, num)` over the last axis, exact in values, from a fraction of the candidates: the top
    `num` elements lie in the `num` blocks of BLOCK consecutive ids with the largest maxima (a block holding one
    of them has a maximum at least as large as it), so the block maxima (`block_max`, computed unless given) pick
    those blocks, by the same rule applied to them while they are wider than SELECT_WIDTH, and top_k runs on
    num * BLOCK candidates instead of V. XLA:GPU's top_k sorts each row, and rows wider than about a thousand
    keys sort much slower (the full-vocabulary top_k costs 1.7 ms for 384 rows x 49,152 at num = 20 on the H200,
    bench/sampler_cost.py; with blocks of 128, the 2,560-wide second selection took 64 us of the verify step,
    against 30 us for all of this one's with blocks of 32 and 19 us with blocks of 16). Among tied values the
    ids may differ from top_k's. Ids are int32 < V."""
    V = x.shape[-1]
    if V <= SELECT_WIDTH:
        _, ids = jax.lax.top_k(_order_key(x), min(num, V))
        return jnp.take_along_axis(x, ids, axis=-1), ids.astype(jnp.int32)
    if block_max is None:
        block_max = _block_maxima(_blocks(x))
    return top_n_of_blocks(block_max, num, V, lambda ids: jnp.take_along_axis(x, ids, axis=-1))


def top_n_of_blocks(block_max: jax.Array, num: int, V: int,
                    values_at: Callable[[jax.Array], jax.Array]) -> tuple[jax.Array, jax.Array]:
    """top_n's selection from the block maxima [..., ceil(V / BLOCK)] of x and a function giving x at ids [..., K]
    (each < V), for when x itself was never written out (greedy_pass)."""
    _, chosen = top_n(block_max, min(num, block_max.shape[-1]))  # [..., num blocks]
    ids = (chosen[..., None] * BLOCK + jnp.arange(BLOCK)).reshape(*chosen.shape[:-1], -1)  # [..., num * BLOCK]
    candidates = values_at(jnp.minimum(ids, V - 1))
    # padding below every float (-inf included), so a padded id is never chosen
    key = jnp.where(ids < V, _order_key(candidates), jnp.iinfo(jnp.int32).min)
    _, at = jax.lax.top_k(key, num)
    return jnp.take_along_axis(candidates, at, axis=-1), jnp.take_along_axis(ids, at, axis=-1).astype(jnp.int32)


def sample(logits: jax.Array, inputs: jax.Array, num_valid: jax.Array, q0: jax.Array, state: ProcessorState | None,
           slots: jax.Array, packed: jax.Array, filtered: bool, num_logprobs: int, all_greedy: bool = False,
           g: grammar.GrammarState | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`sampler.rejection_sample` of the drafts inputs[:, 1:] against the processed target (min_p included),
    keyed on positions q0 + 1 ..; returns (tokens [B, T], n_acc [B], logprobs of the tokens [B, T, 2 + 2 num]).
    state None: no row of the batch has a processor, so the target is the raw one (no state read, no pass over
    the logits for them); else the rows' state is that of their slots [B]. all_greedy (static): every row is
    greedy, so the drafts are checked against the processed argmax and the sampling distribution (softmax, min_p,
    random draws) is never built (greedy_pass.sample does the same in one GPU kernel). g: the grammar state when
    some row has a structured-output constraint (engine/grammar.py), else None."""
    temperature, top_k, top_p, seeds = sampler.unpack_params(packed)
    p = Params.unpack(packed)
    processed = logits.astype(jnp.float32) if state is None else apply(logits, inputs, q0, state, slots, p, g)
    if all_greedy:
        target, block_max = greedy_from_blocks(processed)  # the logprobs' pass reuses the block maxima
        tokens, n_acc = sampler.greedy_accept(target, inputs[:, 1:], num_valid)
        return tokens, n_acc, pack_logprobs(processed, tokens, num_logprobs, block_max)  # greedy rows' scores
    probs = sampler.filter_probs(processed, temperature, top_k, top_p, filtered, None if state is None else p.min_p)
    tokens, n_acc = sampler.accept(probs, inputs[:, 1:], num_valid, seeds, q0 + 1)
    return tokens, n_acc, pack_logprobs(distribution_scores(processed, probs, temperature), tokens, num_logprobs)


def count_tokens(state: ProcessorState, slots: jax.Array, tokens: jax.Array, positions: jax.Array,
                 live: jax.Array) -> ProcessorState:
    """Commit output tokens [B, T] at positions [B, T] of these slots [B] where `live`: counts and history."""
    s = slots[:, None]
    counts = state.counts.at[s, jnp.maximum(tokens, 0)].add(live.astype(jnp.int32))
    column = jnp.where(live, positions % HISTORY, HISTORY)  # out of range: dropped
    history = state.history.at[s, column].set(tokens, mode="drop")
    return replace(state, counts=counts, history=history)


def prefill_tokens(state: ProcessorState, slots: jax.Array, tokens: jax.Array, positions: jax.Array,
                   prompt_len: jax.Array, recent: jax.Array) -> ProcessorState:
    """A prefill chunk's tokens [N] (each of slot `slots` [N], padding: the spare row): prompt positions go into
    the prompt mask, later ones (a preempted request's output) are counted; `recent` [N] marks the chunk's last
    HISTORY tokens of each row, which go into the history ring."""
    is_prompt = positions < prompt_len
    prompt_mask = state.prompt_mask.at[slots, jnp.where(is_prompt, tokens, state.bias.shape[1])].set(
        True, mode="drop")
    counts = state.counts.at[slots, tokens].add((~is_prompt).astype(jnp.int32))
    column = jnp.where(recent, positions % HISTORY, HISTORY)
    history = state.history.at[slots, column].set(tokens, mode="drop")
    return replace(state, counts=counts, prompt_mask=prompt_mask, history=history)


def admit(state: ProcessorState, slots: jax.Array, mask_from: jax.Array, bias: jax.Array, stop_mask: jax.Array,
          bad_words: jax.Array) -> ProcessorState:
    """New requests in these slots [R]: their rows set (bias [R, V], stop_mask [R, V], bad_words [R, W, L]),
    counts cleared, and the prompt mask cleared (prefill fills it) or copied from slot mask_from [R] (a parallel
    sample's leader, whose prompt is prefilled; the spare row num_slots: none)."""
    spare = state.counts.shape[0] - 1
    shared = jnp.where((mask_from < spare)[:, None], state.prompt_mask[mask_from], False)
    allowed = bias > -jnp.inf
    return replace(state, counts=state.counts.at[slots].set(0), prompt_mask=state.prompt_mask.at[slots].set(shared),
                   bias=state.bias.at[slots].set(bias), stop_mask=state.stop_mask.at[slots].set(stop_mask),
                   bad_words=state.bad_words.at[slots].set(bad_words),
                   num_allowed=state.num_allowed.at[slots].set(jnp.sum(allowed, axis=1, dtype=jnp.int32)),
                   num_allowed_stops=state.num_allowed_stops.at[slots].set(
                       jnp.sum(allowed & stop_mask, axis=1, dtype=jnp.int32)))
