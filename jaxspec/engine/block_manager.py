"""Host-side owner of the KV pages: the target's and the draft head's caches share page ids."""

from __future__ import annotations

from collections import deque

from jaxspec.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_pages: int, page_size: int, pages_per_seq: int):
        self.page_size = page_size
        self.pages_per_seq = pages_per_seq
        self.num_pages = num_pages
        self.free_page_ids: deque[int] = deque(range(num_pages))

    @property
    def num_free(self) -> int:
        return len(self.free_page_ids)

    def pages_for(self, num_positions: int) -> int:
        """Pages that cover positions [0, num_positions), capped at a sequence's block-table width."""
        return min(-(-num_positions // self.page_size), self.pages_per_seq)

    def can_grow(self, seq: Sequence, num_positions: int) -> bool:
        return self.pages_for(num_positions) - len(seq.pages) <= self.num_free

    def grow(self, seq: Sequence, num_positions: int) -> None:
        """Give `seq` pages for positions [0, num_positions); the caller checked `can_grow`."""
        for _ in range(self.pages_for(num_positions) - len(seq.pages)):
            seq.pages.append(self.free_page_ids.popleft())

    def free(self, seq: Sequence) -> None:
        """Return a sequence's pages. Safe while steps that use them are in flight: the device runs steps in
        order, so a later owner's writes land after them."""
        self.free_page_ids.extend(seq.pages)
        seq.pages = []
