"""`jaxspec serve MODEL [flags]`: vLLM's `vllm serve` flags, an LLM built from them, and uvicorn.

Only argparse is imported at module level: `jaxspec --help` and every other command work without the serve extra
(FastAPI, uvicorn, prometheus_client); they are imported when the server starts.
"""

from __future__ import annotations

import argparse
import json
import os


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="preset name, jaxspec checkpoint or HF Llama directory")
    s = p.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: every interface)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1 routes (default: $JAXSPEC_API_KEY "
                                     "when set)")
    s.add_argument("--served-model-name", nargs="+", help="model name(s) the API answers to (default: MODEL); "
                                                          "responses report the first")
    s.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
    s.add_argument("--disable-uvicorn-access-log", action="store_true")
    e = p.add_argument_group("engine")
    e.add_argument("--speculative-config", help='JSON: {"method": "eagle", "model": HEAD_DIR, '
                                                '"num_speculative_tokens": 3}')
    e.add_argument("--tokenizer", help="tokenizer directory (default: the model's)")
    e.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--max-model-len", type=int, default=None)
    e.add_argument("--max-num-seqs", type=int, default=64)
    e.add_argument("--max-num-batched-tokens", type=int, default=2048)
    e.add_argument("--gpu-memory-utilization", type=float, default=0.85,
                   help="fraction of device memory for weights and the KV pool")
    e.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    e.add_argument("--block-size", type=int, default=16, help="tokens per KV page")
    e.add_argument("--num-gpu-blocks-override", type=int, default=0, help="KV pages (default: from memory)")
    e.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    e.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                   help="overlap the host's scheduling of step N+1 with the device's step N (default on)")
    e.add_argument("--decode-buckets", type=_ints, help="decode batch sizes to compile, e.g. 1,16,64 (default: "
                                                        "powers of two up to --max-num-seqs)")
    e.add_argument("--prefill-buckets", type=_ints, help="prefill token counts to compile, e.g. 512,2048")
    e.add_argument("--layer-loop", default="auto", choices=["auto", "unroll", "scan"],
                   help="auto: unrolled on a GPU (fastest, slow to compile); scan compiles in seconds")
    e.add_argument("--compilation-cache-dir", help="JAX's persistent compilation cache: a restart with the same "
                                                   "shapes loads its programs instead of compiling them")


def build_llm(args: argparse.Namespace):
    from jaxspec import LLM

    if args.compilation_cache_dir:
        import jax
        jax.config.update("jax_compilation_cache_dir", args.compilation_cache_dir)
    spec = json.loads(args.speculative_config) if args.speculative_config else None
    return LLM(args.model, tokenizer=args.tokenizer, dtype=args.dtype, seed=args.seed,
               max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
               max_num_batched_tokens=args.max_num_batched_tokens,
               gpu_memory_utilization=args.gpu_memory_utilization, tensor_parallel_size=args.tensor_parallel_size,
               page_size=args.block_size, num_pages=args.num_gpu_blocks_override, load_format=args.load_format,
               async_scheduling=args.async_scheduling, speculative_config=spec,
               decode_buckets=args.decode_buckets, prefill_buckets=args.prefill_buckets, layer_loop=args.layer_loop)


def run(args: argparse.Namespace) -> None:
    import uvicorn

    from jaxspec.serve.app import build_app

    api_key = args.api_key or os.environ.get("JAXSPEC_API_KEY")  # read now, as the server starts
    try:
        llm = build_llm(args)
    except (ValueError, FileNotFoundError, json.JSONDecodeError) as exc:
        raise SystemExit(f"jaxspec serve: error: {exc}") from None
    app = build_app(llm, served_model_name=args.served_model_name or [args.model], api_key=api_key,
                    model_path=args.model)
    # asyncio's own loop even where uvloop is installed: the engine steps on a thread of this process, and under
    # uvloop its steps were 20 % longer (64 streams, CPU machine); the likely cause, not verified, is the GIL
    # (uv_try_write keeps it where asyncio's socket writes let go of it)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
                access_log=not args.disable_uvicorn_access_log, timeout_graceful_shutdown=5, loop="asyncio")
