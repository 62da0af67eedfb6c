"""vLLM's sampling options in the engine, with and without EAGLE, async and sync, against independent oracles:
transformers (logprobs, repetition_penalty), a plain full-sequence loop applying each processor in numpy, and
single requests (n samples)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from jaxspec import SamplingParams
from jaxspec.convert.hf_llama import save_hf_llama
from jaxspec.engine.input_processor import sample_seed
from tests import tiny
from tests.test_processors import ref_logits
from tests.tiny import CHARS, TINY, random_prompts, tiny_weights, write_char_tokenizer

make_llm = partial(tiny.make_llm, max_num_seqs=8, decode_buckets=[8], prefill_buckets=[64])
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def weights():
    return tiny_weights()


@pytest.fixture(scope="module")
def hf(tmp_path_factory, weights) -> LlamaForCausalLM:
    """The tiny target in transformers (fp32, eager attention): the oracle. One torch thread: a tiny model's
    forward is 10x faster so on a busy CPU."""
    path = tmp_path_factory.mktemp("hf")
    save_hf_llama(TINY, weights, path)
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    model.generation_config.eos_token_id = None  # generate runs to max_new_tokens, as ignore_eos does
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield model
    torch.set_num_threads(threads)


def hf_logits(hf, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].double().numpy()


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return write_char_tokenizer(tmp_path_factory.mktemp("chars"))


@pytest.fixture(scope="module")
def llms(weights, trained_heads, tokenizer_dir):
    """{"plain": k = 0, "eagle": EAGLE-1 with k = 3}, over the tiny target and the character tokenizer."""
    spec = {"method": "eagle", "model": str(trained_heads["eagle"].path), "num_speculative_tokens": 3}
    return {"plain": make_llm(weights, tokenizer_dir), "eagle": make_llm(weights, tokenizer_dir,
                                                                         speculative_config=spec)}


@pytest.fixture(scope="module")
def prompts(trained_heads):
    return trained_heads["eagle"].prompts[:16]  # the head drafts well on most of these


# ---- logprobs

SAMPLING = {"greedy": dict(temperature=0.0), "seeded": dict(temperature=0.8),
            "top_k": dict(temperature=0.8, top_k=20), "greedy_presence": dict(temperature=0.0, presence_penalty=0.5)}


def expected_logprobs(hf, prompt, tokens, c) -> np.ndarray:
    """[len(tokens), V]: the log of the distribution each token was sampled from, recomputed from the whole
    sequence: transformers' logits, the processors in numpy, / temperature (1 for greedy), top-k."""
    logits = hf_logits(hf, prompt + tokens)[len(prompt) - 1:-1]
    out = []
    for i, row in enumerate(logits):
        x = ref_logits(row, prompt, tokens[:i], c) / (c["temperature"] or 1.0)
        if c.get("top_k") and c["temperature"]:
            x = np.where(x >= np.sort(x)[-c["top_k"]], x, -np.inf)
        out.append(log_softmax(x))
    return np.array(out)


@pytest.mark.parametrize("sampling", list(SAMPLING))
def test_logprobs_equal_transformers_recomputation(hf, llms, prompts, sampling):
    """16 prompts, 5 logprobs and 3 prompt logprobs each, with EAGLE on and off, async and sync: the sampled
    token's logprob and rank, the top 5 and the cumulative logprob equal the recomputation (< 1e-3)."""
    c = SAMPLING[sampling]
    params = [SamplingParams(**c, seed=i, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5, prompt_logprobs=3)
              for i in range(len(prompts))]
    runs = {(name, a): llm.generate(prompts, params, use_tqdm=False, async_scheduling=a)
            for name, llm in llms.items() for a in (True, False)}
    first = runs["plain", True]
    for key, outs in runs.items():
        # async and sync run the same steps: identical. Greedy tokens are the same with EAGLE; random ones follow
        # the same distribution but not the same draws (an accepted draft is not the token Gumbel-max picks).
        other = runs[key[0], not key[1]]
        assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in other], key
        assert [o.outputs[0].logprobs for o in outs] == [o.outputs[0].logprobs for o in other], key
        if not c["temperature"]:
            assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in first], key
            for o, f in zip(outs, first):  # EAGLE's verify rounds differently, far below 1e-3
                for got, ref in zip(o.outputs[0].logprobs, f.outputs[0].logprobs):
                    assert got.keys() == ref.keys()
                    np.testing.assert_allclose([v.logprob for v in got.values()],
                                               [v.logprob for v in ref.values()], atol=1e-4, rtol=0)
    for key, outs in runs.items():
        for prompt, out in zip(prompts, outs):
            comp = out.outputs[0]
            want = expected_logprobs(hf, prompt, comp.token_ids, c)
            assert len(comp.logprobs) == len(comp.token_ids) == MAX_TOKENS
            for i, (token, got) in enumerate(zip(comp.token_ids, comp.logprobs)):
                assert list(got)[0] == token and got[token].rank == 1 + int((want[i] > want[i, token]).sum())
                top = np.argsort(-want[i], kind="stable")[:5]
                assert set(got) == set(top) | {token}, (key, i)
                np.testing.assert_allclose([got[t].logprob for t in got], want[i, list(got)], atol=1e-3, rtol=0)
                assert all(got[t].rank == r + 1 for r, t in enumerate(top) if t != token)
            np.testing.assert_allclose(comp.cumulative_logprob, want[np.arange(MAX_TOKENS), comp.token_ids].sum(),
                                       atol=1e-3 * MAX_TOKENS, rtol=0)
            prompt_lp = log_softmax(hf_logits(hf, prompt)[:-1])
            assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
            for i, got in enumerate(out.prompt_logprobs[1:]):
                token = prompt[i + 1]
                assert set(got) == set(np.argsort(-prompt_lp[i])[:3]) | {token}
                np.testing.assert_allclose([got[t].logprob for t in got], prompt_lp[i, list(got)], atol=1e-3, rtol=0)


