"""The engine with plain decoding (k = 0) against a full-sequence greedy loop, and its scheduling guarantees."""

from __future__ import annotations

import numpy as np
import pytest

from jaxspec import SamplingParams
from jaxspec.models.kernel_config import KernelConfig
from tests.numerics import FP32_EPS, assert_close_scaled
from tests.tiny import (CHARS, TINY, compiles, greedy_reference, make_llm, random_prompts, tiny_weights,
                        write_char_tokenizer)

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def weights():
    return tiny_weights()


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(16, 1, 60, seed=1)


@pytest.fixture(scope="module")
def reference(weights, prompts):
    return [greedy_reference(weights, TINY, p, GREEDY.max_tokens) for p in prompts]


@pytest.mark.parametrize("mode", ["async", "sync", "chunked", "preempt"])
def test_greedy_equals_full_sequence_loop(weights, prompts, reference, mode):
    kw = {"async_scheduling": mode != "sync"}
    if mode == "chunked":
        kw |= {"max_num_batched_tokens": 16, "max_prefill_seqs": 2}  # prompts up to 60 tokens: 4+ chunks
    if mode == "preempt":
        kw |= {"num_pages": 20}  # 16 pages hold one 128-token sequence; 8 slots cannot all fit
    llm = make_llm(weights, **kw)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    if mode == "preempt":
        assert llm.get_metrics()["num_preemptions"] > 0
    assert llm.llm_engine.block_manager.num_free == llm.engine_config.num_pages


def test_padding_rows_stay_one_token_long(weights, prompts, reference):
    """Padding rows (a batch smaller than its bucket) take their length from the spare slot: it stays 1 through
    decode and chunked prefill, so what they attend over never grows with the engine's age."""
    llm = make_llm(weights, decode_buckets=[8], max_num_batched_tokens=16, max_prefill_seqs=2)
    for _ in range(2):  # 3 rows in a bucket of 8: 5 padding rows in every decode step, 40 steps
        outs = llm.generate(prompts[:3], GREEDY, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == reference[:3]
    assert int(llm.llm_engine.runner.state.seq_len[llm.engine_config.max_num_seqs]) == 1


def test_seeded_sampling_is_independent_of_mode_and_batch(weights, prompts):
    params = [SamplingParams(temperature=1.0, top_k=[0, 20][i % 2], top_p=[1.0, 0.8][i // 2 % 2], seed=100 + i,
                             max_tokens=12, ignore_eos=True) for i in range(len(prompts))]
    runs = {}
    for mode in (True, False):
        llm = make_llm(weights, async_scheduling=mode)
        runs[mode] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert runs[True] == runs[False]
    alone = make_llm(weights).generate(prompts[3], params[3], use_tqdm=False)[0].outputs[0].token_ids
    assert alone == runs[True][3]
    assert len({tuple(r) for r in runs[True]}) > 1  # really random: different seeds give different outputs


@pytest.fixture(scope="module")
def char_model(tmp_path_factory, weights, prompts):
    """A model dir with the character tokenizer; returns (path, greedy tokens of prompt 0 without stops)."""
    path = write_char_tokenizer(tmp_path_factory.mktemp("charmodel"))
    llm = make_llm(weights, path)
    ref = llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0].token_ids
    return path, ref


def _first_repeat_free_index(ref: list[int], start: int) -> int:
    """An index j >= start whose token does not occur before it (so it is the first stop there)."""
    return next(j for j in range(start, len(ref)) if ref[j] not in ref[:j])


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_stop_rules_truncate_exactly(weights, prompts, char_model, async_scheduling):
    path, ref = char_model
    llm = make_llm(weights, path, async_scheduling=async_scheduling)
    run = lambda p: llm.generate([prompts[0]], p, use_tqdm=False)[0].outputs[0]  # noqa: E731

    text = "".join(CHARS[t] for t in ref)
    out = run(SamplingParams(temperature=0, max_tokens=7, ignore_eos=True))
    assert out.token_ids == ref[:7] and out.finish_reason == "length" and out.text == text[:7]

    j = _first_repeat_free_index(ref, 5)
    out = run(SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[ref[j]]))
    assert out.token_ids == ref[:j + 1] and out.finish_reason == "stop" and out.stop_reason == ref[j]
    assert out.text == text[:j + 1]

    # a two-character stop string whose characters come from consecutive tokens, i.e. from two steps
    a = 10
    stop = text[a:a + 2]
    first = text.find(stop)
    out = run(SamplingParams(temperature=0, max_tokens=40, stop=[stop]))
    assert out.text == text[:first] and out.finish_reason == "stop" and out.stop_reason == stop
    assert out.token_ids == ref[:first + 2]


