"""How busy the device is: a `jax.profiler.trace` of one generate call, reduced to one number.

Method. jax writes `plugins/profile/<run>/<host>.trace.json.gz` (Chrome trace format) next to the `.xplane.pb`.
The generate call is wrapped in a TraceAnnotation, whose host event gives the wall span. Device activity is every
complete event ("ph": "X") on a device process (process_name "/device:GPU:N"), restricted to its "Stream #..."
threads when there are any (derived lines such as "XLA Modules" span the gaps between kernels and would count
idle time as busy). busy = length of the union of those intervals clipped to the span (streams overlap, so a sum
would over-count); busy_fraction = busy / span. compute_busy leaves out memcpy/memset events. On CPU there is no
device process: XLA's executor threads (`tf_XLA*`) stand in for it, which tests the code path, not the hardware.
The profiler slows the host down (less so with the options below), so host time per step is taken from the timed,
unprofiled runs; the profiled run's own per-step numbers are reported as well, marked as profiled. It also changes
what the host does: traced, XLA updated a step program's CUDA graphs after each plan write (on an H100, ~1.0 ms for
SmolLM2's 470-node EAGLE step, ~5.6 ms for its 4-step program), which the same engine at batch 1 untraced never did
(XLA's log: no update in 243 launches; bench/results/20261207-verify-gemms/).

The tracer costs the host per kernel launch, and once a step is shorter than the host's traced work, the traced
run is host-bound and reports the profiler's busy fraction, not the engine's. So the same generate is also run
untraced while NVML samples the GPU (`nvmlDeviceGetSamples(GPU_UTILIZATION_SAMPLES)`: per sample period, the
percent of time one or more kernels ran, the number `nvidia-smi` shows): the busy fraction of the real run, at
the sampling period's resolution (200 ms on the H200). Samples whose period starts before the call are left out,
so the generate is repeated back to back (`repeats`) until the samples cover its start, steady state and tail
many times over; the host's gaps between the calls count as idle.

Where the idle time lies: the gaps between the busy intervals, binned by length (GAP_EDGES_US). Gaps of a few
microseconds sit between the kernels of one launched program (a CUDA graph's node-to-node latency: fewer, longer
kernels close them); gaps of tens to hundreds are the device waiting for the next program (the host, or a copy).
"""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ANNOTATION = "jaxspec_bench_generate"
_DERIVED_LINES = ("XLA Modules", "Steps", "TraceMe", "Framework", "Source", "Launch Stats", "Sparse")
_COPY_WORDS = ("memcpy", "memset")
GAP_EDGES_US = (2.0, 10.0, 100.0)  # idle gaps binned as < 2, 2-10, 10-100 and >= 100 us


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
    return sum(e - s for s, e in merged(intervals))


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of [start, end) intervals as disjoint intervals in order."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def idle_gaps(intervals: list[tuple[float, float]], lo: float, hi: float,
              edges: tuple[float, ...] = GAP_EDGES_US) -> list[dict]:
    """The idle time of [lo, hi) outside the intervals (µs), binned by the length of each gap: per bin (`edges`
    split lengths into len(edges) + 1 bins) its label, the gaps' count, their total in ms and its fraction of
    the span."""
    busy = merged([(max(s, lo), min(e, hi)) for s, e in intervals if s < hi and e > lo])
    ends, starts = [lo] + [e for _, e in busy], [s for s, _ in busy] + [hi]
    gaps = np.array([s - e for e, s in zip(ends, starts) if s > e], float)
    bins = np.digitize(gaps, edges)
    labels = [f"< {edges[0]:g} us"] + [f"{a:g}-{b:g} us" for a, b in zip(edges, edges[1:])] + [f">= {edges[-1]:g} us"]
    span = hi - lo
    return [{"gap": label, "count": int(np.sum(bins == i)), "ms": float(gaps[bins == i].sum()) / 1e3,
             "fraction": float(gaps[bins == i].sum()) / span if span > 0 else 0.0} for i, label in enumerate(labels)]


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
            "idle_gaps": idle_gaps(clip(dev), lo, hi),
            "num_device_events": len(dev), "sum_event_ms": sum(e["dur"] for e in dev) / 1e3}


