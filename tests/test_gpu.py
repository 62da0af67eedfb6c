"""The GPU kernel path against the XLA reference, on the GPU itself (skipped where there is none; the CPU suite
checks the same kernel through Pallas's interpreter in test_engine.py). Run there with JAX_PLATFORMS=cuda:
tests/conftest.py defaults to the CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.models.attention import AttnBatch, KVCache, paged_attention_pallas, paged_attention_xla
from tests.numerics import BF16_EPS, TF32_EPS, assert_close_scaled
from tests.tiny import TINY, tiny_weights

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")


# fp32 through the kernel runs its dots in TF32 (Triton's default), hence TF32's epsilon and not fp32's; the
# cached values are all N(0, 1), so the tensor's largest output stands for their scale
@pytest.mark.parametrize("dtype, rel", [(jnp.float32, 2 * TF32_EPS), (jnp.bfloat16, 4 * BF16_EPS)])
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(9, 3, 64), (32, 8, 128)])
def test_pallas_paged_attention_matches_xla(dtype, rel, heads, kv_heads, head_dim):
    rng = np.random.default_rng(0)
    B, T, pages, page_size, num_pages = 5, 3, 12, 16, 80
    k = jnp.asarray(rng.standard_normal((kv_heads, 3, num_pages, page_size, head_dim)), dtype)
    v = jnp.asarray(rng.standard_normal((kv_heads, 3, num_pages, page_size, head_dim)), dtype)
    tables = jnp.asarray(rng.permutation(num_pages)[:B * pages].reshape(B, pages), jnp.int32)
    lengths = rng.integers(T, pages * page_size - T, B)
    q_pos = jnp.asarray(lengths[:, None] + np.arange(T), jnp.int32)  # T queries per sequence, as in verify
    q = jnp.asarray(rng.standard_normal((B, T, heads, head_dim)), dtype)
    batch = AttnBatch(tables, jnp.zeros((B, T), jnp.int32))
    ref = paged_attention_xla(q, KVCache(k, v), 1, batch, q_pos).astype(jnp.float32)
    out = paged_attention_pallas(q, KVCache(k, v), 1, batch, q_pos).astype(jnp.float32)
    assert_close_scaled(out, ref, rel, axis=None)


def test_model_logits_pallas_equal_xla_on_gpu():
    """A chunked prefill and a 3-query verify through the whole tiny model, paged, with each attention path. The
    kernel's fp32 dots run in TF32, so the logits agree to TF32 rounding, not bit for bit; greedy tokens of a
    random tiny model (near-ties everywhere) are not a fair comparison, hence logits."""
    from jaxspec.models import llama
    from jaxspec.models.attention import init_cache

    w = tiny_weights()
    rng = np.random.default_rng(1)
    B, page_size, pages = 3, 16, 8
    tables = jnp.asarray(np.arange(B * pages).reshape(B, pages), jnp.int32)
    tokens = jnp.asarray(rng.integers(0, TINY.vocab_size, (B, 40)), jnp.int32)
    logits = {}
    for impl in ("xla", "pallas"):
        cfg = TINY.replace(attn_impl=impl)
        kv = init_cache(cfg.num_layers, cfg.num_kv_heads, B * pages, page_size, cfg.head_dim, jnp.float32)
        outs = []
        for a, b in ((0, 21), (21, 37), (37, 40)):
            pos = jnp.broadcast_to(jnp.arange(a, b, dtype=jnp.int32), (B, b - a))
            slots = tables[jnp.arange(B)[:, None], pos // page_size] * page_size + pos % page_size
            hidden, _, kv = llama.forward(w, cfg, tokens[:, a:b], pos, kv, AttnBatch(tables, slots))
            outs.append(llama.lm_head(w, hidden))
        logits[impl] = jnp.concatenate(outs, axis=1)
    # TF32 dots (epsilon 2^-10) through four layers and the LM head: 2e-2 of the largest logit
    assert_close_scaled(logits["pallas"], logits["xla"], 2e-2, axis=None)


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs 2 GPUs")
def test_tensor_parallel_pallas_equals_one_gpu():
    """The Pallas kernel under shard_map (each GPU its own KV heads) and NCCL all-reduces: TP = 2 gives TP = 1's
    greedy tokens. The LM head is scaled up so that TF32 and all-reduce rounding cannot flip a near-tie."""
    from jaxspec import LLM, SamplingParams
    from tests.tiny import random_prompts

    w = tiny_weights()
    w.lm_head = w.lm_head * 20.0
    prompts = random_prompts(8, 1, 60, seed=2)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = {}
    for tp in (1, 2):
        llm = LLM.from_weights(TINY, w, attn_impl="pallas", max_model_len=128, max_num_seqs=8, page_size=16,
                               warmup=False, tensor_parallel_size=tp)
        outs[tp] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert outs[2] == outs[1]


@pytest.mark.parametrize("B, T", [(1, 1), (1, 4), (4, 4)])
@pytest.mark.parametrize("hidden, heads, kv_heads, head_dim, inter", [(576, 9, 3, 64, 1536), (1024, 8, 2, 128, 2816)])
def test_fused_layers_match_xla_on_gpu(B, T, hidden, heads, kv_heads, head_dim, inter):
    """models/fused_layer.py's kernels compiled by Triton (the CPU suite runs them in the interpreter): a decode
    batch through two bf16 layers at SmolLM2's and Llama-3-8B's head sizes, hidden states and the written cache
    against the XLA layers."""
    from jaxspec.models import llama
    from jaxspec.models.kernel_config import KernelConfig

    cfg = llama.Config(vocab_size=512, hidden_size=hidden, intermediate_size=inter, num_layers=2, num_heads=heads,
                       num_kv_heads=kv_heads, head_dim=head_dim, dtype="bfloat16")
    w = llama.init(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    page_size, pages, num_pages = 16, 64, 4 * 64 + 8
    k, v = (jnp.asarray(rng.standard_normal((kv_heads, 2, num_pages, page_size, head_dim)), jnp.bfloat16)
            for _ in range(2))
    tables = rng.permutation(num_pages)[:B * pages].reshape(B, pages)
    positions = rng.integers(1, pages * page_size - T, B)[:, None] + np.arange(T)
    slots = tables[np.arange(B)[:, None], positions // page_size] * page_size + positions % page_size
    batch = AttnBatch(jnp.asarray(tables, jnp.int32), jnp.asarray(slots, jnp.int32))
    tokens = jnp.asarray(rng.integers(0, 512, (B, T)), jnp.int32)
    out = {}
    fused = KernelConfig(fused_decode=True, fused_decode_tokens=16, fused_decode_max_layer_mib=1024)
    for name, c in (("xla", cfg), ("fused", cfg.replace(attn_impl="pallas", kernel=fused))):
        h, _, kv = jax.jit(llama.forward, static_argnums=1)(w, c, tokens, jnp.asarray(positions, jnp.int32),
                                                             KVCache(k, v), batch)
        out[name] = (h, kv.k, kv.v)
    # bf16 roundings that fall the other way (other sums, fewer ops) through two layers, as the CPU test
    for name, got, want in zip(("hidden", "k", "v"), out["fused"], out["xla"]):
        assert_close_scaled(got.astype(jnp.float32), want.astype(jnp.float32), 8 * BF16_EPS, err_msg=name)


@pytest.mark.parametrize("V, process", [(49152, True), (49152, False), (800, True)])
def test_greedy_pass_equals_the_xla_path_on_gpu(V, process):
    """The one-kernel greedy pass compiled for the GPU gives processors.sample's tokens, accept counts, ranks and
    top-N ids, and its logprobs to fp32 rounding (tests/test_greedy_pass.py's checks, at SmolLM2's vocabulary)."""
    from tests.test_greedy_pass import check_sample

    check_sample(V, 5, process, interpret=False)


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(9, 3, 64), (32, 8, 128)])
def test_cudnn_dense_attention_matches_xla(heads, kv_heads, head_dim):
    """The training target pass's cuDNN attention (attn_impl "cudnn") against XLA's dense causal attention."""
    from jaxspec.models.attention import attention, dense_attention

    rng = np.random.default_rng(0)
    B, T = 3, 200
    q = jnp.asarray(rng.standard_normal((B, T, heads, head_dim)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((B, T, kv_heads, head_dim)), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((B, T, kv_heads, head_dim)), jnp.bfloat16)
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    ref = dense_attention(q, k, v, pos, pos).astype(jnp.float32)
    out = attention(q, k, v, pos, None, 0, None, "cudnn").astype(jnp.float32)
    assert_close_scaled(out, ref, 4 * BF16_EPS, axis=None)
