"""One answer, for every entry point, to "where is this model?": `LLM`, `load_model`, `jaxspec generate`,
`train-eagle` and the benchmarks all accept the same five things:
    a preset name                  "smollm2-135m-instruct" (fetched and converted on first use)
    a preset's weights directory   weights/smollm2-135m-instruct/ (holding ckpt/ and hf/)
    a jaxspec checkpoint           .../ckpt/ (jaxspec_config.json); its tokenizer is found in a sibling hf/
    a Hugging Face directory       config.json + safetensors or pytorch_model.bin (+ the tokenizer)
    a Hugging Face Hub repo id     "HuggingFaceTB/SmolLM2-135M-Instruct", as vLLM takes it: its config, tokenizer
                                   and weights (safetensors when it has them) are downloaded into the Hub's cache
and get where the weights, the HF config, the tokenizer and (for a preset) the default EAGLE head are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from jaxspec import presets
from jaxspec.convert.checkpoint import CONFIG_FILE as CKPT_CONFIG
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class ModelFiles:
    weights: Path  # what load_model reads: a jaxspec checkpoint or an HF directory
    hf_dir: Path | None  # the HF directory (config.json): transformers' peer in the benchmark
    tokenizer: Path | None  # the directory holding the tokenizer, None when there is none (token ids only)
    preset: str | None  # the preset these weights are, if any

    @property
    def head(self) -> dict | None:
        """The preset's default speculative_config (its shipped EAGLE head), None without one."""
        return presets.load_preset(self.preset).eagle if self.preset else None


def beside(path: Path) -> tuple[Path, ...]:
    """Where a model's HF files may be: the directory itself, its hf/ (a preset's weights directory), a
    checkpoint's sibling hf/ (ckpt/ of a preset), and `jaxspec convert`'s DST-hf for a converted GGUF."""
    return path, path / "hf", path.parent / "hf", path.with_name(path.name + "-hf")


def find_beside(path: Path, *names: str) -> Path | None:
    """The first directory of `beside(path)` that holds one of these files."""
    return next((d for d in beside(path) if any((d / n).is_file() for n in names)), None)


def weights_of(path: Path) -> Path:
    """The checkpoint or HF directory inside `path`: ckpt/ first (the fast reload), then the path itself, then hf/."""
    for d, marker in ((path / "ckpt", CKPT_CONFIG), (path, CKPT_CONFIG), (path, "config.json"),
                      (path / "hf", "config.json")):
        if (d / marker).is_file():
            return d
    raise ValueError(f"{path}: neither a jaxspec checkpoint ({CKPT_CONFIG}), a Hugging Face directory "
                     f"(config.json), nor a preset's weights directory (ckpt/ or hf/ inside)")


def resolve_model(model: str | Path, weights_dir: str | Path | None = None, revision: str | None = None) -> ModelFiles:
    """A directory as it is; otherwise a preset, fetched (into `weights_dir`, default `paths.weights_dir()`) if it
    is not yet. ValueError names the model when it is neither."""
    path = Path(model).expanduser()
    preset = None
    if not path.exists() and str(model) in presets.list_presets():
        preset = str(model)
        path = presets.fetch_preset(preset, weights_dir)
    elif not path.exists() and HUB_ID.fullmatch(str(model)):
        path = hub_snapshot(str(model), weights_dir, revision)
    elif not path.exists():
        raise ValueError(f"{model}: no such preset, directory or Hugging Face Hub repo id (owner/name) "
                         f"(presets: {presets.list_presets()})")
    weights = weights_of(path)
    return ModelFiles(weights=weights, hf_dir=find_beside(weights, "config.json"),
                      tokenizer=find_beside(weights, *TOKENIZER_FILES), preset=preset or presets.preset_of(weights))


# owner/name, as the Hub spells repo ids (no further slashes: a longer relative path that does not exist is not one)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# what a Llama checkpoint needs from a repo; weights as safetensors, or pytorch_model*.bin (read without pickle)
# only when the repo has no safetensors
HUB_FILES = ["*.json", "*.jinja", "tokenizer*", "*.model", "*.txt"]


def hub_snapshot(repo_id: str, cache_dir: str | Path | None = None, revision: str | None = None) -> Path:
    """The local directory of a Hub repo's files at `revision` (default its main branch; huggingface_hub's cache,
    or `cache_dir`; HF_TOKEN and HF_HUB_OFFLINE apply), downloaded if they are not there. ValueError names the
    repo when that fails."""
    from huggingface_hub import list_repo_files, snapshot_download

    try:
        files = list_repo_files(repo_id, revision=revision)
        weights = ["*.safetensors"] if any(f.endswith(".safetensors") for f in files) else ["pytorch_model*.bin"]
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir,
                                      allow_patterns=HUB_FILES + weights))
    except Exception as e:  # no network, no such repo, gated without a token, ...: one error that names the repo
        raise ValueError(f"{repo_id}: not a preset or a directory, and downloading it from the Hugging Face Hub "
                         f"failed: {type(e).__name__}: {e}") from None


def resolve_head(model: str | Path) -> Path:
    """An EAGLE head: a directory, or the name of a shipped head (weights/README.md)."""
    path = Path(model).expanduser()
    if path.exists():
        return path
    shipped = presets.shipped_head(str(model))
    if shipped is None:
        raise ValueError(f"speculative_config.model {str(model)!r} is neither a directory nor a shipped head "
                         f"({presets.list_shipped_heads()})")
    return shipped
