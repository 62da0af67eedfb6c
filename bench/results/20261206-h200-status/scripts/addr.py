"""Which buffers of the batch-1 decode step move between dispatches (an engine-like loop: dispatch N+1, then read N):
XLA updates a CUDA graph whose buffers moved since its last launch. Run from the tree to test (PYTHONPATH)."""
import os, sys, collections
sys.path.insert(0, ".")
import jax, numpy as np
from jaxspec.bench.data import load_hf_config
from jaxspec.bench.engine import _timing_batch
from jaxspec.config import EngineConfig
from jaxspec.engine.model_runner import ModelRunner
from jaxspec.models import llama
from jaxspec.models.kernel_config import KernelConfig
from jaxspec.sampling_params import SamplingParams
gpu = jax.default_backend() == "gpu"
cfg = llama.Config.from_hf(load_hf_config("smollm2-135m")[1], dtype="bfloat16").replace(
    attn_impl="pallas" if gpu else "xla", kernel=KernelConfig.from_env(), layer_loop="unroll" if gpu else "scan")
w = llama.init(cfg, jax.random.key(0))
ec = EngineConfig(max_model_len=4096, max_num_seqs=1, page_size=16, decode_buckets=[1], prefill_buckets=[16], max_num_batched_tokens=16)
ec.num_pages = ec.pages_per_seq
r = ModelRunner(ec, cfg, w, None, None)
r.sampling.set(0, SamplingParams(temperature=0.0), 0, 256)
slots, tables = _timing_batch(r, 1, 512)
def ptrs():
    d = {}
    for name in ("caches", "state"):
        for i, leaf in enumerate(jax.tree_util.tree_leaves(getattr(r, name))):
            d[f"{name}{i}"] = leaf.unsafe_buffer_pointer()
    for k, v in r._outputs.items():
        d[f"out{k[-1]}"] = v.unsafe_buffer_pointer() if not v.is_deleted() else None
    for k, v in r._plans.items():
        for i, a in enumerate(v):
            d[f"plan{i}"] = a.unsafe_buffer_pointer()
    return d
moves = collections.Counter()
prev = None
outs = []
for i in range(int(os.environ.get("N", 40))):
    out = r.decode(slots, tables)
    if outs:
        np.asarray(outs.pop(0))  # the engine reads step N after dispatching N + 1
    outs.append(out)
    cur = ptrs()
    if prev is not None:
        for k, v in cur.items():
            if k in prev and prev[k] != v:
                moves[k] += 1
    prev = cur
print("moved (count over dispatches):", dict(moves))
