"""Tensor parallelism on 4 CPU devices (tests/conftest.py): TP = 2 and 4 give TP = 1's outputs, plain and with an
EAGLE head (replicated or split), async and sync, and never compile during generation."""

from __future__ import annotations

from functools import partial

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxspec import LLM, SamplingParams, parallel
from jaxspec.convert.eagle import save_eagle
from jaxspec.models import eagle, llama
from tests import tiny
from tests.numerics import FP32_EPS, assert_close_scaled
from tests.tiny import TINY, compiles, random_prompts, tiny_weights

pytestmark = pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices (conftest.py forces 4 CPU devices)")

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
K = 2


@pytest.fixture(scope="module")
def weights():
    return tiny_weights()


@pytest.fixture(scope="module")
def prompts():
    ps = random_prompts(7, 1, 40, seed=11)
    return ps + [random_prompts(1, 120, 120, seed=12)[0]]  # runs into max_model_len (128) mid-step


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """Random heads (acceptance does not matter here: the outputs must match TP = 1's whatever is accepted).
    EAGLE-3 with a smaller draft vocabulary, so its own lm_head and d2t are exercised."""
    root = tmp_path_factory.mktemp("tp_heads")
    out = {}
    for method, extra in (("eagle", {}), ("eagle3", {"draft_vocab_size": 64, "aux_layers": (0, 1, 3)})):
        cfg = eagle.EagleConfig.from_target(TINY, method, **extra)
        save_eagle(str(root / method), cfg, eagle.init(cfg, jax.random.key(5), scale=0.2))
        out[method] = str(root / method)
    return out


make_llm = partial(tiny.make_llm, max_num_seqs=4, decode_buckets=[4], prefill_buckets=[64])


def spec(heads, method: str = "eagle") -> dict:
    return {"method": method, "model": heads[method], "num_speculative_tokens": K}


def generate(llm: LLM, prompts, params=GREEDY) -> dict[bool, list[list[int]]]:
    """Token ids per prompt, async and sync."""
    runs = {}
    for async_scheduling in (True, False):
        outs = llm.generate(prompts, params, use_tqdm=False, async_scheduling=async_scheduling)
        runs[async_scheduling] = [o.outputs[0].token_ids for o in outs]
    return runs


@pytest.fixture(scope="module")
def reference(weights, prompts, heads):
    """TP = 1 greedy outputs: plain, and with each head."""
    refs = {None: generate(make_llm(weights), prompts)[True]}
    for method in heads:
        refs[method] = generate(make_llm(weights, speculative_config=spec(heads, method)), prompts)[True]
    return refs


@pytest.mark.parametrize("tp, attn_impl", [(2, "xla"), (4, "xla"), (4, "pallas-interpret")])
def test_plain_greedy_equals_tp1(weights, prompts, reference, tp, attn_impl):
    """pallas-interpret: the GPU kernel (in Pallas's interpreter) under shard_map, one device's KV heads each."""
    llm = make_llm(weights, tensor_parallel_size=tp, attn_impl=attn_impl)
    runs = generate(llm, prompts)
    assert runs[True] == reference[None] and runs[False] == reference[None]
    kv = llm.llm_engine.runner.caches.target.k
    assert kv.sharding.spec == P("tp") and len(kv.sharding.device_set) == tp
    assert kv.shape[0] == max(TINY.num_kv_heads, tp)  # tp = 4 > 2 KV heads: each device keeps a copy of one


@pytest.mark.parametrize("tp, draft_tp, method", [(2, 1, "eagle"), (2, 2, "eagle"), (4, 1, "eagle"),
                                                  (4, 4, "eagle"), (2, 2, "eagle3"), (4, 1, "eagle3")])
def test_spec_greedy_equals_tp1(weights, prompts, heads, reference, tp, draft_tp, method):
    llm = make_llm(weights, speculative_config=spec(heads, method), tensor_parallel_size=tp,
                   draft_tensor_parallel_size=draft_tp)
    runs = generate(llm, prompts)
    assert runs[True] == reference[method] and runs[False] == reference[method]
    draft_kv = llm.llm_engine.runner.caches.draft.k
    assert draft_kv.sharding.spec == (P("tp") if draft_tp > 1 else P())
    assert llm.llm_engine.block_manager.num_free == llm.engine_config.num_pages


