"""The compact npz back to a TokenDataset file (mix.npz)."""
import json, sys
import numpy as np
sys.path.insert(0, ".")
from jaxspec.train.data import TokenDataset
src, dst = sys.argv[1], sys.argv[2]
with np.load(src) as z:
    flat, lengths, starts, T, meta = z["flat"], z["lengths"], z["starts"], int(z["seq_len"]), json.loads(str(z["meta"]))
tokens = np.zeros((len(lengths), T), np.int32)
mask = np.zeros((len(lengths), T), np.uint8)
off = 0
for i, (n, s) in enumerate(zip(lengths, starts)):
    tokens[i, :n] = flat[off:off + n]
    mask[i, s:n] = 1
    off += n
TokenDataset(tokens, mask, lengths, meta).save(dst)
print("rows", len(lengths), "response", int(mask.sum()))
