"""Host work per engine step (scheduling, dispatch, output handling): what async scheduling must hide.

    python bench/host_work.py --batch 96 --k 3 [--logprobs 5] [--presence-penalty 0.5] [--numpy-device]
        [--num-scheduler-steps 4] [--profile]

A 2-layer Llama with SmolLM2's vocabulary and tokenizer (random weights, so the device step is short and the
host's share shows), a random EAGLE-1 head at synthetic acceptance 0.7, greedy, EOS ignored. Host work =
(engine wall - time blocked reading outputs) / steps, median (and least) of `--runs` runs after a warm-up run;
beside it the whole generate call's time per step (what the engine's steps leave to the call: its texts).
`--numpy-device` replaces the runner's device calls by numpy outputs of the same shapes (drafts accepted with
probability 0.7): the engine's own Python alone, without JAX's dispatch, the device's work competing for this
machine's cores, or a GPU. `--profile` adds a cProfile of one run, by own time. Python's cyclic garbage
collections during the timed calls are counted and timed (gc.callbacks): each lands inside some step. Needs the
SmolLM2 tokenizer (`jaxspec fetch`).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxspec import LLM, SamplingParams, presets  # noqa: E402
from jaxspec.loader import dummy_config  # noqa: E402
from jaxspec.resolve import resolve_model  # noqa: E402


def tiny_model_dir(hf: Path) -> Path:
    """SmolLM2's config shrunk to two small layers, with its tokenizer files."""
    d = Path(tempfile.mkdtemp()) / "tiny-smollm2"
    d.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(hf / f, d / f)
    cfg = json.loads((hf / "config.json").read_text())
    cfg.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--k", type=int, default=3, help="speculative tokens (0: plain decoding)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--logprobs", type=int, metavar="N", help="top-N logprobs per output token")
    ap.add_argument("--presence-penalty", type=float, default=0.0)
    ap.add_argument("--numpy-device", action="store_true", help="numpy outputs in place of the device calls")
    ap.add_argument("--num-scheduler-steps", type=int, default=1, help="decode steps a dispatch (not with "
                    "--numpy-device: its outputs are single steps)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if args.numpy_device and args.num_scheduler_steps > 1:
        ap.error("--numpy-device makes single steps' outputs: leave --num-scheduler-steps at 1")

    hf = resolve_model(presets.DEFAULT_PRESET).hf_dir
    spec = {"method": "eagle", "model": "-", "num_speculative_tokens": args.k} if args.k else None
    model_dir = tiny_model_dir(hf)
    llm = LLM.from_weights(dummy_config(model_dir, "float32"), None, tokenizer=model_dir, load_format="dummy",
                           speculative_config=spec, synthetic_acceptance=0.7 if args.k else None,
                           max_num_seqs=args.batch, max_model_len=512, decode_buckets=[args.batch],
                           prefill_buckets=[256, 2048], num_scheduler_steps=args.num_scheduler_steps, warmup=False)
    if args.numpy_device:
        numpy_device(llm.llm_engine.runner, args.batch)
    prompts = np.random.default_rng(0).integers(0, 49152, (args.batch, 32)).tolist()
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True, logprobs=args.logprobs,
                            presence_penalty=args.presence_penalty)
    llm.generate(prompts, params, use_tqdm=False)  # compiles
    collections = GarbageCollections()
    runs = []
    for i in range(args.runs):
        before = llm.stats()
        prof = cProfile.Profile() if args.profile and i == 0 else None
        if prof:
            prof.enable()
        t0 = time.perf_counter()
        with collections:
            llm.generate(prompts, params, use_tqdm=False)
        call = time.perf_counter() - t0
        if prof:
            prof.disable()
        m = llm.stats()
        steps = m["num_steps"] - before["num_steps"]
        wall, wait = m["wall_s"] - before["wall_s"], m["host_wait_s"] - before["host_wait_s"]
        runs.append(((wall - wait) / steps * 1e3, wall / steps * 1e3, steps, call / steps * 1e3))
        if prof:
            pstats.Stats(prof).sort_stats("tottime").print_stats(20)
    work, wall, steps, call = sorted(runs)[len(runs) // 2]
    options = (f", logprobs {args.logprobs}" * (args.logprobs is not None)
               + f", presence_penalty {args.presence_penalty}" * bool(args.presence_penalty)
               + ", numpy device" * args.numpy_device
               + f", {args.num_scheduler_steps} steps a dispatch" * (args.num_scheduler_steps > 1))
    print(f"batch {args.batch}, k {args.k}{options}: host work {work:.3f} ms/step (median of {len(runs)}; least "
          f"{min(runs)[0]:.3f}), wall {wall:.3f} ms/step, the whole generate call {call:.3f} ms/step, {steps} steps "
          f"({time.strftime('%Y-%m-%d')}); runs in order: " + ", ".join(f"{w:.3f}" for w, *_ in runs))
    total_steps = sum(r[2] for r in runs)
    print(f"garbage collections during the timed calls: {collections.count} (by generation {collections.by_gen}), "
          f"{collections.seconds * 1e3:.1f} ms in all, {collections.seconds / total_steps * 1e3:.3f} ms a step, "
          f"the longest {collections.longest * 1e3:.2f} ms")


class GarbageCollections:
    """Python's cyclic collections while inside the `with`: their count per generation and time (gc.callbacks)."""

    def __init__(self) -> None:
        self.by_gen, self.seconds, self.longest = [0, 0, 0], 0.0, 0.0
        self._start, self._on = 0.0, False
        gc.callbacks.append(self._callback)

    @property
    def count(self) -> int:
        return sum(self.by_gen)

    def __enter__(self) -> None:
        self._on = True

    def __exit__(self, *exc) -> None:
        self._on = False

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._on:
            t = time.perf_counter() - self._start
            self.by_gen[info["generation"]] += 1
            self.seconds += t
            self.longest = max(self.longest, t)


def numpy_device(runner, batch: int) -> None:
    """Replace the runner's device calls by numpy outputs of the shapes the step programs return (drafts accepted
    with probability 0.7, random tokens and logprob columns), made ahead and cycled, so that a step costs the host
    only its own work. The host arrays are still built (decode_plan, the sampling rows of each prefill)."""
    W = 2 + 2 * runner.spec.num_logprobs
    rng = np.random.default_rng(0)
    pool, made, calls = 64, {}, [0]

    def output(rows: int, k: int, extended: bool, prefill: bool) -> np.ndarray:
        key = (rows, k, extended, prefill)
        if key not in made:  # count (or prefill's flag) and tokens, then the logprob columns
            width = (2 if prefill else k + 2) + (W if prefill else (k + 1) * W) * extended
            out = rng.integers(0, 1000, (pool, rows, width), dtype=np.int32)
            out[:, :, 0] = 1 if prefill else 1 + (rng.random((pool, rows, k)) < 0.7).cumprod(2).sum(2)
            made[key] = list(out)
        calls[0] += 1
        return made[key][calls[0] % pool]

    def decode(slots, tables, k=None, stops=None):
        spec = runner.decode_plan(slots, tables, k, stops)[2]
        return output(batch, spec.num_speculative_tokens, spec.extended, False)

    def prefill(chunks, tables):
        for c in chunks:
            runner.sampling.set(c.seq.slot, c.seq.params, c.seq.seed, len(c.seq.prompt_token_ids))
        return output(runner.cfg.max_prefill_seqs, 0, any(c.seq.params.needs_extended_step for c in chunks), True)

    runner.decode, runner.prefill, runner.copy_pages = decode, prefill, lambda pairs: None


if __name__ == "__main__":
    main()
