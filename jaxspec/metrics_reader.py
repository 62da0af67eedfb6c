"""vLLM's `LLM.get_metrics()` (`vllm.v1.metrics.reader`): the engine's counters and gauges as a list of Metric
objects under vLLM's names, so vLLM code that reads them (its speculative-decoding example sums
`vllm:spec_decode_num_accepted_tokens_per_pos` this way) runs unchanged; the server's /metrics exposes the same
table (serve/metrics.py).

The list also answers to jaxspec's own names: `llm.get_metrics()["mean_acceptance_length"]` is
`llm.stats()["mean_acceptance_length"]` (steps, host wait, k chosen, pages, ...), which vLLM has no names for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Metric:
    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    value: int


@dataclass
class Vector(Metric):
    """A list of counters: vLLM's vllm:spec_decode_num_accepted_tokens_per_pos (one a draft position)."""
    values: list[int]


@dataclass
class Gauge(Metric):
    value: float


@dataclass
class Histogram(Metric):
    """vLLM's request latency and size histograms: buckets maps each upper bound, as Prometheus's `le` label
    ("0.001", "1.0", "+Inf"), to the observations at or below it."""
    count: int
    sum: float
    buckets: dict[str, int]


# (vLLM's name, its type, its description, its value from LLM.stats())
ENGINE: list[tuple[str, type, str, Callable[[dict], Any]]] = [
    ("vllm:num_requests_running", Gauge, "Number of requests in model execution batches.",
     lambda m: m["num_requests_running"]),
    ("vllm:num_requests_waiting", Gauge, "Number of requests waiting to be processed.",
     lambda m: m["num_requests_waiting"]),
    ("vllm:kv_cache_usage_perc", Gauge, "KV-cache usage. 1 means 100 percent usage.",
     lambda m: 1 - m["num_free_pages"] / m["num_pages"]),
    ("vllm:num_preemptions", Counter, "Cumulative number of preemption from the engine.",
     lambda m: m["num_preemptions"]),
    ("vllm:prefix_cache_queries", Counter, "Prefix cache queries, in terms of number of queried tokens.",
     lambda m: m["prefix_cache_queries"]),
    ("vllm:prefix_cache_hits", Counter, "Prefix cache hits, in terms of number of cached tokens.",
     lambda m: m["prefix_cache_hits"]),
]
SPEC_DECODE: list[tuple[str, type, str, Callable[[dict], Any]]] = [  # only with a draft head, as vLLM
    ("vllm:spec_decode_num_drafts", Counter, "Number of spec decoding drafts.", lambda m: m["num_drafts"]),
    ("vllm:spec_decode_num_draft_tokens", Counter, "Number of draft tokens.", lambda m: m["num_draft_tokens"]),
    ("vllm:spec_decode_num_accepted_tokens", Counter, "Number of accepted tokens.",
     lambda m: m["num_accepted_tokens"]),
    ("vllm:spec_decode_num_accepted_tokens_per_pos", Vector, "Accepted tokens per draft position.",
     lambda m: list(m["accepted_per_position"])),
]


def described(stats: dict) -> list[tuple[str, type, str, Any]]:
    """(name, type, description, value) of every metric these stats give."""
    table = ENGINE + (SPEC_DECODE if stats["accepted_per_position"] else [])
    return [(name, kind, doc, value(stats)) for name, kind, doc, value in table]


class Metrics(list):
    """What LLM.get_metrics() returns: vLLM's list of Metric objects, also indexable by a jaxspec stats name. Besides
    the engine's table, the token and request counters and the request histograms that the server keeps itself
    (serve/metrics.py), here counted as sequences finish (each of a request's n samples is one; the histograms
    leave aborted ones out, and vLLM's inter-token latency, a per-token observation, is the server's alone)."""

    def __init__(self, stats: dict, labels: dict[str, str]):
        super().__init__(kind(name, dict(labels), **{"values" if kind is Vector else "value": value})
                         for name, kind, _, value in described(stats))
        self.append(Counter("vllm:prompt_tokens", dict(labels), stats["num_finished_prompt_tokens"]))
        self.append(Counter("vllm:generation_tokens", dict(labels), stats["num_finished_output_tokens"]))
        self.extend(Counter("vllm:request_success", labels | {"finished_reason": reason}, count)
                    for reason, count in stats["num_finished"].items())
        self.extend(Histogram(name, dict(labels), h["count"], h["sum"], dict(h["buckets"]))
                    for name, h in stats["request_histograms"].items())
        self.stats = stats

    def __getitem__(self, key):
        return self.stats[key] if isinstance(key, str) else super().__getitem__(key)
