"""The extended step's pass over the vocabulary for all-greedy batches, as one Pallas GPU (Triton) kernel.

XLA runs a greedy batch with processors or logprobs as three passes over [B, T, V]: processing writes the processed
logits out in fp32, then the block maxima (the argmax, top-N's blocks) and the sum of exponentials with the rank
read them back. Here one program per (row, tile of the vocabulary) reads its tile of the row's logits at every
position (the lm_head's bf16 product) and of its slot's processor rows, once; it processes each tile with
processors.process and keeps, per position, the maximum, the first id that holds it (the greedy token), how many ids
tie with it, the sum of exponentials under it and each block's maximum. The processed logits are never written. A
greedy token is its position's argmax, so its logprob is max - lse and its rank the number of ties; top-N re-reads
only the candidates its blocks pick (processors.top_n_of_blocks, processors.processed_at). At SmolLM2's 96 rows x
4 verify positions with logprobs=5 and a presence penalty (H100, kernel sums): 52 us against XLA's 119, the step's
device time over greedy 0.092 ms instead of 0.144 (bench/results/20261205-greedy-pass/).

processors.sample is the oracle: tests/test_greedy_pass.py runs this kernel in Pallas's interpreter against it.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jaxspec.engine import processors, sampler
from jaxspec.engine.processors import BLOCK, ProcessorState

TILE_BLOCKS = 64  # blocks of BLOCK ids a tile holds at most (1,024 ids), a power of two that divides V / BLOCK
# programs to aim for over rows x slices of the vocabulary: short programs, one tile each where the rows allow. On the
# H200 (SmolLM2, 96 rows x 4 positions, fp32 logits) ten slices of five tiles took 76 us, each program a long chain of
# dependent loads and reductions; one tile a program (and bf16 logits) took 52 us on an H100
PROGRAMS = 8192


class Stats(NamedTuple):
    """The processed logits' statistics at each verify position [B, T]."""
    argmax: jax.Array  # int32, the first id among ties (jnp.argmax's)
    token_logprob: jax.Array  # fp32: the argmax's log-probability, max - lse
    ties: jax.Array  # int32: ids holding the maximum, the argmax's rank
    lse: jax.Array  # fp32: log-sum-exp (-inf where nothing is finite)
    block_max: jax.Array  # [B, T, V / BLOCK] fp32: each block's maximum


def supported(vocab_size: int) -> bool:
    """The kernel reads the vocabulary as rows of BLOCK ids."""
    return vocab_size % BLOCK == 0


