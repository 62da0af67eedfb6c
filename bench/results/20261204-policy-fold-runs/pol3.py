"""H200 host: the dynamic policy's calls inside the engine (tiny random model, synthetic acceptance 0.7), policies
swapped between alternating rounds: 0aa58e1, 7c4d803 (9-call fold), the working tree (runs folded at once)."""
import importlib.util, statistics, sys, time
sys.path.insert(0, "bench")
import numpy as np
from pathlib import Path
from host_work import tiny_model_dir
from jaxspec import LLM, SamplingParams
from jaxspec.engine import spec_policy
from jaxspec.loader import dummy_config
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m
mods = {"0aa58e1": load("a", ".gpu/sp_0aa58e1.py"), "7c4d803": load("b", ".gpu/sp_7c4d803.py"), "tree": spec_policy}
d = tiny_model_dir(Path(sys.argv[1])); B = int(sys.argv[2])
llm = LLM.from_weights(dummy_config(d, "float32"), None, tokenizer=d, load_format="dummy",
                       speculative_config={"method": "eagle", "model": "-", "num_speculative_tokens": 3},
                       synthetic_acceptance=0.7, max_num_seqs=B, max_model_len=512, decode_buckets=[B],
                       prefill_buckets=[2048], warmup=False)
eng = llm.llm_engine
def timed(pol, acc):
    for meth in ("choose", "observe", "reset_slots"):
        f = getattr(type(pol), meth)
        def w(*a, _f=f, **k):
            t = time.perf_counter(); r = _f(pol, *a, **k); acc[0] += time.perf_counter() - t; return r
        setattr(pol, meth, w)
    return pol
prompts = np.random.default_rng(0).integers(0, 49152, (B, 32)).tolist()
p = SamplingParams(temperature=0, max_tokens=256, ignore_eos=True)
res = {n: [] for n in mods}
for rep in range(8):
    for n, m in mods.items():
        pol = m.DynamicPolicy(3, B); pol.set_step_times({(B, k): 0.004 for k in range(4)})
        acc = [0.0]; eng.spec_policy = timed(pol, acc)
        b = llm.get_metrics()["num_steps"]
        llm.generate(prompts, p, use_tqdm=False)
        if rep:
            res[n].append(acc[0] / (llm.get_metrics()["num_steps"] - b) * 1e3)
for n, v in res.items():
    print(f"B={B} {n:8s} policy calls {statistics.median(v):.4f} ms/step  runs {[round(x, 4) for x in v]}")
