"""Where jaxspec's own files are: the checkout it runs from, or the installed wheel; and the per-user cache.

From a checkout, presets are `models/*.json`, shipped EAGLE heads `weights/eagle*/`, and fetched weights go to
`weights/`. An installed wheel carries the presets and shipped heads as package data (`jaxspec/model_presets/`,
`jaxspec/shipped_heads/`, mapped from those directories in pyproject.toml) and fetches weights into the per-user
cache. Everything is decided when called, so a changed environment variable is seen.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def source_tree() -> Path | None:
    """The checkout this package is imported from (pyproject.toml and models/ beside jaxspec/), else None."""
    root = PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() and (root / "models").is_dir() else None


def user_cache_dir() -> Path:
    """$XDG_CACHE_HOME/jaxspec, by default ~/.cache/jaxspec."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jaxspec"


def presets_dir() -> Path:
    tree = source_tree()
    return tree / "models" if tree else PACKAGE / "model_presets"


def shipped_heads_dir() -> Path:
    tree = source_tree()
    return tree / "weights" if tree else PACKAGE / "shipped_heads"


def weights_dir(override: str | Path | None = None) -> Path:
    """Where presets are fetched and converted to: `override`, else $JAXSPEC_WEIGHTS_DIR, else the checkout's
    weights/, else <user cache>/weights (a wheel's own directory is no place for gigabytes)."""
    chosen = override or os.environ.get("JAXSPEC_WEIGHTS_DIR")
    if chosen:
        return Path(chosen).expanduser()
    tree = source_tree()
    return tree / "weights" if tree else user_cache_dir() / "weights"
