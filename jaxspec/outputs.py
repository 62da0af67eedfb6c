"""What requests give back, modelled on vLLM's `RequestOutput`, `CompletionOutput`, `Logprob` and `RequestMetrics`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Logprob:
    """One token's log-probability, its rank in its distribution (1 = the most likely) and its text."""
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per position: token id -> Logprob. The sampled (or prompt) token is always present, first, with the top-N after it.
PositionLogprobs = dict[int, Logprob]


@dataclass
class RequestMetrics:
    """Wall-clock times (time.time()) of a request's life, vLLM's names; None until it happens."""
    arrival_time: float
    last_token_time: float | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    time_in_queue: float | None = None  # first_scheduled_time - arrival_time
    finished_time: float | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None  # sum of the sampled tokens' logprobs (when logprobs are requested)
    # one dict per token of token_ids; a Sequence whose dicts are made as they are read (engine.logprob_output)
    logprobs: Sequence[PositionLogprobs] | None = None
    finish_reason: str | None = None  # "stop", "length" or "abort"; None while running
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None = None  # None for the first prompt token, as in vLLM
    outputs: list[CompletionOutput] = field(default_factory=list)  # one per sample, by index
    finished: bool = False
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
