"""The model's tokenizer and its end-of-sequence token ids, found beside the weights (jaxspec.resolve.beside)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jaxspec import resolve


def load_tokenizer(path: str | Path, must_exist: bool = False) -> Any | None:
    """The tokenizer (transformers) beside a model, or None when there is none (token-id-only use).
    `must_exist`: the path was given as the tokenizer's, so a missing one is an error naming it."""
    path = Path(path)
    if must_exist and not path.exists():
        raise ValueError(f"tokenizer {str(path)!r}: no such file or directory")
    d = resolve.find_beside(path, *resolve.TOKENIZER_FILES)
    if d is None:
        if must_exist:
            raise ValueError(f"tokenizer {str(path)!r}: no {' or '.join(resolve.TOKENIZER_FILES)} there")
        return None
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(d))


def eos_token_ids(tokenizer: Any | None, path: Path) -> set[int]:
    """generation_config.json's eos_token_id (one id or a list) and the tokenizer's."""
    ids: set[int] = set()
    for d in resolve.beside(Path(path)):
        gen = d / "generation_config.json"
        if gen.exists():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            ids |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
            break
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
