"""The GPU kernel path against the XLA reference, on the GPU itself (skipped where there is none; the CPU suite
checks the same kernel through Pallas's interpreter in test_engine.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec import LLM, SamplingParams
from jaxspec.models.attention import AttnBatch, KVCache, paged_attention_pallas, paged_attention_xla
from tests.tiny import TINY, random_prompts, tiny_weights

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")


# fp32 through the kernel runs its dots in TF32 (Triton's default), hence 2e-3 and not fp32 rounding
@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 2e-3), (jnp.bfloat16, 3e-2)])
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(9, 3, 64), (32, 8, 128)])
def test_pallas_paged_attention_matches_xla(dtype, tol, heads, kv_heads, head_dim):
    rng = np.random.default_rng(0)
    B, T, pages, page_size, num_pages = 5, 3, 12, 16, 80
    k = jnp.asarray(rng.standard_normal((1, kv_heads, num_pages, page_size, head_dim)), dtype)
    v = jnp.asarray(rng.standard_normal((1, kv_heads, num_pages, page_size, head_dim)), dtype)
    tables = jnp.asarray(rng.permutation(num_pages)[:B * pages].reshape(B, pages), jnp.int32)
    lengths = rng.integers(T, pages * page_size - T, B)
    q_pos = jnp.asarray(lengths[:, None] + np.arange(T), jnp.int32)  # T queries per sequence, as in verify
    q = jnp.asarray(rng.standard_normal((B, T, heads, head_dim)), dtype)
    batch = AttnBatch(tables, jnp.zeros((B, T), jnp.int32))
    ref = paged_attention_xla(q, KVCache(k, v), 0, batch, q_pos).astype(jnp.float32)
    out = paged_attention_pallas(q, KVCache(k, v), 0, batch, q_pos).astype(jnp.float32)
    err = float(jnp.max(jnp.abs(out - ref)))
    assert err < tol, err


def test_engine_pallas_equals_xla_on_gpu():
    w = tiny_weights()
    prompts = random_prompts(8, 1, 60, seed=2)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = {}
    for impl in ("xla", "pallas"):
        llm = LLM("tiny", weights=(TINY, w), attn_impl=impl, max_model_len=128, max_num_seqs=8, page_size=16,
                  warmup=False)
        outs[impl] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert outs["pallas"] == outs["xla"]


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs 2 GPUs")
def test_tensor_parallel_pallas_equals_one_gpu():
    """The Pallas kernel under shard_map (each GPU its own KV heads) and NCCL all-reduces: TP = 2 gives TP = 1's
    greedy tokens."""
    w = tiny_weights()
    prompts = random_prompts(8, 1, 60, seed=2)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = {}
    for tp in (1, 2):
        llm = LLM("tiny", weights=(TINY, w), attn_impl="pallas", max_model_len=128, max_num_seqs=8, page_size=16,
                  warmup=False, tensor_parallel_size=tp)
        outs[tp] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert outs[2] == outs[1]
