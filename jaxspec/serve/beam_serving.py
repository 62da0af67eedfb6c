"""`use_beam_search` requests (vLLM's): the beam search of `jaxspec.beam_search` driven over the engine loop.

Each step submits the live beams as engine requests of one token with 2 * n logprobs and waits for them; the
answers are a prompt's `n` best beams, one choice each, as vLLM's server gives them: the generated tokens, the
text without a final EOS's unless `include_stop_str_in_output`, finish_reason "stop" when EOS ended the beam. The
response is not streamed (a streaming request gets the whole response as one event, as in vLLM). The beam
settings follow vLLM's request mapping: beam_width = n, the request's temperature or the model's default or 1.0,
`length_penalty` (a vLLM request field), `ignore_eos`, max_tokens.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from jaxspec.beam_search import BeamSearch
from jaxspec.outputs import CompletionOutput, RequestOutput
from jaxspec.sampling_params import BeamSearchParams, RequestOutputKind
from jaxspec.serve import protocol as api
from jaxspec.serve.serving import APIError, EngineInputs, bad_value, refuse_unsupported


def beam_search_params(req: api.SamplingRequest, max_tokens: int | None, prompt_lens: list[int],
                       max_model_len: int, max_logprobs: int, defaults: dict[str, Any]) -> BeamSearchParams:
    """The request's beam settings (vLLM's mapping); a 400 naming the field that cannot be served."""
    refuse_unsupported(req)
    if 2 * req.n > max_logprobs:
        raise APIError(f"use_beam_search with n={req.n} asks each step for {2 * req.n} logprobs, more than the "
                       f"server's max_logprobs={max_logprobs}", param="n")
    try:
        constrained = req.structured_output() is not None
    except api.FieldError as e:
        raise bad_value(e) from None
    if constrained:  # its steps pick beams by logprobs alone: a constraint would be silently dropped
        raise APIError("structured outputs (response_format, tool_choice, structured_outputs, guided_*) are not "
                       "supported with use_beam_search", param="use_beam_search")
    if isinstance(req, api.CompletionRequest) and req.echo and req.logprobs is not None:  # (no prompt logprobs)
        raise APIError("echo with logprobs is not supported with use_beam_search", param="echo")
    if max_tokens is None:  # up to the context (each prompt's beams stop at max_model_len)
        max_tokens = max(max_model_len - min(prompt_lens), 1)
    if defaults.get("max_tokens") is not None:
        max_tokens = min(max_tokens, defaults["max_tokens"])
    temperature = req.temperature if req.temperature is not None else defaults.get("temperature", 1.0)
    try:
        return BeamSearchParams(beam_width=req.n, max_tokens=max_tokens, ignore_eos=req.ignore_eos,
                                temperature=temperature, length_penalty=req.length_penalty,
                                include_stop_str_in_output=req.include_stop_str_in_output)
    except ValueError as e:
        raise bad_value(e) from None


async def run_beam_search(engine, request_id: str, inputs: EngineInputs, params: BeamSearchParams,
                          req: api.SamplingRequest, tokenizer: Any | None) -> list[RequestOutput]:
    """Each prompt's beam search on `engine` (an EngineLoop), as one finished RequestOutput per prompt whose
    outputs are its best beams. A bad prompt raises the engine's ValueError at the first step."""
    prompts = [prompt["prompt_token_ids"] for _, prompt, _ in inputs.requests]
    search = BeamSearch(prompts, params, engine.eos_token_ids, engine.max_model_len)
    step = dataclasses.replace(search.step_params(), output_kind=RequestOutputKind.DELTA)
    while not search.done():
        beams = search.live()
        ids = [f"{request_id}-beam{search.num_steps}-{i}" for i in range(len(beams))]
        stream = await engine.submit([(rid, {"prompt_token_ids": b.tokens}, step) for rid, b in zip(ids, beams)],
                                     time.perf_counter())
        logprobs: dict[str, list] = {rid: [] for rid in ids}
        try:
            async for batch in stream.batches():
                for out in batch:
                    logprobs[out.request_id].extend(out.outputs[0].logprobs or [])
        finally:
            stream.close()
        search.advance([logprobs[rid][0] for rid in ids])
    wants_logprobs = req.logprobs is not None and req.logprobs is not False  # (completions: 0 asks for them)
    outputs = []
    for (rid, _, _), prompt, result in zip(inputs.requests, prompts, search.outputs(None)):
        completions = []
        for i, beam in enumerate(result.sequences):
            generated = beam.tokens[len(prompt):]
            shown = generated[:-1] if beam.finish_reason == "stop" and not params.include_stop_str_in_output \
                else generated
            text = tokenizer.decode(shown, skip_special_tokens=req.skip_special_tokens) if tokenizer else ""
            completions.append(CompletionOutput(i, text, generated, beam.cum_logprob,
                                                beam.logprobs if wants_logprobs else None, beam.finish_reason,
                                                beam.stop_reason))
        outputs.append(RequestOutput(rid, None, prompt, None, completions, finished=True))
    return outputs
