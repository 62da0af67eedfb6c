"""Host: the extended step's logprob columns (processors.pack_logprobs) -> vLLM's per-position dicts.

A step's `out` carries, after its token columns, W = 2 + 2 N int32 columns per emitted position: the token's
logprob (fp32 bits), its rank, the top N logprobs (fp32 bits) and their token ids (N = StepSpec.num_logprobs, the
engine's max_logprobs). Prefill's `out` may hold one more row per flat prompt token (prompt_logprobs).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np

from jaxspec.outputs import Logprob, PositionLogprobs


def split_decode(out: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray | None]:
    """decode out [B, k+2 (+ (k+1) W)] -> (count and tokens [B, k+2], logprobs [B, k+1, W] or None)."""
    if out.shape[1] == k + 2:
        return out, None
    return out[:, :k + 2], out[:, k + 2:].reshape(out.shape[0], k + 1, -1)


def split_prefill(out: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """prefill out [R (+ N), 2 (+ W)] -> (flag and token [R, 2], first-token logprobs [R, W] or None, prompt
    logprobs [N, W] (row t: the token after flat token t) or None)."""
    if out.shape[1] == 2:
        return out, None, None
    return out[:rows, :2], out[:rows, 2:], out[rows:, 2:] if out.shape[0] > rows else None


def token_text(tokenizer: Any | None) -> Callable[[int], str] | None:
    """A logprob's decoded_token: one token's text, decoded once per token id (a request's logprobs name (1 + N)
    tokens per position, mostly the same few thousand); None without a tokenizer."""
    if tokenizer is None:
        return None
    return functools.lru_cache(maxsize=None)(lambda t: tokenizer.decode([t]))


def position_logprobs(tokens: list[int], rows: np.ndarray, num: int,
                      decode: Callable[[int], str] | None) -> list[PositionLogprobs]:
    """Per position t: {tokens[t]: its Logprob, then the top `num` (rank 1..num)}, each with its text when `decode`
    is given. rows [T, W]; the columns are read in bulk (this runs over every output token of a request)."""
    n = (rows.shape[1] - 2) // 2
    num = min(num, n)
    own_lp, own_rank = rows[:, 0].view(np.float32).tolist(), rows[:, 1].tolist()
    top_lp, top_ids = rows[:, 2:2 + num].view(np.float32).tolist(), rows[:, 2 + n:2 + n + num].tolist()
    text = decode or (lambda _: None)
    out = []
    for token, lp, rank, lps, ids in zip(tokens, own_lp, own_rank, top_lp, top_ids):
        d = {token: Logprob(lp, rank, text(token))}
        for r, (t, v) in enumerate(zip(ids, lps), 1):
            if t not in d:
                d[t] = Logprob(v, r, text(t))
        out.append(d)
    return out


class FlatLogprobs(Sequence):
    """A completion's `logprobs` (vLLM's list of {token_id: Logprob}, and its FlatLogprobs idea): the step's rows
    [T, W] as they came from the device, each position's dict made when it is read. Building every dict at the
    finish costs the host seconds per batch (96 requests x 1,024 tokens x 6 Logprobs) that the device waits for,
    and most are never read. Equal to any sequence of the same dicts (a list among them)."""

    def __init__(self, tokens: list[int], rows: np.ndarray, num: int, decode: Callable[[int], str] | None):
        assert len(tokens) == len(rows), (len(tokens), len(rows))
        self._tokens, self._rows, self._num, self._decode = tokens, rows, num, decode
        self._made: dict[int, PositionLogprobs] = {}

    def __len__(self) -> int:
        return len(self._tokens)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return FlatLogprobs(self._tokens[i], self._rows[i], self._num, self._decode)
        if not -len(self) <= i < len(self):
            raise IndexError(f"logprobs position {i} of {len(self)}")
        i %= len(self)
        if i not in self._made:
            self._made[i] = position_logprobs(self._tokens[i:i + 1], self._rows[i:i + 1], self._num, self._decode)[0]
        return self._made[i]

    @property
    def state(self) -> tuple[list[int], np.ndarray, int, bool]:
        """(tokens, rows, num, whether the dicts carry text): what another process needs to make the same dicts
        with its own tokenizer (jaxspec.serve.wire)."""
        return self._tokens, self._rows, self._num, self._decode is not None

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, str) and list(self) == list(other)

    def __repr__(self) -> str:
        return repr(list(self))
