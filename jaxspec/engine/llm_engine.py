"""The engine as a step machine (vLLM's `LLMEngine`): add requests at any time, `step()`, abort.

One `step()` is one turn of the async protocol:

    plan and dispatch step N+1  (returns at once; nothing of step N is read yet, so host work overlaps the device)
    read step N, commit it      (detokenize, stop checks, finished requests leave)

Sync scheduling reads step N first, then plans N+1 as async would (before committing N) and dispatches it: the
device waits while the host works, and nothing else changes. Both run the very same steps (same plans, same
padded batches), so they give identical outputs however a kernel's rounding depends on the batch size, and the
speed difference between them is the overlap alone. Either way one step is in flight between two calls, and the
mode may differ from call to call. Random numbers are keyed on (seed, position).

A step that raises (an interrupt between dispatch and commit, say) is rolled back: every in-flight step is
forgotten, the device state is rebuilt if its donated buffers are gone, and every running request is recomputed
from its committed tokens (preemption's path), so the engine stays correct and no page or slot leaks.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from jaxspec.config import EngineConfig
from jaxspec.engine import logprob_output
from jaxspec.engine.block_manager import BlockManager
from jaxspec.engine.input_processor import InputProcessor
from jaxspec.engine.model_runner import ModelRunner, pick_bucket
from jaxspec.engine.output_processor import OutputProcessor
from jaxspec.engine.scheduler import Scheduler, StepPlan
from jaxspec.engine.sequence import Sequence, Status
from jaxspec.engine.spec_policy import SpecPolicy
from jaxspec.engine.step import MAX_DEVICE_STOPS
from jaxspec.outputs import RequestOutput
from jaxspec.sampling_params import RequestOutputKind, SamplingParams

if TYPE_CHECKING:
    from jaxspec.engine_args import EngineArgs

logger = logging.getLogger("jaxspec")


@dataclass
class SpecMetrics:
    """Speculative decoding counters, vLLM's names: a draft is one row's k proposals in one step."""
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    def as_dict(self) -> dict:
        rate = [a / self.num_drafts if self.num_drafts else 0.0 for a in self.accepted_per_position]
        return {"num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens,
                "accepted_per_position": list(self.accepted_per_position),
                "acceptance_rate_per_position": rate,
                "mean_acceptance_length": self.mean_acceptance_length}


def _sub_counts(after: dict, before: dict) -> dict:
    """after - before for every number of a nested dict (keys missing before count as 0)."""
    return {k: _sub_counts(n, before.get(k, {})) if isinstance(n, dict) else n - before.get(k, 0)
            for k, n in after.items()}


def metrics_delta(before: dict, after: dict) -> dict:
    """`LLM.stats()` counts since the LLM was built; this is one run's share (counts, lists and histograms
    subtracted), with the derived rates (SpecMetrics) recomputed."""
    d = {}
    for key, v in after.items():
        if isinstance(v, list) and key == "accepted_per_position":
            d[key] = [a - b for a, b in zip(v, before[key])]
        elif isinstance(v, dict):  # counts by k, by finish reason; histograms (a dict of dicts)
            d[key] = _sub_counts(v, before.get(key, {}))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            d[key] = v - before.get(key, 0)
    spec = SpecMetrics(d.get("num_drafts", 0), d.get("num_draft_tokens", 0), d.get("num_accepted_tokens", 0),
                       d.get("accepted_per_position", []))
    return d | spec.as_dict()


@dataclass
class StepTimes:
    num_steps: int = 0  # decode (or prefill) steps: a multi-step dispatch counts each of its steps
    num_dispatches: int = 0
    host_wait_s: float = 0.0  # time blocked reading step outputs: the device was behind the host
    wall_s: float = 0.0  # time inside step()


@dataclass
class InFlightStep:
    """A dispatched step whose outputs the host has not read: its plan, its k and its output arrays (copying to
    the host since dispatch)."""
    index: int
    plan: StepPlan
    k: int  # drafts the decode rows verified and made
    prefill_out: jax.Array | None  # [R, 2]: (1 if a first token was sampled, token)
    decode_out: jax.Array | None  # [B, k+2]: (count, tokens..., -1 padding)


class LLMEngine:
    def __init__(self, cfg: EngineConfig, runner: ModelRunner, input_processor: InputProcessor,
                 output_processor: OutputProcessor, async_scheduling: bool = True,
                 spec_policy: SpecPolicy | None = None):
        self.cfg = cfg
        self.runner = runner
        self.input_processor = input_processor
        self.output_processor = output_processor
        self.async_scheduling = async_scheduling  # the default of step(); a call may choose otherwise
        self.k = runner.k  # K: the most drafts a step verifies
        # each step's k (jaxspec.engine.spec_policy); may be replaced between generate calls (benchmarks do)
        self.spec_policy = spec_policy or SpecPolicy(self.k)
        self.block_manager = BlockManager(cfg.num_pages, cfg.page_size, cfg.pages_per_seq, cfg.max_num_seqs,
                                          cfg.enable_prefix_caching)
        self.scheduler = Scheduler(cfg, self.block_manager, output_processor.append_tokens,
                                   output_processor.logprob_store.add_step, self._reserve_grammar)
        # unfinished, plus finished ones whose final output is not out yet; a request's first sample (its `group`
        # holds all n)
        self.requests: dict[str, Sequence] = {}
        self.in_flight: deque[InFlightStep] = deque()
        self.spec_metrics = SpecMetrics(accepted_per_position=[0] * self.k)
        self.times = StepTimes()
        self.trace: list[tuple[str, int]] | None = None  # ("dispatch" | "fetch", step): set to [] to record
        self._unreported: list[Sequence] = []  # finished outside a commit (abort, rollback): output not returned yet
        self._num_steps = 0
        self._dirty = False  # a step() raised before it finished its bookkeeping: roll back before the next

    def _reserve_grammar(self, seq: Sequence) -> bool:
        key, automaton = seq.slot_spec.grammar
        if isinstance(automaton, Future):  # still building: it waits (_settle_grammars)
            return False
        return self.runner.grammar_pool.reserve(key, automaton, seq)

    def _settle_grammars(self) -> None:
        """Waiting requests whose constraint's automaton was still building when they were added get it once it is
        built; one whose build failed (or that can never fit the pool) is aborted, its error logged. With nothing
        else to run, this waits until one is built (past those that fail)."""
        pending = [s for s in self.scheduler.waiting
                   if s.slot_spec is not None and s.slot_spec.grammar is not None
                   and isinstance(s.slot_spec.grammar[1], Future)]
        wait = not self.in_flight and not self.scheduler.running
        for seq in pending:
            try:
                if self.input_processor.settle_grammar(seq, wait):
                    wait = False
            except ValueError as e:
                logger.warning("request %r aborted: %s", seq.request_id, e)
                self.abort_request(seq.request_id)

    @classmethod
    def from_engine_args(cls, engine_args: "EngineArgs") -> "LLMEngine":
        """vLLM's entry point to the engine: the one an `LLM` with these settings steps."""
        return engine_args.create_llm().llm_engine

    def get_tokenizer(self) -> Any | None:
        return self.input_processor.tokenizer

    # ---- requests

    def add_request(self, request_id: str, prompt, params: SamplingParams | None = None) -> None:
        """Validate and queue a request; it is planned at the next step. Allowed while a step is in flight. A bad
        request raises a ValueError naming it, and nothing is queued."""
        self.queue(self.make_request(request_id, prompt, params))

    def make_request(self, request_id: str, prompt, params: SamplingParams | None = None) -> Sequence:
        """The validated request, not queued yet (so a batch can be checked whole before any of it runs)."""
        if not isinstance(request_id, str):
            raise ValueError(f"request ids are strings, got {request_id!r}")
        if request_id in self.requests:
            raise ValueError(f"request {request_id!r}: a request with this id is already running")
        try:
            return self.input_processor.process(request_id, prompt, params)
        except ValueError as e:
            raise ValueError(f"request {request_id!r}: {e}") from None

    def queue(self, seq: Sequence) -> None:
        """Queue a request `make_request` made."""
        if seq.request_id in self.requests:
            raise ValueError(f"request {seq.request_id!r}: a request with this id is already running")
        self.requests[seq.request_id] = seq
        for sample in seq.group:
            self.scheduler.add(sample)

    def abort_request(self, request_ids: str | Iterable[str]) -> None:
        """Finish these requests with finish_reason "abort" (unknown or finished ids are ignored, as in vLLM). They
        are never planned again; pages and slot go back once the steps in flight for them are read."""
        for rid in [request_ids] if isinstance(request_ids, str) else request_ids:
            for seq in self.requests[rid].group if rid in self.requests else []:
                if not seq.is_finished:
                    self.output_processor.finish(seq, "abort", None)
                    self.scheduler.finish(seq)
                    self._unreported.append(seq)

    def forget(self, request_ids: Iterable[str]) -> None:
        """Drop finished requests whose final output nobody will read (a caller that gave up on them)."""
        ids = set(request_ids)
        for rid in ids:
            seq = self.requests.get(rid)
            if seq is not None and seq.group_finished:
                del self.requests[rid]
        self._unreported = [seq for seq in self._unreported if seq.request_id not in ids]

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return sum(not seq.group_finished for seq in self.requests.values())

    def reset_prefix_cache(self) -> bool:
        """vLLM's: forget the prefix cache (the next requests prefill every prompt token), once the steps in flight
        are read; False (a warning, nothing forgotten) while requests hold pages."""
        self.drain()
        if self.block_manager.reset_prefix_cache():
            return True
        logger.warning("prefix cache not reset: %d requests still hold KV pages", len(self.requests))
        return False

    # ---- stepping

    def step(self, async_scheduling: bool | None = None) -> list[RequestOutput]:
        """Dispatch the next step and commit the previous one; returns the outputs of the requests that got tokens
        (or finished) under their output_kind."""
        start = time.perf_counter()
        with self._rollback_on_error():
            outputs = self._outputs(self._turn(self.async_scheduling if async_scheduling is None
                                               else async_scheduling))
        self.times.wall_s += time.perf_counter() - start
        return outputs

    def drain(self) -> None:
        """Read and commit every step in flight without dispatching another (so that aborted and finished
        requests give their pages back now); outputs of requests that finished are returned by the next step."""
        with self._rollback_on_error():
            while self.in_flight:
                touched = self._commit(*self._fetch(self.in_flight.popleft()))
                self._unreported += [seq for seq in touched if seq.is_finished]

    @contextmanager
    def _rollback_on_error(self):
        """Device and scheduler work that either completes or is rolled back (`recover`), whatever raises in it,
        an interrupt included; a rollback that was itself interrupted is redone first."""
        if self._dirty:
            self.recover()
        self._dirty = True
        try:
            yield
        except BaseException:
            self.recover()
            raise
        self._dirty = False

    def _turn(self, async_scheduling: bool) -> list[Sequence]:
        self._settle_grammars()
        touched, self._unreported = self._unreported, []
        # sync: wait for step N before any host work on step N+1; the plan is still made before N's commit
        fetched = self._fetch(self.in_flight.popleft()) if self.in_flight and not async_scheduling else None
        plan = self.scheduler.schedule() if self.scheduler.has_unfinished() else StepPlan()
        if not plan and not self.in_flight and fetched is None and self.scheduler.has_unfinished():
            raise RuntimeError("the scheduler can make no progress: the KV pool cannot hold one request")
        if fetched is not None:
            touched += self._commit(*fetched)
        if plan:
            self._dispatch(plan)
        if self.in_flight and async_scheduling and (not plan or len(self.in_flight) > 1):
            touched += self._commit(*self._fetch(self.in_flight.popleft()))
        if not self.scheduler.has_unfinished():
            # nothing left to plan: the step in flight only runs finished requests once more; read it now so that
            # an idle engine holds no pages
            while self.in_flight:
                touched += self._commit(*self._fetch(self.in_flight.popleft()))
        return touched

    def _dispatch(self, plan: StepPlan) -> None:
        tables = self.block_manager.tables
        k = self.k
        self.runner.copy_pages(plan.copies)  # parallel samples' prompt prefixes, before the prefill reads them
        if plan.prefill:
            self.spec_policy.reset_slots([c.seq.slot for c in plan.prefill if c.start == c.seq.num_copied])
        if plan.decode:
            slots = np.asarray(plan.decode_slots)
            k = self.spec_policy.choose(len(slots), pick_bucket(self.cfg.decode_buckets, len(slots)), slots)
            for _ in range(plan.num_steps):
                self.spec_policy.record(k)
        prefill_out = self.runner.prefill(plan.prefill, tables) if plan.prefill else None
        decode_out = None
        if plan.decode:
            stops = np.stack([self._device_stops(seq) for seq in plan.decode]) if plan.num_steps > 1 else None
            decode_out = self.runner.decode(plan.decode_slots, tables, k, stops)
        self.in_flight.append(InFlightStep(self._num_steps, plan, k, prefill_out, decode_out))
        self._record("dispatch", self._num_steps)
        self._num_steps += 1
        self.times.num_steps += plan.num_steps
        self.times.num_dispatches += 1

    def _device_stops(self, seq: Sequence) -> np.ndarray:
        """What a multi-step dispatch checks for this row: the sequence length it may reach, then its stop ids
        (stop_token_ids, and EOS unless ignore_eos), as many as fit; made once per sequence."""
        if seq.device_stops is None:
            p = seq.params
            limit = self.cfg.max_model_len
            if p.max_tokens is not None:
                limit = min(limit, len(seq.prompt_token_ids) + p.max_tokens)
            ids = list(dict.fromkeys(list(p.stop_token_ids) + ([] if p.ignore_eos else
                                                               sorted(self.output_processor.eos_token_ids))))
            row = np.full((1 + MAX_DEVICE_STOPS,), -1, np.int32)
            row[0] = limit
            ids = ids[:MAX_DEVICE_STOPS]
            row[1:1 + len(ids)] = ids
            seq.device_stops = row
        return seq.device_stops

    def _fetch(self, step: InFlightStep) -> tuple[StepPlan, int, np.ndarray | None, np.ndarray | None]:
        """Read a step's outputs (blocking until the device has them)."""
        t0 = time.perf_counter()
        prefill_np = np.asarray(step.prefill_out) if step.prefill_out is not None else None
        decode_np = np.asarray(step.decode_out) if step.decode_out is not None else None
        self.times.host_wait_s += time.perf_counter() - t0
        self._record("fetch", step.index)
        return step.plan, step.k, prefill_np, decode_np

    def _commit(self, plan: StepPlan, k: int, prefill_np, decode_np) -> list[Sequence]:
        prefill_lp = decode_lp = None
        if prefill_np is not None:
            prefill_np, prefill_lp, prompt_lp = logprob_output.split_prefill(prefill_np, self.cfg.max_prefill_seqs)
            if prompt_lp is not None:
                self.output_processor.add_prompt_logprobs(plan.prefill, prompt_lp)
        if decode_np is not None and plan.num_steps > 1:  # [M, B, ...]: each step split, then stacked again
            parts = [logprob_output.split_decode(d, k) for d in decode_np]
            decode_np = np.stack([counts for counts, _ in parts])
            decode_lp = None if parts[0][1] is None else np.stack([lp for _, lp in parts])
            if self.k:
                for step_np in decode_np:
                    self._count_acceptance(plan, k, step_np)
        elif decode_np is not None:
            decode_np, decode_lp = logprob_output.split_decode(decode_np, k)
            if self.k:
                self._count_acceptance(plan, k, decode_np)
        return self.scheduler.commit(plan, prefill_np, decode_np, prefill_lp, decode_lp)

    def _outputs(self, touched: list[Sequence]) -> list[RequestOutput]:
        outputs = []
        # one output per request; a FINAL_ONLY sample that is still running has nothing to report (the common case
        # at every step of LLM.generate: skipped here, not one make_output per row)
        final_only = RequestOutputKind.FINAL_ONLY
        for seq in {id(s.group[0]): s.group[0] for s in touched
                    if s.is_finished or s.params.output_kind is not final_only}.values():
            out = self.output_processor.make_output(seq)
            if out is not None:
                outputs.append(out)
            if seq.group_finished:
                self.requests.pop(seq.request_id, None)
        return outputs

    def recover(self) -> None:
        """Roll back after a step raised: forget the steps in flight (their outputs are never read), rebuild lost
        device state and the scheduler's queues, and recompute every running request from its committed tokens.
        Finished requests whose final output was not returned yet are reported by the next step. Idempotent, so
        an interrupt during it is mended by the next call."""
        self._dirty = True
        self.in_flight.clear()
        self.runner.restore()
        seqs = [sample for seq in self.requests.values() for sample in seq.group]
        self.scheduler.reset(seqs)
        reported = {id(s) for s in self._unreported}
        self._unreported += [s for s in seqs if s.is_finished and id(s) not in reported]
        self._dirty = False

    def _record(self, event: str, step: int) -> None:
        if self.trace is not None:
            self.trace.append((event, step))

    def _count_acceptance(self, plan: StepPlan, k: int, decode_np: np.ndarray) -> None:
        """Add one step's drafts (up to k per row: `out` marks the positions that had none with -2) to the counters
        and the policy (vectorized: this runs once per step over every row); as vLLM, a row with no drafts made
        no draft."""
        m = self.spec_metrics
        # the extra step of a request that already finished: its tokens are discarded, and so is its draft
        finished = Status.FINISHED  # the status itself, not Sequence.is_finished: 96 property calls cost ~20 us
        live = np.array([seq.status is not finished for seq in plan.decode], bool)
        live &= decode_np[:len(plan.decode), 0] > 0  # a row a multi-step dispatch stopped made no step
        accepted = decode_np[:len(plan.decode), 0][live].astype(np.int64) - 1
        slots = np.asarray(plan.decode_slots)[live]
        if k == 0:
            self.spec_policy.observe(slots, k, accepted)
            return
        drafts = k - np.count_nonzero(decode_np[:len(plan.decode), 2:k + 2][live] == -2, axis=1)
        # rows offered fewer than k (prompt lookup's shorter matches, the end of max_model_len) reached no further
        self.spec_policy.observe(slots, k, accepted, drafts if len(drafts) and drafts.min() < k else None)
        m.num_drafts += int(np.count_nonzero(drafts))
        m.num_draft_tokens += int(drafts.sum())
        m.num_accepted_tokens += int(accepted.sum())
        at_least = np.bincount(accepted, minlength=k + 1)[::-1].cumsum()[::-1]  # [m]: rows that accepted >= m
        for j, n in enumerate(at_least[1:k + 1].tolist()):  # position j accepted: at least j + 1 drafts
            m.accepted_per_position[j] += n
