"""vLLM's EngineArgs / LLMEngine.from_engine_args entry, as vLLM's own llm_engine example uses it: flags parsed by
EngineArgs.add_cli_args, an engine stepped until every request is done, the same outputs as LLM.generate; and
LLM(**asdict(EngineArgs(...))) with vLLM's names for jaxspec's settings."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from jaxspec import LLM, EngineArgs, LLMEngine, RequestOutput, SamplingParams
from jaxspec.convert.checkpoint import save_checkpoint
from tests.tiny import TINY, tiny_weights, write_char_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine-args")
    return save_checkpoint(root / "tiny", TINY, tiny_weights(3)), write_char_tokenizer(root / "tok")


def process_requests(engine: LLMEngine, test_prompts: list[tuple[str, SamplingParams]]) -> dict[str, str]:
    """vLLM's examples/offline_inference/llm_engine_example.py loop: one new request per step."""
    request_id, done = 0, {}
    while test_prompts or engine.has_unfinished_requests():
        if test_prompts:
            prompt, sampling_params = test_prompts.pop(0)
            engine.add_request(str(request_id), prompt, sampling_params)
            request_id += 1
        request_outputs: list[RequestOutput] = engine.step()
        for request_output in request_outputs:
            if request_output.finished:
                done[request_output.request_id] = request_output.outputs[0].text
    return done


def test_llm_engine_example_runs_and_matches_generate(model_dir):
    ckpt, tok = model_dir
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(["--model", str(ckpt), "--tokenizer", str(tok), "--max-model-len", "64",
                              "--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--block-size", "8"])
    engine = LLMEngine.from_engine_args(EngineArgs.from_cli_args(args))
    assert isinstance(engine, LLMEngine) and engine.cfg.page_size == 8 and engine.get_tokenizer() is not None
    prompts = ["abc", "hello", "xyz", "jax", "spec", "engine"]
    params = [SamplingParams(temperature=0, max_tokens=12), SamplingParams(temperature=0.8, seed=5, max_tokens=9)]
    got = process_requests(engine, [(p, params[i % 2]) for i, p in enumerate(prompts)])
    llm = LLM(str(ckpt), tokenizer=str(tok), max_model_len=64, max_num_seqs=4, max_num_batched_tokens=64,
              page_size=8)
    want = llm.generate(prompts, [params[i % 2] for i in range(len(prompts))], use_tqdm=False)
    assert got == {str(i): o.outputs[0].text for i, o in enumerate(want)}


def test_llm_takes_engine_args_fields_under_vllm_names(model_dir):
    ckpt, tok = model_dir
    args = EngineArgs(model=str(ckpt), tokenizer=str(tok), max_model_len=64, max_num_seqs=2, block_size=8,
                      num_gpu_blocks_override=40)
    llm = LLM(**dataclasses.asdict(args))
    assert (llm.engine_config.page_size, llm.engine_config.num_pages, llm.engine_config.max_num_seqs) == (8, 40, 2)
    with pytest.raises(ValueError, match=r"page_size=16 and block_size=8 name the same setting"):
        LLM(str(ckpt), tokenizer=str(tok), max_model_len=64, page_size=16, block_size=8)
    with pytest.raises(TypeError, match="lora_modules"):  # a vLLM option jaxspec has nothing of
        EngineArgs(model=str(ckpt), lora_modules=["x"])


