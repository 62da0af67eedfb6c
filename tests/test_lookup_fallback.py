"""Prompt lookup as a head's fallback (speculative_config with eagle/eagle3 and prompt_lookup_min/max): the rule
that picks each row's draft source, the drafts it makes the engine verify, and lossless outputs whatever it picks
(sampling with looked-up drafts, fewer than k in a row: test_adaptive_k's chi-square)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec import SamplingParams
from jaxspec.config import SpeculativeConfig
from jaxspec.engine import ngram, step
from tests.tiny import make_llm, random_prompts, tiny_weights

K, LO, HI = 3, 1, 3
MAX_TOKENS = 40
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


def _bigram_weights():
    """TINY's random weights with attention and MLP outputs zeroed: each token decides the next (a bigram model),
    so greedy text falls into cycles that the lookup predicts and a head trained on the intact model does not."""
    w = tiny_weights()
    return dataclasses.replace(w, layers=dataclasses.replace(w.layers, wo=w.layers.wo * 0,
                                                             w_down=w.layers.w_down * 0))


def test_each_row_switches_source_when_its_drafts_all_fail():
    """A row keeps the source of its last drafts while they are accepted and switches when all were rejected; the
    lookup only where it finds a match (else the head's drafts, and the row counts as the head's)."""
    spec = dataclasses.replace(step.StepSpec(target=None, draft=None, num_speculative_tokens=K, page_size=8,
                                             max_model_len=32), ngram=(LO, HI))
    history = np.zeros((5, 32), np.int32)
    history[:, :8] = [7, 8, 9, 7, 8, 9, 7, 8]  # every row but the last repeats: the lookup drafts 9, 7, 8
    history[3, :8] = np.arange(8) + 20  # row 3: nothing repeats, no match
    totals = np.full(4, 8, np.int32)
    was = np.array([False, False, True, True, False])  # the sources of the drafts just verified (slot 4: spare)
    failed = np.array([True, False, True, True])
    head = np.full((4, K), 99, np.int32)
    drafts, count, looked_up = step._lookup_fallback(jnp.asarray(history), jnp.asarray(was), jnp.arange(4),
                                                     jnp.asarray(totals), jnp.asarray(failed), jnp.asarray(head), spec)
    # row 0: the head failed -> lookup; row 1: the head succeeded -> head; row 2: lookup failed -> head;
    # row 3: lookup failed -> head (and had no match anyway)
    assert np.asarray(looked_up).tolist() == [True, False, False, False, False]
    assert np.asarray(drafts).tolist() == [[9, 7, 8], [99] * K, [99] * K, [99] * K]
    assert np.asarray(count).tolist() == [K, K, K, K]
    want, n = ngram.propose(jnp.asarray(history), jnp.arange(4), jnp.asarray(totals), K, LO, HI, 32)
    assert np.asarray(want)[0].tolist() == [9, 7, 8] and int(n[3]) == 0
    # a looked-up row whose drafts were accepted keeps looking up; one with no match gets the head's
    drafts, _, looked_up = step._lookup_fallback(jnp.asarray(history), jnp.asarray([True, False, False, True, False]),
                                                 jnp.arange(4), jnp.asarray(totals), jnp.zeros(4, bool),
                                                 jnp.asarray(head), spec)
    assert np.asarray(looked_up).tolist() == [True, False, False, False, False]
    assert np.asarray(drafts)[3].tolist() == [99] * K


def _spec(method: str, heads, **lookup) -> dict:
    return {"method": method, "model": str(heads[method].path), "num_speculative_tokens": K, **lookup}


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_fallback_drafts_what_the_head_cannot_and_stays_lossless(method, trained_heads):
    """On a bigram target the tiny head (trained on the intact model) drafts almost nothing; with the lookup as its
    fallback the cycles are drafted. Greedy outputs equal plain decoding either way: async and sync, four steps a
    dispatch, a KV pool small enough to preempt, prefixes from the prefix cache, k changing with the batch."""
    w = _bigram_weights()
    prompts = random_prompts(8, 10, 30, seed=5)
    want = [o.outputs[0].token_ids for o in make_llm(w).generate(prompts, GREEDY, use_tqdm=False)]
    head_alone = make_llm(w, speculative_config=_spec(method, trained_heads))
    assert [o.outputs[0].token_ids for o in head_alone.generate(prompts, GREEDY, use_tqdm=False)] == want
    alone = head_alone.get_metrics()["mean_acceptance_length"]
    table = {"num_speculative_tokens_per_batch_size": {"1": K, "6": 1}}
    llm = make_llm(w, speculative_config=_spec(method, trained_heads, prompt_lookup_min=LO, prompt_lookup_max=HI),
                   num_pages=30, num_scheduler_steps=4)
    for async_scheduling in (True, False, True):  # the later runs find the prompts cached
        outs = llm.generate(prompts, GREEDY, use_tqdm=False, async_scheduling=async_scheduling)
        assert [o.outputs[0].token_ids for o in outs] == want, f"async={async_scheduling}"
    m = llm.get_metrics()
    assert alone < 1.5 < 2.0 < m["mean_acceptance_length"], (alone, m["mean_acceptance_length"])
    assert m["num_preemptions"] > 0 and sum(o.num_cached_tokens for o in outs) > 0
    tabled = make_llm(w, speculative_config=_spec(method, trained_heads, prompt_lookup_max=HI) | table)
    assert [o.outputs[0].token_ids for o in tabled.generate(prompts, GREEDY, use_tqdm=False)] == want
    sampled = SamplingParams(temperature=0.8, max_tokens=MAX_TOKENS, ignore_eos=True, seed=3)
    runs = [[o.outputs[0].token_ids for o in llm.generate(prompts, sampled, use_tqdm=False, async_scheduling=a)]
            for a in (True, False)]
    assert runs[0] == runs[1]
    assert llm.llm_engine.block_manager.num_free == llm.engine_config.num_pages


def test_config():
    """With a head, either lookup length turns the fallback on (the other as vLLM settles it); neither: off."""
    parse = SpeculativeConfig.parse
    base = {"method": "eagle3", "model": "head", "num_speculative_tokens": 3}
    assert parse(base).prompt_lookup_max is None
    on = parse(base | {"prompt_lookup_max": 4})
    assert (on.prompt_lookup_min, on.prompt_lookup_max, on.is_ngram) == (4, 4, False)
    assert parse(base | {"prompt_lookup_min": 2, "prompt_lookup_max": 5, "dynamic": True}).dynamic
    with pytest.raises(ValueError, match="prompt_lookup_min=4 must be <= prompt_lookup_max=2"):
        parse(base | {"prompt_lookup_min": 4, "prompt_lookup_max": 2})
