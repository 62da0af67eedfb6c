"""Sampler tests: filters against numpy, greedy accept/reject by hand, losslessness by chi-square over seeds."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import chisquare

from jaxspec.engine.sampler import (SamplingTable, batch_flags, filter_probs, pack_params, rejection_sample,
                                    token_keys, unpack_params)
from tests.numerics import FP32_EPS, assert_close_scaled

ALPHA = 0.01
N = 24_000  # samples (one seed each) per losslessness run


def ref_filter(logits, temperature, top_k, top_p):
    """Straightforward numpy oracle for one row of logits [V] (float64)."""
    V = len(logits)
    if temperature == 0:
        return np.eye(V)[np.argmax(logits)]
    p = np.exp((logits - logits.max()) / temperature)
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.zeros(V, bool)
    keep[order[: top_k if 0 < top_k < V else V]] = True
    p = np.where(keep, p, 0.0) / p[keep].sum()
    if top_p < 1.0:  # smallest prefix of the sorted probs with mass >= top_p, at least the argmax
        n = min(int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1, V)
        keep = np.zeros(V, bool)
        keep[order[:n]] = True
        p = np.where(keep, p, 0.0) / p[keep].sum()
    return p


@functools.partial(jax.jit, static_argnames=("all_greedy", "filtered"))
def sample(logits, drafts, num_valid, temperature, top_k, top_p, seeds, positions, all_greedy=False, filtered=True):
    return rejection_sample(logits, drafts, num_valid, temperature, top_k, top_p, seeds, positions,
                            all_greedy, filtered)


def run(logits, drafts, num_valid=None, temperature=1.0, top_k=0, top_p=1.0, seeds=None, positions=None, **kw):
    """Broadcast per-row params (scalars or [B]) and call the jitted sampler; returns numpy arrays."""
    B = drafts.shape[0]
    full = lambda x, dtype: jnp.broadcast_to(jnp.asarray(x, dtype), (B,))
    logits = jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (B,) + np.shape(logits)[-2:])
    num_valid = drafts.shape[1] if num_valid is None else num_valid
    seeds = np.arange(B) if seeds is None else seeds
    positions = np.zeros(B) if positions is None else positions
    tokens, n_acc = sample(logits, jnp.asarray(drafts, jnp.int32), full(num_valid, jnp.int32),
                           full(temperature, jnp.float32), full(top_k, jnp.int32), full(top_p, jnp.float32),
                           full(seeds, jnp.uint32), full(positions, jnp.int32), **kw)
    return np.asarray(tokens), np.asarray(n_acc)


# ---- filter_probs


def test_filter_probs_matches_numpy():
    B, T, V = 8, 3, 50
    logits = np.random.default_rng(0).normal(size=(B, T, V)).astype(np.float32) * 2
    temperature = np.array([1.0, 0.5, 2.0, 0.0, 1.0, 1.0, 0.7, 1.0], np.float32)
    top_k = np.array([0, 5, 1, 5, V, 0, 10, V + 7], np.int32)
    top_p = np.array([1.0, 1.0, 1.0, 0.5, 0.9, 0.6, 0.8, 0.0], np.float32)
    got = np.asarray(filter_probs(jnp.asarray(logits), jnp.asarray(temperature), jnp.asarray(top_k),
                                  jnp.asarray(top_p)))
    for b in range(B):
        for t in range(T):
            want = ref_filter(logits[b, t].astype(np.float64), temperature[b], top_k[b], top_p[b])
            # fp32 against float64: softmax and the renormalizations sum V = 50 terms
            assert_close_scaled(got[b, t], want, V * FP32_EPS, err_msg=f"row {b} pos {t}")
            assert np.array_equal(got[b, t] > 0, want > 0)
    assert ((got[1] > 0).sum(-1) == 5).all() and ((got[2] > 0).sum(-1) == 1).all()  # exactly k kept
    assert ((got[3] > 0).sum(-1) == 1).all() and (got[3].argmax(-1) == logits[3].argmax(-1)).all()  # greedy
    assert ((got[7] > 0).sum(-1) == 1).all()  # top_p 0 keeps the argmax


def test_filter_probs_unfiltered_is_softmax():
    logits = jnp.asarray(np.random.default_rng(1).normal(size=(2, 2, 30)), jnp.float32)
    temperature, top_k, top_p = jnp.array([0.5, 1.0]), jnp.array([0, 30]), jnp.array([1.0, 1.0])
    want = jax.nn.softmax(logits / temperature[:, None, None], axis=-1)
    for filtered in (True, False):
        # two fp32 softmaxes over V = 30 logits, normalized in other orders
        assert_close_scaled(filter_probs(logits, temperature, top_k, top_p, filtered), want, 30 * FP32_EPS,
                            err_msg=f"filtered={filtered}")


def test_pack_and_flags():
    packed = pack_params([0.0, 0.7], [0, 20], [1.0, 0.9], [3, 2**32 - 1])
    t, k, p, s = jax.jit(unpack_params)(jnp.asarray(packed))
    assert t.tolist() == [0.0, np.float32(0.7)] and k.tolist() == [0, 20]
    assert p.tolist() == [1.0, np.float32(0.9)] and s.tolist() == [3, 2**32 - 1]
    assert batch_flags([0, 0], [5, 0], [0.5, 1], 100) == (True, False)
    assert batch_flags([0, 1], [5, 0], [0.5, 1], 100) == (False, False)
    assert batch_flags([1, 1], [0, 100], [1.0, 0.9], 100) == (False, True)


def test_sampling_table_rows_and_batch_kind():
    """Each slot's packed row is pack_params' row of its request; a batch's kind ORs its slots' (the padding row,
    index num_slots, is greedy and plain)."""
    from jaxspec import SamplingParams
    t = SamplingTable(4, 100)
    t.set(0, SamplingParams(temperature=0, top_p=0.5), 7, 3)  # greedy: its top_p filters nothing
    t.set(1, SamplingParams(temperature=0.8, top_k=5, seed=1), 8, 4)
    t.set(2, SamplingParams(temperature=0, logprobs=2), 9, 5)
    t.set(3, SamplingParams(temperature=0, presence_penalty=0.5, min_tokens=2), 10, 6)
    packed, kind = t.batch(np.array([0, 1, 2, 3, 4]))
    want = pack_params([0.0, 0.8, 0.0, 0.0, 0.0], [0, 5, 0, 0, 0], [0.5, 1.0, 1.0, 1.0, 0.0], [7, 8, 9, 10, 0],
                       repetition_penalty=[1.0] * 4 + [0.0], presence_penalty=[0, 0, 0, 0.5, 0],
                       min_tokens=[0, 0, 0, 2, 0], prompt_len=[3, 4, 5, 6, 0], extended=[0, 0, 1, 1, 0])
    assert packed.dtype == np.uint32 and (packed == want).all()
    assert kind == (False, True, True, True, False)
    assert t.batch(np.array([0, 4]))[1] == (True, False, False, False, False)
    assert t.batch(np.array([0, 2]))[1] == (True, False, True, False, False)
    assert t.batch(np.array([2, 3, 4]))[1] == (True, False, True, True, False)
    assert t.batch(np.array([1, 4]))[1] == (False, True, False, False, False)
    from jaxspec.sampling_params import StructuredOutputsParams
    t.set(1, SamplingParams(temperature=0, structured_outputs=StructuredOutputsParams(regex="a")), 8, 4)
    assert t.batch(np.array([1, 2]))[1] == (True, False, True, True, True)  # a constraint is a processor


# ---- greedy accept/reject


def greedy_logits(targets, V=8):
    """[k+1] argmax tokens -> logits [k+1, V] whose argmax is that token."""
    logits = np.random.default_rng(2).normal(size=(len(targets), V)).astype(np.float32)
    logits[np.arange(len(targets)), targets] = 10.0
    return logits


@pytest.mark.parametrize("all_greedy", [True, False])
def test_greedy_accept_reject(all_greedy):
    logits = np.stack([greedy_logits(t) for t in ([3, 5, 1, 7], [3, 5, 1, 7], [3, 5, 1, 7], [3, 5, 1, 7],
                                                  [2, 4, 6, 0], [3, 5, 1, 7])])
    drafts = np.array([[3, 5, 1], [3, 5, 2], [4, 5, 1], [3, 5, 1], [2, 4, 6], [3, 0, 1]])
    num_valid = np.array([3, 3, 3, 1, 0, 2])
    tokens, n_acc = run(logits, drafts, num_valid, temperature=0.0, all_greedy=all_greedy)
    assert n_acc.tolist() == [3, 2, 0, 1, 0, 1]
    assert tokens.tolist() == [[3, 5, 1, 7],  # all accepted: bonus
                               [3, 5, 1, -1],  # third rejected: corrected to the argmax 1
                               [3, -1, -1, -1],  # first rejected
                               [3, 5, -1, -1],  # num_valid 1: bonus after one draft
                               [2, -1, -1, -1],  # num_valid 0: plain decoding
                               [3, 5, -1, -1]]  # second rejected within num_valid 2


@pytest.mark.parametrize("all_greedy", [True, False])
def test_greedy_k0(all_greedy):
    logits = np.stack([greedy_logits([t]) for t in (4, 0, 7)])
    tokens, n_acc = run(logits, np.zeros((3, 0), np.int32), 0, temperature=0.0, all_greedy=all_greedy)
    assert tokens.tolist() == [[4], [0], [7]] and n_acc.tolist() == [0, 0, 0]


def test_mixed_greedy_and_random_rows():
    logits = np.stack([greedy_logits([3, 5, 1, 7])] * 4)
    drafts = np.array([[3, 5, 1]] * 4)
    tokens, n_acc = run(logits, drafts, temperature=np.array([0.0, 1.0, 0.0, 1.0]), seeds=np.array([0, 0, 1, 1]))
    assert tokens[0].tolist() == tokens[2].tolist() == [3, 5, 1, 7]
    assert (tokens[[1, 3], : n_acc[[1, 3]].min()] == drafts[[1, 3], : n_acc[[1, 3]].min()]).all()


# ---- losslessness: the emitted tokens follow the target's (filtered) distribution exactly

V = 6
LOGITS = np.log(np.array([[0.30, 0.05, 0.25, 0.10, 0.20, 0.10],
                          [0.04, 0.40, 0.06, 0.15, 0.05, 0.30],
                          [0.20, 0.10, 0.15, 0.25, 0.22, 0.08]]))  # target at verify positions 0, 1, 2 (k = 2)


def chi2_pvalue(observed, expected):
    """Chi-square over the cells with expected > 0; a count in a zero-probability cell fails outright."""
    observed, expected = np.ravel(observed).astype(float), np.ravel(expected).astype(float)
    if observed[expected == 0].sum() > 0:
        return 0.0
    live = expected > 0
    return chisquare(observed[live], expected[live] * observed[live].sum() / expected[live].sum()).pvalue


def conditional_pvalue(cond, target, p):
    """Cells (cond value, target token): target | cond must follow p for every value of cond."""
    observed = np.zeros((V, V))
    np.add.at(observed, (cond, target), 1)
    return chi2_pvalue(observed, observed.sum(1, keepdims=True) * p[None])


def lossless_pvalues(tokens, n_acc, drafts, p):
    """p-values of: token 0 | draft 0; token 1 | draft 1 given draft 0 accepted; the bonus | both accepted."""
    assert (tokens[np.arange(len(tokens)), n_acc] >= 0).all()
    for j in range(drafts.shape[1]):
        assert (tokens[n_acc > j, j] == drafts[n_acc > j, j]).all()
    acc1, acc2 = n_acc >= 1, n_acc == 2
    return [conditional_pvalue(drafts[:, 0], tokens[:, 0], p[0]),
            conditional_pvalue(drafts[acc1, 1], tokens[acc1, 1], p[1]),
            conditional_pvalue(np.zeros(acc2.sum(), int), tokens[acc2, 2], p[2])]


FILTERS = {"plain": dict(temperature=1.0), "temperature": dict(temperature=0.7),
           "top_k": dict(temperature=1.0, top_k=3), "top_p": dict(temperature=1.0, top_p=0.6),
           "top_k_top_p": dict(temperature=0.8, top_k=4, top_p=0.7)}


def random_drafts(seed):
    """[N, 2] drafts: the target's argmax half the time (as a draft head would), else uniform: often wrong."""
    rng = np.random.default_rng(seed)
    return np.where(rng.random((N, 2)) < 0.5, LOGITS[:2].argmax(-1), rng.integers(0, V, size=(N, 2)))