@pytest.mark.parametrize("sampling", ["greedy", "seeded", "top_k"])
def test_logprobs_alone_sample_as_the_plain_step(llms, prompts, sampling):
    """A batch that wants logprobs alone runs the extended step without processors: the same tokens as the plain
    sampler, draw for draw, EAGLE on and off. Its requests' processor counts are never committed, so in a batch
    with a penalized request (the processors variant) they must still score exactly as alone."""
    c = SAMPLING[sampling]
    for name, llm in llms.items():
        def run(extra: dict, n: int = len(prompts)):
            params = [SamplingParams(**c, seed=i, max_tokens=MAX_TOKENS, ignore_eos=True, **extra) for i in range(n)]
            return llm.generate(prompts[:n], params, use_tqdm=False)
        plain, alone = run({}), run({"logprobs": 5})
        assert [o.outputs[0].token_ids for o in alone] == [o.outputs[0].token_ids for o in plain], name
        # two steps of logprobs alone, then the same requests beside a penalized one (its own pages and slot)
        mixed_params = [SamplingParams(**c, seed=i, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
                        for i in range(4)]
        engine = llm.llm_engine
        for i, p in enumerate(mixed_params):
            engine.add_request(f"mixed-{name}-{i}", prompts[i], p)
        for _ in range(3):
            engine.step()
        engine.add_request(f"mixed-{name}-penalized", prompts[4], SamplingParams(
            temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, presence_penalty=2.0, frequency_penalty=1.0))
        finished = {}
        while engine.has_unfinished_requests():
            finished |= {o.request_id: o for o in engine.step() if o.finished}
        for i, want in enumerate(alone[:4]):
            got = finished[f"mixed-{name}-{i}"].outputs[0]
            assert got.token_ids == want.outputs[0].token_ids, (name, i)
            for g, w in zip(got.logprobs, want.outputs[0].logprobs):
                assert g.keys() == w.keys()
                np.testing.assert_allclose([v.logprob for v in g.values()], [v.logprob for v in w.values()],
                                           rtol=1e-5, atol=1e-6)


def test_prompt_logprobs_of_a_chunked_prompt(hf, llms):
    """A 100-token prompt prefilled in two chunks (64 + 36): every prompt token scored once, as transformers."""
    prompt = random_prompts(1, 100, 100, seed=12)[0]
    out = llms["plain"].generate([prompt], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=0),
                                 use_tqdm=False)[0]
    want = log_softmax(hf_logits(hf, prompt)[:-1])[np.arange(99), prompt[1:]]
    assert [list(d) for d in out.prompt_logprobs[1:]] == [[t] for t in prompt[1:]]
    np.testing.assert_allclose([d[t].logprob for d, t in zip(out.prompt_logprobs[1:], prompt[1:])], want,
                               atol=1e-3, rtol=0)


