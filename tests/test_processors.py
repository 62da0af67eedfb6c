"""Logits processors under speculative decoding: against a numpy oracle, and lossless by chi-square over seeds.

At verify position j the processed distribution must be the one plain decoding would sample from after the
committed output plus the drafts before j. The oracle (`ref_probs`) recomputes it from scratch for each history.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.engine import processors, sampler
from tests.test_sampler import ALPHA, N, chi2_pvalue, joint_pvalue, ref_filter

V = 6
LOGITS = np.log(np.array([[0.30, 0.05, 0.25, 0.10, 0.20, 0.10],
                          [0.04, 0.40, 0.06, 0.15, 0.05, 0.30],
                          [0.20, 0.10, 0.15, 0.25, 0.22, 0.08]]))  # target at verify positions 0, 1, 2 (k = 2)
PROMPT = [0, 3]
OUTPUT = [2, 2, 5]  # committed output; its last token is the verify step's input 0


def ref_logits(logits, prompt, output, c):
    """The processed logits for one position, from scratch (float64), given every token so far."""
    x = np.asarray(logits, np.float64).copy()
    if c.get("allowed") is not None:
        x[np.setdiff1d(np.arange(len(x)), c["allowed"])] = -np.inf
    for t, b in c.get("logit_bias", {}).items():
        x[t] += b
    if len(output) < c.get("min_tokens", 0):
        x[c["stop_ids"]] = -np.inf
    for word in c.get("bad_words", []):
        if len(output) >= len(word) - 1 and list(output[len(output) - len(word) + 1:]) == list(word[:-1]):
            x[word[-1]] = -np.inf
    counts = np.bincount(np.asarray(output, int), minlength=len(x))
    seen = np.isin(np.arange(len(x)), prompt) | (counts > 0)
    r = c.get("repetition_penalty", 1.0)
    x = np.where(seen, np.where(x > 0, x / r, x * r), x)
    return x - c.get("frequency_penalty", 0.0) * counts - c.get("presence_penalty", 0.0) * (counts > 0)


def ref_probs(logits, prompt, output, c):
    """The sampling distribution: processed logits / temperature, then min_p, top-k, top-p (vLLM's order)."""
    x = ref_logits(logits, prompt, output, c)
    t = c.get("temperature", 1.0)
    if t == 0:
        return np.eye(len(x))[np.argmax(x)]
    z = x / t
    p = np.exp(z - z.max())
    p /= p.sum()
    z = np.where(p >= c.get("min_p", 0.0) * p.max(), z, -np.inf)
    return ref_filter(z, 1.0, c.get("top_k", 0), c.get("top_p", 1.0))


def make_rows(c, rows: int, prompt=PROMPT, output=OUTPUT, words: int = 4, length: int = 4):
    """The processor state of one slot holding (prompt, output), repeated `rows` times, with `words` x `length`
    bad-word slots (the engine's are MAX_BAD_WORDS x MAX_BAD_WORD_TOKENS; the functions take any)."""
    bias = np.zeros(V, np.float32)
    if c.get("allowed") is not None:
        bias[:] = -np.inf
        bias[c["allowed"]] = 0
    for t, b in c.get("logit_bias", {}).items():
        bias[t] += b
    bad = np.full((words, length), -1, np.int32)
    for i, w in enumerate(c.get("bad_words", [])):
        bad[i, length - len(w):] = w
    history = np.zeros(processors.HISTORY, np.int32)
    for i, t in enumerate(prompt + output):
        history[i % processors.HISTORY] = t
    one = processors.ProcessorState(
        counts=np.bincount(output, minlength=V).astype(np.int32), prompt_mask=np.isin(np.arange(V), prompt),
        bias=bias, stop_mask=np.isin(np.arange(V), c.get("stop_ids", [])), bad_words=bad, history=history,
        num_allowed=np.int32(np.isfinite(bias).sum()),
        num_allowed_stops=np.int32(np.isfinite(bias[c.get("stop_ids", [])]).sum()))
    return jax.tree.map(lambda a: jnp.broadcast_to(jnp.asarray(a), (rows,) + a.shape), one)


def packed_params(c, seeds, prompt_len=len(PROMPT)):
    B = len(seeds)
    full = lambda name, default: np.full(B, c.get(name, default))  # noqa: E731
    return jnp.asarray(sampler.pack_params(
        full("temperature", 1.0), full("top_k", 0), full("top_p", 1.0), seeds,
        presence_penalty=full("presence_penalty", 0.0), frequency_penalty=full("frequency_penalty", 0.0),
        repetition_penalty=full("repetition_penalty", 1.0), min_p=full("min_p", 0.0),
        min_tokens=full("min_tokens", 0), prompt_len=np.full(B, prompt_len), extended=np.ones(B)))


@functools.partial(jax.jit, static_argnames=("wrong",))
def sample(logits, inputs, num_valid, q0, rows, packed, wrong=None, g=None):
    """processors.sample (the engine's extended path; g: a structured-output grammar state), or a deliberately
    wrong variant (negative controls): "bonus_only" processes only the last position; "no_draft_history" ignores
    the drafts as history."""
    slots = jnp.arange(logits.shape[0])  # row b's state is rows' row b
    if wrong is None:
        tokens, n_acc, _ = processors.sample(logits, inputs, num_valid, q0, rows, slots, packed, True, 0, False, g)
        return tokens, n_acc
    p = processors.Params.unpack(packed)
    processed = processors.apply(logits, inputs, q0, rows, slots, p, g)
    if wrong == "bonus_only":
        processed = jnp.concatenate([logits[:, :-1], processed[:, -1:]], axis=1)
    else:
        processed = jnp.concatenate([processors.apply(logits[:, j:j + 1], inputs[:, :1], q0 + j, rows, slots, p, g)
                                     for j in range(logits.shape[1])], axis=1)
    temperature, top_k, top_p, seeds = sampler.unpack_params(packed)
    probs = sampler.filter_probs(processed, temperature, top_k, top_p, True, p.min_p)
    return sampler.accept(probs, inputs[:, 1:], num_valid, seeds, q0 + 1)


def run(c, drafts, seed0: int, wrong=None, g=None):
    B = len(drafts)
    q0 = len(PROMPT) + len(OUTPUT) - 1
    inputs = np.concatenate([np.full((B, 1), OUTPUT[-1]), drafts], axis=1).astype(np.int32)
    logits = jnp.broadcast_to(jnp.asarray(LOGITS, jnp.float32), (B,) + LOGITS.shape)
    tokens, n_acc = sample(logits, jnp.asarray(inputs), jnp.full((B,), 2, jnp.int32), jnp.full((B,), q0, jnp.int32),
                           make_rows(c, B), packed_params(c, np.arange(B) + seed0), wrong=wrong, g=g)
    return np.asarray(tokens), np.asarray(n_acc)


def grouped_pvalue(groups, target, expected_of):
    """Cells (group, target token): target | group must follow expected_of(group) for every group seen."""
    keys = sorted(set(map(tuple, groups)))
    index = {k: i for i, k in enumerate(keys)}
    observed = np.zeros((len(keys), V))
    np.add.at(observed, ([index[tuple(g)] for g in groups], target), 1)
    expected = np.stack([expected_of(k) for k in keys])
    return chi2_pvalue(observed, observed.sum(1, keepdims=True) * expected)


def lossless_pvalues(c, tokens, n_acc, drafts, ref=None):
    """token 0 | draft 0; token 1 | (draft 0 accepted, draft 1); the bonus | (both accepted): each against the
    oracle's distribution (`ref`, default ref_probs) after the committed output plus the accepted drafts."""
    for j in range(2):
        assert (tokens[n_acc > j, j] == drafts[n_acc > j, j]).all()
    ref = ref or ref_probs
    p = lambda *history: ref(LOGITS[len(history)], PROMPT, OUTPUT + list(history), c)  # noqa: E731
    acc1, acc2 = n_acc >= 1, n_acc == 2
    return [grouped_pvalue(drafts[:, :1], tokens[:, 0], lambda g: p()),
            grouped_pvalue(drafts[acc1], tokens[acc1, 1], lambda g: p(g[0])),
            grouped_pvalue(drafts[acc2], tokens[acc2, 2], lambda g: p(g[0], g[1]))]


def random_drafts(seed):
    """[N, 2] drafts: the raw target's argmax half the time, else uniform: often wrong."""
    rng = np.random.default_rng(seed)
    return np.where(rng.random((N, 2)) < 0.5, LOGITS[:2].argmax(-1), rng.integers(0, V, size=(N, 2)))


PENALTIES = dict(presence_penalty=0.7, frequency_penalty=0.4, repetition_penalty=1.5)
PROCESSORS = {
    "penalties": PENALTIES,
    "repetition": dict(repetition_penalty=2.0, temperature=0.8),
    "min_p": dict(min_p=0.6),
    "logit_bias": dict(logit_bias={1: 1.5, 4: -1.0}),
    "allowed": dict(allowed=[0, 1, 2, 4, 5]),
    "bad_words": dict(bad_words=[[5, 1], [2, 2, 0], [4]]),  # 5 -> no 1; 2 2 -> no 0; never 4
    "min_tokens": dict(min_tokens=5, stop_ids=[1, 3]),  # output 3 long: banned at positions 0 and 1, not 2
    "combination": dict(PENALTIES, top_p=0.8, min_p=0.1, logit_bias={1: 1.0, 2: -0.5}, temperature=0.9),
    "everything": dict(PENALTIES, top_k=4, top_p=0.9, min_p=0.05, logit_bias={0: 0.5}, allowed=[0, 1, 2, 3, 5],
                       bad_words=[[1, 0]], min_tokens=4, stop_ids=[3]),
}


@pytest.mark.parametrize("name", list(PROCESSORS))
def test_lossless(name):
    c = PROCESSORS[name]
    drafts = random_drafts(0)
    tokens, n_acc = run(c, drafts, 1000)
    assert min(lossless_pvalues(c, tokens, n_acc, drafts)) > ALPHA
    assert 0.1 < (n_acc >= 1).mean() < 0.9  # drafts are sometimes right and sometimes wrong


@pytest.mark.parametrize("name", ["penalties", "bad_words", "combination"])
def test_lossless_joint_fixed_drafts(name):
    """The whole emitted sequence for fixed drafts, each position's distribution the oracle's after its history."""
    c = PROCESSORS[name]
    d0, d1 = 2, 5  # a repeated token (penalties) and a bad word's prefix (5 -> no 1)
    p0 = ref_probs(LOGITS[0], PROMPT, OUTPUT, c)
    p1 = ref_probs(LOGITS[1], PROMPT, OUTPUT + [d0], c)
    p2 = ref_probs(LOGITS[2], PROMPT, OUTPUT + [d0, d1], c)
    tokens, n_acc = run(c, np.tile([[d0, d1]], (N, 1)), 77)
    assert joint_pvalue(tokens, n_acc, d0, d1, p0, p1, p2) > ALPHA


@pytest.mark.parametrize("wrong", ["bonus_only", "no_draft_history"])
def test_negative_controls_fail(wrong):
    """The same checks reject a sampler that processes only the bonus token, or that forgets the drafts it
    verifies are history for the positions after them."""
    c = PROCESSORS["combination"]
    drafts = random_drafts(0)
    tokens, n_acc = run(c, drafts, 1000, wrong=wrong)
    assert min(lossless_pvalues(c, tokens, n_acc, drafts)) < ALPHA


def apply_and_oracle(c, seed: int, fixed: list, B: int = 64, k: int = 3):
    """Checks processors.apply against the oracle (raw logits where the oracle leaves nothing) at each of k + 1
    verify positions, for random drafts with some rows fixed ([(first row, last row, drafts)]); returns the
    oracle's logits and its empty positions."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(B, k + 1, V)).astype(np.float32) * 2
    drafts = rng.integers(0, V, (B, k))
    for first, last, fixed_drafts in fixed:
        drafts[first:last] = fixed_drafts
    inputs = np.concatenate([np.full((B, 1), OUTPUT[-1]), drafts], axis=1).astype(np.int32)
    q0 = len(PROMPT) + len(OUTPUT) - 1
    params = processors.Params.unpack(packed_params(c, np.zeros(B)))
    got = np.asarray(jax.jit(processors.apply)(jnp.asarray(logits), jnp.asarray(inputs), jnp.full((B,), q0),
                                               make_rows(c, B), jnp.arange(B), params))
    want = np.array([[ref_logits(logits[b, j], PROMPT, OUTPUT + drafts[b, :j].tolist(), c) for j in range(k + 1)]
                     for b in range(B)])
    empty = ~np.isfinite(want).any(axis=-1)
    want[empty] = logits[empty]
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6 * np.abs(want[finite]).max())
    return want, empty


@pytest.mark.parametrize("name", list(PROCESSORS))
def test_apply_matches_oracle_at_every_position(name):
    """Processed logits at each of 4 verify positions (k = 3) for random drafts equal the oracle's for that
    history: bans exact, values to fp32 rounding."""
    # bad words' prefixes and repeats inside the drafts
    want, empty = apply_and_oracle(PROCESSORS[name], 3, [(0, 8, [5, 1, 0]), (8, 16, [2, 2, 0])])
    assert not empty.any()
    assert (~np.isfinite(want)).any() or name not in ("bad_words", "allowed", "min_tokens")  # the bans did happen


@pytest.mark.parametrize("name", [n for n in PROCESSORS if n != "bad_words"])
def test_draft_processing_equals_the_oracle_after_each_draft(name):
    """processors.process_draft (what the draft head's rollout drafts from) at each of k draft positions, the
    earlier drafts counted, equals the oracle (bad words aside: drafts skip them), over the target's vocabulary
    and over a draft vocabulary of some of its ids (EAGLE-3's)."""
    c = {key: v for key, v in PROCESSORS[name].items() if key != "bad_words"}
    rng = np.random.default_rng(11)
    B, k = 32, 3
    logits = (rng.normal(size=(B, k, V)) * 2).astype(np.float32)
    drafts = rng.integers(0, V, (B, k)).astype(np.int32)
    drafts[:8] = [2, 5, 5]  # repeats of a committed token and of a draft
    state, params = make_rows(c, B), processors.Params.unpack(packed_params(c, np.zeros(B)))
    ids = jnp.array([0, 2, 3, 5], jnp.int32)
    process = jax.jit(processors.process_draft)
    for i in range(k):
        earlier = [jnp.asarray(drafts[:, m]) for m in range(i)]
        position = jnp.full((B,), len(PROMPT) + len(OUTPUT) + i)  # the committed output, then i drafts
        want = np.array([ref_logits(logits[b, i], PROMPT, OUTPUT + drafts[b, :i].tolist(), c) for b in range(B)])
        for vocab, x, w in ((None, logits[:, i], want), (ids, logits[:, i][:, ids], want[:, ids])):
            got = np.asarray(process(jnp.asarray(x), vocab, earlier, position, state, jnp.arange(B), params))
            np.testing.assert_array_equal(np.isfinite(got), np.isfinite(w))
            finite = np.isfinite(w)
            np.testing.assert_allclose(got[finite], w[finite], rtol=1e-5, atol=1e-6 * np.abs(w[finite]).max())


EMPTYING = {  # allowed tokens that the bans can exhaust (output 3 long: positions 0 and 1 below min_tokens)
    "never_empty": dict(allowed=[1, 4, 5], min_tokens=5, stop_ids=[1], bad_words=[[4], [4], [2]]),
    "empty_while_short": dict(allowed=[1, 4], min_tokens=5, stop_ids=[1], bad_words=[[4], [4], [2, 1]]),
    "empty_after_a_draft": dict(allowed=[0, 3], bad_words=[[5, 0], [5, 3], [2, 0]]),
}


@pytest.mark.parametrize("name", list(EMPTYING))
def test_apply_leaves_a_position_with_nothing_allowed_unprocessed(name):
    """Where allowed_token_ids, min_tokens and bad words together ban every token, the position gets the raw
    logits; elsewhere the oracle's. The count of what is left is made from small arrays, so repeated and
    redundant bans (a word banning a token already banned, or one outside the allowed set) must not count."""
    _, empty = apply_and_oracle(EMPTYING[name], 5, [(0, 16, [5, 2, 5])], B=48)  # the two-token words' prefixes
    assert empty.any() == (name != "never_empty") and not empty.all()


@pytest.mark.parametrize("V, num", [(49152, 20), (40000, 7), (6144, 5), (1100, 20), (1000, 20), (20, 20)])
def test_top_n_equals_lax_top_k(V, num):
    """Blocks-of-maxima top-N against the full top_k: same values and, with no ties, the same ids; block maxima
    chosen by the same rule (SmolLM2's vocabulary), a vocabulary that is not a multiple of the block, one narrow
    enough for a single top_k."""
    x = jnp.asarray(np.random.default_rng(V).normal(0, 4, (3, 4, V)), jnp.float32)
    (want_v, want_i), (got_v, got_i) = jax.lax.top_k(x, num), processors.top_n(x, num)
    np.testing.assert_array_equal(got_v, want_v)
    np.testing.assert_array_equal(got_i, want_i)


@pytest.mark.parametrize("V", [1000, 40001])
def test_top_n_of_rows_that_are_mostly_minus_infinity(V):
    """Fewer finite values than N (a filtered distribution): those first, then -inf at ids inside the vocabulary
    (the padding of the last block is never chosen)."""
    x = np.full((2, V), -np.inf, np.float32)
    x[:, [3, V - 1, 500]] = [1.0, 2.0, 3.0]
    values, ids = processors.top_n(jnp.asarray(x), 20)
    np.testing.assert_array_equal(values[:, :3], [[3.0, 2.0, 1.0]] * 2)
    np.testing.assert_array_equal(ids[:, :3], [[500, V - 1, 3]] * 2)
    assert np.all(np.asarray(values[:, 3:]) == -np.inf) and 0 <= int(ids.min()) and int(ids.max()) < V


@pytest.mark.parametrize("V", [1000, 256, 77])
def test_greedy_from_blocks_equals_argmax(V):
    """The argmax from block maxima is jnp.argmax's, the first id among ties included (ties inside a block, across
    blocks, and a row all -inf); the block maxima are those of the padded blocks."""
    rng = np.random.default_rng(V)
    x = rng.integers(-3, 4, (5, 3, V)).astype(np.float32)  # many ties
    x[0, 0] = -np.inf
    x[1, 1, [V - 1, V // 2]] = 9.0
    ids, block_max = processors.greedy_from_blocks(jnp.asarray(x))
    np.testing.assert_array_equal(ids, np.argmax(x, axis=-1))
    padded = np.pad(x, [(0, 0), (0, 0), (0, (-V) % processors.BLOCK)], constant_values=-np.inf)
    np.testing.assert_array_equal(block_max, padded.reshape(5, 3, -1, processors.BLOCK).max(-1))


def test_sparse_admission_equals_the_dense_rows():
    """A request without logit_bias or allowed_token_ids is admitted from its stop ids (step.admit_sparse_step):
    the slot state equals the one its dense rows (SlotSpec.rows, step.admit_step) make; ids past the vocabulary
    are left out of both; more than MAX_SPARSE_STOPS ids, a bias or an allowed set need the dense rows."""
    from types import SimpleNamespace

    from jaxspec.engine.slot_spec import MAX_SPARSE_STOPS, SlotSpec
    from jaxspec.engine.step import SlotState, admit_sparse_step, admit_step

    V, S, spec = 50, 5, SimpleNamespace(shardings=None)
    requests = [SlotSpec({}, None, [[4, 5], [9]], [0, 7, 60]), SlotSpec({}, None, [], [49, 3])]
    slots = np.array([[2, S], [4, 2], [S, S]], np.int32)  # the second shares the first's prompt mask; a padding row
    state = SlotState.init(S, 3, V)
    state = dataclasses.replace(state, proc=dataclasses.replace(
        state.proc, counts=state.proc.counts + 1, prompt_mask=state.proc.prompt_mask.at[2, 11].set(True),
        bias=state.proc.bias + 2.0))  # what earlier requests left in the slots
    dense = [r.rows(V) for r in requests] + [SlotSpec({}, None, [], []).rows(V)]
    sparse = [r.sparse_rows(V) for r in requests] + [SlotSpec({}, None, [], []).sparse_rows(V)]
    none = np.full(3, -1, np.int32)  # no structured-output constraint
    want = admit_step(state, slots, *(np.stack([d[i] for d in dense]) for i in range(3)), none, spec)
    got = admit_sparse_step(state, slots, *(np.stack([s[i] for s in sparse]) for i in range(2)), none, spec)
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert np.asarray(got.proc.stop_mask)[2].nonzero()[0].tolist() == [0, 7]
    assert not any(r.needs_dense_rows(V) for r in requests)
    assert SlotSpec({3: 1.0}, None, [], []).needs_dense_rows(V)
    assert SlotSpec({}, [1, 2], [], []).needs_dense_rows(V)
    assert SlotSpec({}, None, [], list(range(MAX_SPARSE_STOPS + 1))).needs_dense_rows(V)
    assert not SlotSpec({}, None, [], list(range(MAX_SPARSE_STOPS)) + [V + 1]).needs_dense_rows(V)
