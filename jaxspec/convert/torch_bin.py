"""Read a PyTorch `pytorch_model.bin` (zip format) into numpy without torch and without running pickled code.

A `.bin` is a zip holding `<prefix>/data.pkl` (the state dict's pickle) and `<prefix>/data/<key>` (raw storages).
Unpickling an arbitrary file can call any importable function, so `find_class` admits only the handful of
globals a state dict needs; anything else (e.g. `posix.system`) is refused before it is called.

Nothing is inflated on the file's word. Before the pickle runs, its opcodes are walked once (`pickletools`) so that
no declared length or memo index can make the unpickler allocate more than the pickle's own size; the unpickler
builds only descriptions (storage: dtype and element count; tensor: offset, shape and strides), each checked
against its storage and the storage against its zip entry's size; then the storages the tensors use are read in
bounded chunks. Peak memory stays within the tensors' own bytes, whatever sizes the file declares.
"""

from __future__ import annotations

import collections
import io
import math
import pickle
import pickletools
import struct
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, NamedTuple

import ml_dtypes
import numpy as np

from jaxspec.json_config import show

# torch's legacy typed storage classes, as named in the pickle, and the numpy dtype of their bytes.
STORAGE_DTYPES = {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}
MAX_PICKLE_BYTES = 64 << 20  # a state dict's pickle holds ~100 bytes a tensor: 64 MiB is ~600,000 tensors
# torch.save writes storages uncompressed; real weights deflate by well under 2x, so an entry that inflates to
# more than this many times its compressed size (past the first MiB) is a decompression bomb, not a checkpoint.
MAX_INFLATE_RATIO = 16
_READ_CHUNK = 1 << 22
# What a damaged zip archive raises from the zipfile module (central directory, local headers, CRC, inflating).
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError, struct.error,
               UnicodeDecodeError, OverflowError, NotImplementedError)
# What a damaged pickle raises from the unpickler (its own errors, and the builtin constructors it calls).
_PICKLE_ERRORS = (pickle.UnpicklingError, EOFError, TypeError, ValueError, KeyError, IndexError, AttributeError,
                  OverflowError, RecursionError, UnicodeDecodeError, struct.error)


class _Corrupt(Exception):
    """A problem with the file's contents; load_torch_bin prefixes the file's name."""


# What the unpickler hands back are NamedTuples: immutable even to pickle's BUILD opcode (no __dict__, no
# __setstate__), so a view checked when it is built cannot be rewritten by a later opcode.
class _StorageType(NamedTuple):
    dtype: np.dtype


class _Storage(NamedTuple):
    """A storage as the pickle declares it: its zip entry, dtype and element count (nothing read yet)."""
    member: str
    dtype: np.dtype
    numel: int


class _View(NamedTuple):
    """torch._utils._rebuild_tensor_v2's arguments, checked against the storage: a strided view into it."""
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


class _Global(NamedTuple):
    """An allowed callable global, immune to BUILD like the rest."""
    fn: Callable

    def __call__(self, *args):
        return self.fn(*args)


def _is_index(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _rebuild_tensor(storage, offset, size, stride, *_unused) -> _View:
    """torch._utils._rebuild_tensor_v2: the view must lie inside its storage and hold no more elements than it."""
    if not isinstance(storage, _Storage):
        raise _Corrupt(f"tensor built from {show(storage)}, not a storage")
    if not (_is_index(offset) and isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride)
            and all(map(_is_index, size + stride))):
        raise _Corrupt(f"tensor view offset={show(offset)} size={show(size)} stride={show(stride)} is malformed")
    numel = math.prod(size)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if numel else offset - 1
    if numel > storage.numel or last >= storage.numel:
        raise _Corrupt(f"tensor view offset={offset} size={size} stride={stride} overruns storage "
                       f"{storage.member} of {storage.numel} elements")
    return _View(storage, offset, size, stride)


def _rebuild_parameter(data, *_unused) -> _View:
    """torch._utils._rebuild_parameter: a Parameter is just its tensor here."""
    if not isinstance(data, _View):
        raise _Corrupt(f"parameter built from {show(data)}, not a tensor")
    return data


