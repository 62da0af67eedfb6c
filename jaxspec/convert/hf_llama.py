"""Hugging Face Llama checkpoints <-> `llama.Weights`, through one explicit key map.

HF stores each projection as a torch Linear weight `[out, in]`; jaxspec stores `[in, out]`, with q, k, v fused
into `wqkv` and gate, up into `w_gate_up` (one matmul each). `layer_slots` says where every HF tensor lives in
the stacked weights, and both directions (load and save) read it, so they cannot drift apart.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import save_file

from jaxspec.atomic import atomic_dir
from jaxspec.convert.tensors import Tensor, read_checkpoint
from jaxspec.json_config import read_json
from jaxspec.models import llama
from jaxspec.models.llama import Config, Layers, Weights

# Keys HF checkpoints may carry that hold nothing we need (old Llama checkpoints saved the RoPE table).
IGNORED_KEYS = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
LAYER_KEY = re.compile(r"model\.layers\.(0|[1-9]\d{0,8})\.(.+)")  # one spelling per layer index


def layer_slots(cfg: Config) -> dict[str, tuple[str, slice | None, tuple[int, ...]]]:
    """HF per-layer tensor suffix -> (Layers field, its columns in that field or None for a vector, HF shape)."""
    H, I, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size
    return {
        "input_layernorm.weight": ("attn_norm", None, (H,)),
        "self_attn.q_proj.weight": ("wqkv", slice(0, q), (q, H)),
        "self_attn.k_proj.weight": ("wqkv", slice(q, q + kv), (kv, H)),
        "self_attn.v_proj.weight": ("wqkv", slice(q + kv, q + 2 * kv), (kv, H)),
        "self_attn.o_proj.weight": ("wo", slice(0, H), (H, q)),
        "post_attention_layernorm.weight": ("mlp_norm", None, (H,)),
        "mlp.gate_proj.weight": ("w_gate_up", slice(0, I), (I, H)),
        "mlp.up_proj.weight": ("w_gate_up", slice(I, 2 * I), (I, H)),
        "mlp.down_proj.weight": ("w_down", slice(0, H), (H, I)),
    }


def global_slots(cfg: Config) -> dict[str, tuple[str, bool, tuple[int, ...]]]:
    """HF top-level tensor -> (Weights field, transposed?, HF shape)."""
    V, H = cfg.vocab_size, cfg.hidden_size
    slots = {"model.embed_tokens.weight": ("embed", False, (V, H)), "model.norm.weight": ("final_norm", False, (H,))}
    if not cfg.tie_word_embeddings:
        slots["lm_head.weight"] = ("lm_head", True, (V, H))
    return slots


def read_config(model_dir: Path, dtype: str) -> Config:
    path = model_dir / "config.json"
    try:
        hf = read_json(path)
    except FileNotFoundError:
        raise ValueError(f"{path}: missing (not a Hugging Face model directory)") from None
    return Config.from_hf(hf, dtype=dtype, source=str(path))


def _check_shape(t: Tensor, name: str, shape: tuple[int, ...]) -> None:
    if t.array.shape != shape:
        raise ValueError(f"{t.file}: tensor {name!r} has shape {tuple(t.array.shape)}, the config implies {shape}")


def _check_tied_head(cfg: Config, tensors: dict[str, Tensor]) -> None:
    """Some tied checkpoints store lm_head anyway: accept it only as an exact copy of the embedding."""
    head, embed = tensors.get("lm_head.weight"), tensors.get("model.embed_tokens.weight")
    if cfg.tie_word_embeddings and head is not None:
        if embed is None or not np.array_equal(head.array, embed.array):
            raise ValueError(f"{head.file}: tensor 'lm_head.weight' differs from the embedding, but the config "
                             "sets tie_word_embeddings")
        del tensors["lm_head.weight"]


def weights_from_hf(cfg: Config, tensors: dict[str, Tensor], source: str | Path) -> Weights:
    """Assemble stacked numpy `Weights` in `cfg.dtype`; every HF tensor must be mapped exactly once.

    Every name and shape is checked before anything is allocated, so a config whose sizes the checkpoint does
    not hold (a million layers, say) is an error, not a memory blow-up. `source` names the checkpoint (directory
    or file) in the error for missing tensors.
    """
    dtype = np.dtype(cfg.jnp_dtype)
    tensors = dict(tensors)
    _check_tied_head(cfg, tensors)
    per_layer, top = layer_slots(cfg), global_slots(cfg)
    placed = []  # (tensor, layer index or None, slot)
    for name, t in tensors.items():
        m = LAYER_KEY.fullmatch(name)
        if m and int(m[1]) < cfg.num_layers and m[2] in per_layer:
            placed.append((t, int(m[1]), per_layer[m[2]]))
        elif name in top:
            placed.append((t, None, top[name]))
        elif IGNORED_KEYS.fullmatch(name):
            continue
        else:
            raise ValueError(f"{t.file}: unexpected tensor {name!r} (not part of a {cfg.num_layers}-layer "
                             "LlamaForCausalLM)")
        _check_shape(t, name, placed[-1][2][2])
    _check_complete(cfg, {name for name in tensors if not IGNORED_KEYS.fullmatch(name)}, source)
    stacked = {k: np.zeros(v.shape, dtype) for k, v in vars(llama.abstract(cfg).layers).items()}
    out: dict = {}
    for t, layer, (field, where, _) in placed:
        if layer is None:
            out[field] = np.ascontiguousarray(t.array.T if where else t.array, dtype=dtype)
        elif where is None:
            stacked[field][layer][...] = t.array
        else:
            stacked[field][layer][:, where] = t.array.T
    return Weights(embed=out["embed"], layers=Layers(**stacked), final_norm=out["final_norm"],
                   lm_head=out.get("lm_head"))


def _check_complete(cfg: Config, seen: set[str], source: str | Path) -> None:
    """`seen` (names already known to map to a slot) must cover every slot; the first few missing are named
    without listing all of a config's slots (a corrupt layer count can make them billions)."""
    per_layer, top = layer_slots(cfg), global_slots(cfg)
    expected = len(top) + cfg.num_layers * len(per_layer)
    if len(seen) == expected:
        return
    slots = itertools.chain(sorted(top), (f"model.layers.{i}.{s}" for i in range(cfg.num_layers)
                                          for s in sorted(per_layer)))
    missing = list(itertools.islice((n for n in slots if n not in seen), 8))
    more = " ..." if expected - len(seen) > len(missing) else ""
    raise ValueError(f"{source}: missing tensors {missing}{more} ({expected - len(seen)} of {expected})")


