"""Host: the logprob rows of every unfinished request that asked for logprobs, in one pool, a step at a time.

A decode step of an extended batch brings [B, k+1, W] rows (logprob_output). Kept per request as one small block a
step, they cost the host a numpy view and a list append per row and step, and a concatenation of hundreds of blocks
at each finish. Here each such request holds an entry: a row of a page table into one pool of pages [pages, PAGE,
W], indexed by output position (as the KV cache is by sequence position); a step's rows go in with one scatter, and
a request's rows come out with one gather when it finishes. (The engine with numpy outputs in place of the device,
96 rows, k = 3, on the CPU machine, the least of 9 runs: the options' host work over greedy's 0.215 / 0.148 ->
0.175 / 0.138 ms a step in two rounds; the scatter takes ~33 us.) Pages keep the memory to the requests' own
lengths, rounded up to PAGE: one long request does not make every entry as long.

Rows are written at the output positions their tokens would take; the tokens a stop rule drops (or a finished
request's extra step) leave rows past the request's length, which are never read and are overwritten or freed
with the entry. An entry belongs to its request from its first token to its finish, wherever the request's slot
is (a preempted request keeps it while it waits to be recomputed).
"""

from __future__ import annotations

import numpy as np

from jaxspec.engine.sequence import Sequence

PAGE = 128  # output positions a page holds (W = 42 int32 columns with max_logprobs 20: 21 KB)


class LogprobStore:
    def __init__(self) -> None:
        self._pool = np.zeros((0, PAGE, 0), np.int32)  # [pages, PAGE, W]; grown by doubling
        self._free_pages: list[int] = []
        self._tables = np.full((0, 0), -1, np.intp)  # [entries, pages]: an entry's pages in position order
        self._free_entries: list[int] = []

    def add(self, seq: Sequence, start: int, rows: np.ndarray) -> None:
        """seq's rows [T, W] for output positions start..start+T-1 (its entry is made on its first rows)."""
        if seq.logprob_entry < 0:
            seq.logprob_entry = self._new_entry()
        self._write(np.array([seq.logprob_entry]), (start + np.arange(len(rows)))[None], rows[None])

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
        positions = starts[:, None] + np.arange(steps.shape[2])
        for m, block in enumerate(steps):
            if m:
                positions = positions + counts[m - 1][:, None]
            self._write(entries, positions, block)

    def rows(self, seq: Sequence) -> np.ndarray:
        """seq's rows [len(output), W]: gathered from its pages while it runs (a copy: they go on changing, and are
        freed at the finish), then the rows the finish kept."""
        n = len(seq.output_token_ids)
        if seq.logprob_entry < 0:
            return seq.logprob_rows[:n] if seq.logprob_rows is not None else np.zeros((0, 2), np.int32)
        pages = self._tables[seq.logprob_entry, :-(-n // PAGE)]
        return self._pool[pages].reshape(-1, self._pool.shape[2])[:n]

    def release(self, seq: Sequence) -> None:
        """seq finished: its rows move to the sequence (seq.logprob_rows), its pages and entry are free for others."""
        e = seq.logprob_entry
        if e >= 0:
            seq.logprob_rows = self.rows(seq)
            table = self._tables[e]
            self._free_pages += table[table >= 0].tolist()
            table[:] = -1
            self._free_entries.append(e)
            seq.logprob_entry = -1

    def _write(self, entries: np.ndarray, positions: np.ndarray, block: np.ndarray) -> None:
        """block [n, T, W] at these entries' positions [n, T], allocating the pages they reach first."""
        cols = positions // PAGE  # [n, T]: each position's page in its entry's table row
        if cols.max() >= self._tables.shape[1]:
            grown = np.full((len(self._tables), max(cols.max() + 1, 2 * self._tables.shape[1])), -1, np.intp)
            grown[:, :self._tables.shape[1]] = self._tables
            self._tables = grown
        pages = self._tables[entries[:, None], cols]  # [n, T]
        missing = pages < 0
        if missing.any():  # a request crossed into a page it has no page for yet (once every PAGE tokens)
            rows = np.broadcast_to(entries[:, None], pages.shape)[missing]
            for e, p in sorted(set(zip(rows.tolist(), cols[missing].tolist()))):
                self._tables[e, p] = self._new_page(block.shape[-1])
            pages = self._tables[entries[:, None], cols]
        self._pool[pages, positions % PAGE] = block

    def _new_page(self, width: int) -> int:
        if not self._free_pages:
            n = len(self._pool)
            grown = np.zeros((max(2 * n, 8), PAGE, width), np.int32)
            if n:
                grown[:n] = self._pool
            self._pool = grown
            self._free_pages = list(range(len(grown) - 1, n - 1, -1))
        return self._free_pages.pop()

    def _new_entry(self) -> int:
        if not self._free_entries:
            n = len(self._tables)
            grown = np.full((max(2 * n, 8), self._tables.shape[1]), -1, np.intp)
            grown[:n] = self._tables
            self._tables = grown
            self._free_entries = list(range(len(grown) - 1, n - 1, -1))
        return self._free_entries.pop()