def test_eos_stops_exactly(weights, prompts, char_model, tmp_path):
    _, ref = char_model
    j = _first_repeat_free_index(ref, 4)
    llm = make_llm(weights, write_char_tokenizer(tmp_path / "eos", eos_token_id=ref[j]))
    out = llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=40), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == ref[:j + 1] and out.finish_reason == "stop"
    out = llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids == ref[:40]


def test_two_thousand_requests_complete_and_free_every_page(weights):
    llm = make_llm(weights, max_num_seqs=32, num_pages=160, max_num_batched_tokens=64)
    rng = np.random.default_rng(7)
    prompts = random_prompts(2000, 1, 12, seed=3)
    params = [SamplingParams(temperature=0, max_tokens=int(rng.integers(1, 9)), ignore_eos=True) for _ in prompts]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert len(outs) == 2000
    assert [len(o.outputs[0].token_ids) for o in outs] == [p.max_tokens for p in params]
    assert [o.prompt_token_ids for o in outs] == prompts
    assert llm.llm_engine.block_manager.num_free == llm.engine_config.num_pages
    assert sorted(llm.llm_engine.scheduler.free_slots) == list(range(32))
    assert not llm.llm_engine.scheduler.has_unfinished()


def test_no_compilation_during_generation(weights, prompts):
    """Warm-up compiles exactly the programs generation runs, with either GEMM backend (step.program): here
    decode buckets below 4 tokens keep XLA's GEMMs and the rest use cuBLAS. Every sampling option is used, in
    batches that mix them: greedy, random, top-k/top-p, processors, logprobs, prompt logprobs, n > 1; and
    a greedy batch with processors and logprobs."""
    from jaxspec.engine import step

    stable = KernelConfig().stable_scratch
    programs = lambda cublas: sum(step.compiled(s, cublas, stable, 0)._cache_size()  # noqa: E731
                                  for s in (step.decode_step, step.prefill_step))
    before = {cublas: programs(cublas) for cublas in (False, True)}
    llm = make_llm(weights, warmup=True, max_num_seqs=4, max_num_batched_tokens=32, decode_buckets=[2, 4],
                   prefill_buckets=[32], kernel_config=KernelConfig(cublas_min_tokens=4))
    assert llm.engine_config.decode_buckets[0] < 4 <= llm.engine_config.decode_buckets[-1]
    assert all(programs(cublas) > before[cublas] for cublas in (False, True))
    options = [{}, dict(logprobs=2), dict(presence_penalty=0.5, min_p=0.1, logit_bias={3: 2.0}),  # dense admission
               dict(prompt_logprobs=1, top_k=5),
               dict(n=2, repetition_penalty=1.2, top_p=0.9)]
    with compiles() as compiled:
        params = [SamplingParams(temperature=[0, 0.8][i % 2], top_p=[1.0, 0.9][i // 2 % 2], seed=i, max_tokens=9)
                  for i in range(len(prompts))]
        llm.generate(prompts, params, use_tqdm=False)
        params = [SamplingParams(**{"temperature": [0, 0.8][i % 2] if "n" not in o else 0.8, "seed": i,
                                    "max_tokens": 6, **o}) for i, o in enumerate(options * 2)]
        llm.generate(prompts[:len(params)], params, use_tqdm=False)
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, logprobs=1, presence_penalty=0.5),
                     use_tqdm=False)  # all greedy, extended
        for t in (0, 0.8):  # logprobs alone: the extended step without processors
            llm.generate(prompts, SamplingParams(temperature=t, max_tokens=6, logprobs=1, seed=3), use_tqdm=False)
    assert compiled == []
    # 9 decode and 5 prefill variants per bucket (model_runner.ALL_KINDS), the two admission programs (dense and
    # sparse rows) and the page copy
    cfg = llm.engine_config
    assert llm.num_compiled == 9 * len(cfg.decode_buckets) + 5 * len(cfg.prefill_buckets) + 3


