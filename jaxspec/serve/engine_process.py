"""The server's engine in a process of its own (vLLM's engine-core process), `jaxspec serve`'s default.

With the engine on a thread of the server's process, the event loop's work (HTTP, one chunk per stream per
wake-up) and the engine's host work (scheduling, dispatch, detokenizing) take turns on one GIL: under load each
slows the other, and async scheduling, whose point is that the host works while the device does, loses most of
its lead. Here the engine process runs the `EngineCore`; the server's process keeps the event loop, tokenizes
prompts and formats responses, and the two talk through two pipes: commands one way (add, abort, stop), events
the other (acknowledgements, each step's outputs as tuples (jaxspec.serve.wire), metrics snapshots, the engine's
death). A thread of the engine process moves commands from their pipe to the core's queue, so that the server
never waits on a step to send one. The text of requests without stop strings is made in the server from their
token ids (jaxspec.serve.wire), as in vLLM, another part of the per-step host work off the engine. Requests stream
DELTA outputs, so that steps which wait in the pipe can be read as one (`_read`).

The LLM is built in the engine process by `factory` (a picklable callable: the process is spawned, not forked,
as JAX and CUDA are not fork-safe), which is also where its errors are raised; `launch` returns once it is ready,
with what the server needs of it (tokenizer, max_model_len, the model's sampling defaults, EOS ids and
max_logprobs). The server's process never initializes JAX, so it holds no device memory.
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import pickle
import queue
import signal
import threading
from collections.abc import Callable
from typing import Any

from jaxspec.sampling_params import RequestOutputKind
from jaxspec.serve.engine_core import EngineCore, Event, Stop
from jaxspec.serve.engine_loop import EngineDeadError, EngineLoop
from jaxspec.serve.wire import Decoder, Encoder, merge


MAX_EVENTS_PER_WAKEUP = 256  # engine events (a step's outputs each) read per turn of the event loop


def _picklable(e: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def _pump(conn, commands: queue.SimpleQueue) -> None:
    """Engine process: commands from the pipe to the core's queue; the server gone, a Stop."""
    try:
        while True:
            commands.put(conn.recv())
    except (EOFError, OSError):
        commands.put(Stop())


