"""The model's sampling defaults (vLLM's generation_config): which fields are read from generation_config.json,
"vllm" and a directory, the override on top, errors that name the file and field, and LLM.generate's use of
them when given no sampling params."""

from __future__ import annotations

import json

import pytest

from jaxspec import SamplingParams
from jaxspec.generation_config import default_sampling_values
from tests.tiny import make_llm, tiny_weights, write_char_tokenizer

LLAMA3 = {"bos_token_id": 128000, "do_sample": True, "eos_token_id": [128001, 128009], "temperature": 0.6,
          "top_p": 0.9, "top_k": 50, "max_new_tokens": 40, "repetition_penalty": None}


def write(path, config: dict):
    path.mkdir(parents=True, exist_ok=True)
    (path / "generation_config.json").write_text(json.dumps(config))
    return path


def test_fields_read_as_vllm_reads_them(tmp_path):
    model = write(tmp_path / "model" / "hf", LLAMA3).parent  # a preset's layout: the HF files in hf/
    expected = {"temperature": 0.6, "top_p": 0.9, "top_k": 50, "max_tokens": 40}  # set ones; max_new_tokens renamed
    assert default_sampling_values(model) == expected
    assert default_sampling_values(model / "ckpt") == expected  # a checkpoint beside hf/
    assert default_sampling_values(model, "vllm") == {}
    assert default_sampling_values(model, "auto", {"temperature": 0.2, "do_sample": False}) == expected | {
        "temperature": 0.2}
    assert default_sampling_values(model, "vllm", {"min_p": 0.1}) == {"min_p": 0.1}
    other = write(tmp_path / "other", {"repetition_penalty": 1.1})
    assert default_sampling_values(model, str(other)) == {"repetition_penalty": 1.1}
    assert default_sampling_values(None, str(other / "generation_config.json")) == {"repetition_penalty": 1.1}
    assert default_sampling_values(tmp_path / "nothing-here") == {}  # auto without a file: no defaults
    assert default_sampling_values(None) == {}


def test_bad_values_name_their_source(tmp_path):
    bad = write(tmp_path / "bad", {"temperature": -1})
    with pytest.raises(ValueError, match=r"bad/generation_config.json: SamplingParams.temperature must be >= 0"):
        default_sampling_values(bad)
    with pytest.raises(ValueError, match=r"override_generation_config: SamplingParams.top_p must be in \(0, 1\]"):
        default_sampling_values(None, "auto", {"top_p": 2})
    with pytest.raises(ValueError, match=r"generation_config='.*missing': no generation_config.json there"):
        default_sampling_values(None, str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="override_generation_config must be a dict"):
        default_sampling_values(None, "auto", [("temperature", 0)])


def test_generate_without_params_uses_the_defaults(tmp_path):
    tok = write_char_tokenizer(tmp_path / "tok", eos_token_id=2)
    write(tok, {"eos_token_id": 2, "temperature": 0.0, "max_new_tokens": 6})
    llm = make_llm(tiny_weights(), tok)
    assert llm.get_default_sampling_params() == SamplingParams(temperature=0.0, max_tokens=6)
    prompts = ["abc", "hello"]
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, use_tqdm=False)] == \
        [o.outputs[0].token_ids for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6),
                                                      use_tqdm=False)]
    plain = make_llm(tiny_weights(), tok, generation_config="vllm")
    assert plain.get_default_sampling_params() == SamplingParams()
    with pytest.raises(ValueError, match="override_generation_config: SamplingParams.max_tokens"):
        make_llm(tiny_weights(), tok, override_generation_config={"max_new_tokens": 0})


def test_server_requests_take_the_defaults_only_where_unset():
    from jaxspec.serve import protocol as api
    from jaxspec.serve.serving import sampling_params

    defaults = {"temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.1, "max_tokens": 40}
    unset = sampling_params(api.CompletionRequest(prompt="x", max_tokens=None), None, defaults)
    assert (unset.temperature, unset.top_p, unset.repetition_penalty, unset.top_k, unset.max_tokens) == \
        (0.6, 0.9, 1.1, 0, 40)
    explicit = api.ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], temperature=1.0, top_p=1.0,
                                         max_completion_tokens=100)
    params = sampling_params(explicit, 100, defaults)  # an explicit value wins, even the neutral one
    assert (params.temperature, params.top_p, params.repetition_penalty, params.max_tokens) == (1.0, 1.0, 1.1, 40)
    assert sampling_params(explicit, 7, defaults).max_tokens == 7  # the smaller of the two limits
    assert sampling_params(explicit, 7, {}).temperature == 1.0
