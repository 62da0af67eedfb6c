"""Bounds-check a GGUF file's layout before any parser trusts it.

gguf's `GGUFReader` (and transformers' GGUF import after it) take the file's counts and lengths at their word, and
a read past the end of the file gives an empty array instead of an error: one array that claims 2**40 elements
near the end makes the reader loop, appending an empty part per element, until memory runs out. `check_layout`
walks the header once with exact reads and rejects any count, length, type or offset the file cannot hold, so the
parsers then only ever see a consistent structure. Layout (little-endian): magic, version, tensor and key-value
counts; key-value pairs (key string, type, value); tensor infos (name, dims, ggml type, data offset); padding to
`general.alignment`; tensor data.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

VERSIONS = (2, 3)  # what gguf's reader handles (v1 counted in 32 bits)
SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # by GGUFValueType
STRING, ARRAY, UINT32 = 8, 9, 4
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32


class _Cursor:
    """Exact reads from the file's bytes: a read that does not fit is an error naming what was being read."""

    def __init__(self, data: np.ndarray, path: Path):
        self.data, self.path, self.pos = data, path, 0

    def need(self, n: int, what: str) -> None:
        if n > len(self.data) - self.pos:
            raise ValueError(f"{self.path}: truncated or corrupt GGUF header: {what} at byte {self.pos} needs {n} "
                             f"bytes, {len(self.data) - self.pos} remain")

    def skip(self, n: int, what: str) -> int:
        self.need(n, what)
        start, self.pos = self.pos, self.pos + n
        return start

    def take(self, n: int, what: str) -> bytes:
        start = self.skip(n, what)
        return bytes(self.data[start:self.pos])

    def uint(self, size: int, what: str) -> int:
        return int.from_bytes(self.take(size, what), "little")

    def string(self, what: str) -> str:
        raw = self.take(self.uint(8, f"{what}'s length"), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{self.path}: {what} at byte {self.pos - len(raw)} is not UTF-8") from None

    def skip_value(self, vtype: int, what: str) -> None:
        if vtype in SCALAR_SIZES:
            self.skip(SCALAR_SIZES[vtype], what)
        elif vtype == STRING:
            self.skip(self.uint(8, f"{what}'s length"), what)
        elif vtype == ARRAY:
            itype, count = self.uint(4, f"{what}'s item type"), self.uint(8, f"{what}'s length")
            if itype in SCALAR_SIZES:
                self.skip(count * SCALAR_SIZES[itype], f"{what} ({count} items)")
            elif itype == STRING:
                self.need(count * 8, f"{what} ({count} strings)")  # bounds the loop by the file's size
                for i in range(count):
                    self.skip(self.uint(8, f"{what}[{i}]'s length"), f"{what}[{i}]")
            else:
                raise ValueError(f"{self.path}: {what} is an array of type {itype} (only scalars and strings)")
        else:
            raise ValueError(f"{self.path}: {what} has unknown value type {vtype}")


def check_layout(path: Path) -> None:
    """Raise a ValueError naming `path` unless every part of its GGUF layout fits the file."""
    data = np.memmap(path, np.uint8, mode="r") if path.stat().st_size else np.zeros(0, np.uint8)
    c = _Cursor(data, path)
    magic = bytes(data[:4])
    if magic != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (magic {magic!r})")
    c.skip(4, "magic")
    version = c.uint(4, "version")
    if version not in VERSIONS:
        raise ValueError(f"{path}: GGUF version {version} is not supported ({VERSIONS}; big-endian files neither)")
    n_tensors, n_kv = c.uint(8, "tensor count"), c.uint(8, "key-value count")
    alignment, keys = DEFAULT_ALIGNMENT, set()
    for i in range(n_kv):  # each pair takes at least 12 bytes, so a false count runs out of file quickly
        key = c.string(f"metadata key {i}")
        if key in keys:
            raise ValueError(f"{path}: metadata key {key!r} appears twice")
        keys.add(key)
        vtype = c.uint(4, f"metadata {key!r}'s type")
        if key == "general.alignment":
            alignment = c.uint(4, "general.alignment") if vtype == UINT32 else 0
            if alignment <= 0 or alignment & (alignment - 1):
                raise ValueError(f"{path}: general.alignment must be a power of two (uint32)")
        else:
            c.skip_value(vtype, f"metadata {key!r}")
    names, spans = set(), []
    for i in range(n_tensors):
        name = c.string(f"tensor name {i}")
        if name in names:
            raise ValueError(f"{path}: tensor {name!r} appears twice")
        names.add(name)
        n_dims = c.uint(4, f"tensor {name!r}'s rank")
        if n_dims > MAX_DIMS:
            raise ValueError(f"{path}: tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})")
        dims = [c.uint(8, f"tensor {name!r}'s shape") for _ in range(n_dims)]
        raw_type = c.uint(4, f"tensor {name!r}'s type")
        if raw_type not in {t.value for t in GGML_QUANT_SIZES}:
            raise ValueError(f"{path}: tensor {name!r} has unknown ggml type {raw_type}")
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(raw_type)]
        if dims and dims[0] % block:
            raise ValueError(f"{path}: tensor {name!r} rows of {dims[0]} are not whole blocks of {block}")
        offset = c.uint(8, f"tensor {name!r}'s offset")
        if offset % alignment:
            raise ValueError(f"{path}: tensor {name!r} offset {offset} is not a multiple of {alignment}")
        spans.append((name, offset, math.prod(dims) // block * type_size))
    data_start = -(-c.pos // alignment) * alignment
    for name, offset, nbytes in spans:
        if data_start + offset + nbytes > len(data):
            raise ValueError(f"{path}: tensor {name!r} ({nbytes} bytes at {data_start + offset}) runs past the end "
                             f"of the file ({len(data)} bytes)")
