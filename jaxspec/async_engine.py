"""vLLM's `AsyncLLMEngine`: requests from asyncio code, each an async generator of its `RequestOutput`s, while the
engine steps on a thread of its own (jaxspec.serve.engine_loop, the server's engine loop).

    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model="smollm2-135m-instruct"))
    async for output in engine.generate("Hello", SamplingParams(max_tokens=32), request_id="0"):
        print(output.outputs[0].text)        # cumulative by default; RequestOutputKind.DELTA gives the new text

A generator closed early (the consumer breaks out, or its task is cancelled) aborts its request; `abort(id)` ends
it from elsewhere, its generator yielding the final output (finish_reason "abort"). The engine thread serves the
event loop it was started on (the first `generate`'s; a later asyncio.run gets a new thread); `shutdown()` aborts
what runs and stops it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from jaxspec.engine_args import EngineArgs
from jaxspec.outputs import RequestOutput
from jaxspec.sampling_params import SamplingParams
from jaxspec.serve.engine_loop import EngineDeadError, EngineLoop

AsyncEngineArgs = EngineArgs  # vLLM's name for the same settings


class AsyncLLMEngine:
    def __init__(self, llm: Any):
        self.llm = llm
        self._loop: EngineLoop | None = None

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "AsyncLLMEngine":
        return cls(engine_args.create_llm())

    def _engine_loop(self) -> EngineLoop:
        """The engine thread, bound to the running event loop; one left from an earlier loop (an earlier
        asyncio.run) is stopped first, as it can reach only that loop."""
        running = asyncio.get_running_loop()
        if self._loop is not None and self._loop.event_loop is not running:
            self.shutdown()
        if self._loop is None:
            self._loop = EngineLoop(self.llm)
            self._loop.start()
        return self._loop

    async def generate(self, prompt, sampling_params: SamplingParams | None, request_id: str
                       ) -> AsyncIterator[RequestOutput]:
        """The request's outputs as the engine makes them, under sampling_params.output_kind. A bad request raises
        its ValueError (naming the problem) before anything runs; other requests are not affected."""
        stream = await self._engine_loop().submit([(request_id, prompt, sampling_params)], time.perf_counter())
        try:
            async for batch in stream.batches():
                for output in batch:
                    yield output
        finally:
            stream.close()  # aborts the request unless it finished

    async def abort(self, request_id: str | Iterable[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        if self._loop is not None:
            self._loop.abort(ids, notify_reader=True)

    async def get_tokenizer(self) -> Any | None:
        return self.llm.get_tokenizer()

    @property
    def is_running(self) -> bool:
        return self._loop is not None and self._loop.is_healthy

    @property
    def errored(self) -> bool:
        return self._loop is not None and self._loop.error is not None

    @property
    def is_stopped(self) -> bool:
        """The engine stopped on an error (vLLM's: it will run nothing more)."""
        return self.errored

    @property
    def dead_error(self) -> EngineDeadError:
        return EngineDeadError(f"the engine has stopped: {None if self._loop is None else self._loop.error}")

    async def check_health(self) -> None:
        """vLLM's: returns while the engine can run requests, raises `dead_error` once it has stopped on an error."""
        if self.errored:
            raise self.dead_error

    def shutdown(self) -> None:
        """Abort what runs and stop the engine thread (blocking); the LLM stays usable."""
        if self._loop is not None:
            self._loop.stop()
            self._loop = None
