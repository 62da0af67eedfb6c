"""Why each repeated generate in one process is slower: the same 96-prompt greedy generate, repeated, with
interventions between runs; per run the host time split by engine phase."""
import gc, json, resource, sys, time
import numpy as np
import os
from jaxspec import LLM, SamplingParams
from jaxspec.bench import data

HEAD = {"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}
MODEL, DATA = "weights/smollm2-135m-instruct", sys.argv[1]
N, MAXTOK = int(os.environ.get("N", 96)), int(os.environ.get("MAXTOK", 1024))
out_path = sys.argv[2]

def build():
    return LLM(MODEL, speculative_config=HEAD, max_num_seqs=96, max_model_len=1280, max_num_batched_tokens=2048,
               decode_buckets=[96], prefill_buckets=[2048], num_pages=96 * 80 + 1)

llm = build()
prompts = data.dataset_prompts(DATA, N, llm.get_tokenizer())
params = [SamplingParams(temperature=0.0, max_tokens=MAXTOK, seed=i) for i in range(N)]

class Timer:
    def __init__(self): self.t = {}
    def wrap(self, obj, name, key):
        f = getattr(obj, name)
        def g(*a, **kw):
            t0 = time.perf_counter()
            try: return f(*a, **kw)
            finally: self.t[key] = self.t.get(key, 0.0) + time.perf_counter() - t0
        setattr(obj, name, g)

def instrument(llm):
    T = Timer(); e = llm.llm_engine
    T.wrap(e.scheduler, "schedule", "schedule"); T.wrap(e.scheduler, "commit", "commit")
    T.wrap(e.runner, "decode", "dispatch_decode"); T.wrap(e.runner, "prefill", "dispatch_prefill")
    T.wrap(e, "_fetch", "fetch"); T.wrap(e, "_outputs", "outputs")
    return T

timers = {id(llm): instrument(llm)}
llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
rows = []
def run(tag, llm, before=None):
    if before: before()
    e, T = llm.llm_engine, timers[id(llm)]
    T.t.clear()
    w0, h0, s0 = e.times.wall_s, e.times.host_wait_s, e.times.num_steps
    c0, t0 = time.process_time(), time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    el, cpu = time.perf_counter() - t0, time.process_time() - c0
    steps = e.times.num_steps - s0
    ntok = sum(len(o.outputs[0].token_ids) for o in outs)
    r = {"tag": tag, "tok_s": ntok / el, "steps": steps, "wall_ms": 1e3 * (e.times.wall_s - w0) / steps,
         "host_wait_ms": 1e3 * (e.times.host_wait_s - h0) / steps, "cpu_over_wall": cpu / el,
         "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "gc_objects": len(gc.get_objects()),
         "gc_counts": gc.get_count(), **{k + "_ms": 1e3 * v / steps for k, v in T.t.items()}}
    rows.append(r)
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)

def reset_pages(): llm.llm_engine.block_manager.reset()
def gc_freeze(): gc.collect(); gc.freeze()
run("r1", llm); run("r2", llm); run("r3", llm)
run("r4 pages reset", llm, reset_pages); run("r5 pages reset", llm, reset_pages)
run("r6 gc.collect+freeze", llm, gc_freeze)
gc.disable(); run("r7 gc disabled", llm); gc.enable()
llm2 = build(); timers[id(llm2)] = instrument(llm2)
llm2.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
run("r8 new LLM", llm2); run("r9 new LLM", llm2)
del llm2; gc.collect()
run("r10 old LLM", llm)
json.dump(rows, open(out_path, "w"), indent=1)
