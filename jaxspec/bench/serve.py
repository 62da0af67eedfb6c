"""`jaxspec bench serve`: an online serving benchmark against any OpenAI-compatible server, as `vllm bench serve`.

Requests arrive as a Poisson process at --request-rate (gamma intervals with --burstiness; `inf` sends them all
at once), at most --max-concurrency in flight, each streamed over raw HTTP (httpx, so the measurement is of the
stream itself, with `stream_options.include_usage` for exact token counts). vLLM's definitions:
    TTFT  request sent -> first chunk with text
    ITL   time between successive chunks with text (a speculative step may bring several tokens in one chunk)
    TPOT  (E2E - TTFT) / (output tokens - 1), per request: the first token excluded
    E2E   request sent -> last chunk
Every request's generated text is kept in the JSON, so two runs (async vs sync scheduling, say) can be compared
for identical outputs: `--compare-with OTHER.json`. With speculative decoding on the server, the spec-decode
counters of its /metrics (vLLM's names) give the run's mean acceptance length.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from jaxspec.bench import data, report

PERCENTILES = (90, 99)  # with mean and median: what vLLM reports
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total")
# a jaxspec server's engine timing (the run's deltas, per engine step): where TPOT goes
ENGINE_COUNTERS = {"engine_steps": "jaxspec:engine_steps_total",
                   "engine_step_ms": "jaxspec:engine_step_seconds_total",
                   "engine_host_wait_ms": "jaxspec:engine_host_wait_seconds_total",
                   "engine_emit_ms": "jaxspec:engine_emit_seconds_total"}


@dataclass
class RequestInput:
    body: dict  # the JSON body, less model / stream / sampling fields


@dataclass
class RequestResult:
    success: bool = False
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    generated_text: str = ""
    start_time: float = 0.0  # seconds since the benchmark started
    error: str = ""


def add_arguments(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("server")
    s.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server's root (without /v1)")
    s.add_argument("--endpoint", default="/v1/completions", choices=["/v1/completions", "/v1/chat/completions"])
    s.add_argument("--model", help="model name to request (default: the first of GET /v1/models)")
    s.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY when set)")
    d = p.add_argument_group("dataset")
    d.add_argument("--dataset-name", default="random", choices=["random", "jsonl"])
    d.add_argument("--dataset-path", help="jsonl: one conversation per line (messages, turns, prompt or question: "
                                          "GSM8K's question)")
    d.add_argument("--jsonl-output-len", type=int, default=256, help="jsonl: max_tokens of each request")
    d.add_argument("--random-input-len", type=int, default=1024)
    d.add_argument("--random-output-len", type=int, default=128, help="random: max_tokens of each request")
    d.add_argument("--tokenizer", help="random: tokenizer directory (its vocabulary; to send text to chat)")
    d.add_argument("--num-prompts", type=int, default=1000)
    d.add_argument("--seed", type=int, default=0)
    t = p.add_argument_group("traffic")
    t.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (inf: all at once)")
    t.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrivals (1: Poisson)")
    t.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight at once")
    t.add_argument("--temperature", type=float, default=0.0, help="0: greedy (comparable outputs)")
    t.add_argument("--ignore-eos", action="store_true", help="generate max_tokens whatever the model says")
    t.add_argument("--disable-tqdm", action="store_true")
    o = p.add_argument_group("output")
    o.add_argument("--save-result", action="store_true", help="write the result JSON")
    o.add_argument("--result-dir", default=".", help="where --save-result writes")
    o.add_argument("--result-filename", help="default: <endpoint>-<rate>qps-concurrency<N>-<model>-<date>.json")
    o.add_argument("--label", help="a name for this run, kept in the JSON (e.g. 'eagle async')")
    o.add_argument("--compare-with", help="an earlier result JSON: are the generated texts identical?")


# ---- requests

def _tokenizer(path: str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path)


def load_requests(args: argparse.Namespace) -> list[RequestInput]:
    chat = args.endpoint == "/v1/chat/completions"
    if args.dataset_name == "jsonl":
        if not args.dataset_path:
            raise ValueError("--dataset-name jsonl needs --dataset-path")
        convs = data.read_conversations(args.dataset_path, args.num_prompts)
        # chat gets the conversation (the server applies its template); completions the last message's text
        return [RequestInput(({"messages": c} if chat else {"prompt": c[-1]["content"]})
                             | {"max_tokens": args.jsonl_output_len}) for c in convs]
    if not args.tokenizer:
        raise ValueError("--dataset-name random needs --tokenizer (the vocabulary to draw from)")
    tok = _tokenizer(args.tokenizer)
    ids = data.random_prompts(args.num_prompts, args.random_input_len, len(tok), args.seed)
    # token ids go to /v1/completions as they are (exact lengths); chat takes text
    prompts = [{"messages": [{"role": "user", "content": tok.decode(p)}]} if chat else {"prompt": p} for p in ids]
    return [RequestInput(p | {"max_tokens": args.random_output_len}) for p in prompts]


async def send(client, url: str, headers: dict, body: dict, t0: float) -> RequestResult:
    """One streamed request, timed chunk by chunk."""
    r = RequestResult()
    start = time.perf_counter()
    r.start_time = start - t0
    last = start
    text = []
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                r.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:500]}"
                return r
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    r.error = json.dumps(chunk["error"])[:500]
                    return r
                if chunk.get("usage"):
                    r.success = True
                    r.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    r.output_tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices") or []:
                    piece = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
                    if piece:
                        now = time.perf_counter()
                        if not text:
                            r.ttft = now - start
                        else:
                            r.itl.append(now - last)
                        last = now
                        text.append(piece)
        r.latency = last - start
        r.generated_text = "".join(text)
        if not r.success:
            r.error = "the stream ended without usage (stream_options.include_usage)"
    except Exception as e:  # noqa: BLE001 - a failed request is a result, not the end of the run
        r.error = f"{type(e).__name__}: {e}"
    return r


async def _arrivals(n: int, rate: float, burstiness: float, seed: int):
    """Indices 0..n-1 at Poisson (gamma) intervals; all at once for rate inf."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        yield i
        if rate != float("inf") and i < n - 1:
            await asyncio.sleep(rng.gamma(burstiness, 1.0 / (rate * burstiness)))


