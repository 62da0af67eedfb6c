"""H200 host: in-engine cost of the dynamic policy at 256 rows against fixed k=3: the working tree (take + standing
decisions that double), cd256d3 (take), c263694 (before); tiny model (host-bound). Alternating rounds, medians.
arg: tokenizer dir."""
import importlib.util, statistics, sys, time
sys.path.insert(0, "bench")
TOK = sys.argv[1]; sys.argv = sys.argv[:1]
import numpy as np
from pathlib import Path
from host_work import tiny_model_dir
from jaxspec import LLM, SamplingParams
from jaxspec.engine import logprob_output, spec_policy
from jaxspec.loader import dummy_config
spec = importlib.util.spec_from_file_location("spec_policy_old", ".gpu/spec_policy_old.py")
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
spec2 = importlib.util.spec_from_file_location("spec_policy_take", ".gpu/spec_policy_take.py")
take = importlib.util.module_from_spec(spec2); spec2.loader.exec_module(take)
d = tiny_model_dir(Path(TOK))

def make(B):
    return LLM.from_weights(dummy_config(d, "float32"), None, tokenizer=d, load_format="dummy",
                            speculative_config={"method": "eagle", "model": "-", "num_speculative_tokens": 3},
                            synthetic_acceptance=0.7, max_num_seqs=B, max_model_len=512, decode_buckets=[B],
                            prefill_buckets=[2048], warmup=False)

def work(llm, params, prompts):
    before = llm.get_metrics()
    llm.generate(prompts, params, use_tqdm=False)
    m = llm.get_metrics(); steps = m["num_steps"] - before["num_steps"]
    return (m["wall_s"] - before["wall_s"] - (m["host_wait_s"] - before["host_wait_s"])) / steps * 1e3

def timed(pol, acc):
    for meth in ("choose", "observe", "reset_slots"):
        f = getattr(type(pol), meth)
        def w(*a, _f=f, **k):
            t = time.perf_counter(); r = _f(pol, *a, **k); acc[0] += time.perf_counter() - t; return r
        setattr(pol, meth, w)
    return pol

rows = []
B = 256
llm = make(B); eng = llm.llm_engine
prompts = np.random.default_rng(0).integers(0, 49152, (B, 32)).tolist()
p = SamplingParams(temperature=0, max_tokens=256, ignore_eos=True)
pols = {"fixed": lambda: spec_policy.SpecPolicy(3), "dyn-new": lambda: spec_policy.DynamicPolicy(3, B),
        "dyn-take": lambda: take.DynamicPolicy(3, B), "dyn-old": lambda: old.DynamicPolicy(3, B)}
res = {n: [] for n in pols}; inpol = {n: [] for n in pols}
for rep in range(7):
    for n, mk in pols.items():
        pol = mk()
        if hasattr(pol, "set_step_times"):
            pol.set_step_times({(B, k): 0.004 for k in range(4)})
        acc = [0.0]; eng.spec_policy = timed(pol, acc)
        before = llm.get_metrics()["num_steps"]
        w = work(llm, p, prompts)
        if rep:
            res[n].append(w); inpol[n].append(acc[0] / (llm.get_metrics()["num_steps"] - before) * 1e3)
for n in pols:
    rows.append(f"policy {n:8s} B=256 host work ms/step {statistics.median(res[n]):.3f} (policy calls {statistics.median(inpol[n]):.3f}) runs {[round(x, 2) for x in res[n]]}")
print("\n".join(rows))
