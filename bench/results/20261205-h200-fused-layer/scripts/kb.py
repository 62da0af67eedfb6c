"""Micro-benchmark of fused_layer's kernels on the GPU at SmolLM2 shapes (batch 1), variants of warps / stages / K
and N blocks, device time per kernel from a profiler trace; XLA's ops for the same work as reference."""
import json, os, sys, tempfile
import jax, jax.numpy as jnp, numpy as np
from jaxspec.models import fused_layer as fl, llama, paged_kernel, attention as attn
from jaxspec.models.kernel_config import KernelConfig
from jaxspec.bench.profile import find_trace, load_trace, kernel_totals
H, I, NH, KVH, D = 576, 1536, 9, 3, 64
key = jax.random.key(0)
ks = jax.random.split(key, 8)
bf = jnp.bfloat16
x = jnp.zeros((16, H), bf).at[0].set(jax.random.normal(ks[0], (H,), bf))
g = jnp.ones((H,), bf)
wqkv = (jax.random.normal(ks[1], (H, (NH + 2 * KVH) * D), bf) * 0.02).astype(bf)
wo = (jax.random.normal(ks[2], (NH * D, H), bf) * 0.02).astype(bf)
wgu = (jax.random.normal(ks[3], (H, 2 * I), bf) * 0.02).astype(bf)
wd = (jax.random.normal(ks[4], (I, H), bf) * 0.02).astype(bf)
h = jnp.zeros((16, I), bf).at[0].set(jax.random.normal(ks[5], (I,), bf))
cfg = llama.Config(vocab_size=1024, hidden_size=H, intermediate_size=I, num_layers=1, num_heads=NH, num_kv_heads=KVH,
                   head_dim=D, dtype="bfloat16", attn_impl="pallas", kernel=KernelConfig(fused_decode=True))
P, S = 256, 16
kv = attn.KVCache(jnp.zeros((KVH, 1, P, S, D), bf), jnp.zeros((KVH, 1, P, S, D), bf))
tables = jnp.arange(72, dtype=jnp.int32)[None]
pos = jnp.array([[1100]], jnp.int32)
slots = (tables[0, 1100 // S] * S + 1100 % S)[None, None]
batch = attn.AttnBatch(tables, slots)
plan = fl.plan(cfg, pos, batch, kv)
inv = llama.rope_inv_freq(cfg)
o = jax.random.normal(ks[6], (plan.splits, 1, KVH, 16, D), jnp.float32)
l = jnp.ones((plan.splits, 1, KVH, 16), jnp.float32)
m = jnp.zeros((plan.splits, 1, KVH, 16), jnp.float32)

def kernels():
    return {
        "qkv": jax.jit(lambda x, w, kv: fl.qkv(x, g, w, 1e-5, plan, NH, inv, kv, 0), donate_argnums=2),
        "attn_out": jax.jit(lambda o, w, r: fl.attn_out(o, l, m, w, r, plan)),
        "gate_up": jax.jit(lambda x, w: fl.linear(x, w, norm=g, eps=1e-5, swiglu=True)),
        "down": jax.jit(lambda h, w, r: fl.linear(h, w, residual=r)),
    }

def xla_ref():
    x1 = x[:1]
    return {
        "qkv": (jax.jit(lambda x, w: llama.rms_norm(x, g, 1e-5) @ w), (x1, wqkv)),
        "attn_out": (jax.jit(lambda a, w, r: r + a @ w), (jnp.zeros((1, NH * D), bf), wo, x1)),
        "gate_up": (jax.jit(lambda x, w: (lambda y: jax.nn.silu(y[:, :I]) * y[:, I:])(llama.rms_norm(x, g, 1e-5) @ w)), (x1, wgu)),
        "down": (jax.jit(lambda h, w, r: r + h @ w), (h[:1], wd, x1)),
    }

def timed(calls, reps=60):
    for f, args in calls.values():
        jax.block_until_ready(f(*args))
    d = tempfile.mkdtemp()
    with jax.profiler.trace(d):
        for _ in range(reps):
            for f, args in calls.values():
                out = f(*args)
        jax.block_until_ready(out)
    tot = kernel_totals(load_trace(find_trace(d)))
    return {t["name"]: round(t["ms"] * 1e3 / t["count"], 2) for t in tot if t["count"] >= reps}

results = {"xla": timed(xla_ref())}
print("xla", results["xla"], flush=True)
variants = [(4, 3, 256, None), (2, 3, 256, None), (8, 3, 256, None), (4, 2, 256, None), (4, 4, 256, None),
            (4, 3, 128, None), (4, 3, 64, None), (4, 3, 256, 32), (4, 3, 256, 64), (2, 3, 128, 32), (1, 3, 256, None)]
base_bk, base_bn = fl._block_k, fl._block_n
for warps, stages, bkcap, bn in variants:
    fl._params = lambda: fl.plgpu.CompilerParams(num_warps=warps, num_stages=stages)
    fl._block_k = lambda K, rb: min(bkcap, 1 << (K.bit_length() - 1), max(16, 32768 // rb))
    fl._block_n = (lambda n: bn if n % bn == 0 else base_bn(n)) if bn else base_bn
    ks_ = kernels()
    calls = {"qkv": (ks_["qkv"], (x, wqkv, kv)), "attn_out": (ks_["attn_out"], (o, wo, x)),
             "gate_up": (ks_["gate_up"], (x, wgu)), "down": (ks_["down"], (h, wd, x))}
    try:
        # qkv donates kv: give it a fresh one each call
        calls["qkv"] = (lambda f: (lambda x, w: f(x, w, attn.KVCache(kv.k + 0, kv.v + 0))))(ks_["qkv"]), (x, wqkv)
        r = timed(calls)
    except Exception as e:
        r = {"error": str(e)[:200]}
    name = f"w{warps} s{stages} bk{bkcap} bn{bn or 'auto'}"
    results[name] = r
    print(name, {k: v for k, v in r.items() if "jaxspec" in k or k == "error"}, flush=True)
json.dump(results, open(os.path.join(os.environ.get("OUT", "/tmp"), "kb.json"), "w"), indent=1)
