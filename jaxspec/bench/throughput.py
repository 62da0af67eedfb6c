"""`jaxspec bench throughput` / `python bench/throughput.py`: offline throughput, as `vllm bench throughput`.

One run: build the LLM (compiling its buckets), run a short untimed generate, time one `generate` over all
prompts, print `Throughput: X requests/s, Y total tokens/s, Z output tokens/s` and the spec-decoding counters.

`--sweep`: prompt counts (--sweep-prompts) x {async, sync} x {EAGLE (with --speculative-config), no speculation}
in one process. Each mode builds one LLM and reuses it for every count and both schedulings (the flag is flipped
between generate calls). Greedy outputs of async and sync runs are compared token for token. Results go to
bench/results/<date>-<label>.{json,png}; the JSON is rewritten after every point, so a killed run keeps what it
did. Any failing piece (an LLM that does not build, a run, the HF peer, the profiler) is recorded in the table
and the JSON and the sweep goes on.

Order of work: prompts (no jax), the HF peer in a child process (before jax claims the GPU), bandwidth and matmul
rate, every mode's LLM (all compiling up front), then prompt counts outer and modes inner (a spent --time-budget-s
loses the largest counts, not a whole mode; with --repeats R each count runs its modes R times, each round starting
one mode later, and reports the median run: single runs differ by several per cent), then the profiles. Each
stage is timed and printed (`[bench ...s] ...`, one line per compiled program) so a slow compile shows where the
minutes went: on the H200 one unrolled-layer program takes 30 to 60 s, so pass few --decode-buckets /
--prefill-buckets.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import json
import re
import shlex
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from jaxspec import compile_cache
from jaxspec.bench import data, report
from jaxspec.json_config import read_json, read_json_arg

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "bench" / "results"
RESULTS_MD = ROOT / "bench" / "RESULTS.md"
AGREE_TOKENS = 8  # the HF peer must agree on this many first tokens of each output
DATASET_NAMES = ("random", "custom")  # vllm bench throughput's --dataset-name values that we have


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("model")
    m.add_argument("--model", default="smollm2-135m-instruct",
                   help="preset name, jaxspec checkpoint or HF Llama directory")
    m.add_argument("--tokenizer", help="tokenizer directory (default: the model's hf/ directory)")
    m.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                   help="dummy: random weights of the model's shapes (and a random EAGLE head)")
    m.add_argument("--hf-config", help=f"config.json path or a built-in name ({', '.join(data.HF_CONFIGS)}) "
                                       "for --load-format dummy: real shapes, no files")
    m.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                   help="auto: bfloat16 on a GPU, the checkpoint's dtype elsewhere")
    m.add_argument("--speculative-config", help='JSON or a .json file: {"method": "eagle", "model": HEAD_DIR, '
                                                '"num_speculative_tokens": 2}; model "dummy" = a random head '
                                                'shaped like a target layer (with --load-format dummy)')
    m.add_argument("--synthetic-acceptance", type=float, metavar="P",
                   help="each draft position accepts with probability P (dummy-weight runs: outputs meaningless)")
    w = p.add_argument_group("workload")
    w.add_argument("--dataset-name", choices=DATASET_NAMES,
                   help="as vllm bench throughput (whose sharegpt, sonnet, hf... are not here): random (token ids "
                        "of --input-len) or custom (the JSONL of --dataset-path); default custom with a "
                        "--dataset-path, else random")
    w.add_argument("--dataset-path", "--dataset", dest="dataset",
                   help="JSONL with question, prompt, turns or messages rows (chat-formatted)")
    w.add_argument("--input-len", type=int, default=128)
    w.add_argument("--max-tokens", "--output-len", dest="max_tokens", type=int, default=256)
    w.add_argument("--num-prompts", type=int, default=48)
    w.add_argument("--temperature", type=float, default=0.0)
    w.add_argument("--top-p", type=float, default=1.0)
    w.add_argument("--top-k", type=int, default=0)
    w.add_argument("--min-p", type=float, default=0.0)
    w.add_argument("--presence-penalty", type=float, default=0.0)
    w.add_argument("--frequency-penalty", type=float, default=0.0)
    w.add_argument("--repetition-penalty", type=float, default=1.0)
    w.add_argument("--min-tokens", type=int, default=0)
    w.add_argument("--logprobs", type=int, metavar="N", help="top-N logprobs per output token (at most 20)")
    w.add_argument("--structured-outputs", type=json.loads, metavar="JSON",
                   help='every request constrained: StructuredOutputsParams fields, e.g. \'{"regex": "[a-z ]+"}\'')
    w.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=None,
                   help="default: on for random prompts, off for a dataset")
    w.add_argument("--seed", type=int, default=0)
    e = p.add_argument_group("engine")
    e.add_argument("--max-num-seqs", type=int, help="default: the largest prompt count (at most 256)")
    e.add_argument("--max-model-len", type=int, help="default: longest prompt + max tokens + look-ahead")
    e.add_argument("--max-num-batched-tokens", type=int, default=2048)
    e.add_argument("--block-size", "--page-size", dest="page_size", type=int, default=16,
                   help="tokens per KV-cache page")
    e.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True)
    e.add_argument("--num-scheduler-steps", type=int, default=1,
                   help="decode steps per dispatch while nothing waits or prefills (multi-step decoding)")
    e.add_argument("--page-lookahead", type=int, default=64,
                   help="positions of KV pages given ahead to every decoding sequence when one needs a page "
                        "(0: pages as needed)")
    e.add_argument("--page-reserve-whole", action=argparse.BooleanOptionalAction, default=True,
                   help="pages for a decoding sequence's whole length at once while free pages cover it")
    e.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the KV pages of prompts seen before (vLLM's default; a repeated round then prefills "
                   "little: --no-enable-prefix-caching compares with runs before the cache)")
    e.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="devices the target is split over (heads, MLP columns/rows, vocabulary, KV heads)")
    e.add_argument("--draft-tensor-parallel-size", type=int,
                   help="the EAGLE head's degree: 1 (replicated) or the target's (default)")
    e.add_argument("--attn-impl", default="auto", help="LLM attn_impl: auto (pallas on GPU), xla, pallas")
    e.add_argument("--layer-loop", default="auto", help="LLM layer_loop: auto (unroll on GPU), unroll, scan")
    e.add_argument("--decode-buckets", type=_ints, help="batch sizes to compile, e.g. 8,16,32,64,96")
    e.add_argument("--prefill-buckets", type=_ints, help="prefill token counts to compile, e.g. 256,1024,2048")
    e.add_argument("--engine-warmup", action="store_true",
                   help="compile every sampling mode (LLM(warmup=True)) instead of the one this run uses")
    e.add_argument("--no-warmup-compile", action="store_true", help=argparse.SUPPRESS)  # tests: compile on use
    compile_cache.add_argument(e)
    s = p.add_argument_group("sweep and reports")
    s.add_argument("--sweep", action="store_true", help="prompt counts x async/sync x EAGLE/no speculation")
    s.add_argument("--sweep-prompts", type=_ints, default=[24, 48, 96])
    s.add_argument("--sweep-k", action="store_true",
                   help="with --speculative-config: the head's LLM runs with the dynamic k policy and with every fixed "
                        "k = 0..num_speculative_tokens (one LLM, policies swapped between runs; async only)")
    s.add_argument("--sweep-sampling", metavar="JSON",
                   help='another sampling setting run by every mode\'s LLM beside the base one, e.g. \'{"logprobs": 5, '
                        '"presence_penalty": 0.5}\' (keys: the processor options above, and structured_outputs: '
                        'StructuredOutputsParams fields): the two alternate within each round of --repeats, so a '
                        'cost comparison is one process on one host')
    s.add_argument("--sweep-no-plain", action="store_true",
                   help="with --speculative-config: leave the no-speculation mode out (half the compiling)")
    s.add_argument("--hf-baseline", action="store_true", help="transformers generate on the same prompts")
    s.add_argument("--hf-prompts", type=_ints, help="prompt counts for the HF peer (default: all)")
    s.add_argument("--hf-timeout", type=float, default=300.0)
    s.add_argument("--profile-dir", help="trace one run per mode and scheduling; report device busy fraction")
    s.add_argument("--profile-prompts", type=int, help="default: the largest prompt count")
    s.add_argument("--profile-max-tokens", type=int,
                   help="default: --max-tokens, so that the busy fraction is the timed runs' (a shorter run weighs "
                        "the prefill and the tail more)")
    s.add_argument("--profile-repeats", type=int, default=5,
                   help="untraced generate calls, back to back, while NVML samples the GPU's busy fraction")
    s.add_argument("--measure-bandwidth", action="store_true", help="time a large device copy (TB/s)")
    s.add_argument("--bandwidth-bytes", type=int)
    s.add_argument("--bandwidth-tbs", type=float, default=None,
                   help="the GPU's copy bandwidth (TB/s) for the roofline when not measured (default: known by "
                        "device kind, 4.3 for an H200; no roofline on a CPU or an unknown GPU)")
    s.add_argument("--measure-matmul", action="store_true", help="time a large bf16 GEMM (TFLOP/s)")
    s.add_argument("--matmul-tflops", type=float, default=None,
                   help="the GPU's bf16 matmul rate (TFLOP/s) for the roofline's FLOPs floor when not measured "
                        "(default: known by device kind, 667 for an H200; none on an unknown GPU)")
    s.add_argument("--output-json", help="also write the result JSON here")
    s.add_argument("--results-dir", default=str(RESULTS_DIR), help="where --sweep writes JSON and PNG")
    s.add_argument("--update-results-md", nargs="?", const=str(RESULTS_MD), metavar="PATH",
                   help=f"replace this run's section in RESULTS.md (default {RESULTS_MD.relative_to(ROOT)})")
    s.add_argument("--from-json", help="render an earlier result JSON (tables, plot, RESULTS.md); runs nothing")
    s.add_argument("--label", help="name of this configuration in tables and RESULTS.md")
    s.add_argument("--repeats", type=int, default=1,
                   help="time each point this many times, the modes and policies in a different order each round "
                        "(each first, and behind each other, equally often), and report the median run (every "
                        "run's output tok/s is in the JSON)")
    s.add_argument("--time-budget-s", type=float, default=0.0,
                   help="skip remaining runs once this many seconds have passed (0: no limit)")


# ---- what to run

@dataclass
class ModelSource:
    label: str
    ckpt: Path | None  # what load_model reads (None: shapes only, from hf_config)
    hf_dir: Path | None  # transformers directory: the HF peer and the tokenizer
    hf_config: dict
    tokenizer_dir: str | None


def model_source(args) -> ModelSource:
    if args.hf_config:
        if args.load_format != "dummy":
            raise ValueError("--hf-config gives shapes only: use it with --load-format dummy")
        label, hf = data.load_hf_config(args.hf_config)
        return ModelSource(label, None, None, hf, args.tokenizer)
    from jaxspec.convert.checkpoint import CONFIG_FILE, config_from_json
    from jaxspec.resolve import resolve_model

    files = resolve_model(args.model)
    if files.hf_dir is not None:
        hf = read_json(files.hf_dir / "config.json")
    else:
        config = files.weights / CONFIG_FILE
        hf = config_from_json(read_json(config), config).to_hf()
    tok = args.tokenizer or (str(files.tokenizer) if files.tokenizer else None)
    return ModelSource(Path(args.model).name, files.weights, files.hf_dir, hf, tok)


def parse_spec(args) -> dict | None:
    if args.synthetic_acceptance is not None:
        if not args.speculative_config:
            raise ValueError("--synthetic-acceptance needs --speculative-config")
        if args.load_format != "dummy":
            raise ValueError("--synthetic-acceptance is for random weights: add --load-format dummy")
        if not 0.0 <= args.synthetic_acceptance <= 1.0:
            raise ValueError(f"--synthetic-acceptance must be in [0, 1], got {args.synthetic_acceptance}")
    if not args.speculative_config:
        return None
    spec = read_json_arg(args.speculative_config, "--speculative-config")
    spec.setdefault("method", "eagle")
    from jaxspec.config import NGRAM_METHODS  # imports jax: not at the module's import
    if args.load_format == "dummy" and spec["method"] not in NGRAM_METHODS:
        spec.setdefault("model", "dummy")
    elif spec.get("model") == "dummy":
        raise ValueError('speculative model "dummy" (a random head) needs --load-format dummy')
    if args.sweep_k:
        spec["dynamic"] = True
    return spec


def check_dataset(args) -> str:
    """vLLM's --dataset-name, of which we have random and custom (a JSONL file), agreeing with --dataset-path."""
    name = args.dataset_name or ("custom" if args.dataset else "random")
    if name == "custom" and not args.dataset:
        raise ValueError("--dataset-name custom needs --dataset-path FILE.jsonl")
    if name == "random" and args.dataset:
        raise ValueError(f"--dataset-name random makes its own prompts: drop --dataset-path {args.dataset}")
    return name


