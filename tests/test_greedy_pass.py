"""The one-kernel greedy pass (engine/greedy_pass.py) against the XLA path it replaces (processors.sample), in
Pallas's interpreter: every processor, bans from bad words and min_tokens, rows whose state is stale, ties, and
vocabularies split into many tiles and slices; then lowered to Triton for a GPU, and inside the engine."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec import SamplingParams
from jaxspec.engine import greedy_pass, processors, sampler
from jaxspec.models.kernel_config import KernelConfig
from tests import triton_ir
from tests.numerics import FP32_EPS, assert_close_scaled
from tests.tiny import make_llm, random_prompts, tiny_weights

S, W, L = 6, 4, 3  # slots, bad words per slot, tokens per word


def random_state(rng: np.random.Generator, V: int) -> processors.ProcessorState:
    """A slot table whose rows have output counts, prompt tokens, a bias (slot 1: an allowed set), stop ids and
    bad words: one token banned everywhere, one after token 7, one after the pair (3, 5)."""
    counts = rng.integers(1, 4, (S + 1, V)) * (rng.random((S + 1, V)) < 0.05)
    bias = rng.normal(0, 1, (S + 1, V)) * (rng.random((S + 1, V)) < 0.1)
    bias[1] = np.where(rng.random(V) < 0.2, 0.0, -np.inf)
    stop = np.isin(np.arange(V), [1, 2])[None].repeat(S + 1, 0)
    words = np.full((S + 1, W, L), -1, np.int32)
    words[:, 0, -1] = 11
    words[:, 1, -2:] = [7, 12]
    words[:, 2] = [3, 5, 13]
    allowed = np.isfinite(bias)
    return processors.ProcessorState(
        counts=jnp.asarray(counts, jnp.int32), prompt_mask=jnp.asarray(rng.random((S + 1, V)) < 0.05),
        bias=jnp.asarray(bias, jnp.float32), stop_mask=jnp.asarray(stop), bad_words=jnp.asarray(words),
        history=jnp.asarray(rng.integers(0, V, (S + 1, processors.HISTORY)), jnp.int32),
        num_allowed=jnp.asarray(allowed.sum(1), jnp.int32), num_allowed_stops=jnp.asarray((allowed & stop).sum(1),
                                                                                         jnp.int32))


def batch(seed: int, V: int, B: int = 5, T: int = 4, ties: bool = False):
    """Logits [B, T, V] (integers with many ties, or normal), inputs with drafts that hit the bad words' prefixes
    and repeat tokens, positions, slots (the last row a padding row on the spare slot) and packed params (greedy;
    penalties, min_tokens on some rows, row 2's state stale)."""
    rng = np.random.default_rng(seed)
    logits = (rng.integers(-4, 5, (B, T, V)) if ties else rng.normal(0, 3, (B, T, V))).astype(np.float32)
    inputs = rng.integers(0, V, (B, T)).astype(np.int32)
    inputs[0, 1:] = [7, 3, 5][:T - 1]
    inputs[1, 1:] = inputs[1, 0]
    q0 = np.full(B, 40, np.int32)
    slots = np.array([3, 1, 0, 4, S][:B], np.int32)
    packed = sampler.pack_params(
        np.zeros(B), np.zeros(B, int), np.ones(B), np.arange(B), presence_penalty=rng.uniform(0, 1, B),
        frequency_penalty=rng.uniform(0, 0.5, B), repetition_penalty=rng.uniform(1, 1.5, B), min_p=np.zeros(B),
        min_tokens=np.where(np.arange(B) % 2 == 0, 100, 0), prompt_len=np.full(B, 30),
        extended=np.arange(B) != 2)
    return (jnp.asarray(logits), jnp.asarray(inputs), jnp.asarray(q0), jnp.asarray(slots),
            jnp.asarray(packed), random_state(rng, V))


@pytest.mark.parametrize("V, ties, process, dtype", [(800, False, True, "float32"), (4096, False, True, "float32"),
                                                     (800, True, True, "float32"), (4096, True, False, "float32"),
                                                     (160, False, False, "float32"), (2048, False, True, "bfloat16")])
def test_statistics_equal_the_processed_logits(V, ties, process, dtype):
    """Argmax (the first among ties) and ties exactly; block maxima and log-sum-exp to fp32 rounding: of
    processors.apply's output (the raw logits without processors), over 5 to 64 tiles in up to 25 slices; bf16
    logits (as the lm_head's product comes out) read as such and processed in fp32."""
    logits, inputs, q0, slots, packed, state = batch(V, V, ties=ties)
    kernel_logits = logits.astype(dtype)
    logits = kernel_logits.astype(jnp.float32)
    p = processors.Params.unpack(packed)
    ban = processors.bans(inputs, q0, state, slots, p)
    assert (np.asarray(ban.words) >= 0).any() and not np.asarray(ban.keep)[2].any()
    if not process:
        state = ban = None
    got = jax.jit(greedy_pass.statistics, static_argnums=6)(kernel_logits, inputs, state, slots, p, ban, True)
    x = np.asarray(logits if state is None else processors.apply(logits, inputs, q0, state, slots, p))
    top = x.max(-1)
    np.testing.assert_array_equal(got.argmax, x.argmax(-1))
    np.testing.assert_array_equal(got.ties, (x == top[..., None]).sum(-1))
    # the penalties' arithmetic may round differently in another fusion (an fma or not): one ulp
    assert_close_scaled(got.block_max, x.reshape(*x.shape[:2], -1, processors.BLOCK).max(-1), rel=2 * FP32_EPS)
    lse = np.log(np.exp(x - top[..., None]).sum(-1)) + top
    assert_close_scaled(got.lse, lse, rel=8 * FP32_EPS, axis=None)  # sums over V in another order
    # the logprob max - lse carries lse's rounding, relative to lse's magnitude
    rel = 8 * FP32_EPS * np.abs(lse).max() / np.abs(top - lse).max()
    assert_close_scaled(got.token_logprob, top - lse, rel=rel, axis=None)


@pytest.mark.parametrize("V, num, process", [(800, 5, True), (2048, 20, True), (800, 0, True), (2048, 5, False)])
def test_sample_equals_the_xla_path(V, num, process):
    """greedy_pass.sample gives processors.sample's tokens, accept counts, ranks and top-N ids, and its logprobs to
    fp32 rounding, with the drafts' acceptance mixed (drafts set to the processed argmax on some rows)."""
    check_sample(V, num, process, interpret=True)


def check_sample(V: int, num: int, process: bool, interpret: bool) -> None:
    """test_sample_equals_the_xla_path's checks, the kernel interpreted or compiled (tests/test_gpu.py)."""
    logits, inputs, q0, slots, packed, state = batch(V + num, V)
    state = state if process else None
    x = logits if state is None else processors.apply(logits, inputs, q0, state, slots,
                                                      processors.Params.unpack(packed))
    target = jnp.argmax(x, -1).astype(jnp.int32)
    inputs = inputs.at[3, 1:].set(target[3, :-1]).at[0, 1].set(target[0, 0])  # all accepted; the first accepted
    num_valid = jnp.array([3, 3, 2, 3, 0])
    want = jax.jit(processors.sample, static_argnums=(7, 8, 9))(logits, inputs, num_valid, q0, state, slots, packed,
                                                                True, num, True)
    got = jax.jit(greedy_pass.sample, static_argnums=(7, 8))(logits, inputs, num_valid, q0, state, slots, packed,
                                                            num, interpret)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert np.asarray(want[1]).max() >= 2
    # compare where a token is emitted (elsewhere the XLA path scores token 0, this one the argmax)
    emitted = np.asarray(want[0]) >= 0
    g, w = np.asarray(got[2])[emitted], np.asarray(want[2])[emitted]
    f32 = lambda a: a.view(np.float32)  # noqa: E731
    np.testing.assert_array_equal(g[:, 1], w[:, 1])  # rank
    np.testing.assert_array_equal(g[:, 2 + num:], w[:, 2 + num:])  # top-N ids
    assert_close_scaled(f32(g[:, [0]]), f32(w[:, [0]]), rel=16 * FP32_EPS, axis=None)
    if num:
        assert_close_scaled(f32(g[:, 2:2 + num]), f32(w[:, 2:2 + num]), rel=16 * FP32_EPS, axis=None)
    else:
        assert g.shape[1] == w.shape[1] == 2


def test_kernel_lowers_to_triton_for_a_gpu():
    """The kernel lowers to Triton (the GPU path, not the interpreter) at SmolLM2's vocabulary, 96 rows x 4
    positions, with and without processors."""
    logits, inputs, q0, slots, packed, state = batch(0, 49152)
    p = processors.Params.unpack(packed)
    ban = processors.bans(inputs, q0, state, slots, p)
    for s, b in ((state, ban), (None, None)):
        text = jax.jit(lambda *a: greedy_pass.statistics(*a)).trace(  # noqa: B023
            logits, inputs, s, slots, p, b).lower(lowering_platforms=("cuda",)).as_text()
        assert re.findall(r'name = "(jaxspec_\w+)"', text) == ["jaxspec_greedy_pass"]


def test_kernel_compiles_to_gpu_machine_code(tmp_path, monkeypatch):
    """Past lowering: the kernel's Triton IR compiles to H200 (sm_90) machine code without register spills, with
    processors and without (tests/triton_ir.py)."""
    pytest.importorskip("triton")
    modules = triton_ir.capture_modules(monkeypatch)
    logits, inputs, q0, slots, packed, state = batch(0, 49152)
    p = processors.Params.unpack(packed)
    ban = processors.bans(inputs, q0, state, slots, p)
    for s, b in ((state, ban), (None, None)):
        jax.jit(lambda *a: greedy_pass.statistics(*a)).trace(logits, inputs, s, slots, p, b).lower(
            lowering_platforms=("cuda",))
    assert len(modules) == 2
    triton_ir.assert_compiles_without_spills(modules, tmp_path, monkeypatch, num_warps=4, num_stages=2)


def test_engine_runs_the_kernel_and_gives_the_xla_outputs(monkeypatch):
    """With the Pallas attention (interpreted) an all-greedy batch with a presence penalty and logprobs runs its
    decode steps through the kernel (traced), and the engine's tokens, logprobs and ranks equal the XLA path's
    (greedy_pass off), with a draft head (k = 2) and without."""
    traced = []
    statistics = greedy_pass.statistics
    monkeypatch.setattr(greedy_pass, "statistics", lambda *a, **kw: traced.append(1) or statistics(*a, **kw))
    w = tiny_weights(3)
    prompts = random_prompts(3, 4, 20, seed=5)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=3, presence_penalty=0.8)
    head = {"method": "eagle", "model": "dummy", "num_speculative_tokens": 2}
    for spec in (None, head):
        outs = {}
        for on in (True, False):
            llm = make_llm(w, attn_impl="pallas-interpret", max_num_seqs=4, speculative_config=spec,
                           load_format="dummy", kernel_config=KernelConfig(greedy_pass=on))
            outs[on] = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        assert traced, "the kernel did not run"
        traced.clear()
        for a, b in zip(outs[True], outs[False]):
            assert a.token_ids == b.token_ids
            for la, lb in zip(a.logprobs, b.logprobs):
                assert list(la) == list(lb)
                assert [x.rank for x in la.values()] == [x.rank for x in lb.values()]
                np.testing.assert_allclose([x.logprob for x in la.values()], [x.logprob for x in lb.values()],
                                           rtol=0, atol=32 * FP32_EPS * max(1.0, max(abs(x.logprob)
                                                                                     for x in lb.values())))
