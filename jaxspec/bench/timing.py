"""Median wall time of one jitted call, waited on: the kernel micro-benchmarks' (bench/attn_kernel.py,
bench/sampler_cost.py) one timer, so their figures compare."""

from __future__ import annotations

import time

import jax
import numpy as np


def median_time(f, *args, iters: int) -> float:
    """Seconds: the median of `iters` calls of f(*args), each waited on, after one untimed call (compiling)."""
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))
