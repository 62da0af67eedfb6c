"""A head's ideal acceptance on greedy answer rows of a training mix, from the training unroll (CPU, fp32).

    PYTHONPATH=. python3 replay_acceptance.py --head DIR --mix mix.npz --gsm8k-train gsm8k_train.jsonl --n 24

For each row (GSM8K rows left out) the target's features and the head's k unrolled drafts at every anchor come from
one dense pass (jaxspec.train.losses, as in training); the answer is then walked as a greedy engine walks it: a step
starts at the last accepted position, accepts the leading drafts equal to the row's tokens, and adds one more.
"""
import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.bench.engine import load_target
from jaxspec.bench.throughput import model_source
from jaxspec.convert.eagle import load_eagle
from jaxspec.models import eagle
from jaxspec.tokenizer import load_tokenizer
from jaxspec.train import losses

ap = argparse.ArgumentParser()
ap.add_argument("--method", default="eagle")
ap.add_argument("--head", required=True)
ap.add_argument("--n", type=int, default=32, help="rows")
ap.add_argument("--tokens", type=int, default=256, help="answer tokens walked per row")
ap.add_argument("--k", type=int, default=3)
ap.add_argument("--seed", type=int, default=0, help="which rows")
ap.add_argument("--mix", required=True, help="the run's mix.npz (train-eagle --dataset-cache)")
ap.add_argument("--gsm8k-train", required=True, help="its rows are left out")
a = ap.parse_args()

src = model_source(argparse.Namespace(model="smollm2-135m-instruct", hf_config=None, load_format="auto",
                                      tokenizer=None))
tok = load_tokenizer(src.tokenizer_dir or src.ckpt)
tcfg, tw = load_target(src.ckpt, src.hf_config, False, None)[:2]
tcfg = tcfg.replace(attn_impl="xla", layer_loop="scan")
hcfg, hw = load_eagle(a.head, tcfg, a.method)
hcfg = hcfg.replace(attn_impl="xla", dtype="float32")
hw = jax.tree.map(lambda x: x.astype(jnp.float32) if getattr(x, "dtype", None) == jnp.bfloat16 else x, hw)
with np.load(a.mix) as f:  # read each array once (an npz member is decompressed at every access)
    tokens, loss_mask, lengths = f["tokens"], f["loss_mask"], f["lengths"]
gsm = {json.loads(line)["question"][:60] for line in open(a.gsm8k_train)}


def pick_rows() -> list[tuple[int, int]]:
    """(row, first answer position) of --n random rows whose prompt is not a GSM8K question."""
    rows = []
    for r in np.random.default_rng(a.seed).permutation(len(tokens)):
        start = int(np.argmax(loss_mask[r] > 0))
        prompt = tok.decode(tokens[r][:start].tolist())
        if not any(q in prompt for q in gsm):
            rows.append((int(r), start))
            if len(rows) == a.n:
                break
    return rows


@jax.jit
def drafts_of(tokens):
    """[T, k] drafts at every anchor (step j drafts x_{i+j+2}) and the target's greedy tokens [T]."""
    feats, _, logits = losses.target_pass(tw, tcfg, hcfg, tokens)
    outs = losses.unroll(hw, hcfg, tw.embed, tokens, feats.astype(jnp.float32), a.k)
    drafts = [eagle.to_target_ids(hw, hcfg, jnp.argmax(eagle.draft_logits(hw, hcfg, tw, o), -1)) for o in outs]
    return jnp.stack(drafts, -1)[0], jnp.argmax(logits, -1)[0]


steps, accepted = 0, np.zeros(a.k)  # replayed steps; how many accepted position j
forced = np.zeros((a.k, 2))  # teacher-forced (hits, positions) per unroll step
agree = []
rows = pick_rows()
for r, P in rows:
    s = tokens[r].astype(np.int32)
    L = min(int(lengths[r]), P + a.tokens)
    d, g = map(np.asarray, drafts_of(jnp.asarray(s[None])))
    agree.append(float((g[P - 1:L - 1] == s[P:L]).mean()))
    for j in range(a.k):
        for i in range(P - 1, L - 2 - j):
            forced[j] += (d[i, j] == s[i + 2 + j], 1)
    i = P - 1  # the anchor: the last position whose features the target gave; x_{i+1} is committed
    while i + 2 < L:
        m = 0
        while m < a.k and i + 2 + m < L and d[i, m] == s[i + 2 + m]:
            m += 1
        steps += 1
        accepted[:m] += 1
        i += m + 1
print(a.head, f"rows {len(rows)} (Magpie only), first {a.tokens} answer tokens")
print("replay: mean acceptance length", round(1 + accepted.sum() / steps, 3), "per position",
      np.round(accepted / steps, 3).tolist())
print("teacher-forced accuracy per unroll step", np.round(forced[:, 0] / forced[:, 1], 3).tolist(),
      "; fp32 argmax == the row's (bf16 GPU) token", round(float(np.mean(agree)), 4))