def test_no_compilation_during_generation_and_sampling_equals_tp1(weights, prompts, heads):
    """Caches and slot state come back with their input shardings, so every step after warmup hits the cache;
    seeded sampling over the vocabulary-split logits gives TP = 1's tokens, with processors and logprobs too."""
    params = [SamplingParams(temperature=[0, 0.8][i % 2], top_p=[1.0, 0.9][i // 2 % 2], seed=i, max_tokens=9,
                             ignore_eos=True, presence_penalty=[0.0, 0.5][i // 4 % 2],
                             logprobs=[None, 3][i // 4 % 2]) for i in range(len(prompts))]
    llm = make_llm(weights, speculative_config=spec(heads), tensor_parallel_size=2, warmup=True)
    with compiles() as compiled:
        runs = generate(llm, prompts, params)
    assert compiled == []
    assert llm.num_compiled == 9 + 5 + 3  # 9 decode and 5 prefill modes of one bucket each; two admissions, page copy
    assert runs[True] == runs[False]
    assert runs[True] == generate(make_llm(weights, speculative_config=spec(heads)), prompts, params)[True]


@pytest.mark.parametrize("method", [None, "eagle", "eagle3"])
def test_tp_layout_computes_the_same_function(weights, heads, method):
    """The shard-major layout (KV heads copied when fewer than devices) is a pure relabelling: dense forward passes
    of the permuted weights under tp_size = 4 equal the checkpoint layout's, on one device."""
    tokens = np.arange(12, dtype=np.int32)[None] * 7 % TINY.vocab_size
    positions = np.arange(12)[None]
    cfg4, w4 = parallel.prepare(TINY, weights, llama.abstract(TINY), 4)
    assert w4.layers.wqkv.shape[-1] == (TINY.num_heads + 2 * 4) * TINY.head_dim
    ref, _, _ = llama.forward(weights, TINY, tokens, positions)
    got, _, _ = llama.forward(w4, cfg4, tokens, positions)
    # the same sums, but the relabelled matmuls may split and order them otherwise: fp32 sums of up to
    # intermediate_size = 128 terms
    rel = TINY.intermediate_size * FP32_EPS
    assert_close_scaled(got, ref, rel, err_msg="target")
    if method is not None:
        from jaxspec.convert.eagle import load_eagle
        dcfg, dw = load_eagle(heads[method], TINY)
        dcfg4, dw4 = parallel.prepare(dcfg, dw, eagle.abstract(dcfg), 4)
        feats = np.asarray(jax.random.normal(jax.random.key(0), (1, 12, dcfg.feature_size)))
        ref, _ = eagle.forward(dw, dcfg, weights.embed, tokens, feats, positions)
        got, _ = eagle.forward(dw4, dcfg4, weights.embed, tokens, feats, positions)
        assert_close_scaled(got, ref, rel, err_msg=method)


@pytest.mark.parametrize("cfg, kw, message", [
    (TINY, dict(tensor_parallel_size=3), "does not divide the 4 attention heads"),
    (TINY, dict(tensor_parallel_size=8), "only 4 device"),
    (TINY.replace(num_heads=6, num_kv_heads=3), dict(tensor_parallel_size=2), "3 KV heads"),
    (TINY.replace(intermediate_size=130), dict(tensor_parallel_size=4), "intermediate_size=130"),
    (TINY, dict(tensor_parallel_size=4, draft_tensor_parallel_size=2), "draft_tensor_parallel_size"),
    (TINY, dict(tensor_parallel_size=0), "integer >= 1"),
])
def test_bad_tensor_parallel_size_is_rejected_before_anything_runs(weights, heads, cfg, kw, message):
    with compiles() as compiled, pytest.raises(ValueError, match=message):
        LLM.from_weights(cfg, weights, max_model_len=64, max_num_seqs=2, warmup=False,
                         speculative_config=spec(heads), **kw)
    assert compiled == []
