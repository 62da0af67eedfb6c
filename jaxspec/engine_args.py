"""vLLM's `EngineArgs`: the engine's settings as one dataclass with vLLM's field and flag names, so that code written
for vLLM's engine runs with the import changed:

    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    engine = LLMEngine.from_engine_args(EngineArgs.from_cli_args(parser.parse_args()))
    llm = LLM(**dataclasses.asdict(EngineArgs(model="smollm2-135m-instruct", max_model_len=1024)))

The fields are the settings jaxspec implements plus the vLLM options scripts pass routinely (trust_remote_code,
enforce_eager, enable_chunked_prefill, ...; `vllm_options` says what each does here); any other keyword is a
TypeError naming it, as from any dataclass. `jaxspec serve` takes the same flags (the model as a positional
argument, as `vllm serve` does).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from jaxspec.presets import DEFAULT_PRESET


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _json_dict(s: str) -> dict:
    try:
        value = json.loads(s)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object is needed, got {s!r}")
    return value


@dataclass
class EngineArgs:
    model: str = DEFAULT_PRESET  # preset name, jaxspec checkpoint or HF Llama directory
    tokenizer: str | None = None
    dtype: str = "auto"
    seed: int = 0
    load_format: str = "auto"
    speculative_config: dict | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    gpu_memory_utilization: float = 0.85
    kv_cache_memory_bytes: int | None = None
    tensor_parallel_size: int = 1
    block_size: int = 16  # tokens per KV page
    num_gpu_blocks_override: int | None = None  # KV pages (None: sized from memory)
    async_scheduling: bool = True
    max_logprobs: int = 20
    num_scheduler_steps: int = 1  # multi-step decoding: decode steps per dispatch while nothing waits or prefills
    page_lookahead: int = 64  # positions of pages given ahead to every decoding sequence when one needs a page
    page_reserve_whole: bool = True  # ... and pages for its whole length at once while free pages cover it
    enable_prefix_caching: bool | None = None  # None: on (vLLM's default)
    generation_config: str = "auto"  # the model's sampling defaults: "auto", "vllm" (none) or a directory
    override_generation_config: dict | None = None
    structured_outputs_config: dict | None = None  # jaxspec.structured_output.StructuredOutputsConfig's fields
    guided_decoding_backend: str | None = None  # vLLM's name before 0.11 for structured_outputs_config's backend
    # vLLM options with nothing (or one thing) to do here; `vllm_options` says what each does
    trust_remote_code: bool = False
    enforce_eager: bool = False
    enable_chunked_prefill: bool | None = None
    disable_log_stats: bool = True
    swap_space: float = 4
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    download_dir: str | None = None
    revision: str | None = None  # of a Hub repo
    tokenizer_mode: str = "auto"
    enable_lora: bool = False
    # jaxspec's own: which shapes to compile, the layer loop, the persistent compilation cache
    decode_buckets: list[int] | None = None
    prefill_buckets: list[int] | None = None
    layer_loop: str = "auto"
    compilation_cache_dir: str | None = None

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, model_flag: bool = True) -> argparse.ArgumentParser:
        """vLLM's engine flags on `parser` (returned, as vLLM's is). model_flag False leaves the model out, for a
        command that takes it as a positional argument."""
        e = parser.add_argument_group("engine")
        if model_flag:
            e.add_argument("--model", default=DEFAULT_PRESET,
                           help=f"preset name, jaxspec checkpoint or HF Llama directory (default {DEFAULT_PRESET})")
        e.add_argument("--speculative-config", type=_json_dict,
                       help='JSON: {"method": "eagle", "model": HEAD_DIR, "num_speculative_tokens": 3}')
        e.add_argument("--tokenizer", help="tokenizer directory (default: the model's)")
        e.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "half", "float32", "float"])
        e.add_argument("--seed", type=int, default=0)
        e.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
        e.add_argument("--max-model-len", type=int, default=None)
        e.add_argument("--max-num-seqs", type=int, default=64)
        e.add_argument("--max-num-batched-tokens", type=int, default=2048)
        e.add_argument("--gpu-memory-utilization", type=float, default=0.85,
                       help="fraction of device memory for weights and the KV pool")
        e.add_argument("--kv-cache-memory-bytes", type=int, default=None, help="KV pool size (overrides the above)")
        e.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
        e.add_argument("--block-size", type=int, default=16, help="tokens per KV page")
        e.add_argument("--num-gpu-blocks-override", type=int, default=None, help="KV pages (default: from memory)")
        e.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                       help="overlap the host's scheduling of step N+1 with the device's step N (default on)")
        e.add_argument("--max-logprobs", type=int, default=20, help="the most logprobs a request may ask for")
        e.add_argument("--num-scheduler-steps", type=int, default=1,
                       help="decode steps one dispatch runs while no request waits or prefills (multi-step)")
        e.add_argument("--page-lookahead", type=int, default=64,
                       help="positions of KV pages given ahead to every decoding sequence when one needs a page, "
                            "so that block tables change at one step in many (0: pages as needed)")
        e.add_argument("--page-reserve-whole", action=argparse.BooleanOptionalAction, default=True,
                       help="pages for a decoding sequence's whole length (prompt + max_tokens) at once while free "
                            "pages cover it, so its block table stops changing (given back when pages run short)")
        e.add_argument("--generation-config", default="auto",
                       help="sampling defaults: auto (the model's generation_config.json), vllm (none), or a "
                            "directory holding a generation_config.json")
        e.add_argument("--override-generation-config", type=_json_dict,
                       help='JSON applied over the generation config, e.g. {"temperature": 0.5}')
        e.add_argument("--structured-outputs-config", type=_json_dict,
                       help='JSON, e.g. {"backend": "auto", "disable_any_whitespace": true, "max_states": 4096} '
                            "(the device pool of constraint automata: max_states, max_transitions)")
        e.add_argument("--guided-decoding-backend", help="vLLM's older flag: structured_outputs_config's backend")
        e.add_argument("--trust-remote-code", action="store_true", help="accepted; jaxspec never runs model code")
        e.add_argument("--enforce-eager", action="store_true",
                       help="start fast: scanned layers, programs compiled on first use")
        e.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                       help="reuse the KV pages of prompts' shared prefixes (default: on, as in vLLM)")
        e.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
                       help="accepted; long prompts are always prefilled in chunks")
        e.add_argument("--swap-space", type=float, default=4, help="accepted; preempted requests are recomputed")
        e.add_argument("--quantization", "-q", default=None, help="only none: weights run in --dtype")
        e.add_argument("--kv-cache-dtype", default="auto", help="only auto: the KV cache has the model's dtype")
        e.add_argument("--download-dir", help="where presets and Hub repos are fetched (default: the weights dir, "
                                              "the Hub cache)")
        e.add_argument("--revision", help="branch, tag or commit of a Hugging Face Hub repo")
        e.add_argument("--tokenizer-mode", default="auto", help="only auto: the model's fast tokenizer")
        e.add_argument("--decode-buckets", type=_ints, help="decode batch sizes to compile, e.g. 1,16,64 (default: "
                                                            "powers of two up to --max-num-seqs)")
        e.add_argument("--prefill-buckets", type=_ints, help="prefill token counts to compile, e.g. 512,2048")
        e.add_argument("--layer-loop", default="auto", choices=["auto", "unroll", "scan"],
                       help="auto: unrolled on a GPU (fastest, slow to compile); scan compiles in seconds")
        e.add_argument("--compilation-cache-dir", help="JAX's persistent compilation cache: a restart with the same "
                                                       "shapes loads its programs instead of compiling them")
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        """The fields from parsed flags (others in the namespace, e.g. a server's, are ignored)."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)})

    def llm_kwargs(self) -> dict[str, Any]:
        """`LLM`'s keyword arguments for these settings."""
        return dataclasses.asdict(self)

    def create_llm(self):
        from jaxspec.llm import LLM

        return LLM(**self.llm_kwargs())


# vLLM options jaxspec takes only at these values (vllm_options)
REQUIRED: dict[str, tuple] = {
    "pipeline_parallel_size": (1,), "data_parallel_size": (1,), "cpu_offload_gb": (0, 0.0),
    "skip_tokenizer_init": (False,), "enable_sleep_mode": (False,), "tokenizer_revision": (None,),
    "hf_token": (None,), "hf_overrides": (None,), "task": (None, "auto", "generate"),
    "runner": ("auto", "generate")}


def vllm_options(engine_args: dict[str, Any]) -> dict[str, Any]:
    """`LLM`'s keyword arguments with vLLM's options that jaxspec has no setting for taken out, each checked:
    trust_remote_code (no effect: jaxspec reads weights, never code), enforce_eager (True: scanned layers and
    programs compiled on first use, unless layer_loop or warmup say otherwise: vLLM's trade of speed for start-up
    time), enable_chunked_prefill, disable_log_stats, swap_space (no effect: prefill is always chunked, no stats are
    logged, preempted requests are recomputed), quantization (None only), kv_cache_dtype and tokenizer_mode
    ("auto" only), enable_lora (False only); and those vLLM scripts pass at their defaults, with nothing to do here:
    max_seq_len_to_capture, disable_custom_all_reduce, disable_async_output_proc, compilation_config (XLA compiles
    every shape and runs it as CUDA graphs; collectives are XLA's), distributed_executor_backend (None, "mp" or
    "uni": one process drives its devices), and, at their defaults only (REQUIRED), pipeline_parallel_size,
    data_parallel_size, cpu_offload_gb, skip_tokenizer_init, enable_sleep_mode, tokenizer_revision, hf_token
    (HF_TOKEN applies), hf_overrides, task / runner (generation). A value that cannot be honoured is a
    ValueError naming it, before anything loads."""
    out = dict(engine_args)
    for name in ("trust_remote_code", "enable_chunked_prefill", "disable_log_stats", "swap_space",
                 "max_seq_len_to_capture", "disable_custom_all_reduce", "disable_async_output_proc",
                 "compilation_config"):
        out.pop(name, None)
    backend = out.pop("distributed_executor_backend", None)
    if backend not in (None, "mp", "uni"):
        raise ValueError(f"distributed_executor_backend={backend!r} is not supported: one jaxspec process drives its "
                         "devices (several hosts: jax.distributed, README 'Several hosts')")
    for name, allowed in REQUIRED.items():
        if name in out and out.pop(name) not in allowed:
            raise ValueError(f"{name}={engine_args[name]!r} is not supported: jaxspec takes only "
                             f"{' or '.join(map(repr, allowed))}")
    if out.pop("enforce_eager", False):
        if out.get("layer_loop", "auto") == "auto":
            out["layer_loop"] = "scan"
        if out.get("warmup", "auto") == "auto":
            out["warmup"] = False
    quantization = out.pop("quantization", None)
    if quantization is not None:
        raise ValueError(f"quantization={quantization!r} is not supported: jaxspec runs the weights in `dtype` "
                         "(GGUF files are dequantized when converted)")
    if out.pop("enable_lora", False):
        raise ValueError("enable_lora=True is not supported: jaxspec has no LoRA adapters")
    tokenizer_mode = out.pop("tokenizer_mode", "auto")
    if tokenizer_mode != "auto":
        raise ValueError(f"tokenizer_mode={tokenizer_mode!r} is not supported: jaxspec uses the model's fast tokenizer "
                         "('auto')")
    kv_cache_dtype = out.pop("kv_cache_dtype", "auto")
    if kv_cache_dtype != "auto":
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is not supported: the KV cache has the model's dtype "
                         "('auto')")
    return out
