"""A model's tokenizer and EOS ids, found next to its weights; errors name the file.

A converted checkpoint keeps its tokenizer in a sibling `hf/` directory (presets: `weights/<name>/{ckpt,hf}`): the
places searched are jaxspec.resolve.beside's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxspec import resolve
from jaxspec.json_config import read_int, read_json, read_list

_JSON_FILES = (*resolve.TOKENIZER_FILES, "special_tokens_map.json")


def load_tokenizer(path: str | Path, required: bool = False) -> Any | None:
    """The tokenizer (transformers) of a model directory, or None when it ships none (token-id-only use).

    `required`: the path was given explicitly (`LLM(tokenizer=...)`), so it must exist and hold a tokenizer."""
    path = Path(path)
    if required and not path.exists():
        raise ValueError(f"{path}: tokenizer path does not exist")
    d = resolve.find_beside(path, *resolve.TOKENIZER_FILES)
    if d is None:
        if required:
            raise ValueError(f"{path}: no tokenizer here ({' or '.join(resolve.TOKENIZER_FILES)})")
        return None
    configs = {name: read_json(d / name) for name in _JSON_FILES if (d / name).exists()}  # bad JSON: its file named
    tokenizer_class = configs.get("tokenizer_config.json", {}).get("tokenizer_class")
    plain = tokenizer_class in _PLAIN_FAST_CLASSES and (d / "tokenizer.json").exists()
    return from_pretrained(d, str(d), plain_fast=plain)


# tokenizer_config.json classes that AutoTokenizer resolves to transformers' plain fast tokenizer (a tokenizer.json
# and nothing model-specific): that class loads them directly, without AutoTokenizer's module, which imports
# torch (seconds at every start of `jaxspec generate` or `jaxspec serve`). Every other class goes through
# AutoTokenizer.
_PLAIN_FAST_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def from_pretrained(source: Path, *args, plain_fast: bool = False, **kwargs) -> Any:
    """`AutoTokenizer.from_pretrained(*args, **kwargs)` (or, with plain_fast, `PreTrainedTokenizerFast`'s), whose
    failures on a bad file are ValueErrors naming `source` (transformers raises whatever its parsers do: KeyError,
    TypeError, the tokenizers parser's bare Exception)."""
    if plain_fast:
        from transformers import PreTrainedTokenizerFast as AutoTokenizer
    else:
        from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(*args, **kwargs)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, OSError) as e:
        raise ValueError(f"{source}: cannot load the tokenizer ({type(e).__name__}: {e})") from None
    except Exception as e:
        if type(e) is not Exception:  # only the bare Exception of the tokenizers (Rust) parser is the file's fault
            raise
        raise ValueError(f"{source}: not a valid tokenizer ({e})") from None


def eos_token_ids(tokenizer: Any | None, path: Path) -> set[int]:
    """EOS ids from the first generation_config.json found (an id or a list of ids) and the tokenizer's own."""
    ids: set[int] = set()
    for d in resolve.beside(Path(path)):
        gen_file = d / "generation_config.json"
        if gen_file.exists():
            gen = read_json(gen_file)
            if isinstance(gen.get("eos_token_id"), list):
                eos = read_list(gen, "eos_token_id", gen_file, int)
                if any(i < 0 for i in eos):
                    raise ValueError(f"{gen_file}: field 'eos_token_id' has negative ids {eos}")
            else:
                eos = [i for i in [read_int(gen, "eos_token_id", gen_file, default=None, minimum=0)] if i is not None]
            ids |= set(eos)
            break
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
