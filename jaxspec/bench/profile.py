"""How busy the device is: a `jax.profiler.trace` of one generate call, reduced to one number.

Method. jax writes `plugins/profile/<run>/<host>.trace.json.gz` (Chrome trace format) next to the `.xplane.pb`.
The generate call is wrapped in a TraceAnnotation, whose host event gives the wall span. Device activity is every
complete event ("ph": "X") on a device process (process_name "/device:GPU:N"), restricted to its "Stream #..."
threads when there are any (derived lines such as "XLA Modules" span the gaps between kernels and would count
idle time as busy). busy = length of the union of those intervals clipped to the span (streams overlap, so a sum
would over-count); busy_fraction = busy / span. compute_busy leaves out memcpy/memset events. On CPU there is no
device process: XLA's executor threads (`tf_XLA*`) stand in for it, which tests the code path, not the hardware.
The profiler slows the host down (less so with the options below), so host time per step is taken from the timed,
unprofiled runs; the profiled run's own per-step numbers are reported as well, marked as profiled.
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

ANNOTATION = "jaxspec_bench_generate"
_DERIVED_LINES = ("XLA Modules", "Steps", "TraceMe", "Framework", "Source", "Launch Stats", "Sparse")
_COPY_WORDS = ("memcpy", "memset")


def find_trace(log_dir: str | Path) -> Path:
    found = sorted(Path(log_dir).glob("plugins/profile/*/*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"{log_dir}: no plugins/profile/*/*.trace.json.gz written by jax.profiler")
    return found[-1]


def load_trace(path: str | Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def _names(events: list[dict]) -> tuple[dict, dict]:
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    return procs, threads


def _device_events(events: list[dict], procs: dict, threads: dict) -> tuple[str, list[dict]]:
    complete = [e for e in events if e.get("ph") == "X" and e.get("dur", 0) > 0]
    dev_pids = {pid for pid, name in procs.items() if "/device:" in name}
    if dev_pids:
        on_dev = [e for e in complete if e["pid"] in dev_pids]
        streams = [e for e in on_dev if threads.get((e["pid"], e.get("tid")), "").startswith("Stream")]
        if streams:
            return "device streams", streams
        return "device lines", [e for e in on_dev
                                if not threads.get((e["pid"], e.get("tid")), "").startswith(_DERIVED_LINES)]
    cpu = [e for e in complete if threads.get((e["pid"], e.get("tid")), "").startswith("tf_XLA")
           and not e["name"].startswith("ThreadpoolListener")]
    return "cpu-proxy (XLA executor threads)", cpu


def device_busy(trace: dict, annotation: str = ANNOTATION) -> dict:
    """Busy fraction of the device over the annotated span (see the module docstring for the method)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    procs, threads = _names(events)
    method, dev = _device_events(events, procs, threads)
    spans = [e for e in events if e.get("ph") == "X" and e.get("name") == annotation]
    if spans:
        lo, hi = min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans)
    elif dev:
        lo, hi = min(e["ts"] for e in dev), max(e["ts"] + e["dur"] for e in dev)
        method += ", span = first to last device event (annotation missing)"
    else:
        return {"method": method, "error": "no device events and no annotation in the trace"}
    clip = lambda es: [(max(e["ts"], lo), min(e["ts"] + e["dur"], hi)) for e in es  # noqa: E731
                       if e["ts"] < hi and e["ts"] + e["dur"] > lo]
    compute = [e for e in dev if not any(w in e["name"].lower() for w in _COPY_WORDS)
               and "memcpy" not in threads.get((e["pid"], e.get("tid")), "").lower()]
    span = hi - lo  # µs
    busy, compute_busy = union_length(clip(dev)), union_length(clip(compute))
    return {"method": method, "span_ms": span / 1e3, "busy_ms": busy / 1e3, "compute_busy_ms": compute_busy / 1e3,
            "busy_fraction": busy / span if span > 0 else None,
            "compute_busy_fraction": compute_busy / span if span > 0 else None,
            "num_device_events": len(dev), "sum_event_ms": sum(e["dur"] for e in dev) / 1e3}


def _quiet_options():
    """No Python tracer and only level-1 host TraceMes (our annotation, jit dispatch): the default options trace
    every Python call, which triples the host time per step and would hide what async scheduling overlaps."""
    import jax
    try:
        opts = jax.profiler.ProfileOptions()
        opts.python_tracer_level, opts.host_tracer_level = 0, 1
        return opts
    except (AttributeError, TypeError):
        return None


def profile_generate(llm, prompts, params, async_scheduling: bool, log_dir: str | Path) -> dict:
    """One generate call under the profiler: device busy fraction, plus host time per step from the engine."""
    import jax

    from jaxspec.bench.engine import metrics_delta, set_async

    set_async(llm, async_scheduling)
    before = llm.get_metrics()
    with jax.profiler.trace(str(log_dir), profiler_options=_quiet_options()):
        with jax.profiler.TraceAnnotation(ANNOTATION):
            t0 = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            wall = time.perf_counter() - t0
    m = metrics_delta(before, llm.get_metrics())
    path = find_trace(log_dir)
    out = {"async": async_scheduling, "trace": str(path), "wall_s": wall, "num_steps": m["num_steps"],
           "wall_per_step_ms": 1e3 * m["wall_s"] / max(m["num_steps"], 1),
           "host_wait_per_step_ms": 1e3 * m["host_wait_s"] / max(m["num_steps"], 1),
           "host_busy_per_step_ms": 1e3 * (m["wall_s"] - m["host_wait_s"]) / max(m["num_steps"], 1)}
    return out | device_busy(load_trace(path))
