"""Committed tokens -> a request's state and outputs: stop rules, incremental detokenization, RequestOutput.

Stop rules truncate exactly: a step may emit up to k+1 tokens, and everything after the first stop (EOS, a stop
token id, a stop string, max_tokens or max_model_len) is dropped, so the user never sees the overshoot; so are
their logprobs.

Text is kept current while a request runs only where something needs it: stop strings, and outputs that are not
FINAL_ONLY (streaming); jaxspec.engine.detokenizer decodes it token by token. Otherwise it is decoded once, as the
request finishes (in async mode while the device runs the next step), or, for the requests of LLM.generate, whose
outputs nobody sees before the call returns, after its last step, all at once (Sequence.defer_text): the host
work of a finish, on the engine's critical path whenever the host is slower than the device (~0.5 ms for 1,024
tokens on the GPU machine's host), is then one parallel decode at the end. detokenize=False makes no text at all.
Streamed text never splits a UTF-8 character and holds back the last characters that could still begin a stop
string (unless include_stop_str_in_output), so the deltas of a request always add up to its final text.
skip_special_tokens and spaces_between_special_tokens go to the tokenizer's decode (the latter matters only for
slow tokenizers, as in vLLM).

A request with n samples gives one RequestOutput with a CompletionOutput per sample (index 0..n-1): FINAL_ONLY
all of them once every sample is done, CUMULATIVE all of them at each output, DELTA those with something new.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from jaxspec.engine import logprob_output
from jaxspec.engine.detokenizer import Detokenizer, decode_outputs, pending_text
from jaxspec.engine.logprob_store import LogprobStore
from jaxspec.engine.request_histograms import RequestHistograms
from jaxspec.engine.scheduler import PrefillChunk
from jaxspec.engine.sequence import Sequence, Status
from jaxspec.outputs import CompletionOutput, RequestMetrics, RequestOutput
from jaxspec.sampling_params import RequestOutputKind


class OutputProcessor:
    def __init__(self, tokenizer: Any | None, eos_token_ids: set[int], max_model_len: int):
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.detokenizer = None if tokenizer is None else Detokenizer(tokenizer)
        self._token_text_of = logprob_output.token_text(tokenizer)
        self.logprob_store = LogprobStore()  # the output logprob rows of unfinished requests
        # finished sequences (each of a request's n samples is one): by finish reason, their prompt and output tokens
        self.num_finished: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self.num_finished_prompt_tokens = self.num_finished_output_tokens = 0
        self.histograms = RequestHistograms()  # vLLM's latency and size histograms of the finished, aborts left out

    def _has_text(self, seq: Sequence) -> bool:
        return self.tokenizer is not None and seq.params.detokenize

    def live_text(self, seq: Sequence) -> bool:
        """Whether the text is decoded as tokens arrive (else once, at the finish)."""
        p = seq.params
        return self._has_text(seq) and (bool(p.stop) or p.output_kind is not RequestOutputKind.FINAL_ONLY)

    def append_tokens(self, seq: Sequence, tokens: list[int], logprobs: np.ndarray | None = None,
                      now: float | None = None) -> None:
        """Append tokens until a stop rule fires; the rest are discarded, and so are their rows of logprobs
        [len(tokens), W] (the step's logprob columns, extended steps; a decode step's rows go to the store for the
        whole batch at once, `logprob_store.add_step`, before its tokens come here). Most steps' tokens go in at once
        (none is a stop id and the length limit is not reached: one set test and one comparison, not four tests a
        token); the others, and every token of a request whose text is kept as it comes, one by one."""
        now = time.time() if now is None else now  # (the scheduler passes its commit's time)
        metrics = seq.metrics
        if metrics.first_token_time is None:
            metrics.first_token_time = now
        metrics.last_token_time = now
        start = len(seq.output_token_ids)
        if logprobs is not None and seq.params.logprobs is not None:  # before a stop can finish the request
            self.logprob_store.add(seq, start, logprobs)
        if seq.token_rules is None:
            seq.token_rules = self._token_rules(seq)
        stop_ids, limit = seq.token_rules
        if start + len(tokens) < limit and stop_ids.isdisjoint(tokens):  # no rule can fire: all of them, at once
            seq.output_token_ids += tokens
        else:
            self._append(seq, tokens)

    def _token_rules(self, seq: Sequence) -> tuple[frozenset[int], int]:
        """(the ids that end seq, the output length at which it ends): what decides, for most steps' tokens at a
        glance, that no stop rule fires among them (a limit of 0 sends every token through `_append`: text kept as
        it comes, for stop strings and streams). Fixed for the sequence's life."""
        p = seq.params
        if self.live_text(seq):
            return frozenset(), 0
        ids = set(p.stop_token_ids) | (set() if p.ignore_eos else self.eos_token_ids)
        limit = self.max_model_len - len(seq.prompt_token_ids)
        return frozenset(ids), limit if p.max_tokens is None else min(limit, p.max_tokens)

    def _append(self, seq: Sequence, tokens: list[int]) -> None:
        p = seq.params
        live = self.live_text(seq)
        for t in tokens:
            seq.output_token_ids.append(t)
            if t in p.stop_token_ids:
                return self.finish(seq, "stop", t)
            if not p.ignore_eos and t in self.eos_token_ids:
                return self.finish(seq, "stop", None)
            if live and self._extend_text(seq):
                return
            if (p.max_tokens is not None and len(seq.output_token_ids) >= p.max_tokens) or \
                    seq.num_tokens >= self.max_model_len:
                return self.finish(seq, "length", None)

    def add_prompt_logprobs(self, chunks: list[PrefillChunk], rows: np.ndarray) -> None:
        """A prefill's prompt logprob rows [N, W] (row t: the token after flat token t) for the chunks that want
        them; each prompt token's row is kept once (a preempted request's recompute is ignored)."""
        at = 0
        for c in chunks:
            seq, prompt_len = c.seq, len(c.seq.prompt_token_ids)
            if c.wants_prompt_logprobs:
                for p in range(c.start, min(c.start + c.length, prompt_len - 1)):
                    if p == len(seq.prompt_logprob_rows):  # scores prompt token p + 1
                        seq.prompt_logprob_rows.append(rows[at + p - c.start])
            at += c.length

    def _extend_text(self, seq: Sequence) -> bool:
        """Decode the new token into seq.text; True if that completed a stop string (the request is finished).
        Stop strings count only once the output is longer than min_tokens (vLLM)."""
        old_len = len(seq.text)
        seq.text += self.detokenizer.new_text(seq)
        if len(seq.output_token_ids) <= seq.params.min_tokens:
            return False
        for stop in seq.params.stop:
            at = seq.text.find(stop, max(0, old_len - len(stop) + 1))
            if at >= 0:  # the stop string itself is returned only with include_stop_str_in_output (vLLM)
                seq.text = seq.text[:at + len(stop) if seq.params.include_stop_str_in_output else at]
                self.finish(seq, "stop", stop)
                return True
        return False

    def finish(self, seq: Sequence, reason: str, stop_reason: int | str | None) -> None:
        seq.status, seq.finish_reason, seq.stop_reason = Status.FINISHED, reason, stop_reason
        seq.metrics.finished_time = time.time()
        self.num_finished[reason] += 1
        self.num_finished_prompt_tokens += len(seq.prompt_token_ids)
        self.num_finished_output_tokens += len(seq.output_token_ids)
        if reason != "abort":
            self.histograms.observe(seq.metrics, len(seq.prompt_token_ids), len(seq.output_token_ids))
        self.logprob_store.release(seq)
        if not self._has_text(seq):
            return
        if not self.live_text(seq):
            if not seq.defer_text:
                seq.text = decode_outputs(self.tokenizer, self.detokenizer.backend, [seq])[0]
        elif stop_reason is None or isinstance(stop_reason, int):  # not cut at a stop string: flush the tail
            seq.text += pending_text(self.tokenizer, seq)

    def decode_deferred(self, seqs: list[Sequence]) -> None:
        """The text of those finished sequences whose finish left it to the caller (Sequence.defer_text), all in one
        call per set of decode options."""
        owed = [seq for seq in seqs if seq.defer_text and seq.is_finished and self._has_text(seq)]
        if not owed:
            return
        for seq, text in zip(owed, decode_outputs(self.tokenizer, self.detokenizer.backend, owed)):
            seq.text, seq.defer_text = text, False

    def make_output(self, seq: Sequence) -> RequestOutput | None:
        """The output of seq's request (all its samples) for this step under its output_kind, or None when there
        is nothing to report."""
        group, kind = seq.group, seq.params.output_kind
        # (one sample: the common case, made at every step for each of a server's streams)
        finished = seq.is_finished if len(group) == 1 else all(s.is_finished for s in group)
        if kind is RequestOutputKind.FINAL_ONLY and not finished:
            return None
        if len(group) == 1:
            one = self._completion(seq)
            completions = [] if one is None else [one]
        else:
            completions = [c for c in map(self._completion, group) if c is not None]
        if not completions:
            return None
        lead = group[0]
        prompt_logprobs = None
        if lead.params.prompt_logprobs is not None and (kind is not RequestOutputKind.DELTA or not lead.num_outputs):
            prompt_logprobs = self._prompt_logprobs(lead)  # (streamed: in the first output only, as in vLLM)
        lead.num_outputs += 1
        return RequestOutput(lead.request_id, lead.prompt, lead.prompt_token_ids, prompt_logprobs, completions,
                             finished, metrics=_request_metrics(group),
                             num_cached_tokens=max(0, lead.num_cached_tokens))

    def _completion(self, seq: Sequence) -> CompletionOutput | None:
        kind, p = seq.params.output_kind, seq.params
        finished = seq.is_finished
        # while running, hold back what could still turn out to begin a stop string
        hold = 0 if finished or not p.stop or p.include_stop_str_in_output else max(len(s) - 1 for s in p.stop)
        text_end = max(len(seq.text) - hold, seq.num_returned_chars)
        start_token = seq.num_returned_tokens if kind is RequestOutputKind.DELTA else 0
        start_char = seq.num_returned_chars if kind is RequestOutputKind.DELTA else 0
        text, token_ids = seq.text[start_char:text_end], seq.output_token_ids[start_token:]
        if kind is RequestOutputKind.DELTA and not (text or token_ids or (finished and not seq.finish_returned)):
            return None
        seq.num_returned_chars, seq.num_returned_tokens = text_end, len(seq.output_token_ids)
        seq.finish_returned = finished
        logprobs = cumulative = None
        if p.logprobs is not None:
            rows = self.logprob_store.rows(seq)
            logprobs = logprob_output.FlatLogprobs(list(token_ids), rows[start_token:len(seq.output_token_ids)],
                                                   p.logprobs, self._token_text(seq))
            cumulative = float(rows[:, 0].view(np.float32).sum(dtype=np.float64))
        return CompletionOutput(seq.index, text, token_ids, cumulative, logprobs, seq.finish_reason,
                                seq.stop_reason)  # token_ids: a slice, the caller's own

    def _token_text(self, seq: Sequence) -> Callable[[int], str] | None:
        return self._token_text_of if self._has_text(seq) else None

    def _prompt_logprobs(self, seq: Sequence) -> list:
        """[None, then a dict per prompt token after the first] (made once)."""
        if seq.prompt_logprobs is None:
            rows = seq.prompt_logprob_rows
            block = np.stack(rows) if rows else np.zeros((0, 2), np.int32)
            seq.prompt_logprobs = [None] + logprob_output.position_logprobs(
                seq.prompt_token_ids[1:1 + len(rows)], block, seq.params.prompt_logprobs, self._token_text(seq))
        return seq.prompt_logprobs


def _request_metrics(group: list[Sequence]) -> RequestMetrics:
    """One request's times over its samples: the first arrival, schedule and token, the last token and finish. A
    copy: the samples' own go on changing."""
    if len(group) == 1:  # most requests, at every step of a stream: no scan over samples, no copy.copy (~5 us)
        m = group[0].metrics
        return RequestMetrics(m.arrival_time, m.last_token_time, m.first_scheduled_time, m.first_token_time,
                              m.time_in_queue, m.finished_time)
    ms = [s.metrics for s in group]
    first = lambda name: min((v for v in (getattr(m, name) for m in ms) if v is not None), default=None)  # noqa
    last = lambda name: max((v for v in (getattr(m, name) for m in ms) if v is not None), default=None)  # noqa
    arrival, scheduled = first("arrival_time"), first("first_scheduled_time")
    finished = last("finished_time") if all(m.finished_time is not None for m in ms) else None
    return RequestMetrics(arrival_time=arrival, last_token_time=last("last_token_time"),
                          first_scheduled_time=scheduled, first_token_time=first("first_token_time"),
                          time_in_queue=None if scheduled is None else scheduled - arrival, finished_time=finished)