def kernel_totals(trace: dict) -> list[dict]:
    """Device time per kernel name over the whole trace (most first): where a step's time goes."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    _, dev = _device_events(events, *_names(events))
    totals: dict[str, list] = {}
    for e in dev:
        t = totals.setdefault(e["name"], [0, 0.0])
        t[0] += 1
        t[1] += e["dur"]
    return [{"name": n, "count": c, "ms": us / 1e3} for n, (c, us) in sorted(totals.items(), key=lambda x: -x[1][1])]


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


def _nvml_index(local_id: int) -> int:
    """NVML numbers all GPUs; CUDA (and jax) only the visible ones."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    return int(visible[local_id]) if local_id < len(visible) and visible[local_id].strip().isdigit() else local_id


def sampled_utilization(fn: Callable[[], Any], local_id: int = 0) -> tuple[Any, dict]:
    """fn()'s result, and the GPU utilization samples NVML took during it (module docstring): their mean is the
    fraction of the call's time a kernel ran."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(local_id))
    except Exception as e:  # no NVML library or bindings (CPU runs, or the package missing)
        return fn(), {"nvml_error": f"NVML unavailable: {type(e).__name__}: {e}"[:300]}
    try:
        t0 = time.time()
        result = fn()
        t1 = time.time()
        try:
            _, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, int(t0 * 1e6))
        except pynvml.NVMLError as e:
            return result, {"nvml_error": f"nvmlDeviceGetSamples: {e}"}
    finally:
        pynvml.nvmlShutdown()  # nvmlInit counts references
    stamps = [s.timeStamp for s in samples]
    period = float(np.median(np.diff(stamps))) if len(stamps) > 1 else 0.0  # µs
    inside = [s.sampleValue.uiVal for s in samples if t0 * 1e6 + period <= s.timeStamp <= t1 * 1e6]
    out = {"nvml_samples": len(inside), "nvml_period_ms": period / 1e3, "nvml_span_s": t1 - t0,
           "nvml_returned": len(stamps), "nvml_first_last_us": [stamps[0], stamps[-1]] if stamps else None,
           "nvml_call_us": [int(t0 * 1e6), int(t1 * 1e6)]}
    if inside:
        out |= {"nvml_busy_fraction": sum(inside) / len(inside) / 100, "nvml_min": min(inside) / 100}
    else:
        out["nvml_error"] = "no utilization samples inside the call"
    return result, out


def profile_generate(llm, prompts, params, async_scheduling: bool, log_dir: str | Path, repeats: int = 5) -> dict:
    """`repeats` generate calls untraced under NVML sampling (busy fraction of the real run), then one under the
    profiler (a timeline: busy fraction, plus host time per step from the engine)."""
    import jax

    from jaxspec.engine.llm_engine import metrics_delta

    def run():
        return llm.generate(prompts, params, use_tqdm=False, async_scheduling=async_scheduling)

    before = llm.stats()
    _, nvml = sampled_utilization(lambda: [run() for _ in range(repeats)],
                                  getattr(jax.devices()[0], "local_hardware_id", 0) or 0)
    m = metrics_delta(before, llm.stats())
    steps = max(m["num_steps"], 1)
    nvml |= {"nvml_repeats": repeats, "nvml_wall_per_step_ms": 1e3 * m["wall_s"] / steps,
             "nvml_host_work_per_step_ms": 1e3 * (m["wall_s"] - m["host_wait_s"]) / steps}
    if nvml.get("nvml_span_s"):  # the engine loop's share of the calls' wall time (the rest: generate's own work)
        nvml["nvml_engine_fraction"] = m["wall_s"] / nvml["nvml_span_s"]
    before = llm.stats()
    with jax.profiler.trace(str(log_dir), profiler_options=_quiet_options()):
        with jax.profiler.TraceAnnotation(ANNOTATION):
            t0 = time.perf_counter()
            run()
            wall = time.perf_counter() - t0
    m = metrics_delta(before, llm.stats())
    path = find_trace(log_dir)
    out = {"async": async_scheduling, "trace": str(path), "wall_s": wall, "num_steps": m["num_steps"],
           "wall_per_step_ms": 1e3 * m["wall_s"] / max(m["num_steps"], 1),
           "host_wait_per_step_ms": 1e3 * m["host_wait_s"] / max(m["num_steps"], 1),
           "host_busy_per_step_ms": 1e3 * (m["wall_s"] - m["host_wait_s"]) / max(m["num_steps"], 1)}
    busy = device_busy(load_trace(path))
    if busy.get("busy_ms") and nvml.get("nvml_span_s"):
        # a second estimate of the untraced busy fraction: the traced kernels' time (the profiler slows the host,
        # hardly the kernels) over one untraced call's wall time
        busy["traced_kernels_over_untraced_wall"] = busy["busy_ms"] / (1e3 * nvml["nvml_span_s"] / repeats)
    return out | nvml | busy
