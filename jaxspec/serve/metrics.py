"""Prometheus metrics under vLLM's names (label `model_name`), so vLLM's dashboards and scrapers work unchanged.

Request latencies are observed on the event loop from the engine's step timestamps: TTFT from arrival
to the first token, inter-token latency per output chunk (a speculative step may bring several tokens), TPOT per
request (excluding the first token), end to end at the finish; the time queued, in prefill, in decode and running
from the engine's own RequestMetrics of the finished output. The engine's own counters and pool state are read
from the snapshot the engine takes (`EngineLoop.metrics`), never from the engine itself. Names vLLM does
not have get a `jaxspec:` prefix (the KV pool in pages).
"""

from __future__ import annotations

from collections.abc import Callable

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from jaxspec.engine.request_histograms import HISTOGRAMS, ITL_BUCKETS, latencies
from jaxspec.metrics_reader import Gauge, Vector, described
from jaxspec.serve.engine_loop import RequestTiming

ENGINE_PHASES = ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                 "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds")


class EngineCollector:
    """The engine's gauges and counters (metrics_reader's table under vLLM's names, and jaxspec's own), from the
    latest snapshot of `LLM.stats()`."""

    def __init__(self, model_name: str, snapshot: Callable[[], dict]):
        self.model_name = model_name
        self.snapshot = snapshot

    def _family(self, cls, name: str, doc: str, value: float):
        family = cls(name, doc, labels=["model_name"])
        family.add_metric([self.model_name], value)
        return family

    def collect(self):
        m = self.snapshot()
        for name, kind, doc, value in described(m):
            if kind is Vector:  # vLLM's one vector: a counter a draft position
                family = CounterMetricFamily(name, doc, labels=["model_name", "position"])
                for position, count in enumerate(value):
                    family.add_metric([self.model_name, str(position)], count)
                yield family
            else:
                yield self._family(GaugeMetricFamily if kind is Gauge else CounterMetricFamily, name, doc, value)
        # the pool in pages and where the engine's time goes (no vLLM names for these): steps, time inside step()
        # and the part of it spent waiting for the device, and time handing outputs to the server
        gauge, counter = GaugeMetricFamily, CounterMetricFamily
        for cls, name, doc, value in [
                (gauge, "jaxspec:num_free_kv_pages", "KV-cache pages free in the pool.", m["num_free_pages"]),
                (gauge, "jaxspec:num_kv_pages", "KV-cache pages in the pool.", m["num_pages"]),
                (counter, "jaxspec:engine_steps", "Engine steps run.", m["num_steps"]),
                (counter, "jaxspec:engine_step_seconds", "Time inside the engine's step().", m["wall_s"]),
                (counter, "jaxspec:engine_host_wait_seconds", "Time step() waited for the device's results.",
                 m["host_wait_s"]),
                (counter, "jaxspec:engine_emit_seconds", "Time spent handing step outputs to the server.",
                 m.get("emit_s", 0.0))]:
            yield self._family(cls, name, doc, value)


class ServerMetrics:
    def __init__(self, model_name: str, snapshot: Callable[[], dict]):
        prometheus_client.disable_created_metrics()  # as vLLM: no `_created` sample beside every counter
        self.registry = CollectorRegistry()

        def metric(cls, name: str, doc: str, **kw):
            return cls(name, doc, labelnames=["model_name"], registry=self.registry, **kw).labels(model_name)

        # vLLM's request histograms, one table with the offline list's (engine/request_histograms.py); the
        # inter-token latency, a per-token observation, is the server's own
        hist = {name: metric(Histogram, name, doc, buckets=bounds) for name, doc, bounds in HISTOGRAMS}
        self.ttft, self.e2e = hist["vllm:time_to_first_token_seconds"], hist["vllm:e2e_request_latency_seconds"]
        self.tpot = hist["vllm:request_time_per_output_token_seconds"]
        self.request_prompt_tokens = hist["vllm:request_prompt_tokens"]
        self.request_generation_tokens = hist["vllm:request_generation_tokens"]
        # the phases the engine times (queued, prefill, decode, running), from the finished output's RequestMetrics
        self.phases = {name: hist[name] for name in ENGINE_PHASES}
        self.itl = metric(Histogram, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in "
                          "seconds.", buckets=ITL_BUCKETS)
        self.prompt_tokens = metric(Counter, "vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = metric(Counter, "vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          labelnames=["model_name", "finished_reason"], registry=self.registry)
        self.success = {reason: success.labels(model_name, reason) for reason in ("stop", "length", "abort")}
        self.registry.register(EngineCollector(model_name, snapshot))

    def observe(self, outputs: list, timings: list[RequestTiming], now: float) -> None:
        """One step's outputs (DELTA: only the new tokens) with their requests' timings. The generation token
        counter is incremented once a step (each prometheus_client update takes a lock)."""
        total = 0
        for out, t in zip(outputs, timings):
            new = sum(len(c.token_ids) for c in out.outputs)
            total += new
            if new:
                if t.first_token is None:  # the prompt has been processed
                    t.first_token = now
                    self.ttft.observe(now - t.arrival)
                    self.prompt_tokens.inc(len(out.prompt_token_ids))
                    self.request_prompt_tokens.observe(len(out.prompt_token_ids))
                else:
                    self.itl.observe(now - t.last_token)
                t.last_token = now
                t.num_tokens += new
            if out.finished:
                self._finish(out, t, now)
        self.generation_tokens.inc(total)

    def _finish(self, out, t: RequestTiming, now: float) -> None:
        reason = next((c.finish_reason for c in out.outputs if c.finish_reason), "abort")
        self.success[reason].inc()
        if reason == "abort":
            return
        self.request_generation_tokens.observe(t.num_tokens)
        self.e2e.observe(now - t.arrival)
        if out.metrics is not None:
            for name, seconds in latencies(out.metrics, ENGINE_PHASES).items():
                self.phases[name].observe(seconds)
        if t.num_tokens > 1:
            self.tpot.observe((t.last_token - t.first_token) / (t.num_tokens - 1))
