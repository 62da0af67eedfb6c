"""The jitted steps: device arrays in, device arrays out; caches and slot state donated.

`decode_step` is DESIGN's spec_step: verify [last_token, d_1..d_k] for every scheduled slot, rejection-sample,
draft k new tokens with the EAGLE head (or look them up, engine/ngram.py), commit seq_len/last_token/drafts on
device. With k = 0 (no head) it is plain decoding through the same code. `prefill_step` runs ragged prompt chunks
of several sequences as one flat row, samples each finished prompt's first token and, with a head, fills the draft
cache and makes the first drafts. The host reads only `out`: [rows, k+2] int32 = (count, tokens..., then -1 where
a draft was not emitted, -2 where the row had none), written over a donated buffer of its shape (`compiled`).

Host plan layouts (few, large arrays: each jit argument leaf costs host time per call):
  decode  rows_i32 [B, 1 + pages]: slot (== num_slots for padding rows), block table (-1 = no page)
  prefill tok_i32 [N, 4]: token, next token (the draft head's input; -1 = the token sampled here), row (-1 =
          padding), position;  rows_i32 [R, 3 + pages]: slot, index of the row's last token in the flat
          chunk, is_last (the chunk ends the prompt), block table
  both    sampling [rows, C] uint32 (sampler.COLUMNS)

The extended variant (StepSpec.extended: some row needs a logits processor or logprobs, engine/processors.py)
samples from the processed distribution, commits the processor state and appends each emitted token's logprobs to
`out` (a decode batch where no row has a processor, StepSpec.processors False, samples from the raw target and
leaves the processor state alone): decode [B, k+2 + (k+1) W], prefill [R, 2 + W] (W = 2 + 2 num_logprobs,
processors.pack_logprobs); with prompt_logprobs, prefill's `out` has N more rows, one per flat token (columns 2..:
the next token's logprobs under the raw target, as vLLM's prompt logprobs).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp

from jaxspec.engine import grammar, greedy_pass, ngram, processors, sampler
from jaxspec.models import eagle, llama
from jaxspec.models.attention import AttnBatch, KVCache
from jaxspec.parallel import StepShardings


@jax.tree_util.register_static
@dataclass(frozen=True, eq=False)
class StepSpec:
    """Everything static about a step: model shapes, k (the drafts this step verifies and makes; the slot state has
    room for num_speculative_tokens' maximum K), limits and the batch's sampling mode.

    Compared by identity (`canonical` makes equal specs one object): jit compares static arguments on every call,
    and identity is decided in C, where a signal cannot land. A Python __eq__ interrupted there (Ctrl-C during a
    dispatch) comes out of jit as a ValueError that has lost the interrupt."""
    target: llama.Config
    draft: eagle.EagleConfig | None
    num_speculative_tokens: int
    page_size: int
    max_model_len: int
    all_greedy: bool = True
    filtered: bool = False
    extended: bool = False  # processors and logprobs (decode: all_greedy skips the sampling distribution)
    processors: bool = False  # extended decode: some row has a logits processor (else logprobs alone)
    grammar: bool = False  # extended: some row has a structured-output constraint (engine/grammar.py)
    prompt_logprobs: bool = False  # prefill only: logprobs of every prompt token
    num_logprobs: int = 0  # the top-N the extended step returns per token (the engine's max_logprobs)
    num_steps: int = 1  # multi_decode_step: decode steps one dispatch runs
    # prompt lookup (engine/ngram.py): (prompt_lookup_min, prompt_lookup_max). Without a draft head the drafts are
    # looked up (ngram speculation); with one, the lookup is the head's fallback (_lookup_fallback)
    ngram: tuple[int, int] | None = None
    # Benchmarks with random weights: accept each draft position with this probability instead of by the
    # target (all the work is still done; the emitted text is meaningless). None: real rejection sampling.
    synthetic_acceptance: float | None = None
    # Tensor parallelism: the shardings the donated outputs are pinned to (None: one device).
    shardings: StepShardings | None = None

    def canonical(self) -> "StepSpec":
        """The one StepSpec object with these fields."""
        return _CANONICAL.setdefault(tuple(getattr(self, f.name) for f in dataclasses.fields(self)), self)

    @property
    def aux_layers(self) -> tuple[int, ...]:
        return self.draft.aux_layers if self.draft is not None and self.draft.method == "eagle3" else ()


_CANONICAL: dict[tuple, StepSpec] = {}


@partial(jax.tree_util.register_dataclass, data_fields=["target", "draft"], meta_fields=[])
@dataclass
class Caches:
    target: KVCache
    draft: KVCache | None


@partial(jax.tree_util.register_dataclass,
         data_fields=["tokens", "seq_len", "num_drafts", "proc", "grammar", "history", "looked_up", "unused_drafts"],
         meta_fields=[])
@dataclass
class SlotState:
    """Per slot, on device. One extra row (index num_slots) absorbs the writes of padding rows."""
    tokens: jax.Array  # [S + 1, 1 + K] int32: last_token, then up to K drafts to verify next
    seq_len: jax.Array  # [S + 1] int32: tokens in the sequence, last_token included
    # [S + 1] int32: how many of `tokens`' drafts the last step made (steps may run with any k <= K: a step never
    # accepts more drafts than there are)
    num_drafts: jax.Array
    proc: processors.ProcessorState  # what the extended step's logits processors read
    grammar: grammar.GrammarState  # structured outputs: the automata pool and each slot's state in it
    # [S + 1, max_model_len] int32 with prompt lookup (each sequence's tokens by position); None otherwise, so
    # that no other step carries one more argument leaf
    history: jax.Array | None
    # with prompt lookup as a head's fallback: whether the drafts in `tokens` were looked up, [S + 1] bool, and the
    # drafts the other source proposed, [S + 1, K] int32 (-3 past its count: no token is -3)
    looked_up: jax.Array | None = None
    unused_drafts: jax.Array | None = None

    @classmethod
    def init(cls, num_slots: int, max_k: int, vocab_size: int, grammar_states: int = 0,
             grammar_transitions: int = 0, history_len: int = 0, lookup_fallback: bool = False) -> "SlotState":
        return cls(tokens=jnp.zeros((num_slots + 1, 1 + max_k), jnp.int32),
                   seq_len=jnp.ones((num_slots + 1,), jnp.int32), num_drafts=jnp.zeros((num_slots + 1,), jnp.int32),
                   proc=processors.ProcessorState.init(num_slots, vocab_size),
                   grammar=grammar.GrammarState.init(num_slots, vocab_size, grammar_states, grammar_transitions),
                   history=jnp.zeros((num_slots + 1, history_len), jnp.int32) if history_len else None,
                   looked_up=jnp.zeros((num_slots + 1,), bool) if lookup_fallback else None,
                   unused_drafts=jnp.full((num_slots + 1, max_k), NO_DRAFT, jnp.int32) if lookup_fallback else None)


def slot_mapping(block_tables: jax.Array, rows: jax.Array, positions: jax.Array, valid: jax.Array,
                 spec: StepSpec) -> jax.Array:
    """Cache slot of each token (page * page_size + offset), -1 where nothing may be written: padding, positions
    past max_model_len, or pages the host has not allocated (look-ahead drafts)."""
    pages = block_tables.shape[1]
    page_idx = positions // spec.page_size
    page = block_tables[rows, jnp.clip(page_idx, 0, pages - 1)]
    ok = valid & (positions >= 0) & (positions < spec.max_model_len) & (page_idx < pages) & (page >= 0)
    return jnp.where(ok, page * spec.page_size + positions % spec.page_size, -1).astype(jnp.int32)


def _draft_rollout(tw: llama.Weights, dw: eagle.EagleWeights, dkv: KVCache, spec: StepSpec, h: jax.Array,
                   start: jax.Array, block_tables: jax.Array, valid: jax.Array, slots: jax.Array,
                   proc: processors.ProcessorState | None, sampling: jax.Array,
                   g: grammar.GrammarState | None = None) -> tuple[jax.Array, KVCache]:
    """From the head's output h [B, H] at the last verified pair, greedy-draft k tokens: the first from h, then
    k-1 single-token passes at positions start, start+1, ... (fixed trip count, unrolled). With the processor
    state proc (committed up to start; None: no row has a processor) each draft is the argmax of the head's
    processed logits (processors.process_draft)."""
    B = h.shape[0]
    ids, params = None, None
    if proc is not None:
        params = processors.Params.unpack(sampling)
        if spec.draft.method != "eagle":  # its own, smaller vocabulary
            ids = eagle.to_target_ids(dw, spec.draft, jnp.arange(spec.draft.draft_vocab_size, dtype=jnp.int32))
    drafts: list[jax.Array] = []

    def draft(h: jax.Array) -> jax.Array:
        process = None if proc is None else partial(processors.process_draft, ids=ids, drafts=drafts,
                                                    position=start + 1 + len(drafts), state=proc, slots=slots,
                                                    p=params, g=g)
        return eagle.draft_tokens(dw, spec.draft, tw, h, process)  # [B]

    d = draft(h)  # [B]
    drafts.append(d)
    rows = jnp.arange(B)[:, None]
    for i in range(spec.num_speculative_tokens - 1):
        pos = (start + i)[:, None]  # [B, 1]
        batch = AttnBatch(block_tables, slot_mapping(block_tables, rows, pos, valid[:, None], spec))
        out, dkv = eagle.forward(dw, spec.draft, tw.embed, d[:, None], h[:, None], pos, dkv, batch,
                                 from_target=False)
        h = out[:, 0]
        d = draft(h)
        drafts.append(d)
    return jnp.stack(drafts, axis=1), dkv


NO_DRAFT = -3  # SlotState.unused_drafts past the other source's count (emitted tokens are >= 0, or -1 / -2)


def _lookup_fallback(history: jax.Array, state: SlotState, slots: jax.Array, total: jax.Array, emitted: jax.Array,
                     n_acc: jax.Array, verified: jax.Array, head_drafts: jax.Array,
                     spec: StepSpec) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Prompt lookup as the head's fallback. Each row drafts from one source, the head or the lookup, and keeps the
    other's drafts; after a step that verified drafts, a row drafts by lookup (where it finds a match) only if the
    lookup's drafts were accepted, or would have been, strictly further than the head's along the tokens the
    target emitted, else by the head. A head cannot draft what it never learned to: an EAGLE-3 head drafts only its
    reduced vocabulary, and an answer that loops on a token outside it gets one token a step, which the lookup
    drafts whole. Comparing the two on the same tokens, ties to the head, keeps a head that mostly drafts well from
    handing its steps to a lookup that does worse. emitted [B, k+1]: the step's tokens (accepted drafts, then the
    target's; -1 past them), n_acc [B]: the drafts accepted, verified [B]: the row had drafts to verify. Returns
    (drafts [B, k], their count [B], looked_up, unused_drafts)."""
    k = spec.num_speculative_tokens
    K = state.unused_drafts.shape[1]
    was = state.looked_up[slots]
    other = state.unused_drafts[slots][:, :k]
    agree = jnp.sum(jnp.cumprod((other == emitted[:, :k]).astype(jnp.int32), axis=1), axis=1)  # [B]
    want = jnp.where(verified, jnp.where(was, n_acc > agree, agree > n_acc), was)
    looked, count = ngram.propose(history, slots, total, k, *spec.ngram, spec.max_model_len)
    use = want & (count > 0)
    drafts = jnp.where(use[:, None], looked, head_drafts)
    unused = jnp.where(use[:, None], head_drafts, jnp.where(jnp.arange(k) < count[:, None], looked, NO_DRAFT))
    unused = jnp.pad(unused, ((0, 0), (0, K - k)), constant_values=NO_DRAFT)
    return (drafts, jnp.where(use, count, k), state.looked_up.at[slots].set(use),
            state.unused_drafts.at[slots].set(unused))


def _synthetic_accept(logits: jax.Array, drafts: jax.Array, num_valid: jax.Array, seeds: jax.Array,
                      positions: jax.Array, rate: float) -> tuple[jax.Array, jax.Array]:
    """Accept draft j with probability `rate` (keyed on seed and position), then emit the target's argmax."""
    k = drafts.shape[1]
    keys = sampler.token_keys(seeds, positions[:, None] + jnp.arange(k, dtype=jnp.int32))  # [B, k]
    u = jax.vmap(jax.vmap(lambda key: jax.random.uniform(jax.random.fold_in(key, 7))))(keys)
    accepted = (u < rate) & (jnp.arange(k) < num_valid[:, None])
    n_acc = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1), axis=1)
    last = jnp.take_along_axis(sampler.greedy(logits), n_acc[:, None], axis=1)  # [B, 1]
    j = jnp.arange(k + 1)
    padded = jnp.pad(drafts, ((0, 0), (0, 1)))
    emitted = jnp.where(j < n_acc[:, None], padded, jnp.where(j == n_acc[:, None], last, -1))
    return emitted.astype(jnp.int32), n_acc


