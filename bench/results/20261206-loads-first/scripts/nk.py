"""Where fused_layer's one-token kernels spend their ~5-6 us (issue 19). `nk.py time`: each kernel (and XLA's ops
for the same work) timed with its layer's weights read from HBM (30 stacked layers, a new one each call, as a
step does) against one layer's weights over and over (in L2). `nk.py ncu`: one call of each, for Nsight Compute
(cudaProfilerStart before them: run under `ncu --profile-from-start off`)."""
import ctypes, glob, json, os, sys, tempfile
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../20261206-h100-gemv-layer/scripts"))
import jax  # noqa: E402
import kg  # noqa: E402
from jaxspec.bench.profile import find_trace, load_trace, kernel_totals  # noqa: E402


def timed_same(fns, layer=0):
    out = {}
    for name, f in fns.items():
        jax.block_until_ready(f(layer))
        d = tempfile.mkdtemp()
        with jax.profiler.trace(d):
            for _ in range(kg.REPS * kg.L):
                r = f(layer)
            jax.block_until_ready(r)
        tot = kernel_totals(load_trace(find_trace(d)))
        out[name] = {t["name"][:40]: round(t["ms"] * 1e3 / t["count"], 2) for t in tot if not t["name"].startswith("Memcpy")}
    return out


def profiler_start():
    for path in glob.glob(os.path.join(os.path.dirname(jax.__file__), "..", "nvidia", "*", "lib", "libcudart.so*")):
        try:
            return ctypes.CDLL(path).cudaProfilerStart()
        except OSError:
            pass
    import torch
    return torch.cuda.cudart().cudaProfilerStart()


if sys.argv[1] == "time":
    res = {}
    for T in (1,):
        for kind, fns in (("xla", kg.xla(T)), ("ours", kg.ours(T))):
            res[f"{kind} T={T} hbm"] = {k: v["kernels"] for k, v in kg.timed(fns).items()}
            res[f"{kind} T={T} l2"] = timed_same(fns)
    json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "nk-time.json"), "w"), indent=1)
    for name, r in res.items():
        print(name, {k: {n[:22]: us for n, us in v.items() if us > 1.5} for k, v in r.items()})
else:
    fns = list(kg.ours(1).items()) + list(kg.xla(1).items())
    for _, f in fns:  # compile and run once
        jax.block_until_ready(f(3))
    print("cudaProfilerStart", profiler_start(), flush=True)
    for _, f in fns:
        jax.block_until_ready(f(5))
