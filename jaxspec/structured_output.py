"""Structured outputs (vLLM's `StructuredOutputsParams`): a request's JSON schema, regex or choice compiled on the host
into a token automaton that the device walks (engine/grammar.py), so that the fused step masks every verified
position, drafts included, without a host round trip.

The automaton is outlines-core's `Index` (vLLM's "outlines" backend): a DFA over the tokenizer's tokens, built from
a regex. A JSON schema becomes a regex by outlines-core's `build_regex_from_schema`, `json_object` by the schema
{"type": "object"} (nesting bounded, as that function bounds it), `choice` by the alternation of the escaped
choices, a `grammar` (EBNF or Lark, as vLLM takes them) by grammar_regex.py when its language is regular; a grammar
that nests (recursion a finite automaton cannot hold) and structural tags need a pushdown automaton: refused by name
before anything runs. In a final state the model's EOS tokens are allowed (and keep the state); a state that
allows nothing but them ends the answer.

Building an automaton takes milliseconds for a typical schema and seconds for a large one (json_object over a 49k
vocabulary: ~7 s); outlines-core releases the GIL meanwhile, so `Compiler` builds on a thread: a request waits up
to COMPILE_WAIT_S for it (its errors are then raised before anything runs), and past that waits in the queue
while the engine steps the others (LLMEngine settles it, aborting the request if the build fails).
"""

from __future__ import annotations

import dataclasses
import json as json_module
import logging
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxspec import grammar_regex
from jaxspec.grammar_regex import escape

logger = logging.getLogger("jaxspec")

CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
BACKENDS = ("auto", "outlines", "xgrammar", "guidance", "lm-format-enforcer")  # vLLM's names; outlines-core runs all
CACHE_SIZE = 128  # compiled automata kept per engine (vLLM keeps 128 outlines indexes)
END_MARK = "\U0010fffd".encode()  # a private-use character no tokenizer has: end_marked
END_MARK_REGEX = r"\x{10fffd}"
COMPILE_WAIT_S = 0.5  # how long adding a request waits for its automaton before leaving it to build on its own


