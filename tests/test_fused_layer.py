"""The five-kernel Llama layer for small decode batches (models/fused_layer.py) against the XLA layer, its oracle:
each kernel, whole forwards of the target and the draft heads, the engine's greedy output, and the kernels'
lowering to Triton for a GPU. The kernels run in Pallas's interpreter here; tests/test_gpu.py runs them compiled."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec import LLM, SamplingParams
from jaxspec.models import attention as attn
from jaxspec.models import eagle, fused_layer, llama
from jaxspec.models.kernel_config import KernelConfig
from tests import triton_ir
from tests.numerics import BF16_EPS, FP32_EPS, assert_close_scaled
from tests.tiny import random_prompts

# head_dim 32: the kernels' blocks need half a head >= 16 columns; hidden 96 and intermediate 160 are not powers of
# two (SmolLM2's are 576 and 1536); 3 query heads share one KV head
CFG = llama.Config(vocab_size=256, hidden_size=96, intermediate_size=160, num_layers=2, num_heads=3, num_kv_heads=1,
                   head_dim=32)
FUSED = KernelConfig(fused_decode=True, fused_decode_tokens=16, fused_decode_max_layer_mib=1024)
PAGE, PAGES_PER_SEQ, NUM_PAGES = 4, 16, 320


def _decode_batch(B: int, T: int, seed: int = 0):
    """A cache full of random K/V, and T new tokens for each of B rows at random lengths (one of them writing
    nothing: its slot is -1, as for a position past max_model_len)."""
    rng = np.random.default_rng(seed)
    tables = rng.permutation(NUM_PAGES)[:B * PAGES_PER_SEQ].reshape(B, PAGES_PER_SEQ)
    positions = rng.integers(1, PAGES_PER_SEQ * PAGE - T, B)[:, None] + np.arange(T)
    slots = tables[np.arange(B)[:, None], positions // PAGE] * PAGE + positions % PAGE
    slots[0, -1] = -1
    tokens = rng.integers(0, CFG.vocab_size, (B, T))
    i32 = lambda a: jnp.asarray(a, jnp.int32)  # noqa: E731
    return i32(tokens), i32(positions), attn.AttnBatch(i32(tables), i32(slots))


def _cache(cfg: llama.Config, layers: int, seed: int = 1) -> attn.KVCache:
    rng = np.random.default_rng(seed)
    shape = (cfg.num_kv_heads, layers, NUM_PAGES, PAGE, cfg.head_dim)
    return attn.KVCache(*(jnp.asarray(rng.standard_normal(shape), cfg.jnp_dtype) for _ in range(2)))


def _rows(rng, shape, dtype=jnp.float32) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape), dtype)


@pytest.mark.parametrize("norm, swiglu, residual", [(True, False, False), (False, False, True), (True, True, False),
                                                    (False, True, True)])
@pytest.mark.parametrize("tokens", [5, 4, 1])
def test_linear_kernel_equals_the_xla_ops(norm, swiglu, residual, tokens, monkeypatch):
    """RMSNorm, projection, SwiGLU and residual as llama.rms_norm / llama.mlp / `+` compute them (fp32; `tokens`
    real rows, the rest zero and staying zero): with tensor-core dots (5 tokens) and row by row (4 and 1; at 4 its
    steps over K run as a loop, not unrolled)."""
    if tokens == 4:
        monkeypatch.setattr(fused_layer, "GEMV_UNROLL", 0)
    rng = np.random.default_rng(0)
    K, N = 200, 48  # K not a power of two: the row-by-row steps end in a masked one, unrolled (1) and looped (4)
    x = fused_layer.rows(_rows(rng, (1, tokens, K)))
    g, w, r = _rows(rng, (K,)), _rows(rng, (K, 2 * N if swiglu else N)) / np.sqrt(K), fused_layer.rows(
        _rows(rng, (1, tokens, N)))
    stack = jnp.stack([w * 2, w])  # layer 1 of two
    out = fused_layer.linear(x, stack, jnp.ones((1,), jnp.int32), norm=jnp.stack([g * 3, g]) if norm else None,
                             eps=1e-5, residual=r if residual else None, swiglu=swiglu, tokens=tokens,
                             interpret=True)
    h = llama.rms_norm(x, g, 1e-5) if norm else x
    h = h @ w
    if swiglu:
        h = jax.nn.silu(h[:, :N]) * h[:, N:]
    want = r + h if residual else h
    # sums of K products of unit-scale terms, in other orders
    assert_close_scaled(out, want, 4 * K * FP32_EPS)
    assert not np.asarray(out[tokens:]).any()  # padding rows stay zero (the residual's are zero too)


@pytest.mark.parametrize("B, T, dtype, loop", [(1, 1, "float32", "unroll"), (2, 3, "float32", "unroll"),
                                               (4, 4, "float32", "scan"), (16, 1, "float32", "unroll"),
                                               (3, 4, "bfloat16", "unroll")])
def test_forward_equals_the_xla_layers(B, T, dtype, loop):
    """The target's forward over a decode batch: hidden states and both caches (the new K/V at their slots, every
    other slot untouched) as the XLA layers make them, for 1 to 16 tokens, unrolled or scanned layers."""
    cfg = CFG.replace(dtype=dtype, layer_loop=loop)
    w = llama.init(cfg, jax.random.key(0), scale=0.2)
    tokens, positions, batch = _decode_batch(B, T)
    kv = _cache(cfg, cfg.num_layers)
    forward = jax.jit(llama.forward, static_argnums=1)
    want_h, _, want_kv = forward(w, cfg, tokens, positions, kv, batch)
    fused_cfg = cfg.replace(attn_impl="pallas-interpret", kernel=FUSED)
    assert fused_layer.applies(fused_cfg, B * T, batch, kv)
    h, _, got_kv = forward(w, fused_cfg, tokens, positions, kv, batch)
    # fp32: two layers of sums over <= 160 terms in other orders; bf16: a few roundings of 8-bit values that may
    # fall the other way (fused into fewer ops), carried through two layers
    rel = 64 * 160 * FP32_EPS if dtype == "float32" else 8 * BF16_EPS
    assert_close_scaled(h, want_h, rel)
    written = np.zeros(NUM_PAGES * PAGE, bool)
    written[np.asarray(batch.slot_mapping)[np.asarray(batch.slot_mapping) >= 0]] = True
    for name in ("k", "v"):
        got, old = (np.asarray(getattr(c, name), np.float32) for c in (got_kv, kv))
        assert_close_scaled(got, getattr(want_kv, name), rel, err_msg=name)
        shape = got.shape[:2] + (NUM_PAGES * PAGE, -1)  # every slot but the batch's own, in every layer, as it was
        assert np.array_equal(got.reshape(shape)[:, :, ~written], old.reshape(shape)[:, :, ~written]), name


def test_the_fused_path_is_taken_only_where_it_fits():
    tokens, positions, batch = _decode_batch(1, 1)
    kv = _cache(CFG, CFG.num_layers)
    fused = CFG.replace(attn_impl="pallas", kernel=FUSED)
    assert fused_layer.applies(fused, 16, batch, kv)
    assert not fused_layer.applies(fused, 17, batch, kv)  # more rows than one block
    default = CFG.replace(attn_impl="pallas")  # on, for one-token forwards
    assert fused_layer.applies(default, 1, batch, kv) and not fused_layer.applies(default, 2, batch, kv)
    off = KernelConfig(fused_decode=False)
    assert not fused_layer.applies(CFG.replace(attn_impl="pallas", kernel=off), 1, batch, kv)  # switched off
    assert not fused_layer.applies(fused.replace(attn_impl="xla"), 1, batch, kv)
    assert not fused_layer.applies(fused, 1, attn.AttnBatch(batch.block_tables, batch.slot_mapping,
                                                            jnp.zeros((1, 1), jnp.int32)), kv)  # ragged prefill
    assert not fused_layer.applies(fused, 1, batch, None)  # no cache: dense attention
    assert not fused_layer.applies(fused.replace(head_dim=16), 1, batch, kv)  # half a head under 16 columns
    assert not fused_layer.applies(fused.replace(tp_size=2), 1, batch, kv)
    # by default, SmolLM2-135M's layer (6.75 MiB in bf16) but not Llama-3-8B's (416 MiB)
    smollm2 = default.replace(hidden_size=576, intermediate_size=1536, num_heads=9, num_kv_heads=3, head_dim=64,
                              dtype="bfloat16")
    llama8b = default.replace(hidden_size=4096, intermediate_size=14336, num_heads=32, num_kv_heads=8, head_dim=128,
                              dtype="bfloat16")
    assert fused_layer.applies(smollm2, 1, batch, kv) and not fused_layer.applies(llama8b, 1, batch, kv)
    assert fused_layer.applies(llama8b.replace(kernel=KernelConfig(fused_decode_max_layer_mib=416)), 1, batch, kv)
    assert not fused_layer.applies(llama8b.replace(kernel=KernelConfig(fused_decode_max_layer_mib=415)), 1, batch, kv)


def test_table_partitions_are_capped_for_the_merge():
    """attn_out merges a head's partitions of every token as one block of ROWS rows: partitions x tokens <= ROWS."""
    kv = _cache(CFG, CFG.num_layers)
    cfg = CFG.replace(attn_impl="pallas", kernel=KernelConfig(fused_decode=True, fused_decode_tokens=16,
                                                              attn_block_tokens=4))
    for B, T, most in ((1, 1, 16), (1, 4, 4), (2, 3, 2), (4, 4, 1)):
        _, positions, batch = _decode_batch(B, T)
        p = fused_layer.plan(cfg, positions, batch, kv)
        assert p.splits * B * T <= fused_layer.ROWS and p.splits == most, (B, T, p.splits)


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("from_target, T", [(True, 4), (False, 1)])
def test_draft_head_pass_equals_the_xla_layer(method, from_target, T):
    """The head's layer (no input norm; EAGLE-3's 2H-wide attention input and separate residual) over the
    verified pairs (from the target's features) and a single-token rollout pass (from its own output)."""
    target = CFG.replace(num_layers=4)
    dcfg = eagle.EagleConfig.from_target(target, method, aux_layers=(0, 1, 2) if method == "eagle3" else None)
    dw = eagle.init(dcfg, jax.random.key(1), scale=0.2)
    tw = llama.init(target, jax.random.key(0), scale=0.2)
    tokens, positions, batch = _decode_batch(2, T)
    width = dcfg.feature_size if from_target else dcfg.hidden_size
    hidden = _rows(np.random.default_rng(2), (2, T, width))
    kv = _cache(target, 1)
    run = jax.jit(eagle.forward, static_argnums=(1, 8))
    want, want_kv = run(dw, dcfg, tw.embed, tokens, hidden, positions, kv, batch, from_target)
    fused = dcfg.replace(attn_impl="pallas-interpret", kernel=FUSED)
    out, got_kv = run(dw, fused, tw.embed, tokens, hidden, positions, kv, batch, from_target)
    rel = 64 * 160 * FP32_EPS  # as the target's forward: sums in other orders, one layer
    assert_close_scaled(out, want, rel)
    assert_close_scaled(got_kv.k, want_kv.k, rel, err_msg="k")
    assert_close_scaled(got_kv.v, want_kv.v, rel, err_msg="v")


