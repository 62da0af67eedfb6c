"""Token ids of a greedy generate with random SmolLM2 weights and a random EAGLE head (k = 3, the target's own
acceptance), written to a JSON file: run once per XLA_FLAGS setting and compare the files.

    python same.py OUT.json NUM_SCHEDULER_STEPS
"""

import json
import sys

import numpy as np

from jaxspec import LLM, SamplingParams
from jaxspec.bench.data import load_hf_config
from jaxspec.models import llama

out, steps = sys.argv[1], int(sys.argv[2])
_, hf = load_hf_config("smollm2-135m")
llm = LLM.from_weights(llama.Config.from_hf(hf, "bfloat16"), load_format="dummy", max_model_len=512, max_num_seqs=8,
                       decode_buckets=[8], prefill_buckets=[256], max_num_batched_tokens=256, num_scheduler_steps=steps,
                       speculative_config={"method": "eagle", "model": "dummy", "num_speculative_tokens": 3})
rng = np.random.default_rng(0)
prompts = [{"prompt_token_ids": rng.integers(10, 40000, 32).tolist()} for _ in range(8)]
params = [SamplingParams(temperature=0, max_tokens=40 + 9 * i, ignore_eos=True) for i in range(8)]
res = llm.generate(prompts, params, use_tqdm=False)
json.dump([list(r.outputs[0].token_ids) for r in res], open(out, "w"))
print("wrote", out, sum(len(r.outputs[0].token_ids) for r in res), "tokens")