@pytest.mark.parametrize("name", list(FILTERS))
def test_lossless(name):
    f = FILTERS[name]
    p = np.stack([ref_filter(LOGITS[j], f["temperature"], f.get("top_k", 0), f.get("top_p", 1.0)) for j in range(3)])
    drafts = random_drafts(0)
    positions = np.random.default_rng(1).integers(0, 4000, size=N)
    tokens, n_acc = run(LOGITS, drafts, seeds=np.arange(N) + 1000, positions=positions, **f)
    assert min(lossless_pvalues(tokens, n_acc, drafts, p)) > ALPHA
    assert 0.15 < (n_acc >= 1).mean() < 0.85  # drafts are sometimes right and sometimes wrong


def joint_pvalue(tokens, n_acc, d0: int, d1: int, p0, p1, p2) -> float:
    """The whole emitted sequence for the fixed drafts (d0, d1), where p1 follows d0 and p2 follows (d0, d1):
    P(d0, d1, y) = p0(d0) p1(d1) p2(y), P(d0, y != d1) = p0(d0) p1(y), P(y != d0) = p0(y)."""
    observed, expected = {}, {}
    for y in range(len(p0)):
        expected[(y,)] = p0[y] * (y != d0)
        expected[(d0, y)] = p0[d0] * p1[y] * (y != d1)
        expected[(d0, d1, y)] = p0[d0] * p1[d1] * p2[y]
    for row, n in zip(tokens, n_acc):
        seq = tuple(row[: n + 1].tolist())
        observed[seq] = observed.get(seq, 0) + 1
    assert set(observed) <= set(expected)
    cells = list(expected)
    return chi2_pvalue([observed.get(c, 0) for c in cells], [expected[c] for c in cells])