async def benchmark(args: argparse.Namespace, requests: list[RequestInput],
                    model: str) -> tuple[list[RequestResult], float, dict]:
    """(results, duration, what the server's counters say of the run: mean acceptance length, engine timing)."""
    import httpx
    from tqdm.auto import tqdm

    url = args.base_url.rstrip("/") + args.endpoint
    headers = _headers(args)
    sampling = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                "temperature": args.temperature} | ({"ignore_eos": True} if args.ignore_eos else {})
    # idle connections are dropped before a server's keep-alive timeout (uvicorn's is 5 s) can close one just as
    # a request reuses it
    limits = httpx.Limits(max_connections=args.max_concurrency, max_keepalive_connections=args.max_concurrency,
                          keepalive_expiry=2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30.0), limits=limits) as client:
        first = await send(client, url, headers, requests[0].body | sampling, time.perf_counter())
        if not first.success:
            raise RuntimeError(f"the first request failed: {first.error}")
        before = await _counters(client, args.base_url, headers)
        bar = tqdm(total=len(requests), disable=args.disable_tqdm, desc="requests", dynamic_ncols=True)
        gate = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
        t0 = time.perf_counter()

        async def one(i: int) -> RequestResult:
            if gate is None:
                r = await send(client, url, headers, requests[i].body | sampling, t0)
            else:
                async with gate:
                    r = await send(client, url, headers, requests[i].body | sampling, t0)
            bar.update(1)
            return r

        tasks = [asyncio.ensure_future(one(i))
                 async for i in _arrivals(len(requests), args.request_rate, args.burstiness, args.seed)]
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
        bar.close()
        after = await _counters(client, args.base_url, headers)
    return list(results), duration, {"mean_acceptance_length": acceptance_length(before, after),
                                     **engine_timing(before, after)}


