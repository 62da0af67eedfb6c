"""Seed 4's and seed 5's training prompts (decoded from the token mixes) against the held-out splits: exact and
near duplicates (word 3-gram Jaccard >= 0.7), as the mix builder's own filter counts them."""
import json, sys
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
        user = text.split("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0]
        out.append(user)
    return out
train = train_prompts(".gpu/keep/mix-seed4.npz.0") + train_prompts(".gpu/keep/mix-seed5.npz.0")
dedup = Deduplicator()
for t in train:
    dedup.add(t)
res = {"train_prompts": len(train)}
for name, path in [("held_out_seed3", "/tmp/ho3.jsonl"), ("held_out_seed4", "/tmp/ho4.jsonl"),
                   ("held_out_seed5", "bench/results/20261206-h100-eagle3-seed5/prompts/held_out.jsonl")]:
    rows = [json.loads(l)["prompt"] for l in open(path)][:128]
    counts = {}
    for r in rows:
        k = dedup.add(r) or "new"
        counts[k] = counts.get(k, 0) + 1
    res[name] = counts
print(json.dumps(res))
print("control:", [dedup.add(t) for t in train[:3]], repr(train[0][:120]))
