"""OpenAI requests -> engine requests, and engine outputs -> OpenAI responses and stream chunks (vLLM's formats).

Prompts are tokenized here, on the HTTP side, so the engine spends no time on them: a text prompt as the
engine would (`tokenizer.encode`), a conversation through the model's chat template (`jaxspec.chat`). The engine
streams DELTA outputs for every request (the latency metrics need each step's tokens); a non-streaming response
is their concatenation. Choice indices follow vLLM: prompt_index * n + sample index.

`echo` is vLLM's: a completion starts with its prompt (text, and with `logprobs` the prompt tokens' logprobs,
the first token's None), or is the prompt alone when max_tokens is 0 (how lm-eval and OpenAI's clients score a
text); a chat answer starts with the last message's text when it continues that message's role.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import time
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any

from jinja2 import TemplateError

from jaxspec.chat import render_chat
from jaxspec.sampling_params import RequestOutputKind, SamplingParams
from jaxspec.serve import protocol as api
from jaxspec.serve.tool_parsers import PARSERS, ForcedParser, StreamSplitter, ToolCall

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
               500: "InternalServerError", 503: "ServiceUnavailableError"}


class APIError(Exception):
    """An error with its HTTP status, rendered as OpenAI's error JSON."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param = message, status, param

    def body(self) -> dict:
        info = api.ErrorInfo(message=self.message, type=ERROR_TYPES.get(self.status, "BadRequestError"),
                             param=self.param, code=self.status)
        return api.ErrorResponse(error=info).model_dump()


def bad_value(error: ValueError) -> APIError:
    """A 400 from a ValueError of the engine, SamplingParams or a request field (protocol.FieldError), with the
    parameter it names as `param`."""
    if isinstance(error, api.FieldError):
        return APIError(str(error), 400, error.field)
    named = re.search(r"(?:Sampling|BeamSearch)Params\.(\w+)", str(error))
    return APIError(str(error), 400, named.group(1) if named else None)


_SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams))


def refuse_unsupported(req: api.SamplingRequest) -> None:
    """A 400 naming the first field whose feature this server does not implement."""
    for name in req.unsupported_fields():
        raise APIError(f"{name!r} is not supported by this server", param=name)


def sampling_params(req: api.SamplingRequest, max_tokens: int | None, defaults: dict[str, Any]) -> SamplingParams:
    """The request's SamplingParams over the model's sampling defaults (`LLM.default_sampling_values`: the unset
    fields take them, and their max_tokens caps the request's, as in vLLM); a 400 naming the first field this
    server cannot honour."""
    refuse_unsupported(req)
    # the sampling fields a request leaves unset (None) take the model's default (all are request fields)
    values = {name: v for name, v in defaults.items() if name != "max_tokens" and getattr(req, name) is None}
    try:
        values |= req.sampling_values()
    except api.FieldError as e:  # a structured-output field that does not parse
        raise bad_value(e) from None
    if defaults.get("max_tokens") is not None:
        max_tokens = defaults["max_tokens"] if max_tokens is None else min(max_tokens, defaults["max_tokens"])
    for name in values:
        if name not in _SAMPLING_FIELDS:
            raise APIError(f"{name!r} is not supported yet: jaxspec's SamplingParams has no {name!r} field",
                           param=name)
    try:
        return SamplingParams(**values, max_tokens=max_tokens, output_kind=RequestOutputKind.DELTA)
    except ValueError as e:
        raise bad_value(e) from None


@dataclass
class EngineInputs:
    """What one HTTP request hands the engine: (request_id, prompt, params) per prompt; the texts of the prompts
    that came as text (None for token ids), which `echo` repeats."""
    requests: list[tuple[str, dict, SamplingParams | None]]  # None: a beam search's, which makes its own
    prompt_lens: list[int]
    prompt_texts: list[str | None] = field(default_factory=list)


def engine_inputs(request_id: str, prompt_ids: list[list[int]], texts: list[str | None] | None = None,
                  params: SamplingParams | None = None) -> EngineInputs:
    """One engine request per prompt; params None for requests that make their own (beam search)."""
    ids = [request_id] if len(prompt_ids) == 1 else [f"{request_id}-{i}" for i in range(len(prompt_ids))]
    # the engine keeps the last truncate_prompt_tokens tokens (-1: the last max_model_len, which changes only a
    # prompt too long to be served at all)
    truncate = params.truncate_prompt_tokens if params is not None else None
    keep = truncate if (truncate or 0) > 0 else None
    lens = [len(p) if keep is None else min(len(p), keep) for p in prompt_ids]
    texts = texts or [None] * len(prompt_ids)
    return EngineInputs([(rid, {"prompt_token_ids": p}, params) for rid, p in zip(ids, prompt_ids)], lens,
                        [t if n == len(p) else None for t, n, p in zip(texts, lens, prompt_ids)])


