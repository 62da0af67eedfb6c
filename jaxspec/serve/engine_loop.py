"""The asyncio side of the server's engine: submit requests, abort them, and read their outputs.

The engine runs in an `EngineCore` (jaxspec.serve.engine_core) that the HTTP side never touches: `EngineLoop`
runs it on a thread of this process, `EngineProcess` (jaxspec.serve.engine_process) in a process of its own, so
that the event loop's work on the streams and the engine's host work do not take turns on one GIL. Either way
the core's events reach the event loop, where each step's outputs are routed to their request's inbox: the HTTP
side never waits on a step, and the engine does nothing per request but what `step()` does.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from jaxspec.serve.engine_core import Abort, Add, EngineCore, Event, Stop

logger = logging.getLogger("jaxspec.serve")


class EngineDeadError(RuntimeError):
    """The engine thread stopped on an exception; no request can run any more."""


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
    """`start()` on the event loop, then `submit()` requests and read their outputs from the RequestStream. This
    class runs the engine on a thread of this process (`llm` is the LLM; it is the caller's again after `stop()`);
    EngineProcess runs it in a process of its own."""

    def __init__(self, llm, on_outputs: Callable[[list, list[RequestTiming], float], None] | None = None,
                 snapshot_interval_s: float = 0.1):
        self.llm = llm
        self.on_outputs = on_outputs  # called on the event loop with each step's routed outputs
        self.snapshot_interval_s = snapshot_interval_s
        self.metrics: dict = llm.stats() if llm is not None else {}  # the engine's latest snapshot
        self.error: str | None = None  # what stopped the engine
        self._routes: dict[str, _Route] = {}  # event loop only
        self._acks: dict[int, tuple[asyncio.Future, list[str]]] = {}  # add id -> (submit's future, its ids)
        self._add_ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    # ---- what the engine serves (EngineProcess: from its process)

    @property
    def tokenizer(self) -> Any | None:
        return self.llm.get_tokenizer()

    @property
    def max_model_len(self) -> int:
        return self.llm.engine_config.max_model_len

    @property
    def default_sampling_values(self) -> dict[str, Any]:
        return self.llm.default_sampling_values

    @property
    def eos_token_ids(self) -> set[int]:
        return self.llm.llm_engine.input_processor.eos_token_ids

    @property
    def max_logprobs(self) -> int:
        return self.llm.engine_config.max_logprobs

    # ---- the engine's side, on a thread (EngineProcess overrides these three)

    def _start_engine(self) -> None:
        core = EngineCore(self.llm, self._commands, self._emit, self.snapshot_interval_s)
        self._thread = threading.Thread(target=core.run, name="jaxspec-engine", daemon=True)
        self._thread.start()

    def _send(self, command) -> None:
        self._commands.put(command)

    @property
    def _engine_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _emit(self, event: Event) -> None:
        """On the engine thread: the event to the event loop. A metrics snapshot is one reference swap, which
        readers on any thread see whole, and an engine error shows in is_healthy at once; once the event loop has
        closed (an asyncio.run of AsyncLLMEngine's has ended), nobody reads what the engine still says."""
        if event[0] == "metrics":
            self.metrics = event[1]
            return
        if event[0] == "dead":
            self.error = event[1]
        try:
            self._loop.call_soon_threadsafe(self._on_event, event)
        except RuntimeError:  # the event loop is closed
            pass

    # ---- event loop side

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._start_engine()

    def stop(self) -> None:
        """Abort what runs, let the engine free it, and end the thread (blocking: call it from a worker thread)."""
        if self._engine_alive:
            self._send(Stop())
            self._thread.join()

    @property
    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop outputs go to (the one `start()` ran on)."""
        return self._loop

    @property
    def is_healthy(self) -> bool:
        return self.error is None and self._engine_alive

    async def submit(self, requests: list[tuple[str, Any, Any]], arrival: float) -> RequestStream:
        """Queue requests (request_id, prompt, params) and return once the engine has accepted all of them; a
        ValueError (bad request) or EngineDeadError otherwise, and then none of them runs."""
        if not self.is_healthy:
            raise EngineDeadError(f"the engine has stopped: {self.error}")
        engine_requests = self._engine_requests(requests)
        inbox = Inbox(self._loop)
        ids = [rid for rid, _, _ in requests]
        for rid in ids:
            self._routes[rid] = _Route(inbox, RequestTiming(arrival))
        done = self._loop.create_future()
        add_id = next(self._add_ids)
        self._acks[add_id] = (done, ids)
        try:
            self._send(Add(add_id, engine_requests))
        except EngineDeadError:
            self._acks.pop(add_id)
            self._drop(ids)
            raise
        try:
            await done
        except asyncio.CancelledError:  # the caller went away while the engine was adding
            self.abort(ids)
            raise
        return RequestStream(self, ids, inbox)

    def abort(self, request_ids: list[str], notify_reader: bool = False) -> None:
        """Abort requests; their reader gets the final output (finish_reason "abort") only with notify_reader,
        else nobody is assumed to read their inbox any more."""
        for rid in request_ids:
            if rid in self._routes and not notify_reader:
                self._routes[rid].aborted = True
        if self.is_healthy:
            try:
                self._send(Abort(list(request_ids)))
            except EngineDeadError:  # nothing runs any more
                pass

    def _engine_requests(self, requests: list[tuple[str, Any, Any]]) -> list[tuple[str, Any, Any]]:
        """The requests as the engine runs them (EngineProcess: some with their text made here)."""
        return requests

    def _drop(self, request_ids: list[str]) -> None:
        """Requests that will not run."""
        for rid in request_ids:
            self._routes.pop(rid, None)

    def _on_event(self, event: Event) -> None:
        """On the event loop: one event of the engine's."""
        kind = event[0]
        if kind == "outputs":
            self._route(event[1], event[2])
        elif kind == "metrics":
            self.metrics = event[1]  # one reference swap: readers on other threads see old or new
        elif kind == "ack":
            self._acknowledge(event[1], event[2])
        else:  # "dead": an engine bug; say so on every open request and in /health
            self._fail_all(event[1])

    def _acknowledge(self, add_id: int, error: ValueError | None) -> None:
        """The engine took the requests, or refused them all (then they have no route)."""
        done, request_ids = self._acks.pop(add_id)
        if error is not None:
            self._drop(request_ids)
        if done.done():  # cancelled: submit() has asked for an abort
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def _route(self, outputs: list, now: float) -> None:
        """Each output to its request's inbox (not for an aborted request's reader)."""
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

    def _fail_all(self, error: str) -> None:
        self.error = error
        dead = EngineDeadError(f"the engine has stopped: {error}")
        routes, self._routes = self._routes, {}
        for route in routes.values():
            route.inbox.put(dead)
        acks, self._acks = self._acks, {}
        for done, _ in acks.values():
            if not done.done():
                done.set_exception(dead)


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
