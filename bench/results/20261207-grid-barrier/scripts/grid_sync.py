"""Several kernels' work as phases of one Pallas GPU (Triton) kernel, separated by grid-wide barriers.

At batch 1 a decode step is a chain of small kernels, each a few microseconds of work behind a launch, a ramp-up
and a drain that the next kernel waits for. Here the chain's kernels become phases of one persistent kernel: its
programs (at most one per SM, so all are resident at once) take each phase's program ids in turn (id, id + N, ...),
then meet at a barrier (an atomic counter per barrier, acquire-release at GPU scope) before the next phase reads
what the last one wrote. On the CPU, Pallas's interpreter runs programs one after another, where a spinning
barrier would never return; there each phase is its own kernel over the same buffers, the oracle path.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu


@dataclass(frozen=True)
class Phase:
    """`programs` program ids, each running body(pid, *refs) over the kernel's refs (operands, then outputs). With
    `prefetch`, body(pid, *refs, pre=prefetch(pid, *refs)): what prefetch loads must not be written by an earlier
    phase (weights), so on the GPU it is loaded before the barrier that opens the phase, its latency hidden."""
    programs: int
    body: Callable[..., None]
    prefetch: Callable[..., object] | None = None


def barrier(sync_ref, index: int, programs: int) -> None:
    """Wait until all `programs` programs have reached barrier `index` (counter sync_ref[index], zero at the
    kernel's start). Every thread's stores before it are visible to every program after it: the threads of a
    program meet first (their stores then precede the arrival, a release at GPU scope), and the spin's reads of
    the counter are acquires."""
    plgpu.debug_barrier()
    at = jnp.int32(index)
    plgpu.atomic_add(sync_ref, at, jnp.int32(1))
    jax.lax.while_loop(lambda n: n < programs, lambda n: plgpu.atomic_add(sync_ref, at, jnp.int32(0)), jnp.int32(0))
    plgpu.debug_barrier()


def _persistent(*refs, phases: tuple[Phase, ...], programs: int, operands: int):
    *refs, sync_ref = refs
    refs = refs[:operands] + refs[operands + 1:]  # the counters' input (the same buffer as sync_ref)
    p = pl.program_id(0)
    pre = None
    for i, phase in enumerate(phases):
        for turn in range(pl.cdiv(phase.programs, programs)):
            pid = p + turn * programs

            @pl.when(pid < phase.programs)
            def _():
                phase.body(pid, *refs, **({} if pre is None or turn else {"pre": pre}))

        if i < len(phases) - 1:
            after = phases[i + 1]
            # a phase of at most one id per program has its loads issued before the barrier (a program past its
            # ids loads the last id's, unused)
            pre = (after.prefetch(jnp.minimum(p, after.programs - 1), *refs)
                   if after.prefetch is not None and after.programs <= programs else None)
            barrier(sync_ref, i, programs)


def run(phases: list[Phase], operands: list[jax.Array], out_shape: list[jax.ShapeDtypeStruct],
        aliases: dict[int, int], *, sm_count: int, interpret: bool, num_warps: int, num_stages: int,
        name: str) -> list[jax.Array]:
    """The phases in order over `operands` and fresh outputs of `out_shape` (output j written in place of operand
    i for each i: j in `aliases`); every body sees the operands' refs, then the outputs'. One kernel of
    min(sm_count, most programs of a phase) programs on the GPU (sm_count 0: unknown, no cap); one kernel per phase when `interpret`."""
    params = plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)
    if interpret:  # each phase a kernel: outputs so far passed back in, in place
        outs = [operands[inv[j]] if j in (inv := {o: i for i, o in aliases.items()}) else jnp.zeros(s.shape, s.dtype)
                for j, s in enumerate(out_shape)]
        inputs = [x for i, x in enumerate(operands) if i not in aliases]
        for phase in phases:
            # the body's refs: operands (an aliased operand's ref is its output's), then outputs
            def body(*refs, phase=phase):
                ins, outs_refs = list(refs[:len(inputs)]), refs[len(inputs) + len(out_shape):]
                full = [outs_refs[aliases[i]] if i in aliases else ins.pop(0) for i in range(len(operands))]
                pid = pl.program_id(0)
                pre = {} if phase.prefetch is None else {"pre": phase.prefetch(pid, *full, *outs_refs)}
                phase.body(pid, *full, *outs_refs, **pre)

            n = len(inputs)
            outs = pl.pallas_call(body, grid=(phase.programs,), out_shape=out_shape,
                                  input_output_aliases={n + j: j for j in range(len(out_shape))},
                                  interpret=True, compiler_params=params, name=name)(*inputs, *outs)
        return list(outs)
    programs = max(phase.programs for phase in phases)
    programs = min(sm_count, programs) if sm_count > 0 else programs
    sync = jnp.zeros((max(1, len(phases) - 1),), jnp.int32)
    kernel = partial(_persistent, phases=tuple(phases), programs=programs, operands=len(operands))
    outs = pl.pallas_call(kernel, grid=(programs,), out_shape=[*out_shape, jax.ShapeDtypeStruct(sync.shape, sync.dtype)],
                          input_output_aliases={**aliases, len(operands): len(out_shape)},
                          compiler_params=params, name=name)(*operands, sync)
    return list(outs[:-1])
