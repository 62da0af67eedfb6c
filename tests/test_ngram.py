"""N-gram speculation (vLLM's method "ngram"): the device lookup is vLLM's proposer, the engine drafts and counts
as vLLM would at every step, and outputs stay lossless (sampling with fewer drafts than k in a row:
test_adaptive_k's chi-square)."""

from __future__ import annotations


import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec import SamplingParams
from jaxspec.config import SpeculativeConfig
from jaxspec.engine import ngram
from tests.tiny import async_and_sync_tokens, bigram_weights, make_llm, random_prompts, tiny_weights

K, LO, HI = 3, 1, 3
SPEC = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": LO, "prompt_lookup_max": HI}
MAX_TOKENS = 40


def vllm_proposer(tokens: list[int], min_n: int, max_n: int, max_model_len: int, k: int) -> list[int]:
    """The oracle: vLLM's NgramProposer lookup (_find_longest_matched_ngram_and_propose_tokens), a KMP pass over
    the reversed tokens, restated in plain Python."""
    total = len(tokens)
    k = min(k, max_model_len - total)
    if total < min_n or k <= 0:
        return []
    r = tokens[::-1]
    lps = [0] * max_n
    longest, position, prev, i = 0, 0, 0, 1
    while i < total:
        if r[prev] == r[i]:
            prev += 1
            if prev >= longest:
                longest, position = prev, i
            if i < max_n:
                lps[i] = prev
            if prev == max_n:
                prev = lps[max_n - 1]
            i += 1
        elif prev != 0:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    return tokens[start:start + min(k, total - start)]


def test_lookup_is_vllms_proposer():
    """Random histories over 2-5 token values (many repeats), every length up to max_model_len and stale tokens
    past each sequence's end: the device's drafts are vLLM's, for assorted n-gram ranges, k and limits."""
    rng = np.random.default_rng(0)
    L, B = 40, 8
    for _ in range(40):
        lo = int(rng.integers(1, 4))
        hi, k, limit = int(rng.integers(lo, 6)), int(rng.integers(1, 6)), int(rng.integers(16, L + 1))
        history = rng.integers(0, int(rng.integers(2, 6)), (B + 1, L)).astype(np.int32)
        totals = rng.integers(1, limit + 1, B).astype(np.int32)
        drafts, count = ngram.propose(jnp.asarray(history), jnp.arange(B), jnp.asarray(totals), k, lo, hi, limit)
        for b in range(B):
            want = vllm_proposer(history[b, :totals[b]].tolist(), lo, hi, limit, k)
            assert np.asarray(drafts)[b, :int(count[b])].tolist() == want, (history[b, :totals[b]], lo, hi, k)


def _replay(prompts: list[list[int]], longer: list[list[int]]) -> tuple[int, int, int]:
    """vLLM's counters (drafts, draft tokens, accepted tokens) for greedy requests of MAX_TOKENS tokens, stepped
    on the host: each step drafts with the oracle from everything so far and accepts the drafts that agree with the
    greedy text (`longer`: the same requests run K tokens further, for what the last step verifies past the end)."""
    drafts = draft_tokens = accepted = 0
    for prompt, text in zip(prompts, longer):
        t = 1  # the prefill's token
        while t < MAX_TOKENS:
            d = vllm_proposer(prompt + text[:t], LO, HI, 128, K)
            a = 0
            while a < len(d) and d[a] == text[t + a]:
                a += 1
            drafts, draft_tokens, accepted, t = drafts + bool(d), draft_tokens + len(d), accepted + a, t + a + 1
    return drafts, draft_tokens, accepted