def _pin(spec: StepSpec, caches: Caches, state: SlotState, out: jax.Array) -> tuple[Caches, SlotState, jax.Array]:
    """Under tensor parallelism, give the outputs their inputs' shardings: they are the next call's inputs, and any
    other sharding would recompile the step."""
    s = spec.shardings
    if s is None:
        return caches, state, out
    pin = jax.lax.with_sharding_constraint
    draft = None if caches.draft is None else pin(caches.draft, s.draft_kv)
    return Caches(pin(caches.target, s.target_kv), draft), pin(state, s.replicated), pin(out, s.replicated)


def _attn_tables(block_tables: jax.Array) -> jax.Array:
    return jnp.maximum(block_tables, 0)  # unallocated entries are never visible; keep kernels' reads in bounds


def greedy_kernel(spec: StepSpec, vocab_size: int) -> str | None:
    """How an all-greedy extended decode step runs its pass over the vocabulary: greedy_pass's kernel ("pallas", or
    "pallas-interpret" where the attention runs in Pallas's interpreter) or None (XLA: processors.sample)."""
    cfg = spec.target
    if (spec.all_greedy and not spec.grammar and cfg.kernel.greedy_pass and cfg.tp_size == 1
            and greedy_pass.supported(vocab_size) and cfg.attn_impl in ("pallas", "pallas-interpret")):
        return cfg.attn_impl
    return None


