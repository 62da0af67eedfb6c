"""Host: the logprob rows of every unfinished request that asked for logprobs, in one array, a step at a time.

A decode step of an extended batch brings [B, k+1, W] rows (logprob_output). Kept per request as one small block a
step, they cost the host a numpy view and a list append per row and step, and a concatenation of hundreds of blocks
at each finish. Here each such request holds an entry of one array [entries, positions, W], indexed by output
position; a step's rows go in with one scatter, and a request's rows come out with one copy when it finishes. (The
engine with numpy outputs in place of the device, 96 rows, k = 3, on the CPU machine: the options' host work over
greedy's 0.19 -> 0.15 ms a step.) The array holds entries x the longest output x W int32: 96 requests of 2,048
tokens with max_logprobs 20 take 33 MB.

Rows are written at the output positions their tokens would take; the tokens a stop rule drops (or a finished
request's extra step) leave rows past the request's length, which are never read and are overwritten or freed
with the entry. An entry belongs to its request from its first token to its finish, wherever the request's slot
is (a preempted request keeps it while it waits to be recomputed).
"""

from __future__ import annotations

import numpy as np

from jaxspec.engine.sequence import Sequence


class LogprobStore:
    def __init__(self) -> None:
        self._rows = np.zeros((0, 0, 0), np.int32)  # [entries, positions, W]; grown by doubling
        self._free: list[int] = []
        self._entries = 0

    def add(self, seq: Sequence, start: int, rows: np.ndarray) -> None:
        """seq's rows [T, W] for output positions start..start+T-1 (its entry is made on its first rows)."""
        if seq.logprob_entry < 0:
            seq.logprob_entry = self._new_entry()
        self._fit(seq.logprob_entry + 1, start + len(rows), rows.shape[-1])
        self._rows[seq.logprob_entry, start:start + len(rows)] = rows

    def add_step(self, seqs: list[Sequence], rows: np.ndarray, counts: np.ndarray | None = None) -> None:
        """A decode dispatch's rows: [B, T, W] for the step's rows (seqs, in order; padding rows after them), or
        [M, B, T, W] with the tokens each row took in each step, counts [M, B], for a multi-step dispatch. Rows of
        requests without an entry (no logprobs asked, or finished) are skipped; the others go in after each
        request's current output."""
        n = len(seqs)
        entries = np.fromiter([s.logprob_entry for s in seqs], np.intp, n)
        starts = np.fromiter([len(s.output_token_ids) for s in seqs], np.intp, n)
        steps = rows[..., :n, :, :] if counts is not None else rows[None, :n]
        counts = None if counts is None else counts[:, :n]
        keep = entries >= 0
        if not keep.all():
            if not keep.any():
                return
            entries, starts, steps = entries[keep], starts[keep], steps[:, keep]
            counts = None if counts is None else counts[:, keep]
        T = steps.shape[2]
        ends = starts + T + (0 if counts is None else counts[:-1].sum(0))
        self._fit(int(entries.max()) + 1, int(ends.max()), steps.shape[-1])
        positions = starts[:, None] + np.arange(T)
        for m, block in enumerate(steps):
            if m:
                positions = positions + counts[m - 1][:, None]
            self._rows[entries[:, None], positions] = block

    def rows(self, seq: Sequence) -> np.ndarray:
        """seq's rows [len(output), W] (a copy: the entry goes on changing, and is freed at the finish)."""
        n = len(seq.output_token_ids)
        if seq.logprob_entry < 0:
            return seq.logprob_rows[:n] if seq.logprob_rows is not None else np.zeros((0, 2), np.int32)
        return self._rows[seq.logprob_entry, :n].copy()

    def release(self, seq: Sequence) -> None:
        """seq finished: its rows move to the sequence (seq.logprob_rows) and its entry is free for another."""
        if seq.logprob_entry >= 0:
            seq.logprob_rows = self.rows(seq)
            self._free.append(seq.logprob_entry)
            seq.logprob_entry = -1

    def _new_entry(self) -> int:
        if self._free:
            return self._free.pop()
        self._entries += 1
        return self._entries - 1

    def _fit(self, entries: int, positions: int, width: int) -> None:
        E, P, W = self._rows.shape
        if entries <= E and positions <= P:
            assert width == W, (width, W)
            return
        grown = np.zeros((E if entries <= E else max(entries, 2 * E, 8),
                          P if positions <= P else max(positions, 2 * P, 64), width), np.int32)
        if E and P:
            grown[:E, :P] = self._rows
        self._rows = grown
