"""vLLM's AsyncLLMEngine: concurrent async generators give what LLM.generate gives, under each output_kind; a
generator closed early and `abort` both end their request and free its pages; a bad request raises its ValueError
and leaves the others running."""

from __future__ import annotations

import asyncio

import pytest

from jaxspec import LLM, AsyncEngineArgs, AsyncLLMEngine, RequestOutputKind, SamplingParams
from jaxspec.convert.checkpoint import save_checkpoint
from tests.tiny import TINY, tiny_weights, write_char_tokenizer

ARGS = dict(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64, block_size=8)
PROMPTS = ["abc", "hello", "xyz", "jax"]
PARAMS = [SamplingParams(temperature=0, max_tokens=10), SamplingParams(temperature=0.9, seed=3, max_tokens=12),
          SamplingParams(temperature=0, max_tokens=8, output_kind=RequestOutputKind.DELTA),
          SamplingParams(temperature=0, max_tokens=9, output_kind=RequestOutputKind.FINAL_ONLY)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("async-engine")
    ckpt, tok = save_checkpoint(root / "tiny", TINY, tiny_weights(4)), write_char_tokenizer(root / "tok")
    reference = LLM(str(ckpt), tokenizer=str(tok), **ARGS).generate(PROMPTS, PARAMS, use_tqdm=False)
    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=str(ckpt), tokenizer=str(tok), **ARGS))
    yield engine, [o.outputs[0].text for o in reference]
    engine.shutdown()


def test_concurrent_generators_match_generate(model):
    engine, want = model

    async def one(i: int) -> tuple[str, int]:
        text, count = "", 0
        async for out in engine.generate(PROMPTS[i], PARAMS[i], request_id=f"r{i}"):
            count += 1
            delta = PARAMS[i].output_kind is RequestOutputKind.DELTA
            text = text + out.outputs[0].text if delta else out.outputs[0].text
        return text, count

    async def main():
        return await asyncio.gather(*(one(i) for i in range(len(PROMPTS))))

    got = asyncio.run(main())
    assert [text for text, _ in got] == want
    assert got[3][1] == 1 and got[0][1] > 1  # FINAL_ONLY yields once; CUMULATIVE as tokens come
    assert engine.is_running and not engine.errored and not engine.is_stopped
    asyncio.run(engine.check_health())  # vLLM's: returns while the engine can run requests


def test_closing_early_and_abort_end_requests(model):
    engine, _ = model
    llm_engine = engine.llm.llm_engine
    long = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)

    async def main():
        async for _ in engine.generate("abc", long, request_id="closed"):
            break  # the consumer goes away: the request is aborted

        async def aborted():
            outs = []
            async for out in engine.generate("hello", long, request_id="aborted"):
                if not outs:  # from another task in a real program; the generator still ends with the abort
                    asyncio.get_running_loop().call_soon(asyncio.ensure_future, engine.abort("aborted"))
                outs.append(out)
            return outs[-1]

        last = await asyncio.wait_for(aborted(), 60)
        with pytest.raises(ValueError, match="max_tokens"):  # refused before it runs; the engine goes on
            async for _ in engine.generate("abc", SamplingParams(max_tokens=0), request_id="bad"):
                pass
        ok = [out async for out in engine.generate("xyz", SamplingParams(temperature=0, max_tokens=4),
                                                   request_id="after")]
        for _ in range(600):  # the engine thread frees the aborted requests' pages
            if not llm_engine.has_unfinished_requests():
                break
            await asyncio.sleep(0.01)
        return last, ok[-1]

    last, ok = asyncio.run(main())
    assert last.finished and last.outputs[0].finish_reason == "abort" and len(last.outputs[0].token_ids) < 100
    assert ok.finished and len(ok.outputs[0].token_ids) == 4
    assert not llm_engine.has_unfinished_requests()
    metrics = engine.llm.get_metrics()
    assert metrics["num_free_pages"] == metrics["num_pages"] and not llm_engine.in_flight


def test_check_health_raises_once_the_engine_died():
    """vLLM's check_health / dead_error / is_stopped on an engine whose thread stopped on an error."""
    from types import SimpleNamespace

    from jaxspec.serve.engine_loop import EngineDeadError

    engine = AsyncLLMEngine(llm=None)
    engine._loop = SimpleNamespace(error=RuntimeError("device lost"), is_healthy=False)
    assert engine.errored and engine.is_stopped and not engine.is_running
    with pytest.raises(EngineDeadError, match="device lost"):
        asyncio.run(engine.check_health())
