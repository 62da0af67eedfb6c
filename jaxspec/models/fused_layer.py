"""A Llama decoder layer in five Pallas GPU (Triton) kernels, for decode forwards of at most ROWS tokens.

At batch 1 XLA runs a SmolLM2 layer as ~17 kernels of 1-3 us each (RMSNorm reductions, GEMV fusions, RoPE, two
cache updates, the query's transpose and padding, the attention kernel, its merge, ...): on the H200 1.1 ms of
kernels a step for 0.06 ms of weight bytes, so their number, not the bytes, sets the step time. Here a layer is

1. `qkv`: RMSNorm, the q/k/v projection and RoPE; k and v written into the paged cache, q (scaled by 1/sqrt(D))
   into the attention kernel's query blocks (paged_kernel.query_rows' layout). Programs per head: one, or with
   row-by-row products enough pieces of each half-head for about GEMV_MIN_PROGRAMS programs.
2. paged_kernel.attend, the attention kernel, its partitions left unmerged;
3. `attn_out`: the partitions' merge, the output projection and the residual;
4. `linear` with a norm and SwiGLU: RMSNorm, the gate/up projection, silu(gate) * up;
5. `linear` with a residual: the down projection and the residual.

Activations between the kernels are [ROWS, width]: the step's B*T tokens, then zero rows that stay zero, so no
kernel pads or slices. Forwards of up to GEMV_ROWS tokens multiply each row by the weights on the CUDA cores
(broadcast products summed over K, as a GEMV does); more take 16-row tensor-core dots, whose operands go through
shared memory at every step over K (5-9 us a kernel at batch 1, against 5.4-6.7 row by row on an H100). Rounding
follows the XLA layer (llama.decoder_layer, the oracle) op by op: fp32 accumulation, then the model dtype wherever
XLA's ops produce it; the two agree to that dtype's rounding, not bit for bit (sums run in another order).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxspec.models import paged_kernel
from jaxspec.models.attention import AttnBatch, KVCache, kernel_tables

ROWS = 16  # rows of every kernel's blocks: the smallest the tensor cores' dots take
MIN_PROGRAMS = 128  # column blocks are made narrow enough for about this many programs (the H200 has 132 SMs)
UNROLL_HEADS = 4  # attn_out unrolls its loop over heads by the largest divisor of the head count up to this
GEMV_ROWS = 4  # a forward of at most this many tokens multiplies row by row on the CUDA cores, without dots
GEMV_MIN_PROGRAMS = 64  # ... its column blocks narrow enough for about this many programs, down to GEMV_MIN_BLOCK
GEMV_MIN_BLOCK = 8  # columns: 16 bytes of a bf16 row, half a 32-byte memory sector
GEMV_ACC_ELEMS = 8192  # ... and its fp32 products of one step over K (rows x K block x columns) at most this many
GEMV_UNROLL = 8  # ... its steps over K unrolled up to this many (a loop beyond)
GEMV_LOAD_WORDS = 12288  # ... the loads a program issues at once (steps or heads unrolled together), in fp32 words
GEMV_WARPS = 4


def applies(cfg, tokens: int, batch: AttnBatch | None, kv: KVCache | None) -> bool:
    """Whether a forward of `tokens` tokens (B * T) over model config `cfg` (llama.Config) runs these kernels:
    KernelConfig.fused_decode, at most KernelConfig.fused_decode_tokens tokens, a layer of at most
    KernelConfig.fused_decode_max_layer_mib, the Pallas attention, one device, a decode batch (one sequence per row)
    over a paged cache, and shapes the kernels' blocks divide."""
    D, H = cfg.head_dim, cfg.hidden_size
    params = H * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * H + 3 * H * cfg.intermediate_size
    return (cfg.kernel.fused_decode and cfg.attn_impl in ("pallas", "pallas-interpret") and cfg.tp_size == 1
            and params * jnp.dtype(cfg.jnp_dtype).itemsize <= cfg.kernel.fused_decode_max_layer_mib << 20
            and kv is not None and batch is not None and batch.token_rows is None
            and tokens <= min(ROWS, cfg.kernel.fused_decode_tokens)
            and D // 2 >= 16 and D & (D - 1) == 0
            and all(n % 16 == 0 for n in (cfg.hidden_size, cfg.intermediate_size, cfg.q_size)))


