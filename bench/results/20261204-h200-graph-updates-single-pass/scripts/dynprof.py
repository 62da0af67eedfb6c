"""Issue 20: host work per step of the dynamic policy against a fixed k = 3 in one LLM (policies swapped between
alternating rounds), SmolLM2 shapes with random weights (or a 2-layer model: "tiny"), EAGLE k = 3 at synthetic
acceptance 0.7, 256 tokens a request; medians of ROUNDS, then one cProfile round each: own time per step by
function, the largest differences. usage: dynprof.py HF_DIR B full|tiny [ROUNDS]"""
import cProfile, pstats, statistics, sys
sys.path.insert(0, "bench")
import numpy as np
from pathlib import Path
from host_work import tiny_model_dir
from jaxspec import LLM, SamplingParams
from jaxspec.engine.spec_policy import SpecPolicy
from jaxspec.loader import dummy_config
hf, B, size = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 7
d = tiny_model_dir(hf) if size == "tiny" else hf
llm = LLM.from_weights(dummy_config(d, "float32" if size == "tiny" else "bfloat16"), None, tokenizer=d,
                       load_format="dummy", layer_loop="scan",
                       speculative_config={"method": "eagle", "model": "-", "num_speculative_tokens": 3, "dynamic": True},
                       synthetic_acceptance=0.7, max_num_seqs=B, max_model_len=512, decode_buckets=[B],
                       prefill_buckets=[max(512, 64 * B)], warmup=False)
eng = llm.llm_engine
dyn = eng.spec_policy
dyn.set_step_times({(B, k): 0.001 * (1 + 0.1 * k) for k in range(4)})
pols = {"dynamic": dyn, "k=3": SpecPolicy(3, 3)}
prompts = np.random.default_rng(0).integers(0, 49152, (B, 32)).tolist()
p = SamplingParams(temperature=0, max_tokens=256, ignore_eos=True)
for pol in pols.values():
    eng.spec_policy = pol
    llm.generate(prompts, p, use_tqdm=False)
def run(name, prof=None):
    eng.spec_policy = pols[name]
    b = llm.get_metrics()
    if prof: prof.enable()
    llm.generate(prompts, p, use_tqdm=False)
    if prof: prof.disable()
    m = llm.get_metrics()
    steps = m["num_steps"] - b["num_steps"]
    wall, wait = m["wall_s"] - b["wall_s"], m["host_wait_s"] - b["host_wait_s"]
    return steps, (wall - wait) / steps * 1e3, wall / steps * 1e3
res = {n: [] for n in pols}
for r in range(rounds):
    for n in (list(pols) if r % 2 == 0 else list(pols)[::-1]):
        res[n].append(run(n))
for n, v in res.items():
    print(f"B={B} {size} {n:8s} steps {v[0][0]} host work ms/step {statistics.median(x[1] for x in v):.3f} "
          f"wall {statistics.median(x[2] for x in v):.3f}  host rounds {[round(x[1], 3) for x in v]}", flush=True)
own = {}
for n in pols:
    prof = cProfile.Profile()
    steps = run(n, prof)[0]
    o = own.setdefault(n, {})
    for (f, l, fn), (cc, nc, tt, ct, _c) in pstats.Stats(prof).stats.items():
        key = f"{f.split('/')[-1]}:{fn}"
        a = o.setdefault(key, [0.0, 0.0])
        a[0] += nc / steps; a[1] += tt / steps * 1e3
e, g = own["dynamic"], own["k=3"]
print(f"cProfile own ms/step: dynamic {sum(v[1] for v in e.values()):.3f}, k=3 {sum(v[1] for v in g.values()):.3f}; "
      "largest differences (calls/step, ms/step):")
z = [0.0, 0.0]
for k in sorted(set(e) | set(g), key=lambda k: -abs(e.get(k, z)[1] - g.get(k, z)[1]))[:25]:
    print(f"  {e.get(k, z)[0] - g.get(k, z)[0]:7.2f} {e.get(k, z)[1] - g.get(k, z)[1]:8.4f}  {k}")