def _check_opcodes(data: bytes) -> None:
    """Walk the pickle without running it: every declared length must fit in the data, and memo indices stay
    below its size (the C unpickler grows its memo table to twice the largest index it is given)."""
    try:
        for op, arg, _pos in pickletools.genops(data):
            if op.name in ("PUT", "BINPUT", "LONG_BINPUT") and arg > len(data):
                raise _Corrupt(f"pickle memo index {arg} is out of range")
    except (ValueError, struct.error, UnicodeDecodeError) as e:  # what genops raises on malformed opcodes
        raise _Corrupt(f"cannot read the pickle: {e}") from None


class _Unpickler(pickle.Unpickler):
    ALLOWED: ClassVar[dict] = {
        ("torch._utils", "_rebuild_tensor_v2"): _Global(_rebuild_tensor),
        ("torch._utils", "_rebuild_parameter"): _Global(_rebuild_parameter),
        ("collections", "OrderedDict"): collections.OrderedDict,
        **{("torch", name): _StorageType(np.dtype(dt)) for name, dt in STORAGE_DTYPES.items()},
    }

    def __init__(self, data: bytes, archive: _Archive, prefix: str):
        super().__init__(io.BytesIO(data))
        self.archive, self.prefix = archive, prefix
        self.storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str):
        try:
            return self.ALLOWED[(module, name)]
        except (KeyError, TypeError):
            named = f"{module}.{name}"[:200] if isinstance(module, str) and isinstance(name, str) \
                else show((module, name))
            raise _Corrupt(f"refusing to unpickle forbidden global {named} (a state dict only needs tensors)") \
                from None

    def persistent_load(self, pid) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str) and _is_index(pid[4])):
            raise _Corrupt(f"unsupported persistent id {show(pid)}")
        _, storage_type, key, _location, numel = pid
        storage = _Storage(f"{self.prefix}data/{key}", storage_type.dtype, numel)
        known = self.storages.setdefault(key, storage)
        if known != storage:
            raise _Corrupt(f"storage {storage.member} is declared as both {known.numel} x {known.dtype} and "
                           f"{numel} x {storage.dtype}")
        if known is storage:
            self.archive.storage_entry(storage)
        return storage


class _Archive:
    """The zip file, read only in ways its own size bounds: entries are checked before a byte is inflated."""

    def __init__(self, zf: zipfile.ZipFile, size: int):
        self.zf, self.size = zf, size

    def entry(self, name: str, what: str = "entry", nbytes: int | None = None) -> zipfile.ZipInfo:
        """The named entry, checked: it exists, holds `nbytes` if given, and inflates without a bomb."""
        try:
            info = self.zf.getinfo(name)
        except KeyError:
            raise _Corrupt(f"{what} {name} is missing") from None
        if nbytes is not None and info.file_size != nbytes:
            raise _Corrupt(f"{what} {name} declares {nbytes} bytes but its zip entry holds {info.file_size}")
        if info.flag_bits & 0x1:
            raise _Corrupt(f"zip entry {name} is encrypted")
        if info.compress_size > self.size:
            raise _Corrupt(f"zip entry {name} claims {info.compress_size} compressed bytes, the file has {self.size}")
        if info.compress_type == zipfile.ZIP_STORED:
            if info.file_size != info.compress_size:
                raise _Corrupt(f"zip entry {name} is stored uncompressed but claims {info.file_size} bytes in "
                               f"{info.compress_size}")
        elif info.compress_type != zipfile.ZIP_DEFLATED:
            raise _Corrupt(f"zip entry {name} uses compression method {info.compress_type} (torch.save writes "
                           "entries uncompressed)")
        elif info.file_size > max(1 << 20, MAX_INFLATE_RATIO * info.compress_size):
            raise _Corrupt(f"zip entry {name} inflates {info.compress_size} bytes to {info.file_size} (over "
                           f"{MAX_INFLATE_RATIO}x: a decompression bomb, not a checkpoint)")
        return info

    def storage_entry(self, storage: _Storage) -> zipfile.ZipInfo:
        """The storage's entry, which must hold exactly the bytes the pickle declares."""
        return self.entry(storage.member, f"storage ({storage.numel} x {storage.dtype})",
                          storage.numel * storage.dtype.itemsize)

    def read(self, info: zipfile.ZipInfo, limit: int) -> np.ndarray:
        """The entry's bytes (at most `limit`, else an error), inflated in bounded chunks; the CRC is checked."""
        if info.file_size > limit:
            raise _Corrupt(f"zip entry {info.filename} holds {info.file_size} bytes, more than the {limit} "
                           "expected")
        buf = np.empty(info.file_size, np.uint8)
        view = memoryview(buf)
        try:
            with self.zf.open(info) as f:
                pos = 0
                while pos < len(buf):
                    n = f.readinto(view[pos:pos + _READ_CHUNK])
                    if not n:
                        raise _Corrupt(f"zip entry {info.filename} is truncated ({pos} of {len(buf)} bytes)")
                    pos += n
        except _ZIP_ERRORS as e:
            raise _Corrupt(f"zip entry {info.filename} is corrupt ({type(e).__name__}: {e})") from None
        return buf


