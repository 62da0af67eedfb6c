"""Tensor parallelism: one model over a 1-D device mesh (axis "tp"), partitioned by jit (GSPMD), not by hand.

Megatron's split, written as shardings: wqkv and w_gate_up are split by columns (each device computes its own
heads and its slice of the MLP), wo and w_down by rows (jit adds the all-reduce after them), the lm_head by
vocabulary. The KV cache `[L, kv_heads, pages, page_size, head_dim]` is split on axis 1, so attention never
leaves a device. Slot state, plans and step outputs are replicated.

The fused weights need a shard-major column layout so that device s's contiguous block of columns holds exactly
its heads: `to_tp_layout` turns a checkpoint's layout (tp = 1) into it, and replicates KV heads when there are
fewer of them than devices (kv_heads = 2, tp = 4: device s uses KV head s // 2; `Config.num_cached_kv_heads`).

Several hosts: start one process per host, call `jax.distributed.initialize()` before building the `LLM`; the
mesh then spans `jax.devices()` of every host and each process runs the same scheduler on the same requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxspec.models import arrays
from jaxspec.models.arrays import TP_AXIS
from jaxspec.models.attention import KVCache, init_cache


@dataclass(frozen=True)
class StepShardings:
    """Where the step's donated outputs must live: the same place as its inputs, or the next call recompiles."""
    target_kv: NamedSharding
    draft_kv: NamedSharding | None
    replicated: NamedSharding


def make_mesh(n: int) -> Mesh:
    """The first n devices as a 1-D mesh with axis "tp" (Auto: jit propagates shardings from the weights)."""
    return jax.make_mesh((n,), (TP_AXIS,), axis_types=(AxisType.Auto,), devices=jax.devices()[:n])


def validate(cfg, tp: int, what: str = "tensor_parallel_size", name: str = "the model") -> None:
    """A clear ValueError for a degree this model (llama.Config, eagle.EagleConfig) or machine cannot split into."""
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {tp!r}")
    if tp > len(jax.devices()):
        raise ValueError(f"{what}={tp} but only {len(jax.devices())} device(s) are visible ({jax.default_backend()}); "
                         "on several hosts call jax.distributed.initialize() first")
    if cfg.num_heads % tp:
        raise ValueError(f"{what}={tp} does not divide the {cfg.num_heads} attention heads of {name}")
    if cfg.num_kv_heads % tp and tp % cfg.num_kv_heads:
        raise ValueError(f"{what}={tp} and the {cfg.num_kv_heads} KV heads of {name}: one must divide the other "
                         "(KV heads are split across devices, or replicated when there are fewer than devices)")
    if cfg.intermediate_size % tp:
        raise ValueError(f"{what}={tp} does not divide the MLP width (intermediate_size={cfg.intermediate_size}) "
                         f"of {name}")