def decode_step(tw: llama.Weights, dw: eagle.EagleWeights | None, caches: Caches, state: SlotState,
                rows_i32: jax.Array, sampling: jax.Array, spec: StepSpec) -> tuple[Caches, SlotState, jax.Array]:
    k = spec.num_speculative_tokens
    S = state.seq_len.shape[0] - 1
    slots, tables = rows_i32[:, 0], rows_i32[:, 1:]
    B = slots.shape[0]
    valid = slots < S
    tokens = state.tokens[slots, :1 + k]  # [B, 1+k]: last_token, drafts
    n = state.seq_len[slots]  # [B]
    positions = n[:, None] - 1 + jnp.arange(k + 1, dtype=jnp.int32)  # [B, k+1]
    rows = jnp.arange(B)[:, None]
    batch = AttnBatch(_attn_tables(tables), slot_mapping(tables, rows, positions, valid[:, None], spec))

    # 1. verify
    hidden, aux, target_kv = llama.forward(tw, spec.target, tokens, positions, caches.target, batch,
                                           spec.aux_layers)
    product = llama.lm_head(tw, hidden, dtype=None)  # [B, k+1, V] in the weights' dtype
    logits = product.astype(jnp.float32)
    # 2. accept: emitted tokens sit at positions n .. n+n_acc, which must stay below max_model_len
    temperature, top_k, top_p, seeds = sampler.unpack_params(sampling)
    num_valid = jnp.minimum(jnp.clip(spec.max_model_len - 1 - n, 0, k), state.num_drafts[slots])
    g = state.grammar if spec.grammar else None
    if spec.extended:
        proc = state.proc if spec.processors else None
        kernel = greedy_kernel(spec, logits.shape[-1])
        if kernel is not None:
            emitted, n_acc, logprobs = greedy_pass.sample(product, tokens, num_valid, n - 1, proc, slots, sampling,
                                                          spec.num_logprobs, interpret=kernel == "pallas-interpret")
        else:
            emitted, n_acc, logprobs = processors.sample(logits, tokens, num_valid, n - 1, proc, slots, sampling,
                                                         spec.filtered, spec.num_logprobs, spec.all_greedy, g)
    else:
        emitted, n_acc = sampler.rejection_sample(logits, tokens[:, 1:], num_valid, temperature, top_k, top_p,
                                                  seeds, n, spec.all_greedy, spec.filtered)
    if spec.synthetic_acceptance is not None:
        emitted, n_acc = _synthetic_accept(logits, tokens[:, 1:], num_valid, seeds, n, spec.synthetic_acceptance)
    new_last = jnp.take_along_axis(emitted, n_acc[:, None], axis=1)  # [B, 1]
    # the processor state counts the emitted tokens before drafting: the drafts are processed after them. Only
    # processors read the counts (a logprobs request's rows are left as admitted).
    proc, gstate = state.proc, state.grammar
    if spec.processors:
        j = jnp.arange(k + 1)
        proc = processors.count_tokens(proc, slots, emitted, n[:, None] + j, j <= n_acc[:, None])
    if g is not None:  # the constraint's state after the emitted tokens, before the drafts that follow them
        own = processors.Params.unpack(sampling).extended
        g = gstate = grammar.commit_rows(g, slots, own, emitted, jnp.arange(k + 1) <= n_acc[:, None])
    # 3. draft: the head reads pair (feature at p, token at p+1) for p = n-1 .. n-1+k; pairs past n_acc are
    # padding whose draft KV the next step overwrites. With k = 0 the head still reads its one pair, so that its KV
    # cache stays complete for later steps that draft. ngram: the emitted tokens join the history, which is
    # looked up for up to k drafts per row.
    draft_kv = caches.draft
    new_tokens = new_last
    num_drafts = jnp.full((B,), k, jnp.int32)
    history = state.history
    j = jnp.arange(k + 1)[None, :]  # the emitted tokens' index
    looked_up, unused_drafts = state.looked_up, state.unused_drafts
    if spec.ngram is not None:
        history = ngram.write(history, jnp.broadcast_to(slots[:, None], emitted.shape), n[:, None] + j, emitted,
                              valid[:, None] & (j <= n_acc[:, None]))
    if spec.draft is None and spec.ngram is not None:
        if k > 0:
            drafts, num_drafts = ngram.propose(history, slots, n + n_acc + 1, k, *spec.ngram, spec.max_model_len)
            new_tokens = jnp.concatenate([new_last, drafts], axis=1)
    elif spec.draft is not None:
        features = eagle.target_features(spec.draft, hidden, aux)
        pair_tokens = jnp.maximum(emitted, 0)
        out, draft_kv = eagle.forward(dw, spec.draft, tw.embed, pair_tokens, features, positions, draft_kv, batch)
        if k > 0:
            h = jnp.take_along_axis(out, n_acc[:, None, None], axis=1)[:, 0]  # [B, H]
            drafts, draft_kv = _draft_rollout(tw, dw, draft_kv, spec, h, n + n_acc, tables, valid, slots,
                                              proc if spec.processors else None, sampling, g)
            if spec.ngram is not None:
                drafts, num_drafts, looked_up, unused_drafts = _lookup_fallback(
                    history, state, slots, n + n_acc + 1, emitted, n_acc, num_valid > 0, drafts, spec)
            new_tokens = jnp.concatenate([new_last, drafts], axis=1)
    # 4. commit on device. Past the emitted tokens, `out` tells the drafts verified apart (-1) from positions that
    # had none (-2), so the host counts the drafts each row really made (ngram: any number up to k)
    emitted = jnp.where((j > n_acc[:, None]) & (j > num_valid[:, None]), -2, emitted)
    out = [(n_acc + 1)[:, None], emitted]  # out [B, k+2]
    if spec.extended:
        out.append(logprobs.reshape(B, -1))
    # the spare row stays one token long: padding rows read their length from it, and a length that grew with
    # every padded step would have them attend over ever more of page 0 (by the end, every padding row cost as
    # much as a sequence at max_model_len, and a long-running engine got slower and slower)
    state = SlotState(tokens=state.tokens.at[slots, :1 + k].set(new_tokens),
                      seq_len=state.seq_len.at[slots].set(jnp.where(valid, n + n_acc + 1, 1)),
                      num_drafts=state.num_drafts.at[slots].set(num_drafts), proc=proc, grammar=gstate,
                      history=history, looked_up=looked_up, unused_drafts=unused_drafts)
    out = jnp.concatenate(out, axis=1)
    return _pin(spec, Caches(target_kv, draft_kv), state, out)


