"""Paged KV cache and attention with several queries per sequence.

Two implementations behind `attention`: "xla", the reference (gathers each row's pages and masks by position;
runs anywhere, what the CPU tests use) and "pallas", our Pallas GPU kernel (paged_kernel), which reads only a
row's valid pages, once for all of its queries, each query masked to its own length (position + 1).

Layout decision: one cache array per K and V, `[kv_heads, L, pages, page_size, head_dim]`. This is the design's
`[L, pages, page_size, kv_heads, head_dim]` with the KV-head axis moved to the front: merging L and pages is then
free (`[kv_heads, L * pages, page_size, head_dim]`), so a layer is a range of page ids (layer * pages + page)
and the kernel reads the whole cache in place. Slicing out a layer instead (`k[layer]`) made XLA copy the
layer's whole pool into the kernel's operand at every layer of every step, so the step time grew with the
pool. KV heads first also makes sharding by KV heads a split of axis 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp

from jaxspec.models import paged_kernel
from jaxspec.models.kernel_config import KernelConfig


@partial(jax.tree_util.register_dataclass, data_fields=["k", "v"], meta_fields=[])
@dataclass
class KVCache:
    k: jax.Array  # [kv_heads, L, pages, page_size, head_dim]
    v: jax.Array  # [kv_heads, L, pages, page_size, head_dim]

    @property
    def num_slots(self) -> int:
        return self.k.shape[2] * self.k.shape[3]

    @property
    def page_size(self) -> int:
        return self.k.shape[3]


def init_cache(num_layers: int, num_kv_heads: int, num_pages: int, page_size: int, head_dim: int,
               dtype: jnp.dtype) -> KVCache:
    shape = (num_kv_heads, num_layers, num_pages, page_size, head_dim)
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))


def page_bytes(num_layers: int, num_kv_heads: int, page_size: int, head_dim: int, dtype: jnp.dtype) -> int:
    """Bytes `init_cache` allocates per page (K and V, every layer)."""
    return 2 * num_layers * num_kv_heads * page_size * head_dim * jnp.dtype(dtype).itemsize


@partial(jax.tree_util.register_dataclass, data_fields=["block_tables", "slot_mapping", "token_rows"],
         meta_fields=[])
@dataclass
class AttnBatch:
    block_tables: jax.Array  # [R, pages_per_seq] int32: page ids of each sequence row, in order
    slot_mapping: jax.Array  # [B, T] int32: page * page_size + offset where each token's K/V go; <0 = padding
    # [B, T] int32: the block-table row of each token, so one flat row can carry several sequences (ragged
    # prefill). None: token (b, t) belongs to row b.
    token_rows: jax.Array | None = None

    def token_block_tables(self, B: int, T: int) -> jax.Array:
        """[B*T, pages_per_seq]: each token's block table."""
        if self.token_rows is None:
            return jnp.repeat(self.block_tables, T, axis=0)
        return self.block_tables[self.token_rows.reshape(B * T)]


def layer_pages(cache: jax.Array, layer: jax.Array | int) -> tuple[jax.Array, jax.Array | int]:
    """The cache as [kv_heads, L * pages, page_size, head_dim] (a free reshape) and the id offset of `layer`'s
    pages in it."""
    kvh, L, P, S, D = cache.shape
    return cache.reshape(kvh, L * P, S, D), layer * P


def write_kv(kv: KVCache, layer: jax.Array | int, k: jax.Array, v: jax.Array, slot_mapping: jax.Array) -> KVCache:
    """Scatter this chunk's k, v [B, T, kv_heads, head_dim] into layer `layer`; padding slots are dropped."""
    kvh, L, P, S, D = kv.k.shape
    slots = slot_mapping.reshape(-1)
    slots = jnp.where(slots < 0, L * P * S, layer * P * S + slots)  # out of range -> dropped

    def put(cache: jax.Array, new: jax.Array) -> jax.Array:
        flat = cache.reshape(kvh, L * P * S, D)
        new = new.reshape(-1, kvh, D).swapaxes(0, 1).astype(cache.dtype)  # [kv_heads, B*T, D]
        return flat.at[:, slots].set(new, mode="drop").reshape(cache.shape)

    return KVCache(k=put(kv.k, k), v=put(kv.v, v))


