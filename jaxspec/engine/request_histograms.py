"""vLLM's per-request histograms (latencies and sizes) for the offline `LLM.get_metrics()`, observed as each sequence
finishes: a few bucket counts per finished sequence, nothing in the step loop. The server observes the same names
itself, per request output and inter-token gap (serve/metrics.py, which takes its buckets from here).

Times come from the sequence's RequestMetrics (vLLM's names): queued from arrival to first scheduled, prefill to
the first token, decode from the first to the last token, inference from first scheduled to the last token.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from itertools import accumulate

from jaxspec.outputs import RequestMetrics

# vLLM's buckets, with finer ones below 10 ms for the inter-token latency (small models step in 1-3 ms)
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0]  # vLLM's request_latency_buckets: every phase of a request
TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000]

# (vLLM's name, its description, its buckets)
HISTOGRAMS = [
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", E2E_BUCKETS),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", E2E_BUCKETS),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", E2E_BUCKETS),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", E2E_BUCKETS),
    ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", E2E_BUCKETS),
    ("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
     ITL_BUCKETS),
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKEN_BUCKETS),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", TOKEN_BUCKETS),
]


# the phases of a request: (histogram, the RequestMetrics fields it spans)
PHASES = {
    "vllm:time_to_first_token_seconds": ("arrival_time", "first_token_time"),
    "vllm:e2e_request_latency_seconds": ("arrival_time", "finished_time"),
    "vllm:request_queue_time_seconds": ("arrival_time", "first_scheduled_time"),
    "vllm:request_prefill_time_seconds": ("first_scheduled_time", "first_token_time"),
    "vllm:request_decode_time_seconds": ("first_token_time", "last_token_time"),
    "vllm:request_inference_time_seconds": ("first_scheduled_time", "last_token_time"),
}


def latencies(m: RequestMetrics, names: Iterable[str] = tuple(PHASES)) -> dict[str, float]:
    """The phases of `names` (PHASES' keys) that the request reached both ends of, in seconds."""
    spans = {name: (getattr(m, PHASES[name][0]), getattr(m, PHASES[name][1])) for name in names}
    return {name: end - start for name, (start, end) in spans.items() if start is not None and end is not None}


class BucketCounts:
    """One histogram: a count per bucket (a value goes to the first bound >= it, as Prometheus's `le`), the sum and
    the count."""

    def __init__(self, bounds: list[float]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> dict[str, int]:
        """Prometheus's bucket samples: upper bound as its `le` label ("0.001", "1.0", "+Inf") -> observations <= it."""
        return dict(zip([*(repr(float(b)) for b in self.bounds), "+Inf"], accumulate(self.counts)))


class RequestHistograms:
    """The histograms of HISTOGRAMS, by name."""

    def __init__(self):
        self.by_name = {name: BucketCounts(bounds) for name, _, bounds in HISTOGRAMS}

    def observe(self, m: RequestMetrics, num_prompt_tokens: int, num_output_tokens: int) -> None:
        """A finished sequence's times (those it never reached, e.g. an abort while waiting, are left out) and
        sizes."""
        for name, seconds in latencies(m).items():
            self.by_name[name].observe(seconds)
        if num_output_tokens > 1 and m.first_token_time is not None and m.last_token_time is not None:
            self.by_name["vllm:request_time_per_output_token_seconds"].observe(
                (m.last_token_time - m.first_token_time) / (num_output_tokens - 1))
        self.by_name["vllm:request_prompt_tokens"].observe(num_prompt_tokens)
        self.by_name["vllm:request_generation_tokens"].observe(num_output_tokens)

    def snapshot(self) -> dict[str, dict]:
        """{name: {"count", "sum", "buckets"}} (buckets cumulative, as BucketCounts.cumulative)."""
        return {name: {"count": h.count, "sum": h.sum, "buckets": h.cumulative()} for name, h in self.by_name.items()}
