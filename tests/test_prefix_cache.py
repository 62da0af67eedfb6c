"""Prefix caching (vLLM's automatic prefix caching, on by default): a request whose prompt starts with full pages
another request computed starts its prefill after them, sharing the pages; outputs equal an engine without the
cache (greedy, seeded, with an EAGLE head, whose draft KV comes from the cache too, and under eviction), and the
pages' reference counts, hashes and eviction keep every page accounted for."""

from __future__ import annotations

import pytest

from jaxspec import SamplingParams
from jaxspec.engine.block_manager import BlockManager
from jaxspec.engine.llm_engine import metrics_delta
from jaxspec.engine.sequence import Sequence
from tests.tiny import make_llm, random_prompts, tiny_weights

PAGE = 8


def _seq(ids: list[int], slot: int = -1) -> Sequence:
    seq = Sequence("r", list(ids), SamplingParams(), 0, slot=slot)
    seq.start_prefill()
    return seq


def test_pages_are_shared_counted_and_evicted_oldest_first():
    bm = BlockManager(num_pages=8, page_size=PAGE, pages_per_seq=8, num_slots=4, enable_prefix_caching=True)
    ids = list(range(1, 35))  # 34 tokens: full pages inside [0, 33) are pages 0-3 (32 positions)
    a = _seq(ids, slot=0)
    assert bm.share_prefix(a) == 0
    bm.grow(a, 36)  # 5 pages
    bm.register(a, 20)  # only 2 pages computed so far
    assert len(bm.cached) == 2
    bm.register(a, 34)
    assert len(bm.cached) == 4  # the fifth page holds position 33, which pairs with a sampled token: never cached
    b = _seq(ids[:27] + [99] * 7, slot=1)  # the same first 3 pages, then other tokens
    assert bm.share_prefix(b) == 3 * PAGE and b.pages == a.pages[:3]
    assert [bm.refs[p] for p in a.pages] == [2, 2, 2, 1, 1]
    bm.grow(b, 34)
    assert bm.tables[1, :5].tolist() == b.pages and b.pages[3:] != a.pages[3:]
    assert bm.num_free == 8 - 7
    a_pages = list(a.pages)
    bm.free(a)
    assert bm.num_free == 8 - 5 and list(bm.evictable) == [a_pages[3]]  # shared pages still held by b
    bm.free(b)
    assert bm.num_free == 8 and len(bm.evictable) == 4 and bm.tables[:2].max() == -1
    c = _seq(ids)  # all four cached pages again, taken back from the evictable ones
    assert bm.share_prefix(c) == 4 * PAGE and bm.num_free == 4
    bm.free(c)
    d = _seq([7] * 64, slot=2)
    bm.grow(d, 64)  # all 8 pages: the 4 free ones, then the cached ones, least recently freed first
    assert bm.num_free == 0 and not bm.cached and not bm.evictable
    bm.free(d)
    assert bm.share_prefix(_seq(ids)) == 0


def test_a_page_holding_the_last_prompt_position_is_not_cached():
    """The head's KV at the last position pairs with the token sampled there, not with a longer prompt's next one:
    a 32-token prompt caches 3 pages (positions 0-23), a 33-token one 4."""
    bm = BlockManager(num_pages=16, page_size=PAGE, pages_per_seq=8, num_slots=2, enable_prefix_caching=True)
    for length, cached in ((32, 3), (33, 4)):
        seq = _seq(list(range(100, 100 + length)), slot=0)
        bm.grow(seq, length + 2)
        bm.register(seq, length)
        assert len(bm.cached) == cached
        bm.free(seq)
    longer = _seq(list(range(100, 140)))
    assert bm.share_prefix(longer) == 4 * PAGE


def test_off_shares_nothing():
    bm = BlockManager(num_pages=8, page_size=PAGE, pages_per_seq=8, num_slots=2)
    a = _seq(list(range(40)), slot=0)
    bm.grow(a, 40)
    bm.register(a, 40)
    assert not bm.cached and bm.share_prefix(_seq(list(range(40)))) == 0


def _prompts() -> list[list[int]]:
    """Eight prompts over three shared prefixes (17-40 tokens) with their own tails."""
    heads = random_prompts(3, 17, 40, seed=11)
    tails = random_prompts(8, 1, 12, seed=12)
    return [heads[i % 3] + tails[i] for i in range(8)]