def mode_label(spec: dict | None, synthetic: float | None) -> str:
    if spec is None:
        return "no spec"
    label = f"{spec['method']} k={spec.get('num_speculative_tokens')}"
    from jaxspec.config import has_lookup_fallback
    if has_lookup_fallback(spec):
        label += " + lookup"  # prompt lookup as the head's fallback
    return label + (f" synthetic p={synthetic:g}" if synthetic is not None else "")


def make_prompts(args, src: ModelSource, n: int) -> tuple[list[list[int]], str]:
    if args.dataset:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(src.tokenizer_dir) if src.tokenizer_dir else None
        return data.dataset_prompts(args.dataset, n, tok), f"{Path(args.dataset).name} (chat template)"
    return data.random_prompts(n, args.input_len, src.hf_config["vocab_size"], args.seed), \
        f"random token ids, {args.input_len} each"


# the logits processors and logprobs a run may ask for: SamplingParams field -> its default (off)
PROCESSOR_OPTIONS = {"min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
                     "min_tokens": 0, "logprobs": None, "structured_outputs": None}


def processor_options(args) -> dict:
    """The processor options this run turns on (SamplingParams keyword arguments)."""
    args = args if isinstance(args, dict) else vars(args)
    return {name: args.get(name, off) for name, off in PROCESSOR_OPTIONS.items() if args.get(name, off) != off}


