"""Make the embedded default's training data, train its EAGLE-1 and EAGLE-3 heads and evaluate them, on one GPU in
one command that ends by a deadline.

    python3 bench/train_default_heads.py OUT --data-dir ../shared/data      # a fresh single-H200 machine

Stages (SmolLM2-135M-Instruct on one H200; default --deadline-s 540):
1. data, one process, ~205 s: the target writes up to --self-prompts user prompts (Magpie, for
   --prompts-budget-s), GSM8K test and bench/prompts/general_chat.jsonl excluded, 10 % held out; the train split
   and GSM8K train, deduplicated together, get the target's greedy answers (--answer-tokens) for what is left of
   the data share. Should it fail, it is retried once on GSM8K train alone.
2. train, two processes at once on the one GPU (each gets --mem-fraction of its memory): EAGLE-1 (unrolled for
   --eagle-ttt-steps steps), and EAGLE-3 with --ttt-steps training-time-test steps and a --draft-vocab-token
   vocabulary (against the target's distribution with --eagle3-soft-labels); --time-budget-s is set so that the
   evaluation still fits (--train-startup-s before the loop, --eval-reserve-s after it). With --warm-start DIR
   each head fine-tunes the one of its name in DIR (train-eagle --init-from).
3. evaluate, each head right after its training: bench/acceptance.py at k = --eval-k (the ones that matter first)
   on --eval-prompts prompts of the held-out split, of the human-written general_chat set and of GSM8K test,
   greedy, --eval-tokens tokens, scanned layers.
OUT gets the heads (OUT/weights/<head>/: bf16 config.json, model.safetensors, training.json, acceptance.json), the
prompt files (OUT/prompts/), one log per stage (OUT/logs/), summary.json, and the summary table, printed last. A
failed stage is recorded and the stages that do not need it go on. Prompts and the token dataset are kept in
--work-dir and reused by a second run with the same --seed and --self-prompts (--fresh starts over).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

HEADS = {"eagle": "eagle-smollm2-135m-instruct", "eagle3": "eagle3-smollm2-135m-instruct"}
# general chat prompts written by people for evaluation only: never a training prompt, nor near one
GENERAL_CHAT = ROOT / "bench" / "prompts" / "general_chat.jsonl"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="directory for heads, prompts, logs and summary.json")
    ap.add_argument("--data-dir", default=os.environ.get("DATA", "../shared/data"),
                    help="holds gsm8k_train.jsonl and gsm8k_test.jsonl (default $DATA or ../shared/data)")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--work-dir", default="weights/.cache/train-default-heads",
                    help="prompts, token dataset and compilation cache, reused by a later run")
    ap.add_argument("--fresh", action="store_true", help="delete this run's prompts and dataset in --work-dir first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline-s", type=float, default=540, help="everything ends by then (seconds from start)")
    # data
    ap.add_argument("--self-prompts", type=int, default=20000, help="Magpie prompts to keep at most")
    ap.add_argument("--prompts-budget-s", type=float, default=60)
    ap.add_argument("--gen-batch", type=int, default=256, help="engine batch while generating")
    ap.add_argument("--answer-tokens", type=int, default=384)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--data-args", default="", help="more train-eagle flags for the data stage (shell words)")
    # training
    ap.add_argument("--train-s", type=float, default=180, help="planned training loop seconds per head")
    ap.add_argument("--train-startup-s", type=float, default=35, help="a training process's start before its loop")
    ap.add_argument("--steps", type=int, default=20000, help="most steps (the time budget shortens the schedule)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--ttt-steps", type=int, default=5, help="EAGLE-3 training-time-test steps (k = 5 needs 5)")
    ap.add_argument("--eagle-ttt-steps", type=int, default=1,
                    help="EAGLE-1 unrolled steps: 1 is the paper's recipe; more trains drafts 2.. on the head's own "
                    "features, as they are made when drafting (HASS, EAGLE-3's training-time test)")
    ap.add_argument("--draft-vocab", type=int, default=8192, help="EAGLE-3 draft vocabulary")
    ap.add_argument("--eagle3-soft-labels", action="store_true",
                    help="EAGLE-3's cross-entropy against the target's distribution (train-eagle --soft-labels)")
    ap.add_argument("--warm-start", default="",
                    help="directory holding earlier heads (<dir>/<head name>/, e.g. weights): each head fine-tunes "
                    "its predecessor there instead of starting fresh")
    ap.add_argument("--train-args", default="", help="more train-eagle flags for both heads (shell words)")
    ap.add_argument("--mem-fraction", default="0.45",
                    help="XLA_PYTHON_CLIENT_MEM_FRACTION of each concurrent process ('' leaves it unset)")
    # evaluation
    ap.add_argument("--eval-reserve-s", type=float, default=120, help="kept for each head's evaluation")
    ap.add_argument("--eval-prompts", type=int, default=128)
    ap.add_argument("--eval-tokens", type=int, default=256)
    ap.add_argument("--eval-k", default="3,5,1,2,4")
    ap.add_argument("--eval-args", default="", help="more bench/acceptance.py flags (shell words)")
    return ap.parse_args(argv)


class Pipeline:
    """The clock, the stage records and the paths of one run."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.t0 = args, time.monotonic()
        self.out, self.data_dir = Path(args.out), Path(args.data_dir)
        self.work = Path(args.work_dir) / f"self{args.self_prompts}-seed{args.seed}"
        self.prompts, self.cache = self.work / "prompts", self.work / "mix.npz"
        self.stages: list[dict] = []
        self.lock = threading.Lock()
        # the checkout first, then whatever the caller's PYTHONPATH holds (e.g. packages carried as wheels)
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        self.env = dict(os.environ, PYTHONPATH=path, TQDM_MININTERVAL="10")
        # the persistent compilation cache: a second run on this machine skips the compiles
        self.env.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(args.work_dir).absolute() / "jax-cache"))
        self.env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "2")

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.args.deadline_s - self.elapsed()

    def log(self, msg: str) -> None:
        with self.lock:
            print(f"[{self.elapsed():5.0f} s] {msg}", flush=True)

    def stage(self, name: str, cmd: list[str], timeout: float, env: dict | None = None) -> int | str:
        """Run one command, its output in OUT/logs/NAME.log; the return code, "timeout" or "error: ..."."""
        log_path = self.out / "logs" / f"{name}.log"
        start = self.elapsed()
        self.log(f"{name}: start, timeout {timeout:.0f} s: {shlex.join(cmd)}")
        try:
            with open(log_path, "w") as f:
                rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env or self.env, cwd=ROOT,
                                    timeout=max(timeout, 1.0)).returncode
        except subprocess.TimeoutExpired:  # run() has killed the child
            rc = "timeout"
        except OSError as e:
            rc = f"error: {e}"
        record = {"stage": name, "rc": rc, "start_s": round(start, 1), "wall_s": round(self.elapsed() - start, 1),
                  "log": str(log_path), "command": shlex.join(cmd)}
        with self.lock:
            self.stages.append(record)
        self.log(f"{name}: rc {rc} after {record['wall_s']} s")
        return rc

    def skip(self, name: str, why: str) -> None:
        with self.lock:
            self.stages.append({"stage": name, "rc": "skipped", "why": why, "start_s": round(self.elapsed(), 1)})
        self.log(f"{name}: skipped ({why})")


