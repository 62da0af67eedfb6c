"""Does a fresh output buffer make XLA re-record the command buffer at every launch? A chain of L small matmuls
(L x ~3 kernels, like a decode step at batch 1) with its state donated; host time per launch (not blocking),
medians of 300 launches, for: a fresh output each call; the output written into the donated state instead; that
plus a tiny program reading it out; compiled with the engine's SKIP_TEMP option."""
import statistics, sys, time
import jax, jax.numpy as jnp
L = int(sys.argv[1]) if len(sys.argv) > 1 else 60
opts = {"xla_gpu_command_buffer_update_mode": "SKIP_TEMP"} if jax.default_backend() == "gpu" else {}
def chain(ws, x):
    h = x
    for i in range(L):
        h = jnp.tanh(h @ ws[i]) + x
    return h
def fresh(ws, state, x):
    h = chain(ws, x)
    return state + h[:, :8].sum(), h[:, :8].astype(jnp.int32)
def stable(ws, state, ring, x, parity):
    h = chain(ws, x)
    return state + h[:, :8].sum(), jax.lax.dynamic_update_index_in_dim(ring, h[:, :8].astype(jnp.int32), parity, 0)
extract = jax.jit(lambda ring, parity: jax.lax.dynamic_index_in_dim(ring, parity, 0, keepdims=False))
f1 = jax.jit(fresh, donate_argnums=1, compiler_options=opts)
f2 = jax.jit(stable, donate_argnums=(1, 2), compiler_options=opts)
ws = jax.random.normal(jax.random.key(0), (L, 256, 256), jnp.bfloat16) * 0.05
x = jnp.ones((1, 256), jnp.bfloat16)
state = jnp.zeros((1, 8), jnp.bfloat16)
ring = jnp.zeros((2, 1, 8), jnp.int32)
par = [jnp.int32(0), jnp.int32(1)]
def bench(name, call, n=300):
    ts = []
    for i in range(n + 20):
        t0 = time.perf_counter(); out = call(i); ts.append(time.perf_counter() - t0)
        if i % 2: jax.block_until_ready(out)  # at most two in flight, like the engine
    jax.block_until_ready(out)
    print(f"L={L} {name:28s} host per launch {statistics.median(ts[20:]) * 1e6:7.1f} us", flush=True)
def c1(i):
    global state
    state, out = f1(ws, state, x); return out
def c2(i):
    global state, ring
    state, ring = f2(ws, state, ring, x, par[i % 2]); return ring
def c2s(i):
    global state, ring
    state, ring = f2(ws, state, ring, x, par[0]); return ring
def c3s(i):
    global state, ring
    state, ring = f2(ws, state, ring, x, par[0]); out = extract(ring, par[0]); out.copy_to_host_async(); return out
def c3(i):
    global state, ring
    state, ring = f2(ws, state, ring, x, par[i % 2]); out = extract(ring, par[i % 2]); out.copy_to_host_async(); return out
def c1c(i):
    global state
    state, out = f1(ws, state, x); out.copy_to_host_async(); return out
for rep in range(2):
    bench("fresh output", c1)
    bench("fresh output + host copy", c1c)
    bench("ring, alternating parity", c2)
    bench("ring, alternating + extract", c3)
    bench("ring, one parity", c2s)
    bench("ring, one parity + extract", c3s)
# which variants re-record the command buffer at every launch: a traced run of 40 launches each
import gzip, glob, json, os, shutil
for name, call in (("fresh output", c1), ("ring, one parity", c2s), ("ring, alternating parity", c2)):
    d = f"/tmp/cbuf-trace-{name.replace(' ', '_').replace(',', '')}"
    shutil.rmtree(d, ignore_errors=True)
    with jax.profiler.trace(d):
        for i in range(40):
            out = call(i)
            if i % 2: jax.block_until_ready(out)
        jax.block_until_ready(out)
    f = sorted(glob.glob(f"{d}/plugins/profile/*/*.trace.json.gz"))[-1]
    ev = json.load(gzip.open(f, "rt"))["traceEvents"]
    count = lambda s: sum(1 for e in ev if e.get("ph") == "X" and e.get("name", "").startswith(s))  # noqa
    print(f"L={L} {name:28s} traced 40 launches: command_buffer::update x{count('command_buffer::update')}, "
          f"execute x{count('command_buffer::execute')}", flush=True)
