"""Do the resident plan buffers keep their device addresses when a new plan is written over them (donated)? A
moved buffer makes XLA update every CUDA-graph node that reads it at the next launch of each executable. Variants of
the write: dynamic_update_slice at 0 (write_plan as it was), a select on a traced flag, a Pallas copy with the
output aliased to the buffer. Each is called with new values 6 times, idle and while a long program reads the
buffers (python plan_addresses.py)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from jaxspec.engine.step import plan_program


def where(buffers, arrays, keep):
    return tuple(jnp.where(keep, b, a) for b, a in zip(buffers, arrays))


def _copy_kernel(a_ref, b_ref, o_ref):
    o_ref[...] = a_ref[...]


def pallas_copy(buffers, arrays):
    outs = []
    for b, a in zip(buffers, arrays):
        outs.append(pl.pallas_call(_copy_kernel, out_shape=jax.ShapeDtypeStruct(b.shape, b.dtype),
                                   input_output_aliases={1: 0})(a, b))
    return tuple(outs)


@jax.jit
def reader(x, bufs):
    def body(i, x):
        return jnp.tanh(x @ x) + sum(jnp.sum(b).astype(x.dtype) for b in bufs) * 1e-9
    return jax.lax.fori_loop(0, 200, body, x)


variants = {"dus": lambda b, p: plan_program(b, p),
            "where": functools.partial(lambda f, b, p: f(b, p, np.False_), jax.jit(where, donate_argnums=0)),
            "pallas": jax.jit(pallas_copy, donate_argnums=0)}
plan = (np.zeros((1, 47), np.int32), np.ones((1, 11), np.uint32), np.full((1, 9), -1, np.int32))
x = jnp.ones((2048, 2048), jnp.bfloat16)
for name, write in variants.items():
    for busy in (False, True):
        try:
            bufs = jax.device_put(tuple(np.zeros_like(a) for a in plan), jax.local_devices()[0])
            p0 = [b.unsafe_buffer_pointer() for b in bufs]
            kept = []
            for i in range(6):
                y = reader(x, bufs) if busy else None
                bufs = write(bufs, tuple(a + i for a in plan))
                kept.append(sum(b.unsafe_buffer_pointer() == q for b, q in zip(bufs, p0)))
                assert all(np.array_equal(np.asarray(b), a + i) for b, a in zip(bufs, plan)), name
                if y is not None:
                    y.block_until_ready()
            print(f"{name:7s} busy={busy!s:5s} buffers kept (of {len(plan)}) per write: {kept}")
        except Exception as e:  # noqa: BLE001 - a probe: report and go on
            print(f"{name:7s} busy={busy!s:5s} failed: {type(e).__name__}: {str(e)[:200]}")
