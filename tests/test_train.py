"""EAGLE head training: the training-time-test unroll equals the engine's drafting, training lowers the loss,
resuming from a checkpoint continues the same run exactly, export -> load_eagle round-trips, data plumbing.

Everything runs on a tiny random target (4 layers, vocab 128) and its own greedy continuations of random prompts.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.convert.eagle import load_eagle
from jaxspec.models import eagle, llama
from jaxspec.models.attention import AttnBatch, init_cache
from jaxspec.prompts import read_prompts
from jaxspec.train import data, losses, trainer
from tests.tiny_heads import greedy_dataset, tiny_aux_layers
from tests.numerics import BF16_EPS, FP32_EPS, assert_close_scaled

TINY = llama.Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                    num_kv_heads=2, head_dim=16)
SEQ_LEN, BATCH = 64, 8
# Short runs that share one compiled step per method (the static configs, `steps` included, must match).
RUNS = {"eagle": {"steps": 120, "lr": 1e-2, "ttt_steps": 1}, "eagle3": {"steps": 80, "lr": 1e-2, "ttt_steps": 3}}


def head_config(method: str) -> eagle.EagleConfig:
    return eagle.EagleConfig.from_target(TINY, method, aux_layers=tiny_aux_layers(TINY.num_layers) if
                                         method == "eagle3" else None,
                                         draft_vocab_size=96 if method == "eagle3" else None)


@pytest.fixture(scope="module")
def target():
    return jax.jit(llama.init, static_argnums=0, static_argnames="scale")(TINY, jax.random.key(0), scale=0.2)


@pytest.fixture(scope="module")
def dataset(target):
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, TINY.vocab_size, int(rng.integers(2, 13))).tolist() for _ in range(32)]
    return greedy_dataset(target, TINY, prompts, SEQ_LEN)


def train(target, dataset, method, **kw):
    run = RUNS[method]
    return trainer.train_eagle(TINY, target, head_config(method), dataset, run["steps"], BATCH, run["lr"],
                               ttt_steps=run["ttt_steps"], progress=False, **kw)


@pytest.fixture(scope="module")
def trained(target, dataset):
    return {m: train(target, dataset, m) for m in RUNS}


# ---------------------------------------------------------------- the unroll is the engine's drafting

@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_ttt_unroll_equals_paged_drafting(target, method):
    """TTT step j at anchor i == the engine's rollout: a cached pass over the pairs from the target's features,
    then j single-token passes from anchor i feeding `out` back (models/eagle.py with a paged KV cache)."""
    cfg = head_config(method)
    w = jax.jit(eagle.init, static_argnums=(0, 2))(cfg, jax.random.key(1), 0.2)
    B, T, S, page = 2, 16, 3, 4
    k1, k2 = jax.random.split(jax.random.key(2))
    tokens = jax.random.randint(k1, (B, T), 0, TINY.vocab_size)
    feats = jax.random.normal(k2, (B, T, cfg.feature_size))
    outs = jax.jit(losses.unroll, static_argnums=(1, 5))(w, cfg, target.embed, tokens, feats, S)
    fwd = jax.jit(eagle.forward, static_argnames=("cfg", "from_target"))
    pages = T // page + 2
    tables = jnp.arange(B * pages, dtype=jnp.int32).reshape(B, pages)

    def batch(pos):  # pos [B, n]
        return AttnBatch(tables, jnp.take_along_axis(tables, pos // page, 1) * page + pos % page)

    # As the engine does: a pass over all pairs (f_p, x_{p+1}) writes every position's K/V from the target's
    # features; the rollout from anchor i then overwrites positions i+1.. as it goes, and causal masking hides
    # the rest, so each anchor starts from the same cache.
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    kv = init_cache(1, cfg.num_kv_heads, B * pages, page, cfg.head_dim, jnp.float32)
    first, kv_all = fwd(w, cfg=cfg, target_embed=target.embed, tokens=losses.shift_left(tokens, 1), hidden=feats,
                        positions=pos, kv=kv, batch=batch(pos))
    # the unroll attends densely and the engine through pages, in other batch shapes: fp32 sums of up to 3H = 192
    # terms (EAGLE-3's fc) in other orders, a few layers deep
    rel = 192 * FP32_EPS
    assert_close_scaled(outs[0], first, rel, err_msg="first pass")
    for i in (0, 5, T - S - 1):
        h, kv = first[:, i], kv_all
        for j in range(1, S):
            pos = jnp.full((B, 1), i + j, jnp.int32)
            out, kv = fwd(w, cfg=cfg, target_embed=target.embed, tokens=tokens[:, i + j + 1, None],
                          hidden=h[:, None], positions=pos, kv=kv, batch=batch(pos), from_target=False)
            h = out[:, 0]
            assert_close_scaled(outs[j][:, i], h, rel, err_msg=f"anchor {i} step {j}")


# ---------------------------------------------------------------- training

@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_training_lowers_loss(trained, method):
    _, history = trained[method]
    loss = np.array([h["loss"] for h in history])
    acc = np.array([h["acc"] for h in history])  # [steps, ttt_steps]
    first, last = slice(0, 10), slice(-10, None)
    assert np.all(np.isfinite(loss))
    if method == "eagle3":
        assert loss[last].mean() < 0.7 * loss[first].mean()
    else:
        # EAGLE-1's CE is against the target's soft distribution, whose entropy (about 3.7 nats here, times
        # w_cls = 0.1) is a floor of the loss; the regression part and the top-1 agreement must move a lot.
        assert loss[last].mean() < 0.85 * loss[first].mean()
    assert acc[last, 0].mean() > 2.5 * acc[first, 0].mean() and acc[last, 0].mean() > 0.25


def test_eagle3_soft_labels_are_the_targets_draft_vocabulary_distribution(target, dataset):
    """`soft_labels`: TTT step j's loss is the cross-entropy of the head's draft distribution against the target's
    softmax over the draft vocabulary's tokens, averaged over the response positions whose greedy token that
    vocabulary holds (the EAGLE-3 reference trainer's and SpecForge's target_p and position mask), restated here
    position by position in float64; and training on it raises top-1 agreement as training on greedy tokens does."""
    cfg = head_config("eagle3").replace(dtype="float32", attn_impl="xla")
    d2t, t2d = data.draft_vocab(dataset, TINY.vocab_size, cfg.draft_vocab_size)
    w = trainer.init_head(cfg, target, 3, d2t)
    frozen = losses.Frozen(target=target, d2t=jnp.asarray(d2t), t2d=jnp.asarray(t2d))
    tokens, mask, steps = dataset.tokens[:4], dataset.loss_mask[:4], 3
    loss = jax.jit(losses.eagle_loss, static_argnames=("tcfg", "hcfg", "lc"))
    _, metrics = loss(dataclasses.replace(w, d2t=None), frozen, tokens, mask, jax.random.key(0), tcfg=TINY,
                      hcfg=cfg, lc=losses.LossConfig(ttt_steps=steps, soft_labels=True))
    features, _, tlogits = losses.target_pass(target, TINY, cfg, jnp.asarray(tokens))
    outs = losses.unroll(w, cfg, target.embed, jnp.asarray(tokens), features.astype(jnp.float32), steps)
    tl = np.asarray(tlogits, np.float64)
    ids = np.arange(cfg.draft_vocab_size) + d2t
    for j, out in enumerate(outs):
        logits = np.asarray(eagle.draft_logits(w, cfg, target, out), np.float64)
        logp = logits - logits.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        ces = []
        for b in range(tokens.shape[0]):
            for i in range(SEQ_LEN - j - 2):  # anchor i, step j drafts x_{i+j+2}; the target's guess comes at i+j+1
                if mask[b, i + j + 2] and t2d[tl[b, i + j + 1].argmax()] >= 0:
                    p = np.exp(tl[b, i + j + 1, ids] - tl[b, i + j + 1, ids].max())
                    ces.append(-(p / p.sum() * logp[b, i]).sum())
        assert len(ces) > 100
        np.testing.assert_allclose(metrics["loss"][j], np.mean(ces), rtol=1e-5, err_msg=f"step {j}")
    _, history = train(target, dataset, "eagle3", soft_labels=True)
    acc = np.array([h["acc"] for h in history])
    assert acc[-10:, 0].mean() > 2.5 * acc[:10, 0].mean() and acc[-10:, 0].mean() > 0.25


def test_resume_continues_the_same_run(target, dataset, trained, tmp_path):
    """80 steps straight == 40 steps, checkpoint, a fresh call resuming for the other 40: same losses, params."""
    straight, history = trained["eagle3"]
    half = RUNS["eagle3"]["steps"] // 2
    _, first = train(target, dataset, "eagle3", ckpt_dir=tmp_path, ckpt_every=20, stop_at=half)
    assert [h["step"] for h in first] == list(range(half))
    resumed, full = train(target, dataset, "eagle3", ckpt_dir=tmp_path, ckpt_every=20, resume=True)
    assert [h["step"] for h in full] == list(range(RUNS["eagle3"]["steps"]))
    assert [h["loss"] for h in full] == [h["loss"] for h in history]  # the same steps on the same state
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(straight)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="different run"):
        trainer.train_eagle(TINY, target, head_config("eagle3"), dataset, 99, BATCH, 1e-2, ttt_steps=3,
                            ckpt_dir=tmp_path, resume=True, progress=False)


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_export_load_round_trip(trained, target, method, tmp_path):
    weights, history = trained[method]
    cfg = head_config(method)
    k1, k2 = jax.random.split(jax.random.key(3))
    tokens = jax.random.randint(k1, (2, 12), 0, TINY.vocab_size)
    feats = jax.random.normal(k2, (2, 12, cfg.feature_size))
    pos = jnp.broadcast_to(jnp.arange(12), (2, 12))

    def drafts(cfg, w):
        out, _ = eagle.forward(w, cfg, target.embed, tokens, feats, pos)
        return out, eagle.draft_tokens(w, cfg, target, out)

    want_out, want_tok = drafts(cfg, weights)
    info = trainer.training_info(history, 1.0, method=method)
    for dtype in ("float32", "bfloat16"):
        path = trainer.export_head(tmp_path / dtype, cfg, weights, dtype, info)
        got_cfg, got_w = load_eagle(str(path), TINY)
        assert got_cfg == cfg and json.loads((path / "config.json").read_text())["torch_dtype"] == dtype
        out, tok = drafts(got_cfg, got_w)
        if dtype == "float32":  # the same weights, bit for bit: the same computation
            np.testing.assert_array_equal(out, want_out)
            np.testing.assert_array_equal(tok, want_tok)
        else:  # each weight rounded to bf16 (relative error up to eps/2), through fc, attention and the MLP
            assert_close_scaled(out, want_out, 4 * BF16_EPS, err_msg="bf16 export")
    assert json.loads((tmp_path / "float32" / "training.json").read_text())["steps_done"] == RUNS[method]["steps"]


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_warm_start_continues_from_a_trained_head(trained, target, dataset, method):
    """A run started from a trained head begins at that head's loss, not at a fresh head's."""
    weights, history = trained[method]
    cfg = head_config(method)
    _, warm = train(target, dataset, method, warm_from=(cfg, weights, "trained"), stop_at=2)
    trained_loss = np.mean([h["loss"] for h in history[-10:]])
    assert warm[0]["loss"] < 1.5 * trained_loss and warm[0]["loss"] < 0.75 * history[0]["loss"]


def test_warm_start_matches_eagle3_draft_vocabularies_by_token(trained, target):
    weights, _ = trained["eagle3"]
    cfg = head_config("eagle3")
    ids_old = np.arange(cfg.draft_vocab_size) + np.asarray(weights.d2t)
    ids_new = np.sort(np.random.default_rng(1).choice(TINY.vocab_size, 64, replace=False))
    small = cfg.replace(draft_vocab_size=64)
    fresh = trainer.init_head(small, target, 7, (ids_new - np.arange(64)).astype(np.int32))
    got = trainer.warm_start(fresh, small, weights, cfg, "trained")
    np.testing.assert_array_equal(got.d2t, fresh.d2t)
    np.testing.assert_array_equal(got.wqkv, weights.wqkv)
    for col, tid in enumerate(ids_new):
        want = weights.lm_head[:, np.flatnonzero(ids_old == tid)[0]] if tid in ids_old else fresh.lm_head[:, col]
        np.testing.assert_array_equal(got.lm_head[:, col], want)
    assert 0 < np.isin(ids_new, ids_old).sum() < 64  # both cases occur
    with pytest.raises(ValueError, match=r"trained: the head to start from has method='eagle3'"):
        trainer.warm_start(trained["eagle"][0], head_config("eagle"), weights, cfg, "trained")


# ---------------------------------------------------------------- data

def test_draft_vocab_keeps_eos_and_frequent_tokens():
    tokens = np.array([[5, 7, 7, 7, 9, 9, 3, 0], [5, 7, 9, 1, 1, 1, 1, 0]], np.int32)
    mask = np.array([[0, 1, 1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0, 0, 0]], np.uint8)
    ds = data.TokenDataset(tokens, mask, np.array([7, 7], np.int32))
    d2t, t2d = data.draft_vocab(ds, 16, 4, keep=(15,))
    ids = np.arange(4) + d2t
    assert ids.tolist() == [3, 7, 9, 15]  # eos, then response counts (3 beats 1, which only prompts use)
    assert ids.tolist() == sorted(ids.tolist())  # draft ids ascend with target ids
    assert all(t2d[t] == d for d, t in enumerate(ids)) and (t2d >= 0).sum() == 4


def test_dataset_rows_files_and_prompts(dataset, tmp_path):
    assert dataset.tokens.shape == (32, SEQ_LEN) and np.all(dataset.lengths == SEQ_LEN)
    first = dataset.loss_mask.argmax(axis=1)  # response starts after a 2..12-token prompt and runs to the end
    assert np.all((first >= 2) & (first <= 12)) and np.all(dataset.loss_mask.sum(1) == SEQ_LEN - first)
    path = dataset.save(tmp_path / "d.npz")
    back = data.TokenDataset.load(path)
    np.testing.assert_array_equal(back.tokens, dataset.tokens)
    np.testing.assert_array_equal(back.loss_mask, dataset.loss_mask)
    assert back.meta == dataset.meta
    packed = data.pack([([1, 2, 3], [4, 5, 6, 7]), ([1] * 9, [2, 3]), ([1] * 12, [5])], 10)
    assert packed.tokens.tolist()[:2] == [[1, 2, 3, 4, 5, 6, 7, 0, 0, 0], [1] * 9 + [2]]
    assert packed.loss_mask.tolist()[1] == [0] * 9 + [1] and len(packed) == 2
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in [{"question": "q1", "answer": "a"}, {"prompt": "p2"},
                                                       {"turns": ["t3", "t3b"]}, {"question": "q4"}]))
    assert read_prompts([jsonl], 3) == ["q1", "p2", "t3"]
    jsonl.write_text('{"question": "q1"}\n{"text": "x"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2: row has none of the fields"):
        read_prompts(jsonl)


def test_engine_regeneration_matches_greedy_loop(target, dataset):
    """`generate_dataset` through the engine gives the same rows as the plain greedy loop."""
    from jaxspec import LLM

    rows = [0, 1, 2, 3]
    prompts = [dataset.tokens[r, :dataset.loss_mask[r].argmax()].tolist() for r in rows]
    llm = LLM.from_weights(TINY, target, max_model_len=SEQ_LEN + 1, max_num_seqs=4,
                           max_num_batched_tokens=64, page_size=16, warmup=False)
    got = data.generate_dataset(llm, prompts, max_tokens=SEQ_LEN, seq_len=SEQ_LEN, use_tqdm=False)
    np.testing.assert_array_equal(got.tokens, dataset.tokens[rows])
    np.testing.assert_array_equal(got.loss_mask, dataset.loss_mask[rows])


def test_cli_trains_and_exports(target, dataset, tmp_path, capsys):
    """`jaxspec train-eagle` from a cached dataset: bf16 head compute, export, training.json, loadable head."""
    from jaxspec.cli import main
    from jaxspec.convert.checkpoint import save_checkpoint

    model = save_checkpoint(tmp_path / "tiny", TINY, target)
    cache = dataset.save(tmp_path / "data.npz")
    out = tmp_path / "head"
    main(["train-eagle", "--model", str(model), "--method", "eagle", "--dataset-cache", str(cache), "--seq-len",
          str(SEQ_LEN), "--steps", "3", "--batch-size", "4", "--lr", "1e-3", "--target-dtype", "float32",
          "--out", str(out)])
    info = json.loads((out / "training.json").read_text())
    assert info["steps_done"] == 3 and info["compute_dtype"] == "bfloat16" and info["data"]["num_sequences"] == 32
    cfg, w = load_eagle(str(out), TINY)
    assert cfg.method == "eagle" and w.wqkv.dtype == jnp.float32
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    again = tmp_path / "again"
    main(["train-eagle", "--model", str(model), "--method", "eagle", "--dataset-cache", str(cache), "--seq-len",
          str(SEQ_LEN), "--steps", "3", "--batch-size", "4", "--lr", "1e-3", "--target-dtype", "float32",
          "--init-from", str(out), "--out", str(again)])
    assert json.loads((again / "training.json").read_text())["init_from"] == str(out)
    with pytest.raises(SystemExit):  # before any data is made from unused.jsonl
        main(["train-eagle", "--model", str(model), "--data", "unused.jsonl", "--init-from", str(tmp_path / "nowhere"),
              "--out", str(again)])
    assert "--init-from " + str(tmp_path / "nowhere") + ": not an EAGLE head" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train-eagle", "--model", str(model), "--method", "eagle", "--soft-labels", "--data", "unused.jsonl",
              "--out", str(again)])
    assert "--soft-labels is EAGLE-3's" in capsys.readouterr().err


def test_time_budget_shortens_the_schedule(target, dataset):
    """A budget far below what the requested steps need: the run stops in about that time, and the learning rate
    has decayed to (near) zero by its last step, because the schedule itself was shortened."""
    import time

    start = time.perf_counter()
    _, history = trainer.train_eagle(TINY, target, head_config("eagle"), dataset, 1_000_000, BATCH, 1e-2,
                                     time_budget_s=9.0, progress=False)
    wall = time.perf_counter() - start
    assert 30 < len(history) < 1_000_000
    assert wall < 9.0 * 1.2 + 3  # data preparation before the loop is outside the budget
    lrs = [h["lr"] for h in history]
    # the peak is reached after the first estimate; how close depends on how much of the budget the compile took
    assert max(lrs) > 0.5e-2 and lrs[-1] < 0.05 * max(lrs)


def test_step_budget_follows_a_rate_that_drops(monkeypatch):
    """A fake clock: compile 10 s, then 0.1 s per step, 0.25 s from step 300 on (another process starts sharing the
    GPU). The re-estimates shorten the schedule again, so it ends inside the budget without the hard stop; a budget
    the compile alone overruns hits the hard stop."""
    now = [0.0]
    monkeypatch.setattr(trainer.time, "perf_counter", lambda: now[0])

    def simulate(seconds):
        budget, end, step = trainer.StepBudget(seconds, 0), 1_000_000, 0
        ends = []
        while step < end:
            now[0] += 10.0 if step == 0 else 0.1 if step < 300 else 0.25
            step += 1
            if budget.due(step) and (fits := budget.steps_that_fit(step)) is not None and fits < end:
                end = max(step, fits)
                ends.append(end)
            if budget.spent():
                return ends, step, "spent"
        return ends, step, "schedule"

    now[0] = 0.0
    ends, step, why = simulate(100.0)
    assert why == "schedule" and 90 < now[0] <= 100 and len(ends) > 3 and ends[-1] < ends[0] - 200
    now[0] = 0.0
    assert simulate(5.0)[1:] == (1, "spent")


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_train_step_time_script(tmp_path, method):
    """bench/train_step_time.py runs the trainer's step on a random target and writes its time, loss and (traced)
    kernels."""
    import subprocess
    import sys
    from pathlib import Path

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY.to_hf()))
    out = tmp_path / "t.json"
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, str(root / "bench" / "train_step_time.py"), "--hf-config", str(cfg), "--method",
                    method, "--ttt-steps", "2", "--draft-vocab-size", "96",
                    "--aux-layers", ",".join(map(str, tiny_aux_layers(TINY.num_layers))), "--batch-size", "2", "--seq-len", "16",
                    "--iters", "1", "--target-dtype", "float32", "--compute-dtype", "float32", "--profile-dir",
                    str(tmp_path / "prof"), "--output-json", str(out)], check=True, capture_output=True, cwd=root)
    r = json.loads(out.read_text())
    assert r["step_ms"] > 0 and np.isfinite(r["loss"]) and r["args"]["method"] == method
    assert r["kernel_sum_ms"] > 0 and r["kernels_ms_per_step"]