@pytest.mark.parametrize("copying", [True, False])
def test_engine_drafts_and_counts_as_vllm(copying):
    """Greedy: outputs equal plain decoding, async and sync, and the spec-decoding counters equal a host replay of
    vLLM's proposer, also when the prompts' prefixes come from the prefix cache (their history is written apart
    from the prefill)."""
    w = bigram_weights() if copying else tiny_weights()  # copying: greedy text cycles the lookup predicts
    prompts = random_prompts(6, 10, 30, seed=4)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    plain = make_llm(w)
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, greedy, use_tqdm=False)]
    further = SamplingParams(temperature=0, max_tokens=MAX_TOKENS + K, ignore_eos=True)
    longer = [list(o.outputs[0].token_ids) for o in plain.generate(prompts, further, use_tqdm=False)]
    expected = _replay(prompts, longer)
    llm = make_llm(w, speculative_config=SPEC)
    for async_scheduling in (True, False, True):  # the second and third runs find the prompts cached
        before = llm.get_metrics()
        outs = llm.generate(prompts, greedy, use_tqdm=False, async_scheduling=async_scheduling)
        assert [o.outputs[0].token_ids for o in outs] == want
        m = llm.get_metrics()
        assert tuple(m[c] - before[c] for c in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")) == expected
    assert sum(o.num_cached_tokens for o in outs) > 0
    assert (m["mean_acceptance_length"] > 3.0) if copying else (m["mean_acceptance_length"] < 1.5)


def test_lossless_with_parallel_samples_preemption_and_multi_step():
    """Two samples per prompt (the second's prompt copied, not prefilled) at a temperature so low that sampling is
    greedy, a KV pool small enough to preempt, four steps per dispatch, k switching between 1 and 3 with the
    number of rows (a step then verifies the drafts one made for another k): both samples are plain greedy
    decoding's text; seeded sampling gives the same tokens async and sync."""
    w = bigram_weights()
    prompts = random_prompts(8, 10, 30, seed=5)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    want = [[o.outputs[0].token_ids] * 2 for o in make_llm(w).generate(prompts, greedy, use_tqdm=False)]
    table = {"num_speculative_tokens_per_batch_size": {"1": K, "6": 1}}
    llm = make_llm(w, speculative_config=SPEC | table, num_pages=30, num_scheduler_steps=4)
    cold = SamplingParams(temperature=1e-3, max_tokens=MAX_TOKENS, ignore_eos=True, n=2, seed=1)
    outs = llm.generate(prompts, cold, use_tqdm=False)
    assert [[s.token_ids for s in o.outputs] for o in outs] == want
    assert llm.get_metrics()["num_preemptions"] > 0
    assert all(n > 0 for n in llm.llm_engine.spec_policy.num_steps_by_k.values())
    sampled = SamplingParams(temperature=0.8, max_tokens=MAX_TOKENS, ignore_eos=True, seed=3)
    runs = async_and_sync_tokens(llm, prompts, sampled)
    assert runs[0] == runs[1]
    assert llm.llm_engine.block_manager.num_free == llm.engine_config.num_pages


def test_config_is_vllms():
    """vLLM's defaults and checks: both lengths 5 when neither is given, else the missing one equal to the other;
    the method's other names; no head, no dynamic k."""
    parse = SpeculativeConfig.parse
    assert (parse({"method": "ngram", "num_speculative_tokens": 4}).prompt_lookup_min,
            parse({"method": "ngram", "num_speculative_tokens": 4}).prompt_lookup_max) == (5, 5)
    one = parse({"method": "[ngram]", "num_speculative_tokens": 2, "prompt_lookup_max": 3})
    assert (one.method, one.model, one.prompt_lookup_min, one.prompt_lookup_max) == ("ngram", None, 3, 3)
    assert parse({"model": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2}).prompt_lookup_max == 2
    assert parse({"method": "ngram_gpu", "num_speculative_tokens": 2}).is_ngram
    base = {"method": "ngram", "num_speculative_tokens": 3}
    for extra, message in [({"prompt_lookup_min": 4, "prompt_lookup_max": 2}, "must be <= prompt_lookup_max"),
                           ({"prompt_lookup_min": 0}, "prompt_lookup_min must be an integer >= 1"),
                           ({"prompt_lookup_max": 2.5}, "prompt_lookup_max must be"),
                           ({"dynamic": True}, "dynamic is for draft heads"),
                           ({"model": "weights/eagle-smollm2-135m-instruct"}, "uses no draft model"),
                           ({"num_speculative_tokens": 0}, "num_speculative_tokens must be")]:
        with pytest.raises(ValueError, match=message):
            parse(base | extra)
    with pytest.raises(ValueError, match=r"unknown keys \['prompt_lookup'\]"):
        parse(base | {"prompt_lookup": 4})