def test_logprobs_zero_and_decoded_tokens(llms, prompts):
    """logprobs=0: the sampled token only; decoded_token is the token's text (None with detokenize=False)."""
    out = llms["plain"].generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4, logprobs=0),
                                 use_tqdm=False)[0].outputs[0]
    assert [list(d) for d in out.logprobs] == [[t] for t in out.token_ids]
    assert [d[t].decoded_token for d, t in zip(out.logprobs, out.token_ids)] == [CHARS[t] for t in out.token_ids]
    out = llms["plain"].generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4, logprobs=1,
                                                             detokenize=False), use_tqdm=False)[0].outputs[0]
    assert out.text == "" and all(lp.decoded_token is None for d in out.logprobs for lp in d.values())
    plain = llms["plain"].generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert plain[0].outputs[0].logprobs is None and plain[0].outputs[0].cumulative_logprob is None
    assert plain[0].prompt_logprobs is None


# ---- processors: the engine (plain and EAGLE) against a full-sequence greedy loop applying them in numpy


@pytest.fixture(scope="module")
def favourites(hf, prompts):
    """Tokens the plain greedy outputs use most, and a bigram of the first output: processors with an effect."""
    outs = [oracle_greedy(hf, p, MAX_TOKENS, {}) for p in prompts[:8]]
    common = np.argsort(-np.bincount(np.concatenate(outs), minlength=TINY.vocab_size))
    return common[:4].tolist(), outs[0][2:4]


def oracle_greedy(hf, prompt, n, c) -> list[int]:
    """Greedy decoding by recomputing every step from the whole sequence, processing the logits in numpy; stops
    at a stop token like the engine."""
    out: list[int] = []
    while len(out) < n:
        out.append(int(np.argmax(ref_logits(hf_logits(hf, prompt + out)[-1], prompt, out, c))))
        if out[-1] in c.get("stop_ids", []):
            break
    return out


def processor_configs(favourites) -> dict[str, dict]:
    (t1, t2, t3, _), bigram = favourites
    return {"repetition": dict(repetition_penalty=1.3), "presence": dict(presence_penalty=0.8),
            "frequency": dict(frequency_penalty=0.6), "logit_bias": dict(logit_bias={t1: -3.0, t3: 2.0}),
            "allowed": dict(allowed=[t for t in range(TINY.vocab_size) if t not in (t1, t2)]),
            "bad_words": dict(bad_words=[bigram, [t2]]), "min_tokens": dict(min_tokens=6, stop_ids=[t1]),
            "everything": dict(repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.2,
                               logit_bias={t3: 1.0}, bad_words=[bigram], min_tokens=4, stop_ids=[t2])}


def engine_params(c, max_tokens: int) -> SamplingParams:
    """The SamplingParams for an oracle config (bad words as text: the character tokenizer spells them)."""
    return SamplingParams(
        temperature=0, max_tokens=max_tokens, ignore_eos=True, repetition_penalty=c.get("repetition_penalty", 1.0),
        presence_penalty=c.get("presence_penalty", 0.0), frequency_penalty=c.get("frequency_penalty", 0.0),
        logit_bias=c.get("logit_bias"), allowed_token_ids=c.get("allowed"), min_tokens=c.get("min_tokens", 0),
        stop_token_ids=c.get("stop_ids", []), bad_words=["".join(CHARS[t] for t in w) for w in c.get("bad_words", [])])