def test_kernels_lower_to_triton_for_a_gpu():
    """The kernels lower to Triton (the GPU path, not the interpreter) at SmolLM2's shapes: five kernels a layer,
    for the target's forward and the head's pass, at 1 and at 16 tokens."""
    cfg = llama.Config(vocab_size=1024, hidden_size=576, intermediate_size=1536, num_layers=2, num_heads=9,
                       num_kv_heads=3, head_dim=64, dtype="bfloat16", attn_impl="pallas", kernel=FUSED)
    dcfg = eagle.EagleConfig.from_target(cfg, "eagle").replace(kernel=FUSED)
    w = jax.eval_shape(lambda: llama.init(cfg, jax.random.key(0)))
    dw = jax.eval_shape(lambda: eagle.init(dcfg, jax.random.key(0)))
    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
    cache = lambda L: attn.KVCache(*(jax.ShapeDtypeStruct((3, L, 64, 16, 64), jnp.bfloat16) for _ in range(2)))  # noqa

    def triton_calls(fn, *args) -> list[str]:
        text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        assert text.count("__gpu$xla.gpu.triton") == len(re.findall(r'name = "jaxspec_\w+"', text))
        return re.findall(r'name = "(jaxspec_\w+)"', text)

    for B, T in ((1, 1), (4, 4)):
        batch = attn.AttnBatch(i32(B, 8), i32(B, T))
        calls = triton_calls(lambda w, t, p, kv, b: llama.forward(w, cfg, t, p, kv, b), w, i32(B, T), i32(B, T),
                             cache(2), batch)
        assert calls == ["jaxspec_qkv", "jaxspec_paged_attention", "jaxspec_attn_out", "jaxspec_linear",
                         "jaxspec_linear"] * 2, calls
        hidden = jax.ShapeDtypeStruct((B, T, 576), jnp.bfloat16)
        calls = triton_calls(lambda dw, e, t, h, p, kv, b: eagle.forward(dw, dcfg, e, t, h, p, kv, b), dw, w.embed,
                             i32(B, T), hidden, i32(B, T), cache(1), batch)
        assert len(calls) == 5, calls


