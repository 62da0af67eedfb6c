"""The engine on its own thread, and the asyncio side's handle on it.

`LLMEngine` is not thread-safe, so one thread owns it. Before each step that thread drains a queue of commands
(add, abort) that the HTTP side puts there; it steps while any request is unfinished and blocks on the queue
when none is. The outputs of a step go to the event loop in one `call_soon_threadsafe` callback, which routes
each to its request's inbox: the HTTP side never waits on a step and never touches the engine, and the engine
thread does nothing per request but what `step()` does.

Adds are acknowledged: the engine thread validates the requests (`make_request` raises a ValueError naming the
problem), queues them only if all are valid, and resolves the caller's future, so a bad request gets its 400
before any response header is sent and a batch of prompts runs all or nothing.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("jaxspec.serve")


class EngineDeadError(RuntimeError):
    """The engine thread stopped on an exception; no request can run any more."""


@dataclass
class _Add:
    requests: list[tuple[str, Any, Any]]  # (request_id, prompt, SamplingParams)
    done: asyncio.Future


@dataclass
class _Abort:
    request_ids: list[str]


class _Stop:
    pass


@dataclass
class RequestTiming:
    """When a request arrived and got its tokens (perf_counter seconds), for the latency metrics."""
    arrival: float
    first_token: float | None = None
    last_token: float | None = None
    num_tokens: int = 0


class Inbox:
    """One HTTP request's outputs waiting for its reader: a list and a future, lighter than an asyncio.Queue (the
    event loop puts into and takes from one for each of 64 streams every step)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.items: list = []
        self.waiter: asyncio.Future | None = None

    def put(self, item) -> None:
        self.items.append(item)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def take(self) -> list:
        """Everything put since the last take; waits for an item when there is none."""
        while not self.items:
            self.waiter = self.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        items, self.items = self.items, []
        return items


@dataclass
class _Route:
    inbox: Inbox
    timing: RequestTiming
    aborted: bool = False  # nobody reads the inbox any more; the metrics still see the request out