@dataclass(frozen=True)
class Plan:
    """What every layer of one forward shares: each row's position and cache slot, the attention kernel's tables."""
    B: int
    T: int
    positions: jax.Array  # [ROWS] int32 (0 for padding rows)
    slots: jax.Array  # [ROWS] int32: cache slot within a layer, -1: write nothing
    tables: jax.Array  # [B, splits, pages per split] int32
    row_len: jax.Array  # [B, R] int32: keys each query-block row sees
    pages_per_block: int
    interpret: bool

    @property
    def splits(self) -> int:
        return self.tables.shape[1]


def plan(cfg, positions: jax.Array, batch: AttnBatch, kv: KVCache) -> Plan:
    """positions [B, T] of a decode batch over `kv`. The attention's table partitions are capped so that
    partitions x tokens <= ROWS: `attn_out` merges them as one block of rows per head."""
    B, T = positions.shape
    M = B * T
    tables, per_block, splits = kernel_tables(batch.block_tables, B, cfg.num_kv_heads, kv.page_size, cfg.kernel)
    splits = min(splits, _floor2(ROWS // M))
    pad = lambda a, value: jnp.pad(a.reshape(M).astype(jnp.int32), (0, ROWS - M), constant_values=value)  # noqa
    return Plan(B, T, pad(positions, 0), pad(batch.slot_mapping, -1), tables.reshape(B, splits, -1),
                paged_kernel.row_lengths(positions, cfg.num_heads // cfg.num_kv_heads), per_block,
                cfg.attn_impl == "pallas-interpret")


def rows(x: jax.Array) -> jax.Array:
    """[B, T, W] -> [ROWS, W]: the tokens, then zero rows."""
    x = x.reshape(-1, x.shape[-1])
    return jnp.pad(x, ((0, ROWS - x.shape[0]), (0, 0)))


def unrows(x: jax.Array, B: int, T: int) -> jax.Array:
    return x[:B * T].reshape(B, T, x.shape[-1])


def layer(x: jax.Array, residual: jax.Array, attn_norm: jax.Array | None, wqkv: jax.Array, wo: jax.Array,
          mlp_norm: jax.Array, w_gate_up: jax.Array, w_down: jax.Array, cfg, inv_freq: np.ndarray, kv: KVCache,
          layer_index: jax.Array | int, p: Plan) -> tuple[jax.Array, KVCache]:
    """Layer `layer_index` on rows: attention over RMSNorm(x) (x itself without attn_norm: EAGLE's head) added to
    `residual`, then the SwiGLU MLP with its residual. The weights are the stacked [L, ...] arrays (the head's
    own with a leading axis of 1), read at `layer_index` inside the kernels: an XLA slice of them handed to a
    kernel was a copy, six a layer. Returns (the layer's output rows, kv)."""
    kvh, L, P, S, D = kv.k.shape
    eps = cfg.rms_norm_eps
    index = jnp.asarray(layer_index, jnp.int32).reshape(1)
    q, kv = qkv(x, attn_norm, wqkv, eps, p, cfg.num_heads, inv_freq, kv, index)
    k_rows, v_rows = (c.reshape(kvh, L * P * S, D) for c in (kv.k, kv.v))  # free
    R = p.row_len.shape[1]
    o, l, m = paged_kernel.attend(q.reshape(p.B, kvh, R, D), k_rows, v_rows, p.tables, p.row_len, layer_index * P,
                                  page_size=S, pages_per_block=p.pages_per_block, interpret=p.interpret,
                                  num_warps=cfg.kernel.attn_num_warps, num_stages=cfg.kernel.attn_num_stages)
    x = attn_out(o, l, m, wo, index, residual, p)
    M = p.B * p.T
    h = linear(x, w_gate_up, index, norm=mlp_norm, eps=eps, swiglu=True, tokens=M, interpret=p.interpret)
    return linear(h, w_down, index, residual=x, tokens=M, interpret=p.interpret), kv


def _params(tokens: int = ROWS) -> plgpu.CompilerParams:
    return plgpu.CompilerParams(num_warps=GEMV_WARPS if tokens <= GEMV_ROWS else 4, num_stages=3)


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ b accumulated in fp32; fp32 operands multiply in full precision (not TF32), as XLA's dots do."""
    return plgpu.dot(a, b, allow_tf32=False if a.dtype == jnp.float32 else None)


def _block_n(n: int, tokens: int = ROWS) -> int:
    """Output columns per program: the widest block that still gives MIN_PROGRAMS programs, else 16 (a dot's
    least); for the row-by-row products of up to GEMV_ROWS tokens, GEMV_MIN_PROGRAMS, else GEMV_MIN_BLOCK."""
    if tokens <= GEMV_ROWS:  # and two column blocks (SwiGLU's) of 16 K rows within the accumulators' bound
        return next((b for b in (128, 64, 32, 16) if b > GEMV_MIN_BLOCK and n % b == 0 and n // b >= GEMV_MIN_PROGRAMS
                     and tokens * 2 * 16 * b <= GEMV_ACC_ELEMS), GEMV_MIN_BLOCK)
    return next((b for b in (128, 64, 32) if n % b == 0 and n // b >= MIN_PROGRAMS), 16)


def _floor2(n: int) -> int:
    """The largest power of two <= n (Triton's blocks are powers of two)."""
    return 1 << (n.bit_length() - 1)


def _div(a: jax.Array | int, n: int) -> jax.Array | int:
    """a // n for a >= 0 (lax's truncating division: jnp's floor division adds sign fixes Triton cannot lower)."""
    return a // n if isinstance(a, int) else jax.lax.div(a, jnp.asarray(n, a.dtype))


def _rem(a: jax.Array | int, n: int) -> jax.Array | int:
    return a % n if isinstance(a, int) else jax.lax.rem(a, jnp.asarray(n, a.dtype))


def _multiple(a: jax.Array | int, n: int) -> jax.Array | int:
    """pl.multiple_of(a, n) for a traced a (a Python int is known already, and the hint cannot lower on one)."""
    return a if isinstance(a, int) else pl.multiple_of(a, n)


def _projected(x_ref, g_ref, w_ref, layer: jax.Array, eps: float, columns: list[tuple[jax.Array, int]],
               tokens: int = ROWS) -> list[jax.Array]:
    """RMSNorm(x) (x itself when g_ref is None) times each block of w's columns (start, width), norm and w at index
    `layer` of their stacked refs (g_ref [L, K], w_ref [L, K, N]): fp32 [ROWS, width] each, in one pass over K in
    steps of _block_k (the last step masked where they do not divide K). The norm's 1/rms is a factor of each row,
    so it scales the sums at the end while the pass adds up the squares (llama.rms_norm rounds x/rms to the model
    dtype before the weight; here x * weight is rounded: as many roundings, and no pre-pass over x whose loads
    would wait in turn). Rows from `tokens` on are zero in x and in the result; up to GEMV_ROWS tokens take
    _projected_gemv."""
    if tokens <= GEMV_ROWS:
        return _projected_gemv(x_ref, g_ref, w_ref, layer, eps, columns, tokens)
    K = x_ref.shape[1]
    bk = _block_k(K, sum(width for _, width in columns) * w_ref.dtype.itemsize)
    tail = K % bk != 0

    def body(i, carry):
        ssq, accs = carry
        k0 = pl.multiple_of(i * bk, bk)
        keys = pl.ds(k0, bk)
        inside = k0 + jnp.arange(bk) < K if tail else None
        x = _load(x_ref.at[:, keys], None if inside is None else inside[None, :])
        if g_ref is not None:
            x32 = x.astype(jnp.float32)
            ssq = ssq + jnp.sum(x32 * x32, axis=1)
            x = x * _load(g_ref.at[layer, keys], inside)[None, :]
        accs = tuple(acc + _dot(x, _load(w_ref.at[layer, keys, pl.ds(c, width)],
                                         None if inside is None else inside[:, None]))
                     for acc, (c, width) in zip(accs, columns))
        return ssq, accs

    init = (jnp.zeros((ROWS,), jnp.float32), tuple(jnp.zeros((ROWS, width), jnp.float32) for _, width in columns))
    ssq, accs = jax.lax.fori_loop(0, pl.cdiv(K, bk), body, init)
    if g_ref is None:
        return list(accs)
    rstd = jax.lax.rsqrt(ssq / K + eps)[:, None]
    return [acc * rstd for acc in accs]


def _projected_gemv(x_ref, g_ref, w_ref, layer: jax.Array, eps: float, columns: list[tuple[jax.Array, int]],
                    tokens: int) -> list[jax.Array]:
    """_projected for the first `tokens` rows, each a row vector times w's block on the CUDA cores: a tensor-core
    dot takes 16 rows and moves its operands through shared memory at every step, which made these kernels 5-9 us
    against XLA's 2-3 us GEMVs at batch 1 (bench/results/20261205-h200-fused-layer/). Each step over K adds the
    elementwise products (and the norm's squares) into fp32 accumulators, summed across K once at the end. Steps
    run in unrolled groups with every step's loads issued before any product: a layout change or a sum across
    threads is a barrier the loads after it wait behind, so loads interleaved with products waited for memory one
    step at a time. A group is all the steps when their loads fit GEMV_LOAD_WORDS (else a loop over groups)."""
    K = x_ref.shape[1]
    width = sum(w for _, w in columns)
    bk = _gemv_block_k(K, width, tokens)
    steps, tail = pl.cdiv(K, bk), K % bk != 0
    f32 = jnp.float32

    def load(k0, keep: tuple[int, int] | None = None) -> tuple:
        """Rows [k0, k0 + bk) of K: w's column blocks, the norm's weights and each row of x, zero outside the rows
        `keep` (first, end) when given."""
        keys = pl.ds(k0, bk)
        inside = None if keep is None else (k0 + jnp.arange(bk) >= keep[0]) & (k0 + jnp.arange(bk) < keep[1])
        ws = [_load(w_ref.at[layer, keys, pl.ds(c, w)], None if inside is None else inside[:, None])
              for c, w in columns]
        g = None if g_ref is None else _load(g_ref.at[layer, keys], inside)
        # (an array row index: a masked load takes no Python int)
        return ws, g, [_load(x_ref.at[jnp.int32(r), keys], inside) for r in range(tokens)]

    def add(blocks: tuple, ssq: list, accs: list) -> tuple[list, list]:
        ws, g, xs = blocks
        ws = [w.astype(f32) for w in ws]
        ssq, accs = list(ssq), [list(a) for a in accs]
        for r, x in enumerate(xs):
            if g is not None:
                x32 = x.astype(f32)
                ssq[r] = ssq[r] + x32 * x32
                x = x * g
            x = x.astype(f32)[:, None]
            accs[r] = [a + x * w for a, w in zip(accs[r], ws)]
        return ssq, accs

    def add_steps(starts: list, ssq: list, accs: list, keep: tuple[int, int] | None = None) -> tuple[list, list]:
        """The steps at `starts`, every load first (the last one masked to `keep` when given)."""
        loaded = [load(k0, keep if i == len(starts) - 1 else None) for i, k0 in enumerate(starts)]
        for blocks in loaded:
            ssq, accs = add(blocks, ssq, accs)
        return ssq, accs

    ssq = [jnp.zeros((bk,), f32)] * tokens
    accs = [[jnp.zeros((bk, w), f32) for _, w in columns] for _ in range(tokens)]
    # steps go `group` at a time, as many as their loads (w's blocks, x's rows, the norm's) fit GEMV_LOAD_WORDS
    group = max(1, min(steps, GEMV_UNROLL, GEMV_LOAD_WORDS // (bk * width // 2 + (tokens + 1) * bk // 2)))
    plain = steps - tail  # steps that bk's rows fill
    loops = plain // group if steps > group else 0
    if loops:
        ssq, accs = jax.lax.fori_loop(0, loops, lambda j, c: add_steps(
            [pl.multiple_of((j * group + u) * bk, bk) for u in range(group)], *c), (ssq, accs))
    # the rest unrolled; the last step of a K that bk does not divide ends at K, its rows of the step before masked
    starts = [i * bk for i in range(loops * group, plain)] + ([K - bk] if tail else [])
    if starts:
        ssq, accs = add_steps(starts, ssq, accs, ((steps - 1) * bk, K) if tail else None)
    sums = [[jnp.sum(a, axis=0) for a in row] for row in accs]
    if g_ref is not None:
        sums = [[v * jax.lax.rsqrt(jnp.sum(ssq[r]) / K + eps) for v in sums[r]] for r in range(tokens)]
    return [_stack_rows([sums[r][i] for r in range(tokens)]) for i in range(len(columns))]


def _gemv_block_k(K: int, width: int, tokens: int) -> int:
    """Rows of K per step of the row-by-row products (`width` columns, `tokens` rows): a power of two with at most
    GEMV_ACC_ELEMS products a step; of those that cover K in at most GEMV_UNROLL steps, the one that pads K least,
    then the one with fewest steps (SmolLM2's 576 in 5 steps of 128, its 1536 in 3 of 512)."""
    cap = _floor2(min(K, max(16, GEMV_ACC_ELEMS // (tokens * width))))
    fits = [b for b in (1 << i for i in range(4, cap.bit_length())) if pl.cdiv(K, b) <= GEMV_UNROLL]
    return min(fits, key=lambda b: (pl.cdiv(K, b) * b, pl.cdiv(K, b))) if fits else cap


def _stack_rows(vectors: list[jax.Array]) -> jax.Array:
    """fp32 vectors [width] as the first rows of a [ROWS, width] block, zero below (Triton has no concatenation)."""
    row = jnp.arange(ROWS)[:, None]
    out = jnp.zeros((ROWS, vectors[0].shape[0]), jnp.float32)
    for r, v in enumerate(vectors):
        out = jnp.where(row == r, v[None, :], out)
    return out


def _load(ref, mask: jax.Array | None) -> jax.Array:
    return ref[...] if mask is None else plgpu.load(ref, mask=mask, other=0)


def _block_k(K: int, row_bytes: int) -> int:
    """Rows of x's and w's blocks per step (w's rows `row_bytes` wide): few steps, since a program's loads are few
    and small, and their latency, not their bytes, is what it waits for (a short loop's steps can all be in flight
    at once, Triton pipelining them); at most 256, at most K, and w's block at most 32 KB (in shared memory, once
    per pipeline stage)."""
    return min(256, _floor2(K), max(16, 32768 // row_bytes))


def _linear_kernel(*refs, bn: int, eps: float, norm: bool, swiglu: bool, residual: bool, tokens: int):
    refs = list(refs)
    x_ref, layer_ref, g_ref = refs.pop(0), refs.pop(0), refs.pop(0) if norm else None
    w_ref, r_ref, o_ref = refs[0], refs[1] if residual else None, refs[-1]
    N, dt = o_ref.shape[1], o_ref.dtype
    c0 = pl.multiple_of(pl.program_id(0) * bn, bn)
    r = r_ref[:, pl.ds(c0, bn)] if residual else None  # loaded first: its wait overlaps the weights'
    accs = _projected(x_ref, g_ref, w_ref, layer_ref[0], eps, [(c0, bn)] + ([(N + c0, bn)] if swiglu else []),
                      tokens)
    y = accs[0].astype(dt)
    if swiglu:  # llama.mlp: silu(gate) * up of the rounded projections
        gate, up = y.astype(jnp.float32), accs[1].astype(dt).astype(jnp.float32)
        sigmoid = (1 / (1 + jnp.exp(-gate))).astype(dt).astype(jnp.float32)
        y = ((gate * sigmoid).astype(dt).astype(jnp.float32) * up).astype(dt)
    if residual:
        y = (r.astype(jnp.float32) + y.astype(jnp.float32)).astype(dt)
    o_ref[:, pl.ds(c0, bn)] = y


def linear(x: jax.Array, w: jax.Array, layer: jax.Array, *, norm: jax.Array | None = None, eps: float = 0.0,
           residual: jax.Array | None = None, swiglu: bool = False, tokens: int = ROWS,
           interpret: bool = False) -> jax.Array:
    """x [ROWS, K] @ w[layer] -> [ROWS, N] in x's dtype, w stacked [L, K, N] and layer [1] int32; with `norm`
    ([L, K]), RMSNorm(x) * norm[layer] first; with `swiglu`, w is [L, K, 2N] = [gate, up] and the result
    silu(gate) * up; with `residual` [ROWS, N], added last. Rows from `tokens` on are zero in x and residual."""
    N = w.shape[2] // (2 if swiglu else 1)
    bn = _block_n(N, tokens)
    operands = ([x, layer] + ([norm] if norm is not None else []) + [w]
                + ([residual] if residual is not None else []))
    kernel = partial(_linear_kernel, bn=bn, eps=eps, norm=norm is not None, swiglu=swiglu,
                     residual=residual is not None, tokens=tokens)
    return pl.pallas_call(kernel, grid=(N // bn,), out_shape=jax.ShapeDtypeStruct((ROWS, N), x.dtype),
                          compiler_params=_params(tokens), interpret=interpret, name="jaxspec_linear")(*operands)


def _qkv_kernel(*refs, eps: float, norm: bool, heads: int, kv_heads: int, T: int, M: int, R: int,
                layer_slots: int, width: int):
    refs = list(refs)
    x_ref, layer_ref, g_ref = refs.pop(0), refs.pop(0), refs.pop(0) if norm else None
    w_ref, pos_ref, freq_ref, slot_ref, _, _, q_ref, k_ref, v_ref = refs
    half = freq_ref.shape[0]
    D, dt = 2 * half, q_ref.dtype
    pieces = half // width
    j = _div(pl.program_id(0), pieces)  # head: q heads, then k heads, then v heads
    c = pl.multiple_of(_rem(pl.program_id(0), pieces) * width, width)  # this program's columns of each half
    c0 = pl.multiple_of(j * D + c, width)
    layer = layer_ref[0]
    # the rows' positions and slots loaded before the projection, so that their waits overlap the weights'
    angle = pos_ref[...].astype(jnp.float32)[:, None] * freq_ref[pl.ds(c, width)][None, :]  # [ROWS, width]
    slot = slot_ref[...]
    lo, hi = (a.astype(dt) for a in _projected(x_ref, g_ref, w_ref, layer, eps,
                                               [(c0, width), (c0 + half, width)], M))
    rotate = j < heads + kv_heads  # v is not rotated: cos 1, sin 0
    cos = jnp.where(rotate, jnp.cos(angle), 1.0).astype(dt)
    sin = jnp.where(rotate, jnp.sin(angle), 0.0).astype(dt)
    lo, hi = lo * cos - hi * sin, hi * cos + lo * sin  # llama.apply_rope's rotate-half
    m = jnp.arange(ROWS)
    valid = m < M
    cols = c + jnp.arange(width)[None, :]
    # rows not written point past the array's end as well as being masked: the GPU skips them for the mask, and
    # Pallas's interpreter (which scatters every row) drops them for the index

    @pl.when(j < heads)
    def _():  # row (t * G + g) of the (sequence, KV head) query block, as paged_kernel.query_rows
        group = heads // kv_heads
        row = jnp.where(valid, (_div(m, T) * kv_heads + _div(j, group)) * R + _rem(m, T) * group + _rem(j, group),
                        q_ref.shape[0])[:, None]
        # paged_attention_pallas' q / sqrt(D) in the model dtype (divided in fp32: Triton has no bf16 division)
        scale = jnp.float32(np.sqrt(D)).astype(dt).astype(jnp.float32)
        for at, half_q in ((cols, lo), (cols + half, hi)):
            plgpu.store(q_ref.at[row, at], (half_q.astype(jnp.float32) / scale).astype(dt), mask=valid[:, None])

    write = valid & (slot >= 0)
    row = jnp.where(write, layer * layer_slots + slot, k_ref.shape[1])[:, None]
    for index, ref in ((j - heads, k_ref), (j - heads - kv_heads, v_ref)):
        @pl.when((index >= 0) & (index < kv_heads))
        def _():
            plgpu.store(ref.at[index, row, cols], lo, mask=write[:, None])
            plgpu.store(ref.at[index, row, cols + half], hi, mask=write[:, None])


def qkv(x: jax.Array, norm: jax.Array | None, wqkv: jax.Array, eps: float, p: Plan, heads: int,
        inv_freq: np.ndarray, kv: KVCache, layer: jax.Array) -> tuple[jax.Array, KVCache]:
    """Rows x [ROWS, K] through layer `layer` ([1] int32) of the stacked norm [L, K] and wqkv [L, K, N] -> the
    attention kernel's query blocks, flat [B * KVH * R, D] (padding rows unwritten), and kv with the rows' k, v
    written at their slots of that layer."""
    kvh, L, P, S, D = kv.k.shape
    k_flat, v_flat = (c.reshape(kvh, L * P * S, D) for c in (kv.k, kv.v))
    R = p.row_len.shape[1]
    operands = ([x, layer] + ([norm] if norm is not None else [])
                + [wqkv, p.positions, jnp.asarray(inv_freq, jnp.float32), p.slots, k_flat, v_flat])
    M = p.B * p.T
    # columns of each half-head per program: the whole half for dots; row-by-row products split it further
    pieces = _floor2(max(1, GEMV_MIN_PROGRAMS // (heads + 2 * kvh)))
    width = D // 2 if M > GEMV_ROWS else max(GEMV_MIN_BLOCK, D // 2 // pieces)
    kernel = partial(_qkv_kernel, eps=eps, norm=norm is not None, heads=heads, kv_heads=kvh, T=p.T, M=M,
                     R=R, layer_slots=P * S, width=width)
    q, k_flat, v_flat = pl.pallas_call(
        kernel, grid=((heads + 2 * kvh) * (D // 2 // width),),
        out_shape=[jax.ShapeDtypeStruct((p.B * kvh * R, D), x.dtype), k_flat, v_flat],
        input_output_aliases={len(operands) - 2: 1, len(operands) - 1: 2},
        compiler_params=_params(M), interpret=p.interpret, name="jaxspec_qkv")(*operands)
    return q, KVCache(k_flat.reshape(kv.k.shape), v_flat.reshape(kv.v.shape))


def _over_heads(load, add, heads: int, unroll: int, init):
    """carry = add(load(h), carry) for h = 0 .. heads - 1, `unroll` heads at a time (`unroll` divides `heads`): a
    group's loads are all issued before its adds, whose sums across threads are barriers the loads after them would
    wait behind; a loop over the groups, or the one group straight (h a Python int)."""
    def group(g, carry):
        loaded = [load(g * unroll + u) for u in range(unroll)]
        for x in loaded:
            carry = add(x, carry)
        return carry

    return group(0, init) if unroll == heads else jax.lax.fori_loop(0, heads // unroll, group, init)


def _attn_out_kernel(o_ref, l_ref, m_ref, layer_ref, w_ref, r_ref, out_ref, *, bn: int, B: int, T: int,
                     kv_heads: int, R: int, splits: int, unroll: int):
    D, dt = o_ref.shape[-1], out_ref.dtype
    heads = w_ref.shape[1] // D
    layer = layer_ref[0]
    group = heads // kv_heads
    M = B * T
    c0 = pl.multiple_of(pl.program_id(0) * bn, bn)
    r = jnp.arange(ROWS)  # row r of a head's merge block: partition r // M of token r % M
    ok = r < splits * M
    token = _rem(r, M)
    b, t, part = _div(token, T), _rem(token, T), _div(r, M)
    owner = (token[None, :] == r[:, None]) & ok[None, :]  # [token, r]: r holds a partition of that token
    mask = paged_kernel.MASK

    def head(h, acc):
        idx = jnp.where(ok, ((part * B + b) * kv_heads + _div(h, group)) * R + t * group + _rem(h, group),
                        l_ref.shape[0])
        m = plgpu.load(m_ref.at[idx], mask=ok, other=mask)
        l = plgpu.load(l_ref.at[idx], mask=ok, other=0.0)
        o = plgpu.load(o_ref.at[idx[:, None], jnp.arange(D)[None, :]], mask=ok[:, None], other=0.0)
        m_token = jnp.max(jnp.where(owner, m[None, :], mask), axis=1)  # per token, over its partitions
        m_all = jnp.max(jnp.where(owner, m_token[:, None], mask), axis=0)  # the same, per row r
        weight = jnp.where(ok, jnp.exp(m - m_all), 0.0)
        num = _dot(owner.astype(jnp.float32), o * weight[:, None])  # [token, D]
        den = jnp.sum(jnp.where(owner, (l * weight)[None, :], 0.0), axis=1)
        attn = (num / (den[:, None] + 1e-30)).astype(dt)
        return acc + _dot(attn, w_ref[layer, pl.ds(_multiple(h * D, D), D), pl.ds(c0, bn)])

    acc = _over_heads(lambda h: h, head, heads, unroll, jnp.zeros((ROWS, bn), jnp.float32))
    out_ref[:, pl.ds(c0, bn)] = (r_ref[:, pl.ds(c0, bn)].astype(jnp.float32)
                                 + acc.astype(dt).astype(jnp.float32)).astype(dt)


def _attn_out_gemv_kernel(o_ref, l_ref, m_ref, layer_ref, w_ref, r_ref, out_ref, *, bn: int, B: int, T: int,
                          kv_heads: int, R: int, splits: int, unroll: int):
    """_attn_out_kernel for up to GEMV_ROWS tokens: each token's partitions merged on their own (a vector of
    partitions, no merge block), its attention row times wo's block on the CUDA cores, the products of all heads
    added into [D, bn] fp32 accumulators and summed over D once at the end. Heads go `unroll` at a time, each
    group's loads (partitions and weights) issued before its merges, whose sums across threads are barriers."""
    D, dt, layer, M = o_ref.shape[-1], out_ref.dtype, layer_ref[0], B * T
    heads, c0 = w_ref.shape[1] // D, pl.multiple_of(pl.program_id(0) * bn, bn)
    group = heads // kv_heads
    sp = 1 << (splits - 1).bit_length()  # partitions, padded to a power of two
    part = jnp.arange(sp)
    ok = part < splits
    f32 = jnp.float32
    residual = r_ref[:, pl.ds(c0, bn)]

    def load(h) -> tuple:
        """Head h's block of wo and, for each token, its partitions' m, l and o."""
        w = w_ref[layer, pl.ds(_multiple(h * D, D), D), pl.ds(c0, bn)]
        parts = []
        for r in range(M):
            b, t = divmod(r, T)
            idx = jnp.where(ok, ((part * B + b) * kv_heads + _div(h, group)) * R + t * group + _rem(h, group),
                            l_ref.shape[0])
            parts.append((plgpu.load(m_ref.at[idx], mask=ok, other=paged_kernel.MASK),
                          plgpu.load(l_ref.at[idx], mask=ok, other=0.0),
                          plgpu.load(o_ref.at[idx[:, None], jnp.arange(D)[None, :]], mask=ok[:, None], other=0.0)))
        return w, parts

    def add(loaded: tuple, accs: list) -> list:
        w, parts = loaded
        w, accs = w.astype(f32), list(accs)
        for r, (m, l, o) in enumerate(parts):
            weight = jnp.where(ok, jnp.exp(m - jnp.max(m)), 0.0)
            attn = jnp.sum(o * weight[:, None], axis=0) / (jnp.sum(l * weight) + 1e-30)
            accs[r] = accs[r] + attn.astype(dt).astype(f32)[:, None] * w
        return accs

    accs = _over_heads(load, add, heads, unroll, [jnp.zeros((D, bn), f32) for _ in range(M)])
    acc = _stack_rows([jnp.sum(a, axis=0) for a in accs])
    out_ref[:, pl.ds(c0, bn)] = (residual.astype(f32) + acc.astype(dt).astype(f32)).astype(dt)


def attn_out(o: jax.Array, l: jax.Array, m: jax.Array, wo: jax.Array, layer: jax.Array, residual: jax.Array,
             p: Plan) -> jax.Array:
    """paged_kernel.attend's partitions (o [splits, B, KVH, R, D], l, m) merged per token and head, projected by
    wo[layer] (stacked [L, heads * D, H]; layer [1] int32) and added to residual [ROWS, H]: [ROWS, H]."""
    splits, B, kvh, R, D = o.shape
    H, heads = wo.shape[2], wo.shape[1] // D
    M = B * p.T
    bn = _block_n(H, M)
    if M <= GEMV_ROWS:  # its accumulators, [D, bn] a token, within GEMV_ACC_ELEMS
        bn = max(GEMV_MIN_BLOCK, min(bn, _floor2(GEMV_ACC_ELEMS // (M * D))))
        per_head = D * bn // 2 + M * (1 << (splits - 1).bit_length()) * D  # fp32 words: wo's block, the o rows
        unroll = max(d for d in range(1, heads + 1) if heads % d == 0 and (d == 1 or d * per_head <= GEMV_LOAD_WORDS))
        kernel = _attn_out_gemv_kernel
    else:  # heads unrolled by up to UNROLL_HEADS: 32 took Triton 12 s to compile, 8 used all 255 registers
        unroll = max(d for d in range(1, UNROLL_HEADS + 1) if heads % d == 0)
        kernel = _attn_out_kernel
    kernel = partial(kernel, bn=bn, B=B, T=p.T, kv_heads=kvh, R=R, splits=splits, unroll=unroll)
    return pl.pallas_call(kernel, grid=(H // bn,), out_shape=jax.ShapeDtypeStruct((ROWS, H), residual.dtype),
                          compiler_params=_params(M), interpret=p.interpret, name="jaxspec_attn_out")(
        o.reshape(-1, D), l.reshape(-1), m.reshape(-1), layer, wo, residual)
