"""The Llama family in plain JAX: config, stacked weights, paged KV cache and one forward.

Weights of one kind are stacked `[L, ...]` (few pytree leaves, cheap dispatch). On the GPU the layer loop is a
Python loop with static indices: a `lax.scan` over stacked weights copies every layer's weights each step.
`Config.layer_loop = "scan"` exists for CPU compile time and gives identical results.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.models import fused_layer
from jaxspec.models.arrays import EMBED, FFW, GATE_UP, HEADS, LAYERS, QKV, VOCAB, ArrayInfo, init_tree
from jaxspec.json_config import read_bool, read_dict, read_float, read_int, read_list, read_str
from jaxspec.models.attention import AttnBatch, KVCache, attention, write_kv
from jaxspec.models.kernel_config import KernelConfig


@jax.tree_util.register_static
@dataclass(frozen=True)
class Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # Llama 3 rope scaling as sorted (key, value) pairs so the config stays hashable; None for plain RoPE.
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    dtype: str = "float32"
    layer_loop: str = "unroll"  # "unroll" (GPU: static indices) or "scan" (CPU: faster compiles)
    # "xla" (reference, any backend), "pallas" (GPU paged kernel), "cudnn" (GPU, cache-free passes from position 0)
    attn_impl: str = "xla"
    # Tensor parallelism over this many devices (jaxspec.parallel). > 1 switches wqkv and w_gate_up to the
    # shard-major column layout that `parallel.to_tp_layout` makes; checkpoints always keep tp_size = 1's layout.
    tp_size: int = 1
    kernel: KernelConfig = KernelConfig()  # launch parameters (a run's setting, not saved with checkpoints)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def kv_heads_per_shard(self) -> int:
        return max(1, self.num_kv_heads // self.tp_size)

    @property
    def num_cached_kv_heads(self) -> int:
        """KV heads in wqkv and the cache: num_kv_heads, or tp_size when fewer (each shard keeps a copy of its own)."""
        return self.tp_size * self.kv_heads_per_shard

    @property
    def jnp_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    def replace(self, **changes: Any) -> "Config":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf(cls, hf: dict, dtype: str = "float32", source: str = "config.json") -> "Config":
        """Build from a Hugging Face `config.json` dict (both `rope_theta`/`rope_scaling` and `rope_parameters`).

        Every field is type- and range-checked: a ValueError names `source` and the field."""
        if not isinstance(hf, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(hf).__name__}")
        archs = read_list(hf, "architectures", source, str, default=None) or ["LlamaForCausalLM"]
        model_type = read_str(hf, "model_type", source, default="llama")
        if model_type != "llama" or not any(a == "LlamaForCausalLM" for a in archs):
            raise ValueError(f"{source}: unsupported architecture {archs} (model_type={model_type!r}); "
                             "jaxspec serves LlamaForCausalLM")
        for flag in ("attention_bias", "mlp_bias"):
            if read_bool(hf, flag, source, default=False):
                raise ValueError(f"{source}: {flag}=true is not supported")
        rope = read_dict(hf, "rope_parameters", source)
        theta = read_float(rope, "rope_theta", f"{source}: rope_parameters",
                           default=read_float(hf, "rope_theta", source, default=10000.0))
        scaling = read_dict(hf, "rope_scaling", source) or (
            rope if read_str(rope, "rope_type", f"{source}: rope_parameters", default="default") != "default"
            else None)
        rope_scaling = None
        if scaling:
            where = f"{source}: {'rope_scaling' if hf.get('rope_scaling') else 'rope_parameters'}"
            kind = read_str(scaling, "rope_type", where, default=None) or read_str(scaling, "type", where, None)
            if kind != "llama3":
                raise ValueError(f"{where}: rope scaling type {kind!r} is not supported (only 'llama3')")
            keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            missing = [k for k in keys if k not in scaling]
            if missing:
                raise ValueError(f"{where}: llama3 rope scaling lacks {missing}")
            rope_scaling = tuple((k, read_float(scaling, k, where)) for k in keys)
        num_heads = read_int(hf, "num_attention_heads", source)
        num_kv_heads = read_int(hf, "num_key_value_heads", source, default=num_heads)
        if num_heads % num_kv_heads:
            raise ValueError(f"{source}: num_key_value_heads={num_kv_heads} does not divide "
                             f"num_attention_heads={num_heads}")
        hidden = read_int(hf, "hidden_size", source)
        head_dim = read_int(hf, "head_dim", source, default=None)
        if head_dim is None:
            if hidden % num_heads:
                raise ValueError(f"{source}: hidden_size={hidden} is not a multiple of num_attention_heads="
                                 f"{num_heads}, and head_dim is not given")
            head_dim = hidden // num_heads
        if head_dim % 2:
            raise ValueError(f"{source}: head_dim={head_dim} is odd (RoPE rotates pairs of dimensions)")
        return cls(
            vocab_size=read_int(hf, "vocab_size", source),
            hidden_size=hidden,
            intermediate_size=read_int(hf, "intermediate_size", source),
            num_layers=read_int(hf, "num_hidden_layers", source),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=read_float(hf, "rms_norm_eps", source, default=1e-5),
            rope_theta=theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=read_bool(hf, "tie_word_embeddings", source, default=False),
            max_position_embeddings=read_int(hf, "max_position_embeddings", source, default=2048),
            dtype=dtype,
        )

    def to_hf(self) -> dict:
        """The `config.json` dict transformers reads for this shape."""
        hf = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim, "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta, "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings, "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False,
        }
        if self.rope_scaling:
            hf["rope_scaling"] = {"rope_type": "llama3", **dict(self.rope_scaling)}
        return hf


@partial(jax.tree_util.register_dataclass,
         data_fields=["attn_norm", "wqkv", "wo", "mlp_norm", "w_gate_up", "w_down"], meta_fields=[])
@dataclass
class Layers:
    attn_norm: jax.Array  # [L, H]
    # [L, H, (heads + 2 * kv_heads) * head_dim]: q, k, v fused into one matmul. tp_size > 1: kv_heads is
    # num_cached_kv_heads and the columns go shard by shard, [q, k, v of shard 0, q, k, v of shard 1, ...]
    wqkv: jax.Array
    wo: jax.Array  # [L, heads * head_dim, H]
    mlp_norm: jax.Array  # [L, H]
    w_gate_up: jax.Array  # [L, H, 2 * I]: gate then up, fused into one matmul (tp_size > 1: [gate_s, up_s] per shard)
    w_down: jax.Array  # [L, I, H]


@partial(jax.tree_util.register_dataclass,
         data_fields=["embed", "layers", "final_norm", "lm_head"], meta_fields=[])
@dataclass
class Weights:
    embed: jax.Array  # [V, H]
    layers: Layers
    final_norm: jax.Array  # [H]
    lm_head: jax.Array | None  # [H, V]; None when tied to `embed`


def abstract(cfg: Config) -> Weights:
    """Every weight's shape, dtype, logical axes and initializer (jaxspec.models.arrays): what the converter
    checks against, `init` fills and tensor parallelism splits."""
    L, H, I, V = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    a = lambda shape, axes, init="normal": ArrayInfo(shape, cfg.jnp_dtype, axes, init)  # noqa: E731
    return Weights(
        embed=a((V, H), (VOCAB if cfg.tie_word_embeddings else None, EMBED)),  # tied: it is the LM head
        layers=Layers(attn_norm=a((L, H), (LAYERS, EMBED), "ones"),
                      wqkv=a((L, H, cfg.q_size + 2 * cfg.num_cached_kv_heads * cfg.head_dim), (LAYERS, EMBED, QKV)),
                      wo=a((L, cfg.q_size, H), (LAYERS, HEADS, EMBED)),
                      mlp_norm=a((L, H), (LAYERS, EMBED), "ones"),
                      w_gate_up=a((L, H, 2 * I), (LAYERS, EMBED, GATE_UP)),
                      w_down=a((L, I, H), (LAYERS, FFW, EMBED))),
        final_norm=a((H,), (EMBED,), "ones"),
        lm_head=None if cfg.tie_word_embeddings else a((H, V), (EMBED, VOCAB)),
    )


@partial(jax.jit, static_argnames=("scale",))  # one program instead of one per weight shape
def init(cfg: Config, key: jax.Array, scale: float = 0.02) -> Weights:
    """Random weights of the right shapes (tests and `--load-format dummy` benchmarks); norms start at one."""
    return init_tree(abstract(cfg), key, scale)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm computed in fp32, as transformers does, then cast back."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * x32.astype(x.dtype)


def rope_inv_freq(cfg: Config) -> np.ndarray:
    """Inverse frequencies [head_dim/2] in fp32, with Llama 3 scaling when configured (matches transformers)."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (np.float32(cfg.rope_theta) ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
    inv_freq = inv_freq.astype(np.float32)
    if cfg.rope_scaling is None:
        return inv_freq
    p = dict(cfg.rope_scaling)
    factor, low, high, old_len = (p["factor"], p["low_freq_factor"], p["high_freq_factor"],
                                  p["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * np.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """x: [B, T, heads, head_dim]; rotate-half RoPE (the HF layout) at integer positions [B, T]."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, D/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]  # [B, T, 1, D]
    cos, sin = jnp.cos(emb).astype(x.dtype), jnp.sin(emb).astype(x.dtype)
    x1, x2 = jnp.split(x, 2, axis=-1)
    return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


def mlp(x: jax.Array, w_gate_up: jax.Array, w_down: jax.Array, tp: int = 1) -> jax.Array:
    """SwiGLU. w_gate_up's columns are [gate_s, up_s] per shard s (tp = 1: [gate, up])."""
    gate_up = (x @ w_gate_up).reshape(*x.shape[:-1], tp, 2, -1)  # [..., tp, 2, I / tp]
    gate, up = gate_up[..., 0, :], gate_up[..., 1, :]
    return (jax.nn.silu(gate) * up).reshape(*x.shape[:-1], -1) @ w_down


def qkv_projection(x: jax.Array, wqkv: jax.Array, positions: jax.Array, cfg: Config,
                   inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x [B, T, in] -> q [B, T, heads, D], k and v [B, T, cached kv heads, D], RoPE applied to q and k."""
    B, T, _ = x.shape
    tp, D = cfg.tp_size, cfg.head_dim
    q_local, kv_local = cfg.num_heads // tp * D, cfg.kv_heads_per_shard * D  # columns per shard
    qkv = (x @ wqkv).reshape(B, T, tp, q_local + 2 * kv_local)  # shard-major columns (tp = 1: [q, k, v])
    q, k, v = jnp.split(qkv, [q_local, q_local + kv_local], axis=-1)
    q = apply_rope(q.reshape(B, T, cfg.num_heads, D), positions, inv_freq)
    k = apply_rope(k.reshape(B, T, cfg.num_cached_kv_heads, D), positions, inv_freq)
    return q, k, v.reshape(B, T, cfg.num_cached_kv_heads, D)


def attention_block(x: jax.Array, wqkv: jax.Array, wo: jax.Array, positions: jax.Array, cfg: Config,
                    inv_freq: np.ndarray, kv: KVCache | None, layer: jax.Array | int,
                    batch: AttnBatch | None) -> tuple[jax.Array, KVCache | None]:
    """Self-attention over the paged cache (after writing this chunk's K/V into it), or dense when kv is None."""
    B, T, _ = x.shape
    q, k, v = qkv_projection(x, wqkv, positions, cfg, inv_freq)
    if kv is not None:
        kv = write_kv(kv, layer, k, v, batch.slot_mapping)
    out = attention(q, k, v, positions, kv, layer, batch, cfg.attn_impl, cfg.tp_size, cfg.kernel)  # [B, T, H, D]
    return out.reshape(B, T, cfg.q_size) @ wo, kv


def decoder_layer(x: jax.Array, lw: Layers, positions: jax.Array, cfg: Config, inv_freq: np.ndarray,
                  kv: KVCache | None, layer: jax.Array | int, batch: AttnBatch | None) -> tuple[jax.Array, Any]:
    """One pre-norm Llama layer; `lw` holds this layer's slices of the stacked weights."""
    h, kv = attention_block(rms_norm(x, lw.attn_norm, cfg.rms_norm_eps), lw.wqkv, lw.wo, positions, cfg,
                            inv_freq, kv, layer, batch)
    x = x + h
    x = x + mlp(rms_norm(x, lw.mlp_norm, cfg.rms_norm_eps), lw.w_gate_up, lw.w_down, cfg.tp_size)
    return x, kv


def forward(w: Weights, cfg: Config, tokens: jax.Array, positions: jax.Array, kv: KVCache | None = None,
            batch: AttnBatch | None = None, aux_layers: tuple[int, ...] = ()
            ) -> tuple[jax.Array, jax.Array | None, KVCache | None]:
    """tokens, positions: [B, T]. Returns (hidden after the final norm [B, T, H], aux, kv).

    With `kv` the chunk's K/V are written at `batch.slot_mapping` and each query attends to the cached positions
    up to its own; without it attention is dense and causal over the given tokens (the oracle path).
    `aux` concatenates the inputs of `aux_layers` ([B, T, len * H], EAGLE-3's features) or is None.
    """
    inv_freq = rope_inv_freq(cfg)
    B, T = tokens.shape
    x = w.embed[tokens]
    aux = []
    if fused_layer.applies(cfg, B * T, batch, kv):  # small decode batches: a layer in five kernels, on rows
        plan = fused_layer.plan(cfg, positions, batch, kv)
        x = fused_layer.rows(x)

        def run(x, kv, i):  # the stacked weights, read at layer i inside the kernels
            s = w.layers
            return fused_layer.layer(x, x, s.attn_norm, s.wqkv, s.wo, s.mlp_norm, s.w_gate_up, s.w_down, cfg,
                                     inv_freq, kv, i, plan)

        features = lambda x: fused_layer.unrows(x, B, T)  # noqa: E731
    else:
        def run(x, kv, i):  # layer i's slices: static when unrolled, dynamic in the scan
            take = (lambda a: a[i]) if isinstance(i, int) else (
                lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False))
            return decoder_layer(x, jax.tree.map(take, w.layers), positions, cfg, inv_freq, kv, i, batch)

        features = lambda x: x  # noqa: E731

    def body(carry, i):
        x, kv = carry
        return run(x, kv, i), None

    # layers run in segments split at the aux layers, so EAGLE-3's features do not force an unrolled loop
    bounds = sorted({0, cfg.num_layers, *(i for i in aux_layers if i < cfg.num_layers)})
    for a, b in zip(bounds, bounds[1:]):
        if a in aux_layers:
            aux.append(features(x))
        if cfg.layer_loop == "scan":
            (x, kv), _ = jax.lax.scan(body, (x, kv), jnp.arange(a, b))
        else:
            for i in range(a, b):
                x, kv = run(x, kv, i)
    hidden = rms_norm(features(x), w.final_norm, cfg.rms_norm_eps)
    return hidden, (jnp.concatenate(aux, axis=-1) if aux else None), kv


def lm_head(w: Weights, hidden: jax.Array, dtype: jnp.dtype | None = jnp.float32) -> jax.Array:
    """Logits: [..., H] -> [..., V], in fp32, or as the product comes out with dtype None (the weights' dtype: a
    kernel that reads bf16 logits and converts them itself saves XLA writing an fp32 copy)."""
    head = w.embed.T if w.lm_head is None else w.lm_head
    logits = hidden @ head
    return logits if dtype is None else logits.astype(dtype)
