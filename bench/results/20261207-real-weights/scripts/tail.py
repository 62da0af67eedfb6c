"""Per request, the engine step at which it finished: which held-out prompts set a sweep point's length.

usage (the repository root, real weights converted, the data under .gpu/data):
    PYTHONPATH=. python3 bench/results/20261207-real-weights/scripts/tail.py K N [START]
K drafts (0: no speculation), the N prompts from START of held_out.jsonl; greedy, 256 tokens, EOS ignored.
"""
import sys
import time

from transformers import AutoTokenizer

from jaxspec.bench import data
from jaxspec.engine.llm_engine import LLMEngine
from jaxspec.engine_args import EngineArgs
from jaxspec.sampling_params import SamplingParams

k, n = int(sys.argv[1]), int(sys.argv[2])
start = int(sys.argv[3]) if len(sys.argv) > 3 else 0
spec = {"method": "eagle3", "model": "weights/eagle3-smollm2-135m-instruct", "num_speculative_tokens": k} if k else None
eng = LLMEngine.from_engine_args(EngineArgs(model="weights/smollm2-135m-instruct", speculative_config=spec,
                                            max_num_seqs=n, max_model_len=512, decode_buckets=[n],
                                            prefill_buckets=[2048]))
tok = AutoTokenizer.from_pretrained("weights/smollm2-135m-instruct/hf")
prompts = data.dataset_prompts(".gpu/data/held_out.jsonl", start + n, tok)[start:]
params = SamplingParams(temperature=0.0, max_tokens=256, ignore_eos=True)
for i, p in enumerate(prompts):
    eng.add_request(str(start + i), {"prompt_token_ids": p}, params)
steps, done, texts, t = 0, {}, {}, time.time()
while eng.has_unfinished_requests():
    steps += 1
    for o in eng.step():
        if o.finished and o.request_id not in done:
            done[o.request_id], texts[o.request_id] = steps, o.outputs[0].text
print("k", k, "steps", steps, "seconds", round(time.time() - t, 1))
order = sorted(done.items(), key=lambda kv: -kv[1])
print("slowest (prompt index, step it finished):", order[:6])
print("median finishing step:", sorted(done.values())[len(done) // 2])
print("slowest answer:", repr(texts[order[0][0]][:300]))
