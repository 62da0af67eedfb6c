"""A request's host-side state: its tokens, where it stands in the pipeline, and its detokenized text."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jaxspec.engine.slot_spec import SlotSpec
from jaxspec.outputs import PositionLogprobs, RequestMetrics
from jaxspec.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"  # not holding a slot: new, or preempted and waiting to be recomputed
    RUNNING = "running"  # holds a slot and pages (prefilling or decoding)
    FINISHED = "finished"


@dataclass(eq=False)  # identity: queues find and remove a sequence by itself, and a group refers to itself
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    prompt: str | None = None
    index: int = 0  # which of the request's n samples
    group: list[Sequence] | None = None  # the request's samples by index (None: just this one)
    slot_spec: SlotSpec | None = None  # processor rows of an extended request (SamplingParams.needs_extended_step)
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(arrival_time=time.time()))
    output_token_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: str | None = None  # "stop", "length" or "abort"
    stop_reason: int | str | None = None
    slot: int = -1
    pages: list[int] = field(default_factory=list)
    num_prefilled: int = 0  # tokens of `prefill_token_ids` whose KV is computed
    num_copied: int = 0  # of those, the prefix copied from the leader (parallel samples) or cached: prefill starts here
    prompt_mask_from: int = -1  # the slot whose prompt token mask this sample's admission copies (-1: none)
    prefill_token_ids: list[int] = field(default_factory=list)  # what prefill feeds: prompt (+ outputs if preempted)
    page_hashes: list[bytes] = field(default_factory=list)  # prefix hashes of its full pages (BlockManager)
    num_cached_tokens: int = -1  # prompt tokens its first prefill found in the prefix cache (-1: not yet planned)
    decoding: bool = False  # prefill done; the device state holds last_token and seq_len
    num_inflight: int = 0  # dispatched steps whose tokens are not committed yet
    inflight_max_tokens: int = 0  # the most tokens those steps can add (1 per prefill end, k+1 per decode)
    # text: kept current while generating when the request streams or has stop strings, else decoded at finish
    text: str = ""
    defer_text: bool = False  # the finish leaves `text` to OutputProcessor.decode_deferred (LLM.generate's requests)
    prefix_offset: int = 0  # incremental detokenization window over output_token_ids
    read_offset: int = 0
    decode_stream: Any = None  # the tokenizers DecodeStream that keeps `text` (jaxspec.engine.detokenizer)
    num_returned_tokens: int = 0  # DELTA outputs: what the last output already gave
    num_returned_chars: int = 0
    # logprobs (when requested): the output tokens' rows of their steps' logprobs (processors.pack_logprobs), read
    # as vLLM's dicts through logprob_output.FlatLogprobs: in an entry of the engine's LogprobStore until the finish,
    # then here [tokens, W]; per prompt token after the first, its row
    logprob_entry: int = -1
    logprob_rows: np.ndarray | None = None
    prompt_logprob_rows: list[np.ndarray] = field(default_factory=list)
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    finish_returned: bool = False  # an output carried this sample's finish (DELTA outputs report it once)
    num_outputs: int = 0  # RequestOutputs made for the request (kept by its first sample)
    device_stops: np.ndarray | None = None  # what a multi-step dispatch checks (LLMEngine._device_stops)
    token_rules: tuple[frozenset[int], int] | None = None  # stop ids and output limit (OutputProcessor._token_rules)

    def __post_init__(self) -> None:
        if self.group is None:
            self.group = [self]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def group_finished(self) -> bool:
        return all(s.is_finished for s in self.group)

    def start_prefill(self) -> None:
        """(Re)start from scratch: after preemption the generated tokens are recomputed as part of the prompt."""
        self.prefill_token_ids = self.all_token_ids
        self.num_prefilled = self.num_copied = 0
        self.prompt_mask_from = -1
        self.decoding = False

    @property
    def upper_bound_len(self) -> int:
        """The most tokens the sequence can hold once every dispatched step is committed."""
        return self.num_tokens + self.inflight_max_tokens
