"""Waiting and running queues, slots, chunked prefill, preemption by recompute. Plans one step at a time.

The plan for step N+1 never depends on step N's outputs: the host knows each sequence's length only as an upper
bound (every dispatched step may add up to k+1 tokens), allocates pages for that worst case, and learns exact
lengths when a step is committed, one step late. A request that finished in step N is still in step N+1; that
step's tokens for it are dropped at commit. A finished or aborted request leaves the queues at once, but keeps its
pages and slot until the last dispatched step that uses them is committed: plans made before the finish (sync mode
plans N+1 before committing N) can still run it with the tables they were made with.

Parallel samples (SamplingParams.n): the first sample prefills the prompt like any request. Each other sample
waits until that prompt is planned, then takes a slot and its own pages, gets the prefix [0, P-1) copied into
them on the device (StepPlan.copies, dispatched before the step's prefill) and prefills only the prompt's last
token, which samples its first token with its own seed and starts its own drafts. So the prompt is prefilled
once (plus one token per further sample). A sample whose first sample can no longer share (finished and freed)
prefills the whole prompt itself, as does one recomputed after preemption.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from jaxspec.config import EngineConfig
from jaxspec.engine.block_manager import BlockManager
from jaxspec.engine.sequence import Sequence, Status


@dataclass
class PrefillChunk:
    seq: Sequence
    start: int  # first position of the chunk in seq.prefill_token_ids
    length: int
    is_last: bool  # the chunk ends the prompt: the step samples the first new token

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Whether this chunk scores prompt tokens the sequence has no logprobs for yet (position p scores p + 1)."""
        seq = self.seq
        return (seq.params.prompt_logprobs is not None and self.start < len(seq.prompt_token_ids) - 1
                and self.start + self.length > len(seq.prompt_logprob_rows))


@dataclass
class StepPlan:
    prefill: list[PrefillChunk] = field(default_factory=list)
    decode: list[Sequence] = field(default_factory=list)
    # the decode rows' slots when planned: a commit before the dispatch (sync mode) may release a finished
    # sequence's slot while the plan still runs it once more
    decode_slots: list[int] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)  # KV pages (source, destination) to copy first
    num_steps: int = 1  # decode steps of the one dispatch (multi-step decoding: never with prefill)

    def __bool__(self) -> bool:
        return bool(self.prefill or self.decode)


