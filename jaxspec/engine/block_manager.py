"""Host-side owner of the KV pages: the target's and the draft head's caches share page ids.

Prefix caching (vLLM's automatic prefix caching): a full page whose KV depends only on token ids, in both caches,
is registered under a hash of every token up to its end (a chain: the page's tokens and the hash of the page
before it). A new request looks its prompt's full pages up and starts its prefill after the longest run of hits,
sharing those pages (a reference count per page). Which pages qualify: those inside [0, L - 1) of the tokens the
request prefills (L of them): the draft head's KV at position p pairs the target's feature at p with the token at
p + 1, which for the last prompt position is the token sampled there. A page nobody holds any more keeps its
contents and its hash, evictable, and is handed out again least recently freed first once no free page is left.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque

import numpy as np

from jaxspec.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_pages: int, page_size: int, pages_per_seq: int, num_slots: int,
                 enable_prefix_caching: bool = False):
        self.page_size = page_size
        self.pages_per_seq = pages_per_seq
        self.num_pages = num_pages
        self.enable_prefix_caching = enable_prefix_caching
        # Every slot's block table, kept current as pages come and go, so a step's tables are one gather by slot.
        # Row num_slots (padding rows) and unallocated entries are -1.
        self.tables = np.full((num_slots + 1, pages_per_seq), -1, np.int32)
        # prompt tokens of admitted requests that looked in the cache, and of those found there (vLLM's
        # prefix_cache_queries and prefix_cache_hits)
        self.prefix_queries = self.prefix_hits = 0
        self.reset()

    def reset(self) -> None:
        """Every page free, every table empty, the prefix cache forgotten (the device caches may be new)."""
        self.free_page_ids: deque[int] = deque(range(self.num_pages))
        self.tables[:] = -1
        self.refs = [0] * self.num_pages  # sequences holding each page
        self.cached: dict[bytes, int] = {}  # prefix hash -> page
        self.page_hash: dict[int, bytes] = {}  # page -> its prefix hash, for registered pages
        self.evictable: OrderedDict[int, None] = OrderedDict()  # registered pages nobody holds, oldest first

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (vLLM's reset_prefix_cache), while no page is held: False, and nothing
        forgotten, if any is."""
        if any(self.refs):
            return False
        self.free_page_ids.extend(self.evictable)
        self.evictable.clear()
        self.cached.clear()
        self.page_hash.clear()
        return True

    @property
    def num_free(self) -> int:
        """Pages that can be handed out: free ones and evictable cached ones."""
        return len(self.free_page_ids) + len(self.evictable)

    def pages_for(self, num_positions: int) -> int:
        """Pages that cover positions [0, num_positions), capped at a sequence's block-table width."""
        return min(-(-num_positions // self.page_size), self.pages_per_seq)

    def can_grow(self, seq: Sequence, num_positions: int) -> bool:
        return self.pages_for(num_positions) - len(seq.pages) <= self.num_free

    def grow(self, seq: Sequence, num_positions: int) -> None:
        """Give `seq` (holding a slot) pages for positions [0, num_positions); the caller checked `can_grow`. Its
        whole table row is written (pages taken from the prefix cache before it had a slot included)."""
        for _ in range(self.pages_for(num_positions) - len(seq.pages)):
            seq.pages.append(self._take())
        self.tables[seq.slot, :len(seq.pages)] = seq.pages

    def _take(self) -> int:
        if self.free_page_ids:
            page = self.free_page_ids.popleft()
        else:  # the least recently freed cached page: its hash goes with it
            page, _ = self.evictable.popitem(last=False)
            del self.cached[self.page_hash.pop(page)]
        self.refs[page] = 1
        return page

    def free(self, seq: Sequence) -> None:
        """Return a sequence's pages. Safe while steps that use them are in flight: the device runs steps in
        order, so a later owner's writes land after them."""
        self.shrink(seq, 0)

    def shrink(self, seq: Sequence, num_pages: int) -> None:
        """Return a sequence's pages past its first `num_pages` (safe while steps are in flight, as `free`, when
        none of them writes past those pages)."""
        for page in seq.pages[num_pages:]:
            self.refs[page] -= 1
            if self.refs[page] == 0:
                if page in self.page_hash:
                    self.evictable[page] = None
                else:
                    self.free_page_ids.append(page)
        if seq.slot >= 0:
            self.tables[seq.slot, num_pages:] = -1
        del seq.pages[num_pages:]

    # ---- prefix caching

    def _hashes(self, seq: Sequence, num_pages: int) -> list[bytes]:
        """The prefix hashes of seq's first num_pages full pages of prefill_token_ids (kept on the sequence)."""
        hashes, ids, size = seq.page_hashes, seq.prefill_token_ids, self.page_size
        while len(hashes) < num_pages:
            i = len(hashes)
            h = hashlib.sha256(hashes[-1] if hashes else b"")
            h.update(np.asarray(ids[i * size:(i + 1) * size], np.int64).tobytes())
            hashes.append(h.digest())
        return hashes[:num_pages]

    def share_prefix(self, seq: Sequence) -> int:
        """Give a sequence that starts its prefill (no pages yet) the cached pages of the longest run of its full
        pages found in the cache; returns the tokens they cover (its prefill starts there). (With the cache off
        nothing is registered, so nothing is found; the scheduler does not look then.)"""
        usable = (len(seq.prefill_token_ids) - 1) // self.page_size
        for h in self._hashes(seq, usable):
            page = self.cached.get(h)
            if page is None:
                break
            if self.refs[page] == 0:
                del self.evictable[page]
            self.refs[page] += 1
            seq.pages.append(page)
        return len(seq.pages) * self.page_size

    def register(self, seq: Sequence, num_computed: int) -> None:
        """seq's KV is computed (dispatched) for positions [0, num_computed) of its prefill tokens: cache its full
        pages inside [0, min(num_computed, L - 1)). A hash already cached under another page keeps that page."""
        if not self.enable_prefix_caching:
            return
        full = min(num_computed, len(seq.prefill_token_ids) - 1) // self.page_size
        for page, h in zip(seq.pages[:full], self._hashes(seq, full)):
            if page not in self.page_hash and h not in self.cached:
                self.cached[h] = page
                self.page_hash[page] = h