def sample(logits: jax.Array, inputs: jax.Array, num_valid: jax.Array, q0: jax.Array, state: ProcessorState | None,
           slots: jax.Array, packed: jax.Array, num_logprobs: int,
           interpret: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:
    """processors.sample for an all-greedy batch (same arguments and results), the pass over the vocabulary in
    one kernel; `interpret` runs it in Pallas's interpreter (tests on the CPU)."""
    p = processors.Params.unpack(packed)
    ban = None if state is None else processors.bans(inputs, q0, state, slots, p)
    stats = statistics(logits, inputs, state, slots, p, ban, interpret)
    tokens, n_acc = sampler.greedy_accept(stats.argmax, inputs[:, 1:], num_valid)
    values_at = partial(processors.processed_at, logits, inputs, state, slots, p, ban)
    V = logits.shape[-1]
    return tokens, n_acc, processors.pack_columns(
        stats.token_logprob[..., None], stats.ties[..., None], stats.lse[..., None], num_logprobs,
        lambda n: processors.top_n_of_blocks(stats.block_max, n, V, values_at))


def statistics(logits: jax.Array, inputs: jax.Array, state: ProcessorState | None, slots: jax.Array,
               p: processors.Params, ban: processors.Bans | None, interpret: bool = False) -> Stats:
    """The statistics of processors.apply(logits, ...) (of the raw logits, state None) at every position; logits
    [B, T, V] in any float dtype (bf16 as the lm_head's product comes out: read at half the bytes of fp32)."""
    B, T, V = logits.shape
    NB = V // BLOCK
    tile = next(r for r in (TILE_BLOCKS >> i for i in range(TILE_BLOCKS.bit_length())) if NB % r == 0)
    chunks = NB // tile
    per_split = pl.cdiv(chunks, max(1, min(chunks, PROGRAMS // B)))
    splits = pl.cdiv(chunks, per_split)
    lanes = max(2, 1 << (T - 1).bit_length())  # positions padded to a power of two for the stats' stores
    operands = [logits.reshape(B * T * NB, BLOCK)]  # converted to fp32 tile by tile, in the kernel
    if state is not None:
        flags = ban.short.astype(jnp.int32) | (ban.keep.astype(jnp.int32) << 1)
        num_bans = jnp.where(jnp.any(ban.words >= 0, axis=-1), ban.words.shape[-1], 0)
        penalties = jnp.stack([p.presence, p.frequency, p.repetition], axis=1).astype(jnp.float32)
        operands = [slots.astype(jnp.int32), inputs.astype(jnp.int32).reshape(-1), flags.reshape(-1),
                    penalties.reshape(-1), num_bans.reshape(-1).astype(jnp.int32), ban.words.reshape(-1),
                    *operands, *(x.reshape(-1, BLOCK) for x in (state.counts, state.prompt_mask, state.bias,
                                                                state.stop_mask))]
    from jax.experimental.pallas import triton as plgpu

    stat = lambda dtype: jax.ShapeDtypeStruct((B * splits * lanes,), dtype)  # noqa: E731
    block_max, m, arg, ties, total = pl.pallas_call(
        partial(_kernel, T=T, words=0 if ban is None else ban.words.shape[-1], num_blocks=NB, tile=tile,
                chunks=chunks, per_split=per_split, lanes=lanes, process=state is not None),
        grid=(B, splits),
        out_shape=[jax.ShapeDtypeStruct((B * T * NB,), jnp.float32), stat(jnp.float32), stat(jnp.int32),
                   stat(jnp.int32), stat(jnp.float32)],
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
        interpret=interpret,
        name="jaxspec_greedy_pass",
    )(*operands)
    m, arg, ties, total = (x.reshape(B, splits, lanes)[..., :T] for x in (m, arg, ties, total))
    # merge the slices: the maximum, the first slice's argmax among those that hold it, their ties, the sums
    top = jnp.max(m, axis=1)  # [B, T]
    holds = m == top[:, None]
    base = jnp.where(top > -jnp.inf, top, 0.0)
    lse = base + jnp.log(jnp.sum(total * jnp.exp(m - base[:, None]), axis=1))
    return Stats(argmax=jnp.min(jnp.where(holds, arg, jnp.iinfo(jnp.int32).max), axis=1),
                 token_logprob=top - lse, ties=jnp.sum(jnp.where(holds, ties, 0), axis=1), lse=lse,
                 block_max=block_max.reshape(B, T, NB))


def _kernel(*refs, T: int, words: int, num_blocks: int, tile: int, chunks: int, per_split: int, lanes: int,
            process: bool):
    """Program (b, s): tiles s * per_split .. of row b's vocabulary (`tile` blocks of BLOCK ids each), at every
    position t < T. Inputs, flattened: slots [B], inputs [B * T] (the drafts are inputs[b, 1:]), flags [B * T]
    (1: EOS banned, 2: processed), penalties [B * 3] (presence, frequency, repetition), number of bans [B * T]
    (0, or `words` where a bad word matched), bans [B * T * words] (-1: none), then the logits and, with
    `process`, the slot table's counts, prompt mask, bias and stop mask, as rows of BLOCK ids. Outputs: the block
    maxima [B * T * num_blocks], and per (b, s) the `lanes` positions' maximum, argmax, ties and sum of
    exponentials under the maximum."""
    if process:
        (slots_ref, inputs_ref, flags_ref, pen_ref, num_bans_ref, bans_ref, logits_ref, counts_ref, prompt_ref,
         bias_ref, stop_ref, block_max_ref, m_ref, arg_ref, ties_ref, total_ref) = refs
    else:
        logits_ref, block_max_ref, m_ref, arg_ref, ties_ref, total_ref = refs
    b, s = pl.program_id(0), pl.program_id(1)
    column = jnp.arange(BLOCK, dtype=jnp.int32)[None, :]
    if process:
        slot = slots_ref[b]
        p = processors.Params(presence=pen_ref[3 * b], frequency=pen_ref[3 * b + 1], repetition=pen_ref[3 * b + 2],
                              min_p=None, min_tokens=None, prompt_len=None, extended=None)
        drafts = [inputs_ref[b * T + 1 + i] for i in range(T - 1)]
        flags = [flags_ref[b * T + t] for t in range(T)]
        num_bans = [num_bans_ref[b * T + t] for t in range(T)]

    def body(c, carry):
        first = c * tile
        ids = (first + jnp.arange(tile, dtype=jnp.int32))[:, None] * BLOCK + column  # [tile, BLOCK]
        if process:
            rows = pl.ds(slot * num_blocks + first, tile)
            counts, prompt, bias, stop = (r[rows, :] for r in (counts_ref, prompt_ref, bias_ref, stop_ref))
        out = []
        ats = [pl.ds((b * T + t) * num_blocks + first, tile) for t in range(T)]  # position t's rows of BLOCK ids
        tiles = [logits_ref[at, :] for at in ats]  # every position's load first
        for t, at in enumerate(ats):
            x = tiles[t].astype(jnp.float32)
            if process:
                count = counts
                for i in range(t):  # the drafts before position t are output there
                    count = count + (ids == drafts[i]).astype(jnp.int32)
                x = processors.process(x, bias, stop, count, prompt, (flags[t] & 1) > 0, (flags[t] & 2) > 0, p)
                base = (b * T + t) * words
                x = jax.lax.fori_loop(0, num_bans[t], lambda w, x, base=base: jnp.where(
                    ids == bans_ref[base + w], -jnp.inf, x), x)
            block_max = jnp.max(x, axis=1)  # [tile]
            block_max_ref[at] = block_max
            out.append(_update(carry[t], x, ids, jnp.max(block_max)))
        return tuple(out)

    init = tuple((jnp.float32(-jnp.inf), jnp.int32(0), jnp.int32(0), jnp.float32(0)) for _ in range(T))
    acc = jax.lax.fori_loop(s * per_split, jnp.minimum((s + 1) * per_split, chunks), body, init)
    lane = jnp.arange(lanes)
    at = pl.ds((b * pl.num_programs(1) + s) * lanes, lanes)
    for i, (ref, fill) in enumerate(((m_ref, -jnp.inf), (arg_ref, 0), (ties_ref, 0), (total_ref, 0.0))):
        vec = jnp.full((lanes,), fill, ref.dtype)
        for t in range(T):
            vec = jnp.where(lane == t, acc[t][i], vec)
        ref[at] = vec


def _update(acc: tuple, x: jax.Array, ids: jax.Array, tile_max: jax.Array) -> tuple:
    """One tile x [tile, BLOCK] (ids alike, maximum tile_max) into a position's (maximum, argmax, ties, sum of
    exponentials under the maximum); tiles come in vocabulary order, so an equal maximum keeps the earlier id."""
    m, arg, ties, total = acc
    top = jnp.maximum(m, tile_max)
    base = jnp.where(top > -jnp.inf, top, 0.0)
    holds = x == tile_max
    first = jnp.min(jnp.where(holds, ids, jnp.iinfo(jnp.int32).max))
    n = jnp.sum(holds.astype(jnp.int32))
    total = total * jnp.exp(m - base) + jnp.sum(jnp.exp(x - base))
    ties = jnp.where(tile_max > m, n, jnp.where(tile_max == m, ties + n, ties))
    return top, jnp.where(tile_max > m, first, arg), ties, total
