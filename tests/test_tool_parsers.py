"""Tool calls (vLLM's --tool-call-parser hermes / llama3_json): parsed from answers as vLLM parses them, streamed
with a possible call held back at every split of the text, rendered in OpenAI's formats; tool messages reach the
chat template."""

from __future__ import annotations

import json

import pytest

from jaxspec import CompletionOutput, RequestOutput
from jaxspec.serve import protocol as api
from jaxspec.serve.serving import ChatFormat, EngineInputs
from jaxspec.serve.tool_parsers import HermesParser, Llama3JsonParser, PythonicParser, StreamSplitter

WEATHER = {"city": "Paris", "unit": "°C"}
HERMES = ('Let me check. <tool_call>\n{"name": "weather", "arguments": ' + json.dumps(WEATHER) + '}\n</tool_call>'
          '<tool_call>{"name": "time", "arguments": {}}</tool_call>')
LLAMA = '{"name": "weather", "parameters": ' + json.dumps(WEATHER) + '}; {"name": "time", "parameters": {}}'
PYTHONIC = '[weather(city="Paris", unit="°C"), time()]'
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("weather", "time")]


@pytest.mark.parametrize("parser,text,content", [
    (HermesParser(), HERMES, "Let me check. "), (Llama3JsonParser(), LLAMA, None),
    (Llama3JsonParser(), "<|python_tag|>" + LLAMA, None), (PythonicParser(), PYTHONIC, None)])
def test_calls_are_parsed(parser, text, content):
    got_content, calls = parser.parse(text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("weather", WEATHER), ("time", {})]
    assert all(c.id.startswith("chatcmpl-tool-") for c in calls) and len({c.id for c in calls}) == 2


@pytest.mark.parametrize("parser,text", [
    (HermesParser(), "no calls here"), (HermesParser(), "<tool_call>{not json}</tool_call>"),
    (HermesParser(), '<tool_call>{"arguments": {}}</tool_call>'),  # no name
    (Llama3JsonParser(), "The answer is {x}."), (Llama3JsonParser(), '{"name": "weather"'),
    (Llama3JsonParser(), ' {"name": "a", "parameters": {}}'),  # vLLM's rule: the answer starts with the call
    (PythonicParser(), "[1, 2, 3] are numbers"), (PythonicParser(), "[f(x)]"),  # positional: not a tool call
    (PythonicParser(), "[f(a=__import__('os').system('x'))]"),  # only literals; nothing is ever run
    (PythonicParser(), "[f(**k)]"), (PythonicParser(), "[]"), (PythonicParser(), "[" * 100_000)])
def test_what_does_not_parse_is_content(parser, text):
    assert parser.parse(text) == (text, [])


@pytest.mark.parametrize("parser,text", [
    (HermesParser(), HERMES), (Llama3JsonParser(), LLAMA), (HermesParser(), "a <tool> b <tool_c"),
    (Llama3JsonParser(), "<|python_tag|>" + LLAMA), (Llama3JsonParser(), "<|pyt and not a call"),
    (HermesParser(), "<tool_call>{broken"), (PythonicParser(), PYTHONIC), (PythonicParser(), "[not a call")])
def test_streaming_holds_a_call_back_at_every_split(parser, text):
    """Whatever the deltas, the content sent is the parse's content (all the text when nothing parses), never a
    piece of a call, and the calls come at the end."""
    want_content, want_calls = parser.parse(text)
    for cut in range(len(text) + 1):
        for step in (1, 3, len(text) or 1):  # one cut, then pieces of `step` characters
            pieces = [text[:cut]] + [text[i:i + step] for i in range(cut, len(text), step)]
            splitter = StreamSplitter(parser)
            sent = "".join(splitter.feed(p) for p in pieces)
            if want_calls:
                assert parser.starts_call(text) < 0 or len(sent) <= max(parser.starts_call(text), 0)
            held, calls = splitter.finish()
            assert sent + held == (want_content or "" if want_calls else text)
            assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in want_calls]


