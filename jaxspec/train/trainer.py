"""Training loop for EAGLE heads: optax AdamW, one jitted step with donated state, orbax checkpoints, export.

The frozen target (any dtype; bf16 on the GPU) runs inside the step, the head's parameters and optimizer state
are fp32. Batches have a fixed shape [batch_size, seq_len], so the step compiles once. Resuming is exact: the
rows of step s depend only on (seed, s), the noise key is fold_in(rng, s), and the checkpoint holds params,
optimizer state, step, rng and the metric history.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from jaxspec.atomic import atomic_dir
from jaxspec.models import eagle, llama
from jaxspec.train.data import TokenDataset, draft_vocab
from jaxspec.train.losses import Frozen, LossConfig, eagle_loss


@jax.tree_util.register_static
@dataclass(frozen=True)
class OptConfig:
    """The optimizer without its schedule's length, which train_step takes as an array: a time budget can
    shorten the run after it has started without a recompile."""
    lr: float  # peak learning rate
    # linear warm-up from 0 over warmup_steps (None: 5 % of the schedule), then cosine decay to lr * min_lr_ratio
    warmup_steps: int | None = None
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0  # EAGLE and SpecForge train heads without decay
    clip_norm: float = 0.5  # global gradient norm, as EAGLE
    b1: float = 0.9
    b2: float = 0.95  # EAGLE's betas


def learning_rate(oc: OptConfig, step: jax.Array, total_steps: jax.Array) -> jax.Array:
    """Linear warm-up to oc.lr, then cosine decay to oc.lr * min_lr_ratio at total_steps."""
    step, total = jnp.asarray(step, jnp.float32), jnp.asarray(total_steps, jnp.float32)
    warm = jnp.round(0.05 * total) if oc.warmup_steps is None else jnp.float32(oc.warmup_steps)
    frac = jnp.clip((step - warm) / jnp.maximum(total - warm, 1.0), 0.0, 1.0)
    decay = oc.min_lr_ratio + (1 - oc.min_lr_ratio) * 0.5 * (1 + jnp.cos(jnp.pi * frac))
    return oc.lr * jnp.where(step < warm, step / jnp.maximum(warm, 1.0), decay)


def make_optimizer(oc: OptConfig) -> optax.GradientTransformation:
    """AdamW's direction (clipped, Adam-scaled, decayed); train_step scales it by -learning_rate."""
    return optax.chain(optax.clip_by_global_norm(oc.clip_norm), optax.scale_by_adam(b1=oc.b1, b2=oc.b2),
                       optax.add_decayed_weights(oc.weight_decay))


@partial(jax.tree_util.register_dataclass, data_fields=["params", "opt_state", "step", "rng"], meta_fields=[])
@dataclass
class TrainState:
    params: eagle.EagleWeights  # fp32; d2t is None here (frozen, in `Frozen`)
    opt_state: Any
    step: jax.Array  # [] int32: steps done
    rng: jax.Array  # [2] uint32 raw key; step s uses fold_in(rng, s)


@partial(jax.jit, static_argnames=("tcfg", "hcfg", "lc", "oc"), donate_argnames=("state",))
def train_step(state: TrainState, frozen: Frozen, tokens: jax.Array, loss_mask: jax.Array, total_steps: jax.Array,
               tcfg: llama.Config, hcfg: eagle.EagleConfig, lc: LossConfig, oc: OptConfig
               ) -> tuple[TrainState, dict]:
    key = jax.random.fold_in(state.rng, state.step)
    grad_fn = jax.value_and_grad(eagle_loss, has_aux=True)
    (loss, metrics), grads = grad_fn(state.params, frozen, tokens, loss_mask, key, tcfg, hcfg, lc)
    direction, opt_state = make_optimizer(oc).update(grads, state.opt_state, state.params)
    lr = learning_rate(oc, state.step, total_steps)
    params = optax.apply_updates(state.params, jax.tree.map(lambda u: -lr * u, direction))
    metrics = {**metrics, "total": loss, "grad_norm": optax.tree.norm(grads), "lr": lr}
    return TrainState(params, opt_state, state.step + 1, state.rng), metrics


