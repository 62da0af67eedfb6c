"""jaxspec checkpoints: the `Weights` pytree in orbax plus the `Config` as JSON, for fast reload.

Layout of a checkpoint directory:
    jaxspec_config.json   the Config fields (the directory is renamed into place only when complete)
    weights/              orbax StandardCheckpointer directory of `llama.Weights`
`load_model` also accepts a Hugging Face directory (it has `config.json` instead).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from jaxspec.atomic import atomic_dir
from jaxspec.convert.hf_llama import load_hf_llama
from jaxspec.json_config import REQUIRED, read_bool, read_float, read_int, read_json, read_list, read_str, show
from jaxspec.models import llama
from jaxspec.models.llama import Config, Weights

CONFIG_FILE = "jaxspec_config.json"
DTYPES = ("float32", "bfloat16", "float16")
_READERS = {int: read_int, float: read_float, bool: read_bool, str: read_str}  # by Config field type


RUN_FIELDS = ("kernel",)  # launch parameters: a run's setting (LLM(kernel_config=...)), not the model's


def config_to_json(cfg: Config) -> dict:
    """The Config fields but RUN_FIELDS."""
    d = dataclasses.asdict(cfg)
    for name in RUN_FIELDS:
        del d[name]
    return d


def config_from_json(d: dict, source: Path) -> Config:
    """The Config of a jaxspec_config.json dict; every field type- and range-checked against Config's own."""
    fields = {f.name: f for f in dataclasses.fields(Config) if f.name not in RUN_FIELDS}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise ValueError(f"{source}: unknown Config fields {unknown}")
    hints = typing.get_type_hints(Config)
    values = {}
    for name, f in fields.items():
        default = REQUIRED if f.default is dataclasses.MISSING else f.default
        if name == "rope_scaling":
            values[name] = _rope_scaling(d, source)
        else:
            values[name] = _READERS[hints[name]](d, name, source, default)
    if values["num_heads"] % values["num_kv_heads"]:
        raise ValueError(f"{source}: num_kv_heads={values['num_kv_heads']} does not divide "
                         f"num_heads={values['num_heads']}")
    if values["dtype"] not in DTYPES:
        raise ValueError(f"{source}: field 'dtype' must be one of {DTYPES}, got {values['dtype']!r}")
    return Config(**values)


def _rope_scaling(d: dict, source: Path) -> tuple | None:
    """[[key, number], ...] (JSON's form of the sorted pairs) or null."""
    pairs = read_list(d, "rope_scaling", source, list, default=None)
    if pairs is None:
        return None
    if not all(len(p) == 2 and isinstance(p[0], str) for p in pairs):
        raise ValueError(f"{source}: field 'rope_scaling' must be a list of [name, number] pairs, got {show(pairs)}")
    scaling = dict(pairs)
    return tuple((k, read_float(scaling, k, f"{source}: rope_scaling")) for k, _ in pairs)


def save_checkpoint(path: str | Path, cfg: Config, weights: Weights) -> Path:
    """Write (or overwrite) a checkpoint; the leaves are saved in their own dtype, bit for bit. It is built under
    a temporary name and renamed into place when complete: a failed save leaves `path` as it was."""
    path = Path(path).absolute()
    with atomic_dir(path) as tmp:
        with ocp.StandardCheckpointer() as ckptr:
            ckptr.save(tmp / "weights", weights)
        (tmp / CONFIG_FILE).write_text(json.dumps(config_to_json(cfg), indent=2) + "\n")
    return path


def load_checkpoint(path: str | Path, sharding: jax.sharding.Sharding | None = None) -> tuple[Config, Weights]:
    """Config and weights of a jaxspec checkpoint, restored straight onto `sharding` (default: first device)."""
    path = Path(path).absolute()
    config_file = path / CONFIG_FILE
    try:
        cfg = config_from_json(read_json(config_file), config_file)
    except FileNotFoundError:
        raise ValueError(f"{config_file}: missing (not a complete jaxspec checkpoint)") from None
    sharding = sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
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
