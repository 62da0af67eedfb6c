"""Host: the extended step's logprob columns (processors.pack_logprobs) -> vLLM's per-position dicts.

A step's `out` carries, after its token columns, W = 2 + 2 N int32 columns per emitted position: the token's
logprob (fp32 bits), its rank, the top N logprobs (fp32 bits) and their token ids (N = StepSpec.num_logprobs, the
engine's max_logprobs). Prefill's `out` may hold one more row per flat prompt token (prompt_logprobs).
"""

from __future__ import annotations

from typing import Callable

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


def position_logprobs(token: int, row: np.ndarray, num: int,
                      decode: Callable[[int], str] | None) -> PositionLogprobs:
    """{token: its Logprob, then the top `num` (rank 1..num)}, each with its text when `decode` is given."""
    n = (len(row) - 2) // 2
    top_lp, top_ids = row[2:2 + n].view(np.float32), row[2 + n:]
    text = decode or (lambda _: None)
    out = {token: Logprob(float(row[:1].view(np.float32)[0]), int(row[1]), text(token))}
    for r in range(min(num, n)):
        t = int(top_ids[r])
        if t not in out:
            out[t] = Logprob(float(top_lp[r]), r + 1, text(t))
    return out