def _format(stream: bool, parallel: bool | None = None) -> ChatFormat:
    req = api.ChatCompletionRequest(messages=[{"role": "user", "content": "weather?"}], tools=TOOLS, stream=stream,
                                    parallel_tool_calls=parallel)
    return ChatFormat("chatcmpl-1", "m", req, EngineInputs([("r", {}, None)], [2]), None, tool_parser="hermes")


def _output(text: str, finish: str | None) -> RequestOutput:
    return RequestOutput("r", None, [0, 1], outputs=[CompletionOutput(0, text, [5], finish_reason=finish,
                                                                      stop_reason=None)], finished=finish is not None)


def test_responses_carry_openai_tool_calls():
    fmt = _format(False)
    fmt.add([_output(HERMES[:20], None)])
    fmt.add([_output(HERMES[20:], "stop")])
    (choice,) = fmt.response()["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me check. "
    calls = choice["message"]["tool_calls"]
    assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("function", "weather", WEATHER), ("function", "time", {})]
    single = _format(False, parallel=False)
    single.add([_output(HERMES, "stop")])
    assert len(single.response()["choices"][0]["message"]["tool_calls"]) == 1  # vLLM keeps the first
    plain = _format(False)
    plain.add([_output("It is sunny.", "stop")])
    (choice,) = plain.response()["choices"]
    assert choice["message"] == {"role": "assistant", "content": "It is sunny.", "tool_calls": None}
    assert choice["finish_reason"] == "stop"


def test_streamed_tool_calls():
    fmt = _format(True)
    events = [json.loads(e)["choices"][0] for part, end in ((HERMES[:16], None), (HERMES[16:], "stop"))
              for e in fmt.chunks([_output(part, end)])]
    content = "".join(e["delta"].get("content") or "" for e in events)
    calls = [c for e in events for c in e["delta"].get("tool_calls") or []]
    assert content == "Let me check. " and [e["finish_reason"] for e in events][-1] == "tool_calls"
    assert [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (0, "weather", WEATHER), (1, "time", {})]
    assert all(e["finish_reason"] is None for e in events[:-1])


def test_tool_messages_reach_the_template():
    """An assistant's earlier calls (arguments as objects, as vLLM gives templates) and the tool's answer."""
    req = api.ChatCompletionRequest(messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": json.dumps(WEATHER)}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1", "name": "weather"}], tools=TOOLS)
    conv = req.conversation()
    assert conv[1]["tool_calls"][0]["function"]["arguments"] == WEATHER
    assert conv[2] == {"role": "tool", "content": "sunny", "name": "weather", "tool_call_id": "c1"}
    assert req.tool_choice_mode() == "auto"
    assert api.ChatCompletionRequest(messages=conv[:1], tools=TOOLS, tool_choice="none").tool_choice_mode() == "none"


def test_pythonic_arguments_are_literals():
    (call,) = PythonicParser().parse('[search(query="a b", limit=3, exact=True, tags=["x", "y"], opts={"k": None})]')[1]
    assert call.name == "search" and json.loads(call.arguments) == {
        "query": "a b", "limit": 3, "exact": True, "tags": ["x", "y"], "opts": {"k": None}}


def test_forced_calls_are_read_and_cut_answers_stay_content():
    """A forced call's answer (tool_choice named or "required") is the call; an answer that is not one (cut by
    max_tokens, or JSON of another shape) stays content."""
    from jaxspec.serve.tool_parsers import ForcedParser

    named = ForcedParser("get")
    content, calls = named.parse('{"city": "P"}')
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("get", '{"city": "P"}')]
    content, calls = ForcedParser().parse('[{"name": "get", "parameters": {"city": "P"}}, {"name": "now", '
                                          '"parameters": {}}]')
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("get", {"city": "P"}),
                                                                                    ("now", {})]
    for parser, text in [(named, '{"city": "P'), (named, "[1]"), (ForcedParser(), '[{"name": "get"'),
                         (ForcedParser(), '[{"nam": 1}]')]:
        assert parser.parse(text) == (text, [])
