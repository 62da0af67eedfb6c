"""grid_sync: phases of one kernel separated by grid-wide barriers. On the CPU each phase is an interpreted kernel
of its own over the same buffers; these tests check that driver (what every phase sees, in place updates, phases
with more programs than the kernel) and the persistent kernel's shape after lowering to Triton for a GPU.
tests/test_gpu.py runs the persistent kernel itself."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from jaxspec.models import grid_sync


def _phases(n: int) -> list[grid_sync.Phase]:
    """Phase 1 (n programs): out[i] = x[i] * 2, acc[i] += 1 in place. Phase 2 (3 programs): program j sums every
    out[i] with i % 3 == j, each written by another program of phase 1, into total[j]."""
    def double(pid, x_ref, acc_ref, out_ref, acc_out, total_ref):
        out_ref[pid] = x_ref[pid] * 2
        acc_out[pid] = acc_ref[pid] + 1

    def gather(pid, x_ref, acc_ref, out_ref, acc_out, total_ref):
        total_ref[pid] = jax.lax.fori_loop(0, n, lambda i, t: t + jnp.where(jax.lax.rem(i, 3) == pid, out_ref[i], 0.0),
                                           jnp.float32(0))

    return [grid_sync.Phase(n, double), grid_sync.Phase(3, gather)]


def _run(n: int, interpret: bool, sm_count: int = 0):
    x = jnp.arange(n, dtype=jnp.float32)
    acc = jnp.full((n,), 10.0)
    shapes = [jax.ShapeDtypeStruct((n,), jnp.float32), jax.ShapeDtypeStruct((n,), jnp.float32),
              jax.ShapeDtypeStruct((3,), jnp.float32)]
    return grid_sync.run(_phases(n), [x, acc], shapes, {1: 1}, sm_count=sm_count, interpret=interpret,
                         num_warps=4, num_stages=1, name="test_phases")


def test_each_phase_reads_what_the_last_wrote():
    out, acc, total = _run(8, interpret=True)
    np.testing.assert_array_equal(out, 2 * np.arange(8))
    np.testing.assert_array_equal(acc, np.full(8, 11.0))  # the aliased operand, updated once
    np.testing.assert_array_equal(total, [2 * (0 + 3 + 6), 2 * (1 + 4 + 7), 2 * (2 + 5)])


def test_persistent_kernel_has_at_most_sm_count_programs():
    """On the GPU: one kernel whose grid is min(sm_count, the most programs of a phase), each program taking
    every sm_count-th id of a phase (the phase's body traced once per turn), one barrier between the phases."""
    for sm_count, grid, turns in ((0, 8, 1), (132, 8, 1), (3, 3, 3)):
        text = jax.jit(lambda: _run(8, interpret=False, sm_count=sm_count)).trace().lower(
            lowering_platforms=("cuda",)).as_text()
        assert text.count("__gpu$xla.gpu.triton") == 1
        assert re.search(rf"grid_x = {grid}\b", text), (sm_count, re.findall(r"grid_x = \d+", text))


def test_phase_programs_past_the_grid_each_run_once():
    """Interpreted, phases with more programs than 3 per kernel give what one program per id gives."""
    for n in (1, 5, 16):
        out, acc, total = _run(n, interpret=True)
        np.testing.assert_array_equal(out, 2 * np.arange(n))
        np.testing.assert_array_equal(total, [2 * sum(range(j, n, 3)) for j in range(3)])
