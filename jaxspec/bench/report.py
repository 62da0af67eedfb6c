"""Turning a benchmark's JSON into tables, a plot, a roofline and bench/RESULTS.md sections.

Everything here reads the result dict that throughput.py writes, so `--from-json FILE --update-results-md`
re-renders an old run without a device.

Roofline. A decode step must at least read every weight it multiplies by and the KV of every running sequence:
    bytes = W_target + k * W_draft + batch * ctx * (kv_target + k * kv_draft)
W_target counts the layers, the final norm and the LM head (the embedding matrix only when tied, as then it is
the LM head: a lookup reads B rows, not the matrix). An EAGLE step makes k draft passes (one over the k+1
verified positions, then k-1 single-token passes); each reads the head's layer and fc and an LM head (the
target's for EAGLE-1, its own for EAGLE-3). It must also compute, at 2 FLOPs per weight of each matrix product
(F_* per token, engine.step_flops_per_token) and 4 * heads * head_dim per layer per context token of attention (A_*):
    FLOPs = batch * ((k+1) * (F_target + ctx * A_target) + (k+1) * (F_verified + ctx * A_draft)
                     + (k-1) * (F_rollout + ctx * A_draft) + k * F_draft_lm_head)
ctx = mean prompt length + half the mean output length (the mean context over the run), batch = min(num_prompts,
max_num_seqs). floor = max(bytes / copy bandwidth, FLOPs / matmul rate), `bound` naming the larger; the measured
step is engine wall time / steps (prefill steps included, so ramp-up and tail count against us). Each rate is the
GPU's measured one (--measure-bandwidth, --measure-matmul), else the flag's (--bandwidth-tbs, --matmul-tflops),
else the figure known for its device kind; on a CPU, or a GPU of unknown bandwidth, there is no roofline (a floor in
another device's bandwidth means nothing), and on a GPU of unknown matmul rate only the byte floor. A result from
before FLOPs were counted renders with the byte floor only.
"""

from __future__ import annotations

import json
import statistics
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


def dynamic_vs_best(result: dict) -> list[dict]:
    """--sweep-k: per prompt count (and scheduling), the dynamic policy against the best fixed mode (no speculation
    or a fixed k; the one of highest median): the ratio of their median runs and, with --repeats, the median of
    their ratios round by round. A round runs every mode back to back, so pairing within rounds takes out the
    host's drift between rounds (runs of one point spread 10-25 % at 256 prompts on the H200, 2026-12-04). With
    both modes' steps and whether their outputs are the same: on the GPU, greedy outputs of different k can differ
    (a near tie rounds the other way in another verify shape), and one request whose answer drafts worse sets a
    run's length."""
    groups: dict[tuple[int, bool], dict[str, dict]] = {}
    for p in result["points"]:
        groups.setdefault((p["num_prompts"], p["async"]), {})[p["mode"]] = p
    rows = []
    for (n, is_async), modes in groups.items():
        dynamic = next((m for m in modes if m.endswith(" dynamic")), None)
        fixed = {m: p for m, p in modes.items() if m != dynamic and ok(p)}
        if dynamic is None or not ok(modes[dynamic]) or not fixed:
            continue
        d, best = modes[dynamic], max(fixed, key=lambda m: fixed[m]["output_tokens_per_s"])
        runs_d, runs_b = d.get("repeats_output_tokens_per_s"), fixed[best].get("repeats_output_tokens_per_s")
        paired = (statistics.median(x / y for x, y in zip(runs_d, runs_b))
                  if runs_d and runs_b and len(runs_d) == len(runs_b) else None)
        rows.append({"num_prompts": n, "async": is_async, "dynamic_tok_s": d["output_tokens_per_s"],
                     "best_mode": best, "best_tok_s": fixed[best]["output_tokens_per_s"],
                     "ratio": d["output_tokens_per_s"] / fixed[best]["output_tokens_per_s"], "paired_ratio": paired,
                     "num_steps_by_k": d.get("num_steps_by_k", {}), "dynamic_steps": d.get("num_steps"),
                     "best_steps": fixed[best].get("num_steps"), "same_outputs": _same_outputs(d, fixed[best])})
    return rows


