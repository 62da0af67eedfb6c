"""The engine as a step machine (LLMEngine.add_request / step / abort_request) and streaming outputs."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxspec import RequestOutputKind, SamplingParams
from jaxspec.models import llama
from tests.tiny import TINY, greedy_reference, make_llm, random_prompts, tiny_weights, write_byte_tokenizer


@pytest.fixture(scope="module")
def weights():
    return tiny_weights()


def _all_free(llm) -> bool:
    engine = llm.llm_engine
    return (engine.block_manager.num_free == llm.engine_config.num_pages and
            sorted(engine.scheduler.free_slots) == list(range(llm.engine_config.max_num_seqs)) and
            not engine.has_unfinished_requests() and not engine.in_flight)


@pytest.mark.parametrize("method", [None, "eagle"])
@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_requests_added_and_aborted_while_steps_are_in_flight(weights, trained_heads, method, sampling):
    """8 requests, a step, 4 more while it is in flight, then one aborted mid-prefill and one mid-decode: every
    other request equals `generate` on it alone, async and sync; the aborted end with "abort"; nothing leaks."""
    spec = None if method is None else {"method": method, "model": str(trained_heads[method].path),
                                        "num_speculative_tokens": 3}
    # (no prefix cache: the solo runs below would have cached every prompt, and the prefills here are the point)
    llm = make_llm(weights, speculative_config=spec, max_num_batched_tokens=16, max_prefill_seqs=2,
                   enable_prefix_caching=False)
    prompts = trained_heads["eagle"].prompts[:8] + random_prompts(4, 3, 10, seed=5)
    prompts[9] = random_prompts(1, 60, 60, seed=6)[0]  # four prefill chunks of 16 tokens
    params = [SamplingParams(temperature=0 if sampling == "greedy" else 0.9, top_p=0.95, seed=40 + i,
                             max_tokens=[30, 12, 30, 5][i % 4], ignore_eos=True) for i in range(12)]
    solo = [llm.generate([p], q, use_tqdm=False)[0].outputs[0].token_ids for p, q in zip(prompts, params)]
    engine = llm.llm_engine
    for async_scheduling in (True, False):
        final = {}

        def step():
            for out in engine.step(async_scheduling):
                assert out.request_id not in final or not final[out.request_id].finished, "output after the last"
                final[out.request_id] = out

        for i in range(8):
            engine.add_request(f"r{i}", prompts[i], params[i])
        step()
        assert engine.in_flight
        for i in range(8, 12):
            engine.add_request(f"r{i}", prompts[i], params[i])
        long_seq = engine.requests["r9"]
        while long_seq.num_prefilled == 0:
            step()
        assert 0 < long_seq.num_prefilled < len(prompts[9]) and not long_seq.decoding
        engine.abort_request("r9")
        while len(engine.requests["r2"].output_token_ids) < 3:
            step()
        assert not engine.requests["r2"].is_finished
        engine.abort_request(["r2", "no-such-request"])
        while engine.has_unfinished_requests():
            step()
        assert set(final) == {f"r{i}" for i in range(12)}
        for i in range(12):
            out = final[f"r{i}"]
            assert out.finished
            if i in (2, 9):
                assert out.outputs[0].finish_reason == "abort"
                assert out.outputs[0].token_ids == solo[i][:len(out.outputs[0].token_ids)]
            else:
                assert out.outputs[0].token_ids == solo[i], f"r{i} async={async_scheduling}"
                assert out.outputs[0].finish_reason == "length"
        assert _all_free(llm)


def test_add_request_rejects_duplicates_and_bad_requests_before_queueing(weights):
    llm = make_llm(weights)
    engine = llm.llm_engine
    engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=3))
    with pytest.raises(ValueError, match="'a'.*already"):
        engine.add_request("a", [4, 5], SamplingParams(max_tokens=3))
    with pytest.raises(ValueError, match="'b'.*vocabulary"):
        engine.add_request("b", [4, 500], SamplingParams(max_tokens=3))
    with pytest.raises(ValueError, match="request ids are strings"):
        engine.add_request(7, [4, 5], SamplingParams(max_tokens=3))
    assert list(engine.requests) == ["a"] and len(engine.scheduler.waiting) == 1
    while engine.has_unfinished_requests():
        engine.step()
    assert _all_free(llm)


def test_random_arrivals_and_aborts_free_every_page(weights):
    """2,000 requests arriving between steps, 10 % aborted at random moments: the survivors equal the plain
    full-sequence loop, and the pool ends empty."""
    llm = make_llm(weights, max_num_seqs=8, num_pages=16)  # one 128-token sequence; 8 short ones preempt
    engine = llm.llm_engine
    rng = np.random.default_rng(11)
    prompts = random_prompts(2000, 1, 12, seed=12)
    lengths = rng.integers(1, 9, len(prompts))
    abort_at = {i: int(rng.integers(1, 6)) for i in np.flatnonzero(rng.random(len(prompts)) < 0.1)}
    final, added, steps_since = {}, 0, {}
    while added < len(prompts) or engine.has_unfinished_requests():
        for _ in range(rng.poisson(1.5) if added < len(prompts) else 0):
            if added < len(prompts):
                engine.add_request(str(added), prompts[added],
                                   SamplingParams(temperature=0, max_tokens=int(lengths[added]), ignore_eos=True))
                steps_since[added] = 0
                added += 1
        for i, when in list(abort_at.items()):
            if i in steps_since and steps_since[i] == when:
                engine.abort_request(str(i))
                del abort_at[i]
        for out in engine.step():
            final[int(out.request_id)] = out.outputs[0]
        for i in steps_since:
            steps_since[i] += 1
    assert len(final) == len(prompts)
    aborted = [i for i, o in final.items() if o.finish_reason == "abort"]
    assert 50 < len(aborted) < 200
    assert llm.get_metrics()["num_preemptions"] > 0
    survivors = [i for i in range(len(prompts)) if final[i].finish_reason != "abort"]
    for i in survivors[::7]:  # the oracle is slow-ish: every 7th survivor (about 260 requests)
        assert final[i].token_ids == greedy_reference(weights, TINY, prompts[i], int(lengths[i])), i
    assert all(len(final[i].token_ids) == lengths[i] for i in survivors)
    assert _all_free(llm)


# ---- streaming

# A byte-level vocabulary (id = byte) and a one-layer model whose greedy next token is a fixed successor of the
# last one, walking a cycle through the bytes of CYCLE: every character of 2, 3 and 4 bytes is split over tokens,
# and so over steps.
CYCLE = "aé€😀bжz"


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory):
    path = write_byte_tokenizer(tmp_path_factory.mktemp("bytes"))
    cycle = list(CYCLE.encode())
    assert len(set(cycle)) == len(cycle)
    cfg = llama.Config(vocab_size=256, hidden_size=256, intermediate_size=32, num_layers=1, num_heads=2,
                       num_kv_heads=1, head_dim=16)
    w = llama.init(cfg, jax.random.key(0))
    zero = lambda a: a * 0  # noqa: E731
    w.layers = jax.tree.map(zero, w.layers)
    w.layers.attn_norm, w.layers.mlp_norm = w.layers.attn_norm + 1, w.layers.mlp_norm + 1
    succ = np.arange(256)
    succ[cycle] = np.roll(cycle, -1)
    w.embed = np.eye(256, dtype=np.float32)  # one-hot: the normed hidden state is the last token's indicator
    head = np.zeros((256, 256), np.float32)
    head[np.arange(256), succ] = 1.0
    w.lm_head = head
    return cfg, w, path


@pytest.mark.parametrize("method", [None, "spec"])
def test_streamed_deltas_add_up_to_the_final_text(byte_model, tmp_path, method):
    """32 streamed requests over multi-byte characters split across tokens and steps: each delta extends the text
    (never a broken character later rewritten), the deltas add up to the final text, which equals `generate`'s,
    and text arrives before the request finishes. Stop strings are held back, never streamed then cut."""
    from jaxspec.convert.eagle import save_eagle
    from jaxspec.models import eagle

    cfg, w, path = byte_model
    spec = None
    if method:  # a random head: drafts mostly rejected, but steps emit several tokens when they are accepted
        hcfg = eagle.EagleConfig.from_target(cfg, "eagle")
        save_eagle(str(tmp_path / "head"), hcfg, eagle.init(hcfg, jax.random.key(1)))
        spec = {"method": "eagle", "model": str(tmp_path / "head"), "num_speculative_tokens": 2}
    llm = make_llm(w, path, cfg=cfg, speculative_config=spec, max_num_seqs=8)
    cycle = list(CYCLE.encode())
    ends = np.cumsum([len(c.encode()) for c in CYCLE]) - 1  # each character's last byte: outputs start whole
    prompts = [[cycle[ends[i % len(ends)]]] for i in range(32)]
    params = [SamplingParams(temperature=0, max_tokens=20 + i, stop=["жz"] if i % 3 == 0 else None)
              for i in range(32)]
    texts, finished, early = {}, {}, set()
    for out in llm.generate_stream(prompts, params):
        rid = out.request_id
        assert rid not in finished
        texts[rid] = texts.get(rid, "") + out.outputs[0].text
        if out.finished:  # (max_tokens may cut a character: the final delta then ends in its replacement)
            finished[rid] = out.outputs[0]
        elif out.outputs[0].text:
            early.add(rid)
            assert "\ufffd" not in out.outputs[0].text, "a character streamed before all its bytes came"
    assert len(finished) == 32
    assert {rid for rid in finished if texts[rid]} <= early  # (a stop may leave nothing to say)
    ref = llm.generate(prompts, params, use_tqdm=False)
    for i, rid in enumerate(sorted(finished, key=int)):
        assert texts[rid] == ref[i].outputs[0].text, rid
        assert not params[i].stop or "жz" not in texts[rid]
        assert finished[rid].finish_reason == ref[i].outputs[0].finish_reason
    assert any(o.outputs[0].finish_reason == "stop" for o in ref)
    assert _all_free(llm)


def test_closing_a_stream_early_aborts_its_requests(byte_model):
    cfg, w, path = byte_model
    llm = make_llm(w, path, cfg=cfg)
    stream = llm.generate_stream([[97], [98]], SamplingParams(temperature=0, max_tokens=60))
    next(stream)
    stream.close()
    assert _all_free(llm)
    # generate gives whole outputs whatever output_kind the params carry
    outs = llm.generate([[97]], SamplingParams(temperature=0, max_tokens=5, output_kind=RequestOutputKind.DELTA),
                        use_tqdm=False)
    assert outs[0].outputs[0].text == CYCLE[1:3] and outs[0].outputs[0].finish_reason == "length"
