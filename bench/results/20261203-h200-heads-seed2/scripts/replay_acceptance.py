"""PYTHONPATH=. python3 replay_acceptance.py --head DIR --mix mix.npz --gsm8k-train gsm8k_train.jsonl --n 24

Ideal (replayed) acceptance of a head on greedy answer rows of mix.npz, with the training unroll (CPU, fp32)."""
import argparse, json, sys
import numpy as np, jax, jax.numpy as jnp
from jaxspec.bench.engine import load_target
from jaxspec.bench.throughput import model_source
from jaxspec.tokenizer import load_tokenizer
from jaxspec.convert.eagle import load_eagle
from jaxspec.models import eagle
from jaxspec.train import losses

ap = argparse.ArgumentParser()
ap.add_argument("--method", default="eagle"); ap.add_argument("--head", required=True)
ap.add_argument("--n", type=int, default=32); ap.add_argument("--tokens", type=int, default=256); ap.add_argument("--k", type=int, default=3)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--mix", required=True, help="the run's mix.npz (train-eagle --dataset-cache)")
ap.add_argument("--gsm8k-train", required=True, help="its rows are left out")
a = ap.parse_args()
src = model_source(argparse.Namespace(model="smollm2-135m-instruct", hf_config=None, load_format="auto", tokenizer=None))
tok = load_tokenizer(src.tokenizer_dir or src.ckpt)
tcfg, tw = load_target(src.ckpt, src.hf_config, False, None)[:2]
dcfg = tcfg.replace(attn_impl="xla", layer_loop="scan")
hcfg, hw = load_eagle(a.head, dcfg, a.method)
hcfg = hcfg.replace(attn_impl="xla", dtype="float32")
hw = jax.tree.map(lambda x: x.astype(jnp.float32) if hasattr(x, "dtype") and x.dtype == jnp.bfloat16 else x, hw)
d = np.load(a.mix)
gsm = {json.loads(line)["question"][:60] for line in open(a.gsm8k_train)}
rng = np.random.default_rng(a.seed)
rows = []
for r in rng.permutation(len(d["tokens"])):
    P = int(np.argmax(d["loss_mask"][r] > 0))
    text = tok.decode(d["tokens"][r][:P].tolist())
    if any(q in text for q in gsm):
        continue
    rows.append(r)
    if len(rows) == a.n:
        break

@jax.jit
def drafts_of(tokens):
    feats, hidden, logits = losses.target_pass(tw, dcfg, hcfg, tokens)
    outs_ = losses.unroll(hw, hcfg, tw.embed, tokens, feats.astype(jnp.float32), a.k)
    dd = [eagle.to_target_ids(hw, hcfg, jnp.argmax(eagle.draft_logits(hw, hcfg, tw, o), -1)) for o in outs_]
    return jnp.stack(dd, -1), jnp.argmax(logits, -1)

tot, acc_pos, tf = 0, np.zeros(a.k), np.zeros((a.k, 2))
agree = []
for r in rows:
    L0 = int(d["lengths"][r]); P = int(np.argmax(d["loss_mask"][r] > 0))
    L = min(L0, P + a.tokens)
    seq = d["tokens"][r][None, :512].astype(np.int32)
    dr, g = map(np.asarray, drafts_of(jnp.asarray(seq)))
    dr, g, s = dr[0], g[0], seq[0]
    agree.append(float((g[P - 1:L - 1] == s[P:L]).mean()))
    for j in range(a.k):
        for i in range(P - 1, L - 2 - j):
            tf[j] += (dr[i, j] == s[i + 2 + j], 1)
    i = P - 1
    while i + 2 < L:
        m = 0
        while m < a.k and i + 2 + m < L and dr[i, m] == s[i + 2 + m]:
            m += 1
        tot += 1; acc_pos[:m] += 1; i += m + 1
print(a.head, f"rows {len(rows)} (Magpie only), first {a.tokens} answer tokens")
print("replay: mean acceptance length", round(1 + acc_pos.sum() / tot, 3), "per position", np.round(acc_pos / tot, 3).tolist())
print("teacher-forced accuracy per unroll step", np.round(tf[:, 0] / tf[:, 1], 3).tolist(),
      "; fp32 argmax == the row's (bf16 GPU) token", round(float(np.mean(agree)), 4))
