"""The FastAPI app: OpenAI's /v1 routes, /health, /metrics, errors as OpenAI's JSON, and the API key.

`build_app(engine, ...)` serves an engine that is already built: an `EngineProcess` (the CLI's default: the LLM
in a process of its own) or an LLM, whose engine then runs on a thread of this process. The engine starts with
the app (its lifespan) and is stopped with it; everything else runs on the event loop. A client that disconnects,
streaming or not, aborts its requests, and the engine frees their pages.

`api_key` guards every route (`Authorization: Bearer <key>`), /health and /metrics included: a load balancer's
probe or a Prometheus scrape sends the header too (vLLM leaves those two, /tokenize, /detokenize and /version
open). CORS preflights, which browsers send without credentials, are answered before the key check when
`allowed_origins` is given.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from jaxspec.serve import protocol as api
from jaxspec.serve.beam_serving import beam_search_params, run_beam_search
from jaxspec.serve.engine_loop import EngineDeadError, EngineLoop, RequestStream
from jaxspec.serve.metrics import ServerMetrics
from jaxspec.serve.serving import (APIError, ChatFormat, ChatOptions, CompletionFormat, bad_value, chat_inputs,
                                   chat_prompts, completion_inputs, completion_prompts, engine_inputs)

logger = logging.getLogger("jaxspec.serve")


class APIKeyMiddleware:
    """Pure ASGI (a BaseHTTPMiddleware would hide client disconnects from the routes): every HTTP request needs
    the key."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                error = APIError("Unauthorized: this server needs 'Authorization: Bearer <api key>'", 401)
                return await JSONResponse(error.body(), status_code=401)(scope, receive, send)
        return await self.app(scope, receive, send)


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """A malformed body as one readable message, and the first field it names."""
    parts, param = [], None
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        param = param or (loc[0] if loc else None)
        parts.append(f"{'.'.join(loc) or 'body'}: {err.get('msg')}")
    return "; ".join(parts) or "malformed request body", param


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body is already read, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_app(engine, served_model_name: str | list[str] | None = None, api_key: str | None = None,
              model_path: str | None = None, chat_options: ChatOptions = ChatOptions(),
              log_requests: bool = False, allowed_origins: list[str] | None = None,
              cors: dict[str, Any] | None = None) -> FastAPI:
    """An app that serves `engine` (an EngineLoop, EngineProcess among them, or an LLM) under `served_model_name`
    (the first name is the one responses report). `chat_options`: the chat template settings; `log_requests`:
    log each request's prompts and sampling params (vLLM's --enable-log-requests); `allowed_origins` (and `cors`:
    CORSMiddleware's methods, headers, credentials): browsers' cross-origin calls, none unless given."""
    names = [served_model_name] if isinstance(served_model_name, str) else list(served_model_name or [])
    names = names or [model_path or "jaxspec"]
    engine = engine if isinstance(engine, EngineLoop) else EngineLoop(engine)
    tokenizer = engine.tokenizer
    max_model_len = engine.max_model_len
    metrics = ServerMetrics(names[0], lambda: engine.metrics)
    engine.on_outputs = metrics.observe

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield
        await asyncio.to_thread(engine.stop)

    app = FastAPI(title="jaxspec", lifespan=lifespan)
    app.state.engine = engine
    app.state.metrics = metrics
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    if allowed_origins:  # added last, so it runs first: a preflight OPTIONS is answered before the key check
        app.add_middleware(CORSMiddleware, allow_origins=allowed_origins, **(cors or {}))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return _error(APIError(message, 400, param))

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return _error(exc)

    def check_model(model: str | None) -> None:
        if model is not None and model not in names:
            raise APIError(f"The model `{model}` does not exist.", 404, "model")

    async def generate(request: Request, req: api.SamplingRequest, request_id: str, make_inputs: Callable,
                       make_prompts: Callable, fmt_cls: type) -> Response:
        arrival = time.perf_counter()
        check_model(req.model)
        extra = sorted(req.model_extra or {})
        if extra:
            logger.warning("request %s: ignored fields %s", request_id, extra)
        if req.use_beam_search:
            return await beam_search(request, req, request_id, make_prompts, fmt_cls)
        inputs = make_inputs(req, request_id, tokenizer, engine.default_sampling_values)
        if log_requests:
            logger.info("request %s: prompt token ids %s, params %s", request_id,
                        [prompt["prompt_token_ids"] for _, prompt, _ in inputs.requests], inputs.requests[0][2])
        try:
            stream = await engine.submit(inputs.requests, arrival)
        except ValueError as e:
            raise bad_value(e) from None
        except EngineDeadError as e:
            raise APIError(str(e), 500) from None
        fmt = fmt_cls(request_id, names[0], req, inputs, tokenizer)
        if req.stream:
            return StreamingResponse(_sse(stream, fmt), media_type="text/event-stream")
        return await _complete(request, stream, fmt)

    async def beam_search(request: Request, req: api.SamplingRequest, request_id: str, make_prompts: Callable,
                          fmt_cls: type) -> Response:
        """vLLM's use_beam_search: the whole answer at the end; a streaming request gets it as one event."""
        inputs = engine_inputs(request_id, *make_prompts(req, tokenizer))
        params = beam_search_params(req, req.engine_max_tokens(), inputs.prompt_lens, max_model_len,
                                    engine.max_logprobs, engine.default_sampling_values)
        fmt = fmt_cls(request_id, names[0], req, inputs, tokenizer)

        async def collect() -> dict:
            fmt.add(await run_beam_search(engine, request_id, inputs, params, req, tokenizer))
            return fmt.response()

        response = await _finish(request, collect(), lambda: None)
        if not req.stream or response.status_code != 200:
            return response
        return StreamingResponse(iter([f"data: {response.body.decode()}\n\n", "data: [DONE]\n\n"]),
                                 media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(req: api.CompletionRequest, request: Request) -> Response:
        return await generate(request, req, f"cmpl-{uuid.uuid4().hex}", completion_inputs, completion_prompts,
                              CompletionFormat)

    chat = (functools.partial(chat_inputs, options=chat_options),
            functools.partial(chat_prompts, options=chat_options),
            functools.partial(ChatFormat, response_role=chat_options.response_role,
                              tool_parser=chat_options.tool_parser))

    @app.post("/v1/chat/completions")
    async def chat_completions(req: api.ChatCompletionRequest, request: Request) -> Response:
        return await generate(request, req, f"chatcmpl-{uuid.uuid4().hex}", *chat)

    @app.post("/tokenize")
    async def tokenize(req: api.TokenizeCompletionRequest | api.TokenizeChatRequest) -> dict:
        """vLLM's: a text (as the completions API tokenizes it) or a conversation (through the chat template)."""
        check_model(req.model)
        if tokenizer is None:
            raise APIError("this model has no tokenizer", param="prompt")
        if isinstance(req, api.TokenizeChatRequest):
            tokens = chat_prompts(req, tokenizer, req.add_special_tokens, chat_options)[0][0]
        else:
            tokens = tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        strs = tokenizer.convert_ids_to_tokens(tokens) if req.return_token_strs else None
        return api.TokenizeResponse(count=len(tokens), max_model_len=max_model_len, tokens=tokens,
                                    token_strs=strs).model_dump()

    @app.post("/detokenize")
    async def detokenize(req: api.DetokenizeRequest) -> dict:
        check_model(req.model)
        if tokenizer is None:
            raise APIError("this model has no tokenizer", param="tokens")
        vocab = len(tokenizer)
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(f"token ids {bad[:5]} are outside the tokenizer's vocabulary [0, {vocab})",
                           param="tokens")
        return api.DetokenizeResponse(prompt=tokenizer.decode(req.tokens)).model_dump()

    @app.get("/version")
    async def version() -> dict:
        try:
            return {"version": importlib.metadata.version("jaxspec")}
        except importlib.metadata.PackageNotFoundError:  # run from a source tree (PYTHONPATH), not installed
            return {"version": "unknown (not installed)"}

    @app.get("/v1/models")
    async def models() -> dict:
        cards = [api.ModelCard(id=name, root=model_path or names[0], max_model_len=max_model_len) for name in names]
        return api.ModelList(data=cards).model_dump()

    @app.get("/health")
    async def health() -> Response:
        if engine.is_healthy:
            return Response(status_code=200)
        return _error(APIError(f"the engine has stopped: {engine.error}", 503))

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


async def _sse(stream: RequestStream, fmt) -> AsyncIterator[str]:
    """Server-sent events: every chunk available at a wake-up in one write, then usage (if asked) and [DONE].
    Cancelled when the client disconnects; `finally` then aborts what is unfinished."""
    try:
        async for batch in stream.batches():
            events = fmt.chunks(batch)
            if events:
                yield "".join(f"data: {e}\n\n" for e in events)
        usage = fmt.usage_chunk()
        yield (f"data: {usage}\n\n" if usage else "") + "data: [DONE]\n\n"
    except EngineDeadError as e:
        yield f"data: {json.dumps(APIError(str(e), 500).body())}\n\n" + "data: [DONE]\n\n"
    finally:
        stream.close()


async def _complete(request: Request, stream: RequestStream, fmt) -> Response:
    """A non-streaming response, or nothing if the client leaves first (then its requests are aborted)."""

    async def collect() -> dict:
        async for batch in stream.batches():
            fmt.add(batch)
        return fmt.response()

    return await _finish(request, collect(), stream.close)


async def _finish(request: Request, collect, close: Callable[[], None]) -> Response:
    """The JSON that `collect` (a coroutine) makes, or nothing if the client leaves first: then `collect` is
    cancelled and `close` aborts what still runs. A bad request found on the way is a 400, a dead engine a 500."""
    work, gone = asyncio.ensure_future(collect), asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
        close()
    if not work.done() or work.cancelled():
        return Response(status_code=499)  # nobody is listening
    try:
        return JSONResponse(work.result())
    except EngineDeadError as e:
        return _error(APIError(str(e), 500))
    except APIError as e:
        return _error(e)
    except ValueError as e:
        return _error(bad_value(e))