def data_stage(p: Pipeline) -> None:
    a = p.args
    share = p.left() - a.eval_reserve_s - a.train_startup_s - a.train_s  # seconds this stage may take
    answers = share - a.prompts_budget_s - 35  # 35 s: start-up, screening and saving around the two budgets
    gsm_train, gsm_test = p.data_dir / "gsm8k_train.jsonl", p.data_dir / "gsm8k_test.jsonl"
    common = [sys.executable, "-m", "jaxspec", "train-eagle", "--model", a.model, "--seq-len", str(a.seq_len),
              "--max-tokens", str(a.answer_tokens), "--gen-batch", str(a.gen_batch), "--seed", str(a.seed),
              "--dataset-cache", str(p.cache), "--data-only", *shlex.split(a.data_args)]
    cmd = common + ["--data", f"self:{a.self_prompts}", "--data", str(gsm_train), "--exclude", str(gsm_test),
                    "--exclude", str(GENERAL_CHAT), "--prompts-out", str(p.prompts),
                    "--prompts-time-budget-s", str(a.prompts_budget_s),
                    "--gen-time-budget-s", str(max(answers, 10.0))]
    p.stage("data", cmd, timeout=share + 30)
    if p.cache.exists():
        return
    share = p.left() - a.eval_reserve_s - a.train_startup_s - 90  # at least 90 s of training after a retry
    if share < 60:
        return p.skip("data-retry", f"{share:.0f} s left for it")
    p.stage("data-retry", common + ["--data", str(gsm_train), "--gen-time-budget-s", str(share - 30)],
            timeout=share + 15)


