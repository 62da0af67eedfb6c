"""jaxspec checkpoints: the `Weights` pytree in orbax plus the `Config` as JSON, for fast reload.

Layout of a checkpoint directory:
    jaxspec_config.json   the Config fields; written last, so its presence means the checkpoint is complete
    weights/              orbax StandardCheckpointer directory of `llama.Weights`
`load_model` also accepts a Hugging Face directory (it has `config.json` instead).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from jaxspec.convert.hf_llama import load_hf_llama
from jaxspec.models import llama
from jaxspec.models.llama import Config, Weights

CONFIG_FILE = "jaxspec_config.json"


def config_to_json(cfg: Config) -> dict:
    """The Config fields but `kernel` (launch parameters are a run's setting, not the model's)."""
    d = dataclasses.asdict(cfg)
    del d["kernel"]
    return d


def config_from_json(d: dict, source: Path) -> Config:
    fields = {f.name for f in dataclasses.fields(Config)}
    unknown = sorted(set(d) - fields)
    if unknown:
        raise ValueError(f"{source}: unknown Config fields {unknown}")
    if d.get("rope_scaling") is not None:
        d = {**d, "rope_scaling": tuple((k, v) for k, v in d["rope_scaling"])}
    try:
        return Config(**d)
    except TypeError as e:
        raise ValueError(f"{source}: {e}") from None


def save_checkpoint(path: str | Path, cfg: Config, weights: Weights) -> Path:
    """Write (or overwrite) a checkpoint; the leaves are saved in their own dtype, bit for bit."""
    path = Path(path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG_FILE).unlink(missing_ok=True)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path / "weights", weights, force=True)
    (path / CONFIG_FILE).write_text(json.dumps(config_to_json(cfg), indent=2) + "\n")
    return path


def load_checkpoint(path: str | Path, sharding: jax.sharding.Sharding | None = None) -> tuple[Config, Weights]:
    """Config and weights of a jaxspec checkpoint, restored straight onto `sharding` (default: first device)."""
    path = Path(path).absolute()
    config_file = path / CONFIG_FILE
    try:
        cfg = config_from_json(json.loads(config_file.read_text()), config_file)
    except FileNotFoundError:
        raise ValueError(f"{config_file}: missing (not a complete jaxspec checkpoint)") from None
    sharding = sharding or jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), llama.abstract(cfg))
    with ocp.StandardCheckpointer() as ckptr:
        weights = ckptr.restore(path / "weights", target)
    return cfg, weights


def load_model(path: str | Path, dtype: str | None = None) -> tuple[Config, Weights]:
    """Device weights of a jaxspec checkpoint or an HF Llama directory (told apart by their files), or of anything
    else `resolve_model` accepts (a preset, a preset's weights directory), in `dtype` (default: the checkpoint's
    own, float32 for HF)."""
    from jaxspec.resolve import resolve_model

    path = resolve_model(path).weights
    if (path / CONFIG_FILE).exists():
        cfg, weights = load_checkpoint(path)
        if dtype is None or dtype == cfg.dtype:
            return cfg, weights
        return cfg.replace(dtype=dtype), jax.tree.map(lambda a: a.astype(dtype), weights)
    cfg, weights = load_hf_llama(path, dtype or "float32")
    return cfg, jax.device_put(weights)
