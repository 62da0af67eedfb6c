"""Request and response bodies of the OpenAI API, with vLLM's field names, defaults and extra sampling fields.

Sampling fields are mapped to `SamplingParams` by name (`sampling_values`): a field the request sets to anything
but its default is passed on when `SamplingParams` has a field of that name, and rejected with a 400 naming it
when it has not, so a sampling option starts working here the day `SamplingParams` learns it. Fields of
features this server does not implement at all (`UNSUPPORTED`: suffix, ...) are rejected the same way.
Fields the API does not know are ignored with a warning, as vLLM does. A structured output comes as OpenAI's
`response_format`, vLLM's `structured_outputs` object, or vLLM's older `guided_json` / `guided_regex` /
`guided_choice` / `guided_grammar` fields: one of them, as SamplingParams.structured_outputs.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from jaxspec.chat import with_content_format
from jaxspec.serve.tool_parsers import forced_schema
from jaxspec.structured_output import StructuredOutputsParams


@functools.cache
def _field_defaults(model: type[BaseModel]) -> dict[str, Any]:
    """Each field's default, made once per model: pydantic's get_default inspects a default factory's signature on
    every call (~10 us a field, 0.6 ms a request, on the event loop that also feeds the streams)."""
    return {name: info.get_default(call_default_factory=True) for name, info in model.model_fields.items()}


class FieldError(ValueError):
    """A request field's value the server cannot take (a 400 naming `field`)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")  # vLLM accepts (and logs) fields it does not know


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class SamplingRequest(OpenAIBaseModel):
    """The fields both endpoints share: the model, streaming, and vLLM's sampling fields."""
    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: int = 1
    best_of: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = Field(default_factory=list)
    stop_token_ids: list[int] | None = Field(default_factory=list)
    ignore_eos: bool = False
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    repetition_penalty: float | None = None
    min_tokens: int = 0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    use_beam_search: bool = False  # vLLM's: n beams (jaxspec.serve.beam_serving)
    length_penalty: float = 1.0  # beam search's
    # structured outputs (one of them; module docstring)
    response_format: dict | None = None
    structured_outputs: dict | None = None
    guided_json: str | dict | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None

    # request fields that are SamplingParams fields of the same name
    SAMPLING: ClassVar[tuple[str, ...]] = (
        "n", "best_of", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
        "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens", "logit_bias",
        "allowed_token_ids", "bad_words", "prompt_logprobs", "include_stop_str_in_output", "skip_special_tokens",
        "spaces_between_special_tokens", "truncate_prompt_tokens")
    # features of the API that this server does not implement: any value but the default is refused
    UNSUPPORTED: ClassVar[tuple[str, ...]] = ()

    def _non_default(self, name: str) -> Any:
        """The field's value if it differs from its default, else None."""
        value = getattr(self, name)
        return None if value is None or value == _field_defaults(type(self))[name] else value

    def sampling_values(self) -> dict[str, Any]:
        """The sampling fields set to something other than their default, under SamplingParams' names."""
        values = {name: v for name in self.SAMPLING if (v := self._non_default(name)) is not None}
        constraint = self.structured_output()
        if constraint is not None:
            values["structured_outputs"] = constraint
        return values

    def structured_output(self) -> StructuredOutputsParams | None:
        """The request's constraint from whichever field gives it; a FieldError naming the field."""
        given = {}
        fmt = self.response_format or {}
        kind = fmt.get("type", "text") if isinstance(fmt, dict) else None
        if kind == "json_object":
            given["response_format"] = dict(json_object=True)
        elif kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
                raise FieldError("response_format", "response_format json_schema needs {'name': ..., 'schema': "
                                                    "{...}}")
            given["response_format"] = dict(json=spec.get("schema", {}))
        elif kind != "text":
            raise FieldError("response_format", f"response_format type must be 'text', 'json_object' or "
                                                f"'json_schema', got {fmt!r}")
        if self.structured_outputs:
            given["structured_outputs"] = dict(self.structured_outputs)
        guided = {key: getattr(self, f"guided_{key}") for key in ("json", "regex", "choice", "grammar")
                  if getattr(self, f"guided_{key}") is not None}
        if guided:
            given["guided_" + next(iter(guided))] = dict(guided, whitespace_pattern=self.guided_whitespace_pattern)
        if len(given) > 1:
            raise FieldError(next(iter(given)), f"structured outputs: give one of {', '.join(given)}, not several")
        if not given:
            return None
        (field, values), = given.items()
        try:
            return StructuredOutputsParams(**values)
        except (TypeError, ValueError) as e:
            raise FieldError(field, f"{field}: {e}") from None

    def unsupported_fields(self) -> list[str]:
        return [name for name in self.UNSUPPORTED if self._non_default(name) is not None]

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and bool(self.stream_options.continuous_usage_stats)


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = False
    suffix: str | None = None

    SAMPLING: ClassVar[tuple[str, ...]] = SamplingRequest.SAMPLING + ("logprobs",)
    UNSUPPORTED: ClassVar[tuple[str, ...]] = SamplingRequest.UNSUPPORTED + ("suffix",)

    @property
    def echo_only(self) -> bool:
        """echo with max_tokens 0: the answer is the prompt alone (OpenAI's way to score a text; the engine still
        samples one token, as vLLM's does, and the usage counts it)."""
        return bool(self.echo) and self.max_tokens == 0

    def engine_max_tokens(self) -> int | None:
        return 1 if self.echo_only else self.max_tokens

    def sampling_values(self) -> dict[str, Any]:
        values = super().sampling_values()
        if self.echo and "prompt_logprobs" not in values and "logprobs" in values:
            values["prompt_logprobs"] = values["logprobs"]  # vLLM: echoed prompt tokens get the same logprobs
        return values

    def prompts(self) -> list[str | list[int]]:
        """One text or token-id list per prompt (the API's batch forms are lists of either)."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)


class TextPart(OpenAIBaseModel):
    type: str
    text: str | None = None


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage]
    max_tokens: int | None = None  # deprecated by OpenAI for max_completion_tokens; None: up to max_model_len
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    functions: list[dict] | None = None
    function_call: str | dict | None = None
    parallel_tool_calls: bool | None = None
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict | None = None
    # a template sent with the request: vLLM refuses it unless the server trusts request templates; so does this one
    # (jaxspec serve --trust-request-chat-template)
    chat_template: str | None = None

    UNSUPPORTED: ClassVar[tuple[str, ...]] = SamplingRequest.UNSUPPORTED + ("functions", "function_call")

    def structured_output(self) -> StructuredOutputsParams | None:
        """The base's, or a forced tool call's JSON (tool_choice "required" or a named function, as vLLM makes
        it); both at once is a FieldError."""
        constraint = super().structured_output()
        mode = self.tool_choice_mode() if self.tools else "none"
        if mode not in ("required", "named"):
            return constraint
        if constraint is not None:
            raise FieldError("tool_choice", f"tool_choice {self.tool_choice!r} makes the answer a tool call's JSON; "
                                            "it cannot take another structured output as well")
        try:
            return StructuredOutputsParams(json=forced_schema(self.tools, self.tool_choice))
        except ValueError as e:
            raise FieldError("tool_choice" if "tool_choice" in str(e) else "tools", str(e)) from None

    def tool_choice_mode(self) -> str:
        """vLLM's: "none" (no tools, or told not to call them), "auto" (tools given, tool_choice unset or "auto"),
        or what else the request asked for ("required", a named function: not served)."""
        choice = self.tool_choice
        if choice is None:
            return "auto" if self.tools else "none"
        return choice if isinstance(choice, str) else "named"

    def engine_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def response_role(self, generation_role: str = "assistant") -> str:
        """The answer's role, as vLLM's: `generation_role` (the server's --response-role) after a generation prompt,
        else the last message's (the model continues it)."""
        return generation_role if self.add_generation_prompt else self.messages[-1].role

    def echoed_text(self, generation_role: str = "assistant") -> str:
        """With `echo`, what each answer starts with (vLLM's): the last message's text when the answer continues
        its role, else nothing."""
        if not self.echo or not self.messages or self.messages[-1].role != self.response_role(generation_role):
            return ""
        return self.conversation()[-1]["content"]

    def sampling_values(self) -> dict[str, Any]:
        values = super().sampling_values()
        if self.logprobs:  # vLLM: top_logprobs alternatives per token (0: only the sampled token's own)
            values["logprobs"] = self.top_logprobs or 0
        return values

    def conversation(self) -> list[dict]:
        return conversation(self.messages)


def conversation(messages: list[ChatMessage]) -> list[dict]:
    """The messages as the chat template takes them; text parts are joined, other parts are refused."""
    out = []
    for m in messages:
        content = m.content or ""
        if isinstance(content, list):
            content = [part.model_dump(exclude_none=True) for part in content]
        msg = {"role": m.role, "content": content}
        extra = m.model_extra or {}
        if m.name is not None:
            msg["name"] = m.name
        if extra.get("tool_call_id") is not None:  # a tool's answer
            msg["tool_call_id"] = extra["tool_call_id"]
        if extra.get("tool_calls"):  # an assistant's calls; arguments as objects, which templates render (vLLM's)
            msg["tool_calls"] = [_template_call(c) for c in extra["tool_calls"]]
        out.append(msg)
    return with_content_format(out, "string")


def _template_call(call: dict) -> dict:
    function = dict(call.get("function") or {})
    if isinstance(function.get("arguments"), str):
        try:
            function["arguments"] = json.loads(function["arguments"])
        except ValueError:
            pass  # left as the text the client sent
    return {**call, "function": function}


# ---- responses

class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0


def _created() -> int:
    return int(time.time())


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's Logprob as its responses write it (prompt_logprobs: per prompt token {token id: this}, None first)."""
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[int, PromptLogprob] | None]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_created)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ChatTopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None
    tool_calls: list[dict] | None = None  # {"id", "type": "function", "function": {"name", "arguments"}}


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_created)
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = None


# Stream chunks: serving.py writes their JSON as text, with no model per chunk (the event loop writes 64 a step);
# these are the schema it is tested against, byte for byte. A completion chunk is a CompletionResponse.

class DeltaMessage(BaseModel):
    role: str | None = None
    content: str | None = None
    tool_calls: list[dict] | None = None  # as the message's, each with its "index"


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_created)
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class TokenizeCompletionRequest(OpenAIBaseModel):
    """vLLM's /tokenize body for a text (the completions API's tokenization)."""
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(OpenAIBaseModel):
    """vLLM's /tokenize body for a conversation (the chat API's: through the chat template)."""
    model: str | None = None
    messages: list[ChatMessage]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template_kwargs: dict | None = None
    chat_template: str | None = None
    tools: list[dict] | None = None
    return_token_strs: bool | None = False

    def conversation(self) -> list[dict]:
        return conversation(self.messages)


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_created)
    owned_by: str = "jaxspec"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
