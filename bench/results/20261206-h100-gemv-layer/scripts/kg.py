"""fused_layer's kernels alone on the GPU at SmolLM2 shapes, 1 and 4 tokens (the row-by-row GEMV path), variants of
its knobs; XLA's ops for the same work as reference. Weights stacked over 30 layers and each call reads the next
layer's, as a step does (one layer's weights would stay in L2). Device time a call: the sum of a profiler trace's
kernels over 30 x REPS calls."""
import json, os, sys, tempfile
import jax, jax.numpy as jnp, numpy as np
from jaxspec.models import fused_layer as fl, llama, attention as attn
from jaxspec.models.kernel_config import KernelConfig
from jaxspec.bench.profile import find_trace, load_trace, kernel_totals

H, I, NH, KVH, D, L = 576, 1536, 9, 3, 64, 30
REPS = 4
bf = jnp.bfloat16
ks = jax.random.split(jax.random.key(0), 8)
rnd = lambda k, shape: (jax.random.normal(k, shape, jnp.float32) * 0.02).astype(bf)  # noqa
wqkv, wo, wgu, wd = rnd(ks[1], (L, H, (NH + 2 * KVH) * D)), rnd(ks[2], (L, NH * D, H)), rnd(ks[3], (L, H, 2 * I)), rnd(ks[4], (L, I, H))
g = jnp.ones((L, H), bf)
inv = llama.rope_inv_freq(llama.Config(vocab_size=8, hidden_size=H, intermediate_size=I, num_layers=1, num_heads=NH,
                                       num_kv_heads=KVH, head_dim=D))
cfg = llama.Config(vocab_size=1024, hidden_size=H, intermediate_size=I, num_layers=L, num_heads=NH, num_kv_heads=KVH,
                   head_dim=D, dtype="bfloat16", attn_impl="pallas", kernel=KernelConfig(fused_decode=True))
P, S = 80, 16
kv = attn.KVCache(jnp.zeros((KVH, L, P, S, D), bf), jnp.zeros((KVH, L, P, S, D), bf))
IDX = [jnp.full((1,), i, jnp.int32) for i in range(L)]


