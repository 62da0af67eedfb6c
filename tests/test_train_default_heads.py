"""bench/train_default_heads.py's orchestration with stand-in stages (no jax runs): the budgets it hands each stage
fit the deadline, a failed data stage is retried on GSM8K alone, an empty held-out split is not evaluated, one
head failing leaves the other's training and evaluation alone, and the summary is written whatever happened."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import train_default_heads as tdh  # noqa: E402

META = {"num_kept": 3, "num_drawn": 5, "stopped_by": "time_budget", "num_train": 3, "num_held_out": 0,
        "generate_s": 1.0, "filter_counts": {"kept": 3, "unterminated": 2},
        "diversity": {"categories": {"general": 3}, "mean_words": 5.0, "mean_chars": 30.0, "distinct_first_words": 1.0,
                      "distinct_bigrams": 1.0, "top_first_words": [["write", 3]]}}


class FakeStages:
    """Stands in for the child processes: writes what each would, fails where told."""

    def __init__(self, fail: set[str]):
        self.fail, self.calls = fail, []

    def __call__(self, cmd, stdout, stderr, env, cwd, timeout):
        arg = lambda flag: cmd[cmd.index(flag) + 1]  # noqa: E731
        if "bench/acceptance.py" in " ".join(cmd):
            name = "eval-" + json.loads(arg("--speculative-config"))["method"]
        elif "--data-only" in cmd:
            name = "data" if any(c.startswith("self:") for c in cmd) else "data-retry"
        else:
            name = "train-" + arg("--method")
        self.calls.append((name, cmd, timeout, env))
        if name not in self.fail:
            self.write(name, cmd, arg)
        elif name == "data":  # the prompts were written, then the answers failed
            prompts = Path(arg("--prompts-out"))
            prompts.mkdir(parents=True)
            (prompts / "meta.json").write_text(json.dumps(META))
            (prompts / "train.jsonl").write_text(json.dumps({"prompt": "Write a poem"}) + "\n")
            (prompts / "held_out.jsonl").write_text("")
        return subprocess.CompletedProcess(cmd, 1 if name in self.fail else 0)

    @staticmethod
    def write(name, cmd, arg):
        if name.startswith("data"):
            Path(arg("--dataset-cache")).parent.mkdir(parents=True, exist_ok=True)
            Path(arg("--dataset-cache")).write_bytes(b"npz")
        elif name.startswith("train"):
            out = Path(arg("--out"))
            out.mkdir(parents=True)
            (out / "model.safetensors").write_bytes(b"")
            (out / "training.json").write_text(json.dumps({
                "steps_done": 10, "batch_size": 32, "wall_s": 1.0, "final_acc_avg50": [0.5],
                "draft_vocab_size": 8, "draft_vocab_coverage": 0.9 if "eagle3" in cmd else None,
                "data": {"num_sequences": 4, "response_tokens": 40}}))
        else:
            sets = [cmd[i + 1].split("=")[0] for i, c in enumerate(cmd) if c == "--dataset"]
            Path(arg("--output-json")).write_text(json.dumps({
                "speculative_config": json.loads(arg("--speculative-config")), "max_tokens": 256,
                "datasets": {s: {"num_prompts": 2} for s in sets},
                "results": [{"dataset": s, "k": 3, "mean_acceptance_length": 2.5,
                             "acceptance_rate_per_position": [0.8, 0.5, 0.2]} for s in sets]}))


@pytest.mark.parametrize("fail", [{"data"}, {"train-eagle3"}])
def test_pipeline_stages_budgets_and_summary(tmp_path, monkeypatch, capsys, fail):
    fake = FakeStages(fail)
    (tmp_path / "old" / tdh.HEADS["eagle"]).mkdir(parents=True)  # an earlier EAGLE-1 head, no EAGLE-3 one
    (tmp_path / "old" / tdh.HEADS["eagle"] / "config.json").write_text("{}")
    monkeypatch.setattr(tdh.subprocess, "run", fake)
    rc = tdh.main([str(tmp_path / "out"), "--data-dir", str(tmp_path / "data"), "--work-dir", str(tmp_path / "w"),
                   "--self-prompts", "5", "--deadline-s", "540", "--data-args", "--prompt-max-tokens 96",
                   "--warm-start", str(tmp_path / "old"), "--eagle3-soft-labels"])
    names = [c[0] for c in fake.calls]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    out = capsys.readouterr().out
    assert rc == 1 and out.rstrip().endswith(f"everything is in {tmp_path / 'out'}")
    data = fake.calls[0]
    assert data[0] == "data" and "--prompt-max-tokens" in data[1] and data[2] <= 540 - 120 - 35 - 180 + 30
    excluded = [data[1][i + 1] for i, c in enumerate(data[1]) if c == "--exclude"]
    assert excluded == [str(tmp_path / "data" / "gsm8k_test.jsonl"), str(tdh.GENERAL_CHAT)]
    assert float(data[1][data[1].index("--gen-time-budget-s") + 1]) == pytest.approx(540 - 335 - 60 - 35, abs=1)
    for name, cmd, timeout, env in fake.calls:
        if name.startswith("train"):
            budget = float(cmd[cmd.index("--time-budget-s") + 1])
            assert budget <= 540 - 120 - 35 and timeout == pytest.approx(budget + 35 + 30, abs=1)
            assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.45" and "JAX_COMPILATION_CACHE_DIR" in env
            assert cmd[cmd.index("--ttt-steps") + 1] == ("5" if name == "train-eagle3" else "1")
            assert ("--soft-labels" in cmd) == (name == "train-eagle3")
            init = cmd[cmd.index("--init-from") + 1] if "--init-from" in cmd else None
            assert init == (str(tmp_path / "old" / tdh.HEADS["eagle"]) if name == "train-eagle" else None)
        if name.startswith("eval"):
            assert timeout <= 540 and cmd[cmd.index("--k") + 1] == "3,5,1,2,4"
            assert f"general_chat={tdh.GENERAL_CHAT}" in cmd  # the human-written set is always evaluated
    if fail == {"data"}:
        retry = fake.calls[1]
        assert names[:2] == ["data", "data-retry"] and not any(c.startswith("self:") for c in retry[1])
        # the prompts came back, but their held-out split is empty: only GSM8K test is evaluated
        evals = [c for c in fake.calls if c[0].startswith("eval")]
        assert len(evals) == 2 and all("held_out=" not in " ".join(c[1]) for c in evals)
        assert "magpie prompts: 3 kept of 5 drawn" in out and (tmp_path / "out" / "prompts" / "meta.json").exists()
    else:
        assert sorted(names) == ["data", "eval-eagle", "train-eagle", "train-eagle3"]
        assert {s["stage"]: s["rc"] for s in summary["stages"]}["eval-eagle3"] == "skipped"
        assert summary["heads"]["eagle3"]["training"] is None and summary["heads"]["eagle"]["acceptance"]
    assert "| train-eagle | 0 |" in out and "**2.50** (0.80 / 0.50 / 0.20)" in out
    assert all(Path(s["log"]).exists() for s in summary["stages"] if "log" in s)