def batch_indices(num_rows: int, batch_size: int, step: int, seed: int) -> np.ndarray:
    """Rows of step `step`: consecutive slices of per-epoch permutations keyed on (seed, epoch)."""
    out: list[np.ndarray] = []
    start, need = step * batch_size, batch_size
    while need:
        epoch, offset = divmod(start, num_rows)
        take = _permutation(num_rows, seed, epoch)[offset:offset + need]
        out.append(take)
        start, need = start + len(take), need - len(take)
    return np.concatenate(out)


_perm_cache: dict[tuple[int, int, int], np.ndarray] = {}


def _permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    if (n, seed, epoch) not in _perm_cache:
        _perm_cache.clear()
        _perm_cache[(n, seed, epoch)] = np.random.default_rng([seed, epoch]).permutation(n)
    return _perm_cache[(n, seed, epoch)]


def target_config(tcfg: llama.Config) -> llama.Config:
    """The frozen target as the train step runs it: scanned layers (a training step is compute-bound, so the
    per-layer weight copy a scan makes is noise, and the step compiles in seconds) and dense causal attention, as
    cuDNN's fused kernel on a GPU in bf16/fp16 (XLA's [T, T] fp32 scores were a fifth of a SmolLM2 step)."""
    fused = jax.default_backend() == "gpu" and tcfg.dtype in ("bfloat16", "float16")
    return tcfg.replace(attn_impl="cudnn" if fused else "xla", layer_loop="scan")


def initial_state(w: eagle.EagleWeights, oc: OptConfig, seed: int) -> TrainState:
    """Step 0's state for head weights `w`: fresh fp32 buffers (the step donates them, which must not invalidate the
    caller's or the target's arrays; d2t stays out, in `Frozen`), a fresh optimizer, the noise key of `seed`."""
    params = jax.tree.map(lambda a: jnp.array(a, jnp.float32, copy=True), dataclasses.replace(w, d2t=None))
    return TrainState(params, make_optimizer(oc).init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(seed))


_eagle_init = jax.jit(eagle.init, static_argnums=0)  # eager init compiles one program per leaf


def init_head(hcfg: eagle.EagleConfig, tw: llama.Weights, seed: int, d2t: np.ndarray | None,
              lm_head_from_target: bool = False) -> eagle.EagleWeights:
    """A fresh fp32 head (random, as SpecForge). EAGLE-3 with `lm_head_from_target` starts its lm_head and final
    norm from the target's, restricted to the draft vocabulary: on a tiny random target that memorizes faster,
    but on SmolLM2 it starts the CE at 34 nats (confident wrong logits) instead of log(draft_V)."""
    w = _eagle_init(hcfg.replace(dtype="float32"), jax.random.key(seed))
    if hcfg.method == "eagle3":
        w.d2t = jnp.asarray(d2t)
        if lm_head_from_target:
            head = tw.embed.T if tw.lm_head is None else tw.lm_head  # [H, V]
            ids = jnp.arange(hcfg.draft_vocab_size) + w.d2t
            w.lm_head = head[:, ids].astype(jnp.float32)
            w.final_norm = tw.final_norm.astype(jnp.float32)
    return w


def warm_start(fresh: eagle.EagleWeights, hcfg: eagle.EagleConfig, init: eagle.EagleWeights,
               init_cfg: eagle.EagleConfig, source: str) -> eagle.EagleWeights:
    """`fresh` (a new head for `hcfg`, its draft vocabulary chosen from this run's data) with every tensor taken from
    an earlier head `init`, so fine-tuning on a new mix starts from what that head learnt. EAGLE-3 heads whose draft
    vocabularies differ share lm_head columns by target id: a token in both keeps its trained column, a new one keeps
    its fresh column. Raises ValueError naming `source` and the setting or tensor that does not fit."""
    for name in ("method", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim",
                 "vocab_size", "aux_layers", "fc_bias", "own_embed"):
        if getattr(init_cfg, name) != getattr(hcfg, name):
            raise ValueError(f"{source}: the head to start from has {name}={getattr(init_cfg, name)!r}, "
                             f"this run trains {name}={getattr(hcfg, name)!r}")
    out = {}
    for f in dataclasses.fields(eagle.EagleWeights):
        mine, theirs = getattr(fresh, f.name), getattr(init, f.name)
        if f.name == "d2t" or mine is None:
            out[f.name] = mine
        elif f.name == "lm_head" and hcfg.method == "eagle3":
            new_ids = np.arange(hcfg.draft_vocab_size) + np.asarray(fresh.d2t)
            old_ids = np.arange(init_cfg.draft_vocab_size) + np.asarray(init.d2t)
            col_of = np.full((hcfg.vocab_size,), -1, np.int64)
            col_of[old_ids] = np.arange(len(old_ids))
            src = col_of[new_ids]  # the old column of each new draft id, -1 where the old head had none
            taken = jnp.asarray(theirs, jnp.float32)[:, np.maximum(src, 0)]
            out[f.name] = jnp.where(jnp.asarray(src >= 0)[None, :], taken, mine)
        elif theirs is None or theirs.shape != mine.shape:
            raise ValueError(f"{source}: tensor {f.name} has shape {None if theirs is None else theirs.shape}, "
                             f"this run needs {mine.shape}")
        else:
            out[f.name] = jnp.asarray(theirs, jnp.float32)
    return eagle.EagleWeights(**out)