class EngineLoop:
    """`start()` on the event loop, then `submit()` requests and read their outputs from the RequestStream."""

    def __init__(self, llm, on_outputs: Callable[[list, list[RequestTiming], float], None] | None = None,
                 snapshot_interval_s: float = 0.1):
        self.llm = llm
        self.engine = llm.llm_engine
        self.on_outputs = on_outputs  # called on the event loop with each step's routed outputs
        self.snapshot_interval_s = snapshot_interval_s
        self.metrics: dict = llm.get_metrics()  # the engine's counters, refreshed by the engine thread
        self.error: BaseException | None = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._routes: dict[str, _Route] = {}  # event loop only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._live: set[str] = set()  # engine thread only: added and not yet finished
        self._last_snapshot = 0.0

    # ---- event loop side

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="jaxspec-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Abort what runs, let the engine free it, and end the thread (blocking: call it from a worker thread)."""
        if self._thread is not None and self._thread.is_alive():
            self._commands.put(_Stop())
            self._thread.join()

    @property
    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop outputs go to (the one `start()` ran on)."""
        return self._loop

    @property
    def is_healthy(self) -> bool:
        return self.error is None and self._thread is not None and self._thread.is_alive()

    async def submit(self, requests: list[tuple[str, Any, Any]], arrival: float) -> RequestStream:
        """Queue requests (request_id, prompt, params) and return once the engine has accepted all of them; a
        ValueError (bad request) or EngineDeadError otherwise, and then none of them runs."""
        if not self.is_healthy:
            raise EngineDeadError(f"the engine has stopped: {self.error!r}")
        inbox = Inbox(self._loop)
        ids = [rid for rid, _, _ in requests]
        for rid in ids:
            self._routes[rid] = _Route(inbox, RequestTiming(arrival))
        done = self._loop.create_future()
        self._commands.put(_Add(requests, done))
        try:
            await done
        except asyncio.CancelledError:  # the caller went away while the engine thread was adding
            self.abort(ids)
            raise
        return RequestStream(self, ids, inbox)

    def abort(self, request_ids: list[str], notify_reader: bool = False) -> None:
        """Abort requests; their reader gets the final output (finish_reason "abort") only with notify_reader,
        else nobody is assumed to read their inbox any more."""
        for rid in request_ids:
            if rid in self._routes and not notify_reader:
                self._routes[rid].aborted = True
        self._commands.put(_Abort(list(request_ids)))

    def _acknowledge(self, done: asyncio.Future, request_ids: list[str], error: ValueError | None) -> None:
        """On the event loop: the engine took the requests, or refused them all (then they have no route)."""
        if error is not None:
            for rid in request_ids:
                self._routes.pop(rid, None)
        if done.done():  # cancelled: submit() has asked for an abort
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def _route(self, outputs: list, now: float) -> None:
        """On the event loop: each output to its request's inbox (not for an aborted request's reader)."""
        routed, timings = [], []
        for out in outputs:
            route = self._routes.get(out.request_id)
            if route is None:
                continue
            if out.finished:
                del self._routes[out.request_id]
            if not route.aborted:
                route.inbox.put(out)
            routed.append(out)
            timings.append(route.timing)
        if self.on_outputs is not None and routed:
            self.on_outputs(routed, timings, now)

    def _fail_all(self, error: BaseException) -> None:
        routes, self._routes = self._routes, {}
        for route in routes.values():
            route.inbox.put(EngineDeadError(f"the engine has stopped: {error!r}"))

    # ---- engine thread

    def _run(self) -> None:
        try:
            while self._apply(self._next_commands()):
                if self.engine.has_unfinished_requests():
                    outputs = self.engine.step()
                    if outputs:
                        now = time.perf_counter()
                        self._live.difference_update(o.request_id for o in outputs if o.finished)
                        self._loop.call_soon_threadsafe(self._route, outputs, now)
                self._snapshot(force=not self.engine.has_unfinished_requests())
            self._drain_for_stop()
        except BaseException as e:  # an engine bug: say so on every open request and in /health
            logger.exception("the engine thread stopped")
            self.error = e
            self._loop.call_soon_threadsafe(self._fail_all, e)

    def _next_commands(self) -> list:
        """Every queued command; blocks for one when the engine has nothing to do."""
        commands = [] if self.engine.has_unfinished_requests() else [self._commands.get()]
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _apply(self, commands: list) -> bool:
        """Run the commands in order; False once told to stop."""
        for cmd in commands:
            if isinstance(cmd, _Stop):
                return False
            if isinstance(cmd, _Abort):
                self.engine.abort_request(cmd.request_ids)
                self._live.difference_update(cmd.request_ids)
            else:
                self._add(cmd)
        return True

    def _add(self, cmd: _Add) -> None:
        """Validate the whole batch, then queue it: a ValueError leaves nothing queued."""
        ids = [rid for rid, _, _ in cmd.requests]
        try:
            seqs = [self.engine.make_request(rid, prompt, params) for rid, prompt, params in cmd.requests]
        except ValueError as e:
            self._loop.call_soon_threadsafe(self._acknowledge, cmd.done, ids, e)
            return
        for seq in seqs:
            self.engine.queue(seq)
        self._live.update(ids)
        self._loop.call_soon_threadsafe(self._acknowledge, cmd.done, ids, None)

    def _drain_for_stop(self) -> None:
        """Abort everything still running and step until the engine has freed it, so the LLM stays usable."""
        self.engine.abort_request(list(self._live))
        while self.engine.has_unfinished_requests():
            self.engine.step()
        self._snapshot(force=True)

    def _snapshot(self, force: bool) -> None:
        now = time.perf_counter()
        if force or now - self._last_snapshot >= self.snapshot_interval_s:
            self.metrics = self.llm.get_metrics()  # one reference swap: readers on other threads see old or new
            self._last_snapshot = now


@dataclass
class RequestStream:
    """The outputs of one HTTP request's engine requests (one per prompt), in step order."""
    loop: EngineLoop
    request_ids: list[str]
    inbox: Inbox
    unfinished: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.unfinished = set(self.request_ids)

    async def batches(self) -> AsyncIterator[list]:
        """Lists of the outputs available now (one await per wake-up, however many steps it covers), until every
        request has finished."""
        while self.unfinished:
            batch = await self.inbox.take()
            for item in batch:
                if isinstance(item, BaseException):
                    self.unfinished.clear()
                    raise item
                if item.finished:
                    self.unfinished.discard(item.request_id)
            yield batch

    def close(self) -> None:
        """Abort what has not finished (the client went away, or the response failed)."""
        if self.unfinished:
            self.loop.abort(sorted(self.unfinished))
            self.unfinished.clear()