# the stop token ids a multi-step dispatch checks per row (a request with more stops than this is checked for these;
# the host's check is the authority, so one it stops and the device does not only costs that row's later steps)
MAX_DEVICE_STOPS = 8


def multi_decode_step(tw: llama.Weights, dw: eagle.EagleWeights | None, caches: Caches, state: SlotState,
                      rows_i32: jax.Array, sampling: jax.Array, stops: jax.Array,
                      spec: StepSpec) -> tuple[Caches, SlotState, jax.Array]:
    """spec.num_steps decode steps in one dispatch (a device loop): step i verifies what step i-1 drafted. A row
    stops at the first step that emits one of its stop ids or reaches its length limit, as the host would stop it:
    stops [B, 1 + MAX_DEVICE_STOPS] = (the sequence length it may reach, stop ids padded with -1). From then on
    it runs as a padding row (writes nothing, its slot untouched) and its token count in `out` is 0; so does a row
    whose sequence had ended before the dispatch (its last token a stop id, or its length at the limit).
    Returns out [num_steps, B, ...]: each step's decode_step output."""
    S = state.seq_len.shape[0] - 1
    slots = rows_i32[:, 0]
    max_len, stop_ids = stops[:, 0], stops[:, 1:]

    def body(carry, _):
        caches, state, alive = carry
        rows = rows_i32.at[:, 0].set(jnp.where(alive, slots, S))
        caches, state, out = decode_step(tw, dw, caches, state, rows, sampling, spec)
        count = jnp.where(alive, out[:, 0], 0)
        k = spec.num_speculative_tokens
        emitted = out[:, 1:k + 2]  # [B, k+1]
        hit = (emitted[:, :, None] == stop_ids[:, None, :]) & (stop_ids[:, None, :] >= 0)
        hit = jnp.any(hit, axis=-1) & (jnp.arange(k + 1)[None, :] < count[:, None])
        done = jnp.any(hit, axis=1) | (state.seq_len[jnp.minimum(slots, S)] >= max_len)
        return (caches, state, alive & ~done), out.at[:, 0].set(count)

    # a row whose sequence already ended (in an earlier dispatch the host has not read yet) does not run at all
    row = jnp.minimum(slots, S)
    ended = (state.seq_len[row] >= max_len) | jnp.any((state.tokens[row, :1] == stop_ids) & (stop_ids >= 0), axis=1)
    # unrolled with the layers: in a device loop XLA copies every layer's weights out of the stacked arrays at
    # every step (a slice its GEMM fusions take whole in straight-line code): 0.26 of 1.45 ms a step, SmolLM2
    # shapes, EAGLE k = 3, batch 1, an H100
    (caches, state, _), outs = jax.lax.scan(body, (caches, state, (slots < S) & ~ended), None, length=spec.num_steps,
                                            unroll=spec.target.layer_loop == "unroll")
    return caches, state, outs


