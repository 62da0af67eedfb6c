"""`jaxspec serve MODEL [flags]`: vLLM's `vllm serve` flags, an LLM built from them, and uvicorn.

Only argparse and the engine flags (jaxspec.engine_args, no jax) are imported at module level: `jaxspec --help`
and every other command work without the serve extra (FastAPI, uvicorn, prometheus_client); they are imported
when the server starts.
"""

from __future__ import annotations

import argparse
import functools
import os

from jaxspec.engine_args import EngineArgs


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="preset name, jaxspec checkpoint or HF Llama directory")
    s = p.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: every interface)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every route but /health and /metrics "
                                     "(default: $JAXSPEC_API_KEY when set)")
    s.add_argument("--served-model-name", nargs="+", help="model name(s) the API answers to (default: MODEL); "
                                                          "responses report the first")
    s.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
    s.add_argument("--disable-uvicorn-access-log", action="store_true")
    s.add_argument("--disable-frontend-multiprocessing", action="store_true",
                   help="run the engine on a thread of the server's process (default: a process of its own, so "
                        "that the HTTP side and the engine's host work do not share one GIL)")
    EngineArgs.add_cli_args(p, model_flag=False)


def build_llm(args: argparse.Namespace):
    return EngineArgs.from_cli_args(args).create_llm()


def build_engine(args: argparse.Namespace):
    """The LLM the flags describe, in a process of its own (an EngineProcess) unless
    --disable-frontend-multiprocessing."""
    if args.disable_frontend_multiprocessing:
        return build_llm(args)
    from jaxspec.serve.engine_process import EngineProcess

    return EngineProcess.launch(functools.partial(build_llm, args))


def run(args: argparse.Namespace) -> None:
    import uvicorn

    from jaxspec.serve.app import build_app

    api_key = args.api_key or os.environ.get("JAXSPEC_API_KEY")  # read now, as the server starts
    try:
        engine = build_engine(args)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"jaxspec serve: error: {exc}") from None
    app = build_app(engine, served_model_name=args.served_model_name or [args.model], api_key=api_key,
                    model_path=args.model)
    # asyncio's own loop even where uvloop is installed: with the engine on a thread of this process
    # (--disable-frontend-multiprocessing) its steps were 20 % longer under uvloop (64 streams, CPU machine); the
    # likely cause, not verified, is the GIL (uv_try_write keeps it where asyncio's socket writes let go of it)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
                access_log=not args.disable_uvicorn_access_log, timeout_graceful_shutdown=5, loop="asyncio")