def _same_outputs(a: dict, b: dict) -> bool | None:
    """Whether two points' outputs are the same (their hashes; None where either has none)."""
    ha, hb = a.get("outputs_sha256"), b.get("outputs_sha256")
    return None if ha is None or hb is None else ha == hb


def dynamic_table(comparisons: list[dict]) -> str:
    """dynamic_vs_best's rows as a markdown table."""
    rows = [[r["num_prompts"], "async" if r["async"] else "sync", r["dynamic_tok_s"], r["best_mode"], r["best_tok_s"],
             f"{r['ratio']:.3f}", None if r["paired_ratio"] is None else f"{r['paired_ratio']:.3f}",
             " ".join(f"{k}:{n}" for k, n in r["num_steps_by_k"].items() if n),
             f"{r.get('dynamic_steps')} / {r.get('best_steps')}",
             {True: "yes", False: "no", None: None}[r.get("same_outputs")]] for r in comparisons]
    return markdown_table(["num_prompts", "scheduling", "dynamic out tok/s", "best fixed", "its out tok/s",
                           "dynamic / best, medians", "dynamic / best, paired rounds", "dynamic's steps by k",
                           "steps, dynamic / best", "same outputs"], rows)


def gaps(idle: list[dict] | None) -> str | None:
    """profile.idle_gaps as one cell: each bin's share of the span."""
    return None if not idle else ", ".join(f"{g['gap']} {g['fraction']:.1%}" for g in idle)


def profile_table(result: dict) -> str:
    """Device busy fraction sampled by NVML in an untraced run and from the traces, the traced idle time by gap
    length (profile.idle_gaps: short gaps lie between one program's kernels, long ones between programs); host time
    per step from the unprofiled timed run of the same mode, scheduling and prompt count when there is one (the
    profiler slows the host), else from the traced run."""
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
                     pct(p.get("busy_fraction")), pct(p.get("compute_busy_fraction")), gaps(p.get("idle_gaps")),
                     q.get("wall_per_step_ms"),
                     q.get("host_busy_per_step_ms"), q.get("host_wait_per_step_ms"), src,
                     p.get("error") or p.get("method")])
    return markdown_table(["mode", "scheduling", "num_prompts", "busy, untraced (NVML)",
                           "traced kernel time / untraced wall", "engine loop share of wall", "busy, traced",
                           "compute busy, traced", "idle, traced, by gap length", "wall ms/step",
                           "host work ms/step", "host wait ms/step", "per-step source", "method / error"], rows)


# ---- roofline

def step_bytes(model: dict, batch: int, ctx: float) -> float:
    """Bytes one decode step must read (module docstring); `model` is result["model"]."""
    b = model["bytes"]
    k = b["k"]
    return (b["target_weights"] + k * b["draft_weights_per_pass"]
            + batch * ctx * (b["kv_per_token_target"] + k * b["kv_per_token_draft"]))


def step_flops(model: dict, batch: int, ctx: float) -> float | None:
    """FLOPs one decode step must compute (module docstring), or None for a result from before FLOPs were
    counted. Without a draft head its terms are zero."""
    f = model.get("flops")
    if f is None:
        return None
    k = f["k"]
    attn = ctx * f["draft_attn_per_token_ctx"]
    return batch * ((k + 1) * (f["target_per_token"] + ctx * f["target_attn_per_token_ctx"])
                    + (k + 1) * (f["draft_verified_per_token"] + attn)  # the pass over the k+1 verified pairs
                    + max(k - 1, 0) * (f["draft_rollout_per_token"] + attn)  # then k-1 single-token passes
                    + k * f["draft_lm_head_per_token"])  # one LM head per drafted token


