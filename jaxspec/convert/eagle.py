"""EAGLE-1 / EAGLE-3 heads from Hugging Face-style directories, and back.

Layouts read (HF matrices are [out, in]; ours are [in, out], q/k/v and gate/up fused):
- EAGLE-1 (`yuhuili/EAGLE-LLaMA3-Instruct-8B`): `pytorch_model.bin` (read by a restricted unpickler: nothing in
  the file runs) or `model.safetensors`, keys `fc.*` and `layers.0.*` (no input_layernorm); config.json is a Llama
  config with `num_hidden_layers: 1` and a `bias` flag for fc.
- EAGLE-3 (SpecForge export): `model.safetensors`, keys `fc.weight`, `midlayer.*`, `norm.weight`, `lm_head.weight`,
  `d2t`, `t2d`; config.json says `LlamaForCausalLMEagle3` and gives `draft_vocab_size`.

Aux layer convention: `EagleConfig.aux_layers` are the target layers whose *inputs* are read (llama.forward's
`aux_layers`; the EAGLE-3 default (2, L//2, L-3)). SpecForge/sglang's `eagle_config.eagle_aux_hidden_state_layer_ids`
count *outputs* ("layer i's output" = input of layer i+1; sglang adds one), so we add one when reading and subtract
one when writing. A top-level `eagle_aux_hidden_state_layer_ids` (vLLM's convention) is already input-indexed.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

from jaxspec.atomic import atomic_dir
from jaxspec.convert.tensors import read_safetensors
from jaxspec.json_config import read_bool, read_dict, read_int, read_json, read_list
from jaxspec.models import llama
from jaxspec.models.eagle import EagleConfig, EagleWeights, abstract, check_method, default_aux_layers

SAFETENSORS, TORCH_BIN = "model.safetensors", "pytorch_model.bin"
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # non-persistent RoPE buffers some old checkpoints carry


def _prefix(method: str) -> str:
    return "layers.0." if method == "eagle" else "midlayer."


def _tables(cfg: EagleConfig) -> list[tuple[str, tuple[str, ...], tuple[tuple[int, ...], ...], bool]]:
    """The one key table: (EagleWeights field, its HF tensor names, their HF shapes, transposed). A transposed
    field (a projection) is its HF matrices transposed ([out, in] -> [in, out]) and, when several, fused along the
    output axis (q/k/v, gate/up); the others (norms, biases, the embedding: [V, H] in both) are the tensor itself.
    d2t/t2d (EAGLE-3's vocabulary map) are checked apart."""
    H, I, V, Vd = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.draft_vocab_size
    q_size, kv_size, p = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, _prefix(cfg.method)
    attn, mlp, e3 = f"{p}self_attn.", f"{p}mlp.", cfg.method == "eagle3"
    rows = [
        ("fc", ("fc.weight",), ((H, cfg.fc_in),), True),
        ("fc_bias", ("fc.bias",), ((H,),), False) if cfg.fc_bias else None,
        ("embed", ("embed_tokens.weight",), ((V, H),), False) if cfg.own_embed else None,
        ("input_norm", (f"{p}input_layernorm.weight",), ((H,),), False) if e3 else None,
        ("hidden_norm", (f"{p}hidden_norm.weight",), ((H,),), False) if e3 else None,
        ("wqkv", (f"{attn}q_proj.weight", f"{attn}k_proj.weight", f"{attn}v_proj.weight"),
         ((q_size, cfg.attn_in), (kv_size, cfg.attn_in), (kv_size, cfg.attn_in)), True),
        ("wo", (f"{attn}o_proj.weight",), ((H, q_size),), True),
        ("mlp_norm", (f"{p}post_attention_layernorm.weight",), ((H,),), False),
        ("w_gate_up", (f"{mlp}gate_proj.weight", f"{mlp}up_proj.weight"), ((I, H), (I, H)), True),
        ("w_down", (f"{mlp}down_proj.weight",), ((H, I),), True),
        ("final_norm", ("norm.weight",), ((H,),), False) if e3 else None,
        ("lm_head", ("lm_head.weight",), ((Vd, H),), True) if e3 else None,
    ]
    return [r for r in rows if r is not None]


def _hf_shapes(cfg: EagleConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name the head's file must hold, with its HF ([out, in]) shape."""
    shapes = {name: shape for _, names, shapes, _ in _tables(cfg) for name, shape in zip(names, shapes)}
    if cfg.method == "eagle3":
        shapes |= {"d2t": (cfg.draft_vocab_size,), "t2d": (cfg.vocab_size,)}
    return shapes


def _field_from_hf(arrays: list[np.ndarray], transposed: bool) -> np.ndarray:
    return np.concatenate([a.T for a in arrays], axis=1) if transposed else arrays[0]


def _field_to_hf(x: np.ndarray, shapes: tuple[tuple[int, ...], ...], transposed: bool) -> list[np.ndarray]:
    if not transposed:
        return [x]
    return [part.T for part in np.split(x, np.cumsum([s[0] for s in shapes])[:-1], axis=1)]


def _read_tensors(path: str) -> tuple[str, dict[str, np.ndarray]]:
    st, pt = os.path.join(path, SAFETENSORS), os.path.join(path, TORCH_BIN)
    if os.path.exists(st):
        return st, dict(read_safetensors(st))
    if os.path.exists(pt):
        from jaxspec.convert.torch_bin import load_torch_bin
        return pt, load_torch_bin(pt)
    raise ValueError(f"{path}: no {SAFETENSORS} or {TORCH_BIN} (sharded EAGLE heads are not supported)")


def _detect_method(hf: dict, keys: set[str], method: str | None, source: str) -> str:
    """The head's method from its tensor names, checked against its config and the `method` asked for (already
    a valid name: load_eagle checks it before reading anything)."""
    by_keys = ("eagle3" if any(k.startswith("midlayer.") for k in keys)
               else "eagle" if any(k.startswith("layers.0.") for k in keys) else None)
    archs = read_list(hf, "architectures", source, str, default=[])
    by_config = "eagle3" if any("Eagle3" in a for a in archs) else None
    if by_keys is None:
        raise ValueError(f"{source}: neither EAGLE-1 (layers.0.*) nor EAGLE-3 (midlayer.*) tensors found")
    if by_config == "eagle3" and by_keys != "eagle3":
        raise ValueError(f"{source}: config.json says LlamaForCausalLMEagle3 but the tensors are EAGLE-1's "
                         "(layers.0.*)")
    if method is not None and method != by_keys:
        raise ValueError(f"{source}: method {method!r} was asked for but the file holds an {by_keys!r} head")
    return by_keys


def _aux_layers(hf: dict, target: llama.Config, source: str) -> tuple[int, ...]:
    key = "eagle_aux_hidden_state_layer_ids"
    nested = read_list(read_dict(hf, "eagle_config", source), key, f"{source}: eagle_config", int, default=None)
    top = read_list(hf, key, source, int, default=None)
    if nested is not None:
        aux = tuple(i + 1 for i in nested)  # output-of-layer ids (sglang/SpecForge) -> input-of-layer
    elif top is not None:
        aux = tuple(top)  # vLLM: already input-of-layer
    else:
        aux = default_aux_layers(target.num_layers)
    bad = [i for i in aux if not 0 <= i < target.num_layers]
    if bad:
        raise ValueError(f"{source}: aux layer(s) {bad} (as inputs of target layers; from {list(aux)}) are out of "
                         f"range for a {target.num_layers}-layer target: this head belongs to another model")
    return tuple(sorted(aux))


def head_config(hf: dict, keys: set[str], target: llama.Config, method: str | None,
                source: str = "config.json") -> EagleConfig:
    """EagleConfig from the head's config.json dict and its tensor names, checked against the target."""
    method = _detect_method(hf, keys, method, source)
    if read_int(hf, "num_hidden_layers", source, default=1) != 1:
        raise ValueError(f"{source}: num_hidden_layers={hf['num_hidden_layers']}; only one-layer heads are supported")
    # llama.Config.from_hf parses heads, head_dim and RoPE (incl. Llama 3 scaling) the same way as the target's.
    lc = llama.Config.from_hf({**hf, "architectures": ["LlamaForCausalLM"], "model_type": "llama"},
                              dtype=target.dtype, source=source)
    for name, head_v, target_v in (("hidden_size", lc.hidden_size, target.hidden_size),
                                   ("vocab_size", lc.vocab_size, target.vocab_size),
                                   ("head_dim", lc.head_dim, target.head_dim),
                                   ("target_hidden_size", read_int(hf, "target_hidden_size", source,
                                                                   default=lc.hidden_size), target.hidden_size)):
        if head_v != target_v:
            raise ValueError(f"{source}: head {name}={head_v} but the target has {target_v}: "
                             "this EAGLE head was trained for another model")
    fc_bias = read_bool(hf, "bias", source, default="fc.bias" in keys)
    draft_vocab = read_int(hf, "draft_vocab_size", source, default=lc.vocab_size) if method == "eagle3" \
        else lc.vocab_size
    aux_layers = _aux_layers(hf, target, source) if method == "eagle3" else ()
    try:
        return EagleConfig(
            method=method, hidden_size=lc.hidden_size, intermediate_size=lc.intermediate_size,
            num_heads=lc.num_heads, num_kv_heads=lc.num_kv_heads, head_dim=lc.head_dim, vocab_size=lc.vocab_size,
            draft_vocab_size=draft_vocab, rms_norm_eps=lc.rms_norm_eps, rope_theta=lc.rope_theta,
            rope_scaling=lc.rope_scaling, aux_layers=aux_layers, fc_bias=fc_bias,
            own_embed="embed_tokens.weight" in keys, max_position_embeddings=lc.max_position_embeddings,
            dtype=target.dtype, attn_impl=target.attn_impl)
    except ValueError as e:  # EagleConfig's own checks (aux layers strictly increasing, ...)
        raise ValueError(f"{source}: {e}") from None


def _check_tensors(tensors: dict[str, np.ndarray], cfg: EagleConfig, source: str) -> None:
    """Every required tensor present with its HF shape, nothing unknown (a typo'd or foreign key is an error)."""
    want = _hf_shapes(cfg)
    optional = {}
    if cfg.method == "eagle3":
        optional["t2d"] = want.pop("t2d")  # redundant with d2t; checked when present
        if cfg.draft_vocab_size == cfg.vocab_size:
            optional["d2t"] = want.pop("d2t")  # a full-vocabulary head may omit the map (identity)
    keys = {k for k in tensors if not k.endswith(_IGNORED_SUFFIXES)}
    missing, unexpected = sorted(set(want) - keys), sorted(keys - set(want) - set(optional))
    if missing:
        raise ValueError(f"{source}: missing tensor(s) {missing} for an {cfg.method} head")
    if unexpected:
        raise ValueError(f"{source}: unexpected tensor(s) {unexpected} for an {cfg.method} head")
    for name, shape in (want | {k: v for k, v in optional.items() if k in keys}).items():
        if tuple(tensors[name].shape) != shape:
            raise ValueError(f"{source}: tensor {name} has shape {tuple(tensors[name].shape)}, expected {shape}")


def _d2t(tensors: dict[str, np.ndarray], cfg: EagleConfig, source: str) -> np.ndarray:
    if "d2t" not in tensors:
        return np.zeros(cfg.draft_vocab_size, np.int32)
    d2t = np.asarray(tensors["d2t"]).astype(np.int64)
    target_ids = np.arange(cfg.draft_vocab_size) + d2t
    if target_ids.min() < 0 or target_ids.max() >= cfg.vocab_size:
        raise ValueError(f"{source}: tensor d2t maps draft ids outside the target vocabulary [0, {cfg.vocab_size})")
    return d2t.astype(np.int32)


def load_eagle(path: str, target_cfg: llama.Config, method: str | None = None) -> tuple[EagleConfig, EagleWeights]:
    """Read an EAGLE head directory (config.json + weights), or a shipped head by name, for `target_cfg`; `method`
    None = detect from the file.

    Raises ValueError naming the file and tensor on any missing, unexpected or misshapen tensor, and when the head
    does not fit the target (hidden size, vocabulary, head_dim, aux layers).
    """
    from jaxspec.resolve import resolve_head

    if method is not None:
        check_method(method)
    path = str(resolve_head(path))
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise ValueError(f"{path}: no config.json")
    hf = read_json(config_path)
    source, tensors = _read_tensors(path)
    cfg = head_config(hf, set(tensors), target_cfg, method, source=config_path)
    _check_tensors(tensors, cfg, source)

    dtype = cfg.jnp_dtype
    fields = {f: jnp.asarray(_field_from_hf([np.asarray(tensors[n]) for n in names], t).astype(dtype))
              for f, names, _, t in _tables(cfg)}
    if cfg.method == "eagle3":
        fields["d2t"] = jnp.asarray(_d2t(tensors, cfg, source))
    w = EagleWeights(**{f.name: fields.get(f.name) for f in dataclasses.fields(EagleWeights)})
    _check_abstract(w, cfg, source)
    return cfg, w


def _check_abstract(w: EagleWeights, cfg: EagleConfig, source: str) -> None:
    """Belt and braces: the built tree has exactly `abstract(cfg)`'s structure and shapes."""
    got, want = jax.tree.structure(w), jax.tree.structure(abstract(cfg))
    if got != want:
        raise ValueError(f"{source}: internal error: weight tree {got} != {want}")
    for a, b in zip(jax.tree.leaves(w), jax.tree.leaves(abstract(cfg))):
        if a.shape != b.shape:
            raise ValueError(f"{source}: internal error: weight shape {a.shape} != {b.shape}")


def _to_hf_config(cfg: EagleConfig) -> dict:
    hf = cfg.layer_config().to_hf()
    hf["bias"] = cfg.fc_bias
    hf["torch_dtype"] = cfg.dtype
    if cfg.method == "eagle3":
        hf["architectures"] = ["LlamaForCausalLMEagle3"]
        hf["draft_vocab_size"] = cfg.draft_vocab_size
        hf["target_hidden_size"] = cfg.hidden_size
        # SpecForge/sglang count layer outputs: the input of layer i is the output of layer i - 1.
        hf["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in cfg.aux_layers],
                              "use_aux_hidden_state": True}
    return hf


def save_eagle(path: str, cfg: EagleConfig, weights: EagleWeights) -> None:
    """Write `config.json` + `model.safetensors` in the layout `load_eagle` reads (EAGLE-1 with the .bin's key
    names, EAGLE-3 as SpecForge exports), so trained heads load here and in EAGLE/sglang-style loaders. The
    directory is replaced only when complete."""
    out = {}
    for f, names, shapes, t in _tables(cfg):
        out |= dict(zip(names, _field_to_hf(np.asarray(getattr(weights, f)), shapes, t)))
    if cfg.method == "eagle3":
        d2t = np.asarray(weights.d2t).astype(np.int64)  # SpecForge stores int64
        t2d = np.zeros(cfg.vocab_size, np.bool_)
        t2d[np.arange(cfg.draft_vocab_size) + d2t] = True
        out |= {"d2t": d2t, "t2d": t2d}
    with atomic_dir(path) as tmp:
        save_file({name: np.ascontiguousarray(t) for name, t in out.items()}, tmp / SAFETENSORS,
                  metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(_to_hf_config(cfg), indent=2))
