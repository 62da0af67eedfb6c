"""H200 host: in-engine cost of the dynamic policy (new vs HEAD's) against fixed k=3 at 256 rows, and of the
logprob rows (split_decode copying vs views) for logprobs=5+presence 0.5 at 96 rows; tiny model (host-bound).
Alternating rounds, medians. arg: tokenizer dir."""
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
        "dyn-old": lambda: old.DynamicPolicy(3, B)}
res = {n: [] for n in pols}; inpol = {n: [] for n in pols}
for rep in range(6):
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
del llm, eng
B = 96
llm = make(B)
prompts = prompts[:B]
new_split = logprob_output.split_decode
def old_split(out, k):
    if out.shape[1] == k + 2:
        return out, None
    return out[:, :k + 2], out[:, k + 2:].reshape(out.shape[0], k + 1, -1)
modes = {"greedy": ({}, new_split), "ext-views": (dict(logprobs=5, presence_penalty=0.5), old_split),
         "ext-copy": (dict(logprobs=5, presence_penalty=0.5), new_split)}
res = {n: [] for n in modes}
for rep in range(6):
    for n, (o, split) in modes.items():
        logprob_output.split_decode = split
        w = work(llm, SamplingParams(temperature=0, max_tokens=512, ignore_eos=True, **o), prompts)
        if rep:
            res[n].append(w)
for n in modes:
    rows.append(f"logprobs {n:9s} B=96 host work ms/step {statistics.median(res[n]):.3f} runs {[round(x, 2) for x in res[n]]}")
print("\n".join(rows))
