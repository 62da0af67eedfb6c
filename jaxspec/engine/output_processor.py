"""Committed tokens -> a request's state and outputs: stop rules, incremental detokenization, RequestOutput.

Stop rules truncate exactly: a step may emit up to k+1 tokens, and everything after the first stop (EOS, a stop
token id, a stop string, max_tokens or max_model_len) is dropped, so the user never sees the overshoot.

Text is kept current while a request runs only where something needs it: stop strings, and outputs that are not
FINAL_ONLY (streaming). Otherwise it is decoded once, as the request finishes (in async mode while the device
runs the next step). Streamed text never splits a UTF-8 character and holds back the last characters that could
still begin a stop string, so the deltas of a request always add up to its final text.
"""

from __future__ import annotations

from typing import Any

from jaxspec.engine.sequence import Sequence, Status
from jaxspec.outputs import CompletionOutput, RequestOutput
from jaxspec.sampling_params import RequestOutputKind


def detokenize_incrementally(tokenizer: Any, seq: Sequence) -> str:
    """New text for the tokens appended since the last call (vLLM's prefix/read offset scheme: decode a short
    window twice so that multi-token characters and merges come out right; nothing while a character is
    incomplete)."""
    ids = seq.output_token_ids
    prefix = tokenizer.decode(ids[seq.prefix_offset:seq.read_offset], skip_special_tokens=True)
    text = tokenizer.decode(ids[seq.prefix_offset:], skip_special_tokens=True)
    if len(text) > len(prefix) and not text.endswith("\ufffd"):
        seq.prefix_offset, seq.read_offset = seq.read_offset, len(ids)
        return text[len(prefix):]
    return ""


def _pending_text(tokenizer: Any, seq: Sequence) -> str:
    """The text of tokens `detokenize_incrementally` still holds back (an unfinished character at the end)."""
    ids = seq.output_token_ids
    prefix = tokenizer.decode(ids[seq.prefix_offset:seq.read_offset], skip_special_tokens=True)
    return tokenizer.decode(ids[seq.prefix_offset:], skip_special_tokens=True)[len(prefix):]


class OutputProcessor:
    def __init__(self, tokenizer: Any | None, eos_token_ids: set[int], max_model_len: int):
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len

    def live_text(self, seq: Sequence) -> bool:
        """Whether the text is decoded as tokens arrive (else once, at the finish)."""
        p = seq.params
        return self.tokenizer is not None and (bool(p.stop) or p.output_kind is not RequestOutputKind.FINAL_ONLY)

    def append_tokens(self, seq: Sequence, tokens: list[int]) -> None:
        """Append tokens one by one until a stop rule fires; the rest are discarded."""
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

    def _extend_text(self, seq: Sequence) -> bool:
        """Decode the new token into seq.text; True if that completed a stop string (the request is finished)."""
        old_len = len(seq.text)
        seq.text += detokenize_incrementally(self.tokenizer, seq)
        for stop in seq.params.stop:
            at = seq.text.find(stop, max(0, old_len - len(stop) + 1))
            if at >= 0:
                seq.text = seq.text[:at]  # the stop string itself is not returned (vLLM's default)
                self.finish(seq, "stop", stop)
                return True
        return False

    def finish(self, seq: Sequence, reason: str, stop_reason: int | str | None) -> None:
        seq.status, seq.finish_reason, seq.stop_reason = Status.FINISHED, reason, stop_reason
        if self.tokenizer is None:
            return
        if not self.live_text(seq):
            seq.text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
        elif stop_reason is None or isinstance(stop_reason, int):  # not cut at a stop string: flush the tail
            seq.text += _pending_text(self.tokenizer, seq)

    def make_output(self, seq: Sequence) -> RequestOutput | None:
        """The request's output for this step under its output_kind, or None when there is nothing to report."""
        kind = seq.params.output_kind
        finished = seq.is_finished
        if kind is RequestOutputKind.FINAL_ONLY and not finished:
            return None
        # while running, hold back what could still turn out to begin a stop string
        hold = 0 if finished else max((len(s) - 1 for s in seq.params.stop), default=0)
        text_end = max(len(seq.text) - hold, seq.num_returned_chars)
        if kind is RequestOutputKind.DELTA:
            text = seq.text[seq.num_returned_chars:text_end]
            token_ids = seq.output_token_ids[seq.num_returned_tokens:]
            if not (text or token_ids or finished):
                return None
        else:
            text, token_ids = seq.text[:text_end], list(seq.output_token_ids)
        seq.num_returned_chars, seq.num_returned_tokens = text_end, len(seq.output_token_ids)
        completion = CompletionOutput(0, text, token_ids, finish_reason=seq.finish_reason,
                                      stop_reason=seq.stop_reason)
        return RequestOutput(seq.request_id, seq.prompt, seq.prompt_token_ids, [completion], finished)
