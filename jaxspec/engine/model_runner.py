"""The only host<->device boundary: owns weights, caches and slot state, turns plans into arrays, dispatches.

Every call returns at once (JAX async dispatch) with the step's `out` array already copying to the host; the
engine decides when to read it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxspec import parallel
from jaxspec.config import EngineConfig
from jaxspec.engine import sampler
from jaxspec.engine.scheduler import PrefillChunk
from jaxspec.engine.step import Caches, SlotState, StepSpec, decode_step, prefill_step, program
from jaxspec.models import eagle, llama

logger = logging.getLogger("jaxspec")


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
        self.num_slots = cfg.max_num_seqs
        self.vocab_size = target_cfg.vocab_size
        self.tw, self.dw = target_weights, draft_weights
        self.state = SlotState.init(self.num_slots, self.k)
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
                             synthetic_acceptance=synthetic_acceptance, shardings=shardings)
        # the step's static spec for each sampling mode (all_greedy, filtered), built once
        self._specs = {(g, f): dataclasses.replace(self.spec, all_greedy=g, filtered=f).canonical()
                       for g in (True, False) for f in (True, False)}
        self._target_cfg, self._draft_cfg, self._shardings = target_cfg, draft_cfg, shardings
        self.caches = self._new_caches()
        if mesh is None:
            # committed to one device, as every step's outputs are: jit compiles committed and uncommitted inputs
            # separately, so uncommitted first inputs would cost an extra compile during generation
            self.tw, self.dw, self.caches, self.state = jax.device_put(
                (self.tw, self.dw, self.caches, self.state), jax.devices()[0])
        # several hosts: np.asarray needs this host's copy of the replicated `out`
        self._local = jax.process_count() > 1
        self._called: set[tuple] = set()  # (step, bucket, all_greedy, filtered) of the programs called so far

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
                self.caches = jax.device_put(self.caches, jax.devices()[0])
        if any(x.is_deleted() for x in jax.tree.leaves(self.state)):
            self.state = SlotState.init(self.num_slots, self.k)
            self.state = (jax.device_put(self.state, jax.devices()[0]) if self._shardings is None
                          else parallel.place(self.state, self._shardings.replicated))

    # ---- building the host arrays

    def _sampling(self, slots: np.ndarray) -> tuple[np.ndarray, StepSpec]:
        """Packed sampling params of these slots (padding rows all zero: greedy) and the step's sampling mode."""
        packed, flags = self.sampling.batch(slots)
        return packed, self._specs[flags]

    def _slots(self, used: list[int], rows: int) -> np.ndarray:
        """`used` padded to `rows` with the padding slot."""
        slots = np.full((rows,), self.num_slots, np.int32)
        slots[:len(used)] = used
        return slots

    # ---- dispatch

    def _run(self, step: Callable, size: int, spec: StepSpec, *plan: np.ndarray, log=None) -> jax.Array:
        """Call a jitted step on bucket `size` (rows to decode, tokens to prefill), keeping the donated caches and
        state; `out` starts copying to the host at once. A program's first call compiles it: that one is timed and
        logged (`log`, default the jaxspec logger)."""
        tokens = size * (self.k + 1) if step is decode_step else size
        fn = program(step, tokens, spec)
        key = (step.__name__, size, spec.all_greedy, spec.filtered)
        first = key not in self._called  # a first call may find the program compiled already (another LLM's)
        programs = fn._cache_size() if first else 0
        t0 = time.perf_counter()
        self.caches, self.state, out = fn(self.tw, self.dw, self.caches, self.state, *plan, spec)
        if first:
            self._called.add(key)
            if fn._cache_size() > programs:
                jax.block_until_ready(out)
                mode = "greedy" if spec.all_greedy else "top-k/top-p" if spec.filtered else "random"
                (log or logger.info)(f"compiled {step.__name__.removesuffix('_step')} bucket {size} ({mode}) in "
                                     f"{time.perf_counter() - t0:.1f} s")
        out = out.addressable_data(0) if self._local else out
        out.copy_to_host_async()
        return out

    def decode(self, slots: list[int], tables: np.ndarray) -> jax.Array:
        """Dispatch one verify+draft step for the sequences in these slots; `tables` [slots + 1, pages] holds every
        slot's block table. Returns out [B, k+2] (the first len(slots) rows are theirs)."""
        B = pick_bucket(self.cfg.decode_buckets, len(slots))
        slots = self._slots(slots, B)
        rows = np.concatenate([slots[:, None], tables[slots]], axis=1)
        sampling, spec = self._sampling(slots)
        return self._run(decode_step, B, spec, rows, sampling)

    def prefill(self, chunks: list[PrefillChunk], tables: np.ndarray) -> jax.Array:
        """Dispatch one ragged prefill step; returns out [R, 2] = (1 if a first token was sampled, token)."""
        n_tokens = sum(c.length for c in chunks)
        N = pick_bucket(self.cfg.prefill_buckets, n_tokens)
        R = self.cfg.max_prefill_seqs
        for c in chunks:  # the slot's sampling params, for this and every later step of the sequence
            self.sampling.set(c.seq.slot, c.seq.params, c.seq.seed)
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
        sampling, spec = self._sampling(slots)
        return self._run(prefill_step, N, spec, tok, rows, sampling)

    def warmup(self, modes: tuple[tuple[bool, bool], ...] = ((True, False), (False, False), (False, True)),
               log=None) -> int:
        """Compile every bucket in each sampling mode (all_greedy, filtered): by default greedy, random, and random
        with top-k/top-p, so that generation never compiles. Each program's time is logged (`log`). Returns the
        number of compiled variants."""
        P, R, C = self.cfg.pages_per_seq, self.cfg.max_prefill_seqs, len(sampler.COLUMNS)
        count, out = 0, None
        for mode in modes:
            spec = self._specs[mode]
            for B in self.cfg.decode_buckets:
                rows = np.full((B, 1 + P), -1, np.int32)
                rows[:, 0] = self.num_slots
                out = self._run(decode_step, B, spec, rows, np.zeros((B, C), np.uint32), log=log)
                count += 1
            for N in self.cfg.prefill_buckets:
                tok = np.zeros((N, 4), np.int32)
                tok[:, 2] = -1
                rows = np.full((R, 3 + P), -1, np.int32)
                rows[:, 0] = self.num_slots
                out = self._run(prefill_step, N, spec, tok, rows, np.zeros((R, C), np.uint32), log=log)
                count += 1
        if out is not None:
            jax.block_until_ready(out)
        return count