def floors(nbytes: float, nflops: float | None, tb_s: float, tflop_s: float | None, tp: int = 1) -> dict:
    """A step's floors in ms: bytes / bandwidth, FLOPs / matmul rate (None when either is unknown) and the larger,
    `bound` naming it: a step may overlap its reads with its arithmetic but can finish neither sooner. Under tensor
    parallelism each device reads and computes its share at the same time (a lower bound where KV heads or a
    degree-1 draft head are replicated)."""
    bytes_ms = 1e3 * nbytes / tp / (tb_s * 1e12)
    flops_ms = None if nflops is None or tflop_s is None else 1e3 * nflops / tp / (tflop_s * 1e12)
    if flops_ms is None:
        return {"bytes_floor_ms": bytes_ms, "flops_floor_ms": None, "floor_ms": bytes_ms, "bound": None}
    return {"bytes_floor_ms": bytes_ms, "flops_floor_ms": flops_ms, "floor_ms": max(bytes_ms, flops_ms),
            "bound": "bytes" if bytes_ms >= flops_ms else "flops"}


# Device-to-device copy bandwidth (read + write, TB/s) by jax device_kind, for runs that measured none.
KNOWN_BANDWIDTH_TBS = {"NVIDIA H200": 4.3}  # DESIGN.md's figure
# Dense bf16 matmul rate (TFLOP/s) by device kind, for runs that measured none: `--measure-matmul` on the H200
# machine, 2026-12-01 (jit(a @ b), bf16 8192^3, median of 20: 667.0; bench/results/20261201-h200-logprob-cost-4/
# greedy.json), not the 989 TFLOP/s datasheet peak, so the floor is one that GEMMs reach.
KNOWN_MATMUL_TFLOPS = {"NVIDIA H200": 667.0}


def _rate(result: dict, measured: str, field: str, flag: str, known: dict[str, float]) -> tuple[float | None, str]:
    """(rate, where it comes from): this run's measurement (result[measured][field]), else the flag's value, else
    the figure known for the device kind; (None, "") when none."""
    kind = (result.get("machine") or {}).get("device_kind", "unknown device")
    if (result.get(measured) or {}).get(field):
        return result[measured][field], "measured"
    if result["args"].get(flag):
        return result["args"][flag], "--" + flag.replace("_", "-")
    if kind in known:
        return known[kind], f"known for {kind}"
    return None, ""


def roofline_bandwidth(result: dict) -> tuple[float | None, str]:
    """(TB/s, where it comes from) for the roofline, or (None, why there is none)."""
    machine = result.get("machine") or {}
    kind = machine.get("device_kind", "unknown device")
    if machine.get("backend") != "gpu":
        return None, f"no roofline: {kind} is not a GPU (the floor is a GPU's memory bandwidth)"
    tb_s, source = _rate(result, "bandwidth", "tb_s", "bandwidth_tbs", KNOWN_BANDWIDTH_TBS)
    return tb_s, source or (f"no roofline: the copy bandwidth of {kind} is not known; pass --measure-bandwidth or "
                            "--bandwidth-tbs")


def roofline_matmul(result: dict) -> tuple[float | None, str]:
    """(TFLOP/s, where it comes from) for the FLOPs floor, or (None, why there is none): asked only where
    roofline_bandwidth found a GPU's bandwidth, so a CPU never gets one."""
    kind = (result.get("machine") or {}).get("device_kind", "unknown device")
    tflop_s, source = _rate(result, "matmul", "tflop_s", "matmul_tflops", KNOWN_MATMUL_TFLOPS)
    return tflop_s, source or (f"no FLOPs floor: the matmul rate of {kind} is not known; pass --measure-matmul or "
                               "--matmul-tflops")