def completion_prompts(req: api.CompletionRequest, tokenizer: Any) -> tuple[list[list[int]], list[str | None]]:
    """The request's prompts as token ids, and the texts of those sent as text."""
    prompts = req.prompts()
    if not prompts:
        raise APIError("prompt must not be an empty list", param="prompt")
    if any(isinstance(p, str) for p in prompts) and tokenizer is None:
        raise APIError("text prompts need a tokenizer and this model has none: send token ids", param="prompt")
    if req.echo and tokenizer is None:
        raise APIError("echo needs a tokenizer to write the prompt's text and this model has none", param="echo")
    return ([tokenizer.encode(p) if isinstance(p, str) else p for p in prompts],
            [p if isinstance(p, str) else None for p in prompts])


def completion_inputs(req: api.CompletionRequest, request_id: str, tokenizer: Any,
                      defaults: dict[str, Any]) -> EngineInputs:
    params = sampling_params(req, req.engine_max_tokens(), defaults)
    return engine_inputs(request_id, *completion_prompts(req, tokenizer), params)


@dataclass(frozen=True)
class ChatOptions:
    """The server's chat settings (vLLM's flags): --chat-template (the model's own when None),
    --trust-request-chat-template (a request may send its own), --response-role (after a generation prompt),
    --tool-call-parser with --enable-auto-tool-choice (None: requests with tools to call are refused)."""
    template: str | None = None
    trust_request_template: bool = False
    response_role: str = "assistant"
    tool_parser: str | None = None


def _check_tool_choice(req: api.ChatCompletionRequest, options: ChatOptions) -> None:
    mode = req.tool_choice_mode()
    if mode == "none":
        return
    if not req.tools:
        raise APIError("tool_choice needs tools", param="tool_choice")
    if mode in ("required", "named"):  # a structured output (protocol.ChatCompletionRequest.structured_output)
        return
    if mode != "auto":
        raise APIError(f"tool_choice must be 'none', 'auto', 'required' or a named function, got "
                       f"{req.tool_choice!r}", param="tool_choice")
    if options.tool_parser is None:
        raise APIError('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set (as '
                       "in vLLM)", param="tool_choice")


def chat_prompts(req: api.ChatCompletionRequest | api.TokenizeChatRequest, tokenizer: Any,
                 add_special_tokens: bool = False,
                 options: ChatOptions = ChatOptions()) -> tuple[list[list[int]], list[str | None]]:
    """The conversation through the chat template (the request's, the server's or the model's), as token ids (the
    template writes the special tokens itself, so the tokenizer adds none unless asked)."""
    if isinstance(req, api.ChatCompletionRequest):
        _check_tool_choice(req, options)
    if req.chat_template is not None and not options.trust_request_template:
        raise APIError("a request's own chat_template is refused unless the server runs with "
                       "--trust-request-chat-template (as in vLLM)", param="chat_template")
    template = req.chat_template or options.template
    if tokenizer is None or not (template or getattr(tokenizer, "chat_template", None)):
        raise APIError("this model has no chat template: use /v1/completions, or start the server with "
                       "--chat-template", param="messages")
    if not req.messages:
        raise APIError("messages must not be empty", param="messages")
    try:
        conversation = req.conversation()
    except ValueError as e:
        raise APIError(str(e), param="messages") from None
    try:
        text = render_chat(tokenizer, conversation, add_generation_prompt=req.add_generation_prompt,
                           continue_final_message=req.continue_final_message, chat_template=template,
                           tools=req.tools, chat_template_kwargs=req.chat_template_kwargs)
    except (ValueError, TemplateError) as e:  # contradicting options, or a template that refuses the conversation
        param = next((name for name in ("chat_template_kwargs", "continue_final_message") if name in str(e)),
                     "messages")
        raise APIError(f"the chat template: {e}", param=param) from None
    return [tokenizer.encode(text, add_special_tokens=add_special_tokens)], [None]


def chat_inputs(req: api.ChatCompletionRequest, request_id: str, tokenizer: Any, defaults: dict[str, Any],
                options: ChatOptions = ChatOptions()) -> EngineInputs:
    params = sampling_params(req, req.engine_max_tokens(), defaults)
    return engine_inputs(request_id, *chat_prompts(req, tokenizer, options=options), params)


