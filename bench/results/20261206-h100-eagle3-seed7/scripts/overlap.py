"""The training prompts of the seed 4-7 mixes (decoded from the compact token mixes) against the 128 evaluated
prompts of each held-out split (seeds 3-7): exact and near duplicates (word 3-gram Jaccard >= 0.7), as the mix
builder's own filter counts them; a training prompt fed back is the positive control."""
import json
import numpy as np
from transformers import AutoTokenizer
from jaxspec.train.prompt_filters import Deduplicator

tok = AutoTokenizer.from_pretrained("weights/smollm2-135m-instruct/hf")


def train_prompts(path):
    with np.load(path) as z:
        flat, lengths, starts = z["flat"], z["lengths"], z["starts"]
    ends = np.cumsum(lengths)
    out = []
    for n, s, e in zip(lengths, starts, ends):
        text = tok.decode(flat[e - n:e - n + s])
        out.append(text.split("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0])
    return out


train = [p for s in (4, 5, 6, 7) for p in train_prompts(f".gpu/keep/mix-seed{s}.npz")]
dedup = Deduplicator()
for t in train:
    dedup.add(t)
res = {"train_prompts": len(train)}
splits = {3: "20261205-h100-heads-seed3/prompts", 4: "20261206-h100-eagle3-seed4/prompts",
          5: "20261206-h100-eagle3-seed5/prompts", 6: "20261206-h100-eagle3-seed7/prompts-seed6",
          7: "20261206-h100-eagle3-seed7/prompts-seed7"}
for seed, d in splits.items():
    rows = [json.loads(line)["prompt"] for line in open(f"bench/results/{d}/held_out.jsonl")][:128]
    counts = {}
    for r in rows:
        k = dedup.add(r) or "new"
        counts[k] = counts.get(k, 0) + 1
    res[f"held_out_seed{seed}"] = counts
print(json.dumps(res))
print("control:", [dedup.add(t) for t in train[:3]], repr(train[0][:120]))