def _headers(args: argparse.Namespace) -> dict:
    key = args.api_key or os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


# ---- results

def _stats(name: str, values_s: list[float]) -> dict:
    """mean / median / std / pNN of a latency, in ms (vLLM's key names)."""
    a = np.asarray(values_s, dtype=float) * 1000 if values_s else np.zeros(1)
    out = {f"mean_{name}_ms": float(a.mean()), f"median_{name}_ms": float(np.median(a)),
           f"std_{name}_ms": float(a.std())}
    out |= {f"p{p}_{name}_ms": float(np.percentile(a, p)) for p in PERCENTILES}
    return out


def summarize(results: list[RequestResult], duration: float) -> dict:
    ok = [r for r in results if r.success]
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    n_in, n_out = sum(r.prompt_tokens for r in ok), sum(r.output_tokens for r in ok)
    return {"duration": duration, "completed": len(ok), "failed": len(results) - len(ok),
            "total_input_tokens": n_in, "total_output_tokens": n_out,
            "request_throughput": len(ok) / duration, "output_throughput": n_out / duration,
            "total_token_throughput": (n_in + n_out) / duration,
            **_stats("ttft", [r.ttft for r in ok]), **_stats("tpot", tpots),
            **_stats("itl", [x for r in ok for x in r.itl]), **_stats("e2el", [r.latency for r in ok])}


def print_summary(m: dict) -> None:
    rows = [["Successful requests", m["completed"]], ["Failed requests", m["failed"]],
            ["Benchmark duration (s)", round(m["duration"], 2)],
            ["Total input tokens", m["total_input_tokens"]], ["Total generated tokens", m["total_output_tokens"]],
            ["Request throughput (req/s)", round(m["request_throughput"], 2)],
            ["Output token throughput (tok/s)", round(m["output_throughput"], 1)],
            ["Total token throughput (tok/s)", round(m["total_token_throughput"], 1)]]
    if m.get("mean_acceptance_length") is not None:
        rows.append(["Mean acceptance length", round(m["mean_acceptance_length"], 3)])
    if m.get("engine_steps"):
        rows += [["Engine steps", int(m["engine_steps"])], ["Engine ms/step in step()", round(m["engine_step_ms"], 3)],
                 ["Engine ms/step waiting for the device", round(m["engine_host_wait_ms"], 3)],
                 ["Engine ms/step handing outputs on", round(m["engine_emit_ms"], 3)]]
    for name, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E")):
        for stat in ("mean", "median", *(f"p{p}" for p in PERCENTILES)):
            rows.append([f"{stat.capitalize()} {label} (ms)", round(m[f"{stat}_{name}_ms"], 2)])
    print(report.markdown_table(["metric", "value"], rows))


def sweep_table(results: list[dict]) -> str:
    """One row per run (e.g. per mode and rate of bench/serve_sweep.sh): latency percentiles, identity, and the
    engine's steps and ms per step (in step() / of it waiting for the device / handing outputs on) when the
    server reports them."""
    rows = []
    for r in results:
        same = r.get("compare")
        engine = (f'{int(r["engine_steps"])}: {r["engine_step_ms"]:.2f} / {r["engine_host_wait_ms"]:.2f} / '
                  f'{r["engine_emit_ms"]:.2f}' if r.get("engine_steps") else "-")
        rows.append([r.get("label") or r["model_id"], r["request_rate"], f'{r["completed"]}/{r["num_prompts"]}',
                     r["output_throughput"], r["median_ttft_ms"], r["p99_ttft_ms"], r["median_tpot_ms"],
                     r["p99_tpot_ms"], r["median_itl_ms"], r["mean_acceptance_length"],
                     f'{same["identical"]}/{same["compared"]}' if same else "-", engine])
    return report.markdown_table(["mode", "rate", "ok", "out tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms",
                                  "TPOT p99 ms", "ITL p50 ms", "accept len", "identical",
                                  "engine steps: ms/step in step / device wait / emit"], rows)