def test_vllm_options_without_a_jaxspec_setting(model_dir):
    """Options vLLM scripts pass routinely are taken (what each does: jaxspec.engine_args.vllm_options); values
    that cannot be honoured are errors naming them, before the model loads."""
    ckpt, tok = model_dir
    base = dict(tokenizer=str(tok), max_model_len=64, max_num_seqs=2)
    llm = LLM(str(ckpt), trust_remote_code=True, enforce_eager=True, enable_chunked_prefill=True, swap_space=0,
              disable_log_stats=False, enable_prefix_caching=False, **base)
    assert llm.model_config.layer_loop == "scan" and llm.num_compiled == 0
    assert not llm.engine_config.enable_prefix_caching and LLM(str(ckpt), **base).engine_config.enable_prefix_caching
    greedy = SamplingParams(temperature=0, max_tokens=8)
    plain = LLM(str(ckpt), **base)
    assert [o.outputs[0].text for o in llm.generate(["abc", "hello"], greedy, use_tqdm=False)] == \
        [o.outputs[0].text for o in plain.generate(["abc", "hello"], greedy, use_tqdm=False)]
    assert LLM(str(ckpt), enforce_eager=True, layer_loop="unroll", **base).model_config.layer_loop == "unroll"
    assert LLM(str(ckpt), dtype="half", **base).model_config.dtype == "float16"  # vLLM's spelling
    # vLLM's at their defaults, or with nothing to do here
    LLM(str(ckpt), max_seq_len_to_capture=8192, disable_custom_all_reduce=True, disable_async_output_proc=True,
        distributed_executor_backend="mp", pipeline_parallel_size=1, cpu_offload_gb=0, task="generate",
        skip_tokenizer_init=False, hf_token=None, **base)
    for bad, match in [({"quantization": "awq"}, "quantization='awq' is not supported"),
                       ({"pipeline_parallel_size": 2}, "pipeline_parallel_size=2 is not supported"),
                       ({"cpu_offload_gb": 4}, "cpu_offload_gb=4 is not supported"),
                       ({"distributed_executor_backend": "ray"}, "distributed_executor_backend='ray'"),
                       ({"max_num_seq": 4}, r"does not know: \['max_num_seq'\]"),  # misspelt: before loading
                       ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype='fp8' is not supported"),
                       ({"tokenizer_mode": "slow"}, "tokenizer_mode='slow' is not supported"),
                       ({"enable_lora": True}, "enable_lora=True is not supported")]:
        with pytest.raises(ValueError, match=match):
            LLM("no/such/model", **bad, **base)  # raised before the model is looked for
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args(["--enforce-eager", "--trust-remote-code", "--model", "m"]))
    assert args.enforce_eager and args.trust_remote_code and args.enable_prefix_caching is None
    args = EngineArgs.from_cli_args(parser.parse_args(["--no-enable-prefix-caching", "--model", "m"]))
    assert args.enable_prefix_caching is False



def test_structured_outputs_settings(model_dir):
    """structured_outputs_config (and vLLM's older guided_decoding_backend) reach the engine: the pool's size and
    the engine-wide whitespace default; unknown keys, backends and a reasoning parser are named."""
    ckpt, tok = model_dir
    base = dict(tokenizer=str(tok), max_model_len=64, max_num_seqs=2)
    llm = LLM(str(ckpt), structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True,
                                                    "max_states": 64, "max_transitions": 1000}, **base)
    pool = llm.llm_engine.runner.grammar_pool
    assert (pool.max_states, pool.max_transitions) == (64, 1000)
    assert llm.llm_engine.input_processor.structured_outputs.disable_any_whitespace
    assert LLM(str(ckpt), guided_decoding_backend="outlines", **base).llm_engine.input_processor \
        .structured_outputs.backend == "outlines"
    for bad, match in [({"structured_outputs_config": {"backend": "mine"}}, "backend must be one of"),
                       ({"structured_outputs_config": {"max_state": 1}}, r"unknown keys \['max_state'\]"),
                       ({"structured_outputs_config": {"reasoning_parser": "deepseek_r1"}}, "reasoning_parser"),
                       ({"guided_decoding_backend": "x", "structured_outputs_config": {}}, "not both")]:
        with pytest.raises(ValueError, match=match):
            LLM(str(ckpt), **bad, **base)
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args(["--model", "m", "--structured-outputs-config",
                                                       '{"max_states": 8}', "--guided-decoding-backend", "auto"]))
    assert args.structured_outputs_config == {"max_states": 8} and args.guided_decoding_backend == "auto"
