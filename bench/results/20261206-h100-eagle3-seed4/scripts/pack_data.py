"""mix.npz (TokenDataset) -> a compact npz: the rows' tokens end to end as uint16, lengths, response starts, meta."""
import json, sys
import numpy as np
src, dst = sys.argv[1], sys.argv[2]
with np.load(src) as z:
    tokens, mask, lengths, meta = z["tokens"], z["loss_mask"], z["lengths"], str(z["meta"])
assert tokens.max() < 65536
starts = mask.argmax(axis=1).astype(np.int32)
flat = np.concatenate([tokens[i, :n] for i, n in enumerate(lengths)]).astype(np.uint16)
with open(dst, "wb") as f:
    np.savez_compressed(f, flat=flat, lengths=lengths.astype(np.int32), starts=starts, seq_len=np.int32(tokens.shape[1]),
                        meta=np.array(meta))
print("rows", len(lengths), "tokens", flat.size, "response", int(mask.sum()))
