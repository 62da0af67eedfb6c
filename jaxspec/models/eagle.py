"""EAGLE-1 and EAGLE-3 draft heads: one Llama layer that predicts the target's next feature, as pure functions.

Both heads read the token *after* each position together with the target's feature *at* that position
(`tokens[t] = x_{t+1}`, `hidden[t] = f_t`), and their output `out[t]` is a guess of the next feature, from which the
draft logits for x_{t+2} come. Drafting k tokens is one pass over the verified positions, then single-token passes
that feed `out` back as `hidden`.

- EAGLE-1 (Li et al. 2024, `yuhuili/EAGLE-*`): `x = fc(cat([embed(x_{t+1}), f_t]))`, then one Llama layer without
  its input norm; logits = the target's lm_head(out), no extra norm. `f_t` is the target's last hidden state after
  its final norm, or the head's own previous `out`: fc runs either way.
- EAGLE-3 (Li et al. 2025, SpecForge export): `h = fc(cat(aux features))` only when the features come from the
  target (low, middle, high layer inputs, [3H]); the head's own previous `out` ([H], pre-norm) is used as `h`
  directly. Attention reads `cat([input_norm(embed), hidden_norm(h)])` (2H wide) with `h` as the residual; the
  logits are `lm_head(final_norm(out))` over a smaller draft vocabulary, mapped back with `d2t`.

The head's KV cache is a one-layer `KVCache` (L = 1, layer index 0) with the target's paging semantics.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxspec.models import fused_layer, llama
from jaxspec.models.arrays import EMBED, FFW, GATE_UP, HEADS, QKV, VOCAB, ArrayInfo, init_tree
from jaxspec.models.attention import AttnBatch, KVCache
from jaxspec.models.kernel_config import KernelConfig

METHODS = ("eagle", "eagle3")


def check_method(method: str, what: str = "EAGLE method") -> str:
    """The one check of an EAGLE method name; `what` names where it came from in the error."""
    if method not in METHODS:
        raise ValueError(f"{what} must be one of {list(METHODS)}, got {method!r}")
    return method


def default_aux_layers(num_target_layers: int) -> tuple[int, ...]:
    """EAGLE-3's feature layers: the inputs of layers 2, L//2 and L-3 of the target (as EAGLE-3, sglang, vLLM)."""
    L = num_target_layers
    return (2, L // 2, L - 3)


@jax.tree_util.register_static
@dataclass(frozen=True)
class EagleConfig:
    method: str  # "eagle" (EAGLE-1) or "eagle3"
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int  # EAGLE-3's reduced vocabulary; = vocab_size for EAGLE-1
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # as llama.Config
    # EAGLE-3: target layers whose *inputs* are concatenated, ascending (llama.forward's `aux_layers`).
    aux_layers: tuple[int, ...] = ()
    fc_bias: bool = False  # older EAGLE-1 heads have a bias on fc
    own_embed: bool = False  # the head ships its own embedding; otherwise the target's is used
    max_position_embeddings: int = 2048
    dtype: str = "float32"
    attn_impl: str = "xla"  # copied from the target's config by the caller
    kernel: KernelConfig = KernelConfig()  # likewise
    tp_size: int = 1  # tensor parallelism, as llama.Config.tp_size (1: the head is replicated on every device)

    def __post_init__(self) -> None:
        check_method(self.method)
        if self.method == "eagle" and self.draft_vocab_size != self.vocab_size:
            raise ValueError("EAGLE-1 drafts over the target's vocabulary: draft_vocab_size must equal vocab_size")
        if self.method == "eagle3":
            if not self.aux_layers:
                raise ValueError("EAGLE-3 needs aux_layers (the target layers whose inputs it reads)")
            if list(self.aux_layers) != sorted(set(self.aux_layers)):
                # llama.forward concatenates features in layer order, so fc's column blocks must be ascending.
                raise ValueError(f"aux_layers must be strictly increasing, got {self.aux_layers}")

    @property
    def fc_in(self) -> int:
        return 2 * self.hidden_size if self.method == "eagle" else len(self.aux_layers) * self.hidden_size

    @property
    def attn_in(self) -> int:
        """Width of the attention input: EAGLE-3 attends over cat([normed embed, normed h])."""
        return self.hidden_size if self.method == "eagle" else 2 * self.hidden_size

    @property
    def feature_size(self) -> int:
        """Width of `hidden` when it comes from the target (`from_target=True`)."""
        return self.hidden_size if self.method == "eagle" else self.fc_in

    @property
    def jnp_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    def replace(self, **changes: Any) -> "EagleConfig":
        return dataclasses.replace(self, **changes)

    def layer_config(self) -> llama.Config:
        """A one-layer llama.Config, so the head reuses llama's attention, RoPE and KV-cache code."""
        return llama.Config(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_layers=1, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta, rope_scaling=self.rope_scaling,
            max_position_embeddings=self.max_position_embeddings, dtype=self.dtype, attn_impl=self.attn_impl,
            tp_size=self.tp_size, kernel=self.kernel)

    @classmethod
    def from_target(cls, target: llama.Config, method: str, draft_vocab_size: int | None = None,
                    aux_layers: tuple[int, ...] | None = None, **changes: Any) -> "EagleConfig":
        """A head shaped like one layer of `target` (what training a new head starts from)."""
        if method == "eagle3":
            aux_layers = tuple(aux_layers) if aux_layers is not None else default_aux_layers(target.num_layers)
        return cls(method=method, hidden_size=target.hidden_size, intermediate_size=target.intermediate_size,
                   num_heads=target.num_heads, num_kv_heads=target.num_kv_heads, head_dim=target.head_dim,
                   vocab_size=target.vocab_size, draft_vocab_size=draft_vocab_size or target.vocab_size,
                   rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta, rope_scaling=target.rope_scaling,
                   aux_layers=aux_layers if method == "eagle3" else (),
                   max_position_embeddings=target.max_position_embeddings, dtype=target.dtype,
                   attn_impl=target.attn_impl, **changes)


@partial(jax.tree_util.register_dataclass,
         data_fields=["fc", "fc_bias", "embed", "input_norm", "hidden_norm", "wqkv", "wo", "mlp_norm", "w_gate_up",
                      "w_down", "final_norm", "lm_head", "d2t"], meta_fields=[])
@dataclass
class EagleWeights:
    fc: jax.Array  # [fc_in, H]: EAGLE-1 fc_in = 2H (embed, feature); EAGLE-3 fc_in = 3H (aux features)
    fc_bias: jax.Array | None  # [H]
    embed: jax.Array | None  # [V, H]; None = the target's embedding
    input_norm: jax.Array | None  # [H] EAGLE-3 only: input_layernorm over the token embedding
    hidden_norm: jax.Array | None  # [H] EAGLE-3 only: over h
    # [attn_in, (heads + 2 * kv_heads) * head_dim]; attn_in = H (EAGLE-1) or 2H (EAGLE-3); tp_size > 1: as llama's
    wqkv: jax.Array
    wo: jax.Array  # [heads * head_dim, H]
    mlp_norm: jax.Array  # [H] post_attention_layernorm
    w_gate_up: jax.Array  # [H, 2 * I]
    w_down: jax.Array  # [I, H]
    final_norm: jax.Array | None  # [H] EAGLE-3 only
    lm_head: jax.Array | None  # [H, draft_V] EAGLE-3 only (EAGLE-1 uses the target's lm_head)
    d2t: jax.Array | None  # [draft_V] int32 EAGLE-3 only: target id = draft id + d2t[draft id]


def abstract(cfg: EagleConfig) -> EagleWeights:
    """Every weight's shape, dtype, logical axes and initializer (jaxspec.models.arrays): what the converter
    checks against, `init` fills and tensor parallelism splits."""
    H, I, V, Vd = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.draft_vocab_size
    lcfg = cfg.layer_config()
    q_size, kv_size = lcfg.q_size, lcfg.num_cached_kv_heads * cfg.head_dim
    a = lambda shape, axes, init="normal": ArrayInfo(shape, cfg.jnp_dtype, axes, init)  # noqa: E731
    e3 = cfg.method == "eagle3"
    return EagleWeights(
        fc=a((cfg.fc_in, H), (None, EMBED)), fc_bias=a((H,), (EMBED,)) if cfg.fc_bias else None,
        embed=a((V, H), (None, EMBED)) if cfg.own_embed else None,
        input_norm=a((H,), (EMBED,), "ones") if e3 else None, hidden_norm=a((H,), (EMBED,), "ones") if e3 else None,
        wqkv=a((cfg.attn_in, q_size + 2 * kv_size), (None, QKV)), wo=a((q_size, H), (HEADS, EMBED)),
        mlp_norm=a((H,), (EMBED,), "ones"), w_gate_up=a((H, 2 * I), (EMBED, GATE_UP)), w_down=a((I, H), (FFW, EMBED)),
        final_norm=a((H,), (EMBED,), "ones") if e3 else None, lm_head=a((H, Vd), (EMBED, VOCAB)) if e3 else None,
        d2t=ArrayInfo((Vd,), jnp.int32, (None,), "zeros") if e3 else None,
    )


def init(cfg: EagleConfig, key: jax.Array, scale: float = 0.02) -> EagleWeights:
    """Random head (tests, benchmarks, training start); norms at one, d2t a random sorted subset of the vocab."""
    key, vocab_key = jax.random.split(key)
    w = init_tree(abstract(cfg), key, scale)
    if cfg.method == "eagle3":
        hot = jnp.sort(jax.random.choice(vocab_key, cfg.vocab_size, (cfg.draft_vocab_size,), replace=False))
        w.d2t = (hot - jnp.arange(cfg.draft_vocab_size)).astype(jnp.int32)
    return w


def _fc(w: EagleWeights, x: jax.Array) -> jax.Array:
    y = x.astype(w.fc.dtype) @ w.fc  # [B, T, fc_in] -> [B, T, H]
    return y if w.fc_bias is None else y + w.fc_bias


def forward(w: EagleWeights, cfg: EagleConfig, target_embed: jax.Array, tokens: jax.Array, hidden: jax.Array,
            positions: jax.Array, kv: KVCache | None = None, batch: AttnBatch | None = None,
            from_target: bool = True) -> tuple[jax.Array, KVCache | None]:
    """One draft pass. tokens, positions: [B, T]; hidden: [B, T, feature_size] when `from_target` else [B, T, H].

    `tokens[t]` is the token after the one whose feature is `hidden[t]`. Returns (out [B, T, H], kv): `out` feeds
    `draft_logits` and is the `hidden` of the next single-token pass (with from_target=False). With `kv` (one
    layer) the chunk's K/V are written at `batch.slot_mapping` and each query sees cached positions up to its own;
    without it attention is dense and causal over the given tokens (training and tests).
    `from_target` is static: it only matters to EAGLE-3 (EAGLE-1 applies fc to either kind of hidden).
    """
    lcfg = cfg.layer_config()
    want = cfg.feature_size if from_target else cfg.hidden_size
    if hidden.shape[-1] != want:
        raise ValueError(f"{cfg.method} head: hidden has width {hidden.shape[-1]}, expected {want} "
                         f"(from_target={from_target})")
    attn_in, residual = layer_input(w, cfg, target_embed, tokens, hidden, from_target)
    inv_freq = llama.rope_inv_freq(lcfg)
    B, T = tokens.shape
    if fused_layer.applies(lcfg, B * T, batch, kv):  # the layer in five kernels (no input norm), as the target's
        plan = fused_layer.plan(lcfg, positions, batch, kv)
        one = lambda a: a[None]  # noqa: E731  (the head's one layer, stacked as the kernels read weights)
        out, kv = fused_layer.layer(fused_layer.rows(attn_in), fused_layer.rows(residual), None, one(w.wqkv),
                                    one(w.wo), one(w.mlp_norm), one(w.w_gate_up), one(w.w_down), lcfg, inv_freq, kv,
                                    0, plan)
        return fused_layer.unrows(out, B, T), kv
    a, kv = llama.attention_block(attn_in, w.wqkv, w.wo, positions, lcfg, inv_freq, kv, 0, batch)
    return layer_output(w, cfg, residual + a), kv


def layer_input(w: EagleWeights, cfg: EagleConfig, target_embed: jax.Array, tokens: jax.Array, hidden: jax.Array,
                from_target: bool) -> tuple[jax.Array, jax.Array]:
    """(attention input, residual) of the head's layer: EAGLE-1 fc(cat(embed, hidden)) for both; EAGLE-3
    cat(input_norm(embed), hidden_norm(h)) and h, with h = fc(hidden) for target features."""
    eps = cfg.rms_norm_eps
    embed = (target_embed if w.embed is None else w.embed)[tokens].astype(w.wqkv.dtype)  # [B, T, H]
    if cfg.method == "eagle":
        x = _fc(w, jnp.concatenate([embed, hidden.astype(embed.dtype)], axis=-1))  # [B, T, H]
        return x, x  # EAGLE-1's layer 0 has no input norm
    h = _fc(w, hidden) if from_target else hidden.astype(w.wqkv.dtype)  # [B, T, H]
    attn_in = jnp.concatenate([llama.rms_norm(embed, w.input_norm, eps),
                               llama.rms_norm(h, w.hidden_norm, eps)], axis=-1)  # [B, T, 2H]
    return attn_in, h


def layer_output(w: EagleWeights, cfg: EagleConfig, x: jax.Array) -> jax.Array:
    """The layer's MLP half on x = residual + attention: the head's pre-norm output."""
    return x + llama.mlp(llama.rms_norm(x, w.mlp_norm, cfg.rms_norm_eps), w.w_gate_up, w.w_down, cfg.tp_size)

def draft_logits(w: EagleWeights, cfg: EagleConfig, target_weights: llama.Weights, out: jax.Array) -> jax.Array:
    """fp32 logits [B, T, draft_V] from `out` [B, T, H]: the target's lm_head (EAGLE-1) or the head's own."""
    if cfg.method == "eagle":
        return llama.lm_head(target_weights, out.astype(target_weights.embed.dtype))
    return (llama.rms_norm(out, w.final_norm, cfg.rms_norm_eps) @ w.lm_head).astype(jnp.float32)


def to_target_ids(w: EagleWeights, cfg: EagleConfig, draft_ids: jax.Array) -> jax.Array:
    """Draft-vocabulary ids -> target ids (identity for EAGLE-1)."""
    if cfg.method == "eagle":
        return draft_ids.astype(jnp.int32)
    return (draft_ids + w.d2t[draft_ids]).astype(jnp.int32)


def draft_tokens(w: EagleWeights, cfg: EagleConfig, target_weights: llama.Weights, out: jax.Array,
                 process: Callable[[jax.Array], jax.Array] | None = None) -> jax.Array:
    """Greedy drafts (out [..., H] -> [...] int32) in the target's vocabulary (EAGLE drafts greedily; see DESIGN
    "Sampling"): the argmax of draft_logits, or of `process` applied to them (the engine's logits processors)."""
    logits = draft_logits(w, cfg, target_weights, out)
    return to_target_ids(w, cfg, jnp.argmax(logits if process is None else process(logits), axis=-1))


def target_features(cfg: EagleConfig, hidden: jax.Array, aux: jax.Array | None) -> jax.Array:
    """Pick what the head reads from llama.forward's (hidden, aux): EAGLE-1 the normed last hidden, EAGLE-3 aux.

    Run the target with `aux_layers=cfg.aux_layers` for EAGLE-3.
    """
    if cfg.method == "eagle":
        return hidden
    if aux is None or aux.shape[-1] != cfg.feature_size:
        raise ValueError(f"EAGLE-3 needs the target's aux features [.., {cfg.feature_size}]: run llama.forward "
                         f"with aux_layers={cfg.aux_layers}")
    return aux