def sampling_settings(args) -> list[tuple[str, dict]]:
    """(label suffix, processor options) of each sampling setting the modes run: the base one, and the one of
    --sweep-sampling on top of it."""
    base = processor_options(args)
    if not args.sweep_sampling:
        return [("", base)]
    extra = read_json_arg(args.sweep_sampling, "--sweep-sampling")
    unknown = sorted(set(extra) - set(PROCESSOR_OPTIONS))
    if unknown:
        raise ValueError(f"--sweep-sampling: unknown option(s) {unknown}; known: {sorted(PROCESSOR_OPTIONS)}")
    options = base | extra
    return [("", base), (" + " + " ".join(f"{name}={v}" for name, v in extra.items()), options)]


def sampling_params(args, n: int, max_tokens: int | None = None, options: dict | None = None) -> list:
    """One SamplingParams per request with its own seed, so a request's tokens are the same in every run;
    `options`: processor options instead of the run's own."""
    from jaxspec.sampling_params import SamplingParams
    options = processor_options(args) if options is None else options
    return [SamplingParams.from_json(options, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                     max_tokens=max_tokens or args.max_tokens, ignore_eos=args.ignore_eos,
                                     seed=(args.seed * 1_000_003 + i) % 2**32) for i in range(n)]


# ---- bookkeeping

