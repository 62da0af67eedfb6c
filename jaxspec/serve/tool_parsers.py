"""Tool calls in a model's text (vLLM's --tool-call-parser): the OpenAI `tool_calls` an answer makes, and the text
around them.

    hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks (Hermes, Qwen); the text before the
                 first block is the message's content
    llama3_json  the answer is one JSON object {"name": ..., "parameters" | "arguments": {...}}, or several joined
                 by "; ", optionally after <|python_tag|> (Llama 3.1 / 3.2 with JSON tool calling)
    pythonic     the answer is a Python list of calls with keyword arguments of literal values,
                 [get_weather(city="Paris"), now()] (Llama 3.2 with the pythonic template); read with `ast`, never
                 run

A forced call (tool_choice "required" or a named function, vLLM's) needs no parser flag: the answer is constrained
to the JSON of the call (`forced_schema`, a structured output) and `ForcedParser` reads it: the named function's
arguments, or a list of {"name", "parameters"}.

A text that does not parse is plain content, as in vLLM. Streaming: `StreamSplitter` passes text through until a
call may have started (holding back a possible start marker), then holds the rest until the answer ends, when
`parse` decides: the calls as one delta each, or the held text as content.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI's API carries it
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"chatcmpl-tool-{uuid.uuid4().hex}"

    def as_dict(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _call(obj: dict, args_key: tuple[str, ...]) -> ToolCall:
    args = next(obj[k] for k in args_key if k in obj)
    return ToolCall(str(obj["name"]), args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


class HermesParser:
    start = "<tool_call>"
    _blocks = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)

    def starts_call(self, text: str) -> int:
        """Where a call starts in `text` (-1: none yet)."""
        return text.find(self.start)

    def may_start(self, tail: str) -> bool:
        """Whether `tail` (the end of the text so far) could be the beginning of a call's start."""
        return self.start.startswith(tail)

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls); no calls when there are none or they do not parse."""
        at = text.find(self.start)
        if at < 0:
            return text, []
        try:
            calls = [_call(json.loads(a or b), ("arguments",)) for a, b in self._blocks.findall(text)]
        except (ValueError, KeyError, TypeError, StopIteration):
            return text, []
        return text[:at] or None, calls


class Llama3JsonParser:
    bot = "<|python_tag|>"

    def starts_call(self, text: str) -> int:
        return 0 if text.startswith(self.bot) or text.startswith("{") else -1

    def may_start(self, tail: str) -> bool:
        return self.bot.startswith(tail)

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        if self.starts_call(text) < 0:
            return text, []
        decoder, calls = json.JSONDecoder(), []
        at = len(self.bot) if text.startswith(self.bot) else 0
        try:
            while at < len(text):
                obj, end = decoder.raw_decode(text[at:])
                calls.append(_call(obj, ("arguments", "parameters")))
                at += end + len("; ")
        except (ValueError, KeyError, TypeError, StopIteration):
            return text, []
        return None, calls


class PythonicParser:
    def starts_call(self, text: str) -> int:
        return 0 if text.startswith("[") else -1

    def may_start(self, tail: str) -> bool:
        return False

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        if self.starts_call(text) < 0:
            return text, []
        try:
            tree = ast.parse(text.strip(), mode="eval").body
            if not isinstance(tree, ast.List) or not tree.elts:
                return text, []
            calls = [self._call(node) for node in tree.elts]
        except (SyntaxError, ValueError, RecursionError, MemoryError):  # (nesting deeper than the parser goes)
            return text, []
        return None, calls

    def _call(self, node: ast.expr) -> ToolCall:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            raise ValueError("not a call of a name with keyword arguments")
        args = {k.arg: self._value(k.value) for k in node.keywords}
        if None in args:
            raise ValueError("**kwargs")
        return ToolCall(node.func.id, json.dumps(args, ensure_ascii=False))

    def _value(self, node: ast.expr):
        """A literal (constants, lists, dicts of them, as vLLM's parser reads them), or ValueError."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List):
            return [self._value(v) for v in node.elts]
        if isinstance(node, ast.Dict) and None not in node.keys:
            return {self._value(k): self._value(v) for k, v in zip(node.keys, node.values)}
        raise ValueError(f"not a literal: {ast.dump(node)[:60]}")


PARSERS = {"hermes": HermesParser, "llama3_json": Llama3JsonParser, "pythonic": PythonicParser}


class ForcedParser:
    """The answer to a forced tool choice is the call itself (module docstring); one cut short by max_tokens does
    not parse and stays content."""

    def __init__(self, name: str | None = None):
        self.name = name  # the named function; None: "required", a list of calls

    def starts_call(self, text: str) -> int:
        return 0

    def may_start(self, tail: str) -> bool:
        return True

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        try:
            value = json.loads(text)
            if self.name is not None:
                calls = [ToolCall(self.name, text)] if isinstance(value, dict) else []
            else:
                calls = [ToolCall(str(c["name"]), json.dumps(c["parameters"], ensure_ascii=False)) for c in value]
        except (ValueError, KeyError, TypeError):
            calls = []
        return ("", calls) if calls else (text, [])


def forced_schema(tools: list[dict], choice: str | dict) -> dict:
    """The JSON schema of a forced call's answer: the named function's parameters, or ("required") a non-empty
    list of {"name": one of the tools, "parameters": its parameters}. A ValueError names what is missing."""
    functions = {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f"tools[{i}] needs a function with a name")
        functions[function["name"]] = function.get("parameters") or {"type": "object", "properties": {}}
    if choice == "required":
        return {"type": "array", "minItems": 1, "items": {"anyOf": [
            {"type": "object", "properties": {"name": {"type": "string", "enum": [name]}, "parameters": params},
             "required": ["name", "parameters"]} for name, params in functions.items()]}}
    name = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    if name not in functions:
        raise ValueError(f"tool_choice names the function {name!r}, which is not among the tools")
    return functions[name]


class StreamSplitter:
    """One streamed choice's text: what can go out as content now, and what is held as a possible tool call."""

    def __init__(self, parser):
        self.parser = parser
        self.text = ""  # everything so far
        self.sent = 0  # characters sent as content
        self.calling = False  # a call has started: nothing more goes out before the end

    def feed(self, delta: str) -> str:
        """The content that can go out after `delta` arrives."""
        self.text += delta
        if self.calling:
            return ""
        at = self.parser.starts_call(self.text)
        if at >= 0 and at >= self.sent:
            self.calling = True
            return self._send(at)
        keep = next((k for k in range(min(len(self.text) - self.sent, 32), 0, -1)
                     if self.parser.may_start(self.text[-k:])), 0)
        return self._send(len(self.text) - keep)

    def _send(self, upto: int) -> str:
        out, self.sent = self.text[self.sent:upto], max(self.sent, upto)
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """At the answer's end: (the held content still to send, the calls)."""
        content, calls = self.parser.parse(self.text)
        if calls:
            held = (content or "")[self.sent:]
            self.sent = len(self.text)
            return held, calls
        return self._send(len(self.text)), []
