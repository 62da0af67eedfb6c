"""The model's tokenizer and its end-of-sequence token ids, found beside the weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _tokenizer_dirs(path: Path) -> tuple[Path, ...]:
    """Where a tokenizer may live for a model path: the path itself, or its preset layout's hf/ directory."""
    return path, path / "hf", path.parent / "hf"


def load_tokenizer(path: str | Path, must_exist: bool = False) -> Any | None:
    """The tokenizer (transformers) beside a model, or None when there is none (token-id-only use).
    `must_exist`: the path was given as the tokenizer's, so a missing one is an error naming it."""
    path = Path(path)
    if must_exist and not path.exists():
        raise ValueError(f"tokenizer {str(path)!r}: no such file or directory")
    for d in _tokenizer_dirs(path):
        if (d / "tokenizer.json").exists() or (d / "tokenizer_config.json").exists():
            from transformers import AutoTokenizer
            return AutoTokenizer.from_pretrained(str(d))
    if must_exist:
        raise ValueError(f"tokenizer {str(path)!r}: no tokenizer.json or tokenizer_config.json there")
    return None


def eos_token_ids(tokenizer: Any | None, path: Path) -> set[int]:
    """generation_config.json's eos_token_id (one id or a list) and the tokenizer's."""
    ids: set[int] = set()
    for d in _tokenizer_dirs(Path(path)):
        gen = d / "generation_config.json"
        if gen.exists():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            ids |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
            break
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
