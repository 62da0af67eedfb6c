"""Host: which automata (structured_output.Automaton) sit where in the device's grammar tables (engine/grammar.py).

Each constraint in use holds a range of pool states and a range of transitions; requests with the same constraint
share it. A placement is reserved when the scheduler admits a request (`reserve`: False, and the request waits,
while the running requests' automata leave no room) and written to the device before the request's admission
(`uploads`). One no unfinished request uses is evicted, least recently used first, when a new one needs its room;
its rows stay on the device until overwritten, so a dispatched step of a finished request still reads valid
(if stale) ids.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from jaxspec.structured_output import Automaton

CHUNK_STATES = 256  # states one upload dispatch writes
CHUNK_TRANSITIONS = 1 << 16  # transitions one upload dispatch writes


@dataclass
class Placement:
    automaton: Automaton
    state_at: int
    edge_at: int
    owners: list = field(default_factory=list)  # the sequences that use it (finished ones pruned)
    uploaded: bool = False


class _Ranges:
    """Free ranges of [0, size): first fit, merged when freed."""

    def __init__(self, size: int):
        self.free: list[tuple[int, int]] = [(0, size)] if size > 0 else []

    def take(self, n: int) -> int | None:
        if n == 0:
            return 0
        for i, (start, length) in enumerate(self.free):
            if length >= n:
                self.free[i:i + 1] = [(start + n, length - n)] if length > n else []
                return start
        return None

    def give(self, start: int, n: int) -> None:
        if n == 0:
            return
        spans = sorted(self.free + [(start, n)])
        merged = [spans[0]]
        for s, length in spans[1:]:
            if merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((s, length))
        self.free = merged


class GrammarPool:
    def __init__(self, max_states: int, max_transitions: int):
        self.max_states, self.max_transitions = max_states, max_transitions
        self._states, self._edges = _Ranges(max_states), _Ranges(max_transitions)
        self.placements: OrderedDict[str, Placement] = OrderedDict()  # least recently used first

    def check(self, automaton: Automaton, what: str) -> None:
        """A ValueError, before the request is queued, when the automaton can never fit the pool."""
        if automaton.num_states > self.max_states or automaton.num_transitions > self.max_transitions:
            raise ValueError(f"{what}: its automaton has {automaton.num_states} states and "
                             f"{automaton.num_transitions} transitions; the engine's pool holds {self.max_states} and "
                             f"{self.max_transitions} (structured_outputs_config max_states / max_transitions)")

    def reserve(self, key: str, automaton: Automaton, owner) -> bool:
        """Place the automaton (or find it placed) for `owner` (a Sequence); False if the automata of unfinished
        requests leave no room now."""
        placement = self.placements.get(key)
        if placement is None:
            placement = self._place(automaton)
            if placement is None:
                return False
            self.placements[key] = placement
        self.placements.move_to_end(key)
        if owner not in placement.owners:
            placement.owners.append(owner)
        return True

    def placement(self, key: str) -> Placement:
        return self.placements[key]

    def _place(self, automaton: Automaton) -> Placement | None:
        n, e = automaton.num_states, automaton.num_transitions
        while True:
            state_at, edge_at = self._states.take(n), self._edges.take(e)
            if state_at is not None and edge_at is not None:
                return Placement(automaton, state_at, edge_at)
            if state_at is not None:
                self._states.give(state_at, n)
            if edge_at is not None:
                self._edges.give(edge_at, e)
            if not self._evict_one():
                return None

    def _evict_one(self) -> bool:
        for key, placement in self.placements.items():
            placement.owners = [s for s in placement.owners if not s.is_finished]
            if not placement.owners:
                del self.placements[key]
                self._states.give(placement.state_at, placement.automaton.num_states)
                self._edges.give(placement.edge_at, placement.automaton.num_transitions)
                return True
        return False

    def uploads(self, key: str) -> Iterator[tuple[np.ndarray, ...]]:
        """The chunks that write a reserved automaton into the tables (none once written): grammar.place's
        arguments after the tables, fixed shapes (CHUNK_STATES, CHUNK_TRANSITIONS), ids offset to the pool's."""
        p = self.placements[key]
        if p.uploaded:
            return
        p.uploaded = True
        a = p.automaton
        chunks = max(-(-a.num_states // CHUNK_STATES), -(-a.num_transitions // CHUNK_TRANSITIONS), 1)
        for i in range(chunks):
            states = slice(i * CHUNK_STATES, (i + 1) * CHUNK_STATES)
            edges = slice(i * CHUNK_TRANSITIONS, (i + 1) * CHUNK_TRANSITIONS)
            row_len = a.row_len[states]
            counts = np.array([p.state_at + states.start, len(row_len), p.edge_at + edges.start,
                               len(a.tokens[edges])], np.int32)
            yield (counts, _padded(a.allowed[states], CHUNK_STATES),
                   _padded(a.row_start[states] + p.edge_at, CHUNK_STATES), _padded(row_len, CHUNK_STATES),
                   _padded(a.only_end[states], CHUNK_STATES), _padded(a.tokens[edges], CHUNK_TRANSITIONS),
                   _padded(a.next[edges] + p.state_at, CHUNK_TRANSITIONS))

    def initial_state(self, key: str, output_token_ids: list[int]) -> int:
        """The pool state of a request admitted with these output tokens (recomputed after preemption; none: the
        automaton's initial state)."""
        p = self.placements[key]
        local = p.automaton.walk(output_token_ids)
        return -1 if local < 0 else p.state_at + local

    def forget_uploads(self) -> None:
        """The device tables were made anew (ModelRunner.restore): every placement is written again at its next
        admission."""
        for placement in self.placements.values():
            placement.uploaded = False


def _padded(rows: np.ndarray, size: int) -> np.ndarray:
    """rows [n, ...] (n <= size) padded with zeros to [size, ...]: the fixed shapes of one upload."""
    out = np.zeros((size,) + rows.shape[1:], rows.dtype)
    out[:len(rows)] = rows
    return out
