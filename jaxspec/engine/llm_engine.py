"""The step loop: schedule, dispatch, and commit one step late (async) or at once (sync).

    dispatch step N            (returns at once; out_N starts copying to the host)
    plan and dispatch step N+1 (host work overlaps the device; nothing of step N is read yet)
    read out_N, commit it      (detokenize, stop checks, free finished slots)

Sync mode reads step N before any host work on step N+1, then plans N+1 as async would (before committing N)
and dispatches it: the device waits while the host works, and nothing else changes. Both modes run the very
same steps (same plans, same padded batches), so they give identical outputs however a kernel's rounding depends
on the batch size, and the speed difference between them is the overlap alone. Random numbers are keyed on
(seed, position).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from jaxspec.config import EngineConfig
from jaxspec.engine.block_manager import BlockManager
from jaxspec.engine.model_runner import ModelRunner
from jaxspec.engine.output_processor import OutputProcessor
from jaxspec.engine.scheduler import Scheduler, StepPlan
from jaxspec.engine.sequence import Sequence


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


@dataclass
class StepTimes:
    num_steps: int = 0
    host_wait_s: float = 0.0  # time blocked reading step outputs: the device was behind the host
    wall_s: float = 0.0


class LLMEngine:
    def __init__(self, cfg: EngineConfig, runner: ModelRunner, output_processor: OutputProcessor):
        self.cfg = cfg
        self.runner = runner
        self.k = cfg.num_speculative_tokens
        self.block_manager = BlockManager(cfg.num_pages, cfg.page_size, cfg.pages_per_seq, cfg.max_num_seqs)
        self.scheduler = Scheduler(cfg, self.block_manager, output_processor.append_tokens)
        self.spec_metrics = SpecMetrics(accepted_per_position=[0] * self.k)
        self.times = StepTimes()
        self.trace: list[tuple[str, int]] | None = None  # ("dispatch" | "fetch", step): set to [] to record

    def add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def _record(self, event: str, step: int) -> None:
        if self.trace is not None:
            self.trace.append((event, step))

    def run(self, on_commit=None) -> None:
        """Run until every added request is finished. `on_commit()` is called after each commit."""
        pending: deque[tuple[int, StepPlan, object, object]] = deque()
        step = 0
        start = time.perf_counter()
        while self.scheduler.has_unfinished() or pending:
            # sync: wait for step N before any host work on step N+1; the plan is still made before N's commit
            fetched = self._fetch(*pending.popleft()) if pending and not self.cfg.async_scheduling else None
            plan = self.scheduler.schedule() if self.scheduler.has_unfinished() else StepPlan()
            if not plan and not pending and fetched is None:
                raise RuntimeError("the scheduler can make no progress: the KV pool cannot hold one request")
            tables = self.block_manager.tables
            if fetched is not None:
                # the plan may run a request this commit finishes once more (async does too): keep its tables
                tables = tables.copy()
                self._commit(*fetched, on_commit)
            if plan:
                prefill_out = self.runner.prefill(plan.prefill, tables) if plan.prefill else None
                decode_out = self.runner.decode(plan.decode_slots, tables) if plan.decode else None
                self._record("dispatch", step)
                pending.append((step, plan, prefill_out, decode_out))
                step += 1
            if pending and self.cfg.async_scheduling and (not plan or len(pending) > 1):
                self._commit(*self._fetch(*pending.popleft()), on_commit)
        self.times.num_steps += step
        self.times.wall_s += time.perf_counter() - start

    def _fetch(self, step: int, plan: StepPlan, prefill_out, decode_out) -> tuple:
        """Read a step's outputs (blocking until the device has them)."""
        t0 = time.perf_counter()
        prefill_np = np.asarray(prefill_out) if prefill_out is not None else None
        decode_np = np.asarray(decode_out) if decode_out is not None else None
        self.times.host_wait_s += time.perf_counter() - t0
        self._record("fetch", step)
        return plan, prefill_np, decode_np

    def _commit(self, plan: StepPlan, prefill_np, decode_np, on_commit=None) -> None:
        if self.k and decode_np is not None:
            self._count_acceptance(plan, decode_np)
        self.scheduler.commit(plan, prefill_np, decode_np)
        if on_commit is not None:
            on_commit()

    def _count_acceptance(self, plan: StepPlan, decode_np: np.ndarray) -> None:
        """Add one step's drafts to the counters (vectorized: this runs once per step over every row)."""
        m = self.spec_metrics
        # the extra step of a request that already finished: its tokens are discarded, and so is its draft
        live = np.fromiter((not seq.is_finished for seq in plan.decode), bool, len(plan.decode))
        accepted = decode_np[:len(plan.decode), 0][live].astype(np.int64) - 1
        m.num_drafts += len(accepted)
        m.num_draft_tokens += self.k * len(accepted)
        m.num_accepted_tokens += int(accepted.sum())
        for j in range(self.k):
            m.accepted_per_position[j] += int(np.count_nonzero(accepted > j))
