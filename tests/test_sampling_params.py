"""SamplingParams' vLLM fields: defaults, normalization, and a ValueError naming the parameter for bad values, on
construction and again at admission (where the vocabulary, max_logprobs and the tokenizer are known)."""

from __future__ import annotations

import math

import pytest

from jaxspec import SamplingParams
from jaxspec.engine.slot_spec import MAX_BAD_WORD_TOKENS
from tests.tiny import make_llm, tiny_weights, write_char_tokenizer


def test_defaults_are_vllms():
    p = SamplingParams()
    assert (p.n, p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.min_p, p.min_tokens) == \
        (1, 0.0, 0.0, 1.0, 0.0, 0)
    assert (p.logprobs, p.prompt_logprobs, p.logit_bias, p.allowed_token_ids, p.bad_words,
            p.truncate_prompt_tokens) == (None, None, None, None, [], None)
    assert (p.detokenize, p.skip_special_tokens, p.spaces_between_special_tokens, p.include_stop_str_in_output) == \
        (True, True, True, False)
    assert not p.needs_extended_step


def test_normalization():
    p = SamplingParams(logit_bias={"5": 250, 7: -3}, seed=-1, logprobs=True, n=3, best_of=3)
    assert p.logit_bias == {5: 100.0, 7: -3.0} and p.seed is None and p.logprobs == 1 and p.needs_extended_step
    assert SamplingParams(logprobs=-1).logprobs == -1  # the whole vocabulary: checked against max_logprobs later


@pytest.mark.parametrize("kwargs, name", [
    (dict(n=0), "n"), (dict(n=2.0), "n"), (dict(n=2, temperature=0), "n must be 1"), (dict(best_of=2), "best_of"),
    (dict(presence_penalty=2.5), "presence_penalty"), (dict(frequency_penalty=-2.1), "frequency_penalty"),
    (dict(repetition_penalty=0.0), "repetition_penalty"), (dict(repetition_penalty=math.nan), "repetition_penalty"),
    (dict(min_p=1.5), "min_p"), (dict(min_p=-0.1), "min_p"), (dict(min_tokens=-1), "min_tokens"),
    (dict(min_tokens=20, max_tokens=10), "min_tokens"), (dict(logprobs=-2), "logprobs"),
    (dict(logprobs="5"), "logprobs"), (dict(prompt_logprobs=-3), "prompt_logprobs"),
    (dict(logit_bias={"x": 1.0}), "logit_bias"), (dict(logit_bias={1: math.inf}), "logit_bias"),
    (dict(logit_bias=[1]), "logit_bias"), (dict(allowed_token_ids=[]), "allowed_token_ids"),
    (dict(allowed_token_ids=[-1]), "allowed_token_ids"), (dict(bad_words=[""]), "bad_words"),
    (dict(bad_words="abc"), "bad_words"), (dict(stop="x", detokenize=False), "detokenize"),
    (dict(skip_special_tokens="yes"), "skip_special_tokens"), (dict(include_stop_str_in_output=1),
                                                               "include_stop_str_in_output"),
    (dict(truncate_prompt_tokens=0), "truncate_prompt_tokens"), (dict(truncate_prompt_tokens=-2),
                                                                 "truncate_prompt_tokens"),
])
def test_bad_values_raise_on_construction(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return make_llm(tiny_weights(), write_char_tokenizer(tmp_path_factory.mktemp("chars")))


@pytest.mark.parametrize("kwargs, name", [
    (dict(logprobs=21), "logprobs=21 is more than max_logprobs=20"), (dict(logprobs=-1), "logprobs=128"),
    (dict(prompt_logprobs=25), "prompt_logprobs"), (dict(logit_bias={500: 1.0}), "logit_bias"),
    (dict(allowed_token_ids=[3, 200]), "allowed_token_ids"), (dict(stop_token_ids=[128]), "stop_token_ids"),
    (dict(bad_words=["#"]), "bad_words entry '#' tokenizes to no tokens"),
    (dict(bad_words=["a" * (MAX_BAD_WORD_TOKENS + 1)]), "bad_words"),
    (dict(bad_words=[chr(ord("a") + i) + chr(ord("a") + j) for i in range(9) for j in range(8)]), "bad_words"),
])
def test_bad_values_raise_at_admission(llm, kwargs, name):
    """Checked against the model before anything runs: the batch's good requests are not started either."""
    with pytest.raises(ValueError, match=f"request 1: SamplingParams.{name}"):
        llm.generate([[1, 2], [3, 4]], [SamplingParams(max_tokens=2), SamplingParams(max_tokens=2, **kwargs)],
                     use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_fields_changed_after_construction_are_checked_at_admission(llm):
    params = SamplingParams(max_tokens=2)
    params.presence_penalty = 3.0
    with pytest.raises(ValueError, match="presence_penalty"):
        llm.generate([[1, 2]], params, use_tqdm=False)
    params = SamplingParams(max_tokens=2, temperature=0.5, n=2)
    params.temperature = 0
    with pytest.raises(ValueError, match="n must be 1"):
        llm.llm_engine.add_request("x", [1, 2], params)


def test_bad_words_need_a_tokenizer_and_max_logprobs_is_checked():
    llm = make_llm(tiny_weights(), max_logprobs=2)
    with pytest.raises(ValueError, match="bad_words need a tokenizer"):
        llm.generate([[1, 2]], SamplingParams(bad_words=["ab"]), use_tqdm=False)
    with pytest.raises(ValueError, match="max_logprobs=2"):
        llm.generate([[1, 2]], SamplingParams(logprobs=3), use_tqdm=False)
    with pytest.raises(ValueError, match="max_logprobs"):
        make_llm(tiny_weights(), max_logprobs=-1)


def test_truncate_prompt_tokens_keeps_the_last_tokens(llm):
    """vLLM's left truncation: the request runs on its prompt's last k tokens (-1: the last max_model_len)."""
    greedy = dict(temperature=0, max_tokens=6)
    prompt = [5, 9, 2, 7, 3, 8, 1]
    cut, tail, whole = llm.generate([prompt, prompt[-3:], prompt],
                                    [SamplingParams(truncate_prompt_tokens=3, **greedy), SamplingParams(**greedy),
                                     SamplingParams(truncate_prompt_tokens=-1, **greedy)], use_tqdm=False)
    assert cut.prompt_token_ids == prompt[-3:] and cut.outputs[0].token_ids == tail.outputs[0].token_ids
    assert whole.prompt_token_ids == prompt
    long = [1 + t % 120 for t in range(256)]  # 256 tokens against max_model_len 128
    out = llm.generate([long], SamplingParams(truncate_prompt_tokens=100, **greedy), use_tqdm=False)[0]
    assert out.prompt_token_ids == long[-100:] and len(out.outputs[0].token_ids) == 6