class Bench:
    """The result dict under construction, its files, the clock and the error log."""

    def __init__(self, args, result: dict, json_paths: list[Path]):
        self.args, self.result, self.json_paths = args, result, json_paths
        self.start = time.perf_counter()

    def log(self, msg: str) -> None:
        print(f"[bench {time.perf_counter() - self.start:7.1f}s] {msg}", flush=True)

    def out_of_time(self) -> bool:
        budget = self.args.time_budget_s
        return bool(budget) and time.perf_counter() - self.start > budget

    def guard(self, stage: str, fn, *a, **kw):
        """fn(*a, **kw), or None with the error recorded and printed: one piece failing never ends the run."""
        t0 = time.perf_counter()
        try:
            out = fn(*a, **kw)
            self.result["timings"][stage] = time.perf_counter() - t0
            return out
        except Exception as exc:  # noqa: BLE001 (a benchmark reports failures and goes on)
            msg = f"{type(exc).__name__}: {exc}"
            self.result["errors"].append({"stage": stage, "error": msg[:2000],
                                          "traceback": traceback.format_exc()[-4000:]})
            self.log(f"ERROR in {stage}: {msg[:500]}")
            return None

    def save(self) -> None:
        for path in self.json_paths:
            report.save_json(self.result, path)


def machine_info() -> dict:
    import jax
    return {"device_kind": jax.devices()[0].device_kind, "device_count": jax.device_count(),
            "backend": jax.default_backend(), "hostname": socket.gethostname(), "jax_version": jax.__version__}


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", s).strip("-").lower()[:80]


# ---- one timed run

def run_point(llm, prompts, params, is_async: bool) -> tuple[dict, list[list[int]]]:
    from jaxspec.bench.engine import num_compiled
    from jaxspec.engine.llm_engine import metrics_delta

    before, compiled = llm.stats(), num_compiled()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False, async_scheduling=is_async)
    elapsed = time.perf_counter() - t0
    m = metrics_delta(before, llm.stats())
    tokens = [o.outputs[0].token_ids for o in outs]
    n_in, n_out, steps = sum(map(len, prompts)), sum(map(len, tokens)), max(m["num_steps"], 1)
    reasons: dict[str, int] = {}
    for o in outs:
        reasons[str(o.outputs[0].finish_reason)] = reasons.get(str(o.outputs[0].finish_reason), 0) + 1
    point = {
        "num_requests": len(prompts), "elapsed_s": elapsed, "prompt_tokens": n_in, "output_tokens": n_out,
        "requests_per_s": len(prompts) / elapsed, "total_tokens_per_s": (n_in + n_out) / elapsed,
        "output_tokens_per_s": n_out / elapsed, "num_steps": m["num_steps"], "num_dispatches": m["num_dispatches"],
        "engine_wall_s": m["wall_s"], "host_wait_s": m["host_wait_s"],
        "wall_per_step_ms": 1e3 * m["wall_s"] / steps, "host_wait_per_step_ms": 1e3 * m["host_wait_s"] / steps,
        "host_busy_per_step_ms": 1e3 * (m["wall_s"] - m["host_wait_s"]) / steps,
        "num_preemptions": m.get("num_preemptions", 0), "finish_reasons": reasons,
        "num_steps_by_k": m.get("num_steps_by_k", {}),
        "recompiles": None if compiled is None else num_compiled() - compiled,
        "outputs_sha256": hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16],
        **{k: m[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position",
                             "acceptance_rate_per_position", "mean_acceptance_length") if k in m}}
    return point, tokens


