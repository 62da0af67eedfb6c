"""Adaptive speculation: the engine picks each step's k in 0..K; outputs stay lossless whatever it picks."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import chisquare

from jaxspec import SamplingParams
from jaxspec.config import SpeculativeConfig
from jaxspec.engine import spec_policy
from jaxspec.engine.sampler import rejection_sample
from jaxspec.engine.spec_policy import DynamicPolicy, SpecPolicy, TablePolicy
from tests.tiny import compiles, make_llm, random_prompts, read_before_reuse, tiny_weights, watch_reads

K = 3
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


class Cycle(SpecPolicy):
    """Forces k through a fixed cycle, so that it changes every step."""

    def __init__(self, max_k: int, ks: list[int]):
        super().__init__(max_k)
        self.ks, self.i = ks, 0
        self.choices = sorted(set(ks))
        self.num_steps_by_k = {k: 0 for k in self.choices}

    def choose(self, num_rows, bucket, slots):
        self.i += 1
        return self.ks[self.i % len(self.ks)]


@pytest.fixture(scope="module")
def weights():
    return tiny_weights()


@pytest.fixture(scope="module")
def prompts(trained_heads):
    return trained_heads["eagle"].prompts[:12] + random_prompts(1, 100, 100, seed=9)


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_greedy_equals_plain_decoding_whatever_k_the_policy_picks(weights, prompts, trained_heads, method):
    """k changes every step (0 included: the next step then has no drafts to verify): greedy outputs equal plain
    decoding, async and sync, with preemption."""
    plain = [o.outputs[0].token_ids for o in make_llm(weights).generate(prompts, GREEDY, use_tqdm=False)]
    spec = {"method": method, "model": str(trained_heads[method].path), "num_speculative_tokens": K,
            "dynamic": True}
    llm = make_llm(weights, speculative_config=spec, num_pages=40, max_num_seqs=6)
    assert llm.llm_engine.spec_policy.choices == [0, 1, 2, 3]
    for async_scheduling in (True, False):
        llm.llm_engine.spec_policy = Cycle(K, [3, 0, 1, 2, 0, 0, 3, 1])
        outs = llm.generate(prompts, GREEDY, use_tqdm=False, async_scheduling=async_scheduling)
        assert [o.outputs[0].token_ids for o in outs] == plain, f"async={async_scheduling}"
        assert all(llm.llm_engine.spec_policy.num_steps_by_k[k] > 0 for k in range(K + 1))
    m = llm.get_metrics()
    assert m["num_preemptions"] > 0
    assert 1.0 < m["mean_acceptance_length"] < K + 1
    assert llm.llm_engine.block_manager.num_free == llm.engine_config.num_pages


def test_dynamic_policy_runs_and_reports_its_choices(weights, prompts, trained_heads):
    """The dynamic policy measures its step-time model at start-up, compiles a decode program for every k, runs
    without compiling, and its choices show in get_metrics()."""
    spec = {"method": "eagle", "model": str(trained_heads["eagle"].path), "num_speculative_tokens": K,
            "dynamic": True}
    llm = make_llm(weights, speculative_config=spec, warmup=True, max_num_seqs=4, decode_buckets=[4],
                   prefill_buckets=[64])
    policy = llm.llm_engine.spec_policy
    assert isinstance(policy, DynamicPolicy)
    assert set(policy.step_times) == {(4, k) for k in range(K + 1)}
    assert llm.num_compiled == 9 * (K + 1) + 5 + 3  # decode modes x k (one bucket); prefill modes; admits, copy
    params = [SamplingParams(temperature=[0, 0.8][i % 2], top_p=[1.0, 0.9][i // 2 % 2], seed=i, max_tokens=20)
              for i in range(len(prompts))]
    with compiles() as compiled:
        llm.generate(prompts, params, use_tqdm=False)
    assert compiled == []
    steps = llm.get_metrics()["num_steps_by_k"]
    assert sum(steps.values()) > 0 and set(steps) == set(range(K + 1))


# ---- the policies, with a made-up step-time model

def _times(buckets, cost_per_k):
    return {(B, k): 1.0 + cost_per_k * k for B in buckets for k in range(K + 1)}


def test_step_time_model_reads_each_output_as_the_engine_does(weights):
    """The dynamic policy's step times (ModelRunner.time_decode) come from steps dispatched back to back with every
    output read, each before the step two later (which, with twin buffers, writes over it), as the async engine
    reads them."""
    runner = make_llm(weights, max_num_seqs=4, decode_buckets=[4]).llm_engine.runner
    events = watch_reads(runner, "_run")
    times = runner.time_decode([0], iters=4, rounds=3)
    assert set(times) == {(4, 0)} and times[(4, 0)] > 0
    # two warming calls, then three rounds of four
    assert sum(kind == "dispatch" for kind, _ in events) == 2 + 3 * 4 and read_before_reuse(events)


def test_nondecreasing_fit():
    """Pool adjacent violators: the least-squares non-decreasing fit."""
    assert spec_policy.nondecreasing([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]
    assert spec_policy.nondecreasing([1.458, 1.497, 1.313, 1.362]) == pytest.approx([1.4075] * 4)
    assert spec_policy.nondecreasing([1.0, 3.0, 2.0, 4.0]) == pytest.approx([1.0, 2.5, 2.5, 4.0])
    assert spec_policy.nondecreasing([]) == []
    rng = np.random.default_rng(0)
    for _ in range(50):  # against the definition: non-decreasing, and no non-decreasing sequence fits closer
        v = rng.normal(size=6)
        fit = np.array(spec_policy.nondecreasing(list(v)))
        assert np.all(np.diff(fit) >= -1e-12)
        for _ in range(20):
            other = np.sort(fit + rng.normal(scale=0.3, size=6))
            assert np.sum((fit - v) ** 2) <= np.sum((other - v) ** 2) + 1e-12


def test_dynamic_policy_ranks_k_by_step_times_non_decreasing_in_k():
    """A larger k timed cheaper than a smaller one (noise: a step with more drafts does no less work) does not win
    on that: drafts almost never accepted, k = 3 timed as cheap as k = 1 and k = 2 at 1.6x is ranked at 1.3x, so
    k = 1 is chosen (it costs nothing over k = 0); ranked as measured, k = 3 would be."""
    measured = {(8, 0): 1.0, (8, 1): 1.0, (8, 2): 1.6, (8, 3): 1.0}
    p = DynamicPolicy(K, num_slots=8)
    p.set_step_times(measured)
    assert p.measured_step_times == measured
    assert [p.step_times[(8, k)] for k in range(K + 1)] == pytest.approx([1.0, 1.0, 1.3, 1.3])
    slots = np.arange(8)
    for _ in range(60):
        p.observe(slots, K, np.zeros(8, np.int64))
    expected = p.expected_tokens(slots)
    assert max(range(K + 1), key=lambda k: expected[k] / measured[(8, k)]) == 3  # the noise would have won
    assert p.choose(8, 8, slots) == 1


def test_dynamic_policy_follows_the_acceptance_it_observes():
    p = DynamicPolicy(K, num_slots=8)
    p.set_step_times(_times([8], 0.1))
    slots = np.arange(8)
    assert p.choose(8, 8, slots) == K  # the prior (0.6 per position) pays for drafts costing 10 % each
    for _ in range(60):  # drafts never accepted
        p.observe(slots, K, np.zeros(8, np.int64))
    assert p.choose(8, 8, slots) == 0
    for _ in range(3000):  # no drafts offered any more: the estimates drift slowly back to the prior (IDLE_DECAY)
        p.observe(slots, 0, np.zeros(8, np.int64))
        if p.choose(8, 8, slots) > 0:
            break
    assert p.choose(8, 8, slots) > 0, "never tries drafting again"
    for _ in range(60):  # everything accepted
        p.observe(slots, K, np.full(8, K))
    assert p.choose(8, 8, slots) == K


def test_dynamic_policy_decides_again_every_few_steps_or_when_the_batch_changes():
    """A decision stands for REDECIDE_EVERY observed steps of about the same batch; the queued observations are
    folded in when a decision is remade, with the same result as folding each at once."""
    from jaxspec.engine.spec_policy import MAX_QUEUED, REDECIDE_EVERY

    lazy, eager = DynamicPolicy(K, num_slots=8), DynamicPolicy(K, num_slots=8)
    for p in (lazy, eager):
        p.set_step_times(_times([4, 8], 0.1))
    slots = np.arange(8)
    assert lazy.choose(8, 8, slots) == K
    for step in range(REDECIDE_EVERY):
        for p in (lazy, eager):
            p.observe(slots, K, np.zeros(8, np.int64))
        eager._fold()
        if step < REDECIDE_EVERY - 1:
            assert lazy.choose(8, 8, slots) == K  # standing, though fresh estimates may say otherwise
    assert eager.choose(8, 8, slots) == 0  # what fresh estimates say after four steps of rejected drafts
    assert lazy.choose(8, 8, slots) == 0
    lazy.observe(slots, 0, np.zeros(8, np.int64))
    eager.observe(slots, 0, np.zeros(8, np.int64))
    assert lazy.choose(4, 4, slots[:4]) == eager.choose(4, 4, slots[:4])  # another batch: decided now
    np.testing.assert_allclose(lazy.counts, eager.counts, rtol=1e-12)  # a run of four folded at once
    np.testing.assert_allclose(lazy.slot_counts, eager.slot_counts, rtol=1e-12)
    for _ in range(MAX_QUEUED):  # never asked (no step times): the queue stays bounded
        lazy.observe(slots, K, np.zeros(8, np.int64))
    assert len(lazy._queued) < MAX_QUEUED


@pytest.mark.parametrize("change", [0.05, 1.0])
def test_dynamic_policy_folds_runs_of_steps_as_one_step_at_a_time(change):
    """Observations queued in any order of runs (the same rows and k for several steps, batches that change
    now and then or at every step, k that changes, slot resets between them) fold to the counts of folding each
    one as it comes."""
    rng = np.random.default_rng(0)
    for _ in range(10):
        lazy, eager = DynamicPolicy(K, num_slots=16), DynamicPolicy(K, num_slots=16)
        slots = np.arange(8)
        for step in range(200):
            if rng.random() < change:
                slots = rng.choice(16, int(rng.integers(1, 12)), replace=False)
            if rng.random() < 0.03:
                reset = [int(s) for s in rng.choice(16, 2, replace=False)]
                lazy.reset_slots(reset)
                eager.reset_slots(reset)
                eager._fold()
            k = K if rng.random() < 0.8 else int(rng.integers(0, K + 1))
            accepted = rng.integers(0, k + 1, len(slots))
            lazy.observe(slots.copy(), k, accepted.copy())
            eager.observe(slots.copy(), k, accepted)
            eager._fold()
            if rng.random() < 0.05:
                lazy._fold()
        lazy._fold()
        np.testing.assert_allclose(lazy.counts, eager.counts, rtol=1e-12)
        np.testing.assert_allclose(lazy.slot_counts, eager.slot_counts, rtol=1e-12, atol=1e-12)
        assert lazy.slot_counts.any() and lazy.counts.any()


def _counts_by_definition(observations, num_slots):
    """The policy's counts one row and one position at a time, from the definition: a step with k drafts decays
    the global counts of positions below k by DECAY and the others by IDLE_DECAY; a row offered d drafts (k when
    None) that accepted n reached position i < d iff n >= i and accepted it iff n >= i + 1, and its slot's counts of
    the positions below d decay by SLOT_DECAY; a reset (k None) clears its slots."""
    from jaxspec.engine.spec_policy import DECAY, IDLE_DECAY, SLOT_DECAY

    counts, slot_counts = np.zeros(2 * K), np.zeros((num_slots + 1, 2 * K))
    for slots, k, accepted, offered in observations:
        if k is None:
            slot_counts[slots] = 0.0
            continue
        for i in range(K):
            for half in (0, K):
                counts[half + i] *= DECAY if i < k else IDLE_DECAY
        for r, slot in enumerate(slots):
            d = k if offered is None else offered[r]
            for i in range(d):
                for half, reached in ((0, accepted[r] >= i), (K, accepted[r] >= i + 1)):
                    counts[half + i] += reached
                    slot_counts[slot, half + i] = slot_counts[slot, half + i] * SLOT_DECAY + reached
    return counts, slot_counts


@pytest.mark.parametrize("shorter", [0.0, 0.3])
def test_dynamic_policy_counts_are_their_definition(shorter):
    """Queued observations folded in runs (steady rows), one at a time (rows offered fewer than k drafts, as prompt
    lookup's shorter matches give) and slot resets between them give the counts of the definition, position by
    position."""
    rng = np.random.default_rng(1)
    p, observations, slots = DynamicPolicy(K, num_slots=16), [], np.arange(6)
    for step in range(150):
        if rng.random() < 0.1:
            slots = rng.choice(16, int(rng.integers(1, 10)), replace=False)
        if rng.random() < 0.03:
            reset = rng.choice(16, 2, replace=False)
            p.reset_slots([int(s) for s in reset])
            observations.append((reset, None, None, None))
        k = K if rng.random() < 0.8 else int(rng.integers(0, K + 1))
        offered = None
        if k and rng.random() < shorter:
            offered = rng.integers(0, k + 1, len(slots))
        accepted = rng.integers(0, (k if offered is None else offered) + 1, len(slots))
        p.observe(slots.copy(), k, accepted.copy(), None if offered is None else offered.copy())
        observations.append((slots.copy(), k, accepted, offered))
        if rng.random() < 0.1:
            p._fold()
    p._fold()
    counts, slot_counts = _counts_by_definition(observations, 16)
    np.testing.assert_allclose(p.counts, counts, rtol=1e-12)
    np.testing.assert_allclose(p.slot_counts, slot_counts, rtol=1e-12, atol=1e-12 * slot_counts.max())


def test_dynamic_policy_does_not_count_drafts_a_row_was_not_offered():
    """Rows offered one draft of K that accept it: the first position's estimate rises toward 1, the later ones
    stay where nothing measured them (counting them as rejected would have sent them toward 0)."""
    p, fresh = DynamicPolicy(K, num_slots=8), DynamicPolicy(K, num_slots=8)
    slots = np.arange(8)
    for _ in range(60):
        p.observe(slots, K, np.ones(8, np.int64), np.ones(8, np.int64))
    a, prior = p.acceptance(slots), fresh.acceptance(slots)
    assert (a[:, 0] > 0.9).all()
    np.testing.assert_allclose(a[:, 1:], prior[:, 1:], rtol=1e-9)


def test_dynamic_policy_decision_stands_while_few_rows_change():
    """The standing decision holds while the bucket is the same and at most 1/CHANGED_ROWS of the rows it weighed
    (at least one) finished or joined: requests finishing one by one do not make every step decide again. New
    requests in its slots (reset_slots) count as changed rows, and their slots start from the global estimate."""
    from jaxspec.engine.spec_policy import CHANGED_ROWS

    p = DynamicPolicy(K, num_slots=32)
    p.set_step_times(_times([8, 16], 0.1))
    decisions = []
    expected_tokens = p.expected_tokens
    p.expected_tokens = lambda slots: decisions.append(len(slots)) or expected_tokens(slots)
    assert CHANGED_ROWS == 8  # of 16 rows, 2 may change
    slots = np.arange(16)
    p.choose(16, 16, slots)
    p.choose(14, 16, slots[2:])  # two finished: stands
    p.choose(16, 16, np.r_[slots[1:], [20]])  # one finished, one joined: stands
    assert decisions == [16]
    p.choose(13, 16, slots[3:])  # three finished: decided again
    assert decisions == [16, 13]
    p.choose(12, 16, slots[4:])  # one of its 13 finished since: stands (13 // 8 = 1 may change)
    assert decisions == [16, 13]
    p.reset_slots([5])  # a new request in a slot the decision weighed: a second change
    p.choose(12, 16, slots[4:])
    assert decisions == [16, 13, 12]
    p.choose(8, 8, slots[:8])  # another bucket
    assert decisions == [16, 13, 12, 8]
    for _ in range(20):
        p.observe(slots[:8], K, np.zeros(8, np.int64))
    p.reset_slots([0, 1])
    p.observe(slots[:1], K, np.zeros(1, np.int64))  # after the reset: the new request's first step
    p.acceptance(slots[:8])  # folds what is queued, in order
    assert p.slot_counts[1].sum() == 0 and p.slot_counts[0].tolist() == [1] + [0] * (2 * K - 1)
    assert p.slot_counts[2, 0] > 8  # the requests left alone keep their counts


def test_dynamic_policy_decision_stands_longer_each_time_it_is_confirmed():
    """A steady batch whose estimates keep giving the same k: the decision stands 4, 8, 16, then 32 steps; a
    decision that changes k stands REDECIDE_EVERY steps again."""
    from jaxspec.engine.spec_policy import MAX_STANDING, REDECIDE_EVERY

    p = DynamicPolicy(K, num_slots=8)
    p.set_step_times(_times([8], 0.1))
    slots = np.arange(8)
    made = []
    expected_tokens = p.expected_tokens
    p.expected_tokens = lambda s: made.append(step) or expected_tokens(s)
    for step in range(100):
        p.choose(8, 8, slots)
        p.observe(slots, K, np.full(8, K))  # every draft accepted: k = K throughout
    assert MAX_STANDING == 32 and np.diff(made).tolist() == [4, 8, 16, 32, 32]
    for step in range(100, 300):  # now nothing is accepted: a decision moves k down, and stands 4 steps
        k = p.choose(8, 8, slots)
        if k < K:
            break
        p.observe(slots, K, np.zeros(8, np.int64))
    changed = made[-1]
    assert k < K and changed == step < 100 + 50 + MAX_STANDING  # the estimates' memory (~50 steps), then the wait
    for step in range(step, step + 40):
        p.choose(8, 8, slots)
        p.observe(slots, k, np.zeros(8, np.int64))
    assert made[made.index(changed) + 1] - changed == REDECIDE_EVERY


def test_dynamic_policy_keeps_the_small_k_it_settled_on():
    """The first draft accepted half the time, later ones one time in ten: k = 1. Steps at k = 1 measure position
    0 only; positions 1 and 2 keep their measured estimates for hundreds of steps, so the policy does not keep
    trying larger k on stale hopes (decaying them at DECAY, it went back to k = 2 in 11 of these 300 steps)."""
    p = DynamicPolicy(K, num_slots=8)
    p.set_step_times(_times([8], 0.1))
    slots = np.arange(8)
    rng = np.random.default_rng(0)

    def accepted(k: int) -> np.ndarray:
        n = np.zeros(8, np.int64)
        for r in range(8):
            while n[r] < k and rng.random() < (0.5 if n[r] == 0 else 0.1):
                n[r] += 1
        return n

    for _ in range(60):
        p.observe(slots, K, accepted(K))
    picks = []
    for _ in range(300):
        picks.append(p.choose(8, 8, slots))
        p.observe(slots, picks[-1], accepted(picks[-1]))
    assert picks.count(1) >= 295, {k: picks.count(k) for k in set(picks)}


def test_dynamic_policy_weighs_each_request_and_the_step_cost():
    p = DynamicPolicy(K, num_slots=8)
    p.set_step_times(_times([4], 0.4))
    good, bad = np.array([0, 1]), np.array([2, 3])
    for _ in range(30):
        p.observe(good, K, np.full(2, K))
        p.observe(bad, K, np.zeros(2, np.int64))
    assert p.choose(2, 4, good) == K and p.choose(2, 4, bad) == 0
    e_good, e_bad = p.expected_tokens(good), p.expected_tokens(bad)
    assert e_good[K] > 3 * 2 and e_bad[K] < 1.5 * 2 and e_good[0] == e_bad[0] == 2
    p.reset_slots([0, 1])  # new requests there: back to the global estimate
    assert np.allclose(p.acceptance(good), p.acceptance(np.array([5, 6])))
    expensive = DynamicPolicy(K, num_slots=8)
    expensive.set_step_times(_times([4], 5.0))  # drafting costs five steps' worth per draft: never worth it
    assert expensive.choose(2, 4, good) == 0


def test_table_policy_and_config_validation():
    t = TablePolicy(K, {1: 3, 24: 1, 96: 0})
    assert [t.choose(n, n, np.arange(n)) for n in (1, 23, 24, 95, 96, 200)] == [3, 3, 1, 1, 0, 0]
    assert t.choices == [0, 1, 3]
    cfg = SpeculativeConfig.parse({"model": "h", "num_speculative_tokens": K,
                                   "num_speculative_tokens_per_batch_size": {"1": 3, "32": 0}})
    assert cfg.num_speculative_tokens_per_batch_size == {1: 3, 32: 0}
    assert isinstance(spec_policy.make_policy(cfg, 4), TablePolicy)
    bad = [({"dynamic": "yes"}, "dynamic"), ({"num_speculative_tokens_per_batch_size": {"2": 1}}, "batch size 1"),
           ({"num_speculative_tokens_per_batch_size": {"1": 4}}, "k in"),
           ({"num_speculative_tokens_per_batch_size": {"x": 1}}, "not an integer"),
           ({"dynamic": True, "num_speculative_tokens_per_batch_size": {"1": 1}}, "exclude")]
    for extra, message in bad:
        with pytest.raises(ValueError, match=message):
            SpeculativeConfig.parse({"model": "h", "num_speculative_tokens": K} | extra)


def test_vllm_speculative_config_keys():
    """vLLM's other keys: those that change nothing here pass at their values, disable_by_batch_size=N is the
    schedule {1: K, N: 0}, and a value that would change the drafts or their checking is refused by name."""
    base = {"method": "eagle", "model": "h", "num_speculative_tokens": K}
    same = SpeculativeConfig.parse(base | {"disable_padded_drafter_batch": True, "enforce_eager": True,
                                           "speculative_token_tree": None, "acceptance_method": "rejection_sampler",
                                           "draft_tensor_parallel_size": 1})
    assert same == SpeculativeConfig.parse(base)
    by_size = SpeculativeConfig.parse(base | {"disable_by_batch_size": 32})
    assert by_size.num_speculative_tokens_per_batch_size == {1: K, 32: 0}
    assert TablePolicy(K, by_size.num_speculative_tokens_per_batch_size).choose(31, 31, np.arange(31)) == K
    for extra, message in [({"method": "medusa"}, "method must be one of"),
                           ({"spec_token_tree": "[(0,), (1,)]"}, "spec_token_tree"),
                           ({"acceptance_method": "typical_acceptance_sampler"}, "acceptance_method"),
                           ({"draft_tensor_parallel_size": 2}, r"LLM\(draft_tensor_parallel_size"),
                           ({"disable_by_batch_size": 1}, "disable_by_batch_size must be"),
                           ({"disable_by_batch_size": 8, "dynamic": True}, "exclude"),
                           ({"prompt_lookup": 4}, "unknown keys")]:
        with pytest.raises(ValueError, match=message):
            SpeculativeConfig.parse(base | extra)


# ---- losslessness with k changing between steps

V, N, ALPHA = 5, 24_000, 0.01
PROBS = np.array([[0.5, 0.2, 0.15, 0.1, 0.05], [0.05, 0.4, 0.3, 0.15, 0.1], [0.3, 0.05, 0.05, 0.3, 0.3],
                  [0.1, 0.1, 0.6, 0.1, 0.1], [0.25, 0.25, 0.2, 0.2, 0.1], [0.6, 0.1, 0.1, 0.1, 0.1],
                  [0.2, 0.2, 0.2, 0.2, 0.2], [0.1, 0.3, 0.3, 0.2, 0.1], [0.4, 0.1, 0.1, 0.1, 0.3],
                  [0.2, 0.2, 0.2, 0.2, 0.2]], np.float32)  # the target's distribution at each position
DRAFTS = np.array([4, 0, 1, 0, 3, 4, 1, 0, 2, 1], np.int32)  # per position: often improbable


@functools.partial(jax.jit, static_argnames=("ks",))
def _steps(seeds, ks):
    """Per seed: steps with (k, drafts) = ks[0], ks[1], ... from position 0, each verifying k draft slots of which
    the first `drafts` hold drafts (ngram may fill fewer than k; the rest are stale tokens that must be ignored);
    the first 3 emitted tokens."""
    logits_all = jnp.log(jnp.asarray(PROBS))

    def one(seed):
        pos, seq = jnp.int32(0), jnp.full((len(PROBS),), -1, jnp.int32)
        for k, c in ks:
            at = pos + jnp.arange(k + 1)
            logits = logits_all[at][None]
            drafts = jnp.where(jnp.arange(k) < c, jnp.asarray(DRAFTS)[at[1:]], 2)[None]
            one_ = lambda x, dtype: jnp.asarray([x], dtype)  # noqa: E731
            emitted, n_acc = rejection_sample(logits, drafts, one_(c, jnp.int32), one_(1.0, jnp.float32),
                                              one_(0, jnp.int32), one_(1.0, jnp.float32), seed[None],
                                              one_(0, jnp.int32) + pos, all_greedy=False, filtered=False)
            keep = jnp.arange(k + 1) <= n_acc[0]
            seq = seq.at[jnp.where(keep, at, len(PROBS))].set(emitted[0], mode="drop")
            pos = pos + n_acc[0] + 1
        return seq[:3]

    return jax.vmap(one)(seeds)


@pytest.mark.parametrize("ks", [((2, 2), (0, 0), (1, 1)), ((1, 1), (3, 3), (0, 0)), ((0, 0), (2, 2), (2, 2)),
                                ((3, 3), (1, 1), (2, 2)), ((3, 1), (3, 0), (3, 3)), ((3, 2), (3, 1), (3, 0))])
def test_joint_distribution_is_the_target_with_k_changing_between_steps(ks):
    """Chi-square over 24,000 seeds: the first three tokens' joint distribution equals the product of the
    target's per-position distributions, whichever k each step drafted with and however many of its k slots a
    row filled (ngram)."""
    seqs = np.asarray(_steps(jnp.arange(N, dtype=jnp.uint32), ks))
    assert (seqs >= 0).all()
    cells = seqs[:, 0] * V * V + seqs[:, 1] * V + seqs[:, 2]
    observed = np.bincount(cells, minlength=V ** 3)
    p = PROBS.astype(np.float64)
    expected = np.einsum("a,b,c->abc", p[0], p[1], p[2]).reshape(-1)
    expected *= N / expected.sum()
    assert chisquare(observed, expected).pvalue > ALPHA