# ---- outputs

# pydantic's JSON (model_dump_json): compact, non-ASCII as UTF-8
_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _js(value: str | int | None) -> str:
    """A chunk field's JSON as _json writes it, without the encoder's general path (~1.5 us for a None or an int,
    three fields a chunk)."""
    if value is None:
        return "null"
    return encode_basestring(value) if isinstance(value, str) else str(int(value))


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    text_len: int = 0  # characters streamed so far (the next chunk's logprob text_offset)
    started: bool = False  # its first chunk has gone out (with the role, or the echoed prompt)
    num_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list = field(default_factory=list)  # vLLM's per-token {token_id: Logprob}, when asked for
    token_ids: list[int] = field(default_factory=list)  # kept only with logprobs


class _Format:
    """One HTTP request's outputs as OpenAI JSON: stream chunks as they come (`chunks`), or one response at the
    end (`add`, then `response`)."""

    def __init__(self, request_id: str, model: str, req: api.SamplingRequest, inputs: EngineInputs, tokenizer):
        self.request_id, self.model, self.req, self.tokenizer = request_id, model, req, tokenizer
        self.prompt_index = {rid: i for i, (rid, _, _) in enumerate(inputs.requests)}
        self.prompt_texts = inputs.prompt_texts
        # per prompt, from its first output: (the engine's prompt token ids, its prompt logprobs or None)
        self.prompts: dict[int, tuple[list[int], list | None]] = {}
        self.prompt_tokens = sum(inputs.prompt_lens)
        self.created = int(time.time())
        self.choices: dict[int, _Choice] = {}
        # A stream chunk is this envelope around its choices, written as text: pydantic models for every chunk cost
        # the event loop ~4 us more per chunk, 64 streams a step (the chunk models of protocol.py are the schema
        # this text is tested against).
        head = _json({"id": request_id, "object": self.chunk_object, "created": self.created, "model": model})
        self._head = head[:-1] + ',"choices":['
        self.include_usage, self.continuous_usage = req.include_usage, req.continuous_usage

    def _updates(self, batch: list):
        """(choice index, CompletionOutput delta, its _Choice) for each completion in a batch of outputs."""
        for out in batch:
            prompt = self.prompt_index[out.request_id]
            if prompt not in self.prompts or out.prompt_logprobs is not None:
                self.prompts[prompt] = (out.prompt_token_ids, out.prompt_logprobs)
            base = prompt * self.req.n
            for comp in out.outputs:
                choice = self.choices.setdefault(base + comp.index, _Choice())
                choice.num_tokens += len(comp.token_ids)
                choice.finish_reason, choice.stop_reason = comp.finish_reason, comp.stop_reason
                if comp.logprobs:
                    choice.logprobs.extend(comp.logprobs)
                    choice.token_ids.extend(comp.token_ids)
                yield base + comp.index, comp, choice

    def usage(self) -> api.UsageInfo:
        completion = sum(c.num_tokens for c in self.choices.values())
        return api.UsageInfo(prompt_tokens=self.prompt_tokens, completion_tokens=completion,
                             total_tokens=self.prompt_tokens + completion)

    def add(self, batch: list) -> None:
        for _, comp, choice in self._updates(batch):
            choice.text.append(comp.text)

    def chunks(self, batch: list) -> list[str]:
        """The stream events (JSON) for a batch of outputs; deltas with no text and no finish are skipped."""
        events = []
        for index, comp, choice in self._updates(batch):
            events.extend(self._chunks(index, comp, choice))
        return events

    def usage_chunk(self) -> str | None:
        """The last event before [DONE] when stream_options.include_usage: no choices, the whole usage."""
        if not self.include_usage:
            return None
        return self._envelope("", usage=self.usage())

    def _envelope(self, choices: str, usage: api.UsageInfo | None = None) -> str:
        """A chunk's JSON around its choices' JSON; with include_usage every chunk has a usage field (null but in
        the last, or the usage so far with continuous_usage_stats)."""
        if not self.include_usage:
            return f"{self._head}{choices}]}}"
        if self.continuous_usage and usage is None:
            usage = self.usage()
        return f'{self._head}{choices}],"usage":{"null" if usage is None else usage.model_dump_json()}}}'

    def _token_text(self, token_id: int, logprob) -> str:
        return logprob.decoded_token if logprob.decoded_token is not None else self.tokenizer.decode([token_id])

    def _tops(self, step: dict, num: int) -> list[tuple[str, float]]:
        """The `num` best alternatives of one token's logprobs, as (text, logprob)."""
        best = sorted(step.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 0)[:num]
        return [(self._token_text(t, lp), max(lp.logprob, -9999.0)) for t, lp in best]

    def _prompt_logprobs(self, prompt: int) -> list | None:
        """A prompt's logprobs as vLLM's responses carry them (-inf written as -9999, OpenAI's floor)."""
        logprobs = self.prompts.get(prompt, (None, None))[1]
        if logprobs is None:
            return None
        return [None if d is None else {t: api.PromptLogprob(logprob=max(lp.logprob, -9999.0), rank=lp.rank,
                                                             decoded_token=self._token_text(t, lp))
                                        for t, lp in d.items()} for d in logprobs]