def hf_tensors(cfg: Config, w: Weights) -> dict[str, np.ndarray]:
    """The inverse of `weights_from_hf`: HF names and `[out, in]` layout, in the weights' dtype."""
    out = {}
    for name, (field, transposed, _) in global_slots(cfg).items():
        a = np.asarray(getattr(w, field))
        out[name] = a.T if transposed else a
    layers = {k: np.asarray(v) for k, v in vars(w.layers).items()}
    for i in range(cfg.num_layers):
        for suffix, (field, cols, _) in layer_slots(cfg).items():
            a = layers[field][i]
            out[f"model.layers.{i}.{suffix}"] = a if cols is None else a[:, cols].T
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def load_hf_llama(path: str | Path, dtype: str = "float32") -> tuple[Config, Weights]:
    """Config and host (numpy) weights of an HF Llama directory; `jax.device_put` places them."""
    path = Path(path)
    cfg = read_config(path, dtype)
    return cfg, weights_from_hf(cfg, read_checkpoint(path), path)


def save_hf_llama(cfg: Config, w: Weights, path: str | Path, extra_config: dict | None = None) -> None:
    """Write `config.json` (plus `extra_config`, e.g. token ids) and one `model.safetensors` into a new `path`
    (replacing any older one only when complete)."""
    dtype = jax.tree.leaves(w)[0].dtype
    hf = {**cfg.to_hf(), "dtype": str(np.dtype(dtype)), **(extra_config or {})}
    with atomic_dir(path) as tmp:
        save_file(hf_tensors(cfg, w), tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