@dataclass
class StructuredOutputsParams:
    """vLLM's: exactly one of json (a schema, as a dict or its JSON text), regex, choice, json_object, grammar (a
    regular one: grammar_regex.py) or structural_tag (refused: see the module's docstring); the options shape the
    JSON's whitespace."""
    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """A ValueError naming the field: one constraint, of the right type, that this engine supports."""
        owner = type(self).__name__
        if hasattr(self.json, "model_json_schema"):  # a pydantic model class, as vLLM takes it
            self.json = self.json.model_json_schema()
        given = self._given()
        if len(given) != 1:
            raise ValueError(f"{owner} needs exactly one constraint of {', '.join(CONSTRAINTS)}; got "
                             f"{', '.join(given) or 'none'}")
        kind = given[0]
        if kind == "structural_tag":
            raise ValueError(f"{owner}.structural_tag is not supported: jaxspec compiles regular constraints (json, "
                             "regex, choice, json_object, a grammar without nesting) to a token automaton; structural "
                             "tags need a pushdown automaton")
        if kind == "grammar":
            try:
                grammar_regex.to_regex(self.grammar)
            except grammar_regex.GrammarError as e:
                raise ValueError(f"{owner}.grammar: {e}") from None
        if kind == "json" and not isinstance(self.json, (str, dict)):
            raise ValueError(f"{owner}.json must be a JSON schema (a dict or its JSON text), got "
                             f"{type(self.json).__name__}")
        if kind == "json" and isinstance(self.json, str):
            try:
                json_module.loads(self.json)
            except json_module.JSONDecodeError as e:
                raise ValueError(f"{owner}.json is not valid JSON: {e}") from None
        if kind == "regex" and (not isinstance(self.regex, str) or not self.regex):
            raise ValueError(f"{owner}.regex must be a non-empty string, got {self.regex!r}")
        if kind == "choice" and (not isinstance(self.choice, (list, tuple)) or not self.choice
                                 or not all(isinstance(c, str) and c for c in self.choice)):
            raise ValueError(f"{owner}.choice must be a non-empty list of non-empty strings, got {self.choice!r}")
        if kind == "json_object" and self.json_object is not True:
            raise ValueError(f"{owner}.json_object must be True or None, got {self.json_object!r}")
        for name in ("disable_fallback", "disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{owner}.{name} must be a bool, got {getattr(self, name)!r}")
        if self.whitespace_pattern is not None and not isinstance(self.whitespace_pattern, str):
            raise ValueError(f"{owner}.whitespace_pattern must be a string, got {self.whitespace_pattern!r}")

    def _given(self) -> list[str]:
        return [name for name in CONSTRAINTS if getattr(self, name) not in (None, False)]

    @property
    def kind(self) -> str:
        """The one constraint given (validate)."""
        return self._given()[0]

    def to_regex(self) -> str:
        """The constraint as the regex outlines-core compiles."""
        from outlines_core.json_schema import build_regex_from_schema

        kind = self.kind
        if kind == "regex":
            return unanchored(self.regex)
        if kind == "choice":
            return "(" + "|".join(escape(c) for c in self.choice) + ")"
        if kind == "grammar":
            return grammar_regex.to_regex(self.grammar)
        schema = {"type": "object"} if kind == "json_object" else self.json
        if isinstance(schema, str):
            schema = json_module.loads(schema)
        if self.disable_additional_properties:
            schema = _closed(schema)
        whitespace = "" if self.disable_any_whitespace else self.whitespace_pattern
        try:
            return build_regex_from_schema(json_module.dumps(schema), whitespace)
        except (ValueError, TypeError, RuntimeError) as e:
            raise ValueError(f"{type(self).__name__}.{kind}: cannot turn the schema into a regex ({e})") from None


@dataclass
class GuidedDecodingParams(StructuredOutputsParams):
    """vLLM's name before 0.11 (`SamplingParams(guided_decoding=...)`), with its `backend` field: every backend's
    constraint means the same output language here, so any of vLLM's backend names is accepted."""
    backend: str | None = None

    def validate(self) -> None:
        super().validate()
        if self.backend is not None and self.backend.split(":")[0] not in BACKENDS:
            raise ValueError(f"GuidedDecodingParams.backend must be one of {', '.join(BACKENDS)}, got "
                             f"{self.backend!r}")


@dataclass
class StructuredOutputsConfig:
    """vLLM's engine-wide settings (`LLM(structured_outputs_config={...})`): the backend's name (any of vLLM's: one
    automaton compiler runs them all), whitespace and additionalProperties defaults for every request; plus
    jaxspec's device pool of automata: max_states and max_transitions (0: sized from the vocabulary, as
    EngineConfig.grammar_max_transitions says; EngineConfig.grammar_states / grammar_transitions)."""
    backend: str = "auto"
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    reasoning_parser: str = ""
    enable_in_reasoning: bool = False
    max_states: int = 4096
    max_transitions: int = 0

    @classmethod
    def parse(cls, value: "dict | StructuredOutputsConfig | None") -> "StructuredOutputsConfig":
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"structured_outputs_config must be a dict, got {type(value).__name__}")
        unknown = sorted(set(value) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"structured_outputs_config: unknown keys {unknown} (known: "
                             f"{', '.join(cls.__dataclass_fields__)})")
        config = cls(**value)
        if config.backend.split(":")[0] not in BACKENDS:
            raise ValueError(f"structured_outputs_config backend must be one of {', '.join(BACKENDS)}, got "
                             f"{config.backend!r}")
        if config.reasoning_parser or config.enable_in_reasoning:
            raise ValueError("structured_outputs_config reasoning_parser / enable_in_reasoning are not supported: "
                             "jaxspec has no reasoning parsers")
        for name in ("max_states", "max_transitions"):
            v = getattr(config, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"structured_outputs_config {name} must be an integer >= 0, got {v!r}")
        return config

    def applied(self, params: StructuredOutputsParams) -> StructuredOutputsParams:
        """A request's params with the engine's whitespace / additionalProperties defaults (when it sets neither)."""
        if not (self.disable_any_whitespace or self.disable_additional_properties):
            return params
        return dataclasses.replace(
            params, disable_any_whitespace=params.disable_any_whitespace or self.disable_any_whitespace,
            disable_additional_properties=params.disable_additional_properties or self.disable_additional_properties)


