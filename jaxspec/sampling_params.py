"""Per-request sampling parameters, modelled on vLLM's `SamplingParams` (same names, defaults and checks).

Values are normalized and checked when the object is built (as vLLM does) and again when a request is admitted
(`validate`), so a field changed after construction cannot reach the device unchecked. Every check raises a
ValueError naming the parameter; the device sees only values that fit its int32/uint32/fp32 columns.
"""

from __future__ import annotations

import enum
import math
import numbers
from dataclasses import dataclass, field

INT32_MAX = 2**31 - 1


class RequestOutputKind(enum.Enum):
    """What `LLMEngine.step` returns for a request (vLLM's enum)."""
    CUMULATIVE = 0  # everything generated so far, at every step that adds to it
    DELTA = 1  # only what is new since the request's last output (streaming)
    FINAL_ONLY = 2  # one output, when the request finishes (what `LLM.generate` asks for)


def _int(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"SamplingParams.{name} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if not lo <= value <= hi:
        raise ValueError(f"SamplingParams.{name} must be in [{lo}, {hi}], got {value}")
    return value


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"SamplingParams.{name} must be a finite number, got {value!r}")
    return float(value)


def _int_list(name: str, values, lo: int, hi: int) -> list[int]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"SamplingParams.{name} must be a list of integers, got {values!r}")
    return [_int(f"{name}[{i}]", v, lo, hi) for i, v in enumerate(values)]


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # nucleus mass in (0, 1]; 1 disables
    top_k: int = 0  # 0 (or -1) disables
    max_tokens: int | None = 16  # None: up to max_model_len
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None  # None: derived from the LLM's seed and the request's admission order
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop) if isinstance(self.stop, (list, tuple)) else self.stop or []
        self.stop_token_ids = self.stop_token_ids if self.stop_token_ids is not None else []
        self.validate()
        if self.top_k == -1:
            self.top_k = 0

    def validate(self) -> None:
        """Normalize and check every field; a ValueError names the bad parameter (also run at admission)."""
        self.temperature = _real("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        self.top_p = _real("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        self.top_k = _int("top_k", self.top_k, -1, INT32_MAX)
        if self.max_tokens is not None:
            self.max_tokens = _int("max_tokens", self.max_tokens, 1, INT32_MAX)
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise ValueError(f"SamplingParams.stop must be a string or a list of strings, got {self.stop!r}")
        if any(not s for s in self.stop):
            raise ValueError("SamplingParams.stop must not contain empty strings")
        self.stop_token_ids = _int_list("stop_token_ids", self.stop_token_ids, 0, INT32_MAX)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"SamplingParams.ignore_eos must be a bool, got {self.ignore_eos!r}")
        if self.seed is not None:
            self.seed = _int("seed", self.seed, 0, 2**32 - 1)
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"SamplingParams.output_kind must be a RequestOutputKind, got {self.output_kind!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0
