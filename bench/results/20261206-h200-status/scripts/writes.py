"""How often the runner writes a decode step's plan arrays to the device (CPU; a 2-layer model with SmolLM2's
vocabulary, random weights, EAGLE k at synthetic acceptance 0.6 or plain decoding, 32-token random prompts, greedy,
EOS ignored): decode plans written over decode steps, with pages as needed (page_lookahead 0) and given ahead.

    python writes.py K BATCH MAX_TOKENS PAGE_LOOKAHEAD"""
import sys
sys.path.insert(0, "bench")
sys.path.insert(0, ".")
import numpy as np  # noqa: E402
import host_work  # noqa: E402
import jaxspec.engine.model_runner as mr  # noqa: E402
from jaxspec import LLM, SamplingParams, presets  # noqa: E402
from jaxspec.loader import dummy_config  # noqa: E402
from jaxspec.resolve import resolve_model  # noqa: E402

k, batch, max_tokens, ahead = (int(a) for a in sys.argv[1:5])
model_dir = host_work.tiny_model_dir(resolve_model(presets.DEFAULT_PRESET).hf_dir)
spec = {"method": "eagle", "model": "-", "num_speculative_tokens": k} if k else None
llm = LLM.from_weights(dummy_config(model_dir, "float32"), None, tokenizer=model_dir, load_format="dummy",
                       speculative_config=spec, synthetic_acceptance=0.6 if k else None, max_num_seqs=batch,
                       max_model_len=512, decode_buckets=[batch], prefill_buckets=[256, 2048], warmup=False,
                       page_lookahead=ahead)
runner = llm.llm_engine.runner
count = {"decode plans": 0, "written": 0}
place = runner._place


def counting(step, size, plan):
    if step.__name__ == "decode_step":
        held = runner._plans_held.get((step.__name__, size))
        count["decode plans"] += 1
        count["written"] += held is None or not mr._equal(held, plan)
    return place(step, size, plan)


runner._place = counting
prompts = np.random.default_rng(0).integers(0, 49152, (batch, 32)).tolist()
llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True), use_tqdm=False)
print(f"k={k} batch={batch} page_lookahead={ahead}: {count['written']} of {count['decode plans']} decode plans "
      f"written ({count['written'] / count['decode plans']:.2f})")