# ---------------------------------------------------------------- checkpoints

def _manager(ckpt_dir: str | Path, keep: int):
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False)
    return ocp.CheckpointManager(Path(ckpt_dir).absolute(), options=options)


def save_state(mngr, state: TrainState, history: list[dict], run: dict, schedule_steps: int) -> None:
    import orbax.checkpoint as ocp

    step = int(state.step)
    meta = {"run": run, "history": history, "schedule_steps": schedule_steps}
    mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), history=ocp.args.JsonSave(meta)))
    mngr.wait_until_finished()


def restore_state(mngr, like: TrainState, run: dict) -> tuple[TrainState, list[dict], int] | None:
    """The latest checkpoint as (state, history, schedule length), None if there is none; it must come from a
    run with the same settings."""
    import orbax.checkpoint as ocp

    step = mngr.latest_step()
    if step is None:
        return None
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    got = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                     history=ocp.args.JsonRestore()))
    saved = {"soft_labels": False} | got["history"]["run"]  # checkpoints from before the option trained hard labels
    diff = {k: (saved.get(k), v) for k, v in run.items() if saved.get(k) != v}
    if diff:
        raise ValueError(f"{mngr.directory}: checkpoint {step} comes from a different run (saved, now): {diff}")
    # checkpoints from before time budgets existed ran the requested steps
    return got["state"], got["history"]["history"], int(got["history"].get("schedule_steps", saved["steps"]))


# ---------------------------------------------------------------- the loop

