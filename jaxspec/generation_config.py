"""The model's recommended sampling defaults (vLLM's `generation_config` option).

Model makers put their sampling settings in generation_config.json (Llama 3 Instruct: temperature 0.6, top_p 0.9).
vLLM applies them by default: `LLM.generate` without sampling params uses `LLM.get_default_sampling_params()`, and
the OpenAI server fills the fields a request leaves unset from them (its `max_tokens` also caps the request's).
The fields taken are vLLM's: repetition_penalty, temperature, top_k, top_p, min_p and max_new_tokens (as
max_tokens), those the file sets (transformers 5 reads an unset field as None). `generation_config`: "auto" (the
model's file, found beside it as its EOS ids are), "vllm" (none: SamplingParams' own defaults), or a directory
holding a generation_config.json; `override_generation_config` (a dict of the same fields) is applied on top.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from jaxspec.json_config import read_json, show
from jaxspec.resolve import find_beside
from jaxspec.sampling_params import SamplingParams

logger = logging.getLogger("jaxspec")

FILE = "generation_config.json"
FIELDS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")


def default_sampling_values(model_dir: str | Path | None, generation_config: str = "auto",
                            override_generation_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The SamplingParams fields (by SamplingParams' names) that the model's generation config sets; every value
    is checked here, and a bad one is a ValueError naming its file (or override_generation_config) and field."""
    if not isinstance(generation_config, (str, Path)):
        raise ValueError(f"generation_config must be 'auto', 'vllm' or a directory, got {show(generation_config)}")
    if override_generation_config is not None and not isinstance(override_generation_config, dict):
        raise ValueError(f"override_generation_config must be a dict, got {show(override_generation_config)}")
    path: Path | None = None
    if generation_config == "auto":
        found = find_beside(Path(model_dir), FILE) if model_dir is not None else None
        path = found / FILE if found is not None else None
    elif generation_config != "vllm":
        path = Path(generation_config)
        path = path if path.is_file() else path / FILE
        if not path.is_file():
            raise ValueError(f"generation_config={str(generation_config)!r}: no {FILE} there (give 'auto', 'vllm' "
                             "or a directory holding one)")
    values = {}
    for source, config in ((path, read_json(path) if path is not None else {}),
                           ("override_generation_config", override_generation_config or {})):
        picked = {name: config[name] for name in FIELDS if config.get(name) is not None}
        if "max_new_tokens" in picked:
            picked["max_tokens"] = picked.pop("max_new_tokens")
        try:
            SamplingParams(**picked)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{source}: {e}") from None
        values |= picked
    if values:
        logger.warning("default sampling parameters from the model's generation config: %s (generation_config="
                       "'vllm' turns them off)", values)
    return values
