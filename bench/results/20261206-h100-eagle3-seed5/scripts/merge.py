"""Merge token datasets into one shuffled TokenDataset: each argument a TokenDataset npz or a compact one
(pack_data.py: flat uint16 tokens, lengths, response starts); the last argument is the output."""
import json, sys
import numpy as np
from jaxspec.train.data import TokenDataset

def load(path):
    with np.load(path) as z:
        if "flat" not in z.files:
            return TokenDataset.load(path)
        flat, lengths, starts, seq_len = z["flat"], z["lengths"], z["starts"], int(z["seq_len"])
        meta = json.loads(str(z["meta"]))
    tokens = np.zeros((len(lengths), seq_len), np.int32)
    mask = np.zeros((len(lengths), seq_len), np.uint8)
    ends = np.cumsum(lengths)
    for i, (n, s, e) in enumerate(zip(lengths, starts, ends)):
        tokens[i, :n] = flat[e - n:e]
        mask[i, s:n] = 1
    return TokenDataset(tokens, mask, lengths.astype(np.int32), meta)

parts = [load(p) for p in sys.argv[1:-1]]
assert len({d.seq_len for d in parts}) == 1
order = np.random.default_rng(5).permutation(sum(len(d) for d in parts))
cat = lambda k: np.concatenate([getattr(d, k) for d in parts])[order]
eos = sorted({e for d in parts for e in d.meta["eos_token_ids"]})
meta = {"merged_from": [d.meta for d in parts], "eos_token_ids": eos, "shuffle_seed": 5}
out = TokenDataset(cat("tokens"), cat("loss_mask"), cat("lengths"), meta)
out.save(sys.argv[-1])
print("merged", [len(d) for d in parts], "->", len(out), "rows,", int(out.loss_mask.sum()), "response tokens")