def train_eagle(target_cfg: llama.Config, target_weights: llama.Weights, head_cfg: eagle.EagleConfig,
                dataset: TokenDataset, steps: int, batch_size: int, lr: float = 1e-4, *,
                ttt_steps: int | None = None, ttt_decay: float = 0.8, w_reg: float = 1.0, w_cls: float = 0.1,
                noise: float | None = None, soft_labels: bool = False, compute_dtype: str = "float32",
                warmup_steps: int | None = None, min_lr_ratio: float = 0.0, weight_decay: float = 0.0,
                clip_norm: float = 0.5, keep_tokens: tuple[int, ...] | None = None,
                init_weights: eagle.EagleWeights | None = None, lm_head_from_target: bool = False,
                warm_from: tuple[eagle.EagleConfig, eagle.EagleWeights, str] | None = None,
                ckpt_dir: str | Path | None = None, ckpt_every: int = 1000, keep_checkpoints: int = 2,
                resume: bool = False, stop_at: int | None = None, time_budget_s: float | None = None,
                seed: int = 0, progress: bool = True) -> tuple[eagle.EagleWeights, list[dict]]:
    """Train `head_cfg`'s head on `dataset` against the frozen target. Returns (fp32 weights with d2t, history).

    Defaults follow the papers: EAGLE-1 one step, uniform feature noise of width 0.2 (EAGLE's U(-0.1, 0.1)),
    loss = w_reg * smooth-L1 + w_cls * CE; EAGLE-3 seven TTT steps weighted ttt_decay**j, no noise, each step's
    cross-entropy against the target's greedy token or, with `soft_labels`, its distribution over the draft
    vocabulary (as the EAGLE-3 reference trainer and SpecForge).
    `keep_tokens` (default: the dataset's EOS ids) always enter EAGLE-3's draft vocabulary. `stop_at` ends the
    run early at that step (the schedule still spans `steps`), e.g. to resume later with `resume=True`, which
    continues from the latest checkpoint in `ckpt_dir` with the same data order, noise and metric history.
    `warm_from` (config, weights, where they came from) starts from an earlier head instead (`warm_start`).
    `time_budget_s` bounds this call's wall time, compile included: after a few timed steps, and again every 5 %
    of the budget, the schedule is shortened to the steps that fit (never lengthened), so the learning rate still
    decays to its end; should steps slow down between two estimates, the loop stops when the budget is spent.
    `compute_dtype="bfloat16"` runs the head's matmuls in bf16 (the GPU setting); its parameters, the optimizer
    and the loss reductions stay fp32.
    """
    e3 = head_cfg.method == "eagle3"
    lc = LossConfig(ttt_steps=ttt_steps or (7 if e3 else 1), ttt_decay=ttt_decay, w_reg=w_reg, w_cls=w_cls,
                    noise=(0.0 if e3 else 0.2) if noise is None else noise, soft_labels=soft_labels,
                    compute_dtype=compute_dtype)
    oc = OptConfig(lr=lr, warmup_steps=warmup_steps,
                   min_lr_ratio=min_lr_ratio, weight_decay=weight_decay, clip_norm=clip_norm)
    hcfg = head_cfg.replace(dtype="float32", attn_impl="xla")
    if len(dataset) == 0:
        raise ValueError("the dataset is empty")
    d2t = t2d = None
    if e3:
        keep = tuple(dataset.meta.get("eos_token_ids", ())) if keep_tokens is None else tuple(keep_tokens)
        d2t, t2d = draft_vocab(dataset, hcfg.vocab_size, hcfg.draft_vocab_size, keep)
    frozen = Frozen(target=target_weights, d2t=None if d2t is None else jnp.asarray(d2t),
                    t2d=None if t2d is None else jnp.asarray(t2d))
    w = init_weights if init_weights is not None else init_head(hcfg, target_weights, seed, d2t, lm_head_from_target)
    if warm_from is not None:
        init_cfg, init, source = warm_from
        w = warm_start(w, hcfg, init, init_cfg, source)
    state = initial_state(w, oc, seed)
    history: list[dict] = []
    run = {"method": hcfg.method, "steps": steps, "batch_size": batch_size, "seq_len": dataset.seq_len,
           "num_rows": len(dataset), "seed": seed, "lr": lr, "ttt_steps": lc.ttt_steps, "soft_labels": soft_labels,
           "compute_dtype": compute_dtype, "init_from": None if warm_from is None else warm_from[2]}
    mngr = _manager(ckpt_dir, keep_checkpoints) if ckpt_dir is not None else None
    schedule_steps = steps
    if resume and mngr is not None:
        restored = restore_state(mngr, state, run)
        if restored is not None:
            state, history, schedule_steps = restored
    start = int(state.step)
    end = min(schedule_steps, stop_at if stop_at is not None else schedule_steps)
    budget = StepBudget(time_budget_s, start) if time_budget_s is not None else None

    t0 = time.perf_counter()  # history's "time": seconds into this call when the step's metrics were read
    bar = tqdm(total=end, initial=start, desc=f"train {hcfg.method}", disable=not progress, dynamic_ncols=True)
    pending = None

    def record(item) -> None:  # reading a step's metrics waits for it: done one step late, so the device stays busy
        s, m = item
        m = jax.device_get(m)
        history.append({"step": s, "loss": float(m["total"]), "step_loss": [float(x) for x in m["loss"]],
                        "acc": [float(x) for x in m["acc"]], "lr": float(m["lr"]), "grad_norm": float(m["grad_norm"]),
                        "time": round(time.perf_counter() - t0, 3)})
        bar.update(s + 1 - bar.n)
        bar.set_postfix_str(f"loss {history[-1]['loss']:.4f} acc " + "/".join(f"{a:.2f}" for a in history[-1]["acc"]))

    step = start
    while step < end:
        rows = batch_indices(len(dataset), batch_size, step, seed)
        state, metrics = train_step(state, frozen, dataset.tokens[rows], dataset.loss_mask[rows],
                                    jnp.int32(schedule_steps), target_cfg, hcfg, lc, oc)
        if pending is not None:
            record(pending)
        pending = (step, metrics)
        step += 1
        if budget is not None and budget.due(step):
            jax.block_until_ready(state.step)
            fits = budget.steps_that_fit(step)
            if fits is not None and fits < schedule_steps:
                schedule_steps = max(step, fits)
                end = min(end, schedule_steps)
                bar.total = end
                bar.refresh()
                print(f"time budget {time_budget_s:.0f} s: the schedule ends at step {end} "
                      f"({budget.step_s * 1e3:.1f} ms/step)")
        if budget is not None and budget.spent():
            print(f"time budget {time_budget_s:.0f} s spent at step {step} of {end}: stopping")
            end = step
        if mngr is not None and (step % ckpt_every == 0 or step == end):
            record(pending)
            pending = None
            save_state(mngr, state, history, run, schedule_steps)
    if pending is not None:
        record(pending)
    bar.close()
    if mngr is not None:
        mngr.close()
    weights = dataclasses.replace(state.params, d2t=frozen.d2t)
    return weights, history


