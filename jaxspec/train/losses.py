"""EAGLE-1 and EAGLE-3 training losses for one batch of token sequences; the frozen target runs inside.

Indices follow models/eagle.py. Row tokens x_0 .. x_{T-1}; the target gives features f_t and its greedy next
token g_t (= its guess of x_{t+1}). The head's "anchor" i reads the pair (f_i, x_{i+1}) at position i and its
output out_i stands for f_{i+1}, whose logits draft x_{i+2}.

Training-time test (EAGLE-3 paper, SpecForge): the head is unrolled for `ttt_steps` steps. Step j > 0 of anchor
i reads (out^{j-1}_i, x_{i+j+1}) at position i + j and drafts x_{i+j+2}: exactly the engine's rollout
(engine/step.py `_draft_rollout`) after a verify pass whose last accepted pair is anchor i. Its attention sees
what the rollout's query sees in the draft KV cache: the step-0 keys of positions <= i (written from the
target's real features by verify passes) and the keys of steps 1..j of the same anchor (its own chain), at their
true positions i+1..i+j. That is SpecForge's tree mask (causal over step 0, diagonal over later steps), with
RoPE positions shifted by j so relative distances match inference. A plain dense causal pass per step would
instead let step j see *self-fed* keys at every earlier position, which never happens when drafting.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp

from jaxspec.models import eagle, llama
from jaxspec.models.attention import dense_attention


@jax.tree_util.register_static
@dataclass(frozen=True)
class LossConfig:
    ttt_steps: int = 1  # unrolled head steps (EAGLE-1 trains one, EAGLE-3 several)
    ttt_decay: float = 0.8  # weight of step j is ttt_decay ** j
    w_reg: float = 1.0  # EAGLE-1: smooth-L1 feature regression
    w_cls: float = 0.1  # EAGLE-1: cross-entropy against the target's next-token distribution
    noise: float = 0.0  # width of the uniform noise on the target's features: U(-noise/2, noise/2)
    # EAGLE-3: cross-entropy against the target's next-token distribution over the draft vocabulary (the EAGLE-3
    # reference trainer's and SpecForge's target_p) instead of its greedy token alone
    soft_labels: bool = False
    # the head's matmuls; parameters, optimizer state and the losses' reductions stay fp32 (mixed precision)
    compute_dtype: str = "float32"


@partial(jax.tree_util.register_dataclass, data_fields=["target", "d2t", "t2d"], meta_fields=[])
@dataclass
class Frozen:
    """Everything the step reads but never trains."""
    target: llama.Weights
    d2t: jax.Array | None  # [draft_V] int32 (EAGLE-3): target id = draft id + d2t[draft id]
    t2d: jax.Array | None  # [V] int32 (EAGLE-3): draft id of a target id, -1 when outside the draft vocabulary


def shift_left(x: jax.Array, n: int) -> jax.Array:
    """x[:, n:] padded with zeros to the same length: [B, T, ...]."""
    if n == 0:
        return x
    pad = jnp.zeros((x.shape[0], min(n, x.shape[1])) + x.shape[2:], x.dtype)
    return jnp.concatenate([x[:, n:], pad], axis=1)


def tree_attention(q: jax.Array, k0: jax.Array, v0: jax.Array,
                   chain: list[tuple[jax.Array, jax.Array]]) -> jax.Array:
    """q [B, T, H, D] (RoPE applied); k0, v0 [B, T, KVH, D]: step-0 keys, anchor i sees k0[:, :i+1];
    chain: (k, v) of steps 1..j, anchor i sees only its own entry chain[s][:, i]. Returns [B, T, H, D]."""
    B, T, H, D = q.shape
    kvh = k0.shape[2]
    q = q.reshape(B, T, kvh, H // kvh, D)
    scale = 1.0 / jnp.sqrt(jnp.float32(D))
    s0 = jnp.einsum("btkgd,bskd->bkgts", q, k0, preferred_element_type=jnp.float32) * scale  # [B, KVH, G, T, T]
    s0 = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s0, -jnp.inf)
    # A query and its own chain keys pair up one to one: elementwise products, not batched matmuls (which XLA
    # runs as B*T*KVH tiny dots)
    q32 = q.astype(jnp.float32)
    diag = [jnp.sum(q32 * k.astype(jnp.float32)[:, :, :, None], axis=-1).transpose(0, 2, 3, 1)[..., None] * scale
            for k, _ in chain]  # each [B, KVH, G, T, 1]
    probs = jax.nn.softmax(jnp.concatenate([s0] + diag, axis=-1), axis=-1)
    out = jnp.einsum("bkgts,bskd->btkgd", probs[..., :T].astype(v0.dtype), v0, preferred_element_type=jnp.float32)
    for s, (_, v) in enumerate(chain):
        p = probs[..., T + s].transpose(0, 3, 1, 2)[..., None]  # [B, T, KVH, G, 1]
        out = out + p * v.astype(jnp.float32)[:, :, :, None]
    return out.reshape(B, T, H, D).astype(q.dtype)


def head_step(w: eagle.EagleWeights, cfg: eagle.EagleConfig, target_embed: jax.Array, tokens: jax.Array,
              hidden: jax.Array, positions: jax.Array, from_target: bool,
              kv0: tuple[jax.Array, jax.Array] | None, chain: list[tuple[jax.Array, jax.Array]]
              ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """`eagle.forward` (dense, kv=None) with the training-time-test attention. Step 0 (kv0 None) is exactly
    eagle.forward's causal pass; later steps attend to kv0 (tree mask) and `chain` plus their own K/V.
    Returns (out [B, T, H], this step's (k, v) [B, T, KVH, D])."""
    lcfg = cfg.layer_config()
    attn_in, residual = eagle.layer_input(w, cfg, target_embed, tokens, hidden, from_target)
    B, T, _ = attn_in.shape
    q, k, v = llama.qkv_projection(attn_in, w.wqkv, positions, lcfg, llama.rope_inv_freq(lcfg))
    if kv0 is None:
        a = dense_attention(q, k, v, positions, positions)
    else:
        a = tree_attention(q, kv0[0], kv0[1], chain + [(k, v)])
    x = eagle.layer_output(w, cfg, residual + a.reshape(B, T, lcfg.q_size) @ w.wo)
    return x, (k, v)


def unroll(w: eagle.EagleWeights, cfg: eagle.EagleConfig, target_embed: jax.Array, tokens: jax.Array,
           features: jax.Array, steps: int) -> list[jax.Array]:
    """The head's outputs [B, T, H] for TTT steps 0..steps-1 (step j, anchor i drafts x_{i+j+2})."""
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    outs, kv0, chain, h = [], None, [], features
    for j in range(steps):
        out, kv = head_step(w, cfg, target_embed, shift_left(tokens, j + 1), h, positions + j, j == 0, kv0, chain)
        if j == 0:
            kv0 = kv
        else:
            chain.append(kv)
        outs.append(out)
        h = out
    return outs


def target_pass(tw: llama.Weights, tcfg: llama.Config, hcfg: eagle.EagleConfig,
                tokens: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The frozen target over whole rows (dense causal): (features for the head, hidden after the final norm
    [B, T, H], logits [B, T, V] fp32), all under stop_gradient."""
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    hidden, aux, _ = llama.forward(tw, tcfg, tokens, positions, aux_layers=hcfg.aux_layers)
    features = eagle.target_features(hcfg, hidden, aux)
    logits = llama.lm_head(tw, hidden)
    return jax.lax.stop_gradient((features, hidden, logits))


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def eagle_loss(params: eagle.EagleWeights, frozen: Frozen, tokens: jax.Array, loss_mask: jax.Array,
               key: jax.Array, tcfg: llama.Config, hcfg: eagle.EagleConfig,
               lc: LossConfig) -> tuple[jax.Array, dict]:
    """tokens, loss_mask [B, T] (mask 1 where x_t is a response token). Returns (loss, metrics) where metrics
    holds per-step `loss` and `acc` [ttt_steps]: top-1 agreement of the head's draft with the target's greedy
    token over masked positions (tokens outside EAGLE-3's draft vocabulary count as misses)."""
    tw = frozen.target
    cdt = jnp.dtype(lc.compute_dtype)
    w = jax.tree.map(lambda a: a.astype(cdt), params)  # params are fp32 leaves only (d2t lives in `frozen`)
    w = w if hcfg.method == "eagle" else dataclasses.replace(w, d2t=frozen.d2t)
    features, hidden, tlogits = target_pass(tw, tcfg, hcfg, tokens)
    greedy = jnp.argmax(tlogits, axis=-1).astype(jnp.int32)  # [B, T]: the target's choice for x_{t+1}
    features = features.astype(jnp.float32)
    if lc.noise > 0:  # EAGLE-1's robustness trick: the head never sees exact features when drafting
        features = features + (jax.random.uniform(key, features.shape) - 0.5) * lc.noise
    outs = unroll(w, hcfg, tw.embed, tokens, features, lc.ttt_steps)
    # the soft labels, once (EAGLE-1's always, EAGLE-3's when asked): step j's are these shifted (a softmax per
    # step was a pass over [B, T, V] each)
    tprobs = jax.nn.softmax(tlogits, axis=-1) if hcfg.method == "eagle" else None
    if hcfg.method == "eagle3" and lc.soft_labels:  # the target's logits at the draft vocabulary's tokens
        draft_ids = eagle.to_target_ids(w, hcfg, jnp.arange(hcfg.draft_vocab_size))
        tprobs = jax.nn.softmax(jnp.take(tlogits, draft_ids, axis=-1), axis=-1)  # [B, T, draft_V]
    mask = loss_mask.astype(jnp.float32)
    total, step_loss, step_acc = 0.0, [], []
    for j, out in enumerate(outs):
        m = shift_left(mask, j + 2)  # anchor i, step j drafts x_{i+j+2}
        label = shift_left(greedy, j + 1)  # [B, T] target ids
        logits = eagle.draft_logits(w, hcfg, tw, out)  # [B, T, draft_V]
        logp = jax.nn.log_softmax(logits, axis=-1)
        if hcfg.method == "eagle":
            reg = jnp.mean(smooth_l1(out.astype(jnp.float32) - shift_left(hidden, j + 1).astype(jnp.float32)), axis=-1)
            cls = -jnp.sum(shift_left(tprobs, j + 1) * logp, axis=-1)
            loss_j = _masked_mean(lc.w_reg * reg + lc.w_cls * cls, m)
        else:
            dlabel = frozen.t2d[label]  # -1 outside the draft vocabulary: no gradient there
            if tprobs is None:
                ce = -jnp.take_along_axis(logp, jnp.maximum(dlabel, 0)[..., None], axis=-1)[..., 0]
            else:
                ce = -jnp.sum(shift_left(tprobs, j + 1) * logp, axis=-1)
            loss_j = _masked_mean(ce, m * (dlabel >= 0))
        pred = eagle.to_target_ids(w, hcfg, jnp.argmax(logits, axis=-1))
        step_acc.append(_masked_mean((pred == label).astype(jnp.float32), m))
        step_loss.append(loss_j)
        total = total + lc.ttt_decay ** j * loss_j
    return total, {"loss": jnp.stack(step_loss), "acc": jnp.stack(step_acc)}


def smooth_l1(x: jax.Array) -> jax.Array:
    """PyTorch's SmoothL1Loss (beta = 1), elementwise: EAGLE-1's feature regression."""
    ax = jnp.abs(x)
    return jnp.where(ax < 1.0, 0.5 * x * x, ax - 0.5)