def test_programs_compiled_side_by_side_are_the_ones_the_calls_run(prompts):
    """compile_all traces each program with its call's arguments and compiles them on threads: the calls that
    follow compile nothing (a program it was not given still compiles on its first call), and generation
    matches an engine that compiled each program on first use."""
    from jaxspec.engine.step import decode_step

    # a random model and head (the same seed: the same weights for both LLMs) at synthetic acceptance
    args = dict(load_format="dummy", max_num_seqs=4, decode_buckets=[2, 4], prefill_buckets=[64],
                speculative_config={"method": "eagle", "model": "-", "num_speculative_tokens": 2},
                synthetic_acceptance=0.5)
    llm = make_llm(None, **args)
    runner = llm.llm_engine.runner
    greedy = (True, False, False, False, False, False)  # model_runner.BatchKind
    jobs = [(decode_step, B, runner._specs[(k, greedy)], runner._idle_decode(B)) for B in (2, 4) for k in (0, 2)]
    logged = []
    runner.compile_all(jobs, log=logged.append)
    assert len(logged) == 4 and all("side by side" in line for line in logged)
    with compiles() as compiled:
        for step, B, spec, plan in jobs:
            runner._run(step, B, spec, *plan)
    assert compiled == []
    with compiles() as compiled:  # control: k = 1 was not among the jobs
        runner._run(decode_step, 2, runner._specs[(1, greedy)], *runner._idle_decode(2))
    assert compiled
    runner.compile_all(jobs, log=logged.append)  # called already: nothing to do
    assert len(logged) == 4
    plain = make_llm(None, **args)
    outs = [[o.outputs[0].token_ids for o in m.generate(prompts[:4], GREEDY, use_tqdm=False)] for m in (llm, plain)]
    assert outs[0] == outs[1]


