"""GGUF (llama.cpp) Llama file -> Hugging Face Llama directory, to reach models that ship only that way.

Tensors are dequantized to fp32 (exact: every GGML block format is a scale and offset over small integers) and
renamed to HF names; llama.cpp's row permutation of q_proj and k_proj is undone. The config comes from the
`llama.*` metadata, the tokenizer and chat template through transformers' own GGUF tokenizer import.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, ReaderTensor
from gguf.quants import dequantize

from jaxspec.atomic import atomic_dir
from jaxspec.convert.gguf_layout import check_layout
from jaxspec.convert.hf_llama import layer_slots, save_hf_llama, weights_from_hf
from jaxspec.convert.tensors import Tensor
from jaxspec.json_config import show
from jaxspec.models import llama
from jaxspec.models.llama import Config, Weights
from jaxspec.tokenizer import from_pretrained

GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(.+)")
# llama.cpp stores Llama 3 rope scaling as per-frequency divisors in this tensor, not as metadata. Every
# released Llama 3.x uses these three values (only `factor` varies); we check the divisors match them.
ROPE_FREQS = "rope_freqs.weight"
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192.0}
_REQUIRED = object()


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: w.reshape(n_head, 2, d/2, in).swapaxes(1, 2) (interleaved RoPE pairs)
    back to HF's rotate-half row order."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# What a metadata value must be, as `ReaderField.contents()` returns it, and how to say so.
_KINDS = {
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)),
    str: ("a string", lambda v: isinstance(v, str)),
    list: ("an array", lambda v: isinstance(v, list)),
}


def _field(reader: GGUFReader, path: Path, key: str, kind: type, default: Any = _REQUIRED) -> Any:
    """A metadata value of the given kind; a ValueError names the file and the key."""
    f = reader.fields.get(key)
    if f is None:
        if default is _REQUIRED:
            raise ValueError(f"{path}: metadata field {key!r} is missing")
        return default
    try:
        value = f.contents()
    except UnicodeDecodeError:
        raise ValueError(f"{path}: metadata field {key!r} is not UTF-8 text") from None
    what, ok = _KINDS[kind]
    if not ok(value):
        raise ValueError(f"{path}: metadata field {key!r} must be {what}, got {show(value)}")
    return value


def _size(reader: GGUFReader, path: Path, key: str, default: Any = _REQUIRED) -> int:
    """A positive integer metadata value (a count or a width)."""
    value = _field(reader, path, key, int, default)
    if value < 1:
        raise ValueError(f"{path}: metadata field {key!r} must be >= 1, got {value}")
    return value


def _f32(x: float) -> float:
    """GGUF stores floats as fp32: give back the short decimal (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(x)))


def _open(path: Path) -> GGUFReader:
    check_layout(path)  # GGUFReader trusts every count in the file
    try:
        reader = GGUFReader(path)
    except (ValueError, OSError, IndexError, KeyError) as e:  # what GGUFReader raises on a malformed file
        raise ValueError(f"{path}: not a readable GGUF file ({e})") from None
    arch = _field(reader, path, "general.architecture", str)
    if arch != "llama":
        raise ValueError(f"{path}: general.architecture is {arch!r}; only 'llama' is supported")
    return reader


