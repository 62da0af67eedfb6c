"""Steps a batch of held-out prompts takes end to end (greedy, 256 tokens each, EOS ignored), and the step each
request finished at: what sets a sweep point's length, per speculative config.

usage (the repository root, real weights converted, held_out.jsonl under .gpu/data):
    PYTHONPATH=. python3 bench/results/20261207-cpu-lookup-fallback/scripts/run_length.py N SPEC_JSON
"""
import json
import sys
import time

from transformers import AutoTokenizer

from jaxspec.bench import data
from jaxspec.engine.llm_engine import LLMEngine
from jaxspec.engine_args import EngineArgs
from jaxspec.sampling_params import SamplingParams

n, spec = int(sys.argv[1]), json.loads(sys.argv[2])
eng = LLMEngine.from_engine_args(EngineArgs(model="weights/smollm2-135m-instruct", speculative_config=spec,
                                            max_num_seqs=n, max_model_len=512, decode_buckets=[n],
                                            prefill_buckets=[2048]))
tok = AutoTokenizer.from_pretrained("weights/smollm2-135m-instruct/hf")
params = SamplingParams(temperature=0.0, max_tokens=256, ignore_eos=True)
for i, p in enumerate(data.dataset_prompts(".gpu/data/held_out.jsonl", n, tok)):
    eng.add_request(str(i), {"prompt_token_ids": p}, params)
steps, done, outputs, t = 0, {}, {}, time.time()
while eng.has_unfinished_requests():
    steps += 1
    for o in eng.step():
        if o.finished and o.request_id not in done:
            done[o.request_id], outputs[o.request_id] = steps, o.outputs[0].token_ids
finish = sorted(done.values())
print(json.dumps({"num_prompts": n, "speculative_config": spec, "steps": steps, "seconds": round(time.time() - t, 1),
                  "finish_step_median": finish[len(finish) // 2], "finish_step_p90": finish[int(0.9 * len(finish))],
                  "slowest": sorted(done.items(), key=lambda kv: -kv[1])[:4],
                  "outputs_hash": hash(tuple(tuple(outputs[str(i)]) for i in range(n))) & 0xFFFFFFFF}))
