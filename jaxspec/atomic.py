"""Outputs that appear complete or not at all.

A directory is built under a temporary name next to its destination (`.NAME.<pid>.<random>.partial`) and renamed
into place only when everything in it is written, so a failed or interrupted conversion leaves nothing a later
load could pick up: the destination is either untouched or complete.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _sibling(dst: Path, suffix: str) -> Path:
    return dst.parent / f".{dst.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.{suffix}"


@contextmanager
def atomic_dir(dst: str | Path) -> Iterator[Path]:
    """Yield an empty directory to write into; on success it replaces `dst` (an older `dst` is removed), on any
    exception it is deleted and `dst` is left as it was."""
    dst = Path(dst).absolute()
    if dst.exists() and not dst.is_dir():
        raise ValueError(f"{dst}: exists and is not a directory")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(dst, "partial")
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if dst.is_symlink() or dst.exists():
        old = _sibling(dst, "old")
        dst.rename(old)  # POSIX cannot rename over a non-empty directory: move the old one aside first
    tmp.rename(dst)
    if old is not None:
        old.unlink() if old.is_symlink() else shutil.rmtree(old)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write a file under a temporary name and rename it over `path`: readers see the old or the new text."""
    path = Path(path)
    tmp = _sibling(path, "partial")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