def test_async_dispatches_next_step_before_reading_previous(weights, prompts):
    llm = make_llm(weights)
    llm.llm_engine.trace = []
    llm.generate(prompts[:4], GREEDY, use_tqdm=False)
    trace = llm.llm_engine.trace
    for event, step in trace:
        if event == "fetch":
            later = [s for e, s in trace[:trace.index((event, step))] if e == "dispatch"]
            assert step + 1 in later or step == max(s for e, s in trace if e == "dispatch")
    sync = make_llm(weights, async_scheduling=False)
    sync.llm_engine.trace = []
    sync.generate(prompts[:4], GREEDY, use_tqdm=False)
    assert sync.llm_engine.trace == [(e, s) for s in range(len(sync.llm_engine.trace) // 2) for e in ("dispatch", "fetch")]


def test_sync_runs_the_same_steps_as_async(weights, prompts):
    """Sync only moves each read before the next dispatch: same plans and padded batches, so outputs are identical
    however rounding depends on the batch size. Requests finish at different steps, so async runs finished requests
    once more; sync must too."""
    params = [SamplingParams(temperature=0, max_tokens=3 + 2 * i, ignore_eos=True) for i in range(len(prompts))]
    steps, outs = {}, {}
    for mode in (True, False):
        llm = make_llm(weights, async_scheduling=mode, decode_buckets=[2, 4, 8])
        steps[mode] = []
        decode = llm.llm_engine.runner.decode

        def record(slots, tables, k, stops, decode=decode, log=steps[mode]):
            log.append((list(slots), tables[slots].tolist(), k, stops))
            return decode(slots, tables, k, stops)

        llm.llm_engine.runner.decode = record
        outs[mode] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert llm.llm_engine.block_manager.num_free == llm.engine_config.num_pages
    assert steps[True] == steps[False]
    assert len({len(ids) for ids, _, _, _ in steps[True]}) > 2  # the batch shrank through several buckets
    assert outs[True] == outs[False]
    assert [len(o) for o in outs[True]] == [p.max_tokens for p in params]


@pytest.mark.parametrize("bad, message", [
    (dict(prompt=list(range(128))), "max_model_len"),
    (dict(params=dict(max_tokens=0)), "max_tokens"),
    (dict(params=dict(temperature=-1.0)), "temperature"),
    (dict(params=dict(top_p=0.0)), "top_p"),
    (dict(params=dict(top_p=1.5)), "top_p"),
    (dict(prompt=[]), "empty"),
    (dict(prompt=[5, 500]), "vocabulary"),
    (dict(prompt=[5, 6.5]), "integers"),
    (dict(prompt=[[5, 6], [7, 8]]), "flat"),
    (dict(prompt=[[5, 6], [7]]), "flat"),
])
def test_bad_input_is_rejected_before_anything_runs(weights, prompts, reference, bad, message):
    """A bad prompt, or params made bad after construction (which checks them too), is rejected at admission,
    naming the request, before any request of the batch runs."""
    llm = make_llm(weights)
    bad_params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    for name, value in bad.get("params", {}).items():
        with pytest.raises(ValueError, match=name):
            SamplingParams(**{name: value})
        setattr(bad_params, name, value)
    batch = [prompts[0], bad.get("prompt", prompts[1]), prompts[2]]
    with pytest.raises(ValueError, match=message) as err:
        llm.generate(batch, [GREEDY, bad_params, GREEDY], use_tqdm=False)
    assert "request 1" in str(err.value)
    assert not llm.llm_engine.scheduler.has_unfinished()
    outs = llm.generate([prompts[0], prompts[2]], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [reference[0], reference[2]]


def test_pallas_kernel_equals_xla_reference(weights, prompts, reference):
    llm = make_llm(weights, attn_impl="pallas-interpret", max_num_seqs=4)
    outs = llm.generate(prompts[:4], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference[:4]


def test_pallas_kernel_packs_any_queries_per_sequence():
    """T = 5 queries x 4 heads per KV head = 20 rows (padded to 32), at scattered positions (not a contiguous
    run), two table partitions, and a padding query at position 0: each row sees exactly its own prefix."""
    import jax.numpy as jnp

    from jaxspec.models import attention as attn

    rng = np.random.default_rng(7)
    B, T, pages, page_size, kvh, heads, D = 3, 5, 16, 4, 2, 8, 16
    k = jnp.asarray(rng.standard_normal((kvh, 2, B * pages, page_size, D)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((kvh, 2, B * pages, page_size, D)), jnp.float32)
    tables = jnp.asarray(rng.permutation(B * pages).reshape(B, pages), jnp.int32)
    q_pos = rng.integers(0, pages * page_size, (B, T))
    q_pos[2, 4] = 0
    q_pos = jnp.asarray(q_pos, jnp.int32)
    q = jnp.asarray(rng.standard_normal((B, T, heads, D)), jnp.float32)
    batch = attn.AttnBatch(tables, jnp.zeros((B, T), jnp.int32))
    ref = attn.paged_attention_xla(q, attn.KVCache(k, v), 1, batch, q_pos)
    k_pages, offset = attn.layer_pages(k, 1)
    v_pages, _ = attn.layer_pages(v, 1)
    out = attn.paged_kernel.paged_attention(q / np.sqrt(D), k_pages, v_pages, tables + offset, q_pos,
                                            pages_per_block=4, splits=2, interpret=True)
    # softmax-weighted sums of up to 64 cached values (all of the same N(0, 1) scale: the whole tensor's maximum
    # stands for it), in fp32, split and merged otherwise
    assert_close_scaled(out, ref, pages * page_size * FP32_EPS, axis=None)


@pytest.mark.parametrize("rows, splits", [(1, 8), (2, 4), (3, 2), (8, 1)])
def test_pallas_table_splits_equal_xla(rows, splits):
    """Every number of table partitions the kernel may be given (fewer as rows grow) gives the reference's
    attention: the partial softmaxes of the splits merge exactly."""
    import jax.numpy as jnp

    from jaxspec.models import attention as attn

    kernel = KernelConfig(attn_programs=16)  # small enough that a few rows reach every split count
    rng = np.random.default_rng(rows)
    T, pages, page_size, num_pages, kvh, heads, D = 2, 64, 2, 160, 2, 4, 16
    assert attn.pallas_splits(rows, kvh, pages // 8, kernel.attn_programs) == splits  # a program serves all T queries of a sequence
    k = jnp.asarray(rng.standard_normal((kvh, 3, num_pages, page_size, D)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((kvh, 3, num_pages, page_size, D)), jnp.float32)
    tables = jnp.asarray(rng.permutation(num_pages)[:rows * pages].reshape(rows, pages) if rows * pages <= num_pages
                         else rng.integers(0, num_pages, (rows, pages)), jnp.int32)
    lengths = rng.integers(T, pages * page_size - T, rows)
    q_pos = jnp.asarray(lengths[:, None] + np.arange(T), jnp.int32)
    q = jnp.asarray(rng.standard_normal((rows, T, heads, D)), jnp.float32)
    batch = attn.AttnBatch(tables, jnp.zeros((rows, T), jnp.int32))
    ref = attn.paged_attention_xla(q, attn.KVCache(k, v), 1, batch, q_pos)
    out = attn.paged_attention_pallas(q, attn.KVCache(k, v), 1, batch, q_pos, interpret=True, kernel=kernel)
    # as above: fp32 sums over up to 128 cached positions, of one scale, in other orders
    assert_close_scaled(out, ref, pages * page_size * FP32_EPS, axis=None)


def test_kernel_settings_are_part_of_the_jit_key(weights, prompts, monkeypatch):
    """A changed kernel setting compiles anew (it is in the static config), and JAXSPEC_* set the defaults when an
    LLM is built, not at import."""
    monkeypatch.setenv("JAXSPEC_ATTN_PROGRAMS", "64")
    monkeypatch.setenv("JAXSPEC_CUBLAS_MIN_TOKENS", "2")
    llm = make_llm(weights)
    assert llm.model_config.kernel == KernelConfig(attn_programs=64, cublas_min_tokens=2)
    other = make_llm(weights, kernel_config=KernelConfig(attn_programs=32))
    assert hash(other.model_config) != hash(llm.model_config) and other.model_config != llm.model_config
    monkeypatch.setenv("JAXSPEC_ATTN_PROGRAMS", "x")
    with pytest.raises(ValueError, match="JAXSPEC_ATTN_PROGRAMS"):
        make_llm(weights)


def test_flag_settings_parse_as_booleans(weights, monkeypatch):
    """KernelConfig's flags take 0 or 1 from JAXSPEC_* and only booleans as values."""
    monkeypatch.setenv("JAXSPEC_RESIDENT_PLAN", "0")
    assert KernelConfig.from_env() == KernelConfig(resident_plan=False)
    monkeypatch.setenv("JAXSPEC_RESIDENT_PLAN", "2")
    with pytest.raises(ValueError, match="JAXSPEC_RESIDENT_PLAN"):
        KernelConfig.from_env()
    with pytest.raises(ValueError, match="stable_scratch"):
        KernelConfig(stable_scratch=1)


def test_twin_programs_keep_their_output_buffers_and_change_no_output(weights, prompts, reference):
    """KernelConfig.twin_programs (forced on here; a GPU's default): each program's calls alternate between two
    jit objects, each writing over an output buffer it keeps (one address from call to call, so that XLA never
    re-records its CUDA graph), read by the host before it is written again; greedy tokens and logprobs equal an
    engine that alternates only the buffers (what runs where there are no CUDA graphs)."""
    from jaxspec.engine.step import decode_step

    logprobs = SamplingParams(temperature=0, max_tokens=GREEDY.max_tokens, ignore_eos=True, logprobs=3)
    # (no prefix cache: only llms[0] ran the prompts before, and cached KV rounds differently in the last bits)
    llms = [make_llm(weights, decode_buckets=[4, 8], enable_prefix_caching=False) for _ in range(2)]
    runner = llms[0].llm_engine.runner
    runner._twins = True
    assert not llms[1].llm_engine.runner._twins  # the CPU default
    outs = llms[0].generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference
    twins = {key[-1] for key in runner._outputs if key[0] == "decode_step"}
    assert twins == {0, 1} and {key[-1] for key in runner._called if key[0] == "decode_step"} == {0, 1}
    spec = runner._specs[(0, (True, False, False, False, False, False))]
    assert runner._program(decode_step, 8, spec, 0) is not runner._program(decode_step, 8, spec, 1)
    addresses = {key: out.unsafe_buffer_pointer() for key, out in runner._outputs.items()}
    got, want = (m.generate(prompts[:6], logprobs, use_tqdm=False) for m in llms)  # logprob rows: host copies
    assert [o.outputs[0].token_ids for o in got] == reference[:6]
    assert [o.outputs[0].logprobs for o in got] == [o.outputs[0].logprobs for o in want]
    after = {key: out.unsafe_buffer_pointer() for key, out in runner._outputs.items()}
    assert {key: after[key] for key in addresses if key in after} == {k: a for k, a in addresses.items() if k in after}


def test_resident_plan_keeps_its_addresses_and_changes_no_output(weights, prompts, reference):
    """The plan arrays are written into one set of device buffers per (step, bucket) (KernelConfig.resident_plan):
    their addresses stay the same from dispatch to dispatch, and outputs equal those of fresh arrays per step."""
    llm = make_llm(weights, decode_buckets=[4, 8])
    runner = llm.llm_engine.runner
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert {name for name, _ in runner._plans} == {"decode_step", "prefill_step"}
    addresses = {key: [a.unsafe_buffer_pointer() for a in plan] for key, (plan, _) in runner._plans.items()}
    outs = llm.generate(prompts[:5], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference[:5]
    after = {key: [a.unsafe_buffer_pointer() for a in plan] for key, (plan, _) in runner._plans.items()}
    assert {key: after[key] for key in addresses} == addresses
    fresh = make_llm(weights, decode_buckets=[4, 8], kernel_config=KernelConfig(resident_plan=False))
    assert [o.outputs[0].token_ids for o in fresh.generate(prompts, GREEDY, use_tqdm=False)] == reference
    assert fresh.llm_engine.runner._plans == {}


def _watch_plans(llm, monkeypatch) -> tuple[list, list]:
    """From here on, every plan the runner places, ((step name, bucket), copies of its arrays), and the indices in
    that list of the ones it wrote to the device (a call of plan_program)."""
    import jaxspec.engine.model_runner as model_runner

    runner = llm.llm_engine.runner
    placed, written = [], []
    place, write = runner._place, model_runner.plan_program

    def counting_place(step, size, plan):
        placed.append(((step.__name__, size), tuple(np.array(a) for a in plan)))
        return place(step, size, plan)

    def counting_write(buffers, plan):
        written.append(len(placed) - 1)
        return write(buffers, plan)

    monkeypatch.setattr(runner, "_place", counting_place)
    monkeypatch.setattr(model_runner, "plan_program", counting_write)
    return placed, written


def test_resident_plan_is_written_only_when_it_changes(weights, prompts, reference, monkeypatch):
    """A plan equal to the one its buffers hold is not written again (one dispatch less a step): over generates
    of 16 prompts and of one, the buffers are written exactly at the dispatches whose plan differs from the one
    their (step, bucket) holds, most of the one prompt's decode steps write nothing, and outputs stay the
    reference's."""
    from jaxspec.engine.model_runner import _equal

    llm = make_llm(weights, decode_buckets=[1, 4, 8])
    held = {key: plan for key, (_, plan) in llm.llm_engine.runner._plans.items()}
    placed, written = _watch_plans(llm, monkeypatch)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference
    start = len(placed)
    outs = llm.generate(prompts[:1], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference[:1]
    want = []
    for i, (key, plan) in enumerate(placed):
        if key not in held or not _equal(held[key], plan):
            want.append(i)
        held[key] = plan
    assert written == want
    single = [i for i in range(start, len(placed)) if placed[i][0] == ("decode_step", 1)]
    assert len(single) >= GREEDY.max_tokens - 2 and len(set(single) & set(written)) <= len(single) // 2


def test_page_lookahead_changes_tables_rarely_and_no_output(weights, prompts, monkeypatch):
    """When one decoding sequence needs a page, every one gets pages for page_lookahead more positions: 8 prompts
    decoding 60 tokens each in 8 slots write their decode plan at a third of the steps or less against most steps
    with pages as needed (0), the outputs are the full-sequence loop's in both, and every page taken ahead goes back
    to the pool."""
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    want = [greedy_reference(weights, TINY, p, params.max_tokens) for p in prompts[:8]]
    writes = {}
    for ahead in (0, 32):
        llm = make_llm(weights, page_lookahead=ahead, num_pages=400)  # pages to spare
        placed, written = _watch_plans(llm, monkeypatch)
        outs = llm.generate(prompts[:8], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == want
        assert llm.llm_engine.block_manager.num_free == llm.engine_config.num_pages
        decode = sum(placed[i][0][0] == "decode_step" for i in written)
        writes[ahead] = decode / llm.stats()["num_steps"]
    assert writes[32] <= 1 / 3 < writes[0], writes


def test_page_lookahead_takes_nothing_from_a_tight_pool(weights, prompts, reference, monkeypatch):
    """Pages go ahead only while the free ones cover another round of lookahead for every decoding sequence: in a
    pool that cannot (20 pages of 8 tokens for 8 slots), the engine schedules exactly as with pages as needed, the
    same preemptions and plan writes, and the outputs are the reference's."""
    runs = []
    for ahead in (0, 64):
        llm = make_llm(weights, num_pages=20, page_lookahead=ahead)
        _, written = _watch_plans(llm, monkeypatch)
        outs = llm.generate(prompts, GREEDY, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == reference
        runs.append((llm.get_metrics()["num_preemptions"], len(written)))
    assert runs[0] == runs[1] and runs[0][0] > 0


def test_whole_length_pages_keep_the_plan_unchanged(weights, prompts, monkeypatch):
    """With pages to spare, a decoding sequence that needs a page gets pages for its whole length at once
    (page_reserve_whole), as its prompt's last chunk is planned: one prompt decoding 60 tokens writes its decode
    plan once, against four or more
    with rounds of page_lookahead (8) positions only; the outputs are the full-sequence loop's in both, and
    every page goes back to the pool."""
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    want = [greedy_reference(weights, TINY, prompts[0], params.max_tokens)]
    writes = {}
    for whole in (True, False):
        llm = make_llm(weights, page_lookahead=8, page_reserve_whole=whole)
        placed, written = _watch_plans(llm, monkeypatch)
        outs = llm.generate(prompts[:1], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == want
        assert llm.llm_engine.block_manager.num_free == llm.engine_config.num_pages
        writes[whole] = sum(placed[i][0][0] == "decode_step" for i in written)
    assert writes[True] == 1 and writes[False] >= 4, writes


def test_whole_length_pages_go_back_when_a_request_needs_them(weights):
    """Pages a sequence took for its whole length go back once a new request needs them: A (10 prompt tokens, 100 to
    generate) holds the 15 pages of its 110 tokens and 8 of lookahead in a pool of 40 (8 tokens each); B and C
    (100-token prompts, 13 pages each, 26 against 25 free) then both start at the next step, without a preemption,
    and every output equals the full-sequence loop's."""
    llm = make_llm(weights, num_pages=40, page_lookahead=8, max_num_batched_tokens=256, max_prefill_seqs=2)
    engine = llm.llm_engine
    prompts = random_prompts(1, 10, 10, seed=7) + random_prompts(2, 100, 100, seed=8)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (100, 8, 8)]
    final = {}

    def step():
        for out in engine.step():
            final[out.request_id] = out

    engine.add_request("a", prompts[0], params[0])
    a = engine.requests["a"]
    while len(a.output_token_ids) < 10:  # past its first two pages
        step()
    assert len(a.pages) == 15
    engine.add_request("b", prompts[1], params[1])
    engine.add_request("c", prompts[2], params[2])
    step()
    assert engine.requests["b"].num_prefilled == engine.requests["c"].num_prefilled == 100
    assert len(a.pages) < 15
    while engine.has_unfinished_requests():
        step()
    assert llm.get_metrics()["num_preemptions"] == 0
    for rid, prompt, p in zip("abc", prompts, params):
        assert list(final[rid].outputs[0].token_ids) == greedy_reference(weights, TINY, prompt, p.max_tokens)
    assert engine.block_manager.num_free == llm.engine_config.num_pages


def test_whole_length_pages_go_back_before_a_preemption(weights):
    """Pages a sequence took for its whole length go back when a decoding sequence needs them: A holds 15 pages of a
    pool of 24; B (40 prompt tokens, 60 to generate: 13 pages) outgrows the 4 left while A decodes, and takes A's
    spare pages rather than preempting anyone; both outputs equal the full-sequence loop's."""
    llm = make_llm(weights, num_pages=24, page_lookahead=8)
    engine = llm.llm_engine
    prompts = random_prompts(1, 10, 10, seed=7) + random_prompts(1, 40, 40, seed=9)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (100, 60)]
    final, held = {}, []

    def step():
        for out in engine.step():
            final[out.request_id] = out
        if not a.is_finished:
            held.append(len(a.pages))

    engine.add_request("a", prompts[0], params[0])
    a = engine.requests["a"]
    while not a.decoding:
        step()
    assert len(a.pages) == 15
    engine.add_request("b", prompts[1], params[1])
    while engine.has_unfinished_requests():
        step()
    assert llm.get_metrics()["num_preemptions"] == 0 and min(held) < 15
    for rid, prompt, p in zip("ab", prompts, params):
        assert list(final[rid].outputs[0].token_ids) == greedy_reference(weights, TINY, prompt, p.max_tokens)
    assert engine.block_manager.num_free == llm.engine_config.num_pages


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_appending_a_steps_tokens_at_once_equals_one_by_one(ignore_eos):
    """OutputProcessor.append_tokens takes a step's tokens in one go when no stop rule can fire among them: for
    random steps around stop ids, EOS, max_tokens and max_model_len, the tokens kept, the finish reason and the
    stop reason equal those of the token-by-token rules (`_append`)."""
    from jaxspec.engine.output_processor import OutputProcessor
    from jaxspec.engine.sequence import Sequence

    rng = np.random.default_rng(3)
    processor = OutputProcessor(None, {2, 3}, max_model_len=60)
    for trial in range(400):
        params = SamplingParams(max_tokens=int(rng.integers(1, 50)), ignore_eos=ignore_eos,
                                stop_token_ids=[[], [7], [7, 9]][int(rng.integers(3))])
        prompt = [1] * int(rng.integers(1, 30))
        fast, slow = (Sequence(str(trial), prompt, params, 0) for _ in range(2))
        while not fast.is_finished:
            tokens = rng.integers(2, 40, int(rng.integers(1, 5))).tolist()
            processor.append_tokens(fast, tokens)
            processor._append(slow, tokens)
            assert (fast.output_token_ids, fast.status, fast.finish_reason, fast.stop_reason) == \
                (slow.output_token_ids, slow.status, slow.finish_reason, slow.stop_reason), trial