def print_point(p: dict, k: int) -> None:
    print(f"Throughput: {p['requests_per_s']:.2f} requests/s, {p['total_tokens_per_s']:.2f} total tokens/s, "
          f"{p['output_tokens_per_s']:.2f} output tokens/s   "
          f"[{p['num_prompts']} prompts, {p['mode']}, {'async' if p['async'] else 'sync'}]")
    line = (f"  {p['num_steps']} steps, {p['wall_per_step_ms']:.2f} ms/step wall, "
            f"{p['host_busy_per_step_ms']:.2f} ms/step host work, {p['host_wait_per_step_ms']:.2f} ms/step host wait")
    if k:
        rates = ", ".join(f"{r:.3f}" for r in p.get("acceptance_rate_per_position", []))
        line += f"; mean acceptance length {p['mean_acceptance_length']:.3f}, per-position acceptance [{rates}]"
    if p.get("recompiles"):
        line += f"; WARNING: {p['recompiles']} compilation(s) during the timed run"
    print(line, flush=True)


# ---- comparisons

def compare_outputs(outputs: dict, result: dict) -> None:
    """async == sync, token for token, per (prompt count, mode); and agreement with the HF peer's first tokens."""
    hf = result.get("hf") or {}
    args = result["args"]
    for (n, mode), runs in _group(outputs).items():
        if True in runs and False in runs:
            result["identical"][f"{n}/{mode}"] = identity(runs[True], runs[False])
        hf_run = hf.get("runs", {}).get(str(n))
        meaningless = ("synthetic" in mode or args["temperature"] > 0 or hf.get("random_weights")
                       or processor_options(args))
        if hf_run and not meaningless:
            ours = runs.get(True) or runs.get(False)
            pairs = [(o[:AGREE_TOKENS], h[:AGREE_TOKENS]) for o, h in zip(ours, hf_run["first_tokens"])]
            agree_tok = sum(a == b for o, h in pairs for a, b in zip(o, h))
            result["hf_agreement"][f"{n}/{mode}"] = {
                "requests_exact": sum(o == h for o, h in pairs) / len(pairs),
                "tokens": agree_tok / max(sum(min(len(o), len(h)) for o, h in pairs), 1), "first_n": AGREE_TOKENS}