def _qkv_columns(num_heads: int, num_kv_heads: int, head_dim: int, tp: int) -> np.ndarray:
    """Source column of each wqkv column in the tp layout: per shard s, its q heads, then its k heads, its v heads.
    Cached KV head c reads KV head c * num_kv_heads // num_cached (itself, or a copy when KV heads are few)."""
    D, q_local = head_dim, num_heads // tp * head_dim
    kv_local = max(1, num_kv_heads // tp)
    num_cached = tp * kv_local
    q_size, kv_size = num_heads * D, num_kv_heads * D
    cols = []
    for s in range(tp):
        cols.append(np.arange(s * q_local, (s + 1) * q_local))
        sources = [c * num_kv_heads // num_cached for c in range(s * kv_local, (s + 1) * kv_local)]
        for base in (q_size, q_size + kv_size):  # k, then v
            cols += [base + h * D + np.arange(D) for h in sources]
    return np.concatenate(cols)


def _gate_up_columns(intermediate_size: int, tp: int) -> np.ndarray:
    n = intermediate_size // tp
    return np.concatenate([half * intermediate_size + np.arange(s * n, (s + 1) * n)
                           for s in range(tp) for half in (0, 1)])


def _take(x, cols: np.ndarray):
    return np.take(x, cols, axis=-1) if isinstance(x, np.ndarray) else jnp.take(x, jnp.asarray(cols), axis=-1)


# Under tensor parallelism these logical axes (jaxspec.models.arrays) are split over "tp"; every other is
# replicated. An array whose split axis does not divide evenly is replicated whole.
RULES: dict[str, str] = {arrays.VOCAB: TP_AXIS, arrays.QKV: TP_AXIS, arrays.HEADS: TP_AXIS, arrays.GATE_UP: TP_AXIS,
                         arrays.FFW: TP_AXIS}


def to_tp_layout(weights, abstract, cfg, tp: int):
    """Checkpoint layout (tp = 1) -> the shard-major layout of `cfg.replace(tp_size=tp)`; identity for tp = 1.
    `abstract` (the model's ArrayInfo tree, tp = 1) says which arrays have fused q/k/v or gate/up columns; only
    those columns move (and KV heads are copied when fewer than tp)."""
    if tp == 1:
        return weights
    columns = {arrays.QKV: _qkv_columns(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, tp),
               arrays.GATE_UP: _gate_up_columns(cfg.intermediate_size, tp)}

    def move(x, info: arrays.ArrayInfo):
        cols = columns.get(info.logical_axes[-1])
        return x if cols is None else _take(x, cols)

    return jax.tree.map(move, weights, abstract)


def prepare(cfg, weights, abstract, tp: int, what: str = "tensor_parallel_size", name: str = "the model"):
    """Validate, then return (config with tp_size = tp, weights in its layout) from a checkpoint's (tp = 1);
    `abstract` is the model's ArrayInfo tree for `cfg` (llama.abstract, eagle.abstract)."""
    validate(cfg, tp, what, name)
    if cfg.tp_size != 1:
        raise ValueError(f"weights must come in the checkpoint layout (tp_size=1, got {cfg.tp_size}); ask for "
                         f"{what} instead")
    return cfg.replace(tp_size=tp), to_tp_layout(weights, abstract, cfg, tp)


def weight_shardings(abstract, mesh: Mesh, tp: int):
    """A NamedSharding per weight of an ArrayInfo tree (None stays None), from its logical axes and RULES; tp = 1
    (a draft head kept whole): every weight replicated on the mesh."""

    def named(info: arrays.ArrayInfo) -> NamedSharding:
        spec = [RULES.get(name) if tp > 1 else None for name in info.logical_axes]
        if any(axis is not None and info.shape[i] % tp for i, axis in enumerate(spec)):
            spec = [None] * len(spec)
        return NamedSharding(mesh, P(*spec))

    return jax.tree.map(named, abstract)


def cache_sharding(mesh: Mesh, tp: int) -> NamedSharding:
    """KV cache [kv_heads, L, pages, page_size, head_dim]: KV heads split over "tp" (tp = 1: replicated)."""
    return NamedSharding(mesh, P(TP_AXIS) if tp > 1 else P())


def place(tree, shardings):
    """Put a pytree (numpy or jax arrays) onto its shardings; across processes each host fills its own shards."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)
    if isinstance(shardings, jax.sharding.Sharding):
        shardings = jax.tree.map(lambda _: shardings, tree)
    return jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: np.asarray(x[i])),
                        tree, shardings)


def make_cache(num_layers: int, num_kv_heads: int, num_pages: int, page_size: int, head_dim: int,
               dtype: jnp.dtype, sharding: NamedSharding | None = None) -> KVCache:
    """Zeros created in place on their shards (the pool can be most of every device's memory); None: one device."""
    make = lambda: init_cache(num_layers, num_kv_heads, num_pages, page_size, head_dim, dtype)  # noqa: E731
    return make() if sharding is None else jax.jit(make, out_shardings=KVCache(sharding, sharding))()


def bytes_per_device(abstract, tp: int) -> int:
    """Bytes of a model's weights (its ArrayInfo tree, in tp's layout) that each device holds under
    `weight_shardings`."""
    shardings = weight_shardings(abstract, make_mesh(tp), tp)
    return sum(math.prod(s.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize
               for x, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings)))