def dense_attention(q: jax.Array, k: jax.Array, v: jax.Array, q_pos: jax.Array, kv_pos: jax.Array) -> jax.Array:
    """q [B, T, H, D]; k, v [B, S, KVH, D]; a query sees keys at positions <= its own (kv_pos < 0 is padding)."""
    B, T, H, D = q.shape
    kvh = k.shape[2]
    q = q.reshape(B, T, kvh, H // kvh, D)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) / jnp.sqrt(D)
    visible = (kv_pos[:, None, :] <= q_pos[:, :, None]) & (kv_pos[:, None, :] >= 0)  # [B, T, S]
    scores = jnp.where(visible[:, None, None], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v, preferred_element_type=jnp.float32)
    return out.reshape(B, T, H, D).astype(q.dtype)


def paged_attention_xla(q: jax.Array, kv: KVCache, layer: jax.Array | int, batch: AttnBatch,
                        q_pos: jax.Array) -> jax.Array:
    """Reference: gather every page of each token's block table, then mask by position."""
    B, T, H, D = q.shape
    tables = batch.token_block_tables(B, T)  # [B*T, pages]

    def gather(cache: jax.Array) -> jax.Array:
        pages, offset = layer_pages(cache, layer)
        rows = pages[:, tables + offset]  # [KVH, B*T, pages, page_size, D]
        kvh, N, pages, S, _ = rows.shape
        return rows.reshape(kvh, N, pages * S, D).transpose(1, 2, 0, 3)  # [B*T, pages*S, KVH, D]

    k, v = gather(kv.k), gather(kv.v)
    kv_pos = jnp.broadcast_to(jnp.arange(k.shape[1], dtype=jnp.int32), (B * T, k.shape[1]))
    out = dense_attention(q.reshape(B * T, 1, H, D), k, v, q_pos.reshape(B * T, 1), kv_pos)
    return out.reshape(B, T, H, D)


def paged_attention_pallas(q: jax.Array, kv: KVCache, layer: jax.Array | int, batch: AttnBatch,
                           q_pos: jax.Array, interpret: bool = False, tp: int = 1,
                           kernel: KernelConfig = KernelConfig()) -> jax.Array:
    """GPU kernel (paged_kernel): each sequence's T queries in one program per KV head, reading its context once.
    A ragged batch (several sequences per row: prefill) runs as B*T one-query rows with their own tables.

    With tp > 1 the kernel cannot be auto-partitioned: shard_map runs it per device on that device's KV heads
    (cache axis 0) and query heads (axis 2), which tensor parallelism keeps on the same device.
    """
    B, T, H, D = q.shape
    k_pages, offset = layer_pages(kv.k, layer)  # [KVH, L * pages, page_size, D]: no copy
    v_pages, _ = layer_pages(kv.v, layer)
    if batch.token_rows is None:
        tables = batch.block_tables
    else:  # ragged: every token is a one-query row with its own table
        tables = batch.token_block_tables(B, T)
        q, q_pos = q.reshape(B * T, 1, H, D), q_pos.reshape(B * T, 1)
    run = partial(_pallas, interpret=interpret, kernel=kernel)
    if tp > 1:
        from jax.sharding import AbstractMesh, AxisType
        from jax.sharding import PartitionSpec as P

        from jaxspec.models.arrays import TP_AXIS
        mesh = AbstractMesh((tp,), (TP_AXIS,), axis_types=(AxisType.Auto,))
        heads = P(None, None, TP_AXIS)
        run = jax.shard_map(run, mesh=mesh, in_specs=(heads, P(TP_AXIS), P(TP_AXIS), P(), P(), P()),
                            out_specs=heads, check_vma=False)
    return run(q, k_pages, v_pages, tables, q_pos, jnp.asarray(offset, jnp.int32)).reshape(B, T, H, D)


def pallas_splits(rows: int, kv_heads: int, table_blocks: int, programs: int) -> int:
    """How many partitions of the block table the kernel runs as separate programs (then merges). Splits keep
    the GPU busy when few rows have long contexts, but every split costs a program and a merge even past a
    row's length: use the fewest that give about `programs` (KernelConfig.attn_programs) programs. A power of
    two dividing table_blocks, at most 16."""
    want = max(1, min(16, table_blocks, programs // (rows * kv_heads)))
    return 1 << (want.bit_length() - 1)


def _pallas(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, block_tables: jax.Array, q_pos: jax.Array,
            offset: jax.Array, interpret: bool, kernel: KernelConfig) -> jax.Array:
    """q [B, T, H, D]; k_pages, v_pages [KVH, all pages, page_size, D]; block_tables [B, pages] of the layer whose
    first page is `offset`."""
    B, _, _, D = q.shape
    block_tables, per_block, splits = kernel_tables(block_tables, B, k_pages.shape[0], k_pages.shape[2], kernel)
    q = q / jnp.sqrt(D).astype(q.dtype)
    return paged_kernel.paged_attention(q, k_pages, v_pages, block_tables, q_pos, offset, pages_per_block=per_block,
                                        splits=splits, interpret=interpret, num_warps=kernel.attn_num_warps,
                                        num_stages=kernel.attn_num_stages)


def kernel_tables(block_tables: jax.Array, rows: int, kv_heads: int, page_size: int,
                  kernel: KernelConfig) -> tuple[jax.Array, int, int]:
    """(the table padded to a power of two, pages per loop block, splits) for the kernel: it walks the table in
    `splits` partitions of blocks of pages; Triton wants power-of-two sizes (padding pages lie past every length
    and are never read)."""
    pages = block_tables.shape[1]
    padded = 1 << (pages - 1).bit_length()
    per_block = min(max(1, kernel.attn_block_tokens // page_size), padded)
    splits = pallas_splits(rows, kv_heads, padded // per_block, kernel.attn_programs)
    return jnp.pad(block_tables, ((0, 0), (0, padded - pages))), per_block, splits


def attention(q: jax.Array, k: jax.Array, v: jax.Array, q_pos: jax.Array, kv: KVCache | None,
              layer: jax.Array | int, batch: AttnBatch | None, impl: str, tp: int = 1,
              kernel: KernelConfig = KernelConfig()) -> jax.Array:
    """Attention for queries q [B, T, H, D] at positions q_pos [B, T].

    Without a cache, dense causal attention over this chunk's own k, v; impl "cudnn" runs it as cuDNN's fused
    (flash) attention, for rows whose positions are 0..T-1 (training's target pass: no [T, T] scores in memory).
    With a cache, over the cached sequence (which already holds this chunk's K/V). `tp`: the tensor-parallel degree
    (the kernel path needs it; the XLA path is partitioned by jit from its inputs' shardings).
    """
    if kv is None:
        if impl == "cudnn":
            return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        return dense_attention(q, k, v, q_pos, q_pos)
    if impl in ("pallas", "pallas-interpret"):  # the interpreter runs the kernel on CPU, for tests
        return paged_attention_pallas(q, kv, layer, batch, q_pos, interpret=impl == "pallas-interpret", tp=tp,
                                      kernel=kernel)
    if impl == "xla":
        return paged_attention_xla(q, kv, layer, batch, q_pos)
    raise ValueError(f"unknown attention implementation {impl!r} over a KV cache (expected 'xla', 'pallas' or "
                     "'pallas-interpret')")
