"""One model resolver for every entry point (jaxspec/resolve.py): a preset name, a preset's weights directory, a
jaxspec checkpoint and an HF directory all find the same weights, tokenizer and default head, and the scripts
that used to find models their own way (bench/acceptance.py, the benchmark, load_model) accept each of them."""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

import pytest

from jaxspec import presets
from jaxspec.config import SpeculativeConfig
from jaxspec.convert.checkpoint import load_model
from jaxspec.resolve import resolve_head, resolve_model
from tests.tiny import TINY, write_model_dir, write_random_head

ROOT = Path(__file__).resolve().parents[1]
PRESET = presets.DEFAULT_PRESET


@pytest.fixture(scope="module")
def fake_preset(tmp_path_factory) -> Path:
    """A weights directory laid out as `jaxspec fetch` leaves the default preset, holding a tiny model: its
    source.json says it was built from the preset's source, so fetching it again is a file comparison."""
    weights = tmp_path_factory.mktemp("weights")
    root = write_model_dir(weights / PRESET)
    (root / "source.json").write_text(json.dumps(presets.load_preset(PRESET).source))
    return weights


def test_every_form_finds_the_same_files(fake_preset, monkeypatch):
    root = fake_preset / PRESET
    monkeypatch.setenv("JAXSPEC_WEIGHTS_DIR", str(fake_preset))  # read when called: the preset is the tiny model
    head = presets.shipped_head("eagle3-smollm2-135m-instruct")  # the preset's head
    for model in (PRESET, root, root / "ckpt", str(root / "ckpt")):
        files = resolve_model(model)
        assert (files.weights, files.hf_dir, files.tokenizer) == (root / "ckpt", root / "hf", root / "hf"), model
        assert files.preset == PRESET and files.head["model"] == str(head) and (head / "model.safetensors").is_file()
    spec = SpeculativeConfig.parse(files.head)  # the head with prompt lookup (n-grams of 2-5) as its fallback
    assert (spec.method, spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max) == (
        "eagle3", 3, 2, 5)
    hf = resolve_model(root / "hf")
    assert (hf.weights, hf.tokenizer, hf.preset) == (root / "hf", root / "hf", PRESET)
    cfg, _ = load_model(root)  # a preset's weights directory, as LLM and the benchmark take it
    assert cfg.vocab_size == TINY.vocab_size


def test_a_copied_model_is_not_a_preset(fake_preset, tmp_path):
    """Without the preset's source.json the same files are just a checkpoint: no default head."""
    shutil.copytree(fake_preset / PRESET / "ckpt", tmp_path / "ckpt")
    files = resolve_model(tmp_path)
    assert files.weights == tmp_path / "ckpt" and files.tokenizer is None and files.head is None


def test_errors_name_the_model(tmp_path):
    with pytest.raises(ValueError, match=r"no-such-model: no such preset, directory or Hugging Face Hub repo id"):
        resolve_model("no-such-model")
    with pytest.raises(ValueError, match=rf"{tmp_path}: neither a jaxspec checkpoint .* nor a preset's weights"):
        load_model(tmp_path)
    with pytest.raises(ValueError, match=r"'eagle-nothing' is neither a directory nor a shipped head"):
        resolve_head("eagle-nothing")
    assert resolve_head("eagle3-smollm2-135m-instruct") == presets.shipped_head("eagle3-smollm2-135m-instruct")


def test_acceptance_script_takes_a_preset_weights_directory(fake_preset, tmp_path):
    """`bench/acceptance.py --model weights/<preset>` failed ("neither a jaxspec checkpoint nor a Hugging Face
    directory") where bench/throughput.py took the same path; both now resolve it the same way."""
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"question": q}) + "\n" for q in ("abcab", "xyz")))
    spec = {"method": "eagle", "model": str(write_random_head(tmp_path / "head")), "num_speculative_tokens": 2}
    main = runpy.run_path(str(ROOT / "bench" / "acceptance.py"))["main"]
    result = main(["--model", str(fake_preset / PRESET), "--speculative-config", json.dumps(spec), "--dataset",
                   str(tmp_path / "prompts.jsonl"), "--num-prompts", "2", "--max-tokens", "6", "--max-model-len", "64",
                   "--max-num-batched-tokens", "64"])
    (row,) = result["results"]
    assert row["num_prompts"] == 2 and row["output_tokens"] > 0 and row["mean_acceptance_length"] >= 1


def test_hub_repo_ids_are_downloaded_into_the_hub_cache(fake_preset, tmp_path, monkeypatch):
    """An owner/name that is neither a preset nor a directory is fetched from the Hugging Face Hub, as vLLM does:
    config, tokenizer and safetensors (pytorch_model*.bin only where a repo has no safetensors); a download that
    fails is a ValueError naming the repo. huggingface_hub is stubbed: no network here."""
    import huggingface_hub

    snapshot = shutil.copytree(fake_preset / PRESET / "hf", tmp_path / "snapshot")  # as a Hub snapshot would be
    repos = {"org/tiny": ["config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json"],
             "org/bin-only": ["config.json", "pytorch_model.bin"]}
    calls = []

    def snapshot_download(repo_id, revision=None, cache_dir=None, allow_patterns=None):
        calls.append((repo_id, cache_dir, allow_patterns, revision))
        return str(snapshot)

    def list_repo_files(repo_id, revision=None):
        if repo_id not in repos:
            raise huggingface_hub.errors.LocalEntryNotFoundError(f"offline, and {repo_id} is not in the cache")
        return repos[repo_id]

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub, "list_repo_files", list_repo_files)
    files = resolve_model("org/tiny", tmp_path / "cache")
    assert files.weights == snapshot and files.tokenizer == snapshot and files.preset is None
    assert calls[-1][:2] == ("org/tiny", tmp_path / "cache") and "*.safetensors" in calls[-1][2]
    assert not any(p.endswith(".bin") for p in calls[-1][2])
    resolve_model("org/bin-only", revision="v1.0")
    assert "pytorch_model*.bin" in calls[-1][2] and "*.safetensors" not in calls[-1][2] and calls[-1][3] == "v1.0"
    with pytest.raises(ValueError, match=r"org/missing: not a preset or a directory, and downloading it from the "
                                         r"Hugging Face Hub failed: LocalEntryNotFoundError"):
        resolve_model("org/missing")

