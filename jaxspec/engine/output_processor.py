"""Appending emitted tokens to a request: incremental detokenization and the stop rules.

Stop rules truncate exactly: a step may emit up to k+1 tokens, and everything after the first stop (EOS, a stop
token id, a stop string, max_tokens or max_model_len) is dropped, so the user never sees the overshoot.
"""

from __future__ import annotations

from typing import Any

from jaxspec.engine.sequence import Sequence, Status


def detokenize_incrementally(tokenizer: Any, seq: Sequence) -> str:
    """New text for the tokens appended since the last call (vLLM's prefix/read offset scheme: decode a short
    window twice so that multi-token characters and merges come out right)."""
    ids = seq.output_token_ids
    prefix = tokenizer.decode(ids[seq.prefix_offset:seq.read_offset], skip_special_tokens=True)
    text = tokenizer.decode(ids[seq.prefix_offset:], skip_special_tokens=True)
    if len(text) > len(prefix) and not text.endswith("\ufffd"):
        seq.prefix_offset, seq.read_offset = seq.read_offset, len(ids)
        return text[len(prefix):]
    return ""


class OutputProcessor:
    def __init__(self, tokenizer: Any | None, eos_token_ids: set[int], max_model_len: int):
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len

    def append_tokens(self, seq: Sequence, tokens: list[int]) -> None:
        """Append tokens one by one until a stop rule fires; the rest are discarded."""
        p = seq.params
        for t in tokens:
            seq.output_token_ids.append(t)
            if t in p.stop_token_ids:
                return self._finish(seq, "stop", t)
            if not p.ignore_eos and t in self.eos_token_ids:
                return self._finish(seq, "stop", None)
            # text is needed during generation only to find stop strings; otherwise LLM decodes it once at the end
            if p.stop and self.tokenizer is not None and self._hit_stop_string(seq):
                return
            if len(seq.output_token_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len:
                return self._finish(seq, "length", None)

    def _hit_stop_string(self, seq: Sequence) -> bool:
        old_len = len(seq.text)
        seq.text += detokenize_incrementally(self.tokenizer, seq)
        for stop in seq.params.stop:
            at = seq.text.find(stop, max(0, old_len - len(stop) + 1))
            if at >= 0:
                seq.text = seq.text[:at]  # the stop string itself is not returned (vLLM's default)
                self._finish(seq, "stop", stop)
                return True
        return False

    def _finish(self, seq: Sequence, reason: str, stop_reason: int | str | None) -> None:
        seq.status, seq.finish_reason, seq.stop_reason = Status.FINISHED, reason, stop_reason
        if self.tokenizer is not None and not seq.params.stop:
            # the whole text, once, as the request finishes: in async mode the device is running the next step
            # meanwhile, where decoding every output after the run would leave it idle
            seq.text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