def test_spec_greedy_equals_plain_greedy_and_the_oracle_under_every_processor(hf, llms, prompts, favourites):
    """8 prompts, 12 tokens, each processor alone and all together: plain decoding, EAGLE and the numpy loop give
    the same tokens (all together: async and sync), and each processor changed the output."""
    base = [oracle_greedy(hf, p, MAX_TOKENS, {}) for p in prompts[:8]]
    before = llms["eagle"].get_metrics()
    for name, c in processor_configs(favourites).items():
        want = [oracle_greedy(hf, p, MAX_TOKENS, c) for p in prompts[:8]]
        assert want != base, name
        for key, llm in llms.items():
            for a in (True, False) if name == "everything" else (True,):
                outs = llm.generate(prompts[:8], engine_params(c, MAX_TOKENS), use_tqdm=False, async_scheduling=a)
                assert [o.outputs[0].token_ids for o in outs] == want, (name, key, a)
    after = llms["eagle"].get_metrics()
    accepted = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    assert accepted / (after["num_drafts"] - before["num_drafts"]) > 0.1  # drafts were accepted and verified


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_drafts_are_processed_as_the_target(weights, trained_heads, tokenizer_dir, prompts, method):
    """logit_bias +100 on one token (in EAGLE-3's draft vocabulary) makes it the target's greedy choice at every
    position; the head drafts from its logits processed the same way (step._draft_rollout), so every draft is that
    token and every draft is accepted, from the prefill's drafts on. A head drafting from its raw logits proposes
    it at few positions."""
    head = trained_heads[method]
    vocab = np.arange(TINY.vocab_size) if method == "eagle" else np.arange(len(head.weights.d2t)) + head.weights.d2t
    token = int(vocab[len(vocab) // 2])
    spec = {"method": method, "model": str(head.path), "num_speculative_tokens": 3}
    llm = make_llm(weights, tokenizer_dir, speculative_config=spec)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logit_bias={token: 100.0})
    outs = llm.generate(prompts[:8], params, use_tqdm=False)
    assert all(o.outputs[0].token_ids == [token] * MAX_TOKENS for o in outs)
    m = llm.get_metrics()
    assert m["num_drafts"] > 0 and m["num_accepted_tokens"] == m["num_draft_tokens"], m


def test_processors_through_chunked_prefill_and_preemption(hf, weights, tokenizer_dir, favourites):
    """Prompts prefilled in 16-token chunks (the prompt mask built over several steps) and a pool too small for
    every sequence (preempted sequences are recomputed: their output is counted again from the prefill): still
    the oracle's tokens, and the logprobs of the processed distribution at every position (a preempted request's
    rows span its slots before and after)."""
    llm = make_llm(weights, tokenizer_dir, max_num_batched_tokens=16, prefill_buckets=[16], num_pages=20)
    prompts = random_prompts(8, 20, 40, seed=13)
    c = processor_configs(favourites)["everything"]
    params = replace(engine_params(c, 24), logprobs=2)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.get_metrics()["num_preemptions"] > 0
    assert [o.outputs[0].token_ids for o in outs] == [oracle_greedy(hf, p, 24, c) for p in prompts]
    for prompt, out in zip(prompts, outs):
        tokens, logprobs = out.outputs[0].token_ids, out.outputs[0].logprobs
        want = expected_logprobs(hf, prompt, tokens, dict(c, temperature=0.0))
        assert len(logprobs) == len(tokens)
        for i, (token, got) in enumerate(zip(tokens, logprobs)):
            assert set(got) == set(np.argsort(-want[i], kind="stable")[:2]) | {token}, i
            np.testing.assert_allclose([got[t].logprob for t in got], want[i, list(got)], atol=1e-3, rtol=0)


def test_repetition_penalty_equals_transformers_generate(hf, llms, prompts):
    """transformers' RepetitionPenaltyLogitsProcessor (CTRL) with generate(repetition_penalty=1.3), greedy."""
    n = 20
    want = []
    for p in prompts[:8]:
        with torch.no_grad():
            ids = hf.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False, repetition_penalty=1.3)
        want.append(ids[0, len(p):].tolist())
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, repetition_penalty=1.3)
    for key, llm in llms.items():
        assert [o.outputs[0].token_ids for o in llm.generate(prompts[:8], params, use_tqdm=False)] == want, key


def test_min_tokens_holds_off_a_likely_eos_with_speculation(weights, trained_heads, tmp_path):
    """EOS made the target's favourite token (its lm_head column along the hidden states' mean: the argmax at
    ~75 % of positions, and so the draft head's favourite too): without min_tokens most outputs stop within a
    few tokens; with min_tokens=20 none has EOS before token 21, greedy or seeded, with EAGLE (k = 3)."""
    import jax

    from jaxspec.models import llama

    eos = 5
    ids = np.array(random_prompts(8, 60, 60, seed=3))
    hidden, _, _ = jax.jit(llama.forward, static_argnums=1)(weights, TINY, ids,
                                                           np.broadcast_to(np.arange(60), ids.shape))
    h = np.asarray(hidden).reshape(-1, TINY.hidden_size)
    m = h.mean(0)
    lm_head = np.array(weights.lm_head)
    lm_head[:, eos] = 3 * m / (m @ m) * (h @ lm_head).max(1).mean()
    w = replace(weights, lm_head=lm_head)
    spec = {"method": "eagle", "model": str(trained_heads["eagle"].path), "num_speculative_tokens": 3}
    llm = make_llm(w, write_char_tokenizer(tmp_path, eos_token_id=eos), speculative_config=spec)
    prompts = random_prompts(16, 2, 12, seed=8)
    early = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40), use_tqdm=False)
    assert np.mean([len(o.outputs[0].token_ids) for o in early]) < 6
    for temperature in (0.0, 1.0):
        outs = llm.generate(prompts, [SamplingParams(temperature=temperature, seed=i, max_tokens=40, min_tokens=20)
                                      for i in range(16)], use_tqdm=False)
        for o in outs:
            assert eos not in o.outputs[0].token_ids[:20] and len(o.outputs[0].token_ids) > 20
        assert sum(o.outputs[0].finish_reason == "stop" for o in outs) >= 8  # EOS soon after the 20th token