def _materialize(views: dict[str, _View], archive: _Archive) -> dict[str, np.ndarray]:
    """Read each storage the tensors use, once, and cut the tensors out of it (copies only for strided views)."""
    storages: dict[_Storage, np.ndarray] = {}
    out = {}
    for name, v in views.items():
        s = v.storage
        if s not in storages:
            storages[s] = archive.read(archive.storage_entry(s), s.numel * s.dtype.itemsize).view(s.dtype)
        data = storages[s]
        contiguous = math.prod(v.size) == 0 or v.stride == tuple(
            math.prod(v.size[i + 1:]) for i in range(len(v.size)))
        if contiguous:
            out[name] = data[v.offset:v.offset + math.prod(v.size)].reshape(v.size)
        else:
            strides = [st * s.dtype.itemsize for st in v.stride]
            out[name] = np.array(np.lib.stride_tricks.as_strided(data[v.offset:], shape=v.size, strides=strides))
    return out


def _load(archive: _Archive) -> dict[str, np.ndarray]:
    names = archive.zf.namelist()
    pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        raise _Corrupt(f"expected one <prefix>/data.pkl in the archive, found {show(pickles)}")
    prefix = pickles[0][: -len("data.pkl")]
    if f"{prefix}byteorder" in names:
        order = bytes(archive.read(archive.entry(f"{prefix}byteorder"), 16)).strip()
        if order != b"little":
            raise _Corrupt(f"byte order {show(order)} is not supported (only little-endian storages)")
    data = bytes(archive.read(archive.entry(pickles[0]), MAX_PICKLE_BYTES))
    _check_opcodes(data)
    try:
        state = _Unpickler(data, archive, prefix).load()
    except _PICKLE_ERRORS as e:
        raise _Corrupt(f"cannot read the pickle ({type(e).__name__}: {show(str(e))})") from None
    if not isinstance(state, dict):
        raise _Corrupt(f"top-level object is {type(state).__name__}, expected a state dict")
    bad = [k for k, v in state.items() if not isinstance(k, str) or not isinstance(v, _View)]
    if bad:
        raise _Corrupt(f"entries {show(bad[:5])} are not tensors")
    return _materialize(state, archive)


def load_torch_bin(path: str | Path) -> dict[str, np.ndarray]:
    """State dict of a zip-format `torch.save` file as numpy arrays (bf16 as `ml_dtypes.bfloat16`).

    Any problem with the file is a ValueError naming it (and the storage or tensor where there is one)."""
    path = Path(path)
    try:
        zf = zipfile.ZipFile(path)
    except _ZIP_ERRORS as e:  # not a zip, or its central directory is damaged
        raise ValueError(f"{path}: not a readable zip-format PyTorch file ({type(e).__name__}: {e}; legacy "
                         "tar/pickle .bin files are not supported)") from None
    with zf:
        try:
            return _load(_Archive(zf, path.stat().st_size))
        except _Corrupt as e:
            raise ValueError(f"{path}: {e}") from None
        except _ZIP_ERRORS as e:  # a local header
            raise ValueError(f"{path}: corrupt zip archive ({type(e).__name__}: {e})") from None
