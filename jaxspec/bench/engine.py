"""Building and driving the LLMs a benchmark times: shared weights, one-mode compilation, metrics per run.

- A checkpoint's weights are loaded once and handed to every `LLM` of the sweep through
  `LLM.from_weights(cfg, w)`: EAGLE and plain decoding share one copy on the device. Dummy runs pass `w=None`
  with `load_format="dummy"`: the LLM draws random weights, and a random head shaped like one target layer.
- `compile_buckets` compiles every bucket for the one sampling mode the run uses (`ModelRunner.warmup` restricted
  to it): a fifth of the start-up compile time.
- Async and sync runs share one LLM: `generate(async_scheduling=...)` picks the protocol per call.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import NamedTuple

import jax
import numpy as np

from jaxspec.engine.model_runner import back_to_back
from jaxspec.engine.step import compiled, decode_step, multi_decode_step, prefill_step
from jaxspec.llm import LLM
from jaxspec.models import eagle, llama


def load_target(ckpt, hf_config: dict, dummy: bool, dtype: str | None) -> tuple[llama.Config, object]:
    """(Config, Weights) on the device: the checkpoint cast to dtype; for dummy runs (Config, None), the LLM draws
    the random weights itself (`LLM.from_weights(cfg, None, load_format="dummy")`)."""
    if dummy:
        return llama.Config.from_hf(hf_config, dtype or "float32"), None
    from jaxspec.convert.checkpoint import load_model
    return load_model(ckpt, dtype)


def bucket_list(sizes: list[int] | None, limit: int) -> list[int] | None:
    """Sizes to compile (fewer buckets: less compile time, more padding), always ending at the engine's limit."""
    return sorted({b for b in sizes if 0 < b < limit} | {limit}) if sizes else None


def compile_buckets(llm: LLM, all_greedy: bool, filtered: bool, extended: bool = False, processors: bool = False,
                    log=None, k_values: list[int] | None = None) -> int:
    """Compile every decode and prefill bucket in the one sampling mode the run uses (extended: logprobs, with
    logits processors if `processors`), decode steps for every k its speculation policy may pick (or
    `k_values`); `log(msg)` hears each program's compile time."""
    engine = llm.llm_engine
    return engine.runner.warmup(kinds=((all_greedy, filtered, extended, extended and processors, False, False),),
                                k_values=k_values or engine.spec_policy.choices, log=log)


def env_knobs() -> dict[str, str]:
    """The environment variables that change what the engine compiles: jaxspec's (JAXSPEC_*) and XLA_FLAGS."""
    return {name: val for name, val in sorted(os.environ.items())
            if name.startswith("JAXSPEC_") or (name == "XLA_FLAGS" and val)}


def num_compiled() -> int | None:
    """Programs in the step functions' jit caches: a change during a timed run means it compiled."""
    try:
        return sum(compiled(step, cublas, stable, twin)._cache_size()
                   for step in (decode_step, multi_decode_step, prefill_step)
                   for cublas in (False, True) for stable in (False, True) for twin in (0, 1))
    except AttributeError:
        return None


def _nbytes(*trees) -> int:
    return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(trees))


def model_bytes(llm: LLM) -> dict:
    """Configs, what a decode step must read and what it must compute (report.py's roofline)."""
    runner = llm.llm_engine.runner
    tcfg, dcfg, tw, dw = llm.model_config, runner.spec.draft, runner.tw, runner.dw
    return {"config": dataclasses.asdict(tcfg), "draft_config": dataclasses.asdict(dcfg) if dcfg else None,
            "total_weight_bytes": _nbytes(tw, dw)} | step_costs(tcfg, tw, dcfg, dw, runner.k)


def step_costs(tcfg: llama.Config, tw, dcfg: eagle.EagleConfig | None, dw, k: int) -> dict:
    """The per-step and per-token counts report.step_bytes and report.step_flops multiply out: the one cost model
    of a decode step, shared by the throughput roofline and bench/step_time.py."""
    return {"bytes": step_read_bytes(tcfg, tw, dcfg, dw, k), "flops": step_flops_per_token(tcfg, dcfg, k)}


def step_read_bytes(tcfg, tw, dcfg, dw, k: int) -> dict:
    """What a decode step must read: the target's weights but the embedding (a lookup reads only B rows; tied, it
    is the LM head), each draft pass's weights, and the KV bytes per token of context."""
    head = tw.embed if tw.lm_head is None else tw.lm_head
    itemsize = tcfg.jnp_dtype.itemsize
    b = {"k": k, "tensor_parallel_size": tcfg.tp_size, "target_weights": _nbytes(tw.layers, tw.final_norm, head),
         "kv_per_token_target": 2 * tcfg.num_layers * tcfg.num_kv_heads * tcfg.head_dim * itemsize,
         "draft_weights_per_pass": 0, "kv_per_token_draft": 0}
    if dw is not None:
        own = (dw.fc, dw.fc_bias, dw.input_norm, dw.hidden_norm, dw.wqkv, dw.wo, dw.mlp_norm, dw.w_gate_up,
               dw.w_down, dw.final_norm)
        b["draft_weights_per_pass"] = _nbytes(*own, dw.lm_head if dcfg.method == "eagle3" else head)
        b["kv_per_token_draft"] = 2 * dcfg.num_kv_heads * dcfg.head_dim * itemsize
    return b


