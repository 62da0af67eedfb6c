"""JSON config files (config.json, generation_config.json, jaxspec_config.json, ...) and typed reads of their fields.

Every error is a ValueError that names the file and the field, whatever the file put there: bad JSON, a list or
null where an integer belongs, a string where a flag belongs. A field that is absent or null takes its default
(as transformers reads `"head_dim": null`); a required field that is absent or null is an error.
"""

from __future__ import annotations

import json
import math
import reprlib
from pathlib import Path
from typing import Any

REQUIRED: Any = object()  # default of a field that must be present
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80


def parse_json(text: str | bytes, source: str | Path) -> Any:
    """JSON text read from `source` (a file, a `file:line` of a JSONL file, a flag), which errors name."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{source}: not valid JSON ({e})") from None
    except RecursionError:
        raise ValueError(f"{source}: not valid JSON (nested too deeply)") from None


def _object(value: Any, source: str | Path) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{source}: expected a JSON object, got {type(value).__name__}")
    return value


def read_json(path: str | Path) -> dict:
    """The JSON object in `path` (FileNotFoundError passes through: callers say what a missing file means)."""
    return _object(parse_json(Path(path).read_bytes(), path), path)


def read_json_arg(text: str, flag: str) -> dict:
    """A command-line JSON object given inline or as the path of a .json file; errors name the flag or file."""
    if text.endswith(".json") and Path(text).exists():
        return read_json(text)
    return _object(parse_json(text, flag), flag)


def show(value: Any) -> str:
    """A short repr for messages (a hostile file's values can be megabytes long)."""
    return _SHORT.repr(value)


def _value(d: dict, key: str, source: str | Path, default: Any) -> Any:
    """The field's value; None when absent or null and it has a default."""
    value = d.get(key)
    if value is None and default is REQUIRED:
        raise ValueError(f"{source}: required field {key!r} is {'null' if key in d else 'missing'}")
    return value


def read_int(d: dict, key: str, source: str | Path, default: Any = REQUIRED, minimum: int | None = 1) -> Any:
    """An integer field (bools are not integers here) of at least `minimum` (None: any)."""
    value = _value(d, key, source, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{source}: field {key!r} must be an integer, got {show(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{source}: field {key!r} must be >= {minimum}, got {value}")
    return value


def read_float(d: dict, key: str, source: str | Path, default: Any = REQUIRED, positive: bool = True) -> Any:
    """A finite number field (integers accepted), > 0 when `positive`."""
    value = _value(d, key, source, default)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{source}: field {key!r} must be a finite number, got {show(value)}")
    if positive and value <= 0:
        raise ValueError(f"{source}: field {key!r} must be > 0, got {value}")
    return float(value)


def _read_instance(d: dict, key: str, source: str | Path, default: Any, kind: type, what: str) -> Any:
    value = _value(d, key, source, default)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise ValueError(f"{source}: field {key!r} must be {what}, got {show(value)}")
    return value


def read_bool(d: dict, key: str, source: str | Path, default: Any = REQUIRED) -> Any:
    """A true/false field (not the string "false", which Python would call true)."""
    return _read_instance(d, key, source, default, bool, "true or false")


def read_str(d: dict, key: str, source: str | Path, default: Any = REQUIRED) -> Any:
    return _read_instance(d, key, source, default, str, "a string")


def read_dict(d: dict, key: str, source: str | Path) -> dict:
    """A nested object field; {} when absent or null."""
    return _read_instance(d, key, source, {}, dict, "an object")


def read_list(d: dict, key: str, source: str | Path, item: type, default: Any = REQUIRED) -> Any:
    """A list field whose items are all of type `item` (int: bools excluded)."""
    value = _value(d, key, source, default)
    if value is None:
        return default
    if not isinstance(value, list) or not all(
            isinstance(v, item) and not (item is int and isinstance(v, bool)) for v in value):
        raise ValueError(f"{source}: field {key!r} must be a list of {item.__name__}, got {show(value)}")
    return value