class Scheduler:
    def __init__(self, cfg: EngineConfig, block_manager: BlockManager,
                 append_tokens: Callable[[Sequence, list[int], np.ndarray | None, float], None],
                 add_decode_logprobs: Callable[[list[Sequence], np.ndarray, np.ndarray | None], None],
                 reserve_grammar: Callable[[Sequence], bool] = lambda seq: True):
        self.cfg = cfg
        self.k = cfg.num_speculative_tokens
        self.block_manager = block_manager
        self.append_tokens = append_tokens  # appends emitted tokens, applies stop rules (may finish the seq)
        self.add_decode_logprobs = add_decode_logprobs  # a decode dispatch's logprob rows, before its tokens
        # places a structured-output request's automaton in the device pool (False: no room now, it waits)
        self.reserve_grammar = reserve_grammar
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order; preemption takes from the end
        self.free_slots: list[int] = list(range(cfg.max_num_seqs - 1, -1, -1))
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Take a finished (or aborted) sequence out of the queues; its pages and slot go back once no dispatched
        step uses them."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq.num_inflight == 0:
            self._free(seq)

    def _free(self, seq: Sequence) -> None:
        if seq.slot >= 0:
            self.block_manager.free(seq)
            self.free_slots.append(seq.slot)
            seq.slot = -1

    def reset(self, seqs: list[Sequence]) -> None:
        """Rebuild the queues from scratch after dispatched steps were lost (their outputs never read; the device
        state may be gone): every page and slot free, every unfinished sequence of `seqs` (in admission order)
        waiting to be recomputed from its committed tokens. Depends on nothing a half-done plan or commit may have
        left behind."""
        self.block_manager.reset()
        self.free_slots = list(range(self.cfg.max_num_seqs - 1, -1, -1))
        self.running = []
        self.waiting = deque(seq for seq in seqs if not seq.is_finished)
        for seq in seqs:
            seq.slot, seq.pages, seq.num_inflight, seq.inflight_max_tokens = -1, [], 0, 0
            if not seq.is_finished:
                seq.status, seq.decoding = Status.WAITING, False

    # ---- planning

    def _decode_reach(self, num_steps: int) -> int:
        """How far past a sequence's upper-bound length U a decode dispatch may write: verify up to U-1+k, the
        head's single passes up to U+2k-2; each further step of a multi-step dispatch starts at most k+1 positions
        later. So it writes positions [0, min(U + reach, max_model_len))."""
        return (num_steps - 1) * (self.k + 1) + (2 * self.k - 1 if self.k else 0)

    def _preempt(self, seq: Sequence) -> None:
        """Free a running sequence's pages and slot; it is recomputed from its tokens once its in-flight steps
        are committed. Safe while those steps still use the pages: the device runs steps in order, so a later
        owner's writes land after them."""
        self._free(seq)
        seq.status = Status.WAITING
        self.num_preemptions += 1
        self.running.remove(seq)
        self.waiting.appendleft(seq)

    def _decode_need(self, seq: Sequence, num_steps: int) -> int:
        """The positions a decode dispatch of num_steps steps may write for `seq`: [0, this)."""
        return min(seq.upper_bound_len + self._decode_reach(num_steps), self.cfg.max_model_len)

    def _reserve_decode(self, seq: Sequence, allow_preempt: bool, num_steps: int = 1) -> bool:
        need = self._decode_need(seq, num_steps)
        if self.block_manager.pages_for(need) <= len(seq.pages):
            return True  # the common case: the pages it holds already cover this step
        while not self._make_room(seq, need):
            if not allow_preempt:
                return False
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        self.block_manager.grow(seq, need)
        return True

    def _make_room(self, seq: Sequence, need: int) -> bool:
        """Whether `seq` can hold positions [0, need), once the pages decoding sequences took ahead have gone back
        if the free pages alone do not cover it: before a cached page is evicted or a sequence preempted."""
        bm = self.block_manager
        if bm.pages_for(need) - len(seq.pages) > len(bm.free_page_ids):
            self._release_ahead()
        return bm.can_grow(seq, need)

    def _top_up(self, seqs: list[Sequence], reach: int, rounds: bool = True) -> None:
        """Pages ahead for these sequences (the decoding ones when one of them needed a page this step; a prompt whose
        last chunk is planned, with `rounds` False), taken from free pages (not cached ones): with
        cfg.page_reserve_whole, for each one's whole length while the free pages cover them all and, if a request
        waits, a full prefill chunk; else (with `rounds`) for cfg.page_lookahead more positions each while the free
        pages still cover another such round for every one afterwards (and the chunk). A grown sequence's block
        table changes, and with it the step's plan arrays, which the runner writes to the device with a program call
        of its own when they differ from the last (~0.3 ms of host time on an H100; and XLA then updated the CUDA
        graph of the next step or two, see EngineConfig.page_reserve_whole); growing every sequence at once leaves
        them unchanged for many steps instead of changing at nearly every step of a large batch. Pages taken ahead
        go back with the sequence, or earlier when a request needs them (_release_ahead)."""
        ahead = self.cfg.page_lookahead
        if not ahead:
            return
        bm, max_len = self.block_manager, self.cfg.max_model_len
        chunk = bm.pages_for(self.cfg.max_num_batched_tokens) if self.waiting else 0
        options = (([(True, chunk)] if self.cfg.page_reserve_whole else [])
                   + ([(False, chunk + len(seqs) * bm.pages_for(ahead))] if rounds else []))
        for whole, keep in options:
            wants = [(seq, bm.pages_for(min(max(seq.upper_bound_len, self._final_len(seq) if whole else 0)
                                            + reach + ahead, max_len))) for seq in seqs]
            wants = [(seq, pages) for seq, pages in wants if pages > len(seq.pages)]
            extra = sum(pages - len(seq.pages) for seq, pages in wants)
            if wants and len(bm.free_page_ids) - extra >= keep:
                for seq, pages in wants:
                    bm.grow(seq, pages * bm.page_size)
                return

    def _final_len(self, seq: Sequence) -> int:
        """The most tokens a sequence can end with: its prompt and max_tokens, or max_model_len."""
        limit = seq.params.max_tokens
        return self.cfg.max_model_len if limit is None else len(seq.prompt_token_ids) + limit

    def _release_ahead(self) -> None:
        """Give back the pages decoding sequences hold past what their next dispatch may write (those _top_up took
        ahead): no dispatched step writes there, and none is held that pages as needed would not hold."""
        bm = self.block_manager
        for seq in self.running:
            if seq.decoding:
                need = bm.pages_for(self._decode_need(seq, self.cfg.num_scheduler_steps))
                if len(seq.pages) > need:
                    bm.shrink(seq, need)

    @staticmethod
    def _may_share_prefix(seq: Sequence) -> bool:
        """Whether a request may start its prefill past cached pages: not one whose logits processors count the
        prompt's tokens as prefill runs them (penalties), nor one that wants every prompt token's logprobs (vLLM
        skips the cache for those too)."""
        return not seq.params.needs_processors and seq.params.prompt_logprobs is None

    @staticmethod
    def _share_source(seq: Sequence) -> Sequence | None | bool:
        """For a new sample of a parallel request: the first sample whose prompt KV it can copy now, False if it
        should wait for that prompt to be planned, None if it prefills on its own."""
        lead = seq.group[0]
        if seq is lead or seq.output_token_ids or len(seq.prompt_token_ids) < 2:
            return None
        if lead.status is Status.RUNNING and lead.decoding:  # its prompt was planned in an earlier step
            return lead
        return None if lead.is_finished else False

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        # multi-step decoding only while no request waits and none is mid-prompt (those take single steps, so
        # that a new request waits at most one step for its prefill)
        steps = self.cfg.num_scheduler_steps
        if steps > 1 and (self.waiting or not all(s.decoding for s in self.running)):
            steps = 1
        # 1. decode every running sequence past prefill, preempting the newest when pages run out. Most hold the
        # pages their positions need already: that test inline (this loop runs over every row at every step)
        reach, max_len, page_size = self._decode_reach(steps), self.cfg.max_model_len, self.block_manager.page_size
        running, grew = Status.RUNNING, False
        for seq in list(self.running):
            if seq.status is not running or not seq.decoding:
                continue
            if min(len(seq.prompt_token_ids) + len(seq.output_token_ids) + seq.inflight_max_tokens + reach,
                   max_len) <= len(seq.pages) * page_size:
                plan.decode.append(seq)
            elif self._reserve_decode(seq, True, steps):
                plan.decode.append(seq)
                grew = True
        if grew:
            self._top_up(plan.decode, reach)
        # 2. prefill chunks: unfinished prompts of running sequences first, then new (or preempted) requests
        budget = self.cfg.max_num_batched_tokens
        candidates = [s for s in self.running if not s.decoding] + [s for s in self.waiting if s.num_inflight == 0]
        for seq in candidates:
            if budget == 0 or len(plan.prefill) == self.cfg.max_prefill_seqs:
                break
            new = seq.status is Status.WAITING
            source, looked = None, False
            if new:
                if not self.free_slots:
                    break
                if seq.slot_spec is not None and seq.slot_spec.grammar is not None and not self.reserve_grammar(seq):
                    continue
                source = self._share_source(seq)
                if source is False:
                    continue
                seq.start_prefill()
                if source is not None:
                    seq.num_prefilled = seq.num_copied = len(seq.prompt_token_ids) - 1
                elif self.block_manager.enable_prefix_caching and self._may_share_prefix(seq):
                    seq.num_prefilled = seq.num_copied = self.block_manager.share_prefix(seq)
                    looked = True
            remaining = len(seq.prefill_token_ids) - seq.num_prefilled
            n = min(remaining, budget)
            is_last = n == remaining
            # the last chunk's first drafts look k-1 positions past the prompt's sampled token
            need = min(seq.num_prefilled + n + (self.k if is_last else 0), self.cfg.max_model_len)
            if not self._make_room(seq, need):
                if new:  # it waits on: the cached pages it took go back
                    self.block_manager.free(seq)
                    seq.num_prefilled = seq.num_copied = 0
                break
            if new:
                self.waiting.remove(seq)
                seq.status, seq.slot = Status.RUNNING, self.free_slots.pop()
                self.running.append(seq)
                if seq.metrics.first_scheduled_time is None:
                    seq.metrics.first_scheduled_time = time.time()
                    seq.metrics.time_in_queue = seq.metrics.first_scheduled_time - seq.metrics.arrival_time
                    seq.num_cached_tokens = 0 if source is not None else seq.num_copied
                if looked:
                    self.block_manager.prefix_queries += len(seq.prefill_token_ids)
                    self.block_manager.prefix_hits += seq.num_copied
            self.block_manager.grow(seq, need)
            if is_last:  # its whole length's pages now, so that its first steps' plans already hold them
                self._top_up([seq], self._decode_reach(self.cfg.num_scheduler_steps), rounds=False)
            if source is not None:
                seq.prompt_mask_from = source.slot
                plan.copies += zip(source.pages[:self.block_manager.pages_for(seq.num_copied)], seq.pages)
            plan.prefill.append(PrefillChunk(seq, seq.num_prefilled, n, is_last))
            seq.num_prefilled += n
            budget -= n
        # 3. mark what is in flight; a prompt finished now already decodes in this step (the prefill runs first).
        # The pages this step fills are cached for later steps' new requests (dispatched after it), not this one's
        for chunk in plan.prefill:
            self.block_manager.register(chunk.seq, chunk.start + chunk.length)
            chunk.seq.num_inflight += 1
            if chunk.is_last:
                chunk.seq.inflight_max_tokens += 1
                chunk.seq.decoding = True
                if self._reserve_decode(chunk.seq, allow_preempt=False):
                    plan.decode.append(chunk.seq)
        plan.num_steps = steps if plan.decode and not plan.prefill else 1  # a preemption may have queued a prefill
        for seq in plan.decode:
            seq.num_inflight += 1
            seq.inflight_max_tokens += plan.num_steps * (self.k + 1)
        plan.decode_slots = [seq.slot for seq in plan.decode]
        return plan

    # ---- committing

    def commit(self, plan: StepPlan, prefill_out, decode_out, prefill_logprobs=None,
               decode_logprobs=None) -> list[Sequence]:
        """Apply a step's fetched outputs: prefill_out [R, 2], decode_out [B, k+2] (count, tokens...), and with an
        extended step their tokens' logprob columns, [R, W] and [B, k+1, W]; a multi-step dispatch's decode arrays
        have a leading [num_steps] axis, and each row gets its steps' tokens in order. Returns the sequences that
        got tokens."""
        emitted: list[Sequence] = []
        now = time.time()  # the step's tokens' time (RequestMetrics), one for all of them as in vLLM
        for i, chunk in enumerate(plan.prefill):
            seq = chunk.seq
            seq.num_inflight -= 1
            tokens = [int(prefill_out[i, 1])] if chunk.is_last and prefill_out[i, 0] else []
            if chunk.is_last:
                seq.inflight_max_tokens -= 1
            lp = None if prefill_logprobs is None else prefill_logprobs[i:i + 1]
            self._emit(seq, tokens, emitted, lp, now)
        if decode_logprobs is not None and plan.decode:
            self.add_decode_logprobs(plan.decode, decode_logprobs, decode_out[..., 0] if plan.num_steps > 1 else None)
        if not plan.decode:
            return emitted
        span = plan.num_steps * (self.k + 1)
        if plan.num_steps > 1:  # [M][B][k+2]: each row's tokens of every step, in order (a row stopped on the device
            steps = [d.tolist() for d in decode_out]  # has count 0 from then on)
            tokens = [[t for rows in steps for t in rows[i][1:1 + rows[i][0]]] for i in range(len(plan.decode))]
        else:
            tokens = [row[1:1 + row[0]] for row in decode_out.tolist()]  # one conversion, not one per row
        for seq, new in zip(plan.decode, tokens):
            seq.num_inflight -= 1
            seq.inflight_max_tokens -= span
            self._emit(seq, new, emitted, None, now)
        return emitted

    def _emit(self, seq: Sequence, tokens: list[int], emitted: list[Sequence], logprobs, now: float) -> None:
        """A committed step's tokens for seq (none: a prefill chunk that was not the last), then its pages and slot
        freed if it is finished and no dispatched step uses them any more."""
        finished = Status.FINISHED  # the status itself: this runs for every row at every step
        if tokens and seq.status is not finished:
            self.append_tokens(seq, tokens, logprobs, now)
            emitted.append(seq)
            if seq.status is finished:
                self.finish(seq)
        if seq.status is finished and seq.num_inflight == 0:
            self._free(seq)