def prefill_step(tw: llama.Weights, dw: eagle.EagleWeights | None, caches: Caches, state: SlotState,
                 tok_i32: jax.Array, rows_i32: jax.Array, sampling: jax.Array,
                 spec: StepSpec) -> tuple[Caches, SlotState, jax.Array]:
    k = spec.num_speculative_tokens
    S = state.seq_len.shape[0] - 1
    tokens, next_tokens, tok_rows, positions = (tok_i32[:, i] for i in range(4))  # [N] each
    slots, last_index, is_last, tables = rows_i32[:, 0], rows_i32[:, 1], rows_i32[:, 2] > 0, rows_i32[:, 3:]
    R = slots.shape[0]
    tok_valid = tok_rows >= 0
    tok_rows = jnp.maximum(tok_rows, 0)
    batch = AttnBatch(_attn_tables(tables), slot_mapping(tables, tok_rows, positions, tok_valid, spec)[None],
                      tok_rows[None])

    hidden, aux, target_kv = llama.forward(tw, spec.target, tokens[None], positions[None], caches.target, batch,
                                           spec.aux_layers)  # hidden [1, N, H]
    logits = llama.lm_head(tw, hidden[0, last_index])[:, None]  # [R, 1, V]: only each row's last token
    first_pos = positions[last_index] + 1  # [R]: position of the token sampled here
    temperature, top_k, top_p, seeds = sampler.unpack_params(sampling)
    proc, gstate = state.proc, state.grammar
    g = gstate if spec.grammar else None
    params = processors.Params.unpack(sampling)
    if spec.extended:
        # the chunk's tokens enter the processor state first: the first token's penalties count the prompt
        prompt_len = params.prompt_len
        recent = tok_valid & (positions > first_pos[tok_rows] - 1 - processors.HISTORY)
        proc = processors.prefill_tokens(proc, jnp.where(tok_valid, slots[tok_rows], S), tokens, positions,
                                         prompt_len[tok_rows], recent)
        emitted, _, logprobs = processors.sample(logits, tokens[last_index][:, None], jnp.zeros((R,), jnp.int32),
                                                 first_pos - 1, proc, slots, sampling, True, spec.num_logprobs,
                                                 g=g)
    else:
        emitted, _ = sampler.rejection_sample(logits, jnp.zeros((R, 0), jnp.int32), jnp.zeros((R,), jnp.int32),
                                              temperature, top_k, top_p, seeds, first_pos, spec.all_greedy,
                                              spec.filtered)
    first = emitted[:, 0]  # [R]
    draft_kv = caches.draft
    new_tokens = first[:, None]
    if k > 0 and spec.draft is not None:
        # the head's pairs (feature at p, token at p+1); the final prompt position pairs with the token sampled now
        is_row_end = (jnp.arange(tokens.shape[0]) == last_index[tok_rows]) & is_last[tok_rows]
        pair_tokens = jnp.where(is_row_end, first[tok_rows], jnp.maximum(next_tokens, 0))
        features = eagle.target_features(spec.draft, hidden, aux)
        out, draft_kv = eagle.forward(dw, spec.draft, tw.embed, pair_tokens[None], features, positions[None],
                                      draft_kv, batch)
    real = slots < S
    commit = is_last & real
    slots = jnp.where(commit, slots, S)  # rows that do not end their prompt leave the slot state alone
    if spec.extended:  # the first token is counted before the drafts that follow it are processed
        proc = processors.count_tokens(proc, slots, first[:, None], first_pos[:, None], commit[:, None])
    if g is not None:
        g = gstate = grammar.commit_rows(g, slots, params.extended, first[:, None], commit[:, None])
    num_drafts = jnp.full((R,), k, jnp.int32)
    history, looked_up, unused_drafts = state.history, state.looked_up, state.unused_drafts
    if spec.ngram is not None:  # the chunk's tokens and the first token join the history
        history = ngram.write(history, rows_i32[tok_rows, 0], positions, tokens, tok_valid)
        history = ngram.write(history, slots, first_pos, first, commit)
    if looked_up is not None:  # a prompt's first drafts are the head's; the lookup's are kept
        K = unused_drafts.shape[1]
        looked, count = ngram.propose(history, slots, first_pos + 1, K, *spec.ngram, spec.max_model_len)
        count = jnp.minimum(count, k)
        looked_up = looked_up.at[slots].set(False)
        unused_drafts = unused_drafts.at[slots].set(jnp.where(jnp.arange(K) < count[:, None], looked, NO_DRAFT))
    if spec.draft is None and spec.ngram is not None:
        if k > 0:
            drafts, num_drafts = ngram.propose(history, slots, first_pos + 1, k, *spec.ngram, spec.max_model_len)
            new_tokens = jnp.concatenate([new_tokens, drafts], axis=1)
    elif k > 0:
        h = out[0, last_index]  # [R, H]
        drafts, draft_kv = _draft_rollout(tw, dw, draft_kv, spec, h, first_pos, tables, real, slots,
                                          proc if spec.extended else None, sampling, g)
        new_tokens = jnp.concatenate([new_tokens, drafts], axis=1)
    out = jnp.stack([commit.astype(jnp.int32), jnp.where(commit, first, -1)], axis=1)  # [R, 2]
    if spec.extended:
        out = jnp.concatenate([out, logprobs[:, 0]], axis=1)  # [R, 2 + W]
    if spec.prompt_logprobs:  # every flat token's next token under the raw target: [N, V] logits, this variant only
        scores = llama.lm_head(tw, hidden[0]).astype(jnp.float32)
        prompt = processors.pack_logprobs(scores[None], next_tokens[None], spec.num_logprobs)[0]  # [N, W]
        out = jnp.concatenate([out, jnp.pad(prompt, ((0, 0), (2, 0)))], axis=0)  # [R + N, 2 + W]
    state = SlotState(tokens=state.tokens.at[slots, :1 + k].set(new_tokens),
                      seq_len=state.seq_len.at[slots].set(jnp.where(commit, first_pos + 1, 1)),  # spare: 1 (decode)
                      num_drafts=state.num_drafts.at[slots].set(num_drafts), proc=proc, grammar=gstate,
                      history=history, looked_up=looked_up, unused_drafts=unused_drafts)
    return _pin(spec, Caches(target_kv, draft_kv), state, out)


