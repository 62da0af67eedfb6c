"""Read a PyTorch `pytorch_model.bin` (zip format) into numpy without torch and without running pickled code.

A `.bin` is a zip holding `<prefix>/data.pkl` (the state dict's pickle) and `<prefix>/data/<key>` (raw storages).
Unpickling an arbitrary file can call any importable function, so `find_class` admits only the handful of
globals a state dict needs; anything else (e.g. `posix.system`) is refused before it is called.
"""

from __future__ import annotations

import collections
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import ml_dtypes
import numpy as np

# torch's legacy typed storage classes, as named in the pickle, and the numpy dtype of their bytes.
STORAGE_DTYPES = {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}


class _CorruptTensor(Exception):
    pass


@dataclass(frozen=True)
class _StorageType:
    dtype: np.dtype


def _rebuild_tensor(storage: np.ndarray, offset: int, size: tuple, stride: tuple, *_unused) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2: a strided view into the storage, copied out to a dense array."""
    last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset - 1
    if offset < 0 or last >= storage.size or any(s < 0 for s in stride):
        raise _CorruptTensor(f"view offset={offset} size={size} stride={stride} overruns a storage of "
                             f"{storage.size} elements")
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=size, strides=[s * item for s in stride])
    return np.array(view)


def _rebuild_parameter(data: np.ndarray, *_unused) -> np.ndarray:
    """torch._utils._rebuild_parameter: a Parameter is just its tensor here."""
    return data


class _Unpickler(pickle.Unpickler):
    ALLOWED: ClassVar[dict] = {
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
        ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
        ("collections", "OrderedDict"): collections.OrderedDict,
        **{("torch", name): _StorageType(np.dtype(dt)) for name, dt in STORAGE_DTYPES.items()},
    }

    def __init__(self, file, path: Path, archive: zipfile.ZipFile, prefix: str):
        super().__init__(file)
        self.path, self.archive, self.prefix = path, archive, prefix
        self.storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str):
        try:
            return self.ALLOWED[(module, name)]
        except KeyError:
            raise ValueError(f"{self.path}: refusing to unpickle forbidden global {module}.{name} "
                             "(a state dict only needs tensors)") from None

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise ValueError(f"{self.path}: unsupported persistent id {pid!r}")
        _, storage_type, key, _location, numel = pid
        if key not in self.storages:
            member = f"{self.prefix}data/{key}"
            try:
                raw = self.archive.read(member)
            except KeyError:
                raise ValueError(f"{self.path}: storage {member} is missing") from None
            dtype = storage_type.dtype
            if len(raw) < numel * dtype.itemsize:
                raise ValueError(f"{self.path}: storage {member} holds {len(raw)} bytes, "
                                 f"expected {numel} x {dtype.itemsize}")
            self.storages[key] = np.frombuffer(raw, dtype, count=numel)
        return self.storages[key]


def load_torch_bin(path: str | Path) -> dict[str, np.ndarray]:
    """State dict of a zip-format `torch.save` file as numpy arrays (bf16 as `ml_dtypes.bfloat16`)."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path}: not a zip-format PyTorch file (legacy tar/pickle .bin files are not supported)")
    with zipfile.ZipFile(path) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise ValueError(f"{path}: expected one <prefix>/data.pkl in the archive, found {pickles}")
        prefix = pickles[0][: -len("data.pkl")]
        byteorder = f"{prefix}byteorder"
        if byteorder in archive.namelist() and archive.read(byteorder).strip() != b"little":
            raise ValueError(f"{path}: big-endian storages are not supported")
        with archive.open(pickles[0]) as f:
            unpickler = _Unpickler(f, path, archive, prefix)
            try:
                state = unpickler.load()
            except _CorruptTensor as e:
                raise ValueError(f"{path}: corrupt tensor: {e}") from None
            except (pickle.UnpicklingError, EOFError, TypeError) as e:
                raise ValueError(f"{path}: cannot read the pickle: {e}") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: top-level object is {type(state).__name__}, expected a state dict")
    bad = [k for k, v in state.items() if not isinstance(k, str) or not isinstance(v, np.ndarray)]
    if bad:
        raise ValueError(f"{path}: entries {bad[:5]} are not tensors")
    return dict(state)