def roofline(result: dict) -> list[dict]:
    tb_s, bw_source = roofline_bandwidth(result)
    rows = []
    if tb_s is None:
        return rows
    tflop_s, mm_source = roofline_matmul(result)
    for p in result["points"]:
        model = result["models"].get(p["mode"])
        if not ok(p) or model is None or not p.get("num_steps"):
            continue
        batch = min(p["num_prompts"], result["args"]["max_num_seqs"])
        ctx = p["prompt_tokens"] / p["num_requests"] + 0.5 * p["output_tokens"] / p["num_requests"]
        nbytes, nflops = step_bytes(model, batch, ctx), step_flops(model, batch, ctx)
        floor = floors(nbytes, nflops, tb_s, tflop_s, model["bytes"].get("tensor_parallel_size", 1))
        rows.append({"num_prompts": p["num_prompts"], "mode": p["mode"], "async": p["async"], "batch": batch,
                     "ctx": ctx, "gb_per_step": nbytes / 1e9,
                     "gflop_per_step": None if nflops is None else nflops / 1e9,
                     **floor, "step_ms": p["wall_per_step_ms"], "ratio": p["wall_per_step_ms"] / floor["floor_ms"],
                     "bandwidth_tb_s": tb_s, "bandwidth_source": bw_source, "matmul_tflop_s": tflop_s,
                     "matmul_source": mm_source})
    return rows


def roofline_rates(result: dict) -> str:
    """The rates the roofline's floors were taken at, from its rows (a result from before FLOPs were counted has
    only the bandwidth, and the oldest not its source)."""
    r = result["roofline"][0]
    bw = f"copy {r['bandwidth_tb_s']:.2f} TB/s" + (f" ({r['bandwidth_source']})" if r.get("bandwidth_source") else "")
    if r.get("matmul_tflop_s") is None:
        return f"{bw}; {r.get('matmul_source') or 'no FLOPs floor: FLOPs not counted in this result'}"
    return f"{bw}, matmul {r['matmul_tflop_s']:.0f} TFLOP/s ({r['matmul_source']})"


def roofline_table(result: dict) -> str:
    """One row per point; rows from before FLOPs were counted show the byte floor only (floor_ms was it)."""
    f2 = lambda v: None if v is None else f"{v:.2f}"  # noqa: E731
    rows = [[r["num_prompts"], r["mode"], "async" if r["async"] else "sync", r["batch"], r["ctx"],
             f2(r["gb_per_step"]), f2(r.get("gflop_per_step")), f2(r.get("bytes_floor_ms", r["floor_ms"])),
             f2(r.get("flops_floor_ms")), f2(r["floor_ms"]), f2(r["step_ms"]), f"{r['ratio']:.2f}x", r.get("bound")]
            for r in result.get("roofline", [])]
    return markdown_table(["num_prompts", "mode", "scheduling", "batch", "mean ctx", "GB/step", "GFLOP/step",
                           "bytes floor ms", "FLOPs floor ms", "floor ms", "measured ms/step", "measured/floor",
                           "bound"], rows)


# ---- bandwidth and matmul rate

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


def measure_matmul(n: int | None = None, iters: int = 20) -> dict:
    """Dense bf16 GEMM rate: the median time of an n x n by n x n product (8192 on a GPU, enough to fill an H200;
    512 elsewhere), 2 n^3 FLOPs. Random operands, as constant ones draw less power and clock higher. The rate a
    step's matrix products are held to in the FLOPs floor."""
    import jax
    import jax.numpy as jnp

    from jaxspec.bench.timing import median_time

    n = n or (8192 if jax.default_backend() == "gpu" else 512)
    a, b = jax.random.normal(jax.random.key(0), (2, n, n), jnp.bfloat16)
    dt = median_time(jax.jit(jnp.matmul), a, b, iters=iters)
    return {"method": f"jit(a @ b), bf16 {n}^3, median of {iters} calls waited on", "n": n,
            "ms_per_matmul": dt * 1e3, "tflop_s": 2 * n ** 3 / dt / 1e12}


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
    if result.get("matmul"):
        parts.append(f"- matmul rate: {result['matmul']['tflop_s']:.0f} TFLOP/s ({result['matmul']['method']})")
    parts += ["", "Throughput:", "", sweep_table(result)]
    if result.get("dynamic_vs_best"):
        parts += ["", "Dynamic k against the best fixed mode:", "", dynamic_table(result["dynamic_vs_best"])]
    if result.get("roofline"):
        parts += ["", f"Roofline ({roofline_rates(result)}):", "", roofline_table(result)]
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