def admit_step(state: SlotState, slots: jax.Array, bias: jax.Array, stop_mask: jax.Array, bad_words: jax.Array,
               grammar_states: jax.Array, spec: StepSpec) -> SlotState:
    """Reset the processor state of new extended requests: slots [R, 2] = (slot, the slot whose prompt mask it
    shares (a parallel sample's leader) or num_slots; padding rows: num_slots twice) get their rows
    (processors.SlotSpec.rows) and their constraint's state, grammar_states [R] (grammar.NONE: none). Dispatched
    before the prefill that fills in their prompts."""
    proc = processors.admit(state.proc, slots[:, 0], slots[:, 1], bias, stop_mask, bad_words)
    g = grammar.GrammarState(state.grammar.tables, state.grammar.state.at[slots[:, 0]].set(grammar_states))
    state = dataclasses.replace(state, proc=proc, grammar=g)
    return state if spec.shardings is None else jax.lax.with_sharding_constraint(state, spec.shardings.replicated)


def admit_sparse_step(state: SlotState, slots: jax.Array, stop_ids: jax.Array, bad_words: jax.Array,
                      grammar_states: jax.Array, spec: StepSpec) -> SlotState:
    """admit_step for requests with no logit_bias or allowed_token_ids (most extended ones): a zero bias, and the
    stop mask given as ids [R, MAX_SPARSE_STOPS] (-1: none, SlotSpec.sparse_rows), so that an admission copies a
    few hundred bytes to the device rather than [R, V] rows (~4 MB at R = 8 and a 49k vocabulary)."""
    R, V = stop_ids.shape[0], state.proc.bias.shape[1]
    ids = jnp.where(stop_ids >= 0, stop_ids, V)  # out of range: dropped
    stop_mask = jnp.zeros((R, V), bool).at[jnp.arange(R)[:, None], ids].set(True, mode="drop")
    return admit_step(state, slots, jnp.zeros((R, V), state.proc.bias.dtype), stop_mask, bad_words, grammar_states,
                      spec)


