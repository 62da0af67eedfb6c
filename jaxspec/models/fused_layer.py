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
GEMV_WARPS = 4


def applies(cfg, tokens: int, batch: AttnBatch | None, kv: KVCache | None) -> bool:
    """Whether a forward of `tokens` tokens (B * T) over model config `cfg` (llama.Config) runs these kernels:
    KernelConfig.fused_decode, at most KernelConfig.fused_decode_tokens tokens, the Pallas attention, one device, a
    decode batch (one sequence per row) over a paged cache, and shapes the kernels' blocks divide."""
    D = cfg.head_dim
    return (cfg.kernel.fused_decode and cfg.attn_impl in ("pallas", "pallas-interpret") and cfg.tp_size == 1
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


def _div(a: jax.Array, n: int) -> jax.Array:
    """a // n for a >= 0 (lax's truncating division: jnp's floor division adds sign fixes Triton cannot lower)."""
    return jax.lax.div(a, jnp.asarray(n, a.dtype))


def _rem(a: jax.Array, n: int) -> jax.Array:
    return jax.lax.rem(a, jnp.asarray(n, a.dtype))


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
    elementwise products into [block K, width] fp32 accumulators, summed across K once at the end. Up to
    GEMV_UNROLL steps are unrolled, so all their loads can be in flight together (more run as a loop); K's
    remainder is taken in smaller power-of-two steps (no masks: a block's size is static), each summed alone."""
    K = x_ref.shape[1]
    width = sum(w for _, w in columns)
    bk = _floor2(min(K, max(16, GEMV_ACC_ELEMS // (tokens * width))))
    f32 = jnp.float32

    def step(k0, size: int, ssq: list, accs: list) -> tuple[list, list]:
        """Rows [k0, k0 + size) of K: the rows' sums of squares, and the products added to accs (when they are
        [size, width] each) or summed over the step first."""
        keys = pl.ds(k0, size)
        ws = [w_ref[layer, keys, pl.ds(c, w)].astype(f32) for c, w in columns]
        g = None if g_ref is None else g_ref[layer, keys]
        ssq, accs = list(ssq), [list(a) for a in accs]
        for r in range(tokens):
            x = x_ref[r, keys]
            if g is not None:
                x32 = x.astype(f32)
                ssq[r] = ssq[r] + jnp.sum(x32 * x32)
                x = x * g
            x = x.astype(f32)[:, None]
            accs[r] = [a + (x * w if a.ndim == 2 else jnp.sum(x * w, axis=0)) for a, w in zip(accs[r], ws)]
        return ssq, accs

    ssq = [jnp.zeros((), f32)] * tokens
    accs = [[jnp.zeros((bk, w), f32) for _, w in columns] for _ in range(tokens)]
    full = K // bk
    if full <= GEMV_UNROLL:
        for i in range(full):
            ssq, accs = step(i * bk, bk, ssq, accs)
    else:
        ssq, accs = jax.lax.fori_loop(0, full, lambda i, c: step(pl.multiple_of(i * bk, bk), bk, *c), (ssq, accs))
    sums = [[jnp.sum(a, axis=0) for a in row] for row in accs]
    rest = K % bk
    while rest:  # the remainder's binary digits, largest first
        size = _floor2(rest)
        ssq, sums = step(K - rest, size, ssq, sums)
        rest -= size
    if g_ref is not None:
        sums = [[v * jax.lax.rsqrt(ssq[r] / K + eps) for v in sums[r]] for r in range(tokens)]
    return [_stack_rows([sums[r][i] for r in range(tokens)]) for i in range(len(columns))]


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
    accs = _projected(x_ref, g_ref, w_ref, layer_ref[0], eps, [(c0, bn)] + ([(N + c0, bn)] if swiglu else []),
                      tokens)
    y = accs[0].astype(dt)
    if swiglu:  # llama.mlp: silu(gate) * up of the rounded projections
        gate, up = y.astype(jnp.float32), accs[1].astype(dt).astype(jnp.float32)
        sigmoid = (1 / (1 + jnp.exp(-gate))).astype(dt).astype(jnp.float32)
        y = ((gate * sigmoid).astype(dt).astype(jnp.float32) * up).astype(dt)
    if residual:
        y = (r_ref[:, pl.ds(c0, bn)].astype(jnp.float32) + y.astype(jnp.float32)).astype(dt)
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
    lo, hi = (a.astype(dt) for a in _projected(x_ref, g_ref, w_ref, layer, eps,
                                               [(c0, width), (c0 + half, width)], M))
    angle = pos_ref[...].astype(jnp.float32)[:, None] * freq_ref[pl.ds(c, width)][None, :]  # [ROWS, width]
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

    slot = slot_ref[...]
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


def _over_heads(head, heads: int, init):
    """head(h, carry) for h = 0 .. heads - 1, in groups of up to UNROLL_HEADS unrolled heads (each head's gathers are
    independent, so a group's can be in flight together) and a loop over the groups: 32 heads unrolled took Triton
    12 s to compile, 8 used all 255 registers."""
    unroll = max(d for d in range(1, UNROLL_HEADS + 1) if heads % d == 0)

    def group(g, carry):
        for u in range(unroll):
            carry = head(g * unroll + u, carry)
        return carry

    return jax.lax.fori_loop(0, heads // unroll, group, init)


def _attn_out_kernel(o_ref, l_ref, m_ref, layer_ref, w_ref, r_ref, out_ref, *, bn: int, B: int, T: int,
                     kv_heads: int, R: int, splits: int):
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
        return acc + _dot(attn, w_ref[layer, pl.ds(pl.multiple_of(h * D, D), D), pl.ds(c0, bn)])

    acc = _over_heads(head, heads, jnp.zeros((ROWS, bn), jnp.float32))
    out_ref[:, pl.ds(c0, bn)] = (r_ref[:, pl.ds(c0, bn)].astype(jnp.float32)
                                 + acc.astype(dt).astype(jnp.float32)).astype(dt)


def _attn_out_gemv_kernel(o_ref, l_ref, m_ref, layer_ref, w_ref, r_ref, out_ref, *, bn: int, B: int, T: int,
                          kv_heads: int, R: int, splits: int):
    """_attn_out_kernel for up to GEMV_ROWS tokens: each token's partitions merged on their own (a vector of
    partitions, no merge block), its attention row times wo's block on the CUDA cores, the products of all heads
    added into [D, bn] fp32 accumulators and summed over D once at the end."""
    D, dt, layer, M = o_ref.shape[-1], out_ref.dtype, layer_ref[0], B * T
    heads, c0 = w_ref.shape[1] // D, pl.multiple_of(pl.program_id(0) * bn, bn)
    group = heads // kv_heads
    sp = 1 << (splits - 1).bit_length()  # partitions, padded to a power of two
    part = jnp.arange(sp)
    ok = part < splits
    f32 = jnp.float32

    def head(h, accs: list) -> list:
        w = w_ref[layer, pl.ds(pl.multiple_of(h * D, D), D), pl.ds(c0, bn)].astype(f32)
        accs = list(accs)
        for r in range(M):
            b, t = divmod(r, T)
            idx = jnp.where(ok, ((part * B + b) * kv_heads + _div(h, group)) * R + t * group + _rem(h, group),
                            l_ref.shape[0])
            m = plgpu.load(m_ref.at[idx], mask=ok, other=paged_kernel.MASK)
            l = plgpu.load(l_ref.at[idx], mask=ok, other=0.0)
            o = plgpu.load(o_ref.at[idx[:, None], jnp.arange(D)[None, :]], mask=ok[:, None], other=0.0)
            weight = jnp.where(ok, jnp.exp(m - jnp.max(m)), 0.0)
            attn = jnp.sum(o * weight[:, None], axis=0) / (jnp.sum(l * weight) + 1e-30)
            accs[r] = accs[r] + attn.astype(dt).astype(f32)[:, None] * w
        return accs

    accs = _over_heads(head, heads, [jnp.zeros((D, bn), f32) for _ in range(M)])
    acc = _stack_rows([jnp.sum(a, axis=0) for a in accs])
    out_ref[:, pl.ds(c0, bn)] = (r_ref[:, pl.ds(c0, bn)].astype(f32) + acc.astype(dt).astype(f32)).astype(dt)


def attn_out(o: jax.Array, l: jax.Array, m: jax.Array, wo: jax.Array, layer: jax.Array, residual: jax.Array,
             p: Plan) -> jax.Array:
    """paged_kernel.attend's partitions (o [splits, B, KVH, R, D], l, m) merged per token and head, projected by
    wo[layer] (stacked [L, heads * D, H]; layer [1] int32) and added to residual [ROWS, H]: [ROWS, H]."""
    splits, B, kvh, R, D = o.shape
    H = wo.shape[2]
    M = B * p.T
    bn = _block_n(H, M)
    if M <= GEMV_ROWS:  # its accumulators, [D, bn] a token, within GEMV_ACC_ELEMS
        bn = max(GEMV_MIN_BLOCK, min(bn, _floor2(GEMV_ACC_ELEMS // (M * D))))
    kernel = partial(_attn_out_gemv_kernel if M <= GEMV_ROWS else _attn_out_kernel, bn=bn, B=B, T=p.T,
                     kv_heads=kvh, R=R, splits=splits)
    return pl.pallas_call(kernel, grid=(H // bn,), out_shape=jax.ShapeDtypeStruct((ROWS, H), residual.dtype),
                          compiler_params=_params(M), interpret=p.interpret, name="jaxspec_attn_out")(
        o.reshape(-1, D), l.reshape(-1), m.reshape(-1), layer, wo, residual)
