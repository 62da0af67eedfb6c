"""Loaders under hostile input: every error is a ValueError naming the file and the field or tensor.

Config files with wrong types, missing keys, head counts that do not divide and bad JSON; tokenizer paths that do
not exist.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import pytest

from jaxspec import LLM
from jaxspec.convert.checkpoint import CONFIG_FILE, load_checkpoint, save_checkpoint
from jaxspec.convert.eagle import load_eagle, save_eagle
from jaxspec.convert.hf_llama import load_hf_llama, save_hf_llama
from jaxspec.models import eagle
from jaxspec.tokenizer import eos_token_ids, load_tokenizer
from tests.tiny import TINY, tiny_weights, write_char_tokenizer


@pytest.fixture(scope="module")
def weights():
    return tiny_weights()


def edit_json(path: Path, edit) -> None:
    d = json.loads(path.read_text())
    edit(d)
    path.write_text(json.dumps(d))


def setter(**fields):
    return lambda d: d.update(fields)


def deleter(key):
    return lambda d: d.pop(key)


def raises_naming(file: Path, *words: str):
    """pytest.raises(ValueError) whose message starts with the file and contains each word, in order."""
    return pytest.raises(ValueError, match=re.escape(str(file)) + ".*" + ".*".join(re.escape(w) for w in words))


# ---- config.json of a Hugging Face directory ---------------------------------------------------------------------

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 256}
BAD_HF_CONFIGS = {  # name: (edit of config.json, words the error must contain)
    "vocab list": (setter(vocab_size=[128]), ("'vocab_size'", "integer", "[128]")),
    "vocab null": (setter(vocab_size=None), ("'vocab_size'", "null")),
    "vocab missing": (deleter("vocab_size"), ("'vocab_size'", "missing")),
    "hidden string": (setter(hidden_size="64"), ("'hidden_size'", "integer", "'64'")),
    "layers bool": (setter(num_hidden_layers=True), ("'num_hidden_layers'", "integer", "True")),
    "intermediate float": (setter(intermediate_size=127.5), ("'intermediate_size'", "integer")),
    "heads zero": (setter(num_attention_heads=0), ("'num_attention_heads'", ">= 1")),
    "heads dict": (setter(num_attention_heads={"n": 4}), ("'num_attention_heads'", "integer")),
    "positions negative": (setter(max_position_embeddings=-5), ("'max_position_embeddings'", ">= 1", "-5")),
    "kv 3 of 4": (setter(num_key_value_heads=3), ("num_key_value_heads=3", "num_attention_heads=4")),
    "kv 8 of 4": (setter(num_key_value_heads=8), ("num_key_value_heads=8", "num_attention_heads=4")),
    "kv zero": (setter(num_key_value_heads=0), ("'num_key_value_heads'", ">= 1")),
    "head_dim odd": (setter(head_dim=15), ("head_dim=15", "odd")),
    "head_dim list": (setter(head_dim=[16]), ("'head_dim'", "integer")),
    "no head_dim, hidden not a multiple": (lambda d: d.update(hidden_size=66) or d.pop("head_dim"),
                                           ("hidden_size=66", "num_attention_heads=4")),
    "tied string": (setter(tie_word_embeddings="false"), ("'tie_word_embeddings'", "true or false")),
    "bias string": (setter(attention_bias="no"), ("'attention_bias'", "true or false")),
    "eps string": (setter(rms_norm_eps="1e-5"), ("'rms_norm_eps'", "number")),
    "eps zero": (setter(rms_norm_eps=0), ("'rms_norm_eps'", "> 0")),
    "theta list": (setter(rope_theta=[1.0]), ("'rope_theta'", "number")),
    "rope_scaling list": (setter(rope_scaling=[1, 2]), ("'rope_scaling'", "object")),
    "rope_parameters string": (setter(rope_parameters="default"), ("'rope_parameters'", "object")),
    "rope factor string": (setter(rope_scaling=LLAMA3 | {"factor": "8"}), ("rope_scaling", "'factor'", "number")),
    "rope theta nested": (setter(rope_parameters={"rope_theta": "big"}), ("rope_parameters", "'rope_theta'")),
    "architectures string": (setter(architectures="LlamaForCausalLM"), ("'architectures'", "list of str")),
    "model_type int": (setter(model_type=7), ("'model_type'", "string")),
}


@pytest.fixture(scope="module")
def hf_template(tmp_path_factory, weights) -> Path:
    path = tmp_path_factory.mktemp("hf") / "model"
    save_hf_llama(TINY, weights, path)
    return path


@pytest.fixture
def hf_dir(hf_template, tmp_path) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    for f in hf_template.iterdir():
        (path / f.name).write_bytes(f.read_bytes())
    return path


def test_hf_template_loads(hf_dir):
    cfg, _ = load_hf_llama(hf_dir)
    assert cfg == TINY.replace(max_position_embeddings=cfg.max_position_embeddings)


@pytest.mark.parametrize("case", BAD_HF_CONFIGS)
def test_bad_hf_config_names_file_and_field(hf_dir, case):
    edit, words = BAD_HF_CONFIGS[case]
    edit_json(hf_dir / "config.json", edit)
    with raises_naming(hf_dir / "config.json", *words):
        load_hf_llama(hf_dir)


@pytest.mark.parametrize("text, words", [("{\"vocab_size\": ", ("not valid JSON",)), ("[1, 2]", ("JSON object",)),
                                         (b"\xff\xfe\x00{", ("not valid JSON",))])
def test_hf_config_not_a_json_object(hf_dir, text, words):
    path = hf_dir / "config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with raises_naming(path, *words):
        load_hf_llama(hf_dir)


def test_bad_safetensors_index_names_the_index(hf_dir):
    index = hf_dir / "model.safetensors.index.json"
    index.write_text('{"weight_map": ')
    with raises_naming(index, "not valid JSON"):
        load_hf_llama(hf_dir)
    index.write_text(json.dumps({"weight_map": {"embed": "../../etc/passwd"}}))
    with raises_naming(index, "../../etc/passwd"):
        load_hf_llama(hf_dir)


# ---- a draft head's config.json ----------------------------------------------------------------------------------

@pytest.fixture
def head_dir(tmp_path) -> Path:
    cfg = eagle.EagleConfig.from_target(TINY, "eagle3", draft_vocab_size=64, aux_layers=(0, 1, 3))
    save_eagle(str(tmp_path / "head"), cfg, eagle.init(cfg, jax.random.key(1)))
    return tmp_path / "head"


BAD_HEAD_CONFIGS = {
    "layers string": (setter(num_hidden_layers="1"), ("'num_hidden_layers'", "integer")),
    "bias string": (setter(bias="yes"), ("'bias'", "true or false")),
    "eagle_config list": (setter(eagle_config=[1]), ("'eagle_config'", "object")),
    "aux ids strings": (setter(eagle_config={"eagle_aux_hidden_state_layer_ids": ["1"]}),
                        ("eagle_config", "'eagle_aux_hidden_state_layer_ids'", "list of int")),
    "aux ids repeated": (setter(eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 0, 2]}),
                         ("aux_layers", "strictly increasing")),
    "draft vocab string": (setter(draft_vocab_size="64"), ("'draft_vocab_size'", "integer")),
    "target hidden list": (setter(target_hidden_size=[64]), ("'target_hidden_size'", "integer")),
    "kv 3 of 4": (setter(num_key_value_heads=3), ("num_key_value_heads=3", "num_attention_heads=4")),
    "vocab null": (setter(vocab_size=None), ("'vocab_size'", "null")),
}


@pytest.mark.parametrize("case", BAD_HEAD_CONFIGS)
def test_bad_head_config_names_file_and_field(head_dir, case):
    load_eagle(str(head_dir), TINY)  # the unedited head loads
    edit, words = BAD_HEAD_CONFIGS[case]
    edit_json(head_dir / "config.json", edit)
    with raises_naming(head_dir / "config.json", *words):
        load_eagle(str(head_dir), TINY)


def test_head_config_bad_json(head_dir):
    (head_dir / "config.json").write_text("{'single': 'quotes'}")
    with raises_naming(head_dir / "config.json", "not valid JSON"):
        load_eagle(str(head_dir), TINY)


# ---- jaxspec_config.json of a converted checkpoint ---------------------------------------------------------------

@pytest.fixture(scope="module")
def ckpt_template(tmp_path_factory, weights) -> Path:
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt", TINY, weights)


BAD_CKPT_CONFIGS = {
    "layers string": (setter(num_layers="4"), ("'num_layers'", "integer")),
    "vocab null": (setter(vocab_size=None), ("'vocab_size'", "null")),
    "vocab missing": (deleter("vocab_size"), ("'vocab_size'", "missing")),
    "heads negative": (setter(num_heads=-4), ("'num_heads'", ">= 1")),
    "kv 3 of 4": (setter(num_kv_heads=3), ("num_kv_heads=3", "num_heads=4")),
    "tied int": (setter(tie_word_embeddings=1), ("'tie_word_embeddings'", "true or false")),
    "rope_scaling int": (setter(rope_scaling=5), ("'rope_scaling'", "list")),
    "rope_scaling pairs": (setter(rope_scaling=[["factor"]]), ("'rope_scaling'", "pairs")),
    "dtype": (setter(dtype="int8"), ("'dtype'", "int8")),
    "dtype list": (setter(dtype=["float32"]), ("'dtype'", "string")),
    "unknown field": (setter(colour="blue"), ("unknown Config fields", "colour")),
}


@pytest.mark.parametrize("case", BAD_CKPT_CONFIGS)
def test_bad_checkpoint_config_names_file_and_field(ckpt_template, tmp_path, case):
    path = tmp_path / "ckpt"
    path.mkdir()
    (path / "weights").symlink_to(ckpt_template / "weights")
    (path / CONFIG_FILE).write_bytes((ckpt_template / CONFIG_FILE).read_bytes())
    assert load_checkpoint(path)[0] == TINY
    edit, words = BAD_CKPT_CONFIGS[case]
    edit_json(path / CONFIG_FILE, edit)
    with raises_naming(path / CONFIG_FILE, *words):
        load_checkpoint(path)


@pytest.mark.parametrize("text", ["", "{", "[]", "null"])
def test_checkpoint_config_not_json(ckpt_template, tmp_path, text):
    path = tmp_path / "ckpt"
    path.mkdir()
    (path / CONFIG_FILE).write_text(text)
    with raises_naming(path / CONFIG_FILE, "JSON"):
        load_checkpoint(path)


# ---- tokenizer and generation config -----------------------------------------------------------------------------

def test_tokenizer_path_that_does_not_exist_is_an_error(weights, tmp_path):
    with raises_naming(tmp_path / "typo", "does not exist"):
        LLM("tiny", weights=(TINY, weights), tokenizer=str(tmp_path / "typo"), warmup=False, max_model_len=64,
            max_num_seqs=2)
    (tmp_path / "empty").mkdir()
    with raises_naming(tmp_path / "empty", "no tokenizer"):
        load_tokenizer(tmp_path / "empty", required=True)
    assert load_tokenizer(tmp_path / "empty") is None  # a model directory without a tokenizer: token ids only
    write_char_tokenizer(tmp_path / "tok")
    assert load_tokenizer(tmp_path / "tok", required=True).encode("abc") == [0, 1, 2]


@pytest.mark.parametrize("name, text, words", [
    ("tokenizer.json", '{"version": "1.0", ', ("not valid JSON",)),
    ("tokenizer.json", "[1]", ("JSON object",)),
    ("tokenizer_config.json", "{tokenizer_class}", ("not valid JSON",)),
    ("tokenizer.json", '{"model": {"type": "Nope"}}', ("tokenizer",)),
])
def test_corrupt_tokenizer_names_the_file(tmp_path, name, text, words):
    write_char_tokenizer(tmp_path)
    (tmp_path / name).write_text(text)
    with raises_naming(tmp_path / name if "JSON" in " ".join(words) else tmp_path, *words):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("eos, words", [("{", ("not valid JSON",)), ('{"eos_token_id": "2"}', ("'eos_token_id'",)),
                                        ('{"eos_token_id": [1, "x"]}', ("'eos_token_id'", "list of int")),
                                        ('{"eos_token_id": -1}', ("'eos_token_id'", ">= 0")),
                                        ('{"eos_token_id": [3, -1]}', ("'eos_token_id'", "negative"))])
def test_bad_generation_config_names_the_file(tmp_path, eos, words):
    write_char_tokenizer(tmp_path, eos_token_id=3)
    assert eos_token_ids(None, tmp_path) == {3}
    (tmp_path / "generation_config.json").write_text(eos)
    with raises_naming(tmp_path / "generation_config.json", *words):
        eos_token_ids(None, tmp_path)