def hf_config(reader: GGUFReader, path: Path) -> dict:
    """The HF `config.json` dict the `llama.*` metadata describes (rope scaling is added from the tensors)."""
    if _field(reader, path, "llama.expert_count", int, 0):
        raise ValueError(f"{path}: llama.expert_count is set; mixture-of-experts models are not supported")
    scaling = _field(reader, path, "llama.rope.scaling.type", str, "none")
    if scaling != "none":
        raise ValueError(f"{path}: llama.rope.scaling.type {scaling!r} is not supported")
    hidden, heads = _size(reader, path, "llama.embedding_length"), _size(reader, path, "llama.attention.head_count")
    head_dim = _size(reader, path, "llama.attention.key_length", hidden // heads or 1)
    for key in ("llama.attention.value_length", "llama.rope.dimension_count"):
        if _size(reader, path, key, head_dim) != head_dim:
            raise ValueError(f"{path}: {key} = {_size(reader, path, key)} differs from the head size {head_dim}")
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise ValueError(f"{path}: tensor 'token_embd.weight' is missing")
    if len(embed.shape) != 2:
        raise ValueError(f"{path}: tensor 'token_embd.weight' has {len(embed.shape)} dimensions, expected 2")
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": int(embed.shape[1]), "hidden_size": hidden,
        "intermediate_size": _size(reader, path, "llama.feed_forward_length"),
        "num_hidden_layers": _size(reader, path, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _size(reader, path, "llama.attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rms_norm_eps": _f32(_field(reader, path, "llama.attention.layer_norm_rms_epsilon", float)),
        "rope_theta": _f32(_field(reader, path, "llama.rope.freq_base", float, 10000.0)),
        "max_position_embeddings": _size(reader, path, "llama.context_length", 2048),
        "tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors),
    }


def llama3_rope_scaling(cfg: Config, divisors: np.ndarray, path: Path) -> dict | None:
    """Recover HF's llama3 `rope_scaling` from llama.cpp's `rope_freqs` divisors, checking it reproduces them."""
    if divisors.shape != (cfg.head_dim // 2,):
        raise ValueError(f"{path}: tensor {ROPE_FREQS!r} has shape {divisors.shape}, the head size implies "
                         f"({cfg.head_dim // 2},)")
    factor = float(divisors.max())
    if factor == 1.0:
        return None
    scaling = {"rope_type": "llama3", "factor": factor, **LLAMA3_ROPE}
    scaled = cfg.replace(rope_scaling=tuple((k, scaling[k]) for k in (
        "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")))
    expected = llama.rope_inv_freq(cfg) / llama.rope_inv_freq(scaled)
    if divisors.shape != expected.shape or not np.allclose(divisors, expected, rtol=1e-5):
        raise ValueError(f"{path}: tensor {ROPE_FREQS!r} is not Llama 3 rope scaling with factor {factor} and "
                         f"{LLAMA3_ROPE}")
    return scaling


def read_tensors(reader: GGUFReader, cfg: Config, path: Path) -> dict[str, Tensor]:
    """Every weight dequantized to fp32 under its HF name, q/k rows back in HF order."""
    out = {}
    for t in reader.tensors:
        m = LAYER_TENSOR.fullmatch(t.name)
        if t.name in GLOBAL_NAMES:
            name = GLOBAL_NAMES[t.name]
        elif m and m[2] in LAYER_NAMES:
            name = f"model.layers.{m[1]}.{LAYER_NAMES[m[2]]}"
        elif t.name == ROPE_FREQS:
            continue
        else:
            raise ValueError(f"{path}: unexpected tensor {t.name!r} for a Llama model")
        w = _dequantize(t, path)
        if m and m[2] in ("attn_q.weight", "attn_k.weight"):
            heads = cfg.num_heads if m[2] == "attn_q.weight" else cfg.num_kv_heads
            shape = layer_slots(cfg)[LAYER_NAMES[m[2]]][2]
            if w.shape != shape:
                raise ValueError(f"{path}: tensor {t.name!r} has shape {w.shape}, the metadata implies {shape}")
            w = unpermute_qk(w, heads)
        out[name] = Tensor(w, path)
    return out


def _dequantize(t: ReaderTensor, path: Path) -> np.ndarray:
    """The tensor in fp32 and its HF (row-major) shape."""
    try:
        return dequantize(t.data, t.tensor_type).astype(np.float32).reshape(tuple(reversed(t.shape.tolist())))
    except (NotImplementedError, ValueError) as e:
        raise ValueError(f"{path}: cannot dequantize tensor {t.name!r} ({t.tensor_type.name}): {e}") from None


TOKENIZER_MODELS = ("llama", "gpt2")  # sentencepiece and byte-level BPE: the Llama family's two


def check_tokenizer(reader: GGUFReader, path: Path, vocab_size: int) -> dict:
    """Check the `tokenizer.*` metadata transformers builds the tokenizer from (so it cannot fail half-way through
    a conversion); returns the bos/eos/pad ids the file sets, for config.json and generation_config.json."""
    model = _field(reader, path, "tokenizer.ggml.model", str)
    if model not in TOKENIZER_MODELS:
        raise ValueError(f"{path}: tokenizer.ggml.model {model!r} is not supported (expected one of "
                         f"{TOKENIZER_MODELS})")
    tokens = _field(reader, path, "tokenizer.ggml.tokens", list)
    if not tokens or len(tokens) > vocab_size or not all(isinstance(t, str) for t in tokens):
        raise ValueError(f"{path}: tokenizer.ggml.tokens must be 1 to {vocab_size} strings (the embedding's rows), "
                         f"got {show(tokens)}")
    for key, kind in (("tokenizer.ggml.scores", float), ("tokenizer.ggml.token_type", int)):
        values = _field(reader, path, key, list, None)
        if values is not None and (len(values) != len(tokens) or not all(_KINDS[kind][1](v) for v in values)):
            raise ValueError(f"{path}: {key} must be {len(tokens)} values, one per token, got {show(values)}")
    merges = _field(reader, path, "tokenizer.ggml.merges", list, None)
    if merges is not None and not all(isinstance(m, str) and len(m.split(" ")) == 2 for m in merges):
        raise ValueError(f"{path}: tokenizer.ggml.merges must be strings 'left right', got {show(merges)}")
    if merges is None and reader.fields.get("tokenizer.ggml.scores") is None:
        raise ValueError(f"{path}: metadata field 'tokenizer.ggml.merges' is missing (and no tokenizer.ggml.scores "
                         "to derive merges from)")
    _field(reader, path, "tokenizer.chat_template", str, None)
    ids = {}
    for hf_key, key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                        ("pad_token_id", "padding_token_id"), (None, "unknown_token_id")):
        value = _field(reader, path, f"tokenizer.ggml.{key}", int, None)
        if value is not None and not 0 <= value < len(tokens):
            raise ValueError(f"{path}: tokenizer.ggml.{key} = {value} is not a token id (0 to {len(tokens) - 1})")
        if value is not None and hf_key is not None:
            ids[hf_key] = value
    return ids


def save_tokenizer(path: Path, out_dir: Path) -> None:
    """transformers rebuilds the fast tokenizer (and chat template) from the GGUF's `tokenizer.*` metadata."""
    from_pretrained(path, path.parent, gguf_file=path.name).save_pretrained(out_dir)


def load_gguf(gguf_path: str | Path, dtype: str = "float32") -> tuple[Config, Weights, dict]:
    """Config, host weights and special token ids of a GGUF Llama file: every metadata field and tensor checked
    (the tokenizer's too), so that any problem is a ValueError naming the file before anything is written."""
    path = Path(gguf_path).resolve()
    reader = _open(path)
    hf = hf_config(reader, path)
    cfg = Config.from_hf(hf, dtype=dtype, source=str(path))
    rope_freqs = next((t for t in reader.tensors if t.name == ROPE_FREQS), None)
    if rope_freqs is not None:
        hf["rope_scaling"] = llama3_rope_scaling(cfg, _dequantize(rope_freqs, path).ravel(), path)
        cfg = Config.from_hf(hf, dtype=dtype, source=str(path))
    ids = check_tokenizer(reader, path, cfg.vocab_size)
    return cfg, weights_from_hf(cfg, read_tensors(reader, cfg, path), path), ids


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Write an HF Llama directory (config, weights, tokenizer, generation config) for a GGUF file: built under a
    temporary name and renamed into place when complete, so a failure leaves no directory behind."""
    path, out_dir = Path(gguf_path).resolve(), Path(out_dir)
    cfg, weights, ids = load_gguf(path, dtype)
    with atomic_dir(out_dir) as tmp:
        save_hf_llama(cfg, weights, tmp, extra_config=ids)
        (tmp / "generation_config.json").write_text(json.dumps(ids, indent=2) + "\n")
        save_tokenizer(path, tmp)
    return out_dir