def identity(a: list[list[int]], b: list[list[int]]) -> dict:
    """How far two runs' outputs agree: fraction of identical requests, the first differing request and, over
    the differing ones, the earliest token index where they part (late partings point at batch-dependent numerics
    in the tail, where async and sync batches differ, rather than at a protocol bug)."""
    same = [x == y for x, y in zip(a, b)]
    parts = [next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y)))
             for x, y in zip(a, b) if x != y]
    return {"all": all(same), "fraction": sum(same) / len(same),
            "first_mismatch": same.index(False) if not all(same) else None,
            "earliest_differing_token": min(parts) if parts else None,
            "median_differing_token": sorted(parts)[len(parts) // 2] if parts else None}


def _group(outputs: dict) -> dict:
    grouped: dict = {}
    for (n, mode, is_async), toks in outputs.items():
        grouped.setdefault((n, mode), {})[is_async] = toks
    return grouped


# ---- the run

def run(args) -> dict:
    from jaxspec.bench.engine import env_knobs

    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
        result["label"] = args.label or result["label"]
        finish(args, result, [], render_only=True)
        return result
    args.dataset_name = check_dataset(args)
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    sampling_settings(args)  # a bad --sweep-sampling fails before anything is built
    if args.ignore_eos is None:
        args.ignore_eos = not args.dataset
    src = model_source(args)
    spec = parse_spec(args)
    counts = sorted(set(args.sweep_prompts)) if args.sweep else [args.num_prompts]
    prompts, prompt_source = make_prompts(args, src, max(counts))
    k = spec.get("num_speculative_tokens", 0) if spec else 0
    args.max_num_seqs = args.max_num_seqs or min(max(counts), 256)
    # a multiple of 128 tokens (and of the page): the Pallas kernel walks a block table 128 tokens at a time
    need = max(map(len, prompts)) + args.max_tokens + 2 * k + 1
    unit = max(128, args.page_size)
    args.max_model_len = args.max_model_len or -(-need // unit) * unit
    modes = [(mode_label(spec, args.synthetic_acceptance), spec)]
    if args.sweep and spec and not args.sweep_no_plain:
        modes.append((mode_label(None, None), None))
    date = datetime.datetime.now(datetime.timezone.utc)
    knobs = [f"{v} {what}" for v, what in ((args.layer_loop, "layers"), (args.attn_impl, "attention")) if v != "auto"]
    knobs += [f"tp {args.tensor_parallel_size}"] if args.tensor_parallel_size > 1 else []
    knobs += [f"page {args.page_size}"] if args.page_size != 16 else []
    knobs += [f"{name}={val}" for name, val in env_knobs().items()]  # engine and compiler knobs
    knobs += [f"{name.replace('_', ' ')} {val}" for name, val in processor_options(args).items()]
    label = args.label or " | ".join([src.label + (" (dummy weights)" if args.load_format == "dummy" else ""),
                                      " + ".join(m for m, _ in modes), prompt_source,
                                      f"out {args.max_tokens}", *knobs])
    result = {"schema": 1, "label": label, "date": date.isoformat(timespec="seconds"),
              "command": shlex.join([Path(sys.argv[0]).name] + sys.argv[1:]), "args": vars(args).copy(),
              "machine": {}, "synthetic_acceptance": args.synthetic_acceptance,
              "prompts": {"source": prompt_source, "count": len(prompts),
                          "mean_input_len": sum(map(len, prompts)) / len(prompts)},
              "models": {}, "points": [], "identical": {}, "hf_agreement": {}, "profile": [], "errors": [],
              "timings": {}}
    # knobs in the name too: two runs of one model started in the same second must not overwrite each other
    stem = "-".join([f"{date:%Y%m%d-%H%M%S}", _slug(src.label), *([_slug(spec["method"])] if spec else []),
                     *map(_slug, knobs)])
    json_paths = ([Path(args.results_dir) / f"{stem}.json"] if args.sweep else []) + (
        [Path(args.output_json)] if args.output_json else [])
    bench = Bench(args, result, json_paths)
    bench.log(f"{label}: {len(counts)} prompt count(s) x {len(modes)} mode(s); max_num_seqs {args.max_num_seqs}, "
              f"max_model_len {args.max_model_len}")
    bench.save()
    if args.hf_baseline:
        result["hf"] = bench.guard("hf_baseline", hf_peer, args, src, prompts, counts, bench)
        bench.save()
    sweep(args, bench, src, prompts, counts, modes)
    finish(args, result, json_paths, plot_path=(Path(args.results_dir) / f"{stem}.png") if args.sweep else None)
    return result


def hf_peer(args, src: ModelSource, prompts, counts, bench: Bench) -> dict:
    from jaxspec.bench.hf_baseline import run_hf_baseline
    job = {"hf_dir": str(src.hf_dir) if src.hf_dir and args.load_format != "dummy" else None,
           "hf_config": src.hf_config, "dtype": args.dtype, "prompts": prompts,
           "counts": [n for n in counts if not args.hf_prompts or n in args.hf_prompts],
           "max_tokens": args.max_tokens, "ignore_eos": args.ignore_eos, "batch_size": args.max_num_seqs,
           "agree_tokens": AGREE_TOKENS, "seed": args.seed}
    bench.log(f"HF transformers peer: counts {job['counts']} ({'random' if not job['hf_dir'] else 'same'} weights)")
    hf = run_hf_baseline(job, args.hf_timeout)
    for n, r in hf.get("runs", {}).items():
        bench.log(f"HF generate, {n} prompts: {r['output_tokens_per_s']:.1f} output tokens/s")
    if hf.get("error"):
        bench.log(f"HF peer: {hf['error'][:500]}")
    return hf


def sweep(args, bench: Bench, src: ModelSource, prompts, counts, modes) -> None:
    """Build every mode's LLM first (all compiling happens up front), then prompt counts outer, modes inner: when
    the time budget runs out, the largest counts go missing, not a whole mode."""
    import jax

    from jaxspec.bench import engine
    result = bench.result
    cache = compile_cache.configure(args.compilation_cache_dir)  # before anything compiles
    result["compilation_cache_dir"] = str(cache) if cache else None
    result["machine"] = machine_info()
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if jax.default_backend() == "gpu" else None)
    result["dtype"] = dtype or "the checkpoint's"
    if args.measure_bandwidth:
        result["bandwidth"] = bench.guard("bandwidth", report.measure_bandwidth, args.bandwidth_bytes)
        if result["bandwidth"]:
            bench.log(f"copy bandwidth {result['bandwidth']['tb_s']:.3f} TB/s (read + write)")
    if args.measure_matmul:
        result["matmul"] = bench.guard("matmul", report.measure_matmul)
        if result["matmul"]:
            bench.log(f"matmul rate {result['matmul']['tflop_s']:.1f} TFLOP/s ({result['matmul']['method']})")
    target = bench.guard("load_target", engine.load_target, src.ckpt, src.hf_config, args.load_format == "dummy",
                         dtype)
    llms = {label: bench.guard(f"build {label}", build, args, src, target, spec, bench, prompts, counts)
            if target and not bench.out_of_time() else None for label, spec in modes}
    outputs: dict = {}
    schedulings = [True, False] if args.sweep and not args.sweep_k else [args.async_scheduling]
    for n in counts:
        jobs = [(llm, policy_label + suffix, policy, options) for label, llm in llms.items()
                for policy_label, policy in policies(args, llm, label)
                for suffix, options in sampling_settings(args)]
        runs: dict[tuple[str, bool], list[dict]] = {}
        for rep in range(args.repeats):
            for llm, mode, policy, options in (jobs[i] for i in round_order(len(jobs), rep)):
                if policy is not None:
                    llm.llm_engine.spec_policy = policy
                for is_async in schedulings:
                    point = {"num_prompts": n, "mode": mode, "async": is_async}
                    runs.setdefault((mode, is_async), []).append(
                        point | timed_point(args, bench, llm, prompts[:n], point, outputs, options))
        for points in runs.values():
            result["points"].append(median_point(points))
        bench.save()
    for label, llm in llms.items():
        if llm is not None and args.profile_dir and not bench.out_of_time():
            profile(args, bench, llm, label, prompts, counts)
    llms.clear()
    gc.collect()
    compare_outputs(outputs, result)


def policies(args, llm, label: str) -> list[tuple[str, object]]:
    """The speculation policies a mode runs with: its own; with --sweep-k and a head, the dynamic one (kept
    across prompt counts, as a server's would be) and a fixed k for each k = 0..K."""
    from jaxspec.engine.spec_policy import DynamicPolicy, SpecPolicy

    engine = llm.llm_engine if llm is not None else None
    if not args.sweep_k or engine is None or not engine.k:
        return [(label, None)]
    if not hasattr(engine, "_sweep_dynamic"):
        engine._sweep_dynamic = engine.spec_policy
    dynamic = engine._sweep_dynamic
    assert isinstance(dynamic, DynamicPolicy), "--sweep-k builds the head's LLM with the dynamic policy"
    return [(f"{label} dynamic", dynamic)] + [(f"{label} k={k}", SpecPolicy(engine.k, k)) for k in range(engine.k + 1)]


def round_order(n: int, r: int) -> list[int]:
    """The order of n modes in round r, a Williams design: over n rounds (2n when n is odd) each mode runs first
    equally often, and right after each other mode equally often. Rotating one order kept each mode behind the
    same one in every round: a mode that always follows another LLM's run (the dynamic policy behind no
    speculation, in --sweep-k) carried whatever that switch costs into all of its rounds."""
    first = [0] + [(j + 1) // 2 if j % 2 else n - j // 2 for j in range(1, n)]  # 0, 1, n-1, 2, n-2, ...
    if n % 2 and (r // n) % 2:
        first = first[::-1]
    return [(i + r) % n for i in first]


def median_point(points: list[dict]) -> dict:
    """One (prompt count, mode, scheduling) of --repeats runs: the run of median output tok/s (the lower of the
    two middle ones), with every run's figure; the first failed run if any failed."""
    failed = [p for p in points if not report.ok(p)]
    if failed or len(points) == 1:
        return (failed or points)[0]
    ranked = sorted(points, key=lambda p: p["output_tokens_per_s"])
    return ranked[(len(ranked) - 1) // 2] | {"repeats_output_tokens_per_s": [p["output_tokens_per_s"] for p in points]}


def timed_point(args, bench: Bench, llm, prompts, point: dict, outputs: dict, options: dict | None = None) -> dict:
    if llm is None:
        return {"error": "the LLM did not build (see errors)"}
    if bench.out_of_time():
        return {"skipped": "time budget spent"}
    n, label, is_async = point["num_prompts"], point["mode"], point["async"]
    got = bench.guard(f"run {n} {label} {'async' if is_async else 'sync'}", run_point, llm, prompts,
                      sampling_params(args, n, options=options), is_async)
    if got is None:
        return {"error": bench.result["errors"][-1]["error"][:300]}
    outputs[(n, label, is_async)] = got[1]
    print_point(point | got[0], llm.llm_engine.k)
    return got[0]


def build(args, src: ModelSource, target, spec: dict | None, bench: Bench, prompts, counts):
    """One LLM: built, its buckets compiled for this run's sampling mode, warmed up by an untimed generate."""
    from jaxspec.bench import engine
    from jaxspec.engine import sampler
    from jaxspec.llm import LLM

    cfg, weights = target
    label = mode_label(spec, args.synthetic_acceptance)
    kwargs = dict(tokenizer=src.tokenizer_dir, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=args.max_num_batched_tokens, async_scheduling=args.async_scheduling,
                  seed=args.seed, speculative_config=spec, load_format=args.load_format,
                  page_size=args.page_size, num_pages=args.max_num_seqs * -(-args.max_model_len // args.page_size) + 1,
                  warmup=args.engine_warmup, compilation_cache_dir=args.compilation_cache_dir,
                  attn_impl=args.attn_impl, layer_loop=args.layer_loop, num_scheduler_steps=args.num_scheduler_steps,
                  page_lookahead=args.page_lookahead, page_reserve_whole=args.page_reserve_whole,
                  enable_prefix_caching=args.enable_prefix_caching, tensor_parallel_size=args.tensor_parallel_size,
                  draft_tensor_parallel_size=args.draft_tensor_parallel_size,
                  decode_buckets=engine.bucket_list(args.decode_buckets, args.max_num_seqs),
                  prefill_buckets=engine.bucket_list(args.prefill_buckets, args.max_num_batched_tokens))
    if spec is not None and args.synthetic_acceptance is not None:
        kwargs["synthetic_acceptance"] = args.synthetic_acceptance
    t0 = time.perf_counter()
    llm = LLM.from_weights(cfg, weights, **kwargs)
    bench.result["models"][label] = engine.model_bytes(llm)
    c = llm.engine_config
    bench.log(f"built {label} in {time.perf_counter() - t0:.1f} s ({llm.model_config.attn_impl} attention, "
              f"{llm.model_config.layer_loop} layers); decode buckets {c.decode_buckets}, prefill buckets "
              f"{c.prefill_buckets}")
    if not args.engine_warmup and not args.no_warmup_compile:
        t0 = time.perf_counter()
        flags = sampler.batch_flags([args.temperature], [args.top_k], [args.top_p], cfg.vocab_size)
        n = sum(bench.guard(f"compile {label}{suffix}", engine.compile_buckets, llm, *flags, bool(options),
                            bool(set(options) - {"logprobs"}), log=bench.log) or 0
                for suffix, options in sampling_settings(args))
        bench.log(f"compiled {n} programs in {time.perf_counter() - t0:.1f} s")
    bench.save()
    t0 = time.perf_counter()
    # a program's first launch loads it onto the device (milliseconds): every decode bucket the timed runs can use
    # gets its first launch here, one short generate per bucket (a batch shrinking as requests finish uses them all)
    sizes = [b for b in c.decode_buckets if b < max(counts)] + [max(counts)]
    for n in sizes:
        for _, options in sampling_settings(args):
            llm.generate(prompts[:n], sampling_params(args, n, min(args.max_tokens, 16), options), use_tqdm=False)
    bench.log(f"warm-up generates ({sizes} prompts, {min(args.max_tokens, 16)} tokens) "
              f"{time.perf_counter() - t0:.1f} s")
    return llm


def profile(args, bench: Bench, llm, label: str, prompts, counts) -> None:
    from jaxspec.bench.profile import profile_generate
    n = args.profile_prompts or max(counts)
    for is_async in (True, False):
        log_dir = Path(args.profile_dir) / f"{_slug(label)}-{'async' if is_async else 'sync'}"
        p = bench.guard(f"profile {label} {'async' if is_async else 'sync'}", profile_generate, llm, prompts[:n],
                        sampling_params(args, n, args.profile_max_tokens), is_async, log_dir, args.profile_repeats)
        p = p or {"async": is_async, "error": bench.result["errors"][-1]["error"][:300]}
        bench.result["profile"].append({"mode": label, "num_prompts": n} | p)
        if p.get("busy_fraction") is not None:
            bench.log(f"profile {label} {'async' if is_async else 'sync'}: device busy {p['busy_fraction']:.1%} "
                      f"of {p['span_ms']:.0f} ms ({p['method']}); idle by gap length: {report.gaps(p['idle_gaps'])}; "
                      f"{p['wall_per_step_ms']:.2f} ms/step wall, {p['host_busy_per_step_ms']:.2f} ms/step host work")
        bench.save()


def finish(args, result: dict, json_paths: list[Path], plot_path: Path | None = None,
           render_only: bool = False) -> None:
    """Roofline, tables, files. Each piece is guarded: a plot that fails does not lose the JSON."""
    bench = Bench(args, result, json_paths)
    if not render_only:
        result["roofline"] = bench.guard("roofline", report.roofline, result) or []
    print("\n" + report.sweep_table(result))
    result["dynamic_vs_best"] = report.dynamic_vs_best(result)
    if result["dynamic_vs_best"]:
        print("\nDynamic k against the best fixed mode:\n" + report.dynamic_table(result["dynamic_vs_best"]))
    if result.get("roofline"):
        print(f"\nRoofline: {report.roofline_rates(result)}\n" + report.roofline_table(result))
    elif report.roofline_bandwidth(result)[0] is None:
        print("\n" + report.roofline_bandwidth(result)[1])  # one line: why there is none
    if result.get("profile"):
        print("\n" + report.profile_table(result))
    for key, ident in result.get("identical", {}).items():
        where = "" if ident["all"] or ident.get("earliest_differing_token") is None else (
            f"; differing requests part at token {ident['earliest_differing_token']} at the earliest, "
            f"{ident['median_differing_token']} at the median")
        print(f"async vs sync outputs, {key}: {'identical' if ident['all'] else 'DIFFER'} "
              f"({ident['fraction']:.0%} of requests identical{where})")
    for e in result.get("errors", []):
        print(f"ERROR in {e['stage']}: {e['error'][:300]}")
    if result.get("synthetic_acceptance") is not None:
        print(f"NOTE: synthetic acceptance p={result['synthetic_acceptance']}: EAGLE outputs are meaningless")
    if plot_path is not None:
        result["plot"] = bench.guard("plot", report.plot, result, plot_path)
    bench.save()
    if args.update_results_md:
        bench.guard("results_md", report.update_results_md, args.update_results_md, result)
    for path in json_paths:
        print(f"wrote {path}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="bench/throughput.py", description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ValueError, FileNotFoundError) as exc:  # a bad model, head or dataset: nothing could run
        parser.error(str(exc))
