"""Per-request sampling parameters, modelled on vLLM's `SamplingParams`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # nucleus mass in (0, 1]; 1 disables
    top_k: int = 0  # 0 (or -1) disables
    max_tokens: int = 16
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None  # None: derived from the LLM's seed and the request's index

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0

    def validate(self) -> None:
        """Raise a ValueError naming the bad parameter (called before a request is admitted)."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be 0 or -1 (off) or a positive integer, got {self.top_k!r}")
        if any(not s for s in self.stop):
            raise ValueError("SamplingParams.stop must not contain empty strings")
        if self.seed is not None and not 0 <= self.seed < 2**32:
            raise ValueError(f"SamplingParams.seed must be in [0, 2**32), got {self.seed!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0