def lane(p: Pipeline, method: str) -> None:
    """Train one head, then evaluate it."""
    a = p.args
    head = p.out / "weights" / HEADS[method]
    budget = p.left() - a.eval_reserve_s - a.train_startup_s
    if not p.cache.exists():
        return p.skip(f"train-{method}", "no dataset")
    if budget < 20:
        return p.skip(f"train-{method}", f"{budget:.0f} s left for its loop")
    env = dict(p.env, XLA_PYTHON_CLIENT_MEM_FRACTION=a.mem_fraction) if a.mem_fraction else p.env
    extra = ["--ttt-steps", str(a.ttt_steps if method == "eagle3" else a.eagle_ttt_steps)]
    if method == "eagle3":
        extra += ["--draft-vocab-size", str(a.draft_vocab)] + (["--soft-labels"] if a.eagle3_soft_labels else [])
    init = Path(a.warm_start) / HEADS[method] if a.warm_start else None
    if init is not None and (init / "config.json").exists():
        extra += ["--init-from", str(init)]
    elif init is not None:
        p.log(f"train-{method}: no head at {init}, so it starts fresh")
    p.stage(f"train-{method}", [
        sys.executable, "-m", "jaxspec", "train-eagle", "--model", a.model, "--method", method,
        "--dataset-cache", str(p.cache), "--seq-len", str(a.seq_len), "--steps", str(a.steps),
        "--batch-size", str(a.batch_size), "--lr", str(a.lr), "--time-budget-s", f"{budget:.0f}", "--seed",
        str(a.seed), "--out", str(head), *extra, *shlex.split(a.train_args)],
        timeout=budget + a.train_startup_s + 30, env=env)
    if not (head / "model.safetensors").exists():
        return p.skip(f"eval-{method}", "no head")
    held_out = p.prompts / "held_out.jsonl"
    sets = [f"held_out={held_out}"] if held_out.exists() and held_out.stat().st_size else []
    sets += [f"general_chat={GENERAL_CHAT}", f"gsm8k_test={p.data_dir / 'gsm8k_test.jsonl'}"]
    spec = json.dumps({"method": method, "model": str(head)})
    p.stage(f"eval-{method}", [
        sys.executable, str(ROOT / "bench" / "acceptance.py"), "--model", a.model, "--speculative-config", spec,
        "--k", a.eval_k, *[x for s in sets for x in ("--dataset", s)], "--num-prompts", str(a.eval_prompts),
        "--max-tokens", str(a.eval_tokens), "--layer-loop", "scan", "--time-budget-s", f"{max(p.left() - 45, 1):.0f}",
        "--output-json", str(head / "acceptance.json"), *shlex.split(a.eval_args)],
        timeout=p.left() - 3, env=env)


def summarize(p: Pipeline) -> str:
    """summary.json, and the table printed last: stages, each head's training, its acceptance."""
    from acceptance import acceptance_table

    from jaxspec.train.magpie import format_report

    heads, lines = {}, ["| stage | rc | start s | wall s |", "|---|---|---|---|"]
    lines += [f"| {s['stage']} | {s['rc']} | {s['start_s']} | {s.get('wall_s', '-')} |" for s in p.stages]
    meta = p.out / "prompts" / "meta.json"
    if meta.exists():
        lines += ["", format_report(json.loads(meta.read_text()))]
    for method, name in HEADS.items():
        d = p.out / "weights" / name
        info = json.loads((d / "training.json").read_text()) if (d / "training.json").exists() else None
        acc = json.loads((d / "acceptance.json").read_text()) if (d / "acceptance.json").exists() else None
        heads[method] = {"dir": str(d), "training": info and {k: info.get(k) for k in (
            "steps_done", "wall_s", "final_loss_avg50", "final_acc_avg50", "draft_vocab_size",
            "draft_vocab_coverage")}, "acceptance": acc and acc["results"]}
        if info:
            data = info["data"]
            lines += ["", f"{name}: {info['steps_done']} steps x {info['batch_size']} rows in {info['wall_s']} s, "
                      f"final top-1 acc {info['final_acc_avg50']}; data {data['num_sequences']} rows, "
                      f"{data['response_tokens']} response tokens"
                      + (f"; draft vocab {info['draft_vocab_size']} covers {info['draft_vocab_coverage']:.1%}"
                         if info.get("draft_vocab_coverage") is not None else "")]
        if acc:
            lines += [acceptance_table(acc)]
    summary = {"args": vars(p.args), "elapsed_s": round(p.elapsed(), 1), "stages": p.stages, "heads": heads}
    (p.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return "\n".join(lines + ["", f"total {p.elapsed():.0f} s of a {p.args.deadline_s:.0f} s deadline; "
                                  f"everything is in {p.out}"])


def main(argv: list[str] | None = None) -> int:
    p = Pipeline(parse_args(argv))
    (p.out / "logs").mkdir(parents=True, exist_ok=True)
    if p.args.fresh:
        shutil.rmtree(p.work, ignore_errors=True)
    p.log(f"deadline {p.args.deadline_s:.0f} s; data {p.data_dir}, work {p.work}, out {p.out}")
    data_stage(p)
    if p.prompts.exists():
        shutil.copytree(p.prompts, p.out / "prompts", dirs_exist_ok=True)
    lanes = [threading.Thread(target=lane, args=(p, m)) for m in HEADS]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    print(summarize(p), flush=True)
    return 0 if len(p.stages) == 5 and all(s["rc"] == 0 for s in p.stages) else 1  # data, 2 x (train, eval)


if __name__ == "__main__":
    sys.exit(main())
