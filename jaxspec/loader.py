"""Loading what an `LLM` runs: the target (a preset, a checkpoint, an HF directory, or random weights of a
config's shape) and the EAGLE head, in the dtype the backend wants, placed on the devices."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

from jaxspec.config import SpeculativeConfig
from jaxspec.json_config import read_json
from jaxspec.models import eagle, llama

LOAD_FORMATS = ("auto", "dummy")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's other spellings


def default_dtype() -> str | None:
    """bf16 on an accelerator (as the checkpoints' torch_dtype says for Llama models); the stored dtype elsewhere."""
    return "bfloat16" if jax.default_backend() == "gpu" else None


def default_attn_impl() -> str:
    return "pallas" if jax.default_backend() == "gpu" else "xla"


def default_layer_loop() -> str:
    return "unroll" if jax.default_backend() == "gpu" else "scan"


def check_choice(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def load_target(model: str, load_format: str, dtype: str, weights_dir: str | None = None,
                revision: str | None = None) -> tuple[Path, llama.Config, llama.Weights | None]:
    """(path, config, weights) of the target; weights None for load_format="dummy" (random ones are drawn once
    the config is final). weights_dir: where a preset or a Hub repo is fetched; revision: the Hub repo's."""
    check_choice("load_format", load_format, LOAD_FORMATS)
    dtype = DTYPE_ALIASES.get(dtype, dtype)
    check_choice("dtype", dtype, DTYPES)
    if load_format == "dummy":  # random weights of a real shape: speed measurements without the weights
        return Path(model), dummy_config(Path(model), dtype), None
    from jaxspec.convert.checkpoint import load_model
    from jaxspec.resolve import resolve_model

    path = resolve_model(model, weights_dir, revision).weights
    return path, *load_model(path, default_dtype() if dtype == "auto" else dtype)


def dummy_config(path: Path, dtype: str) -> llama.Config:
    """The shape of a model from its config.json alone (a directory or the file itself)."""
    config_file = path / "config.json" if path.is_dir() else path
    if not config_file.exists():
        raise ValueError(f"{config_file}: load_format='dummy' needs a config.json to take the shape from")
    hf = read_json(config_file)
    if dtype == "auto":
        stored = hf.get("dtype", hf.get("torch_dtype", "bfloat16"))  # transformers 5 writes "dtype"
        dtype = {"bfloat16": "bfloat16", "float16": "bfloat16"}.get(stored, "float32")
    return llama.Config.from_hf(hf, dtype=dtype, source=str(config_file))


def load_draft(spec: SpeculativeConfig, target_cfg: llama.Config, load_format: str,
               seed: int) -> tuple[eagle.EagleConfig, eagle.EagleWeights]:
    """The EAGLE head in the target's dtype and attention implementation; load_format="dummy": a random head
    shaped like one target layer."""
    from jaxspec.convert.eagle import load_eagle
    if load_format == "dummy":
        draft_cfg = eagle.EagleConfig.from_target(target_cfg, spec.method)
        draft_w = eagle.init(draft_cfg, jax.random.key(seed + 1))
    else:
        draft_cfg, draft_w = load_eagle(spec.model, target_cfg, spec.method)
    draft_cfg = draft_cfg.replace(attn_impl=target_cfg.attn_impl, kernel=target_cfg.kernel, dtype=target_cfg.dtype)
    dtype = target_cfg.jnp_dtype
    draft_w = jax.tree.map(lambda a: jnp.asarray(a).astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating)
                           else jnp.asarray(a), draft_w)
    return draft_cfg, draft_w
