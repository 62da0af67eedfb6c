"""Prompt lookup as a head's fallback (speculative_config with eagle/eagle3 and prompt_lookup_min/max): the rule
that picks each row's draft source, the drafts it makes the engine verify, and lossless outputs whatever it picks
(sampling with looked-up drafts, fewer than k in a row: test_adaptive_k's chi-square)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec import SamplingParams
from jaxspec.config import SpeculativeConfig, has_lookup_fallback
from jaxspec.engine import step
from tests.tiny import async_and_sync_tokens, bigram_weights, make_llm, random_prompts

K, LO, HI = 3, 1, 3
MAX_TOKENS = 40
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


def test_a_row_looks_up_only_where_the_lookup_was_accepted_further_than_the_head():
    """After a step that verified drafts, a row drafts by lookup (where it finds a match) only if the lookup's
    drafts, its own or the ones it kept, agree with the tokens the target emitted strictly further than the
    head's; ties go to the head. The source not used keeps its drafts (NO_DRAFT past their count)."""
    spec = dataclasses.replace(step.StepSpec(target=None, draft=None, num_speculative_tokens=K, page_size=8,
                                             max_model_len=32), ngram=(LO, HI))
    history = np.zeros((9, 32), np.int32)
    history[:, :8] = [7, 8, 9, 7, 8, 9, 7, 8]  # the lookup drafts 9, 7, 8
    history[5, :8] = np.arange(8) + 20  # row 5: nothing repeats, no match
    totals = np.full(8, 8, np.int32)
    X = step.NO_DRAFT
    rows = [  # (drafts looked up, the other source's, emitted, accepted, verified, next drafts looked up)
        (False, [5, X, X], [5, -1, -1, -1], 0, True, True),  # head 0, lookup 1: lookup
        (False, [5, 6, X], [4, -1, -1, -1], 0, True, False),  # both 0: head
        (False, [5, 6, 2], [5, 6, 1, -1], 2, True, False),  # both 2: head
        (True, [5, 7, 2], [5, 7, -1, -1], 1, True, False),  # lookup 1, head 2: head
        (True, [5, 6, 1], [5, 6, 2, 3], 3, True, True),  # lookup 3, head 2: lookup
        (False, [5, X, X], [5, -1, -1, -1], 0, True, False),  # lookup better but no match now: head
        (True, [5, 6, 2], [5, 6, 2, 3], 3, True, False),  # both 3: head
        (True, [5, X, X], [4, -1, -1, -1], 0, False, True),  # nothing verified (a k = 0 step): as it was
    ]
    state = dataclasses.replace(step.SlotState.init(8, K, 128, history_len=32, lookup_fallback=True),
                                looked_up=jnp.asarray([r[0] for r in rows] + [False]),
                                unused_drafts=jnp.asarray([r[1] for r in rows] + [[X] * K], jnp.int32))
    head = np.tile(np.array([[99, 98, 97]], np.int32), (8, 1))
    drafts, count, looked_up, unused = step._lookup_fallback(
        jnp.asarray(history), state, jnp.arange(8), jnp.asarray(totals), jnp.asarray([r[2] for r in rows]),
        jnp.asarray([r[3] for r in rows]), jnp.asarray([r[4] for r in rows]), jnp.asarray(head), spec)
    use = [r[5] for r in rows]
    assert np.asarray(looked_up).tolist() == use + [False]
    lookup, kept = [9, 7, 8], [99, 98, 97]
    assert np.asarray(drafts).tolist() == [lookup if u else kept for u in use]
    assert np.asarray(count).tolist() == [K] * 8
    no_match = [X] * K
    assert np.asarray(unused).tolist() == [kept if u else (no_match if i == 5 else lookup)
                                           for i, u in enumerate(use)] + [no_match]


def _spec(method: str, heads, **lookup) -> dict:
    return {"method": method, "model": str(heads[method].path), "num_speculative_tokens": K, **lookup}


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_fallback_drafts_what_the_head_cannot_and_stays_lossless(method, trained_heads):
    """On a bigram target the tiny head (trained on the intact model) drafts almost nothing; with the lookup as its
    fallback the cycles are drafted. Greedy outputs equal plain decoding either way: async and sync, four steps a
    dispatch, a KV pool small enough to preempt, prefixes from the prefix cache, k changing with the batch."""
    w = bigram_weights()
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
    runs = async_and_sync_tokens(llm, prompts, sampled)
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


def test_has_lookup_fallback_reads_a_config_as_parse_does():
    """The labels' test (jaxspec generate, the benchmark) agrees with the parsed config on every form of it."""
    head = {"method": "eagle3", "model": "head", "num_speculative_tokens": 3}
    for spec in [head, head | {"prompt_lookup_min": 2}, {**head, "method": "eagle", "prompt_lookup_max": 5},
                 {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5},
                 {"model": "[ngram]", "num_speculative_tokens": 3, "prompt_lookup_min": 2},
                 {"model": "head", "num_speculative_tokens": 3, "prompt_lookup_min": 2}]:
        parsed = SpeculativeConfig.parse(spec)
        assert has_lookup_fallback(spec) == (parsed.prompt_lookup_max is not None and not parsed.is_ngram), spec