class StepBudget:
    """Times steps on the host to decide how many fit in a wall-clock budget. The first step (compile) and the
    next few (warm-up) are excluded from the rate. The estimate is taken after `timed` warm steps, then again every
    `recheck` of the budget from the steps since the last estimate, so a rate that drops (another process starts
    sharing the GPU) shortens the schedule again; `spent()` is the hard stop should the rate drop even more."""

    def __init__(self, seconds: float, start_step: int, warm: int = 3, timed: int = 20, recheck: float = 0.05):
        self.seconds, self.recheck, self.t0 = seconds, recheck, time.perf_counter()
        self.warm_at, self.next_at = start_step + 1 + warm, start_step + 1 + warm + timed
        self.t_last: float | None = None
        self.s_last = self.warm_at
        self.step_s: float | None = None

    def due(self, steps_done: int) -> bool:
        return steps_done in (self.warm_at, self.next_at)

    def spent(self) -> bool:
        return time.perf_counter() - self.t0 > self.seconds

    def steps_that_fit(self, steps_done: int) -> int | None:
        """Call (after a device sync) when `due`; the total step count that fits, once it is known."""
        now = time.perf_counter()
        if steps_done == self.warm_at:
            self.t_last = now
            return None
        self.step_s = (now - self.t_last) / (steps_done - self.s_last)
        self.t_last, self.s_last = now, steps_done
        self.next_at = steps_done + max(1, int(self.recheck * self.seconds / self.step_s))
        # 3 % margin for checkpoints, metric reads and the export after the loop
        return steps_done + int(max(0.0, 0.97 * self.seconds - (now - self.t0)) / self.step_s)


# ---------------------------------------------------------------- export

def export_head(path: str | Path, head_cfg: eagle.EagleConfig, weights: eagle.EagleWeights,
                dtype: str = "bfloat16", info: dict | None = None) -> Path:
    """`save_eagle` in `dtype` (config.json + model.safetensors), plus `training.json` when `info` is given; the
    directory appears (replacing an older one) only when all of it is written."""
    from jaxspec.convert.eagle import save_eagle

    path = Path(path)
    cast = lambda a: a.astype(dtype) if a is not None and jnp.issubdtype(a.dtype, jnp.floating) else a
    with atomic_dir(path) as tmp:
        save_eagle(str(tmp), head_cfg.replace(dtype=dtype), jax.tree.map(cast, weights))
        if info is not None:
            (tmp / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    return path


def training_info(history: list[dict], wall_s: float, **fields: Any) -> dict:
    """What `training.json` records: the given fields, the device, wall time and the final metrics."""
    dev = jax.devices()[0]
    last = history[-min(len(history), 50):]
    return {**fields, "steps_done": history[-1]["step"] + 1 if history else 0, "wall_s": round(wall_s, 1),
            "device": f"{dev.platform}:{getattr(dev, 'device_kind', '')}", "jax": jax.__version__,
            "final_loss_avg50": float(np.mean([h["loss"] for h in last])) if last else None,
            "final_acc_avg50": np.mean([h["acc"] for h in last], axis=0).round(4).tolist() if last else None,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