@pytest.mark.parametrize("B, T", [(4, 4), (1, 4), (1, 1)])
def test_kernels_compile_to_gpu_machine_code(B, T, tmp_path, monkeypatch):
    """Past lowering: the Triton IR Pallas makes of each kernel compiles to H200 (sm_90) machine code without
    register spills, at SmolLM2's, Llama-3-8B's and tests/test_gpu.py's shapes, with tensor-core dots (16 tokens)
    and row by row (4 and 1: fused_layer.GEMV_ROWS) (tests/triton_ir.py)."""
    pytest.importorskip("triton")
    modules = triton_ir.capture_modules(monkeypatch)
    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
    for hidden, heads, kv_heads, head_dim, inter in ((576, 9, 3, 64, 1536), (1024, 8, 2, 128, 2816),
                                                     (4096, 32, 8, 128, 14336)):
        cfg = llama.Config(vocab_size=1024, hidden_size=hidden, intermediate_size=inter, num_layers=1,
                           num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, dtype="bfloat16",
                           attn_impl="pallas", kernel=FUSED)
        w = jax.eval_shape(lambda: llama.init(cfg, jax.random.key(0)))  # noqa: B023
        kv = attn.KVCache(*(jax.ShapeDtypeStruct((kv_heads, 1, 64, 16, head_dim), jnp.bfloat16) for _ in range(2)))
        jax.jit(lambda w, t, p, kv, b: llama.forward(w, cfg, t, p, kv, b)).trace(  # noqa: B023
            w, i32(B, T), i32(B, T), kv, attn.AttnBatch(i32(B, 8), i32(B, T))).lower(lowering_platforms=("cuda",))
    assert len(modules) == 15
    num_warps = fused_layer._params(B * T).num_warps
    triton_ir.assert_compiles_without_spills(modules, tmp_path, monkeypatch, num_warps=num_warps, num_stages=3)


