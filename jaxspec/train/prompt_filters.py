"""Screening prompts before training on them: quality rules, exact and near-duplicate removal, overlap with texts
that must stay unseen (benchmark test splits), a held-out split by hash, and a topic-diversity report.

Host-only (Python and numpy): it runs between generation chunks. Everything is deterministic: hashes are crc32 and
sha256 (never Python's salted `hash`), the MinHash permutations come from a fixed seed.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
import zlib
from collections import Counter
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FilterConfig:
    min_chars: int = 10
    min_words: int = 3  # whitespace-separated; set 1 for languages written without spaces
    max_chars: int = 2000
    max_repeated_trigrams: float = 0.3  # fraction of word 3-grams that repeat an earlier one: degenerate loops
    max_char_run: int = 10  # one character this many times in a row ("!!!!!!!!!!")
    min_letter_fraction: float = 0.4  # letters among non-space characters; code prompts sit near 0.6
    near_duplicate_jaccard: float = 0.7  # word 3-gram Jaccard at or above which two prompts count as one
    # a word n-gram shared with an excluded text drops the prompt: GSM8K test shares a 10-gram with its own train
    # split in 9 of 1,319 questions (8-grams: 80, stock phrases such as "how much money does she have left")
    overlap_ngram: int = 10


_LETTER, _SPACE = re.compile(r"[^\W\d_]"), re.compile(r"\s")


def normalize(text: str) -> str:
    """Case, width and punctuation folded away: the form duplicates are compared in."""
    folded = unicodedata.normalize("NFKC", text).lower()
    return " ".join(re.sub(r"[\W_]+", " ", folded).split())


def _ngrams(words: list[str], n: int) -> list[tuple[str, ...]]:
    """Word n-grams; a text shorter than n is one gram of all its words."""
    if len(words) < n:
        return [tuple(words)] if words else []
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


def quality_reason(text: str, cfg: FilterConfig = FilterConfig()) -> str | None:
    """The first rule the text breaks: "empty", "too_short", "too_long", "non_text" or "repetitive"; None if it
    breaks none."""
    text = text.strip()
    if not text:
        return "empty"
    words = normalize(text).split()
    if len(text) < cfg.min_chars or len(words) < cfg.min_words:
        return "too_short"
    if len(text) > cfg.max_chars:
        return "too_long"
    if len(_LETTER.findall(text)) < cfg.min_letter_fraction * (len(text) - len(_SPACE.findall(text))):
        return "non_text"
    trigrams = _ngrams(words, 3)
    if len(trigrams) >= 4 and 1 - len(set(trigrams)) / len(trigrams) > cfg.max_repeated_trigrams:
        return "repetitive"
    if re.search(r"(\S)\1{%d,}" % (cfg.max_char_run - 1), text):
        return "repetitive"
    return None


class Deduplicator:
    """Exact (normalized text) and near duplicates (word 3-gram Jaccard >= threshold) of everything added so far.

    Near duplicates are found by MinHash LSH: 16 bands of 4 hashes make a pair at Jaccard 0.7 a candidate with
    probability 0.99 (0.5: 0.64), and candidates are confirmed by their exact Jaccard, so nothing below the threshold
    is ever dropped.
    """
    def __init__(self, threshold: float = 0.7, bands: int = 16, rows: int = 4):
        rng = np.random.default_rng(20240612)
        self.threshold, self.bands, self.rows = threshold, bands, rows
        # multiply-shift hashing: odd 64-bit multipliers, wrapping uint64 arithmetic, the top 32 bits
        self._a = rng.integers(0, 2**63, bands * rows, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        self._b = rng.integers(0, 2**63, bands * rows, dtype=np.uint64)
        self._exact: set[str] = set()
        self._buckets: list[dict[bytes, list[int]]] = [{} for _ in range(bands)]
        self._shingles: list[frozenset[int]] = []

    def add(self, text: str) -> str | None:
        """Add the text unless it duplicates an earlier one: None when added, else "duplicate" or
        "near_duplicate"."""
        norm = normalize(text)
        if norm in self._exact:
            return "duplicate"
        shingles = frozenset(zlib.crc32(" ".join(g).encode()) for g in _ngrams(norm.split(), 3))
        keys = self._band_keys(shingles)
        candidates = {j for band, key in zip(self._buckets, keys) for j in band.get(key, ())}
        if any(_jaccard(shingles, self._shingles[j]) >= self.threshold for j in sorted(candidates)):
            return "near_duplicate"
        self._exact.add(norm)
        for band, key in zip(self._buckets, keys):
            band.setdefault(key, []).append(len(self._shingles))
        self._shingles.append(shingles)
        return None

    def _band_keys(self, shingles: frozenset[int]) -> list[bytes]:
        h = np.fromiter(shingles, np.uint64, len(shingles)) if shingles else np.zeros(1, np.uint64)
        signature = ((np.multiply.outer(h, self._a) + self._b) >> np.uint64(32)).min(axis=0)  # [bands * rows]
        raw, width = signature.tobytes(), self.rows * signature.itemsize
        return [raw[i * width:(i + 1) * width] for i in range(self.bands)]


def _jaccard(a: frozenset[int], b: frozenset[int]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


class OverlapIndex:
    """Texts that must stay unseen (a benchmark's test split): a prompt overlaps them when its normalized text
    equals one of them or shares a word n-gram with one."""

    def __init__(self, texts: list[str], n: int = 10):
        self.n = n
        self._exact = {normalize(t) for t in texts}
        self._grams = {g for t in texts for g in _ngrams(normalize(t).split(), n)}

    def __len__(self) -> int:
        return len(self._exact)

    def overlaps(self, text: str) -> bool:
        norm = normalize(text)
        return norm in self._exact or any(g in self._grams for g in _ngrams(norm.split(), self.n))


def is_held_out(text: str, fraction: float) -> bool:
    """Whether a prompt belongs to the held-out split: by a hash of its normalized text, so the split of a prompt
    never depends on which other prompts were drawn, or in which order."""
    digest = hashlib.sha256(normalize(text).encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


def diversity_report(rows: list[dict]) -> dict:
    """How varied a prompt set is: categories, mean length, the share of distinct first words and of distinct word
    bigrams, and the most common first words (mostly the request's verb or question word)."""
    texts = [r["prompt"] for r in rows]
    words = [normalize(t).split() for t in texts]
    first = Counter(w[0] for w in words if w)
    bigrams = [g for w in words for g in zip(w, w[1:])]
    n = max(len(rows), 1)
    return {"num_prompts": len(rows),
            "categories": dict(sorted(Counter(r.get("category", "") for r in rows).items())),
            "mean_words": round(sum(map(len, words)) / n, 1), "mean_chars": round(sum(map(len, texts)) / n, 1),
            "distinct_first_words": round(len(first) / n, 4),
            "distinct_bigrams": round(len(set(bigrams)) / max(len(bigrams), 1), 4),
            "top_first_words": first.most_common(10)}
