"""bench/acceptance.py on a tiny target and head: per data set and k tables from one LLM per k, whose per-data-set
counts equal those of a run on that data set alone (the oracle for splitting one LLM's metrics by differences)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tiny import TINY, tiny_weights, write_chat_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import acceptance  # noqa: E402

PROMPTS = {"poems": ["Write a poem about the sea", "Write a short poem about rain", "A poem on winter nights"],
           "trips": ["Plan a trip to Rome", "Where should I go in Spain", "Plan two days in Oslo"]}
COUNTS = ("num_prompts", "output_tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
          "acceptance_rate_per_position", "mean_acceptance_length")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from jaxspec.convert.checkpoint import save_checkpoint
    from tests.tiny_heads import train_tiny_head

    root = tmp_path_factory.mktemp("acc")
    weights = tiny_weights(0)
    write_chat_tokenizer(save_checkpoint(root / "model" / "ckpt", TINY, weights))  # a preset's weights layout
    head = train_tiny_head("eagle", TINY, weights, root / "head", steps=60).path
    files = {}
    for name, rows in PROMPTS.items():
        files[name] = root / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps({"prompt": p}) + "\n" for p in rows + rows[:1]))  # one repeat
    return root, head, files


def run(root, head, files, names, k, out):
    argv = ["--model", str(root / "model"), "--speculative-config", json.dumps({"method": "eagle", "model": str(head)}),
            "--k", k, "--num-prompts", "8", "--max-tokens", "24", "--max-num-batched-tokens", "128",
            "--output-json", str(out)]
    for name in names:
        argv += ["--dataset", f"{name}={files[name]}"]
    return acceptance.main(argv)


def test_tables_per_dataset_and_k(setup, capsys):
    root, head, files = setup
    both = run(root, head, files, ["poems", "trips"], "2,1", root / "both.json")
    assert json.loads((root / "both.json").read_text()) == both and not both["errors"]
    assert [(r["k"], r["dataset"]) for r in both["results"]] == [(2, "poems"), (2, "trips"), (1, "poems"),
                                                                  (1, "trips")]
    assert all(r["num_prompts"] == 3 for r in both["results"])  # the repeated row is dropped
    assert all(len(r["acceptance_rate_per_position"]) == r["k"] for r in both["results"])
    assert any(r["num_accepted_tokens"] > 0 for r in both["results"])
    alone = run(root, head, files, ["trips"], "2", root / "alone.json")
    assert {c: alone["results"][0][c] for c in COUNTS} == {c: both["results"][1][c] for c in COUNTS}
    table = acceptance.acceptance_table(both)
    assert "| poems (3) |" in table and "k = 1 | k = 2" in table
    assert table in capsys.readouterr().out


def test_sampling_options(setup, capsys):
    """--sampling reaches the requests: logit_bias +100 on one token makes it every output token, and the head's
    drafts, processed as the target is, are all accepted; the table names the options."""
    root, head, files = setup
    argv = ["--model", str(root / "model"), "--speculative-config", json.dumps({"method": "eagle", "model": str(head)}),
            "--k", "2", "--num-prompts", "8", "--max-tokens", "24", "--max-num-batched-tokens", "128",
            "--dataset", f"poems={files['poems']}", "--sampling", '{"logit_bias": {"40": 100}, "ignore_eos": true}']
    result = acceptance.main(argv)
    assert result["sampling"] == {"logit_bias": {"40": 100}, "ignore_eos": True} and not result["errors"]
    r = result["results"][0]
    assert r["output_tokens"] == 3 * 24 and r["num_accepted_tokens"] == r["num_draft_tokens"] > 0, r
    assert "greedy, logit_bias {'40': 100}, ignore_eos True, 24 tokens" in capsys.readouterr().out
    with pytest.raises(ValueError, match="presence_penalty"):
        acceptance.main(argv[:-1] + ['{"presence_penalty": 5}'])


def test_bad_arguments(setup):
    root, head, files = setup
    with pytest.raises(ValueError, match="two data sets named"):
        acceptance.parse_datasets([f"a={files['poems']}", f"a={files['trips']}"])
    with pytest.raises(ValueError, match="does not exist"):
        acceptance.parse_datasets(["nowhere.jsonl"])
    with pytest.raises(ValueError, match="pass --k"):
        acceptance.parse_k(acceptance.parse_args(["--speculative-config", "{}", "--dataset", "x"]), {})
