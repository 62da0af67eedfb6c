"""The only host<->device boundary: owns weights, caches and slot state, turns plans into arrays, dispatches.

Every call returns at once (JAX async dispatch) with the step's `out` array already copying to the host; the
engine decides when to read it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxspec import parallel
from jaxspec.config import EngineConfig
from jaxspec.engine import sampler
from jaxspec.engine.grammar_pool import GrammarPool
from jaxspec.engine.scheduler import PrefillChunk
from jaxspec.engine.slot_spec import MAX_BAD_WORD_TOKENS, MAX_BAD_WORDS, MAX_SPARSE_STOPS
from jaxspec.engine.step import (COPY_PAGES, HISTORY_WRITES, MAX_DEVICE_STOPS, Caches, SlotState, StepSpec,
                                 admit_sparse_step, admit_step, copy_pages_step, decode_step, history_step,
                                 multi_decode_step, output_shape, place_grammar_step, plan_program, prefill_step,
                                 program, slot_program)
from jaxspec.models import eagle, llama

logger = logging.getLogger("jaxspec")


# A batch's kind: (all_greedy, filtered, extended, processors, grammar, prompt_logprobs), from its rows
# (SamplingTable.batch) and, for prefill, whether a chunk wants prompt logprobs. Each step maps it to few compiled
# variants: the extended decode keeps all_greedy (a greedy batch with processors or logprobs never builds the
# sampling distribution), for sampling batches the filtered flag, and whether any row has a logits processor (a
# batch that wants logprobs alone skips them); the extended prefill always filters and processes (its sort covers
# R rows, not B * (k+1)). So a warm engine has 9 decode and 5 prefill variants per bucket; batches with a
# structured-output constraint (grammar) have 3 decode and 2 prefill variants of their own, compiled on first use.
BatchKind = tuple[bool, bool, bool, bool, bool, bool]
_SAMPLING = ((True, False), (False, False), (False, True))  # (all_greedy, filtered): greedy, random, top-k/top-p
ALL_KINDS: tuple[BatchKind, ...] = (tuple((g, f, False, False, False, False) for g, f in _SAMPLING)
                                    + tuple((g, f, True, p, False, False) for p in (False, True) for g, f in _SAMPLING)
                                    + ((False, True, True, True, False, True),))
GRAMMAR_KINDS: tuple[BatchKind, ...] = (tuple((g, f, True, True, True, False) for g, f in _SAMPLING)
                                        + ((False, True, True, True, True, True),))
# Greedy, random, and top-k/top-p without processors or logprobs: what a GPU compiles at start-up by default
# (LLM(warmup="auto")); the extended kinds compile on first use there (each one logged).
BASIC_KINDS: tuple[BatchKind, ...] = ALL_KINDS[:3]


def decode_mode(kind: BatchKind) -> BatchKind:
    all_greedy, filtered, extended, processors, grammar, _ = kind
    return (all_greedy, filtered, extended, processors, grammar, False)  # prompt logprobs are prefill's only


def prefill_mode(kind: BatchKind) -> BatchKind:
    all_greedy, filtered, extended, _, grammar, prompt_logprobs = kind
    if extended or prompt_logprobs:
        return (False, True, True, True, grammar, prompt_logprobs)
    return (all_greedy, filtered, False, False, False, False)


# threads compiling at once (compile_all): XLA parallelizes within a program too, so more than this gains little
COMPILE_THREADS = 8


def _describe(step: Callable, size: int, spec: StepSpec) -> str:
    mode = "greedy" if spec.all_greedy else "top-k/top-p" if spec.filtered else "random"
    mode += (", processors + logprobs" if spec.processors else ", logprobs") if spec.extended else ""
    mode += ", structured output" if spec.grammar else ""
    mode += ", prompt logprobs" if spec.prompt_logprobs else ""
    mode += f", {spec.num_steps} steps" if spec.num_steps > 1 else ""
    return f"{step.__name__.removesuffix('_step')} bucket {size} (k={spec.num_speculative_tokens}, {mode})"


def _timed_compile(lowered) -> float:
    t0 = time.perf_counter()
    lowered.compile()
    return time.perf_counter() - t0


def fixed_parts(rows: list[tuple[int, ...]], width: int, size: int, fill) -> Iterator[np.ndarray]:
    """`rows` (each `width` ints) as int32 arrays of `size` rows, the last padded with `fill`: one compiled shape
    however many there are."""
    for i in range(0, len(rows), size):
        part = np.full((size, width), fill, np.int32)
        part[:len(rows[i:i + size])] = rows[i:i + size]
        yield part


def back_to_back(dispatch: Callable[[], jax.Array], n: int) -> tuple[float, float]:
    """Call `dispatch` n times back to back, as the async engine dispatches steps, reading each output once the next
    call is queued (as the engine reads it, before its buffer goes back, donated, to the call two later: the twin
    output buffers of ModelRunner._run), and the last at the end. Returns (seconds in all, seconds inside the
    calls)."""
    t0 = time.perf_counter()
    inside, last = 0.0, None
    for _ in range(n):
        t1 = time.perf_counter()
        out = dispatch()
        inside += time.perf_counter() - t1
        if last is not None:
            np.asarray(last)
        last = out
    np.asarray(last)
    return time.perf_counter() - t0, inside


def _equal(held: tuple[np.ndarray, ...], plan: tuple[np.ndarray, ...]) -> bool:
    """Whether two plans (tuples of host arrays) hold the same arrays: shapes, dtypes and values."""
    return len(held) == len(plan) and all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(held, plan))


def pick_bucket(buckets: list[int], n: int) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest compiled bucket {buckets[-1]}")


class ModelRunner:
    def __init__(self, cfg: EngineConfig, target_cfg: llama.Config, target_weights: llama.Weights,
                 draft_cfg: eagle.EagleConfig | None = None, draft_weights: eagle.EagleWeights | None = None,
                 synthetic_acceptance: float | None = None, mesh: Mesh | None = None):
        """`mesh` (tensor parallelism, jaxspec.parallel): weights in the layout of their configs' tp_size, placed
        here with their shardings; caches split by KV heads, slot state replicated. None: one device."""
        self.cfg = cfg
        self.k = cfg.num_speculative_tokens
        spec = cfg.speculative
        # prompt lookup: ngram speculation, or a head's fallback (step._lookup_fallback)
        self.ngram = (None if spec is None or spec.prompt_lookup_max is None
                      else (spec.prompt_lookup_min, spec.prompt_lookup_max))
        self._lookup_fallback = self.ngram is not None and draft_cfg is not None
        self.num_slots = cfg.max_num_seqs
        self.vocab_size = target_cfg.vocab_size
        self.tw, self.dw = target_weights, draft_weights
        self.grammar_pool = GrammarPool(cfg.grammar_states, cfg.grammar_max_transitions(target_cfg.vocab_size))
        self.state = self._new_state()
        self.sampling = sampler.SamplingTable(self.num_slots, target_cfg.vocab_size)
        shardings = None
        if mesh is not None:
            shardings = parallel.StepShardings(
                target_kv=parallel.cache_sharding(mesh, target_cfg.tp_size),
                draft_kv=parallel.cache_sharding(mesh, draft_cfg.tp_size) if draft_cfg is not None else None,
                replicated=NamedSharding(mesh, P()))
            # straight onto their shards, before the KV pool is allocated (a head at tp 1 is whole on every device)
            self.tw = parallel.place(self.tw, parallel.weight_shardings(llama.abstract(target_cfg), mesh,
                                                                        target_cfg.tp_size))
            if self.dw is not None:
                self.dw = parallel.place(self.dw, parallel.weight_shardings(eagle.abstract(draft_cfg), mesh,
                                                                            draft_cfg.tp_size))
            self.state = parallel.place(self.state, shardings.replicated)
        self.spec = StepSpec(target=target_cfg, draft=draft_cfg, num_speculative_tokens=self.k,
                             page_size=cfg.page_size, max_model_len=cfg.max_model_len,
                             num_logprobs=min(cfg.max_logprobs, target_cfg.vocab_size),
                             synthetic_acceptance=synthetic_acceptance, shardings=shardings,
                             ngram=self.ngram).canonical()
        # the step's static spec for each k <= K and mode (decode_mode / prefill_mode of a batch kind), built once
        self._specs = {(k, mode): dataclasses.replace(self.spec, num_speculative_tokens=k, all_greedy=mode[0],
                                                      filtered=mode[1], extended=mode[2], processors=mode[3],
                                                      grammar=mode[4], prompt_logprobs=mode[5]).canonical()
                       for k in range(self.k + 1)
                       for mode in {f(kind) for kind in ALL_KINDS + GRAMMAR_KINDS
                                    for f in (decode_mode, prefill_mode)}}
        self.num_prefill_tokens = 0  # prompt (and recomputed) tokens run through prefill so far
        self._target_cfg, self._draft_cfg, self._shardings = target_cfg, draft_cfg, shardings
        self.caches = self._new_caches()
        if mesh is None:
            # committed to one device, as every step's outputs are: jit compiles committed and uncommitted inputs
            # separately, so uncommitted first inputs would cost an extra compile during generation
            self.tw, self.dw, self.caches, self.state = jax.device_put(
                (self.tw, self.dw, self.caches, self.state), jax.local_devices()[0])
        # several hosts: np.asarray needs this host's copy of the replicated `out`
        self._local = jax.process_count() > 1
        self._called: set[tuple] = set()  # (step, bucket, k, mode) of the programs called so far
        self._precompiled: set[tuple] = set()  # of those keys, the ones compile_all compiled (and logged)
        # (step, bucket) -> (the device buffers its plan arrays are written into, host copies of what they hold)
        # (KernelConfig.resident_plan; one device only: under a mesh the arrays go to each call as they are)
        self._resident = target_cfg.kernel.resident_plan and mesh is None
        self._plans: dict[tuple[str, int], tuple[tuple[jax.Array, ...], tuple[np.ndarray, ...]]] = {}
        # each program's calls alternate between two output buffers, (program key, 0 or 1) -> the buffer that call
        # writes `out` over; on a GPU (one device) between two executables as well (KernelConfig.twin_programs).
        # A buffer is written again two calls of its program later: the engine has read its output by then.
        self._twins = (target_cfg.kernel.twin_programs and mesh is None and jax.default_backend() == "gpu")
        self._outputs: dict[tuple, jax.Array] = {}
        self._next_twin: dict[tuple, int] = {}

    def _new_state(self) -> SlotState:
        return SlotState.init(self.num_slots, self.k, self.vocab_size, self.grammar_pool.max_states,
                              self.grammar_pool.max_transitions, self.cfg.max_model_len if self.ngram else 0,
                              self._lookup_fallback)

    def _new_caches(self) -> Caches:
        tcfg, dcfg, shardings = self._target_cfg, self._draft_cfg, self._shardings
        dtype, pages = tcfg.jnp_dtype, self.cfg.num_pages
        target_kv = parallel.make_cache(tcfg.num_layers, tcfg.num_cached_kv_heads, pages, self.cfg.page_size,
                                        tcfg.head_dim, dtype, shardings and shardings.target_kv)
        draft_kv = None
        if dcfg is not None:
            draft_kv = parallel.make_cache(1, dcfg.layer_config().num_cached_kv_heads, pages, self.cfg.page_size,
                                           dcfg.head_dim, dtype, shardings and shardings.draft_kv)
        return Caches(target_kv, draft_kv)

    def restore(self) -> None:
        """After a dispatch was interrupted: fresh caches and slot state where the donated ones are gone (every
        running sequence is then recomputed from its tokens, so their contents do not matter)."""
        if any(x.is_deleted() for x in jax.tree.leaves(self.caches)):
            self.caches = self._new_caches()
            if self._shardings is None:
                self.caches = jax.device_put(self.caches, jax.local_devices()[0])
        self._plans = {key: (buffers, held) for key, (buffers, held) in self._plans.items()
                       if not any(a.is_deleted() for a in buffers)}
        self._outputs = {key: out for key, out in self._outputs.items() if not out.is_deleted()}
        if any(x.is_deleted() for x in jax.tree.leaves(self.state)):
            self.state = self._new_state()
            self.state = (jax.device_put(self.state, jax.local_devices()[0]) if self._shardings is None
                          else parallel.place(self.state, self._shardings.replicated))
            self.grammar_pool.forget_uploads()  # the fresh tables hold none of the placed automata

    # ---- building the host arrays

    def _sampling(self, slots: np.ndarray, step: Callable, k: int,
                  prompt_logprobs: bool = False) -> tuple[np.ndarray, StepSpec]:
        """Packed sampling params of these slots (padding rows all zero: greedy) and the spec of `step` with k
        drafts for the batch's kind."""
        packed, flags = self.sampling.batch(slots)
        kind = flags + (prompt_logprobs,)  # BatchKind
        return packed, self._specs[(k, prefill_mode(kind) if step is prefill_step else decode_mode(kind))]

    def _slots(self, used: list[int], rows: int) -> np.ndarray:
        """`used` padded to `rows` with the padding slot."""
        slots = np.full((rows,), self.num_slots, np.int32)
        slots[:len(used)] = used
        return slots

    # ---- dispatch

    def _place(self, step: Callable, size: int, plan: tuple[np.ndarray, ...]) -> tuple:
        """The plan as the step reads it: written into this (step, bucket)'s resident device buffers (one small
        donated dispatch; their addresses never change, see KernelConfig.resident_plan), or as it is. A plan equal
        to the one the buffers hold is not written again: a steady decode batch's plan changes only when a row
        gets a page, and the write was a third of a batch-1 dispatch's host time (an H100: ~0.33 of ~1.0 ms)."""
        if not self._resident:
            return plan
        key = (step.__name__, size)
        buffers, held = self._plans.get(key, (None, None))
        if buffers is not None and _equal(held, plan):
            return buffers
        if buffers is None:
            buffers = jax.device_put(tuple(np.zeros_like(a) for a in plan), jax.local_devices()[0])
        buffers = plan_program(buffers, plan)
        self._plans[key] = buffers, tuple(np.array(a) for a in plan)  # copies: the caller's arrays may change
        return buffers

    @staticmethod
    def _key(step: Callable, size: int, spec: StepSpec) -> tuple:
        return (step.__name__, size, spec.num_speculative_tokens, spec.all_greedy, spec.filtered, spec.extended,
                spec.processors, spec.grammar, spec.prompt_logprobs, spec.num_steps)

    @staticmethod
    def _program(step: Callable, size: int, spec: StepSpec, twin: int = 0) -> Callable:
        tokens = size if step is prefill_step else size * (spec.num_speculative_tokens + 1)
        return program(step, tokens, spec, twin)

    def _run(self, step: Callable, size: int, spec: StepSpec, *plan: np.ndarray, log=None) -> jax.Array:
        """Call a jitted step on bucket `size` (rows to decode, tokens to prefill), keeping the donated caches and
        state; `out` starts copying to the host at once. A program's first call compiles it (unless compile_all
        did): that one is timed and logged (`log`, default the jaxspec logger)."""
        program_key = self._key(step, size, spec)
        twin = self._next_twin.get(program_key, 0)  # the output buffer's; the executable's too with twins
        self._next_twin[program_key] = 1 - twin
        executable = twin if self._twins else 0
        fn = self._program(step, size, spec, executable)
        key = program_key + (executable,)
        first = key not in self._called  # a first call may find the program compiled already (another LLM's)
        programs = fn._cache_size() if first else 0
        t0 = time.perf_counter()
        plan = self._place(step, size, plan)
        out = self._outputs.pop(program_key + (twin,), None)  # (lost if the call is interrupted: made again)
        if out is None:
            out = self.output_buffer(step, spec, plan)
        self.caches, self.state, out = fn(self.tw, self.dw, self.caches, self.state, out, *plan, spec=spec)
        self._outputs[program_key + (twin,)] = out
        if first:
            self._called.add(key)
            if fn._cache_size() > programs and key not in self._precompiled:
                jax.block_until_ready(out)
                (log or logger.info)(f"compiled {_describe(step, size, spec)} in {time.perf_counter() - t0:.1f} s")
        out = out.addressable_data(0) if self._local else out
        out.copy_to_host_async()
        return out

    def output_buffer(self, step: Callable, spec: StepSpec, plan: tuple) -> jax.Array:
        """A device buffer for the `out` of `step` on this plan, placed as the slot state is."""
        out = np.zeros(output_shape(step, spec, plan), np.int32)
        return (jax.device_put(out, jax.local_devices()[0]) if self._shardings is None
                else parallel.place(out, self._shardings.replicated))

    def compile_all(self, jobs: list[tuple], log=None) -> None:
        """Compile the programs of these calls, (step, bucket, spec, plan arrays) each, side by side: XLA compiles
        without holding the GIL, and a GPU's unrolled step programs take 20-60 s each, so a fresh start's dozens
        of them (every bucket, k and sampling mode) take a fraction of the time one after another. Each is traced
        here with the arguments its call will pass (so the call finds it compiled), compiled on a pool of threads,
        and logged (`log`) as it completes. Programs called or compiled before are skipped."""
        for twin in (0, 1) if self._twins else (0,):  # the second twins after the first: from the disk cache
            todo, seen = [], set()
            for step, size, spec, plan in jobs:
                key = self._key(step, size, spec) + (twin,)
                if key in self._called or key in seen:
                    continue
                seen.add(key)
                todo.append((key, step, size, spec, plan))
            if not todo:
                continue
            say = log or logger.info
            with ThreadPoolExecutor(min(len(todo), os.cpu_count() or 1, COMPILE_THREADS)) as pool:
                futures = []
                for key, step, size, spec, plan in todo:  # tracing holds the GIL: one at a time, others compile
                    plan = self._place(step, size, plan)
                    if key not in self._outputs:  # the buffer the call with this twin will write over (_run)
                        self._outputs[key] = self.output_buffer(step, spec, plan)
                    lowered = self._program(step, size, spec, twin).lower(
                        self.tw, self.dw, self.caches, self.state, self._outputs[key], *plan, spec=spec)
                    futures.append((key, step, size, spec, pool.submit(_timed_compile, lowered)))
                for key, step, size, spec, future in futures:
                    seconds = future.result()
                    self._precompiled.add(key)
                    say(f"compiled {_describe(step, size, spec)}{' (twin)' if twin else ''} in {seconds:.1f} s "
                        f"(of {len(todo)}, side by side)")

    def decode(self, slots: list[int], tables: np.ndarray, k: int | None = None,
               stops: np.ndarray | None = None) -> jax.Array:
        """Dispatch one verify+draft step with k drafts (default K) for the sequences in these slots; `tables`
        [slots + 1, pages] holds every slot's block table. Returns out [B, k+2 (+ logprob columns)] (the first
        len(slots) rows are theirs). With `stops` [len(slots), 1 + MAX_DEVICE_STOPS] (multi_decode_step's), one
        dispatch runs cfg.num_scheduler_steps steps and out is [steps, B, ...]."""
        return self._run(*self.decode_plan(slots, tables, k, stops))

    def decode_plan(self, slots: list[int], tables: np.ndarray, k: int | None = None,
                    stops: np.ndarray | None = None) -> tuple:
        """What `decode` dispatches: (step, bucket, spec, *host arrays), built on the host (no device work)."""
        B = pick_bucket(self.cfg.decode_buckets, len(slots))
        n = len(slots)
        slots = self._slots(slots, B)
        rows = np.concatenate([slots[:, None], tables[slots]], axis=1)
        sampling, spec = self._sampling(slots, decode_step, self.k if k is None else k)
        if stops is None:
            return decode_step, B, spec, rows, sampling
        padded = np.full((B, 1 + MAX_DEVICE_STOPS), -1, np.int32)
        padded[:n] = stops
        return multi_decode_step, B, self._multi(spec), rows, sampling, padded

    def _multi(self, spec: StepSpec) -> StepSpec:
        return dataclasses.replace(spec, num_steps=self.cfg.num_scheduler_steps).canonical()

    def prefill(self, chunks: list[PrefillChunk], tables: np.ndarray) -> jax.Array:
        """Dispatch one ragged prefill step; returns out [R, 2] = (1 if a first token was sampled, token)."""
        n_tokens = sum(c.length for c in chunks)
        N = pick_bucket(self.cfg.prefill_buckets, n_tokens)
        R = self.cfg.max_prefill_seqs
        for c in chunks:  # the slot's sampling params, for this and every later step of the sequence
            self.sampling.set(c.seq.slot, c.seq.params, c.seq.seed, len(c.seq.prompt_token_ids))
        self._admit([c for c in chunks if c.start == c.seq.num_copied and c.seq.params.needs_extended_step])
        if self.ngram:
            self._write_history([c for c in chunks if c.start == c.seq.num_copied > 0])
        slots = self._slots([c.seq.slot for c in chunks], R)
        tok = np.zeros((N, 4), np.int32)
        tok[:, 2] = -1  # padding tokens belong to no row
        rows = np.zeros((R, 3 + self.cfg.pages_per_seq), np.int32)
        rows[:, 0] = slots
        rows[:, 3:] = tables[slots]
        at = 0
        for r, c in enumerate(chunks):
            ids = c.seq.prefill_token_ids
            end = c.start + c.length
            tok[at:at + c.length, 0] = ids[c.start:end]
            nxt = ids[c.start + 1:end + 1]
            tok[at:at + len(nxt), 1] = nxt
            tok[at + len(nxt):at + c.length, 1] = -1  # the prompt's last token pairs with the token sampled here
            tok[at:at + c.length, 2] = r
            tok[at:at + c.length, 3] = np.arange(c.start, end)
            rows[r, 1:3] = (at + c.length - 1, int(c.is_last))
            at += c.length
        self.num_prefill_tokens += n_tokens
        # a prompt's first drafts: all K
        sampling, spec = self._sampling(slots, prefill_step, self.k, any(c.wants_prompt_logprobs for c in chunks))
        return self._run(prefill_step, N, spec, tok, rows, sampling)

    def _admit(self, chunks: list[PrefillChunk]) -> None:
        """Set the processor state of the slots of extended requests that start prefilling now (one dispatch,
        before the prefill): their stop ids alone when none has a logit_bias or allowed_token_ids (the common
        case), else every row's dense [V] bias and stop mask; and each one's structured-output state, its
        automaton written into the grammar pool first if it is not there yet (reserved by the scheduler)."""
        if not chunks:
            return
        R, V = self.cfg.max_prefill_seqs, self.vocab_size
        slots = np.full((R, 2), self.num_slots, np.int32)
        bad = np.full((R, MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS), -1, np.int32)
        states = np.full((R,), -1, np.int32)
        for r, c in enumerate(chunks):
            slots[r] = (c.seq.slot, c.seq.prompt_mask_from if c.seq.prompt_mask_from >= 0 else self.num_slots)
            if c.seq.slot_spec.grammar is not None:
                key = c.seq.slot_spec.grammar[0]
                for chunk in self.grammar_pool.uploads(key):
                    self.state = slot_program(place_grammar_step)(self.state, *chunk, spec=self.spec)
                states[r] = self.grammar_pool.initial_state(key, c.seq.output_token_ids)
        if not any(c.seq.slot_spec.needs_dense_rows(V) for c in chunks):
            stop_ids = np.full((R, MAX_SPARSE_STOPS), -1, np.int32)
            for r, c in enumerate(chunks):
                stop_ids[r], bad[r] = c.seq.slot_spec.sparse_rows(V)
            self.state = slot_program(admit_sparse_step)(self.state, slots, stop_ids, bad, states, spec=self.spec)
            return
        bias = np.zeros((R, V), np.float32)
        stop = np.zeros((R, V), bool)
        for r, c in enumerate(chunks):
            bias[r], stop[r], bad[r] = c.seq.slot_spec.rows(V)
        self.state = slot_program(admit_step)(self.state, slots, bias, stop, bad, states, spec=self.spec)

    def _write_history(self, chunks: list[PrefillChunk]) -> None:
        """ngram: the prompt prefix that these first chunks skip (cached or copied) into their history rows,
        HISTORY_WRITES tokens per dispatch, before the prefill that writes the rest."""
        writes = [(c.seq.slot, p, t) for c in chunks for p, t in enumerate(c.seq.prefill_token_ids[:c.start])]
        for part in fixed_parts(writes, 3, HISTORY_WRITES, (self.num_slots, 0, 0)):
            self.state = slot_program(history_step)(self.state, part, spec=self.spec)

    def copy_pages(self, pairs: list[tuple[int, int]]) -> None:
        """Copy KV pages (source, destination) in both caches, COPY_PAGES per dispatch."""
        for pages in fixed_parts(pairs, 2, COPY_PAGES, -1):
            self.caches = slot_program(copy_pages_step)(self.caches, pages, spec=self.spec)

    def warmup(self, kinds: tuple[BatchKind, ...] = ALL_KINDS, k_values: list[int] | None = None, log=None) -> int:
        """Compile every bucket for each batch kind (all_greedy, filtered, extended, prompt_logprobs), by default
        every kind a batch can be, so that generation never compiles; decode steps for each of `k_values`
        (default [K]); the admission programs too with an extended kind, and the page copy (parallel samples)
        always. The step programs compile side by side (compile_all), then each runs once on padding rows. Each
        step program's time is logged (`log`). Returns the number of compiled programs."""
        P, R, C, S = self.cfg.pages_per_seq, self.cfg.max_prefill_seqs, len(sampler.COLUMNS), self.num_slots
        jobs = []
        for mode in sorted({decode_mode(kind) for kind in kinds}):
            for k in k_values or [self.k]:
                for B in self.cfg.decode_buckets:
                    jobs.append((decode_step, B, self._specs[(k, mode)], self._idle_decode(B)))
                    if self.cfg.num_scheduler_steps > 1:
                        stops = np.full((B, 1 + MAX_DEVICE_STOPS), -1, np.int32)
                        jobs.append((multi_decode_step, B, self._multi(self._specs[(k, mode)]),
                                     (*self._idle_decode(B), stops)))
        for mode in sorted({prefill_mode(kind) for kind in kinds}):
            for N in self.cfg.prefill_buckets:
                tok = np.zeros((N, 4), np.int32)
                tok[:, 2] = -1
                rows = np.full((R, 3 + P), -1, np.int32)
                rows[:, 0] = S
                jobs.append((prefill_step, N, self._specs[(self.k, mode)], (tok, rows, np.zeros((R, C), np.uint32))))
        self.compile_all(jobs, log)
        out = None
        for _ in range(2 if self._twins else 1):  # both twins of each program (KernelConfig.twin_programs)
            for step, size, spec, plan in jobs:
                out = self._run(step, size, spec, *plan, log=log)
        count = len(jobs)
        if any(kind[2] for kind in kinds):
            V, bad = self.vocab_size, np.full((R, MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS), -1, np.int32)
            none = np.full((R,), -1, np.int32)
            self.state = slot_program(admit_step)(self.state, np.full((R, 2), S, np.int32),
                                                  np.zeros((R, V), np.float32), np.zeros((R, V), bool), bad, none,
                                                  spec=self.spec)
            self.state = slot_program(admit_sparse_step)(self.state, np.full((R, 2), S, np.int32),
                                                         np.full((R, MAX_SPARSE_STOPS), -1, np.int32), bad, none,
                                                         spec=self.spec)
            count += 2
        self.caches = slot_program(copy_pages_step)(self.caches, np.full((COPY_PAGES, 2), -1, np.int32),
                                                    spec=self.spec)
        count += 1
        if out is not None:
            jax.block_until_ready(out)
        return count

    def _idle_decode(self, B: int) -> tuple[np.ndarray, np.ndarray]:
        """A decode plan of B padding rows (they touch only the padding slot and no page)."""
        rows = np.full((B, 1 + self.cfg.pages_per_seq), -1, np.int32)
        rows[:, 0] = self.num_slots
        return rows, np.zeros((B, len(sampler.COLUMNS)), np.uint32)

    def time_decode(self, k_values: list[int], iters: int = 4, rounds: int = 5) -> dict[tuple[int, int], float]:
        """Seconds per decode step for each (bucket, k), greedy, steps dispatched back to back as the async engine
        runs them (host dispatch included; each output read once the next step is queued, as the engine reads it,
        before its buffer goes back to the step two later): the step-time model of the dynamic speculation policy.
        The median of `rounds` rounds of `iters` steps, each round over every (bucket, k), k ascending in one round
        and descending in the next: one pass of 8 steps each, right after compiling, timed bucket 1 with k = 0 at
        1.458 ms against 1.362 with k = 3, where the engine's own steps took 1.01 against 1.38 (an H100,
        2026-12-07). Compiles what it times. The rows are padding, so attention reads no context: at long contexts
        real steps are slower."""
        samples: dict[tuple[int, int], list[float]] = {}
        greedy = decode_mode(ALL_KINDS[0])
        self.compile_all([(decode_step, B, self._specs[(k, greedy)], self._idle_decode(B))
                          for B in self.cfg.decode_buckets for k in k_values])
        for B in self.cfg.decode_buckets:
            for k in k_values:
                for _ in range(2):  # warm: each twin executable's first call (or one executable's first two)
                    np.asarray(self._run(decode_step, B, self._specs[(k, greedy)], *self._idle_decode(B)))
        for r in range(rounds):
            for B in self.cfg.decode_buckets:
                for k in (k_values if r % 2 == 0 else k_values[::-1]):
                    spec = self._specs[(k, greedy)]
                    elapsed, _ = back_to_back(lambda: self._run(decode_step, B, spec, *self._idle_decode(B)), iters)
                    samples.setdefault((B, k), []).append(elapsed / iters)
        return {key: float(np.median(t)) for key, t in samples.items()}
