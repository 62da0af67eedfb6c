"""Two executables of one decode program, each with its own output buffer kept at one address (donated back two
steps later, after its step was read), alternating step by step: no CUDA-graph re-record at any launch; against
ModelRunner.decode (HEAD: a fresh output each step, so XLA re-records the program's graph at every launch).
Engine-like loop: dispatch step N, then read step N-1. Random SmolLM2 weights. usage: twin.py B K [JSON]"""
import json, statistics, sys, time
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, "bench")
from jaxspec.bench.data import load_hf_config
from jaxspec.bench.engine import _timing_batch
from jaxspec.config import EngineConfig, SpeculativeConfig
from jaxspec.engine.model_runner import ModelRunner
from jaxspec.engine.step import SCRATCH_OPTION, decode_step, stable_scratch_supported
from jaxspec.models import eagle, llama
from jaxspec.models.kernel_config import KernelConfig
from jaxspec.sampling_params import SamplingParams
B, k = int(sys.argv[1]), int(sys.argv[2])
sampling = SamplingParams(**({"temperature": 0.0} | (json.loads(sys.argv[3]) if len(sys.argv) > 3 else {})))
cfg = llama.Config.from_hf(load_hf_config("smollm2-135m")[1], dtype="bfloat16").replace(
    attn_impl="pallas", kernel=KernelConfig.from_env(), layer_loop="unroll")
w = llama.init(cfg, jax.random.key(0))
dcfg = eagle.EagleConfig.from_target(cfg, "eagle") if k else None
dw = eagle.init(dcfg, jax.random.key(1)) if k else None
context, n = 512, 200
ec = EngineConfig(max_model_len=context + 12 * n * (k + 1) + 64, max_num_seqs=B, page_size=16, decode_buckets=[B],
                  prefill_buckets=[16], max_num_batched_tokens=16,
                  speculative=SpeculativeConfig("eagle", "-", k) if k else None)
ec.num_pages = B * ec.pages_per_seq
runner = ModelRunner(ec, cfg, w, dcfg, dw)
for slot in range(B):
    runner.sampling.set(slot, sampling, slot, context // 2)
slots, tables = _timing_batch(runner, B, context)

def wrapper():
    def run(tw, dw, caches, state, out, rows, sampling, spec):
        caches, state, result = decode_step(tw, dw, caches, state, rows, sampling, spec)
        return caches, state, jax.lax.dynamic_update_slice(out, result, (0, 0))
    run.__name__ = "decode_step"
    return run

step, size, spec, rows, samp = runner.decode_plan(slots, tables)
opts = dict([SCRATCH_OPTION]) if stable_scratch_supported() else {}
if size * (k + 1) >= spec.target.kernel.cublas_min_tokens:
    opts["xla_gpu_enable_triton_gemm"] = False
fns = [jax.jit(wrapper(), static_argnames=("spec",), donate_argnames=("caches", "state", "out"),
               compiler_options=opts or None) for _ in range(2)]
shape = runner.decode(slots, tables).shape
bufs = [jax.device_put(np.zeros(shape, np.int32), jax.local_devices()[0]) for _ in range(2)]

def head_step(i):
    return runner.decode(slots, tables)

def twin_step(i):
    step, size, spec, rows, samp = runner.decode_plan(slots, tables)
    plan = runner._place(step, size, (rows, samp))
    j = i % 2
    runner.caches, runner.state, out = fns[j](runner.tw, runner.dw, runner.caches, runner.state, bufs[j], *plan,
                                              spec=spec)
    bufs[j] = out
    out.copy_to_host_async()
    return out

def loop(fn, steps):
    prev, t0 = None, time.perf_counter()
    for i in range(steps):
        out = fn(i)
        if prev is not None:
            np.asarray(prev)
        prev = out
    np.asarray(prev)
    return (time.perf_counter() - t0) / steps * 1e3

for f in (head_step, twin_step):
    loop(f, 10)
res = {"head": [], "twin": []}
for r in range(5):
    for name in (("head", "twin") if r % 2 == 0 else ("twin", "head")):
        runner.state = jax.block_until_ready(runner.state)
        res[name].append(loop(head_step if name == "head" else twin_step, n))
a, b = (np.asarray(head_step(0)), np.asarray(twin_step(0)))
for name, v in res.items():
    print(f"B={B} k={k} {sys.argv[3] if len(sys.argv) > 3 else 'greedy':40s} {name}: ms/step "
          f"{statistics.median(v):.3f}  rounds {[round(x, 3) for x in v]}", flush=True)
