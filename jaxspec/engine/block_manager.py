"""Host-side owner of the KV pages: the target's and the draft head's caches share page ids."""

from __future__ import annotations

from collections import deque

import numpy as np

from jaxspec.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_pages: int, page_size: int, pages_per_seq: int, num_slots: int):
        self.page_size = page_size
        self.pages_per_seq = pages_per_seq
        self.num_pages = num_pages
        self.free_page_ids: deque[int] = deque(range(num_pages))
        # Every slot's block table, kept current as pages come and go, so a step's tables are one gather by slot.
        # Row num_slots (padding rows) and unallocated entries are -1.
        self.tables = np.full((num_slots + 1, pages_per_seq), -1, np.int32)

    def reset(self) -> None:
        """Every page free, every table empty."""
        self.free_page_ids = deque(range(self.num_pages))
        self.tables[:] = -1

    @property
    def num_free(self) -> int:
        return len(self.free_page_ids)

    def pages_for(self, num_positions: int) -> int:
        """Pages that cover positions [0, num_positions), capped at a sequence's block-table width."""
        return min(-(-num_positions // self.page_size), self.pages_per_seq)

    def can_grow(self, seq: Sequence, num_positions: int) -> bool:
        return self.pages_for(num_positions) - len(seq.pages) <= self.num_free

    def grow(self, seq: Sequence, num_positions: int) -> None:
        """Give `seq` (holding a slot) pages for positions [0, num_positions); the caller checked `can_grow`."""
        have = len(seq.pages)
        for _ in range(self.pages_for(num_positions) - have):
            seq.pages.append(self.free_page_ids.popleft())
        self.tables[seq.slot, have:len(seq.pages)] = seq.pages[have:]

    def free(self, seq: Sequence) -> None:
        """Return a sequence's pages. Safe while steps that use them are in flight: the device runs steps in
        order, so a later owner's writes land after them."""
        self.free_page_ids.extend(seq.pages)
        self.tables[seq.slot] = -1
        seq.pages = []