class CompletionFormat(_Format):
    chunk_object = "text_completion"

    def _logprobs(self, token_ids: list[int], steps: list, offset: int) -> api.CompletionLogprobs:
        """OpenAI's completion logprobs: per token its text, logprob, the top `logprobs` alternatives and the
        token itself (up to logprobs + 1 entries, as OpenAI and vLLM give), and its offset in the text. A
        position without logprobs (an echoed prompt's first token) has None for both."""
        out = api.CompletionLogprobs()
        for t, step in zip(token_ids, steps):
            if step is None:
                text, own, tops = self.tokenizer.decode([t]), None, None
            else:
                text, own = self._token_text(t, step[t]), max(step[t].logprob, -9999.0)
                tops = {self._token_text(u, lp): max(lp.logprob, -9999.0)
                        for u, lp in itertools.islice(step.items(), (self.req.logprobs or 0) + 1)}
            out.tokens.append(text)
            out.token_logprobs.append(own)
            out.top_logprobs.append(tops)
            out.text_offset.append(offset)
            offset += len(text)
        return out

    def _echo(self, index: int) -> tuple[str, list[int], list]:
        """The prompt of choice `index` as its answer repeats it: text, token ids, logprobs per token."""
        prompt = index // self.req.n
        ids, logprobs = self.prompts[prompt]
        text = self.prompt_texts[prompt] if prompt < len(self.prompt_texts) else None
        return (self.tokenizer.decode(ids) if text is None else text), list(ids), list(logprobs or [])

    def _answer(self, index: int, text: str, token_ids: list[int], logprobs: list) -> tuple[str, list, list]:
        """A choice's text, token ids and logprobs as the response gives them: the generated ones, behind the
        prompt with echo, or the prompt alone with echo and max_tokens 0."""
        if not self.req.echo:
            return text, token_ids, logprobs
        ptext, pids, plogprobs = self._echo(index)
        if self.req.echo_only:
            return ptext, pids, plogprobs
        return ptext + text, pids + list(token_ids), plogprobs + list(logprobs)

    def _chunks(self, index: int, comp, choice: _Choice) -> list[str]:
        text, token_ids, logprobs = comp.text, comp.token_ids, comp.logprobs or []
        if not choice.started:
            choice.started = True
            text, token_ids, logprobs = self._answer(index, text, token_ids, logprobs)
        elif self.req.echo_only:
            text, token_ids, logprobs = "", [], []
        if not (text or comp.finish_reason or logprobs):
            return []
        rendered = "null"
        if self.req.logprobs is not None and logprobs:
            rendered = self._logprobs(token_ids, logprobs, choice.text_len).model_dump_json()
        choice.text_len += len(text)
        return [self._envelope(f'{{"index":{index},"text":{_js(text)},"logprobs":{rendered},"finish_reason":'
                               f'{_js(comp.finish_reason)},"stop_reason":{_js(comp.stop_reason)}}}')]

    def response(self) -> dict:
        choices = []
        for i, c in sorted(self.choices.items()):
            text, token_ids, logprobs = self._answer(i, "".join(c.text), c.token_ids, c.logprobs)
            choices.append(api.CompletionChoice(
                index=i, text=text, finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                logprobs=self._logprobs(token_ids, logprobs, 0) if self.req.logprobs is not None else None,
                prompt_logprobs=self._prompt_logprobs(i // self.req.n)))
        return api.CompletionResponse(id=self.request_id, created=self.created, model=self.model, choices=choices,
                                      usage=self.usage()).model_dump()


class ChatFormat(_Format):
    chunk_object = "chat.completion.chunk"

    def __init__(self, *a, response_role: str = "assistant", tool_parser: str | None = None, **kw):
        super().__init__(*a, **kw)
        self.role, self.echoed = self.req.response_role(response_role), self.req.echoed_text(response_role)
        # the answers are parsed for tool calls when the request lets the model call its tools
        self.parser = self._tool_parser(tool_parser)
        # forced calls keep the engine's finish_reason (vLLM's); parsed ones report "tool_calls"
        self.forced = isinstance(self.parser, ForcedParser)
        self.splitters: dict[int, StreamSplitter] = {}

    def _tool_parser(self, tool_parser: str | None):
        """What reads tool calls in the answers: the server's parser when the model may call the tools ("auto"),
        ForcedParser when the request forces calls, else None."""
        mode = self.req.tool_choice_mode() if self.req.tools else "none"
        if mode == "auto":
            return PARSERS[tool_parser]() if tool_parser is not None else None
        if mode == "required":
            return ForcedParser()
        return ForcedParser(self.req.tool_choice["function"]["name"]) if mode == "named" else None

    def _logprobs(self, token_ids: list[int], steps: list) -> api.ChatLogprobs:
        content = []
        for t, step in zip(token_ids, steps):
            text = self._token_text(t, step[t])
            tops = [api.ChatTopLogprob(token=s, logprob=lp, bytes=list(s.encode()))
                    for s, lp in self._tops(step, self.req.top_logprobs or 0)]
            content.append(api.ChatTokenLogprob(token=text, logprob=max(step[t].logprob, -9999.0),
                                                bytes=list(text.encode()), top_logprobs=tops))
        return api.ChatLogprobs(content=content)

    def _calls(self, calls: list[ToolCall]) -> list[ToolCall]:
        return calls if self.req.parallel_tool_calls is not False else calls[:1]  # vLLM: the first only

    def _chunks(self, index: int, comp, choice: _Choice) -> list[str]:
        events = []
        if not choice.started:  # as OpenAI and vLLM: a choice's first chunk has the role and no text
            choice.started = True
            events.append(self._envelope(f'{{"index":{index},"delta":{{"role":{_js(self.role)},"content":""}},'
                                         '"logprobs":null,"finish_reason":null}'))
            if self.echoed:  # then, with echo, the text the answer continues (vLLM's echo chunk)
                events.append(self._envelope(f'{{"index":{index},"delta":{{"content":{_js(self.echoed)}}},'
                                             '"logprobs":null,"finish_reason":null}'))
        text, finish, calls = comp.text, comp.finish_reason, []
        if self.parser is not None:  # text that may be a tool call is held until the answer ends
            splitter = self.splitters.setdefault(index, StreamSplitter(self.parser))
            text = splitter.feed(comp.text)
            if finish is not None:
                held, calls = splitter.finish()
                text += held
        if text or finish or comp.logprobs:
            logprobs = self._logprobs(comp.token_ids, comp.logprobs).model_dump_json() if comp.logprobs else "null"
            end = "null" if calls else _js(finish)
            events.append(self._envelope(f'{{"index":{index},"delta":{{"content":{_js(text)}}},"logprobs":'
                                         f'{logprobs},"finish_reason":{end},"stop_reason":'
                                         f'{"null" if calls else _js(comp.stop_reason)}}}'))
        if calls:  # each call whole in one delta (a client joins the argument pieces it gets; here there is one)
            deltas = [{"index": i, **call.as_dict()} for i, call in enumerate(self._calls(calls))]
            reason = finish if self.forced else "tool_calls"
            events.append(self._envelope(f'{{"index":{index},"delta":{{"tool_calls":{_json(deltas)}}},'
                                         f'"logprobs":null,"finish_reason":{_js(reason)},'
                                         f'"stop_reason":{_js(comp.stop_reason)}}}'))
        return events

    def _message(self, text: str, finish: str | None) -> tuple[api.ChatResponseMessage, str | None]:
        if self.parser is not None:
            content, calls = self.parser.parse(text)
            if calls:
                return api.ChatResponseMessage(role=self.role, content=content, tool_calls=[
                    c.as_dict() for c in self._calls(calls)]), finish if self.forced else "tool_calls"
        return api.ChatResponseMessage(role=self.role, content=self.echoed + text), finish

    def response(self) -> dict:
        choices = []
        for i, c in sorted(self.choices.items()):
            message, finish = self._message("".join(c.text), c.finish_reason)
            choices.append(api.ChatChoice(index=i, message=message, finish_reason=finish, stop_reason=c.stop_reason,
                                          logprobs=self._logprobs(c.token_ids, c.logprobs) if c.logprobs else None))
        return api.ChatCompletionResponse(id=self.request_id, created=self.created, model=self.model,
                                          choices=choices, usage=self.usage(),
                                          prompt_logprobs=self._prompt_logprobs(0)).model_dump()