def setup(T):
    tables = jnp.arange(72, dtype=jnp.int32)[None]
    pos = jnp.arange(1100, 1100 + T, dtype=jnp.int32)[None]
    slots = (tables[0, pos[0] // S] * S + pos[0] % S)[None]
    plan = fl.plan(cfg, pos, attn.AttnBatch(tables, slots), kv)
    x = jnp.zeros((16, H), bf).at[:T].set(rnd(ks[0], (T, H)) * 50)
    h = jnp.zeros((16, I), bf).at[:T].set(rnd(ks[5], (T, I)) * 50)
    o = jax.random.normal(ks[6], (plan.splits, 1, KVH, plan.row_len.shape[1], D), jnp.float32)
    l = jnp.ones(o.shape[:-1], jnp.float32)
    m = jnp.zeros(o.shape[:-1], jnp.float32)
    return plan, x, h, o, l, m


def ours(T):
    plan, x, h, o, l, m = setup(T)
    idx = IDX.__getitem__
    qkv = jax.jit(lambda x, i, kv: fl.qkv(x, g, wqkv, 1e-5, plan, NH, inv, kv, i), donate_argnums=2)
    ao = jax.jit(lambda o, i, r: fl.attn_out(o, l, m, wo, i, r, plan))
    gu = jax.jit(lambda x, i: fl.linear(x, wgu, i, norm=g, eps=1e-5, swiglu=True, tokens=T))
    dn = jax.jit(lambda h, i, r: fl.linear(h, wd, i, residual=r, tokens=T))
    state = {"kv": attn.KVCache(kv.k + 0, kv.v + 0)}  # donated call after call

    def run_qkv(i):
        q, state["kv"] = qkv(x, idx(i), state["kv"])
        return q
    return {"qkv": run_qkv, "attn_out": lambda i: ao(o, idx(i), x), "gate_up": lambda i: gu(x, idx(i)),
            "down": lambda i: dn(h, idx(i), x)}


def xla(T):
    _, x, h, *_ = setup(T)
    x, h = x[:T], h[:T]
    lay = lambda a: [a[i] for i in range(L)]  # noqa
    Wq, Wo, Wg, Wd = lay(wqkv), lay(wo), lay(wgu), lay(wd)
    f_qkv = jax.jit(lambda x, w: llama.rms_norm(x, g[0], 1e-5) @ w)
    f_ao = jax.jit(lambda a, w, r: r + a @ w)
    f_gu = jax.jit(lambda x, w: (lambda y: jax.nn.silu(y[:, :I]) * y[:, I:])(llama.rms_norm(x, g[0], 1e-5) @ w))
    f_dn = jax.jit(lambda h, w, r: r + h @ w)
    a = jnp.zeros((T, NH * D), bf)
    return {"qkv": lambda i: f_qkv(x, Wq[i]), "attn_out": lambda i: f_ao(a, Wo[i], x),
            "gate_up": lambda i: f_gu(x, Wg[i]), "down": lambda i: f_dn(h, Wd[i], x)}


def timed(fns):
    out = {}
    for name, f in fns.items():
        for i in range(L):
            jax.block_until_ready(f(i))
        d = tempfile.mkdtemp()
        with jax.profiler.trace(d):
            for _ in range(REPS):
                for i in range(L):
                    r = f(i)
            jax.block_until_ready(r)
        tot = kernel_totals(load_trace(find_trace(d)))
        calls = REPS * L
        own = [t for t in tot if not t["name"].startswith("Memcpy")]
        out[name] = {"us": round(sum(t["ms"] for t in own) * 1e3 / calls, 3),
                     "launches": round(sum(t["count"] for t in tot) / calls, 2),
                     "kernels": {t["name"][:60]: round(t["ms"] * 1e3 / t["count"], 2) for t in tot}}
    return out


if __name__ == "__main__":  # (bench/results/20261206-loads-first/scripts/kd.py imports the functions above)
    DEFAULT = {k: getattr(fl, k) for k in ("GEMV_WARPS", "GEMV_MIN_PROGRAMS", "GEMV_ACC_ELEMS", "GEMV_MIN_BLOCK",
                                           "GEMV_UNROLL")}
    VARIANTS = [{}, {"GEMV_WARPS": 8}, {"GEMV_WARPS": 16, "GEMV_ACC_ELEMS": 32768}, {"GEMV_WARPS": 8, "GEMV_ACC_ELEMS": 16384},
                {"GEMV_WARPS": 16, "GEMV_ACC_ELEMS": 16384}, {"GEMV_MIN_PROGRAMS": 128},
                {"GEMV_WARPS": 8, "GEMV_MIN_PROGRAMS": 128},
                {"GEMV_WARPS": 16, "GEMV_ACC_ELEMS": 32768, "GEMV_MIN_PROGRAMS": 128}, {"GEMV_UNROLL": 0},
                {"GEMV_WARPS": 2}]
    WIDE = sys.argv[1:] == ["wide"]  # call 3: one token, wider column blocks (fewer programs)
    if WIDE:
        VARIANTS = [{}, {"GEMV_MIN_PROGRAMS": 32}, {"GEMV_MIN_PROGRAMS": 16}, {"GEMV_MIN_PROGRAMS": 8},
                    {"GEMV_MIN_PROGRAMS": 16, "GEMV_WARPS": 8}, {"GEMV_MIN_PROGRAMS": 8, "GEMV_WARPS": 8}]
    results = {}
    for T in (1,) if WIDE else (1, 4):
        results[f"xla T={T}"] = r = timed(xla(T))
        print(f"xla T={T}", {k: (v["us"], v["launches"]) for k, v in r.items()}, flush=True)
        for var in VARIANTS if T == 1 else VARIANTS[:3]:
            for k, v in (DEFAULT | var).items():
                setattr(fl, k, v)
            name = f"T={T} " + (",".join(f"{k[5:]}={v}" for k, v in var.items()) or "default")
            try:
                r = timed(ours(T))
                print(name, {k: (v["us"], v["launches"]) for k, v in r.items()}, flush=True)
            except Exception as e:  # noqa: BLE001
                r = {"error": str(e)[:300]}
                print(name, r, flush=True)
            results[name] = r
    json.dump(results, open(os.path.join(os.environ.get("OUT", "/tmp"), "kg-1.json" if WIDE else "kg.json"), "w"),
              indent=1)
    print("\nus a call (launches)   qkv   attn_out   gate_up   down   sum")
    for name, r in results.items():
        if "error" in r:
            continue
        print(f"{name:38s}", " ".join(f"{r[k]['us']:7.2f}" for k in ("qkv", "attn_out", "gate_up", "down")),
              f"{sum(r[k]['us'] for k in ('qkv', 'attn_out', 'gate_up', 'down')):7.2f}")