@pytest.mark.parametrize("method", [None, "eagle"])
def test_outputs_equal_an_engine_without_the_cache(trained_heads, method):
    """The same requests twice (the second call's prompts all found in the cache, up to their last full page
    before the last token) and once more with a mix of sampling settings: tokens equal an engine with
    enable_prefix_caching=False; fewer prompt tokens are prefilled, each output says how many were cached, and the
    EAGLE head accepts the same drafts (its KV for the cached positions is the one the cache kept)."""
    weights = tiny_weights()
    spec = None if method is None else {"method": method, "model": str(trained_heads[method].path),
                                        "num_speculative_tokens": 2}
    on, off = (make_llm(weights, speculative_config=spec, enable_prefix_caching=flag) for flag in (True, False))
    prompts = _prompts()
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    mixed = [SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=12, ignore_eos=True) for i in range(4)] + \
        [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, presence_penalty=0.5),
         SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, prompt_logprobs=2),
         SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2),
         SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, n=2, seed=9)]
    for params in (greedy, greedy, mixed):
        before = [llm.stats() for llm in (on, off)]
        got, want = (llm.generate(prompts, params, use_tqdm=False) for llm in (on, off))
        run = [metrics_delta(b, llm.stats()) for llm, b in zip((on, off), before)]
        assert [[c.token_ids for c in o.outputs] for o in got] == [[c.token_ids for c in o.outputs] for o in want]
        assert all(o.num_cached_tokens == 0 for o in want)
        cached = [o.num_cached_tokens for o in got]
        if params is greedy:  # (a parallel sample's own prefill, copied or cached, is not its request's count)
            assert run[0]["num_prefill_tokens"] == run[1]["num_prefill_tokens"] - sum(cached)
            assert run[0]["prefix_cache_hits"] == sum(cached) and run[1]["prefix_cache_queries"] == 0
        if method is not None:
            assert run[0]["num_accepted_tokens"] == run[1]["num_accepted_tokens"] > 0
        if params is mixed:
            # penalties and prompt logprobs read every prompt token through prefill: no hits for those
            assert cached[4] == cached[5] == 0 and cached[6] > 0
        else:
            assert all(c % 8 == 0 for c in cached) and sum(cached) > 0
    assert cached[:4] == [(len(p) - 1) // 8 * 8 for p in prompts[:4]]  # seen before: every full page it may share
    for llm in (on, off):
        assert llm.llm_engine.block_manager.num_free == llm.engine_config.num_pages


def test_eviction_under_a_small_pool_keeps_outputs():
    """A pool too small to keep every cached page: pages are evicted and reused, hits still found where they
    survive, and outputs equal the engine without the cache."""
    weights = tiny_weights()
    prompts = _prompts() * 2
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    on, off = (make_llm(weights, num_pages=40, max_num_seqs=4, decode_buckets=[4], enable_prefix_caching=flag)
               for flag in (True, False))
    for _ in range(2):
        got, want = (llm.generate(prompts, greedy, use_tqdm=False) for llm in (on, off))
        assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    bm = on.llm_engine.block_manager
    assert bm.num_free == 40 and sum(o.num_cached_tokens for o in got) > 0
    assert len(bm.cached) == len(bm.page_hash) == len(bm.evictable) <= 40


def test_reset_prefix_cache():
    """vLLM's reset_prefix_cache: after it, the same prompts find only what a fresh engine finds (with the same
    outputs); while a request holds pages it refuses (False) and forgets nothing."""
    llm = make_llm(tiny_weights())
    prompts = _prompts()
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    first = llm.generate(prompts, greedy, use_tqdm=False)
    assert sum(o.num_cached_tokens for o in llm.generate(prompts, greedy, use_tqdm=False)) > 0
    engine = llm.llm_engine
    engine.add_request("held", prompts[0], greedy)
    engine.step()
    assert not llm.reset_prefix_cache() and engine.block_manager.cached
    engine.abort_request("held")
    while engine.has_unfinished_requests():
        engine.step()
    assert llm.reset_prefix_cache()
    bm = engine.block_manager
    assert not bm.cached and not bm.evictable and len(bm.free_page_ids) == llm.engine_config.num_pages
    again = llm.generate(prompts, greedy, use_tqdm=False)
    # what a fresh engine finds (the call's own prompts share prefixes with each other), not the earlier calls'
    assert [o.num_cached_tokens for o in again] == [o.num_cached_tokens for o in first]
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in first]
