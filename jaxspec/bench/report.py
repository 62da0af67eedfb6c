"""Turning a benchmark's JSON into tables, a plot, a roofline and bench/RESULTS.md sections.

Everything here reads the result dict that throughput.py writes, so `--from-json FILE --update-results-md`
re-renders an old run without a device.

Roofline. A decode step must at least read every weight it multiplies by and the KV of every running sequence:
    bytes = W_target + k * W_draft + batch * ctx * (kv_target + k * kv_draft)
W_target counts the layers, the final norm and the LM head (the embedding matrix only when tied, as then it is
the LM head: a lookup reads B rows, not the matrix). An EAGLE step makes k draft passes (one over the k+1
verified positions, then k-1 single-token passes); each reads the head's layer and fc and an LM head (the
target's for EAGLE-1, its own for EAGLE-3). ctx = mean prompt length + half the mean output length (the mean
context over the run), batch = min(num_prompts, max_num_seqs). floor = bytes / copy bandwidth; the measured step
is engine wall time / steps (prefill steps included, so ramp-up and tail count against us). The bandwidth is the
GPU's measured one (--measure-bandwidth), else --bandwidth-tbs, else the figure known for its device kind; on a
CPU, or a GPU of unknown bandwidth, there is no roofline (a floor in another device's bandwidth means nothing).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

MD_BEGIN, MD_END = "<!-- BEGIN bench: {} -->", "<!-- END bench: {} -->"
RUNS_MARKER = "<!-- bench/throughput.py --update-results-md writes the sections below -->"


# ---- tables

def markdown_table(headers: list[str], rows: list[list]) -> str:
    fmt = lambda v: "n/a" if v is None else f"{v:.3g}" if isinstance(v, float) and abs(v) < 10 else (  # noqa: E731
        f"{v:.0f}" if isinstance(v, float) else str(v))
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def ok(p: dict | None) -> bool:
    return p is not None and "error" not in p and "skipped" not in p


def comparisons(result: dict) -> list[dict]:
    """One row per (num_prompts, mode): async vs sync, acceptance, identity, and the HF peer."""
    by_key = {(p["num_prompts"], p["mode"], p["async"]): p for p in result["points"]}
    hf_runs = (result.get("hf") or {}).get("runs", {})
    rows = []
    for n, mode in dict.fromkeys((p["num_prompts"], p["mode"]) for p in result["points"]):
        a, s = by_key.get((n, mode, True)), by_key.get((n, mode, False))
        tok = lambda p: p["output_tokens_per_s"] if ok(p) else None  # noqa: E731
        one = a if ok(a) else s if ok(s) else None
        hf = hf_runs.get(str(n), {})
        rows.append({
            "num_prompts": n, "mode": mode, "async_tok_s": tok(a), "sync_tok_s": tok(s),
            "speedup": tok(a) / tok(s) if tok(a) and tok(s) else None,
            "mean_acceptance_length": one.get("mean_acceptance_length") if one else None,
            "identical": result.get("identical", {}).get(f"{n}/{mode}"),
            "hf_tok_s": hf.get("output_tokens_per_s"),
            "hf_agreement": result.get("hf_agreement", {}).get(f"{n}/{mode}"),
            "errors": "; ".join(dict.fromkeys(p[k] for p in (a, s) if p for k in ("error", "skipped") if k in p))
            or "-"})
    return rows


def sweep_table(result: dict) -> str:
    rows = []
    for r in comparisons(result):
        ident = r["identical"]
        at = "" if ident is None or ident.get("earliest_differing_token") is None else (
            f"; from token {ident['earliest_differing_token']}")
        ident_s = None if ident is None else "yes" if ident["all"] else f"NO ({ident['fraction']:.0%} of requests{at})"
        agree = r["hf_agreement"]
        rows.append([r["num_prompts"], r["mode"], r["async_tok_s"], r["sync_tok_s"],
                     None if r["speedup"] is None else f"{r['speedup']:.3f}x", r["mean_acceptance_length"], ident_s,
                     r["hf_tok_s"], None if agree is None else f"{agree['requests_exact']:.0%}",
                     r["errors"]])
    return markdown_table(["num_prompts", "mode", "async out tok/s", "sync out tok/s", "speedup", "mean acc len",
                           "async==sync outputs", "HF out tok/s", "HF first-8 agree", "errors"], rows)


def profile_table(result: dict) -> str:
    """Device busy fraction sampled by NVML in an untraced run and from the traces; host time per step from the
    unprofiled timed run of the same mode, scheduling and prompt count when there is one (the profiler slows the
    host), else from the traced run."""
    timed = {(p["num_prompts"], p["mode"], p["async"]): p for p in result["points"] if ok(p)}
    rows = []
    for p in result.get("profile", []):
        t = timed.get((p.get("num_prompts"), p.get("mode"), p.get("async")))
        src, q = ("timed run", t) if t else ("profiled run", p)
        pct = lambda v: None if v is None else f"{v:.1%}"  # noqa: E731
        nvml = pct(p.get("nvml_busy_fraction"))
        nvml = f"{nvml} ({p['nvml_samples']} samples)" if nvml else p.get("nvml_error", "n/a")
        rows.append([p.get("mode"), "async" if p.get("async") else "sync", p.get("num_prompts"), nvml,
                     pct(p.get("traced_kernels_over_untraced_wall")), pct(p.get("nvml_engine_fraction")),
                     pct(p.get("busy_fraction")), pct(p.get("compute_busy_fraction")), q.get("wall_per_step_ms"),
                     q.get("host_busy_per_step_ms"), q.get("host_wait_per_step_ms"), src,
                     p.get("error") or p.get("method")])
    return markdown_table(["mode", "scheduling", "num_prompts", "busy, untraced (NVML)",
                           "traced kernel time / untraced wall", "engine loop share of wall", "busy, traced",
                           "compute busy, traced", "wall ms/step",
                           "host work ms/step", "host wait ms/step", "per-step source", "method / error"], rows)


# ---- roofline

def step_bytes(model: dict, batch: int, ctx: float) -> float:
    """Bytes one decode step must read (module docstring); `model` is result["model"]."""
    b = model["bytes"]
    k = b["k"]
    return (b["target_weights"] + k * b["draft_weights_per_pass"]
            + batch * ctx * (b["kv_per_token_target"] + k * b["kv_per_token_draft"]))


# Device-to-device copy bandwidth (read + write, TB/s) by jax device_kind, for runs that measured none.
KNOWN_BANDWIDTH_TBS = {"NVIDIA H200": 4.3}  # DESIGN.md's figure


def roofline_bandwidth(result: dict) -> tuple[float | None, str]:
    """(TB/s, where it comes from) for the roofline, or (None, why there is none)."""
    machine = result.get("machine") or {}
    kind = machine.get("device_kind", "unknown device")
    if machine.get("backend") != "gpu":
        return None, f"no roofline: {kind} is not a GPU (the floor is a GPU's memory bandwidth)"
    if (result.get("bandwidth") or {}).get("tb_s"):
        return result["bandwidth"]["tb_s"], "measured"
    if result["args"].get("bandwidth_tbs"):
        return result["args"]["bandwidth_tbs"], "--bandwidth-tbs"
    if kind in KNOWN_BANDWIDTH_TBS:
        return KNOWN_BANDWIDTH_TBS[kind], f"known for {kind}"
    return None, (f"no roofline: the copy bandwidth of {kind} is not known; pass --measure-bandwidth or "
                  "--bandwidth-tbs")


def roofline(result: dict) -> list[dict]:
    tbs, source = roofline_bandwidth(result)
    rows = []
    if tbs is None:
        return rows
    for p in result["points"]:
        model = result["models"].get(p["mode"])
        if not ok(p) or model is None or not p.get("num_steps"):
            continue
        batch = min(p["num_prompts"], result["args"]["max_num_seqs"])
        ctx = p["prompt_tokens"] / p["num_requests"] + 0.5 * p["output_tokens"] / p["num_requests"]
        nbytes = step_bytes(model, batch, ctx)
        # tensor parallelism: each device reads its share at the same time (a lower bound where KV heads or a
        # degree-1 draft head are replicated)
        floor_ms = 1e3 * nbytes / model["bytes"].get("tensor_parallel_size", 1) / (tbs * 1e12)
        rows.append({"num_prompts": p["num_prompts"], "mode": p["mode"], "async": p["async"], "batch": batch,
                     "ctx": ctx, "gb_per_step": nbytes / 1e9, "floor_ms": floor_ms,
                     "step_ms": p["wall_per_step_ms"], "ratio": p["wall_per_step_ms"] / floor_ms,
                     "bandwidth_tb_s": tbs, "bandwidth_source": source})
    return rows


def roofline_table(result: dict) -> str:
    rows = [[r["num_prompts"], r["mode"], "async" if r["async"] else "sync", r["batch"], r["ctx"],
             f"{r['gb_per_step']:.2f}", f"{r['floor_ms']:.2f}", f"{r['step_ms']:.2f}", f"{r['ratio']:.2f}x"]
            for r in result.get("roofline", [])]
    return markdown_table(["num_prompts", "mode", "scheduling", "batch", "mean ctx", "GB/step", "floor ms",
                           "measured ms/step", "measured/floor"], rows)


# ---- bandwidth

def measure_bandwidth(nbytes: int | None = None, iters: int = 20) -> dict:
    """Copy bandwidth: `y = x + 1` over a large uint32 array, chained `iters` times without a host sync; bytes
    moved count the read and the write. The floor a decode step is held to."""
    import jax
    import jax.numpy as jnp

    nbytes = nbytes or ((64 << 20) if jax.default_backend() == "cpu" else (2 << 30))
    x = jnp.zeros((nbytes // 4,), jnp.uint32)
    step = jax.jit(lambda a: a + jnp.uint32(1))
    y = step(x).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(iters):
        y = step(y)
    y.block_until_ready()
    dt = (time.perf_counter() - t0) / iters
    return {"method": "jit(x + 1) over uint32, chained, read + write counted", "bytes": nbytes,
            "ms_per_copy": dt * 1e3, "tb_s": 2 * nbytes / dt / 1e12}


# ---- files

def save_json(result: dict, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    tmp.replace(path)


def plot(result: dict, path: str | Path) -> str:
    """Output tokens/s against the prompt count, one line per mode and scheduling (and the HF peer)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, mode in enumerate(dict.fromkeys(p["mode"] for p in result["points"])):
        for is_async, style in ((True, "-o"), (False, "--s")):
            pts = sorted((p["num_prompts"], p["output_tokens_per_s"]) for p in result["points"]
                         if p["mode"] == mode and p["async"] == is_async and ok(p))
            if pts:
                ax.plot(*zip(*pts), style, color=f"C{i}", label=f"{mode}, {'async' if is_async else 'sync'}")
    hf = sorted((r["num_prompts"], r["output_tokens_per_s"]) for r in (result.get("hf") or {}).get("runs", {}).values())
    if hf:
        ax.plot(*zip(*hf), ":^", color="gray", label="transformers generate")
    ax.set_xticks(sorted({p["num_prompts"] for p in result["points"]}))
    ax.set_xlabel("prompts")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{result['label']}\n{result['machine']['device_kind']}, {result['date'][:10]}", fontsize=9)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def results_section(result: dict) -> str:
    m = result["machine"]
    a = result["args"]
    parts = [f"### {result['label']}", "",
             (f"- machine: {m['device_kind']} x{m['device_count']} ({m['backend']}), host `{m['hostname']}`, "
              f"jax {m['jax_version']}"),
             f"- date: {result['date']}",
             f"- command: `{result['command']}`",
             (f"- prompts: {result['prompts']['source']}, mean input {result['prompts']['mean_input_len']:.0f} "
              f"tokens; max_tokens {a['max_tokens']}, temperature {a['temperature']}, ignore_eos {a['ignore_eos']}, "
              f"max_num_seqs {a['max_num_seqs']}")]
    if result.get("synthetic_acceptance") is not None:
        parts.append(f"- **synthetic acceptance p={result['synthetic_acceptance']}: the EAGLE rows' outputs are "
                     "meaningless (acceptance is drawn, not computed); only their speed means anything**")
    if result.get("bandwidth"):
        parts.append(f"- copy bandwidth: {result['bandwidth']['tb_s']:.2f} TB/s (read + write)")
    parts += ["", "Throughput:", "", sweep_table(result)]
    if result.get("roofline"):
        parts += ["", "Roofline:", "", roofline_table(result)]
    elif roofline_bandwidth(result)[0] is None:
        parts += ["", f"Roofline: {roofline_bandwidth(result)[1]}."]
    if result.get("profile"):
        parts += ["", "Device timeline:", "", profile_table(result)]
    if result.get("errors"):
        parts += ["", "Errors:", ""] + [f"- {e['stage']}: {e['error']}" for e in result["errors"]]
    return "\n".join(parts)


def update_results_md(md_path: str | Path, result: dict) -> None:
    """Replace this run's section (keyed by its label) in RESULTS.md, or append it after the runs marker."""
    md_path = Path(md_path)
    text = md_path.read_text() if md_path.exists() else f"# Benchmark results\n\n{RUNS_MARKER}\n"
    begin, end = MD_BEGIN.format(result["label"]), MD_END.format(result["label"])
    block = f"{begin}\n{results_section(result)}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    md_path.write_text(text)
