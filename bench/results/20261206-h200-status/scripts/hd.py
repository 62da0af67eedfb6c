"""Where a batch-1 decode dispatch's host time goes (issue 19, item 1), SmolLM2 shapes, random weights, k = 0:
the dispatch breakdown (jaxspec.bench.engine.dispatch_breakdown), the host's traced events over pipelined
dispatches (CUPTI driver calls and XLA's runtime TraceMes, level 2, no Python tracer) per dispatch, and a cProfile
of ModelRunner.decode. Writes $OUT/hd-<tag>.json; prints a summary."""
import cProfile, collections, io, json, os, pstats, sys, tempfile, time
sys.path.insert(0, ".")
import jax
import numpy as np
from jaxspec.bench.data import load_hf_config
from jaxspec.bench.engine import _timing_batch, decode_step_time, dispatch_breakdown
from jaxspec.bench.profile import find_trace, load_trace
from jaxspec.config import EngineConfig
from jaxspec.engine.model_runner import ModelRunner
from jaxspec.models import llama
from jaxspec.models.kernel_config import KernelConfig
from jaxspec.sampling_params import SamplingParams

tag = sys.argv[1]
B, context, iters = 1, 512, int(os.environ.get("HD_ITERS", 40))
cfg = llama.Config.from_hf(load_hf_config("smollm2-135m")[1], dtype="bfloat16").replace(
    attn_impl="pallas" if jax.default_backend() == "gpu" else "xla", kernel=KernelConfig.from_env(),
    layer_loop="unroll")
w = llama.init(cfg, jax.random.key(0))
ec = EngineConfig(max_model_len=4096, max_num_seqs=B, page_size=16, decode_buckets=[B], prefill_buckets=[16],
                  max_num_batched_tokens=16)
ec.num_pages = B * ec.pages_per_seq
runner = ModelRunner(ec, cfg, w, None, None)
runner.sampling.set(0, SamplingParams(temperature=0.0), 0, context // 2)
res = {"tag": tag, "kernel": str(cfg.kernel), "xla_flags": os.environ.get("XLA_FLAGS", "")}
t = decode_step_time(runner, B, context, iters)
res["timing_ms"] = {k: v * 1e3 for k, v in t._asdict().items() if k.endswith("_s")}
res["breakdown_ms"] = dispatch_breakdown(runner, B, context, 20)
# host events over pipelined dispatches
slots, tables = _timing_batch(runner, B, context)
for _ in range(5):
    out = runner.decode(slots, tables)
np.asarray(out)
opts = jax.profiler.ProfileOptions()
opts.python_tracer_level, opts.host_tracer_level = 0, 2
d = tempfile.mkdtemp()
n = int(os.environ.get("HD_N", 30))
with jax.profiler.trace(d, profiler_options=opts):
    for _ in range(n):
        out = runner.decode(slots, tables)
    np.asarray(out)
events = load_trace(find_trace(d))["traceEvents"]
pname = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
tname = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
agg = collections.defaultdict(lambda: [0, 0.0])
for e in events:
    if e.get("ph") != "X" or "/device:" in pname.get(e["pid"], ""):
        continue
    key = (tname.get((e["pid"], e["tid"]), str(e["tid"]))[:24], e["name"][:80])
    agg[key][0] += 1
    agg[key][1] += e.get("dur", 0)
rows = sorted(((us / n, c / n, th, nm) for (th, nm), (c, us) in agg.items()), reverse=True)
res["host_events_per_dispatch"] = [{"us": round(u, 2), "count": round(c, 2), "thread": th, "name": nm}
                                  for u, c, th, nm in rows[:80]]
# device kernels per dispatch
dev = collections.Counter()
for e in events:
    if e.get("ph") == "X" and "/device:" in pname.get(e["pid"], "") and "Stream" in tname.get((e["pid"], e["tid"]), ""):
        dev["kernels"] += 1
        dev["us"] += e.get("dur", 0)
res["device_per_dispatch"] = {k: v / n for k, v in dev.items()}
# cProfile of the Python side
pr = cProfile.Profile()
pr.enable()
for _ in range(int(os.environ.get("HD_PROF", 300))):
    out = runner.decode(slots, tables)
np.asarray(out)
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
res["cprofile_tottime"] = s.getvalue()[-6000:]
# JAX's per-call floor against the number of argument buffers
if tag in ("f1", "after"):
    floor = {}
    for nargs in (1, 8, 32, 64):
        xs = [jax.device_put(np.zeros((4, 4), np.float32) + i) for i in range(nargs)]
        f = jax.jit(lambda *a: a[0] + 1)
        jax.block_until_ready(f(*xs))
        times = []
        for _ in range(200):
            t0 = time.perf_counter()
            y = f(*xs)
            times.append(time.perf_counter() - t0)
            jax.block_until_ready(y)
        floor[f"{nargs} args"] = float(np.median(times)) * 1e6
    res["call_floor_us"] = floor
    print("   call floor us", {k: round(v, 1) for k, v in floor.items()})
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), f"hd-{tag}.json"), "w"), indent=1)
print(f"== {tag}: timing", {k: round(v, 3) for k, v in res["timing_ms"].items()})
print("   breakdown", {k: round(v, 3) for k, v in res["breakdown_ms"].items()})
print("   device per dispatch", res["device_per_dispatch"])
for r in res["host_events_per_dispatch"][:22]:
    print(f"   {r['us']:8.1f} us x{r['count']:6.2f} [{r['thread']}] {r['name']}")
print("\n".join(res["cprofile_tottime"].splitlines()[:40]))
