"""Probe: a grid-wide barrier inside one Pallas GPU (Triton) kernel. N programs run R rounds; in round i each
writes its row of a double buffer, arrives at a counter (atomic add, acq_rel, GPU scope), spins until all N have
arrived, then reads its neighbour's row and counts wrong values. Time per round = (t(R) - t(1)) / (R - 1).
Usage: python barrier.py [interpret]"""
import sys
import time
from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

W = 128


def kernel(cnt_in, buf_in, cnt_ref, buf_ref, err_ref, *, n, rounds, modifier, spin):
    p = pl.program_id(0)

    def one(i, errs):
        slot = jax.lax.rem(i, 2)
        buf_ref[slot, p, :] = jnp.full((W,), (i * n + p).astype(jnp.float32))
        plgpu.debug_barrier()  # every thread's stores before the arrival (released by the atomic)
        plgpu.atomic_add(cnt_ref, jnp.int32(0), jnp.int32(1))
        target = (i + 1) * n
        if spin == "atomic":
            jax.lax.while_loop(lambda c: c < target, lambda c: plgpu.atomic_add(cnt_ref, jnp.int32(0), jnp.int32(0)), jnp.int32(0))
        else:
            jax.lax.while_loop(lambda c: c < target, lambda c: plgpu.load(cnt_ref.at[pl.ds(0, 1)], volatile=True)[0],
                               jnp.int32(0))
        q = jax.lax.rem(p + 1, n)
        got = plgpu.load(buf_ref.at[slot, q, :], volatile=modifier == "volatile")
        return errs + jnp.sum((got != (i * n + q).astype(jnp.float32)).astype(jnp.int32))

    err_ref[p] = jax.lax.fori_loop(0, rounds, one, jnp.int32(0))


@partial(jax.jit, static_argnames=("n", "rounds", "modifier", "spin", "interpret"))
def run(n, rounds, modifier, spin, interpret=False):
    cnt = jnp.zeros((1,), jnp.int32)
    buf = jnp.zeros((2, n, W), jnp.float32)
    return pl.pallas_call(partial(kernel, n=n, rounds=rounds, modifier=modifier, spin=spin), grid=(n,),
                          out_shape=[jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct((2, n, W), jnp.float32),
                                     jax.ShapeDtypeStruct((n,), jnp.int32)],
                          input_output_aliases={0: 0, 1: 1}, interpret=interpret,
                          compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1))(cnt, buf)


def timed(f, reps=20):
    f()[2].block_until_ready()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()[2].block_until_ready()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2]


if __name__ == "__main__":
    if sys.argv[1:] == ["interpret"]:
        c, b, e = run(1, 3, None, "atomic", interpret=True)
        print("interpret n=1:", c, e)
        sys.exit()
    print(jax.devices()[0], getattr(jax.devices()[0], "core_count", None))
    print("n modifier spin | errors | us per round (median of 20 calls, R=2000 vs R=1)")
    for spin in ("atomic", "volatile"):
        for modifier in (None, "volatile"):
            for n in (16, 64, 128, 132):
                R = 2000
                c, b, e = run(n, R, modifier, spin)
                t1 = timed(lambda: run(n, 1, modifier, spin))
                tr = timed(lambda: run(n, R, modifier, spin))
                print(f"{n:4d} {str(modifier):5s} {spin:8s} | errors {int(e.sum()):6d} cnt {int(c[0])} | "
                      f"{(tr - t1) / (R - 1) * 1e6:.3f} us a round (call R=1 {t1 * 1e6:.1f} us)", flush=True)
