"""The raw tensors of a Hugging Face checkpoint directory, each remembering the file it came from.

Reads a single `model.safetensors`, a sharded set named by `model.safetensors.index.json`, or a
`pytorch_model.bin` (through the torch-free reader). The safetensors parser is our own, a few lines over the
documented format, so that a truncated or corrupt file fails with the file and tensor named, and bf16 loads as
`ml_dtypes.bfloat16` (the `safetensors.numpy` reader cannot).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from jaxspec.convert.torch_bin import load_torch_bin
from jaxspec.json_config import read_dict, read_json, show

SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "I64": np.int64,
    "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}


@dataclass(frozen=True)
class Tensor:
    array: np.ndarray
    file: Path  # where it was read from, for error messages


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """All tensors of one `.safetensors` file, memory-mapped (read-only views)."""
    path = Path(path)
    data = np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.zeros(0, np.uint8)
    if data.size < 8:
        raise ValueError(f"{path}: truncated safetensors file ({data.size} bytes, no header)")
    header_len = int(data[:8].view("<u8")[0])
    if 8 + header_len > data.size:
        raise ValueError(f"{path}: truncated safetensors file (header of {header_len} bytes, file {data.size})")
    try:
        header = json.loads(bytes(data[8:8 + header_len]))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{path}: corrupt safetensors header: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: corrupt safetensors header (not a JSON object)")
    header.pop("__metadata__", None)
    body = data[8 + header_len:]
    out = {}
    for name, info in header.items():
        dtype, shape, (start, end) = _entry(info, path, name)
        if end > body.size:
            raise ValueError(f"{path}: tensor {name!r} is truncated (its data ends at byte {end} of the data "
                             f"section, which has {body.size})")
        if end - start != math.prod(shape) * dtype.itemsize:
            raise ValueError(f"{path}: tensor {name!r} spans {end - start} bytes, {shape} {dtype} needs "
                             f"{math.prod(shape) * dtype.itemsize}")
        out[name] = body[start:end].view(dtype).reshape(shape)
    return out


def _entry(info, path: Path, name: str) -> tuple[np.dtype, tuple[int, ...], tuple[int, int]]:
    """(dtype, shape, (start, end)) of one header entry: a known dtype, sizes and offsets that are non-negative
    integers (not bools or floats), start <= end."""
    def indices(v) -> bool:
        return isinstance(v, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in v)

    ok = (isinstance(info, dict) and info.get("dtype") in SAFETENSORS_DTYPES and indices(info.get("shape"))
          and indices(info.get("data_offsets")) and len(info["data_offsets"]) == 2
          and info["data_offsets"][0] <= info["data_offsets"][1])
    if not ok:
        raise ValueError(f"{path}: tensor {show(name)} has a bad header entry {show(info)}")
    return np.dtype(SAFETENSORS_DTYPES[info["dtype"]]), tuple(info["shape"]), tuple(info["data_offsets"])


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The weight files of an HF directory, in order of preference: safetensors (single or sharded), then .bin."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_dict(read_json(index), "weight_map", index)
        shards = sorted(set(weight_map.values()), key=str)
        bad = [s for s in shards if not isinstance(s, str) or Path(s).name != s or s in ("", ".", "..")]
        if not weight_map or bad:
            raise ValueError(f"{index}: 'weight_map' must map tensor names to shard file names in this directory, "
                             f"got {show(bad or weight_map)}")
        missing = [s for s in shards if not (model_dir / s).exists()]
        if missing:
            raise ValueError(f"{index}: shards {missing} are missing")
        return [model_dir / s for s in shards]
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (model_dir / name).exists():
            return [model_dir / name]
    raise ValueError(f"{model_dir}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin")


def read_checkpoint(model_dir: str | Path) -> dict[str, Tensor]:
    """Every tensor of an HF checkpoint directory; a name found in two files is an error."""
    out: dict[str, Tensor] = {}
    for file in checkpoint_files(Path(model_dir)):
        arrays = load_torch_bin(file) if file.suffix == ".bin" else read_safetensors(file)
        for name, array in arrays.items():
            if name in out:
                raise ValueError(f"{file}: tensor {name!r} is also in {out[name].file}")
            out[name] = Tensor(array, file)
    return out
