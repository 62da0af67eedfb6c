"""Floating-point comparisons scaled to the magnitude of what is compared.

Two computations of the same value (paged vs dense attention, XLA vs torch, sharded vs whole) add their terms in
different orders, and CPUs fuse and vectorize differently: an element's rounding error is bounded by the size of
the terms it was summed from, which the largest value of its row (or tensor) stands for, not by the element's
own size. An absolute `atol` on values whose scale varies passes on one CPU and fails on another; a tolerance
relative to each element fails on the small elements of a row. So: |actual - desired| <= rel * max|desired| over
the row (or tensor), with rel an epsilon times how many roundings can pile up, stated where it is chosen.
"""

from __future__ import annotations

import numpy as np

FP32_EPS = float(np.finfo(np.float32).eps)  # 1.2e-7: the unit roundoff of fp32 is half of it
TF32_EPS = 2.0 ** -10  # 9.8e-4: the GPU's TF32 matmuls keep 11 significant bits of fp32 inputs
BF16_EPS = 2.0 ** -7  # 7.8e-3: bfloat16 keeps 8 significant bits


def assert_close_scaled(actual, desired, rel: float, axis: int | tuple[int, ...] | None = -1,
                        err_msg: str = "") -> None:
    """Every element within rel * max|desired| of `desired`, the maximum taken over `axis` (-1: each row of logits
    or hidden states; None: the whole tensor). Shapes must match and non-finite values must sit at the same
    places with the same values."""
    a, d = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
    err_msg = f"{err_msg}: " if err_msg else ""
    if a.shape != d.shape:
        raise AssertionError(f"{err_msg}shapes differ: {a.shape} vs {d.shape}")
    finite = np.isfinite(d)
    if not np.array_equal(np.isfinite(a), finite) or not np.array_equal(a[~finite], d[~finite], equal_nan=True):
        raise AssertionError(f"{err_msg}non-finite values differ ({int((~np.isfinite(a)).sum())} in actual, "
                             f"{int((~finite).sum())} in desired)")
    a, d = np.where(finite, a, 0.0), np.where(finite, d, 0.0)
    scale = np.max(np.abs(d), axis=axis, keepdims=True) if d.ndim else np.abs(d)
    err = np.abs(a - d)
    excess = err - rel * scale
    if (excess > 0).any():
        i = tuple(int(j) for j in np.unravel_index(np.argmax(excess), a.shape))
        s = float(np.broadcast_to(scale, a.shape)[i])
        raise AssertionError(
            f"{err_msg}{int((excess > 0).sum())} of {a.size} elements differ by more than rel={rel:.3g} times the "
            f"largest |desired| of their {'tensor' if axis is None else f'axis {axis}'}; worst at {i}: actual "
            f"{a[i]:.9g}, desired {d[i]:.9g}, |diff| {err[i]:.3g} = {err[i] / s if s else np.inf:.3g} x {s:.4g}")