def unanchored(regex: str) -> str:
    """The regex without a leading ^ (or \\A) and a trailing $ (or \\z): the whole answer matches it anyway, as
    vLLM's default backend reads such anchors, while outlines-core refuses them."""
    for start in ("^", "\\A"):
        if regex.startswith(start):
            regex = regex[len(start):]
            break
    for end in ("$", "\\z"):
        head = regex[:-len(end)]
        if regex.endswith(end) and (len(head) - len(head.rstrip("\\"))) % 2 == 0:  # not an escaped $
            regex = head
            break
    return regex


def _closed(schema: Any) -> Any:
    """The schema with additionalProperties false on every object that does not say (vLLM's
    disable_additional_properties)."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if out.get("type") == "object" and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


@dataclass
class Automaton:
    """A constraint's token DFA as flat arrays (states numbered 0..n-1, local to it; engine/grammar.py places them
    in the device pool): the allowed tokens of each state as bits, its transitions as (token, next state) rows
    sorted by token, and whether it allows only end tokens (the answer must end there)."""
    initial: int
    allowed: np.ndarray  # [n, ceil(V / 32)] uint32: bit t % 32 of word t // 32 is token t
    row_start: np.ndarray  # [n] int32: state s's transitions are tokens[row_start[s]:row_start[s] + row_len[s]]
    row_len: np.ndarray  # [n] int32
    only_end: np.ndarray  # [n] bool
    tokens: np.ndarray  # [E] int32, sorted within each state's row
    next: np.ndarray  # [E] int32

    @property
    def num_states(self) -> int:
        return len(self.row_len)

    @property
    def num_transitions(self) -> int:
        return len(self.tokens)

    def step(self, state: int, token: int) -> int:
        """The state after `token` (-1: the token is not allowed there)."""
        start, length = self.row_start[state], self.row_len[state]
        i = start + int(np.searchsorted(self.tokens[start:start + length], token))
        return int(self.next[i]) if i < start + length and self.tokens[i] == token else -1

    def walk(self, tokens: list[int]) -> int:
        """The state after these tokens from the initial one (a preempted request's, recomputed); -1 if one is not
        allowed (an output the device never makes)."""
        state = self.initial
        for t in tokens:
            if state < 0:
                break
            state = self.step(state, t)
        return state


def build_automaton(transitions: dict[int, dict[int, int]], initial: int, final: set[int], end_ids: set[int],
                    vocab_size: int) -> Automaton:
    """outlines-core's index (state -> {token -> next state}) as an Automaton, states renumbered in sorted order;
    `end_ids` (the model's EOS tokens) allowed in every final state, keeping it."""
    states = sorted(set(transitions) | {initial} | set(final)
                    | {n for row in transitions.values() for n in row.values()})
    number = {s: i for i, s in enumerate(states)}
    ends = np.array(sorted(t for t in end_ids if t < vocab_size), np.int64)
    rows_t, rows_n = [], []
    for s in states:
        row = {t: n for t, n in transitions.get(s, {}).items() if t < vocab_size}
        t = np.fromiter(row.keys(), np.int64, len(row))
        n = np.fromiter((number[x] for x in row.values()), np.int64, len(row))
        if s in final:
            extra = np.setdiff1d(ends, t)
            t, n = np.concatenate([t, extra]), np.concatenate([n, np.full(len(extra), number[s])])
        order = np.argsort(t, kind="stable")
        rows_t.append(t[order])
        rows_n.append(n[order])
    row_len = np.array([len(t) for t in rows_t], np.int32)
    row_start = np.concatenate([[0], np.cumsum(row_len)[:-1]]).astype(np.int32)
    tokens = np.concatenate(rows_t).astype(np.int32) if rows_t else np.zeros(0, np.int32)
    words = (vocab_size + 31) // 32
    allowed = np.zeros((len(states), words * 32), bool)
    allowed[np.repeat(np.arange(len(states)), row_len), tokens] = True
    allowed = np.packbits(allowed, axis=1, bitorder="little").view("<u4").astype(np.uint32)
    only_end = np.array([len(t) > 0 and np.isin(t, ends).all() for t in rows_t], bool)
    return Automaton(initial=number[initial], allowed=allowed, row_start=row_start, row_len=row_len,
                     only_end=only_end, tokens=tokens, next=np.concatenate(rows_n).astype(np.int32))


def end_marked(transitions: dict[int, dict[int, int]], index_final: set[int], initial: int, mark_id: int,
               eos: int) -> tuple[dict[int, dict[int, int]], set[int]]:
    """outlines-core's index of `(?:regex)END_MARK` over a vocabulary holding END_MARK as token `mark_id` -> the
    regex's own (transitions, final states).

    outlines-core (0.2.x) drops every token that leads from an accepting state to a state that is not accepting
    (regex-automata reports a match one byte late, and the index tests the state after the token for a match):
    `(ab)*` would allow "ab" but never "a" then "b", and `[0-9]+(\\.[0-9]+)?` no "." after a whole number. With
    the mark after the regex no state inside it accepts, so every token is kept; a state is final where the mark
    completes a match from it. The mark's edges and the index's EOS loops go, then every state that is not on a
    path from the initial state to a final one (the bytes of the mark read as tokens, say)."""
    final = {s for s, row in transitions.items() if row.get(mark_id) in index_final}
    rows = {s: {t: n for t, n in row.items() if t not in (mark_id, eos)} for s, row in transitions.items()}
    reached, todo = {initial}, [initial]
    while todo:
        for n in rows.get(todo.pop(), {}).values():
            if n not in reached:
                reached.add(n)
                todo.append(n)
    live, grew = final & reached, True
    while grew:  # the reached states from which a final state is reachable
        grew = False
        for s in reached - live:
            if any(n in live for n in rows.get(s, {}).values()):
                live.add(s)
                grew = True
    return {s: {t: n for t, n in rows.get(s, {}).items() if n in live} for s in live}, final & live


def token_bytes(tokenizer: Any) -> dict[bytes, list[int]]:
    """Each ordinary token's bytes -> its ids (special tokens left out), as vLLM's outlines backend reads a
    tokenizer: the token's text, a space for SentencePiece's leading "▁", and the raw byte for byte tokens
    (<0xXX>, or a byte-level BPE token that is not whole UTF-8)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    unicode_to_byte = {v: k for k, v in bytes_to_unicode().items()}
    special = set(tokenizer.all_special_tokens)
    vocab: dict[bytes, list[int]] = {}
    for token, index in tokenizer.get_vocab().items():
        if token in special:
            continue
        text = tokenizer.convert_tokens_to_string([token])
        if token.startswith("\u2581") or token == "<0x20>":
            text = " " + text
        if not text:
            continue
        if "\ufffd" in text:
            if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                data = bytes([int(token[3:5], 16)])
            elif all(c in unicode_to_byte for c in token):
                data = bytes(unicode_to_byte[c] for c in token)
            else:
                data = text.encode()
        else:
            data = text.encode()
        vocab.setdefault(data, []).append(index)
    return vocab


class Compiler:
    """One tokenizer's constraints -> Automata, with an LRU cache of the last CACHE_SIZE (a server sees the same
    schema again and again; json_object takes seconds on a 49k vocabulary)."""

    def __init__(self, tokenizer: Any, vocab_size: int, end_ids: set[int]):
        self.tokenizer, self.vocab_size, self.end_ids = tokenizer, vocab_size, set(end_ids)
        self._vocabulary = None
        self._cache: OrderedDict[str, Automaton] = OrderedDict()
        self._building: dict[str, Future] = {}  # regex -> its build on the thread
        self._thread: ThreadPoolExecutor | None = None

    def compile(self, params: StructuredOutputsParams,
                wait_s: float | None = None) -> tuple[str, Automaton | Future]:
        """(the constraint's cache key, its automaton), or a Future of it when building takes longer than wait_s
        (None: as long as it takes); a ValueError naming the field when it cannot be built in time."""
        regex = params.to_regex()
        if regex in self._cache:
            self._cache.move_to_end(regex)
            return regex, self._cache[regex]
        self.vocabulary()  # (its errors now, on this thread)
        future = self._building.get(regex)
        if future is None:
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="jaxspec-automaton")
            what = f"{type(params).__name__}.{params.kind}"
            future = self._building[regex] = self._thread.submit(self._build, regex, what)
        try:
            return regex, self.settle(regex, future, wait_s)
        except TimeoutError:
            return regex, future

    def settle(self, regex: str, future: Future, wait_s: float | None = 0) -> Automaton:
        """A build's automaton, cached (TimeoutError: not done in wait_s; its ValueError if it failed)."""
        try:
            automaton = future.result(timeout=wait_s)
        finally:
            if future.done():  # built or failed: no longer building
                self._building.pop(regex, None)
        self._cache[regex] = automaton
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return automaton

    def _build(self, regex: str, what: str) -> Automaton:
        from outlines_core import Index

        try:
            index = Index(f"(?:{regex}){END_MARK_REGEX}", self.vocabulary())
        except (ValueError, TypeError, RuntimeError):
            index = None  # (a vocabulary with some of the mark's bytes as tokens but not all: the index as it is)
        if index is not None:
            initial = index.get_initial_state()
            transitions, final = end_marked(index.get_transitions(), set(index.get_final_states()), initial,
                                            self.vocab_size, min(self.end_ids))
            if initial not in transitions:
                raise ValueError(f"{what}: {_short(regex)!r} allows no text made of this tokenizer's tokens")
            return build_automaton(transitions, initial, final, self.end_ids, self.vocab_size)
        logger.warning("%s: outlines-core's index of %r with an end mark failed; the plain index refuses tokens that "
                       "leave an accepting state for one that is not", what, _short(regex))
        try:
            index = Index(regex, self.vocabulary())
        except (ValueError, TypeError, RuntimeError) as e:
            raise ValueError(f"{what}: cannot compile {_short(regex)!r} over this tokenizer ({e})") from None
        return build_automaton(index.get_transitions(), index.get_initial_state(), set(index.get_final_states()),
                               self.end_ids, self.vocab_size)

    def vocabulary(self):
        if self._vocabulary is None:
            from outlines_core import Vocabulary

            if not self.end_ids:
                raise ValueError("structured outputs need the model's EOS token id (its generation_config.json or "
                                 "tokenizer), which this model does not give")
            eos = min(self.end_ids)
            vocab = {data: [i for i in ids if i != eos and i < self.vocab_size]
                     for data, ids in token_bytes(self.tokenizer).items()}
            vocab[END_MARK] = vocab.get(END_MARK, []) + [self.vocab_size]  # end_marked's token (see there)
            self._vocabulary = Vocabulary(eos, {data: ids for data, ids in vocab.items() if ids})
        return self._vocabulary


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