def test_lossless_joint_fixed_drafts():
    p = np.exp(LOGITS)
    drafts = np.tile([[2, 1]], (N, 1))
    tokens, n_acc = run(LOGITS, drafts, seeds=np.arange(N) + 77, positions=np.full(N, 123))
    assert joint_pvalue(tokens, n_acc, 2, 1, *p) > ALPHA


def test_lossless_respects_num_valid():
    p = np.exp(LOGITS)
    drafts = random_drafts(3)
    num_valid = np.random.default_rng(4).integers(0, 3, size=N)
    tokens, n_acc = run(LOGITS, drafts, num_valid, seeds=np.arange(N) + 5000, positions=np.arange(N))
    assert (n_acc <= num_valid).all()
    for nv in range(3):  # with num_valid = nv the token at nv is a bonus sampled from p[nv]
        rows = (num_valid == nv) & (n_acc == nv)
        assert chi2_pvalue(np.bincount(tokens[rows, nv], minlength=V), p[nv]) > ALPHA


def test_negative_controls_fail():
    # The same checks must reject wrong samplers, else passing them means nothing.
    p = np.exp(LOGITS)
    drafts = random_drafts(0)
    rng = np.random.default_rng(5)
    accept_always = np.concatenate([drafts, rng.choice(V, size=(N, 1), p=p[2])], axis=1)
    assert min(lossless_pvalues(accept_always, np.full(N, 2), drafts, p)) < ALPHA
    # Subtle bug: on rejection resample from p instead of the residual (the draft is emitted too often).
    accepted = rng.random(N) < p[0, drafts[:, 0]]
    token0 = np.where(accepted, drafts[:, 0], [rng.choice(V, p=p[0]) for _ in range(N)])
    assert conditional_pvalue(drafts[:, 0], token0, p[0]) < ALPHA
    # Sampling from the unfiltered p when the target is top-k filtered.
    top_k = ref_filter(LOGITS[0], 1.0, 3, 1.0)
    assert chi2_pvalue(np.bincount(rng.choice(V, size=N, p=p[0]), minlength=V), top_k) < ALPHA