def _num_params(*infos) -> int:
    return sum(math.prod(a.shape) for a in infos)


def step_flops_per_token(tcfg: llama.Config, dcfg: eagle.EagleConfig | None, k: int) -> dict:
    """FLOPs per token of each part of a decode step: 2 per weight of every matrix product (the target's qkv, o,
    gate_up, down and LM head; the head's fc, qkv, o, gate_up, down and LM head: the target's for EAGLE-1, its own
    over the draft vocabulary for EAGLE-3) and, per token of context, 4 * heads * head_dim per layer for attention
    (QK^T and PV). Shapes from the models' `abstract()`, so they are the weights' own (KV heads copied under tensor
    parallelism included). EAGLE-3's single-token passes skip fc: the head's own output is already H wide."""
    t = llama.abstract(tcfg)
    head = t.embed if t.lm_head is None else t.lm_head  # tied: the embedding is the LM head
    layers = t.layers
    f = {"k": k, "target_per_token": 2 * _num_params(layers.wqkv, layers.wo, layers.w_gate_up, layers.w_down, head),
         "target_attn_per_token_ctx": 4 * tcfg.num_layers * tcfg.num_heads * tcfg.head_dim,
         "draft_verified_per_token": 0, "draft_rollout_per_token": 0, "draft_lm_head_per_token": 0,
         "draft_attn_per_token_ctx": 0}
    if dcfg is not None:
        d = eagle.abstract(dcfg)
        layer, fc = 2 * _num_params(d.wqkv, d.wo, d.w_gate_up, d.w_down), 2 * _num_params(d.fc)
        f |= {"draft_verified_per_token": fc + layer,
              "draft_rollout_per_token": layer + (fc if dcfg.method == "eagle" else 0),
              "draft_lm_head_per_token": 2 * _num_params(head if dcfg.method == "eagle" else d.lm_head),
              "draft_attn_per_token_ctx": 4 * dcfg.num_heads * dcfg.head_dim}
    return f


class DecodeTiming(NamedTuple):
    pipelined_s: float  # per step, steps dispatched back to back
    blocking_s: float  # per step, each read before the next is dispatched
    dispatch_s: float  # host time to dispatch one step onto an idle device
    num_steps: int  # steps run in all (warm-up included): what a trace of the call holds
    # host time of one dispatch while earlier steps run (back to back): near dispatch_s unless the launch waits
    # for the device (a host sync inside the program), when it nears pipelined_s
    busy_dispatch_s: float = 0.0


def _timing_batch(runner, B: int, context: int) -> tuple[list[int], np.ndarray]:
    """Slots 0..B-1 at `context` tokens with random last tokens and K drafts (slot i owns pages i*P .. i*P+P-1):
    the slot list and block tables a timed decode dispatches."""
    cfg = runner.cfg
    pages = cfg.pages_per_seq
    if B * pages > cfg.num_pages:
        raise ValueError(f"batch {B} at max_model_len {cfg.max_model_len} needs {B * pages} pages, "
                         f"the pool has {cfg.num_pages}")
    rng = np.random.default_rng(0)
    state = dataclasses.replace(
        runner.state, tokens=rng.integers(0, runner.vocab_size, (runner.num_slots + 1, 1 + runner.k), dtype=np.int32),
        seq_len=np.full((runner.num_slots + 1,), context, np.int32),
        num_drafts=np.full((runner.num_slots + 1,), runner.k, np.int32))
    sharding = runner.spec.shardings
    runner.state = jax.device_put(state, sharding.replicated if sharding else jax.local_devices()[0])
    tables = np.full((runner.num_slots + 1, pages), -1, np.int32)
    tables[:B] = np.arange(B * pages, dtype=np.int32).reshape(B, pages)
    return list(range(B)), tables


def no_stops(B: int) -> np.ndarray:
    """multi_decode_step's stops for B rows that never stop (no stop ids, no length limit): every step runs."""
    from jaxspec.engine.step import MAX_DEVICE_STOPS

    stops = np.full((B, 1 + MAX_DEVICE_STOPS), -1, np.int32)
    stops[:, 0] = np.iinfo(np.int32).max
    return stops


