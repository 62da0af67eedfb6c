"""Profile host work of greedy vs logprobs+presence in one process: per-step own time by function, diff."""
import cProfile, pstats, sys, time
sys.path.insert(0, "bench"); ARGS = sys.argv[1:]; sys.argv = ["x"]
import numpy as np
from host_work import tiny_model_dir
from jaxspec import LLM, SamplingParams, presets
from jaxspec.loader import dummy_config
from jaxspec.resolve import resolve_model
from pathlib import Path
hf = Path(ARGS[0]) if ARGS else resolve_model(presets.DEFAULT_PRESET).hf_dir
d = tiny_model_dir(hf)
B = 96
llm = LLM.from_weights(dummy_config(d, "float32"), None, tokenizer=d, load_format="dummy",
                       speculative_config={"method": "eagle", "model": "-", "num_speculative_tokens": 3},
                       synthetic_acceptance=0.7, max_num_seqs=B, max_model_len=512, decode_buckets=[B],
                       prefill_buckets=[256, 2048], warmup=False)
prompts = np.random.default_rng(0).integers(0, 49152, (B, 32)).tolist()
settings = {"greedy": {}, "ext": dict(logprobs=5, presence_penalty=0.5)}
res = {}
for name, o in settings.items():
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, **o), use_tqdm=False)
for rep in range(2):
  for name, o in settings.items():
    p = SamplingParams(temperature=0, max_tokens=256, ignore_eos=True, **o)
    before = llm.get_metrics()
    prof = cProfile.Profile(); prof.enable()
    llm.generate(prompts, p, use_tqdm=False)
    prof.disable()
    m = llm.get_metrics(); steps = m["num_steps"] - before["num_steps"]
    st = pstats.Stats(prof).stats
    own = {}
    for (f, l, fn), (cc, nc, tt, ct, _callers) in st.items():
        key = f"{f.split('/')[-1]}:{fn}"
        if "asarray" in fn: continue
        own[key] = own.get(key, 0) + tt / steps * 1e3
    res[name] = own
    print(name, steps, "steps; host ms/step (own, excl asarray):", round(sum(own.values()), 3),
          "| work", round((m["wall_s"]-before["wall_s"]-(m["host_wait_s"]-before["host_wait_s"]))/steps*1e3, 3))
g, e = res["greedy"], res["ext"]
diff = sorted(((e.get(k, 0) - g.get(k, 0), k) for k in set(g) | set(e)), reverse=True)
for dv, k in diff[:30]: print(f"{dv:8.4f} {e.get(k,0):8.4f} {k}")
import pstats as P
print("--- bottom (ext cheaper)")
for dv, k in diff[-8:]: print(f"{dv:8.4f} {e.get(k,0):8.4f} {k}")
print("--- greedy top own")
for k, v in sorted(g.items(), key=lambda x: -x[1])[:25]: print(f"{v:8.4f} {k}")
