"""Which held-out prompt overlap.py counted as a near duplicate, and of what (within the split or a training prompt)."""
import json, sys
sys.argv=['x']
exec(open('bench/results/20261206-h100-eagle3-seed7/scripts/overlap.py').read().split("train = [")[0])
from jaxspec.train.prompt_filters import _jaccard, _ngrams, normalize
import zlib
def sh(t): return frozenset(zlib.crc32(" ".join(g).encode()) for g in _ngrams(normalize(t).split(), 3))
ho=[json.loads(l)["prompt"] for l in open("bench/results/20261206-h100-eagle3-seed7/prompts-seed6/held_out.jsonl")][:128]
hs=[sh(t) for t in ho]
for i in range(128):
    for j in range(i):
        if _jaccard(hs[i], hs[j]) >= 0.7: print("within held-out", i, j, repr(ho[i][:100]), repr(ho[j][:100]))
for s in (4,5,6,7):
    for t in train_prompts(f".gpu/keep/mix-seed{s}.npz"):
        st=sh(t)
        for i,h in enumerate(hs):
            if h and _jaccard(st, h) >= 0.7: print("train seed", s, i, repr(ho[i][:150]), "||", repr(t[:150]))