def place_grammar_step(state: SlotState, counts: jax.Array, allowed: jax.Array, row_start: jax.Array,
                       row_len: jax.Array, only_end: jax.Array, tokens: jax.Array, next_states: jax.Array,
                       spec: StepSpec) -> SlotState:
    """Write one chunk of a constraint's automaton into the grammar pool (grammar.place; grammar_pool.uploads)."""
    tables = grammar.place(state.grammar.tables, counts, allowed, row_start, row_len, only_end, tokens, next_states)
    state = dataclasses.replace(state, grammar=grammar.GrammarState(tables, state.grammar.state))
    return state if spec.shardings is None else jax.lax.with_sharding_constraint(state, spec.shardings.replicated)


HISTORY_WRITES = 512  # tokens one history_step call writes (a longer prefix takes several calls)


def history_step(state: SlotState, writes: jax.Array, spec: StepSpec) -> SlotState:
    """ngram speculation: write tokens into the history, writes [HISTORY_WRITES, 3] = (slot, position, token;
    slot num_slots: none). For the prompt prefix a prefill does not run (cached, or copied from a parallel
    sample's leader)."""
    slots = writes[:, 0]
    history = ngram.write(state.history, slots, writes[:, 1], writes[:, 2], slots < state.history.shape[0] - 1)
    state = dataclasses.replace(state, history=history)
    return state if spec.shardings is None else jax.lax.with_sharding_constraint(state, spec.shardings.replicated)


COPY_PAGES = 64  # pages one copy_pages_step call moves (a longer prefix takes several calls)


