"""The engine side of the server: the one owner of an `LLMEngine`, on a thread or in a process of its own.

`LLMEngine` is not thread-safe, so one `EngineCore` runs it. Before each step it drains the commands queued for
it (add, abort, stop); it steps while any request is unfinished and blocks for a command when none is. What it
has to say goes through `emit`, as events: an add's acknowledgement, each step's outputs with their time, a
snapshot of `LLM.stats()` (every `snapshot_interval_s`, and whenever it goes idle, before and after the last
outputs; with `emit_s`, the time spent handing outputs on, which grows when the server cannot keep up) and the
error that stopped it. Where events go (this process's event loop, or a pipe to the server's process) is the
caller's business (jaxspec.serve.engine_loop, jaxspec.serve.engine_process).

Adds are acknowledged: the core validates a batch of requests (`make_request` raises a ValueError naming the
problem) and queues them only if all are valid, so a bad request gets its 400 before any response header is
sent and a batch of prompts runs all or nothing.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("jaxspec.serve")


@dataclass
class Add:
    add_id: int  # the acknowledgement names it
    requests: list[tuple[str, Any, Any]]  # (request_id, prompt, SamplingParams)


@dataclass
class Abort:
    request_ids: list[str]


class Stop:
    """Abort what runs, let the engine free it, and return from `run`."""


# Events, as tuples: ("ack", add_id, ValueError | None), ("outputs", [RequestOutput], perf_counter time),
# ("metrics", LLM.stats() | {"emit_s": ...}), ("dead", "what stopped the engine").
Event = tuple


class EngineCore:
    def __init__(self, llm, commands: queue.SimpleQueue, emit: Callable[[Event], None],
                 snapshot_interval_s: float = 0.1):
        self.llm = llm
        self.engine = llm.llm_engine
        self.commands = commands
        self.emit = emit
        self.snapshot_interval_s = snapshot_interval_s
        self._live: set[str] = set()  # added and not yet finished
        self._last_snapshot = 0.0
        self._emit_s = 0.0  # in emit(outputs): encoding, and the pipe's back-pressure in a process of its own

    def run(self) -> None:
        """Step until told to stop; an exception (an engine bug) is logged and emitted as "dead"."""
        try:
            while self._apply(self._next_commands()):
                if self.engine.has_unfinished_requests():
                    outputs = self.engine.step()
                    if outputs and not self.engine.has_unfinished_requests():
                        # idle now: the snapshot goes before these outputs, so that a client holding its last
                        # token reads counters (/metrics) that hold every step (after them, a benchmark's final
                        # read could beat it and miss the run's last steps)
                        self._snapshot(force=True)
                    if outputs:
                        now = time.perf_counter()
                        self._live.difference_update(o.request_id for o in outputs if o.finished)
                        self.emit(("outputs", outputs, now))
                        self._emit_s += time.perf_counter() - now
                self._snapshot(force=not self.engine.has_unfinished_requests())
            self._drain_for_stop()
        except BaseException as e:
            logger.exception("the engine stopped")
            self.emit(("dead", repr(e)))

    def _next_commands(self) -> list:
        """Every queued command; blocks for one when the engine has nothing to do."""
        commands = [] if self.engine.has_unfinished_requests() else [self.commands.get()]
        while True:
            try:
                commands.append(self.commands.get_nowait())
            except queue.Empty:
                return commands

    def _apply(self, commands: list) -> bool:
        """Run the commands in order; False once told to stop."""
        for cmd in commands:
            if isinstance(cmd, Stop):
                return False
            if isinstance(cmd, Abort):
                self.engine.abort_request(cmd.request_ids)
                self._live.difference_update(cmd.request_ids)
            else:
                self._add(cmd)
        return True

    def _add(self, cmd: Add) -> None:
        """Validate the whole batch, then queue it: a ValueError leaves nothing queued."""
        try:
            seqs = [self.engine.make_request(rid, prompt, params) for rid, prompt, params in cmd.requests]
        except ValueError as e:
            self.emit(("ack", cmd.add_id, ValueError(str(e))))  # a plain ValueError: it crosses a pipe
            return
        for seq in seqs:
            self.engine.queue(seq)
        self._live.update(rid for rid, _, _ in cmd.requests)
        self.emit(("ack", cmd.add_id, None))

    def _drain_for_stop(self) -> None:
        """Abort everything still running and step until the engine has freed it, so the LLM stays usable."""
        self.engine.abort_request(list(self._live))
        while self.engine.has_unfinished_requests():
            self.engine.step()
        self._snapshot(force=True)

    def _snapshot(self, force: bool) -> None:
        now = time.perf_counter()
        if force or now - self._last_snapshot >= self.snapshot_interval_s:
            self.emit(("metrics", self.llm.stats() | {"emit_s": self._emit_s}))
            self._last_snapshot = now