async def _counters(client, base_url: str, headers: dict) -> dict[str, float]:
    """The server's counters this benchmark reads (spec decoding, vLLM's names; a jaxspec engine's timing), those
    it has; none without /metrics. `headers` carry the API key, which a jaxspec server asks for there too."""
    try:
        text = (await client.get(base_url.rstrip("/") + "/metrics", headers=headers)).text
    except Exception:  # noqa: BLE001 - metrics are optional
        return {}
    values = {}
    for name in (*SPEC_COUNTERS, *ENGINE_COUNTERS.values()):
        found = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
        if found:
            values[name] = sum(float(v) for v in found)
    return values


def acceptance_length(before: dict, after: dict) -> float | None:
    if not all(name in before and name in after for name in SPEC_COUNTERS):
        return None
    drafts = after[SPEC_COUNTERS[0]] - before[SPEC_COUNTERS[0]]
    accepted = after[SPEC_COUNTERS[1]] - before[SPEC_COUNTERS[1]]
    return 1 + accepted / drafts if drafts else None


def engine_timing(before: dict, after: dict) -> dict[str, float]:
    """The run's engine steps, and per step: ms inside step(), of which waiting for the device, and ms handing
    outputs to the server (empty for a server without these counters)."""
    if not all(name in before and name in after for name in ENGINE_COUNTERS.values()):
        return {}
    delta = {key: after[name] - before[name] for key, name in ENGINE_COUNTERS.items()}
    steps = delta.pop("engine_steps")
    return {"engine_steps": steps} | {key: 1e3 * v / steps if steps else 0.0 for key, v in delta.items()}


def compare_texts(ours: list[str], theirs: list[str]) -> dict:
    """Request by request: identical generated texts? (the runs must use the same dataset, seed and prompts)."""
    mismatches = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    return {"compared": min(len(ours), len(theirs)), "identical": min(len(ours), len(theirs)) - len(mismatches),
            "mismatches": mismatches, "same_count": len(ours) == len(theirs)}


async def _model_name(client, args: argparse.Namespace) -> str:
    resp = await client.get(args.base_url.rstrip("/") + "/v1/models", headers=_headers(args))
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


async def run_async(args: argparse.Namespace) -> dict:
    import httpx

    requests = load_requests(args)
    async with httpx.AsyncClient(timeout=30.0) as client:
        model = args.model or await _model_name(client, args)
    results, duration, server = await benchmark(args, requests, model)
    metrics = summarize(results, duration) | server
    result = {"date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
              "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]), "label": args.label,
              "base_url": args.base_url, "endpoint": args.endpoint, "model_id": model,
              "dataset_name": args.dataset_name, "dataset_path": args.dataset_path, "num_prompts": args.num_prompts,
              "seed": args.seed, "request_rate": args.request_rate, "burstiness": args.burstiness,
              "max_concurrency": args.max_concurrency, "temperature": args.temperature, **metrics,
              "input_lens": [r.prompt_tokens for r in results], "output_lens": [r.output_tokens for r in results],
              "ttfts": [r.ttft for r in results], "itls": [r.itl for r in results],
              "e2els": [r.latency for r in results], "start_times": [r.start_time for r in results],
              "generated_texts": [r.generated_text for r in results], "errors": [r.error for r in results]}
    return result


def run(args: argparse.Namespace) -> dict:
    result = asyncio.run(run_async(args))
    print_summary(result)
    if args.compare_with:
        other = json.loads(Path(args.compare_with).read_text())
        result["compare"] = {"with": args.compare_with,
                             **compare_texts(result["generated_texts"], other["generated_texts"])}
        c = result["compare"]
        print(f"outputs vs {args.compare_with}: {c['identical']}/{c['compared']} identical"
              + (f" (first mismatch: request {c['mismatches'][0]})" if c["mismatches"] else ""))
    if args.save_result:
        name = args.result_filename or (f"{args.endpoint.strip('/').replace('/', '-')}-{args.request_rate}qps-"
                                        f"concurrency{args.max_concurrency}-{Path(result['model_id']).name}-"
                                        f"{result['date']}.json")
        path = Path(args.result_dir) / name
        report.save_json(result, path)
        print(f"wrote {path}")
    return result
