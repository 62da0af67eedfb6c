"""Engine A/B in one LLM, variants alternating round by round: the step output's copy to the host started at
dispatch (copy_to_host_async, HEAD) or left to the fetch (np.asarray). SmolLM2 shapes, random weights, EAGLE k = 3
at synthetic acceptance 0.6, random 128-token prompts, EOS ignored; 1 and 96 prompts. usage: ab_copy.py HF_DIR"""
import statistics, sys, time, types
import jax
import numpy as np
from pathlib import Path
from jaxspec import LLM, SamplingParams
from jaxspec.engine import model_runner
from jaxspec.loader import dummy_config
hf = Path(sys.argv[1]); rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
llm = LLM.from_weights(dummy_config(hf, "bfloat16"), None, tokenizer=hf, load_format="dummy",
                       speculative_config={"method": "eagle", "model": "-", "num_speculative_tokens": 3},
                       synthetic_acceptance=0.6, max_num_seqs=96, max_model_len=1024, decode_buckets=[1, 96],
                       prefill_buckets=[2048], warmup=False)
runner = llm.llm_engine.runner
def _run_nocopy(self, step, size, spec, *plan, log=None):
    fn = self._program(step, size, spec)
    plan = self._place(step, size, plan)
    self.caches, self.state, out = fn(self.tw, self.dw, self.caches, self.state, *plan, spec)
    return out.addressable_data(0) if self._local else out
variants = {"async copy": None, "copy at fetch": types.MethodType(_run_nocopy, runner)}
def use(v):
    if v is None: runner.__dict__.pop("_run", None)
    else: runner._run = v
rng = np.random.default_rng(0)
for n, tokens in ((1, 512), (96, 512)):
    prompts = rng.integers(0, 49152, (n, 128)).tolist()
    p = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    for v in variants.values():
        use(v); llm.generate(prompts, p, use_tqdm=False)
    res = {name: [] for name in variants}
    for r in range(rounds):
        for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            use(variants[name])
            b = llm.get_metrics(); t0 = time.perf_counter()
            llm.generate(prompts, p, use_tqdm=False)
            el = time.perf_counter() - t0
            m = llm.get_metrics(); steps = m["num_steps"] - b["num_steps"]
            wall, wait = m["wall_s"] - b["wall_s"], m["host_wait_s"] - b["host_wait_s"]
            res[name].append((n * tokens / el, wall / steps * 1e3, (wall - wait) / steps * 1e3, steps))
    for name, v in res.items():
        med = lambda i: statistics.median(x[i] for x in v)  # noqa
        print(f"prompts {n:3d} {name:14s} out tok/s {med(0):9.0f}  ms/step {med(1):.3f}  host work {med(2):.3f}  "
              f"steps {v[0][3]}  tok/s rounds {[round(x[0]) for x in v]}", flush=True)
