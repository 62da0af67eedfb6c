"""EAGLE speculative decoding in the engine: lossless against plain decoding, async == sync, exact stops."""

from __future__ import annotations

from functools import partial

import pytest

from jaxspec import LLM, SamplingParams
from tests import tiny
from tests.tiny import CHARS, TINY, random_prompts, tiny_weights, write_char_tokenizer

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)  # the heads trained on 64-token rows


@pytest.fixture(scope="module")
def weights():
    return tiny_weights()


@pytest.fixture(scope="module")
def prompts(trained_heads):
    heads = trained_heads
    ps = heads["eagle"].prompts[:15]
    assert ps == heads["eagle3"].prompts[:15]
    return ps + [random_prompts(1, 110, 110, seed=6)[0]]  # one runs into max_model_len (128) mid-step


make_llm = partial(tiny.make_llm, max_num_seqs=4, decode_buckets=[4], prefill_buckets=[64])


def spec(heads, method: str, k: int) -> dict:
    return {"method": method, "model": str(heads[method].path), "num_speculative_tokens": k}


@pytest.fixture(scope="module")
def plain(weights, prompts):
    outs = make_llm(weights).generate(prompts, GREEDY, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_spec_equals_plain_decoding(weights, prompts, plain, trained_heads, method, k):
    llm = make_llm(weights, speculative_config=spec(trained_heads, method, k),
                   num_pages=24)  # 16 pages = one sequence
    for async_scheduling in (True, False):
        outs = llm.generate(prompts, GREEDY, use_tqdm=False, async_scheduling=async_scheduling)
        assert [o.outputs[0].token_ids for o in outs] == plain, f"async={async_scheduling}"
    m = llm.get_metrics()
    assert m["num_preemptions"] > 0
    assert 1.2 <= m["mean_acceptance_length"] <= k + 0.8, m
    assert m["num_accepted_tokens"] == sum(m["accepted_per_position"])
    assert llm.llm_engine.block_manager.num_free == llm.engine_config.num_pages


def test_seeded_spec_sampling_async_equals_sync(weights, prompts, trained_heads):
    params = [SamplingParams(temperature=0.8, top_p=[1.0, 0.9][i % 2], top_k=[0, 30][i // 2 % 2], seed=i,
                             max_tokens=16, ignore_eos=True) for i in range(len(prompts))]
    llm = make_llm(weights, speculative_config=spec(trained_heads, "eagle3", 3))
    runs = []
    for async_scheduling in (True, False):
        runs.append([o.outputs[0].token_ids
                     for o in llm.generate(prompts, params, use_tqdm=False, async_scheduling=async_scheduling)])
    assert runs[0] == runs[1]
    alone = llm.generate([prompts[2]], params[2], use_tqdm=False)[0].outputs[0].token_ids
    assert alone == runs[0][2]


def test_stops_inside_an_accepted_run_truncate_exactly(weights, prompts, trained_heads, tmp_path):
    path = write_char_tokenizer(tmp_path)
    llm = make_llm(weights, path, speculative_config=spec(trained_heads, "eagle", 3))
    p = prompts[0]
    ref = llm.generate([p], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0].token_ids
    assert llm.get_metrics()["mean_acceptance_length"] > 1.5  # so most cut points below fall inside a run
    text = "".join(CHARS[t] for t in ref)
    for m in range(1, 16):
        out = llm.generate([p], SamplingParams(temperature=0, max_tokens=m, ignore_eos=True),
                           use_tqdm=False)[0].outputs[0]
        assert out.token_ids == ref[:m] and out.finish_reason == "length"
        first = ref.index(ref[m])
        out = llm.generate([p], SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[ref[m]]),
                           use_tqdm=False)[0].outputs[0]
        assert out.token_ids == ref[:first + 1] and out.stop_reason == ref[m]
        stop = text[m:m + 2]
        at = text.find(stop)
        out = llm.generate([p], SamplingParams(temperature=0, max_tokens=30, stop=stop), use_tqdm=False)[0].outputs[0]
        assert out.text == text[:at] and out.token_ids == ref[:at + 2] and out.finish_reason == "stop"
    j = next(i for i in range(3, 30) if ref[i] not in ref[:i])
    eos_llm = make_llm(weights, write_char_tokenizer(tmp_path / "eos", eos_token_id=ref[j]),
                       speculative_config=spec(trained_heads, "eagle", 3))
    out = eos_llm.generate([p], SamplingParams(temperature=0, max_tokens=30), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == ref[:j + 1] and out.finish_reason == "stop"


def test_async_spec_dispatches_before_reading(weights, prompts, trained_heads):
    llm = make_llm(weights, speculative_config=spec(trained_heads, "eagle", 3))
    llm.llm_engine.trace = []
    llm.generate(prompts[:4], GREEDY, use_tqdm=False)
    trace = llm.llm_engine.trace
    last = max(s for e, s in trace if e == "dispatch")
    for i, (event, step) in enumerate(trace):
        if event == "fetch" and step < last:
            assert ("dispatch", step + 1) in trace[:i], f"step {step} was read before step {step + 1} was dispatched"


@pytest.mark.parametrize("config, message", [
    (dict(num_speculative_tokens=0), "num_speculative_tokens"),
    (dict(num_speculative_tokens=17), "num_speculative_tokens"),
    (dict(method="medusa"), "method"),
])
def test_bad_speculative_config(weights, trained_heads, config, message):
    with pytest.raises(ValueError, match=message):
        make_llm(weights, speculative_config={**spec(trained_heads, "eagle", 3), **config})


def test_head_that_does_not_fit_the_target(weights, trained_heads):
    other = TINY.replace(hidden_size=32, num_heads=2, intermediate_size=64)
    from jaxspec.models import llama
    import jax
    w = llama.init(other, jax.random.key(3))
    with pytest.raises(ValueError, match="hidden"):
        LLM.from_weights(other, w, max_model_len=64, max_num_seqs=2, warmup=False,
                         speculative_config=spec(trained_heads, "eagle", 3))