# ---- n samples of one prompt


@pytest.mark.parametrize("key", ["plain", "eagle"])
def test_n_samples_equal_single_requests_and_prefill_once(llms, key):
    """n=4 with a seed: four different samples, reproducible, equal to four single requests seeded seed + i; the
    prompt (4 pages of 8 tokens) is prefilled once, plus its last token per further sample."""
    llm = llms[key]
    prompt = random_prompts(1, 30, 30, seed=9)[0]
    params = SamplingParams(n=4, temperature=0.9, seed=11, max_tokens=10, ignore_eos=True, presence_penalty=0.4,
                            repetition_penalty=1.2, logprobs=2)
    before = llm.get_metrics()["num_prefill_tokens"]
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert llm.get_metrics()["num_prefill_tokens"] - before == len(prompt) + 3
    assert [c.index for c in out.outputs] == [0, 1, 2, 3] and out.finished
    samples = [c.token_ids for c in out.outputs]
    assert len({tuple(s) for s in samples}) == 4
    again = llm.generate([prompt], params, use_tqdm=False)[0]
    assert [c.token_ids for c in again.outputs] == samples
    singles = llm.generate([prompt] * 4, [replace(params, n=1, seed=sample_seed(11, i)) for i in range(4)],
                           use_tqdm=False)
    assert [o.outputs[0].token_ids for o in singles] == samples
    for single, c in zip(singles, out.outputs):
        np.testing.assert_allclose(c.cumulative_logprob, single.outputs[0].cumulative_logprob, atol=1e-4)
    assert llm.llm_engine.block_manager.num_free == llm.engine_config.num_pages


def test_n_samples_stream_and_abort(llms):
    llm = llms["plain"]
    prompt = random_prompts(1, 20, 20, seed=10)[0]
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=6, ignore_eos=True)
    final = llm.generate([prompt], params, use_tqdm=False)[0]
    streamed: dict[int, list[int]] = {}
    finished = []
    for out in llm.generate_stream([prompt], params):
        for c in out.outputs:
            streamed.setdefault(c.index, []).extend(c.token_ids)
        finished.append(out.finished)
    assert finished[-1] and not any(finished[:-1])
    assert [streamed[i] for i in range(3)] == [c.token_ids for c in final.outputs]
    engine = llm.llm_engine
    engine.add_request("n", prompt, replace(params, max_tokens=30))
    engine.step()
    engine.step()
    engine.abort_request("n")
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert [c.finish_reason for c in outs[-1].outputs] == ["abort"] * 3
    assert engine.block_manager.num_free == llm.engine_config.num_pages


# ---- text options and metrics


def test_text_options(weights, prompts, tmp_path):
    """skip_special_tokens (a special token in the output is dropped from the text, or kept), detokenize=False
    (no text), include_stop_str_in_output, and the request's metrics in order."""
    from tokenizers import AddedToken, Tokenizer

    path = write_char_tokenizer(tmp_path)
    llm = make_llm(weights, path)
    ref = llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    special = ref.token_ids[3]
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(CHARS[special], special=True)])
    tok.save(str(path / "tokenizer.json"))
    llm = make_llm(weights, path)
    text = "".join(CHARS[t] for t in ref.token_ids)
    for skip in (True, False):
        out = llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                                                        skip_special_tokens=skip), use_tqdm=False)[0].outputs[0]
        assert out.text == (text.replace(CHARS[special], "") if skip else text)
    out = llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                                                    detokenize=False), use_tqdm=False)[0]
    assert out.outputs[0].text == "" and out.outputs[0].token_ids == ref.token_ids
    stop = text[6:8]
    at = text.find(stop)
    for include in (False, True):
        outs = list(llm.generate_stream([prompts[0]], SamplingParams(
            temperature=0, max_tokens=20, stop=stop, include_stop_str_in_output=include, skip_special_tokens=False)))
        streamed = "".join(o.outputs[0].text for o in outs)
        assert streamed == text[:at + 2 if include else at] and outs[-1].outputs[0].stop_reason == stop
    # with min_tokens, a stop string completed within the first min_tokens tokens does not count (vLLM)
    m = at + 3
    later = next((i for i in range(len(text) - 1) if text[i:i + 2] == stop and i + 2 > m), None)
    out = llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=stop,
                                                    min_tokens=m, skip_special_tokens=False), use_tqdm=False)[0]
    assert out.outputs[0].text == (text if later is None else text[:later])
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.last_token_time <= m.finished_time
    assert m.time_in_queue == m.first_scheduled_time - m.arrival_time and out.num_cached_tokens == 0


