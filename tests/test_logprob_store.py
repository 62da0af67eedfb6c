"""LogprobStore against per-request lists of the same rows: growth in both directions, entries freed at the finish
and reused, rows of requests without logprobs or finished skipped, multi-step blocks placed by their counts."""

from __future__ import annotations

import numpy as np

from jaxspec.engine.logprob_store import LogprobStore
from jaxspec.engine.sequence import Sequence
from jaxspec.sampling_params import SamplingParams


def test_store_keeps_each_requests_rows_through_growth_and_reuse():
    rng = np.random.default_rng(0)
    store, W, T = LogprobStore(), 6, 3
    want: dict[int, list[np.ndarray]] = {}
    seqs = [Sequence(str(i), [1], SamplingParams(logprobs=2 if i % 4 else None), 0) for i in range(40)]
    live = seqs[:12]
    for s in live:
        if s.params.logprobs is not None:
            row = rng.integers(0, 99, (1, W), dtype=np.int32)
            store.add(s, 0, row)
            want[id(s)] = [row]
        s.output_token_ids.append(7)
    later = iter(seqs[12:])
    for step in range(120):
        rows = rng.integers(0, 99, (len(live) + 2, T, W), dtype=np.int32)  # two padding rows
        counts = rng.integers(1, T + 1, len(live))
        store.add_step(live, rows)
        for i, (s, n) in enumerate(zip(live, counts)):
            if s.logprob_entry >= 0:
                want[id(s)].append(rows[i, :n])
            s.output_token_ids += [7] * int(n)
        if step % 10 == 9:  # one finishes, another starts (and takes its entry, if it wants logprobs)
            done = live.pop(0)
            store.release(done)
            if done.params.logprobs is not None:
                np.testing.assert_array_equal(store.rows(done), np.concatenate(want[id(done)]))
                assert done.logprob_entry == -1
            new = next(later)
            if new.params.logprobs is not None:
                row = rng.integers(0, 99, (1, W), dtype=np.int32)
                store.add(new, 0, row)
                want[id(new)] = [row]
            new.output_token_ids.append(7)
            live.append(new)
    for s in live:
        if s.params.logprobs is not None:
            np.testing.assert_array_equal(store.rows(s), np.concatenate(want[id(s)]))
        else:
            assert s.logprob_entry == -1 and len(store.rows(s)) == 0
    assert len(store._tables) <= 16 and len(store._pool) <= 64  # entries and pages were reused


def test_multi_step_block_lands_after_each_steps_tokens():
    store, W = LogprobStore(), 4
    seqs = [Sequence(str(i), [1], SamplingParams(logprobs=1), 0) for i in range(3)]
    for s in seqs:
        store.add(s, 0, np.zeros((1, W), np.int32))
        s.output_token_ids.append(0)
    rows = np.arange(2 * 4 * 3 * W, dtype=np.int32).reshape(2, 4, 3, W)  # [M, B, T, W]: one padding row
    counts = np.array([[1, 3, 2, 0], [2, 0, 3, 0]])  # the second row stopped on the device after its first step
    store.add_step(seqs, rows, counts)
    for i, s in enumerate(seqs):
        s.output_token_ids += [0] * int(counts[:, i].sum())
        want = np.concatenate([np.zeros((1, W), np.int32), rows[0, i, :counts[0, i]], rows[1, i, :counts[1, i]]])
        np.testing.assert_array_equal(store.rows(s), want)