def _engine_main(factory: Callable[[], Any], commands_conn, events_conn, snapshot_interval_s: float) -> None:
    """The engine process: build the LLM, say it is ready (or why not), and run the core until told to stop.
    Ctrl-C in a terminal reaches every process of its group: this one leaves it to the server, whose shutdown
    stops the engine in order (as vLLM's engine core does)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        llm = factory()
    except BaseException as e:
        events_conn.send(("failed", _picklable(e)))
        return
    events_conn.send(("ready", {"tokenizer": llm.get_tokenizer(), "max_model_len": llm.engine_config.max_model_len,
                                "default_sampling_values": llm.default_sampling_values,
                                "eos_token_ids": llm.llm_engine.input_processor.eos_token_ids,
                                "max_logprobs": llm.engine_config.max_logprobs, "metrics": llm.stats()}))
    commands: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_pump, args=(commands_conn, commands), name="jaxspec-commands", daemon=True).start()
    encoder = Encoder()

    def emit(event: Event) -> None:
        if event[0] == "outputs":
            event = ("outputs", encoder.encode(event[1]), event[2])
        events_conn.send(event)

    EngineCore(llm, commands, emit, snapshot_interval_s).run()


class EngineProcess(EngineLoop):
    """An EngineLoop whose engine runs in a child process; make one with `launch`."""

    def __init__(self, process, commands_conn, events_conn, ready: dict):
        super().__init__(None)
        self.metrics = ready["metrics"]
        self._process, self._commands_conn, self._events_conn = process, commands_conn, events_conn
        self._ready = ready
        self._decoder = Decoder(ready["tokenizer"])
        self._stopping = False

    @classmethod
    def launch(cls, factory: Callable[[], Any], snapshot_interval_s: float = 0.1) -> "EngineProcess":
        """Spawn the engine process and wait until its LLM is built; the factory's exception (a ValueError naming a
        bad setting, say) is raised here."""
        ctx = multiprocessing.get_context("spawn")
        commands_recv, commands_send = ctx.Pipe(duplex=False)
        events_recv, events_send = ctx.Pipe(duplex=False)
        process = ctx.Process(target=_engine_main, name="jaxspec-engine", daemon=True,
                              args=(factory, commands_recv, events_send, snapshot_interval_s))
        process.start()
        commands_recv.close()  # the child's ends: closed here, so that either side sees the other exit (EOF)
        events_send.close()
        try:
            kind, payload = events_recv.recv()
        except EOFError:
            process.join()
            raise RuntimeError(f"the engine process exited while building the LLM (exit code {process.exitcode})")
        if kind == "failed":
            process.join()
            raise payload
        return cls(process, commands_send, events_recv, payload)

    @property
    def tokenizer(self) -> Any | None:
        return self._ready["tokenizer"]

    @property
    def max_model_len(self) -> int:
        return self._ready["max_model_len"]

    @property
    def default_sampling_values(self) -> dict[str, Any]:
        return self._ready["default_sampling_values"]

    @property
    def eos_token_ids(self) -> set[int]:
        return self._ready["eos_token_ids"]

    @property
    def max_logprobs(self) -> int:
        return self._ready["max_logprobs"]

    @property
    def pid(self) -> int:
        return self._process.pid

    def _engine_requests(self, requests: list[tuple[str, Any, Any]]) -> list[tuple[str, Any, Any]]:
        """DELTA outputs only (the server's), which add up when the reader merges waiting steps."""
        for rid, _, params in requests:
            if params.output_kind is not RequestOutputKind.DELTA:
                raise ValueError(f"request {rid!r}: the engine process streams DELTA outputs, got {params.output_kind}")
        return [(rid, prompt, self._decoder.engine_params(rid, params)) for rid, prompt, params in requests]

    def _drop(self, request_ids: list[str]) -> None:
        super()._drop(request_ids)
        self._decoder.forget(request_ids)

    def _start_engine(self) -> None:
        self._loop.add_reader(self._events_conn.fileno(), self._read)

    def _send(self, command) -> None:
        try:
            self._commands_conn.send(command)
        except OSError as e:  # the process is gone; the reader says so on every open request
            raise EngineDeadError(f"the engine process is gone: {e!r}") from None

    @property
    def _engine_alive(self) -> bool:
        return self._process.is_alive()

    def _read(self) -> None:
        """On the event loop, when the events pipe is readable: the events that wait there, at most
        MAX_EVENTS_PER_WAKEUP, with each run of consecutive steps' outputs merged into one (wire.merge). Never
        until the pipe is empty: an engine that steps faster than this loop routes would keep it full, and the
        streams' tasks, which run between these callbacks, would send nothing until the engine stopped (seen on
        the H200: 64 streams got every token in the last 20 ms). Merged, a backlog costs one decode and one write
        per stream; before (up to 4 events, each decoded and routed), the server fell behind at 64 streams and
        its full pipe held the engine back (H200, rate inf: the engine spent 0.6-2.6 ms a step blocked on it)."""
        events = []
        try:
            while len(events) < MAX_EVENTS_PER_WAKEUP and self._events_conn.poll():
                events.append(self._events_conn.recv())
        except (EOFError, OSError):
            self._loop.remove_reader(self._events_conn.fileno())
            self._route_events(events)
            if not self._stopping and self.error is None:
                self._process.join(timeout=5)
                self._fail_all(f"the engine process exited (exit code {self._process.exitcode})")
            return
        self._route_events(events)

    def _route_events(self, events: list) -> None:
        """The events in order, each run of consecutive steps' outputs as one (decoded once, at its last time)."""
        for is_outputs, run in itertools.groupby(events, key=lambda event: event[0] == "outputs"):
            if is_outputs:
                run = list(run)
                rows = functools.reduce(merge, (event[1] for event in run))
                self._on_event(("outputs", self._decoder.decode(rows), run[-1][2]))
            else:
                for event in run:
                    self._on_event(event)

    def stop(self, timeout_s: float = 60) -> None:
        """Abort what runs and end the engine process (blocking: call it from a worker thread); a process that has
        not ended after timeout_s is killed."""
        self._stopping = True
        if self._process.is_alive():
            try:
                self._commands_conn.send(Stop())
            except OSError:
                pass
            self._process.join(timeout=timeout_s)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