def test_generate_decodes_its_texts_at_the_end_as_each_finish_would(weights, prompts, tmp_path):
    """LLM.generate leaves its answers' text to one decode after its last step (Sequence.defer_text): in one call
    of mixed requests (a special token in the output skipped or kept, a stop string, whose text is kept as it comes,
    n = 2, detokenize=False) every text is what the engine API, which decodes at each finish, gives."""
    from tokenizers import AddedToken, Tokenizer

    path = write_char_tokenizer(tmp_path)
    llm = make_llm(weights, path)
    base = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    ref = llm.generate([prompts[0]], base, use_tqdm=False)[0].outputs[0]
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(CHARS[ref.token_ids[3]], special=True)])
    tok.save(str(path / "tokenizer.json"))
    llm = make_llm(weights, path)
    text = "".join(CHARS[t] for t in ref.token_ids)
    params = [replace(base, skip_special_tokens=True), replace(base, skip_special_tokens=False),
              replace(base, stop=[text[6:8]], skip_special_tokens=False),
              replace(base, n=2, temperature=1.0, seed=3, skip_special_tokens=False),
              replace(base, detokenize=False)]
    outs = llm.generate([prompts[0]] * len(params), params, use_tqdm=False)
    engine = llm.llm_engine
    for i, p in enumerate(params):
        engine.add_request(f"api-{i}", prompts[0], p)
    api = {}
    while engine.has_unfinished_requests():
        api.update((o.request_id, o) for o in engine.step() if o.finished)
    tokenizer = llm.get_tokenizer()
    for i, (out, p) in enumerate(zip(outs, params)):
        assert [c.text for c in out.outputs] == [c.text for c in api[f"api-{i}"].outputs]
        for c in out.outputs:
            expect = tokenizer.decode(c.token_ids, skip_special_tokens=p.skip_special_tokens) if p.detokenize else ""
            assert c.text == (expect[:expect.find(text[6:8])] if p.stop else expect)
    assert outs[0].outputs[0].text != outs[1].outputs[0].text  # the special token was in the output


def test_flat_logprobs_read_like_vllms_list():
    """The lazy logprobs container: the same dicts as building them all at once, by index, slice and iteration."""
    from jaxspec.engine.logprob_output import FlatLogprobs, position_logprobs
    from jaxspec.outputs import Logprob

    rng = np.random.default_rng(0)
    n, T = 3, 5  # top-n per position, T positions: rows [T, 2 + 2n] of (logprob bits, rank, top-n bits, top-n ids)
    lps = np.sort(rng.normal(size=(T, n)).astype(np.float32), axis=1)[:, ::-1]
    ids = np.stack([rng.permutation(50)[:n] for _ in range(T)]).astype(np.int32)
    tokens = [int(ids[0, 0]), 60, int(ids[2, 1]), 61, int(ids[4, 2])]  # 60, 61: outside every top-n
    rows = np.concatenate([np.full((T, 1), -3.5, np.float32).view(np.int32), np.full((T, 1), 7, np.int32),
                           np.ascontiguousarray(lps).view(np.int32), ids], axis=1)
    flat = FlatLogprobs(tokens, rows, 2, lambda t: f"<{t}>")
    eager = position_logprobs(tokens, rows, 2, lambda t: f"<{t}>")
    assert len(flat) == T and flat == eager and list(flat) == eager and flat[-1] == eager[-1]
    assert flat[1:4] == eager[1:4] and isinstance(flat[1:4], FlatLogprobs)
    assert flat[1][60] == Logprob(-3.5, 7, "<60>") and list(flat[1]) == [60, *ids[1, :2].tolist()]
    assert flat[0] == {tokens[0]: Logprob(-3.5, 7, f"<{tokens[0]}>"), int(ids[0, 1]): Logprob(float(lps[0, 1]), 2,
                                                                                            f"<{ids[0, 1]}>")}
    with pytest.raises(IndexError, match="position 5 of 5"):
        flat[5]
