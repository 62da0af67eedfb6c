"""`jaxspec serve MODEL [flags]`: vLLM's `vllm serve` flags, an LLM built from them, and uvicorn.

Only argparse and the engine flags (jaxspec.engine_args, no jax) are imported at module level: `jaxspec --help`
and every other command work without the serve extra (FastAPI, uvicorn, prometheus_client); they are imported
when the server starts.
"""

from __future__ import annotations

import argparse
import codecs
import functools
import json
import os
from pathlib import Path

from jaxspec.engine_args import EngineArgs
from jaxspec.serve.tool_parsers import PARSERS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="preset name, jaxspec checkpoint or HF Llama directory")
    s = p.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: every interface)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every route, /health and /metrics "
                                     "included (default: $JAXSPEC_API_KEY when set)")
    s.add_argument("--served-model-name", nargs="+", help="model name(s) the API answers to (default: MODEL); "
                                                          "responses report the first")
    s.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
    s.add_argument("--disable-uvicorn-access-log", action="store_true")
    s.add_argument("--disable-frontend-multiprocessing", action="store_true",
                   help="run the engine on a thread of the server's process (default: a process of its own, so "
                        "that the HTTP side and the engine's host work do not share one GIL)")
    s.add_argument("--chat-template", type=load_chat_template,
                   help="the chat template: a file, or the template itself (default: the model's)")
    s.add_argument("--trust-request-chat-template", action="store_true",
                   help="let a request send its own chat_template (refused by default)")
    s.add_argument("--response-role", default="assistant", help="the role of answers after a generation prompt")
    s.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="let requests with tools have the model call them (needs --tool-call-parser)")
    s.add_argument("--tool-call-parser", choices=sorted(PARSERS),
                   help="how the model writes tool calls: hermes (<tool_call> blocks), llama3_json (JSON), "
                        "pythonic ([f(a=1)])")
    s.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction, default=False,
                   help="log each request's prompt token ids and sampling params")
    s.add_argument("--disable-log-requests", action="store_true", help="accepted (the default)")
    s.add_argument("--root-path", default="", help="the path prefix of a proxy in front of the server")
    s.add_argument("--allowed-origins", type=json.loads, default=None,
                   help='JSON list of origins whose browsers may call the server (CORS), e.g. ["*"]; default none '
                        '(vLLM allows every origin)')
    s.add_argument("--allowed-methods", type=json.loads, default=["*"], help="CORS methods (JSON list)")
    s.add_argument("--allowed-headers", type=json.loads, default=["*"], help="CORS headers (JSON list)")
    s.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    EngineArgs.add_cli_args(p, model_flag=False)


def load_chat_template(value: str) -> str:
    """vLLM's --chat-template: a file's contents, or the template itself when it reads as one (with escapes such as
    \\n decoded); a value that names no file and holds no template braces is an error naming it."""
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text()
    if not any(c in value for c in "{}\n"):
        raise argparse.ArgumentTypeError(f"--chat-template {value!r}: no such file, and not a template")
    return codecs.decode(value, "unicode_escape")


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
    from jaxspec.serve.serving import ChatOptions

    api_key = args.api_key or os.environ.get("JAXSPEC_API_KEY")  # read now, as the server starts
    try:
        engine = build_engine(args)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"jaxspec serve: error: {exc}") from None
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise SystemExit("jaxspec serve: error: --enable-auto-tool-choice needs --tool-call-parser")
    parser = args.tool_call_parser if args.enable_auto_tool_choice else None
    chat = ChatOptions(args.chat_template, args.trust_request_chat_template, args.response_role, parser)
    cors = dict(allow_methods=args.allowed_methods, allow_headers=args.allowed_headers,
                allow_credentials=args.allow_credentials)
    app = build_app(engine, served_model_name=args.served_model_name or [args.model], api_key=api_key,
                    model_path=args.model, chat_options=chat, log_requests=args.enable_log_requests,
                    allowed_origins=args.allowed_origins, cors=cors)
    # asyncio's own loop even where uvloop is installed: with the engine on a thread of this process
    # (--disable-frontend-multiprocessing) its steps were 20 % longer under uvloop (64 streams, CPU machine); the
    # likely cause, not verified, is the GIL (uv_try_write keeps it where asyncio's socket writes let go of it)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level, root_path=args.root_path,
                access_log=not args.disable_uvicorn_access_log, timeout_graceful_shutdown=5, loop="asyncio")
