"""The throughput benchmark on CPU: one sweep point (async and sync, EAGLE and plain) on a tiny random model, the
HF peer on a tiny real checkpoint, the trace arithmetic, and the JSONL reader. Speed is not checked here; the
plumbing, the printed line and the JSON fields are."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from jaxspec.bench import data, profile, report
from jaxspec.bench.throughput import main

THROUGHPUT = re.compile(r"^Throughput: ([\d.]+) requests/s, ([\d.]+) total tokens/s, ([\d.]+) output tokens/s",
                        re.M)
TINY = data.HF_CONFIGS["tiny"] | {"vocab_size": 256, "hidden_size": 32, "intermediate_size": 64,
                                  "num_attention_heads": 2, "num_key_value_heads": 1}
SMALL = ["--input-len", "8", "--max-tokens", "8", "--max-num-batched-tokens", "16", "--decode-buckets", "2",
         "--prefill-buckets", "16", "--no-warmup-compile"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    (tmp / "config.json").write_text(json.dumps(TINY))
    argv = ["--load-format", "dummy", "--hf-config", str(tmp / "config.json"), "--sweep", "--sweep-prompts", "2",
            "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}', *SMALL,
            "--results-dir", str(tmp / "results"), "--output-json", str(tmp / "out.json"),
            "--update-results-md", str(tmp / "RESULTS.md"), "--profile-dir", str(tmp / "prof"),
            "--profile-max-tokens", "4", "--profile-repeats", "2", "--measure-bandwidth",
            "--bandwidth-bytes", str(1 << 20), "--measure-matmul"]
    return tmp, argv


def test_sweep_point(sweep, capsys, monkeypatch):
    tmp, argv = sweep
    real = profile.sampled_utilization

    def with_span(fn, local_id=0):  # no NVML here: stand in the span it would have measured
        t0 = time.perf_counter()
        result, out = real(fn, local_id)
        return result, out | {"nvml_span_s": time.perf_counter() - t0}

    monkeypatch.setattr(profile, "sampled_utilization", with_span)
    result = main(argv)
    out = capsys.readouterr().out
    lines = THROUGHPUT.findall(out)
    assert len(lines) == 4  # {eagle, no spec} x {async, sync}
    assert all(float(x) > 0 for line in lines for x in line)
    assert "mean acceptance length" in out and "per-position acceptance" in out
    assert not result["errors"], result["errors"]

    saved = json.loads((tmp / "out.json").read_text())
    assert saved["label"] == result["label"] and saved["machine"]["backend"] == "cpu"
    assert {(p["mode"], p["async"]) for p in saved["points"]} == {
        ("eagle k=2", True), ("eagle k=2", False), ("no spec", True), ("no spec", False)}
    for p in saved["points"]:
        assert p["num_prompts"] == p["num_requests"] == 2
        assert p["output_tokens"] == 16 and p["prompt_tokens"] == 16  # ignore_eos: exactly max_tokens each
        assert p["output_tokens_per_s"] > 0 and p["num_steps"] > 0 and p["recompiles"] == 0
    eagle = [p for p in saved["points"] if p["mode"] == "eagle k=2"]
    assert all(len(p["acceptance_rate_per_position"]) == 2 and p["mean_acceptance_length"] >= 1 for p in eagle)
    assert set(saved["identical"]) == {"2/eagle k=2", "2/no spec"}
    assert all(v["all"] and v["fraction"] == 1.0 for v in saved["identical"].values())
    assert saved["models"]["eagle k=2"]["bytes"]["draft_weights_per_pass"] > 0
    assert saved["models"]["eagle k=2"]["flops"]["draft_verified_per_token"] > 0
    assert saved["models"]["no spec"]["flops"]["draft_verified_per_token"] == 0
    assert saved["roofline"] == [] and saved["bandwidth"]["tb_s"] > 0  # measured, but a CPU's: no roofline
    assert saved["matmul"]["tflop_s"] > 0 and saved["matmul"]["n"] == 512  # likewise
    assert "Roofline" not in out and "FLOPs floor" not in out
    assert "\nno roofline: cpu is not a GPU (the floor is a GPU's memory bandwidth)\n" in out
    assert len(saved["profile"]) == 4
    assert all(0 < p["busy_fraction"] <= 1 and p["num_steps"] > 0 for p in saved["profile"])
    assert all(p["nvml_repeats"] == 2 and "nvml_error" in p for p in saved["profile"])  # no NVML GPU here
    for p in saved["profile"]:
        assert 0 < p["nvml_engine_fraction"] <= 1 and 0 < p["nvml_host_work_per_step_ms"] <= p["nvml_wall_per_step_ms"]
        assert p["traced_kernels_over_untraced_wall"] > 0
        assert sum(g["fraction"] for g in p["idle_gaps"]) == pytest.approx(1 - p["busy_fraction"])
    assert list((tmp / "results").glob("*.json"))
    md = (tmp / "RESULTS.md").read_text()
    assert result["label"] in md and "| num_prompts | mode |" in md


def test_tensor_parallel_flag_gives_the_same_outputs(tmp_path):
    """--tensor-parallel-size 2 (two of the test's host devices) generates what one device does, with EAGLE."""
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    digests = {}
    for tp in (1, 2):
        argv = ["--load-format", "dummy", "--hf-config", str(tmp_path / "config.json"), "--num-prompts", "2",
                "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}', *SMALL,
                "--tensor-parallel-size", str(tp), "--output-json", str(tmp_path / f"tp{tp}.json")]
        result = main(argv)
        assert not result["errors"], result["errors"]
        (point,) = result["points"]
        digests[tp] = point["outputs_sha256"]
        assert result["models"][point["mode"]]["bytes"]["tensor_parallel_size"] == tp  # what the LLM ran
        assert (f"tp {tp}" in result["label"]) == (tp > 1)
    assert digests[1] == digests[2]


def test_sampling_options_reach_every_request(tmp_path):
    """--logprobs and the processors go into each request's SamplingParams and the run's label."""
    import argparse

    from jaxspec.bench.throughput import add_arguments, sampling_params

    (tmp_path / "config.json").write_text(json.dumps(TINY))
    options = ["--logprobs", "5", "--presence-penalty", "0.5", "--frequency-penalty", "0.1",
               "--repetition-penalty", "1.1", "--min-p", "0.05", "--min-tokens", "2"]
    result = main(["--load-format", "dummy", "--hf-config", str(tmp_path / "config.json"), "--num-prompts", "2",
                   "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}', *SMALL, *options])
    assert not result["errors"], result["errors"]
    assert "logprobs 5" in result["label"] and "presence penalty 0.5" in result["label"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    (params, _) = sampling_params(parser.parse_args(options + ["--ignore-eos"]), 2)
    assert (params.logprobs, params.presence_penalty, params.frequency_penalty, params.repetition_penalty,
            params.min_p, params.min_tokens) == (5, 0.5, 0.1, 1.1, 0.05, 2)


def test_sweep_without_the_plain_mode(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    result = main(["--load-format", "dummy", "--hf-config", str(tmp_path / "config.json"), "--sweep",
                   "--sweep-prompts", "2", "--sweep-no-plain", "--synthetic-acceptance", "0.5",
                   "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}', *SMALL,
                   "--results-dir", str(tmp_path)])
    assert not result["errors"], result["errors"]
    assert {(p["mode"], p["async"]) for p in result["points"]} == {("eagle k=2 synthetic p=0.5", True),
                                                                   ("eagle k=2 synthetic p=0.5", False)}


def test_repeats_report_the_median_run_of_balanced_rounds(tmp_path, monkeypatch):
    """--repeats 3 with --sweep-k: every policy is timed three times, each round starting with the next policy,
    and its point is the median run, with all three figures."""
    from jaxspec.bench import throughput

    order, real = [], throughput.timed_point

    def timed(args, bench, llm, prompts, point, outputs, options=None):
        order.append(point["mode"])
        return real(args, bench, llm, prompts, point, outputs, options)

    monkeypatch.setattr(throughput, "timed_point", timed)
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    result = main(["--load-format", "dummy", "--hf-config", str(tmp_path / "config.json"), "--sweep",
                   "--sweep-prompts", "2", "--sweep-k", "--sweep-no-plain", "--repeats", "3",
                   "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 1}', *SMALL,
                   "--results-dir", str(tmp_path)])
    assert not result["errors"], result["errors"]
    modes = ["eagle k=1 dynamic", "eagle k=1 k=0", "eagle k=1 k=1"]
    assert order == modes + modes[1:] + modes[:1] + modes[2:] + modes[:2]
    assert [p["mode"] for p in result["points"]] == modes
    for p in result["points"]:
        runs = p["repeats_output_tokens_per_s"]
        assert len(runs) == 3 and p["output_tokens_per_s"] == sorted(runs)[1]
    # the dynamic policy against the best fixed k: by medians, and round by round
    points = {p["mode"]: p for p in result["points"]}
    best = max(modes[1:], key=lambda m: points[m]["output_tokens_per_s"])
    dynamic_runs, best_runs = (points[m]["repeats_output_tokens_per_s"] for m in (modes[0], best))
    [row] = result["dynamic_vs_best"]
    assert row["best_mode"] == best and row["num_prompts"] == 2
    assert row["ratio"] == pytest.approx(points[modes[0]]["output_tokens_per_s"] / points[best]["output_tokens_per_s"])
    assert row["paired_ratio"] == pytest.approx(sorted(x / y for x, y in zip(dynamic_runs, best_runs))[1])
    assert (row["dynamic_steps"], row["best_steps"]) == (points[modes[0]]["num_steps"], points[best]["num_steps"])
    assert row["same_outputs"] == (points[modes[0]]["outputs_sha256"] == points[best]["outputs_sha256"])
    assert f"{row['dynamic_steps']} / {row['best_steps']}" in report.dynamic_table(result["dynamic_vs_best"])
    with pytest.raises(SystemExit):
        main(["--model", "no-model-needed", "--repeats", "0"])


@pytest.mark.parametrize("n", range(1, 9))
def test_round_order_puts_each_mode_first_once_and_behind_each_other_equally_often(n):
    """A Williams design: over n rounds (2n for odd n) every mode leads once (twice) and follows every other mode
    once (twice); a rotation of one order would keep each mode behind the same one in every round."""
    from jaxspec.bench.throughput import round_order

    rounds = [round_order(n, r) for r in range(n if n % 2 == 0 else 2 * n)]
    assert all(sorted(order) == list(range(n)) for order in rounds)
    times = 1 if n % 2 == 0 else 2
    assert Counter(order[0] for order in rounds) == {m: times for m in range(n)}
    follows = Counter((a, b) for order in rounds for a, b in zip(order, order[1:]))
    assert follows == {(a, b): times for a in range(n) for b in range(n) if a != b}


def test_sweep_sampling_alternates_two_settings_on_one_llm(tmp_path, monkeypatch, capsys):
    """--sweep-sampling: the mode's LLM runs the base setting and the extra one in turn in every round, with the
    extra options in each request of its runs and its programs compiled before timing (no run compiles)."""
    from jaxspec.bench import throughput

    seen, real = [], throughput.run_point

    def run_point(llm, prompts, params, is_async):
        seen.append({(p.logprobs, p.presence_penalty) for p in params})
        return real(llm, prompts, params, is_async)

    monkeypatch.setattr(throughput, "run_point", run_point)
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    argv = ["--load-format", "dummy", "--hf-config", str(tmp_path / "config.json"), "--num-prompts", "2",
            "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 1}',
            *[a for a in SMALL if a != "--no-warmup-compile"], "--repeats", "2"]
    result = main(argv + ["--sweep-sampling", '{"logprobs": 2, "presence_penalty": 0.5}'])
    assert not result["errors"], result["errors"]
    base, extra = {(None, 0.0)}, {(2, 0.5)}
    assert seen[-4:] == [base, extra, extra, base]  # after the build's warm-up: round 2 starts one setting later
    assert [p["mode"] for p in result["points"]] == ["eagle k=1", "eagle k=1 + logprobs=2 presence_penalty=0.5"]
    assert all(p["recompiles"] == 0 and len(p["repeats_output_tokens_per_s"]) == 2 for p in result["points"])
    with pytest.raises(SystemExit):
        main(argv + ["--sweep-sampling", '{"temperature": 1.0}'])
    assert "--sweep-sampling: unknown option(s) ['temperature']" in capsys.readouterr().err


def test_rerender_and_cli(sweep, capsys):
    """`jaxspec bench throughput --from-json` re-renders a saved run; the section is replaced, not duplicated."""
    from jaxspec.cli import main as cli_main

    tmp, _ = sweep
    if not (tmp / "out.json").exists():
        pytest.skip("needs test_sweep_point's output")
    cli_main(["bench", "throughput", "--from-json", str(tmp / "out.json"), "--update-results-md",
              str(tmp / "RESULTS.md")])
    assert "| num_prompts | mode |" in capsys.readouterr().out
    label = json.loads((tmp / "out.json").read_text())["label"]
    assert (tmp / "RESULTS.md").read_text().count(report.MD_BEGIN.format(label)) == 1


def test_hf_peer_agrees(tmp_path, capsys):
    """The same weights in transformers and here: greedy first tokens agree, and the HF row is reported."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = {k: v for k, v in TINY.items() if k != "architectures"}
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    for p in model.parameters():  # larger weights than the default init, so the argmax is decisive
        p.data.normal_(0, 0.3)
    model.save_pretrained(tmp_path / "hf")
    result = main(["--model", str(tmp_path / "hf"), "--num-prompts", "2", "--hf-baseline", *SMALL])
    out = capsys.readouterr().out
    assert len(THROUGHPUT.findall(out)) == 1
    assert not result["errors"], result["errors"]
    hf = result["hf"]
    assert not hf.get("error") and not hf["random_weights"]
    assert hf["runs"]["2"]["output_tokens"] == 16
    assert result["hf_agreement"]["2/no spec"]["requests_exact"] == 1.0


def test_identity():
    from jaxspec.bench.throughput import identity
    got = identity([[1, 2, 3], [4, 5, 6], [7, 8]], [[1, 2, 3], [4, 9, 6], [7, 8, 0]])
    assert got == {"all": False, "fraction": 1 / 3, "first_mismatch": 1, "earliest_differing_token": 1,
                   "median_differing_token": 2}


def test_device_busy_from_trace():
    """Union of stream intervals inside the annotated span; derived lines and other processes ignored."""
    ev = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
          {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0"}},
          {"ph": "M", "pid": 2, "tid": 7, "name": "thread_name", "args": {"name": "Stream #7(Compute)"}},
          {"ph": "M", "pid": 2, "tid": 8, "name": "thread_name", "args": {"name": "Stream #8(MemcpyD2H)"}},
          {"ph": "M", "pid": 2, "tid": 9, "name": "thread_name", "args": {"name": "XLA Modules"}},
          {"ph": "X", "pid": 1, "tid": 1, "ts": 100, "dur": 100, "name": profile.ANNOTATION},
          {"ph": "X", "pid": 2, "tid": 7, "ts": 90, "dur": 20, "name": "gemm"},  # 10 inside the span
          {"ph": "X", "pid": 2, "tid": 7, "ts": 120, "dur": 30, "name": "fusion"},
          {"ph": "X", "pid": 2, "tid": 8, "ts": 140, "dur": 20, "name": "MemcpyD2H"},  # overlaps fusion by 10
          {"ph": "X", "pid": 2, "tid": 9, "ts": 100, "dur": 100, "name": "jit_decode_step"},
          {"ph": "X", "pid": 1, "tid": 1, "ts": 150, "dur": 40, "name": "host work"}]
    busy = profile.device_busy({"traceEvents": ev})
    assert busy["method"] == "device streams" and busy["span_ms"] == pytest.approx(0.1)
    assert busy["busy_fraction"] == pytest.approx(0.5)  # [100,110) + [120,160)
    assert busy["compute_busy_fraction"] == pytest.approx(0.4)
    assert profile.union_length([(0, 2), (1, 3), (5, 6)]) == 4
    # idle [110, 120) and [160, 200): one 2-10 us gap would be 10 us, so it is in 10-100 with the 40 us one
    assert [(g["count"], g["ms"]) for g in busy["idle_gaps"]] == [(0, 0), (0, 0), (2, pytest.approx(0.05)), (0, 0)]
    assert sum(g["fraction"] for g in busy["idle_gaps"]) == pytest.approx(1 - busy["busy_fraction"])


def test_idle_gaps_by_length():
    """Gaps between busy intervals (and before the first, after the last) binned at 2 / 10 / 100 us."""
    got = profile.idle_gaps([(1, 2), (3, 4), (3.5, 8), (20, 30), (200, 210), (500, 600)], 0, 400)
    assert [g["gap"] for g in got] == ["< 2 us", "2-10 us", "10-100 us", ">= 100 us"]
    assert [(g["count"], g["ms"]) for g in got] == [(2, pytest.approx(0.002)), (0, 0), (1, pytest.approx(0.012)),
                                                   (2, pytest.approx(0.36))]
    assert sum(g["fraction"] for g in got) == pytest.approx(1 - 26 / 400)  # busy: 1 + 5 + 10 + 10 + 0 (outside)
    assert report.gaps(got).startswith("< 2 us 0.5%, 2-10 us 0.0%, 10-100 us 3.0%")


def test_nvml_busy_keeps_samples_whose_period_lies_inside_the_call(monkeypatch):
    """A utilization sample covers the period before its time stamp: one that began before the call (idle, for all
    we know) or stamped after it is left out; the others are averaged."""
    import types

    class Sample:
        def __init__(self, ts, value):
            self.timeStamp, self.sampleValue = ts, types.SimpleNamespace(uiVal=value)

    clock = iter([1000.0, 1001.0])  # seconds: the call runs from 1000 to 1001
    monkeypatch.setattr(time, "time", lambda: next(clock))
    us = 1_000_000
    samples = [Sample(1000 * us + 100_000, 0), Sample(1000 * us + 300_000, 90), Sample(1000 * us + 500_000, 100),
               Sample(1000 * us + 700_000, 98), Sample(1001 * us + 100_000, 0)]
    fake = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: i,
                                 nvmlShutdown=lambda: None, NVML_GPU_UTILIZATION_SAMPLES=1, NVMLError=RuntimeError,
                                 nvmlDeviceGetSamples=lambda h, kind, since: (0, samples))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    result, out = profile.sampled_utilization(lambda: "done")
    assert result == "done" and out["nvml_period_ms"] == pytest.approx(200)
    assert out["nvml_samples"] == 3 and out["nvml_busy_fraction"] == pytest.approx((90 + 100 + 98) / 300)
    assert out["nvml_min"] == pytest.approx(0.9)


class _Tokenizer:
    chat_template = "x"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|assistant:"

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]


def test_dataset_prompts(tmp_path):
    rows = [{"question": "q1", "answer": "a"}, {"turns": ["t1", "t2"]}, {"prompt": "p"},
            {"turns": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "drop"}]}]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    got = ["".join(map(chr, ids)) for ids in data.dataset_prompts(path, 5, _Tokenizer())]
    assert got == ["user:q1|assistant:", "user:t1|assistant:", "user:p|assistant:", "user:u|assistant:",
                   "user:q1|assistant:"]  # cycled
    path.write_text(path.read_text() + json.dumps({"other": 1}) + "\n")
    with pytest.raises(ValueError, match=r"d.jsonl:5: row has none of the fields"):
        data.dataset_prompts(path, 5, _Tokenizer())
    assert data.random_prompts(3, 5, 100, 0) == data.random_prompts(3, 5, 100, 0)
    with pytest.raises(ValueError, match="tokenizer"):
        data.dataset_prompts(path, 1, None)


def test_general_chat_prompts_are_varied_and_kept_out_of_training():
    """The human-written evaluation set: 100 distinct prompts, every category in any first 8, none sharing a
    10-gram with GSM8K (so it measures general chat), and the training pipeline's overlap screen drops a copy."""
    from jaxspec.prompts import read_prompts
    from jaxspec.train.prompt_filters import OverlapIndex

    path = Path(__file__).resolve().parents[1] / "bench" / "prompts" / "general_chat.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    prompts = read_prompts(path)
    categories = sorted({r["category"] for r in rows})
    assert len(prompts) == len(set(prompts)) == 100 and len(categories) == 8
    assert {r["category"] for r in rows[:8]} == set(categories)
    index = OverlapIndex(prompts)
    assert index.overlaps(prompts[7].upper() + "  ") and not index.overlaps("Write a poem about the sea.")
    gsm = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k_test.jsonl"
    if gsm.exists():
        assert not any(OverlapIndex(read_prompts(gsm)).overlaps(p) for p in prompts)


@pytest.mark.parametrize("argv, message", [
    (["--dataset-name", "sharegpt"], "--dataset-name: invalid choice: 'sharegpt'"),
    (["--dataset-name", "custom"], "--dataset-name custom needs --dataset-path"),
    (["--dataset-name", "random", "--dataset-path", "x.jsonl"], "random makes its own prompts: drop --dataset-path"),
])
def test_dataset_name_errors_name_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(["--model", "no-model-needed", *argv])
    assert re.search(message, capsys.readouterr().err)


def test_dataset_path_is_vllms_name_for_dataset(tmp_path):
    """--dataset-path FILE (vLLM) and --dataset FILE (ours) read the same JSONL, as --dataset-name custom."""
    from jaxspec.bench.throughput import add_arguments, check_dataset, make_prompts, model_source
    from tests.tiny import write_model_dir

    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"question": "abc"}) + "\n")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    model = str(write_model_dir(tmp_path / "m"))  # its character tokenizer: "abc" is [0, 1, 2]
    prompts = []
    for flags in (["--dataset-path", str(path)], ["--dataset", str(path)], ["--dataset-name", "custom",
                                                                              "--dataset-path", str(path)]):
        args = parser.parse_args(["--model", model, *flags])
        assert check_dataset(args) == "custom"
        prompts.append(make_prompts(args, model_source(args), 2)[0])
    assert prompts[0] == prompts[1] == prompts[2] == [[0, 1, 2]] * 2


H200 = {"backend": "gpu", "device_kind": "NVIDIA H200"}
A100 = {"backend": "gpu", "device_kind": "NVIDIA A100-SXM4-80GB"}


def _model(target_weights: float, target_flops: int = 0) -> dict:
    """A result's model entry without speculation: `target_weights` bytes read, `target_flops` per token."""
    flops = {"k": 0, "target_per_token": target_flops, "target_attn_per_token_ctx": 0, "draft_verified_per_token": 0,
             "draft_rollout_per_token": 0, "draft_lm_head_per_token": 0, "draft_attn_per_token_ctx": 0}
    return {"bytes": {"k": 0, "target_weights": target_weights, "draft_weights_per_pass": 0, "kv_per_token_target": 0,
                      "kv_per_token_draft": 0}, "flops": flops}


def _point(mode: str = "m", num_prompts: int = 1, step_ms: float = 2.0) -> dict:
    return {"num_prompts": num_prompts, "num_requests": num_prompts, "mode": mode, "async": True, "num_steps": 10,
            "prompt_tokens": 8 * num_prompts, "output_tokens": 8 * num_prompts, "wall_per_step_ms": step_ms}


@pytest.mark.parametrize("machine, bandwidth, tbs, rows", [
    (H200, {}, None, 4.3),  # known for an H200
    (H200, {"tb_s": 4.0}, None, 4.0),  # measured wins
    (A100, {}, 2.0, 2.0),  # given
    (A100, {}, None, None),  # unknown: none
    ({"backend": "cpu", "device_kind": "cpu"}, {"tb_s": 0.05}, 4.3, None),  # a CPU: never
])
def test_roofline_only_with_a_gpus_bandwidth(machine, bandwidth, tbs, rows):
    result = {"machine": machine, "bandwidth": bandwidth, "matmul": {"tflop_s": 0.1},
              "args": {"bandwidth_tbs": tbs, "matmul_tflops": 500.0, "max_num_seqs": 1},
              "points": [_point()], "models": {"m": _model(4.3e9)}}
    got = report.roofline(result)
    if rows is None:
        assert got == [] and report.roofline_bandwidth(result)[1].startswith("no roofline: ")
    else:
        assert got[0]["bandwidth_tb_s"] == rows and got[0]["floor_ms"] == pytest.approx(4.3 / rows)


@pytest.mark.parametrize("machine, matmul, tflops, rate", [
    (H200, {}, None, report.KNOWN_MATMUL_TFLOPS["NVIDIA H200"]),  # known for an H200
    (H200, {"tflop_s": 700.0}, 500.0, 700.0),  # measured wins
    (A100, {}, 250.0, 250.0),  # given
    (A100, {}, None, None),  # unknown: the byte floor only
])
def test_matmul_rate_sources(machine, matmul, tflops, rate):
    result = {"machine": machine, "matmul": matmul, "args": {"bandwidth_tbs": 2.0, "matmul_tflops": tflops,
                                                             "max_num_seqs": 1},
              "points": [_point()], "models": {"m": _model(2e9, target_flops=int(1e12))}}
    (row,) = report.roofline(result)
    assert row["matmul_tflop_s"] == rate and row["bytes_floor_ms"] == pytest.approx(1.0)
    if rate is None:
        assert row["flops_floor_ms"] is None and row["bound"] is None and row["floor_ms"] == row["bytes_floor_ms"]
        assert report.roofline_matmul(result)[1].startswith("no FLOPs floor: ")
    else:
        assert row["flops_floor_ms"] == pytest.approx(1e3 / rate)


def test_floor_is_the_larger_and_the_table_names_it():
    """A step is held to whichever of bytes / bandwidth and FLOPs / matmul rate is longer."""
    result = {"machine": H200, "args": {"bandwidth_tbs": 4.0, "matmul_tflops": 800.0, "max_num_seqs": 96},
              "points": [_point("small", 1, 3.0), _point("big", 96, 9.0)],
              # 8e9 bytes: 2 ms. FLOPs per token 8e10: 0.1 ms at batch 1, 9.6 ms at batch 96
              "models": {"small": _model(8e9, int(8e10)), "big": _model(8e9, int(8e10))}}
    small, big = result["roofline"] = report.roofline(result)
    assert (small["bound"], small["floor_ms"], small["flops_floor_ms"]) == ("bytes", pytest.approx(2.0),
                                                                            pytest.approx(0.1))
    assert (big["bound"], big["floor_ms"], big["bytes_floor_ms"]) == ("flops", pytest.approx(9.6), pytest.approx(2.0))
    assert big["ratio"] == pytest.approx(9.0 / 9.6) and big["gflop_per_step"] == pytest.approx(96 * 80)
    header, _, row_small, row_big = report.roofline_table(result).splitlines()
    assert header.endswith("| bytes floor ms | FLOPs floor ms | floor ms | measured ms/step | measured/floor | bound |")
    assert row_small.endswith("| 2.00 | 0.10 | 2.00 | 3.00 | 1.50x | bytes |")
    assert row_big.endswith("| 2.00 | 9.60 | 9.60 | 9.00 | 0.94x | flops |")
    assert report.roofline_rates(result) == "copy 4.00 TB/s (--bandwidth-tbs), matmul 800 TFLOP/s (--matmul-tflops)"


def test_old_results_render_the_byte_floor_only():
    """A JSON from before FLOPs were counted: stored rows without FLOP fields, models without "flops"."""
    old_row = {"num_prompts": 1, "mode": "m", "async": True, "batch": 1, "ctx": 12.0, "gb_per_step": 4.3,
               "floor_ms": 1.0, "step_ms": 2.0, "ratio": 2.0, "bandwidth_tb_s": 4.3, "bandwidth_measured": True}
    result = {"machine": H200, "args": {"bandwidth_tbs": None, "max_num_seqs": 1}, "roofline": [old_row],
              "points": [_point()], "models": {"m": {"bytes": _model(4.3e9)["bytes"]}}}
    assert report.roofline_table(result).splitlines()[-1].endswith(
        "| 4.30 | n/a | 1.00 | n/a | 1.00 | 2.00 | 2.00x | n/a |")
    assert report.roofline_rates(result) == "copy 4.30 TB/s; no FLOPs floor: FLOPs not counted in this result"
    (row,) = report.roofline(result)  # recomputed: the model has bytes only
    assert row["gflop_per_step"] is None and row["bound"] is None and row["floor_ms"] == pytest.approx(1.0)


@pytest.mark.parametrize("method, k, flops", [
    (None, 0, 3 * 1 * (53248 + 10 * 256)),
    # EAGLE-1: 3 verified pairs + 1 single-token pass, fc in each, the target's LM head for each of 2 drafts
    ("eagle", 2, 3 * 3 * (53248 + 10 * 256) + 3 * (3 + 1) * (22528 + 10 * 128) + 3 * 2 * 16384),
    # EAGLE-3: fc only in the pass over target features, attention 2H wide, a 64-token draft vocabulary
    ("eagle3", 2, 3 * 3 * (53248 + 10 * 256) + 3 * 3 * (26624 + 10 * 128) + 3 * 1 * (22528 + 10 * 128)
     + 3 * 2 * 4096),
])
def test_step_flops_against_a_hand_count(method, k, flops):
    """H 32, I 64, 2 layers, 4 heads of 8, 2 KV heads, V 256; batch 3, k 2, context 10. Per layer qkv 32 x 64,
    o 32 x 32, gate_up 32 x 128, down 64 x 32: 9,216 weights; target 2 x (2 x 9,216 + LM head 32 x 256) = 53,248
    FLOPs per token, attention 4 x 4 x 8 x 2 layers = 256 per context token. EAGLE-1 head: fc 64 x 32 + one layer,
    2 x 11,264 = 22,528; EAGLE-3: fc 64 x 32 (two aux layers) + qkv 64 x 64 + the rest, 2 x 13,312 = 26,624, without
    fc 22,528, LM head 2 x 32 x 64; head attention 4 x 4 x 8 = 128. A plain step has k = 0: batch 3 x 1 token."""
    from jaxspec.bench.engine import step_flops_per_token
    from jaxspec.models import eagle, llama

    cfg = llama.Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=8)
    dcfg = None if method is None else eagle.EagleConfig.from_target(
        cfg, method, draft_vocab_size=64 if method == "eagle3" else None, aux_layers=(0, 1))
    assert report.step_flops({"flops": step_flops_per_token(cfg, dcfg, k)}, 3, 10) == flops


def test_mode_label_names_the_heads_lookup_fallback():
    from jaxspec.bench.throughput import mode_label

    assert mode_label({"method": "eagle3", "num_speculative_tokens": 3}, None) == "eagle3 k=3"
    fallback = {"method": "eagle3", "num_speculative_tokens": 3, "prompt_lookup_max": 5}
    assert mode_label(fallback, None) == "eagle3 k=3 + lookup"
    assert mode_label({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 5}, 0.6) == \
        "ngram k=2 synthetic p=0.6"
    assert mode_label(None, None) == "no spec"
