"""A step's RequestOutputs as plain tuples, for the pipe from the engine process to the server's.

Pickling 64 RequestOutput dataclasses costs ~0.4 ms a step on each side (CPU machine); the same fields as tuples
~0.05 ms. A request's prompt and prompt token ids travel with its first output only (the server keeps them for
the rest, as they do not change), and a completion's logprobs as the step's rows (logprob_output.FlatLogprobs),
made into dicts in the server with its own tokenizer when read.

Text, as in vLLM's engine-core design, is made in the server for every request without stop strings: the engine
runs it with detokenize=False and sends token ids, and the Decoder detokenizes them incrementally (the engine's
own Detokenizer, the same DecodeStream windows, the held-back tail flushed at the finish), which takes ~10 us per
request and step off the engine's host work. Requests with stop strings keep their text in the engine, whose
stop checks need it.

When the server falls behind the engine, it reads the steps that wait in the pipe at once and `merge`s them into
one (DELTA outputs add up: tokens, text and logprobs concatenate, the latest finish and times win, as vLLM's
output collector merges what a slow reader has not taken), so one decode and one write per stream cover many
steps and the server catches up instead of holding the engine back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jaxspec.engine.detokenizer import Detokenizer, pending_text
from jaxspec.engine.logprob_output import FlatLogprobs, token_text
from jaxspec.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from jaxspec.sampling_params import SamplingParams


def _metrics(m: RequestMetrics | None) -> tuple | None:
    if m is None:
        return None
    return (m.arrival_time, m.last_token_time, m.first_scheduled_time, m.first_token_time, m.time_in_queue,
            m.finished_time)


def _logprobs(logprobs) -> tuple:
    if isinstance(logprobs, FlatLogprobs):
        return ("flat", *logprobs.state)
    return ("list", None if logprobs is None else list(logprobs))


class Encoder:
    """Engine side: which requests have had their first output sent."""

    def __init__(self):
        self._sent: set[str] = set()

    def encode(self, outputs: list[RequestOutput]) -> list[tuple]:
        rows = []
        for o in outputs:
            first = o.request_id not in self._sent
            if o.finished:
                self._sent.discard(o.request_id)
            elif first:
                self._sent.add(o.request_id)
            completions = [(c.index, c.text, c.token_ids, c.cumulative_logprob, _logprobs(c.logprobs),
                            c.finish_reason, c.stop_reason) for c in o.outputs]
            rows.append((o.request_id, (o.prompt, o.prompt_token_ids) if first else None, o.prompt_logprobs,
                         completions, o.finished, _metrics(o.metrics), o.num_cached_tokens))
        return rows


def _merged_logprobs(a: tuple, b: tuple) -> tuple:
    if a[0] == "flat" and b[0] == "flat":
        return ("flat", a[1] + b[1], np.concatenate([a[2], b[2]]), b[3], b[4])
    assert a[0] == b[0] == "list", (a[0], b[0])
    return ("list", None if a[1] is None and b[1] is None else (a[1] or []) + (b[1] or []))


def _merged_by_key(a: list[tuple], b: list[tuple], combine) -> dict:
    """a's and b's tuples by their first field (a's order first), combine(old, new) where both have one."""
    merged = {x[0]: x for x in a}
    for x in b:
        merged[x[0]] = combine(merged[x[0]], x) if x[0] in merged else x
    return merged


def _merged_completion(old: tuple, new: tuple) -> tuple:
    # (index, text, token_ids, cumulative_logprob, logprobs, finish_reason, stop_reason)
    return (new[0], old[1] + new[1], old[2] + new[2], new[3], _merged_logprobs(old[4], new[4]), new[5], new[6])


def _merged_row(old: tuple, new: tuple) -> tuple:
    # (request_id, prompt, prompt_logprobs, completions, finished, metrics, num_cached_tokens)
    completions = _merged_by_key(old[3], new[3], _merged_completion)
    return (new[0], old[1] if old[1] is not None else new[1], old[2] if old[2] is not None else new[2],
            [completions[i] for i in sorted(completions)], new[4], new[5], new[6])


def merge(a: list[tuple], b: list[tuple]) -> list[tuple]:
    """Two consecutive steps' rows (DELTA outputs) as one step's: what a reader of both would have got. A request
    keeps its place; its prompt and prompt logprobs come with its first row, its finish and times with its last."""
    return list(_merged_by_key(a, b, _merged_row).values())


@dataclass
class _Text:
    """One sample's incremental detokenization in the server: the fields of a Sequence that Detokenizer uses."""
    params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0
    decode_stream: Any = None


class Decoder:
    """Server side: the rows back as RequestOutputs, equal to the engine's."""

    def __init__(self, tokenizer: Any | None):
        self.tokenizer = tokenizer
        self._prompts: dict[str, tuple[str | None, list[int]]] = {}
        self._token_text = token_text(tokenizer)
        self._detokenizer = None if tokenizer is None else Detokenizer(tokenizer)
        self._texts: dict[str, tuple[SamplingParams, dict[int, _Text]]] = {}  # requests whose text is made here

    def engine_params(self, request_id: str, params: SamplingParams) -> SamplingParams:
        """The params to run a request with: detokenize=False when its text is to be made here (it wants text and
        has no stop strings), else its own."""
        if self.tokenizer is None or params is None or not params.detokenize or params.stop:
            return params
        self._texts[request_id] = (params, {})
        return dataclasses.replace(params, detokenize=False)

    def forget(self, request_ids: list[str]) -> None:
        """Requests the engine refused."""
        for rid in request_ids:
            self._texts.pop(rid, None)

    def _text(self, state: _Text, token_ids: list[int], finished: bool) -> str:
        pieces = []
        for t in token_ids:
            state.output_token_ids.append(t)
            pieces.append(self._detokenizer.new_text(state))
        if finished:  # what the windows still hold (the engine's finish(), which no stop string ends here)
            pieces.append(pending_text(self.tokenizer, state))
        return "".join(pieces)

    def _logprobs(self, encoded: tuple, text: bool):
        if encoded[0] == "list":
            return encoded[1]
        tokens, rows, num, decoded = encoded[1:]
        return FlatLogprobs(tokens, rows, num, self._token_text if decoded or text else None)

    def _named(self, prompt_logprobs: list | None) -> list | None:
        """Prompt logprobs with the texts the engine would have given them."""
        if prompt_logprobs is None:
            return None
        return [None if d is None else {t: Logprob(lp.logprob, lp.rank, self._token_text(t)) for t, lp in d.items()}
                for d in prompt_logprobs]

    def decode(self, rows: list[tuple]) -> list[RequestOutput]:
        outputs = []
        for request_id, prompt, prompt_logprobs, completions, finished, metrics, cached in rows:
            if prompt is None:
                prompt = self._prompts.pop(request_id) if finished else self._prompts[request_id]
            elif not finished:
                self._prompts[request_id] = prompt
            texts = self._texts.pop(request_id, None) if finished else self._texts.get(request_id)
            comps = []
            for index, text, token_ids, cumulative, lp, reason, stop in completions:
                if texts is not None:
                    params, samples = texts
                    state = samples.get(index) or samples.setdefault(index, _Text(params))
                    text = self._text(state, token_ids, reason is not None)
                comps.append(CompletionOutput(index, text, token_ids, cumulative, self._logprobs(lp, texts is not None),
                                              reason, stop))
            if texts is not None:
                prompt_logprobs = self._named(prompt_logprobs)
            outputs.append(RequestOutput(request_id, prompt[0], prompt[1], prompt_logprobs, comps, finished,
                                         None if metrics is None else RequestMetrics(*metrics), cached))
        return outputs