# ---- k = 0 and determinism


def test_k0_is_plain_sampling_keyed_on_position():
    p = np.exp(LOGITS[:1])
    no_drafts = np.zeros((N, 0), np.int32)
    by_seed, _ = run(LOGITS[:1], no_drafts, 0, seeds=np.arange(N), positions=np.full(N, 9))
    by_position, _ = run(LOGITS[:1], no_drafts, 0, seeds=np.full(N, 42), positions=np.arange(N))
    for tokens in (by_seed[:, 0], by_position[:, 0]):
        assert chi2_pvalue(np.bincount(tokens, minlength=V), p[0]) > ALPHA
    # The same token as spec decoding with k = 2 and no drafts allowed: plain decoding = spec with k = 0.
    spec, n_acc = run(LOGITS, random_drafts(6), 0, seeds=np.arange(N), positions=np.full(N, 9))
    assert (n_acc == 0).all() and (spec[:, 0] == by_seed[:, 0]).all() and (spec[:, 1:] == -1).all()


def test_same_seed_and_position_same_tokens_in_any_batch():
    rng = np.random.default_rng(7)
    B = 64
    logits = rng.normal(size=(B, 3, 50)).astype(np.float32)
    drafts = rng.integers(0, 50, size=(B, 2))
    drafts[:, 0] = logits[:, 0].argmax(-1)  # often accepted, so later positions matter too
    params = dict(num_valid=rng.integers(0, 3, size=B), temperature=rng.choice([0.0, 0.8, 1.0], size=B),
                  top_k=rng.choice([0, 5], size=B), top_p=rng.choice([1.0, 0.9], size=B),
                  seeds=rng.integers(0, 2**32, size=B), positions=rng.integers(0, 10_000, size=B))
    tokens, n_acc = run(logits, drafts, **params)
    perm = rng.permutation(B)
    tokens_p, n_acc_p = run(logits[perm], drafts[perm], **{k: v[perm] for k, v in params.items()})
    assert (tokens_p == tokens[perm]).all() and (n_acc_p == n_acc[perm]).all()
    for b in range(4):  # alone, batch size 1
        alone, n_alone = run(logits[b:b + 1], drafts[b:b + 1], **{k: v[b:b + 1] for k, v in params.items()})
        assert (alone[0] == tokens[b]).all() and n_alone[0] == n_acc[b]
    # a different position gives different randomness
    moved, _ = run(logits, drafts, **{**params, "positions": params["positions"] + 1})
    assert (moved != tokens).any()