def test_engine_greedy_output_equals_the_xla_layers(monkeypatch):
    """The engine with the fused layers (batches of up to 4 x (k + 1) = 16 tokens) gives the XLA layers' greedy
    tokens, with and without a draft head (random: its drafts mostly rejected, every verify still runs 4 tokens),
    one step or three a dispatch, in fp32; its decode programs run the target's layers and the head's passes
    fused."""
    traced = []  # for each fused layer traced: the target's (it has an input norm) or the head's
    layer = fused_layer.layer
    monkeypatch.setattr(fused_layer, "layer", lambda x, residual, attn_norm, *a: traced.append(
        "head" if attn_norm is None else "target") or layer(x, residual, attn_norm, *a))
    w = llama.init(CFG, jax.random.key(0), scale=0.2)
    prompts = random_prompts(4, 5, 30, seed=3, vocab=CFG.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    args = dict(max_model_len=96, max_num_seqs=4, max_num_batched_tokens=64, page_size=8, warmup=False,
                decode_buckets=[4], prefill_buckets=[64], load_format="dummy")
    head = {"method": "eagle", "model": "dummy", "num_speculative_tokens": 3}
    for spec, steps in ((None, 1), (head, 1), (None, 3)):  # and 3 steps a dispatch (multi_decode_step)
        outs = {}
        for name, impl, kernel in (("xla", "xla", KernelConfig()), ("fused", "pallas-interpret", FUSED)):
            llm = LLM.from_weights(CFG, w, speculative_config=spec, attn_impl=impl, kernel_config=kernel,
                                   num_scheduler_steps=steps, **args)
            outs[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert outs["fused"] == outs["xla"], (spec, steps)
    # the target's layers in the decode programs without and with the head (scanned on the CPU: one trace each),
    # the head's pass over the verified tokens and its k - 1 rollout passes
    assert traced.count("target") >= 2 and traced.count("head") >= 3, traced
