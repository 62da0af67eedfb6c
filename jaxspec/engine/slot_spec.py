"""Host: what an extended request puts into its slot's processor state (engine/processors.py), and its limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from jaxspec.structured_output import Automaton

MAX_BAD_WORDS = 64  # token sequences per request (a word may give two: with and without a leading space)
MAX_BAD_WORD_TOKENS = 8  # tokens per bad word
MAX_SPARSE_STOPS = 16  # stop ids an admission sends as ids; a request with more sends its dense rows


@dataclass
class SlotSpec:
    """Built and checked at admission (engine/input_processor.py)."""
    logit_bias: dict[int, float]
    allowed_token_ids: list[int] | None
    bad_words: list[list[int]]  # token sequences, each 1..MAX_BAD_WORD_TOKENS long, at most MAX_BAD_WORDS
    stop_ids: list[int]  # banned while the output is shorter than min_tokens: EOS and stop_token_ids
    grammar: tuple[str, Automaton] | None = None  # structured outputs: the constraint's key and token automaton

    def needs_dense_rows(self, vocab_size: int) -> bool:
        """Whether its bias or stop mask must travel as [V] rows: logit_bias, allowed_token_ids, or more stop ids
        than MAX_SPARSE_STOPS (otherwise sparse_rows say it all)."""
        return bool(self.logit_bias) or self.allowed_token_ids is not None or \
            len(self._stop_ids(vocab_size)) > MAX_SPARSE_STOPS

    def _stop_ids(self, vocab_size: int) -> list[int]:
        return [t for t in self.stop_ids if t < vocab_size]

    def sparse_rows(self, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
        """(stop ids [MAX_SPARSE_STOPS] int32, -1 padded; bad_words [W, L] int32): processors.admit's rows for a
        request with a zero bias (not needs_dense_rows), a few hundred bytes instead of [V] rows."""
        stop = np.full(MAX_SPARSE_STOPS, -1, np.int32)
        ids = self._stop_ids(vocab_size)
        stop[:len(ids)] = ids
        return stop, self._bad_words()

    def rows(self, vocab_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bias [V] fp32, stop_mask [V] bool, bad_words [W, L] int32): processors.admit's rows."""
        bias = np.zeros(vocab_size, np.float32)
        if self.allowed_token_ids is not None:
            bias[:] = -np.inf
            bias[self.allowed_token_ids] = 0.0
        for t, b in self.logit_bias.items():
            bias[t] += b
        stop = np.zeros(vocab_size, bool)
        stop[self._stop_ids(vocab_size)] = True
        return bias, stop, self._bad_words()

    def _bad_words(self) -> np.ndarray:
        bad = np.full((MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS), -1, np.int32)
        for i, word in enumerate(self.bad_words):
            bad[i, MAX_BAD_WORD_TOKENS - len(word):] = word
        return bad