def test_token_keys():
    keys = token_keys(jnp.array([1, 2**32 - 1], jnp.uint32), jnp.array([[0, 7], [7, 0]], jnp.int32))
    want = jax.random.fold_in(jax.random.PRNGKey(2**32 - 1), 7)
    assert (jax.random.key_data(keys[1, 0]) == want).all()
    assert not (jax.random.key_data(keys[0, 1]) == jax.random.key_data(keys[1, 0])).all()


def test_threshold_search_keeps_the_sorts_tokens():
    """bench/sampler_cost.py's sort-free top-k / top-p filter (a candidate for the sampler, timed against the sort)
    keeps exactly the tokens the sort keeps, ties (bf16-rounded and integer logits) and edge settings included."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "sampler_cost", Path(__file__).resolve().parents[1] / "bench" / "sampler_cost.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    search = jax.jit(bench.filter_probs_search, static_argnums=4)
    rng = np.random.default_rng(3)
    for trial in range(6):
        B, T, V = 8, 2, int(rng.integers(20, 2000))
        logits = (rng.normal(size=(B, T, V)) * rng.uniform(0.5, 4)).astype(np.float32)
        if trial % 3 == 1:
            logits = np.asarray(jnp.asarray(logits, jnp.bfloat16).astype(jnp.float32))
        if trial % 3 == 2:
            logits = np.round(logits)
        args = (jnp.asarray(logits), jnp.asarray(rng.choice([0.0, 0.5, 1.0, 2.0], B), jnp.float32),
                jnp.asarray(rng.choice([0, -1, 1, 5, 50, V, V + 3], B), jnp.int32),
                jnp.asarray(rng.choice([1.0, 0.95, 0.5, 0.0, 0.999], B), jnp.float32))
        want = np.asarray(filter_probs(*args))
        got = np.asarray(search(*args, trial % 2 == 1))  # both layouts of a pass's tests
        assert np.array_equal(got > 0, want > 0), f"trial {trial}"
        assert_close_scaled(got, want, 30 * FP32_EPS, axis=-1)
