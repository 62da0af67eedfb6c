"""Multi-step decoding (num_scheduler_steps): one dispatch runs several decode steps and stops each row on the
device at its EOS, stop ids or length limit. Outputs equal one step per dispatch (greedy and seeded, EAGLE-1,
EAGLE-3 and none, async and sync) with stops landing at every step and position of a block, and a row the device
stopped emits nothing in the block's later steps."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from jaxspec import SamplingParams
from jaxspec.bench.engine import decode_step_time, timing_rounds
from jaxspec.engine.sequence import Sequence
from tests.tiny import (CHARS, compiles, make_llm, random_prompts, read_before_reuse, tiny_weights, watch_reads,
                        write_char_tokenizer)

STEPS = 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory, trained_heads):
    """Prompts, the tiny model's greedy continuations of them, and as EOS the rarest of tokens 4-10 of request 8's
    (an EOS-rule request, which then stops at EOS there)."""
    weights = tiny_weights()
    prompts = trained_heads["eagle"].prompts[:8] + random_prompts(8, 2, 9, seed=3)
    free = make_llm(weights).generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                                      use_tqdm=False)
    outs = [list(o.outputs[0].token_ids) for o in free]
    freq = Counter(t for o in outs for t in o)
    eos = min(outs[8][3:10], key=freq.__getitem__)  # request 8 stops there; few others meet it
    tokenizer = write_char_tokenizer(tmp_path_factory.mktemp("chars"), eos_token_id=eos)
    return weights, tokenizer, prompts, outs


def params_for(sampling: str, outs: list[list[int]]) -> list[SamplingParams]:
    """Sixteen requests whose limits (1 to 23 tokens) end them at every step of a block and every position of a
    step; some stop at EOS, some at a stop id or a stop string their greedy text reaches, some ignore EOS; every
    third asks for logprobs."""
    params = []
    for i, out in enumerate(outs):
        kw = dict(temperature=0) if sampling == "greedy" else dict(temperature=0.9, top_p=0.95, seed=70 + i)
        at = 2 + i % 5
        rule = [{}, {"stop_token_ids": [out[at]]}, {"stop": [CHARS[out[at]] + CHARS[out[at + 1]]]},
                {"ignore_eos": True}][i % 4]
        params.append(SamplingParams(max_tokens=[1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 16, 17, 19, 21, 23][i], **rule,
                                     logprobs=2 if i % 3 == 0 else None, **kw))
    return params


def result(o) -> tuple:
    c = o.outputs[0]
    return tuple(c.token_ids), c.text, c.finish_reason, c.stop_reason, c.logprobs and list(c.logprobs)


@pytest.mark.parametrize("method,sampling,layer_loop", [(m, s, "scan") for m in (None, "eagle", "eagle3")
                                                      for s in ("greedy", "seeded")] + [("eagle", "seeded", "unroll")])
def test_multi_step_equals_single_steps(setup, trained_heads, method, sampling, layer_loop, monkeypatch):
    """With scanned layers (the CPU's default) the device loop is a loop; with unrolled ones (the GPU's) it is
    unrolled too (multi_decode_step)."""
    weights, tokenizer, prompts, outs = setup
    spec = None if method is None else {"method": method, "model": str(trained_heads[method].path),
                                        "num_speculative_tokens": 2}
    params = params_for(sampling, outs)
    # none waits: blocks at once; one bucket (fewer programs to compile: padding rows change no output)
    kw = dict(speculative_config=spec, max_num_seqs=16, decode_buckets=[16], layer_loop=layer_loop)
    single = make_llm(weights, tokenizer, **kw)
    multi = make_llm(weights, tokenizer, num_scheduler_steps=STEPS, **kw)
    blocks = []  # (the sequences' output lengths before, the block's count columns [M, B]) of each block
    commit = type(multi.llm_engine.scheduler).commit

    def recording(self, plan, prefill_out, decode_out, *logprobs):
        if plan.num_steps > 1:
            blocks.append(([len(s.output_token_ids) for s in plan.decode], plan.decode, decode_out[:, :, 0].copy()))
        return commit(self, plan, prefill_out, decode_out, *logprobs)

    monkeypatch.setattr(type(multi.llm_engine.scheduler), "commit", recording)
    for async_scheduling in (True, False):
        want = [result(o) for o in single.generate(prompts, params, use_tqdm=False,
                                                   async_scheduling=async_scheduling)]
        got = [result(o) for o in multi.generate(prompts, params, use_tqdm=False, async_scheduling=async_scheduling)]
        assert got == want
    reasons = {(r[2], type(r[3]).__name__) for r in want}
    assert ("length", "NoneType") in reasons
    if sampling == "greedy":  # the stop rules were picked from the greedy text: each one ends some request
        assert {("stop", "int"), ("stop", "str"), ("stop", "NoneType")} <= reasons
    metrics = multi.get_metrics()
    assert metrics["num_dispatches"] < metrics["num_steps"] and blocks
    stopped_at = set()
    for before, seqs, counts in blocks:
        for i, seq in enumerate(seqs):
            # a row that had ended before the block (the plan was made before its end was read) may run it; one
            # that ends inside the block by a rule the device checks runs none of its later steps
            n, final = before[i], len(seq.output_token_ids)
            if n >= final or not _device_stoppable(seq):
                continue
            ends = [m for m in range(STEPS) if n + counts[:m + 1, i].sum() >= final]
            if ends:
                stopped_at.add(ends[0])
                assert not counts[ends[0] + 1:, i].any(), (counts[:, i], seq.finish_reason, seq.stop_reason)
    assert stopped_at == set(range(STEPS))  # rows stopped in every step of a block


def _device_stoppable(seq: Sequence) -> bool:
    """Finished by a rule the device checks (EOS, a stop id, the length limit), not by a stop string."""
    return seq.finish_reason == "length" or (seq.finish_reason == "stop" and not isinstance(seq.stop_reason, str))


def test_multi_step_waits_for_nothing(setup):
    """A request that arrives while a block runs gets its prefill in the next dispatch: blocks are single steps
    while anything waits or prefills, so it starts as soon as it would without them."""
    weights, tokenizer, prompts, _ = setup
    llm = make_llm(weights, tokenizer, num_scheduler_steps=STEPS)
    engine = llm.llm_engine
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    final = {}

    def step():
        final.update({o.request_id: list(o.outputs[0].token_ids) for o in engine.step() if o.finished})

    engine.add_request("a", prompts[0], greedy)
    step()
    step()
    assert engine.in_flight and engine.in_flight[-1].plan.num_steps == STEPS  # steady: a block
    engine.add_request("b", prompts[1], greedy)
    step()
    plan = engine.in_flight[-1].plan
    assert plan.num_steps == 1 and [c.seq.request_id for c in plan.prefill] == ["b"]
    while engine.has_unfinished_requests():
        step()
    solo = make_llm(weights, tokenizer).generate(prompts[:2], greedy, use_tqdm=False)
    assert [final["a"], final["b"]] == [list(o.outputs[0].token_ids) for o in solo]


def test_warmup_compiles_the_multi_step_programs(setup):
    """With num_scheduler_steps > 1, warm-up compiles each decode program in its multi-step form too: generating
    (blocks and single steps) compiles nothing."""
    weights, tokenizer, prompts, _ = setup
    llm = make_llm(weights, tokenizer, num_scheduler_steps=STEPS, warmup=True, max_num_seqs=4, decode_buckets=[4],
                   prefill_buckets=[64])
    with compiles() as compiled:
        llm.generate(prompts[:6], [SamplingParams(temperature=[0, 0.8][i % 2], seed=i, max_tokens=9 + i)
                                   for i in range(6)], use_tqdm=False)
    assert compiled == [] and llm.get_metrics()["num_dispatches"] < llm.get_metrics()["num_steps"]


def test_step_timing_counts_steps_not_dispatches(setup):
    """bench's decode_step_time with multi-step dispatches runs about as many steps as with single ones, so the
    rows reach the same contexts and the per-step times compare (every row grows by one token a step here)."""
    weights, *_ = setup
    context, run = 16, {}
    for m in (1, STEPS):
        runner = make_llm(weights, num_scheduler_steps=m).llm_engine.runner
        timing = decode_step_time(runner, 2, context, iters=6, multi=m > 1)
        run[m] = timing.num_steps * m, int(np.asarray(runner.state.seq_len)[0]) - context
    assert run[1] == (15, 15)  # 3 warm-up, 6 timed, 6 read one at a time
    assert run[STEPS][0] == run[STEPS][1] and 0 <= run[STEPS][0] - run[1][0] < 3 * STEPS


def test_step_timing_reads_each_output_before_its_buffer_comes_back(setup):
    """decode_step_time reads every dispatch's output, and back to back reads each one before the dispatch two
    later (which, with twin buffers, writes over it) is made, as the async engine does."""
    weights, *_ = setup
    runner = make_llm(weights, num_scheduler_steps=STEPS).llm_engine.runner
    events = watch_reads(runner, "decode")
    for multi in (False, True):
        events.clear()
        timing = decode_step_time(runner, 2, 16, iters=6, multi=multi)
        assert sum(kind == "dispatch" for kind, _ in events) == timing.num_steps and read_before_reuse(events)


def test_step_timing_warms_up_both_twin_executables():
    """Each program's twin executables compile at their first calls, so decode_step_time warms up with at least two
    dispatches whatever their steps (a 4-step run's single warm-up dispatch left a compile in the timed round)."""
    for m in (1, 2, STEPS, 8):
        warmup, timed, blocking = timing_rounds(32, m)
        assert warmup >= 2 and timed * m >= 32 > (timed - 1) * m and blocking * m >= 10


def test_multi_step_under_tensor_parallelism(setup):
    """Split over 2 (CPU) devices, the multi-step program keeps the shardings its steps pin: the same outputs as one
    step per dispatch there."""
    weights, _, prompts, _ = setup
    params = [SamplingParams(temperature=0, max_tokens=3 + 2 * i, ignore_eos=True) for i in range(6)]
    want = make_llm(weights, tensor_parallel_size=2).generate(prompts[:6], params, use_tqdm=False)
    llm = make_llm(weights, tensor_parallel_size=2, num_scheduler_steps=STEPS)
    got = llm.generate(prompts[:6], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert llm.get_metrics()["num_dispatches"] < llm.get_metrics()["num_steps"]
