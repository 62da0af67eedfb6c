"""What each weight is, declared beside its model: shape, dtype, the logical name of every axis, and how a random
one starts. `jaxspec.parallel` maps logical axes to the device mesh through one rules table, `init_tree` draws
random weights, the converters check shapes: a new weight needs only its line in the model's `abstract`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

TP_AXIS = "tp"  # the device mesh's one axis (tensor parallelism; jaxspec.parallel)

# Logical axis names. Columns of fused projections are laid out shard by shard under tensor parallelism
# (jaxspec.parallel.to_tp_layout), so splitting them evenly gives each device whole heads.
VOCAB = "vocab"  # rows of a tied embedding / columns of an LM head
EMBED = "embed"  # the hidden size
QKV = "qkv"  # fused q, k, v output columns
HEADS = "heads"  # attention output rows (heads * head_dim)
GATE_UP = "gate_up"  # fused gate, up output columns
FFW = "ffw"  # MLP down-projection rows (intermediate_size)
LAYERS = "layers"  # the stacked-layer axis


@dataclass(frozen=True)
class ArrayInfo:
    shape: tuple[int, ...]
    dtype: Any
    logical_axes: tuple[str | None, ...]  # one per axis; None: an axis that is never split
    init: str = "normal"  # "normal" (scaled), "ones" (norm weights) or "zeros"

    def __post_init__(self) -> None:
        if len(self.logical_axes) != len(self.shape):
            raise ValueError(f"logical_axes {self.logical_axes} do not match shape {self.shape}")


def init_tree(abstract: Any, key: jax.Array, scale: float) -> Any:
    """Random arrays for a tree of ArrayInfo (None leaves stay None)."""
    leaves, treedef = jax.tree.flatten(abstract)
    keys = jax.random.split(key, max(len(leaves), 1))

    def draw(k: jax.Array, info: ArrayInfo) -> jax.Array:
        if info.init == "ones":
            return jnp.ones(info.shape, info.dtype)
        if info.init == "zeros":
            return jnp.zeros(info.shape, info.dtype)
        return (scale * jax.random.normal(k, info.shape, jnp.float32)).astype(info.dtype)

    return jax.tree.unflatten(treedef, [draw(k, x) for k, x in zip(keys, leaves)])