def copy_pages_step(caches: Caches, pages: jax.Array, spec: StepSpec) -> Caches:
    """Parallel samples (SamplingParams.n): copy KV pages [COPY_PAGES, 2] = (source, destination; -1: none) of a
    prompt's prefix in the target's and the draft head's caches, every layer."""
    num_pages = caches.target.k.shape[2]
    src, dst = jnp.maximum(pages[:, 0], 0), jnp.where(pages[:, 1] >= 0, pages[:, 1], num_pages)  # out of range: drop

    def copy(kv: KVCache | None) -> KVCache | None:
        if kv is None:
            return None
        move = lambda a: a.at[:, :, dst].set(a[:, :, src], mode="drop")  # noqa: E731
        return KVCache(move(kv.k), move(kv.v))

    caches = Caches(copy(caches.target), copy(caches.draft))
    if spec.shardings is None:
        return caches
    draft = None if caches.draft is None else jax.lax.with_sharding_constraint(caches.draft, spec.shardings.draft_kv)
    return Caches(jax.lax.with_sharding_constraint(caches.target, spec.shardings.target_kv), draft)


def write_plan(buffers: tuple[jax.Array, ...], arrays: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
    """Each plan array written over its buffer; jitted with the buffers donated (plan_program), the outputs keep
    the buffers' device addresses."""
    return tuple(jax.lax.dynamic_update_slice(b, a, (0,) * a.ndim) for b, a in zip(buffers, arrays))


plan_program = jax.jit(write_plan, donate_argnums=0)


@functools.cache
def slot_program(step: Callable) -> Callable:
    """admit_step, admit_sparse_step, place_grammar_step, history_step or copy_pages_step jitted, with what it
    changes donated."""
    return jax.jit(step, static_argnames=("spec",),
                   donate_argnames=("caches",) if step is copy_pages_step else ("state",))


SCRATCH_OPTION = ("xla_gpu_command_buffer_update_mode", "SKIP_TEMP")


@functools.cache
def stable_scratch_supported() -> bool:
    """Whether this XLA compiles for a GPU with the command-buffer update mode of SCRATCH_OPTION (newer XLA only;
    on other backends the option means nothing and is not passed)."""
    if jax.default_backend() != "gpu":
        return False
    try:
        jax.jit(lambda x: x + 1, compiler_options=dict([SCRATCH_OPTION])).lower(jnp.float32(0)).compile()
    except Exception:  # an XLA without the field or the mode rejects the option
        return False
    return True


def output_shape(step: Callable, spec: StepSpec, plan: tuple) -> tuple[int, ...]:
    """The shape of the int32 `out` that `step` returns for this plan (the host layouts above): decode [B, k+2
    (+ (k+1) W)], multi-step [num_steps, B, ...], prefill [R (+ N), 2 (+ W)]."""
    W = 2 + 2 * spec.num_logprobs if spec.extended else 0
    if step is prefill_step:
        tok, rows = plan[0], plan[1]
        return (rows.shape[0] + (tok.shape[0] if spec.prompt_logprobs else 0), 2 + W)
    k = spec.num_speculative_tokens
    shape = (plan[0].shape[0], k + 2 + (k + 1) * W)
    return (spec.num_steps,) + shape if step is multi_decode_step else shape


def _into_output(step: Callable) -> Callable:
    """`step` with one more argument, `out`: a buffer of its output's shape (output_shape), donated, which the
    output is written over, so that it keeps that buffer's address (ModelRunner: see KernelConfig.twin_programs)."""
    def run(tw, dw, caches, state, out, *plan, spec):
        caches, state, result = step(tw, dw, caches, state, *plan, spec)
        # written over `out`: an argument left unused would be dropped, and its donation with it
        return caches, state, jax.lax.dynamic_update_slice(out, result, (0,) * result.ndim)

    run.__name__ = step.__name__  # the XLA module keeps the step's name (jit_decode_step in profiles)
    return run


@functools.cache
def compiled(step: Callable, cublas: bool, stable_scratch: bool, twin: int) -> Callable:
    """`step` (decode_step, multi_decode_step or prefill_step) jitted as _into_output(step), caches, slot state and
    the output buffer donated, with or without cuBLAS GEMMs and the stable scratch address
    (KernelConfig.stable_scratch, where supported); called as fn(tw, dw, caches, state, out, *plan, spec=spec).
    `twin` 0 or 1: two jit objects of the same program, so two executables with a CUDA graph each. (Every
    argument positional and required: functools.cache keys `f(a, b)` and `f(a, b, default)` apart.)"""
    options = {}
    if cublas:
        options["xla_gpu_enable_triton_gemm"] = False
    if stable_scratch and stable_scratch_supported():
        options.update([SCRATCH_OPTION])
    return jax.jit(_into_output(step), static_argnames=("spec",), donate_argnames=("caches", "state", "out"),
                   compiler_options=options or None)


def program(step: Callable, tokens: int, spec: StepSpec, twin: int = 0) -> Callable:
    """The jitted `step` (`compiled`) for a batch that runs `tokens` tokens through the model (rows x (k + 1) to
    decode): with cuBLAS GEMMs from the spec's KernelConfig.cublas_min_tokens tokens up (see there)."""
    kernel = spec.target.kernel
    return compiled(step, tokens >= kernel.cublas_min_tokens, kernel.stable_scratch, twin)