def timing_rounds(iters: int, steps_per_dispatch: int = 1) -> tuple[int, int, int]:
    """decode_step_time's dispatches: warm-up, timed back to back, read one at a time. Each round counts steps
    (3, iters, up to 10), rounded up to whole dispatches of `steps_per_dispatch` steps; the warm-up is at least two
    dispatches, as each of a program's twin executables (KernelConfig.twin_programs) compiles at its first call (with
    one, a 4-step run's first timed dispatch compiled the second twin: 3.6 s a dispatch)."""
    warmup, timed, blocking = (-(-n // steps_per_dispatch) for n in (3, iters, min(iters, 10)))
    return max(warmup, 2), timed, blocking


def decode_step_time(runner, B: int, context: int, iters: int, multi: bool = False) -> DecodeTiming:
    """Seconds per decode dispatch at batch B with every slot at `context` tokens: dispatches back to back, as
    the async engine keeps the device busy, each output read once the next dispatch is queued (as the engine reads
    it: an output left unread may still be on its way to the host when its buffer is donated to the dispatch two
    later, ModelRunner's twin buffers); dispatches read one at a time; and the host's time to dispatch one
    onto an idle device (building its arrays and launching its kernels), which the engine must spend per dispatch
    besides its own scheduling: a step whose device time is below it is host-bound however the host is scheduled.
    `multi`: each dispatch runs runner.cfg.num_scheduler_steps (M) steps (multi_decode_step, no row stops), and
    `iters` (the warm-up and blocking rounds too) counts steps, so about iters / M dispatches: every row grows at
    each step, and with as many dispatches as single steps a 4-step run attended over contexts four times longer
    (jaxspec_paged_attention 0.145 against 0.101 ms a step, bench/results/20261207-unrolled-steps/)."""
    slots, tables = _timing_batch(runner, B, context)
    stops = no_stops(B) if multi else None
    warmup, iters, blocking = timing_rounds(iters, runner.cfg.num_scheduler_steps if multi else 1)
    for _ in range(warmup):
        np.asarray(runner.decode(slots, tables, None, stops))
    elapsed, busy = back_to_back(lambda: runner.decode(slots, tables, None, stops), iters)
    pipelined = elapsed / iters
    dispatch = 0.0
    t0 = time.perf_counter()
    for _ in range(blocking):
        t1 = time.perf_counter()
        out = runner.decode(slots, tables, None, stops)
        dispatch += time.perf_counter() - t1
        np.asarray(out)
    return DecodeTiming(pipelined, (time.perf_counter() - t0) / blocking, dispatch / blocking,
                        warmup + iters + blocking, busy / iters)


def dispatch_breakdown(runner, B: int, context: int, iters: int = 20, multi: bool = False) -> dict[str, float]:
    """Where the host time of one decode dispatch goes, each part timed alone onto an idle device (median ms):
    `plan`, the runner's host arrays (ModelRunner.decode_plan); `put`, their host-to-device copy (blocking);
    `launch`, the jitted step called with the plan already on the device (JAX's argument handling and XLA's
    launch of the program's kernels, command-buffer updates included); `launch_same`, the same with one plan's
    device arrays every time (nor does the output buffer move, written over call after call: XLA need not
    update the CUDA graph); `args`, a jitted no-op taking the same arguments (JAX's per-call floor); `decode`,
    ModelRunner.decode as the engine calls it (plan, copy, launch and the output's host copy started)."""
    from jaxspec.engine.step import program

    slots, tables = _timing_batch(runner, B, context)
    stops = no_stops(B) if multi else None
    times: dict[str, list[float]] = {name: [] for name in ("plan", "put", "launch", "launch_same", "args", "decode")}
    same = out = None
    noop = jax.jit(lambda tw, dw, caches, state, *plan: plan[0][0, 0])

    def timed(name: str, fn):
        t0 = time.perf_counter()
        result = fn()
        times[name].append(time.perf_counter() - t0)
        return result

    for i in range(iters + 2):  # the first two rounds warm up (compiles, allocator)
        step, size, spec, *plan = timed("plan", lambda: runner.decode_plan(slots, tables, None, stops))
        device_plan = timed("put", lambda: jax.block_until_ready(jax.device_put(plan, jax.local_devices()[0])))
        fn = program(step, size * (spec.num_speculative_tokens + 1), spec)
        out = runner.output_buffer(step, spec, plan) if out is None else out  # written over, call after call
        runner.caches, runner.state, out = timed(
            "launch", lambda: fn(runner.tw, runner.dw, runner.caches, runner.state, out, *device_plan, spec=spec))
        np.asarray(out)
        same = same or device_plan
        runner.caches, runner.state, out = timed(
            "launch_same", lambda: fn(runner.tw, runner.dw, runner.caches, runner.state, out, *same, spec=spec))
        np.asarray(out)
        jax.block_until_ready(timed("args", lambda: noop(runner.tw, runner.dw, runner.caches, runner.state,
                                                         *device_plan)))
        np.asarray(timed("decode", lambda: runner.decode(slots, tables, None, stops)))
        if i < 2:
            for v in times.values():
                v.clear()
    return {name: float(np.median(v)) * 1e3 for name, v in times.items()}
