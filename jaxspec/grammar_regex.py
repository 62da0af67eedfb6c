"""`StructuredOutputsParams.grammar` as a regex: the grammar's language when it is regular, so the same token
automaton that runs JSON schemas and regexes (structured_output.py) runs it, on the device, lossless under
speculation.

The text is EBNF as vLLM's default backend (xgrammar) and llama.cpp's GBNF write it (`root ::= ...`), or Lark as
vLLM converts it (no `::=` anywhere: `name: ...` rules, `|` lines, `start` or the first rule as the root):

- EBNF: `name ::= alternatives`; "strings" with C escapes (\\n, \\t, \\xHH, \\uHHHH, ...), [character classes] with
  ranges and ^, `.` (any character), ( ), |, *, +, ?, {m}, {m,}, {m,n}; `#` comments. The root rule is `root`.
- Lark: "strings" or 'strings', /regexes/, [optional], x~n and x~m..n, rule names with ? / ! prefixes, priorities
  and `-> alias` (dropped); `//` and `#` comments. `%import` / `%ignore` and string or regex flags are refused.

A rule may refer to itself only as the last item of some of its alternatives (`digits ::= [0-9] digits | [0-9]`:
[0-9]*[0-9]; also inside an optional end: `list ::= item ("," list)?`) or as the first (`list ::= list "," item |
item`: item ("," item)*). Any other recursion (nested brackets, a JSON grammar) has a context-free language that no
finite automaton holds: refused, naming the cycle of rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

ANY_CHAR = r"[\x{0}-\x{10ffff}]"  # GBNF's `.`, and a negated empty class
MAX_REGEX_CHARS = 1_000_000  # a grammar that inlines to more (rules reused at depth) is refused
_REGEX_META = set("\\.+*?()|[]{}^$#&-~")  # what Rust's regex::escape escapes (outlines-core's regex engine)


class GrammarError(ValueError):
    pass


@dataclass(frozen=True)
class Node:
    kind: str  # lit, class, any, raw, ref, seq, alt, rep
    text: str = ""  # lit: the text; raw: a regex; ref: the rule's name; class: the [...] regex
    items: tuple["Node", ...] = ()  # seq / alt: the parts; rep: the one repeated
    low: int = 0  # rep
    high: int | None = None  # rep (None: no bound)


def to_regex(grammar: str) -> str:
    """The grammar's language as a regex (Rust syntax, as outlines-core reads it); GrammarError (a ValueError)
    saying what is wrong and where."""
    if not isinstance(grammar, str) or not grammar.strip():
        raise GrammarError(f"must be a non-empty string, got {grammar!r}")
    return _to_regex(grammar)


@lru_cache(maxsize=64)
def _to_regex(grammar: str) -> str:
    lark = is_lark(grammar)
    rules = _Parser(grammar, lark=lark).rules()
    root = ("start" if "start" in rules else next(iter(rules))) if lark else "root"
    if root not in rules:
        raise GrammarError(f"has no '{root}' rule (the rule the answer is)")
    for name, body in rules.items():
        for ref in _refs(body):
            if ref not in rules:
                raise GrammarError(f"rule '{name}' refers to '{ref}', which is not defined")
    return _Inliner(rules).regex(root)


def is_lark(grammar: str) -> bool:
    """vLLM's test: no line (comments aside) holds `::=`."""
    return not any("::=" in re.sub(r"(#|//).*$", "", line) for line in grammar.splitlines())


# ------------------------------------------------------------------------------------------------- parsing

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_LARK_NAME = re.compile(r"[?!]?([A-Za-z_][A-Za-z0-9_]*)(\.-?\d+)?")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a", "b": "\b", "0": "\0", "e": "\x1b"}


class _Parser:
    """A recursive-descent parser of one grammar text into {rule name: Node}, in order of definition."""

    def __init__(self, text: str, lark: bool = False):
        self.text, self.lark, self.pos = text, lark, 0

    def error(self, msg: str) -> GrammarError:
        line = self.text.count("\n", 0, self.pos) + 1
        col = self.pos - (self.text.rfind("\n", 0, self.pos) + 1) + 1
        return GrammarError(f"line {line}, column {col}: {msg}")

    def space(self, newlines: bool = True) -> None:
        """Skip blanks and comments (and line ends, where they do not end a Lark rule)."""
        comment = re.compile(r"(#|//)[^\n]*" if self.lark else r"#[^\n]*")
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in " \t\r" or (c == "\n" and newlines):
                self.pos += 1
            elif m := comment.match(self.text, self.pos):
                self.pos = m.end()
            else:
                return

    def peek(self, s: str) -> bool:
        return self.text.startswith(s, self.pos)

    def rules(self) -> dict[str, Node]:
        rules: dict[str, Node] = {}
        self.space()
        while self.pos < len(self.text):
            start = self.pos
            name = self.rule_head()
            if name in rules:
                self.pos = start
                raise self.error(f"rule '{name}' is defined twice")
            rules[name] = self.alternatives()
            self.space()
        if not rules:
            raise GrammarError("holds no rule")
        return rules

    def rule_head(self) -> str:
        if self.lark:
            if self.peek("%"):
                directive = self.text[self.pos:].split(None, 1)[0]
                raise self.error(f"Lark directives ({directive}) are not supported: write the rules out")
            m = _LARK_NAME.match(self.text, self.pos)
            sep = ":"
        else:
            m = _NAME.match(self.text, self.pos)
            sep = "::="
        if not m:
            raise self.error(f"expected a rule name followed by '{sep}'")
        name = m.group(1) if self.lark else m.group(0)
        self.pos = m.end()
        self.space(newlines=False)
        if not self.peek(sep):
            raise self.error(f"expected '{sep}' after the rule name '{name}'")
        self.pos += len(sep)
        return name

    def at_rule_end(self) -> bool:
        """EBNF: whether the next thing is the next rule's head."""
        m = _NAME.match(self.text, self.pos)
        return bool(m) and self.text[m.end():].lstrip().startswith("::=")

    def alternatives(self, depth: int = 0) -> Node:
        alts = [self.sequence(depth)]
        while True:
            save = self.pos
            self.space()
            if self.peek("|"):  # (Lark: a line that starts with | goes on with the rule)
                self.pos += 1
                alts.append(self.sequence(depth))
            else:
                self.pos = save
                break
        return _alt(alts)

    def sequence(self, depth: int) -> Node:
        """Items up to a |, a closing bracket, the next rule (EBNF: its `name ::=`; Lark: a line end outside
        brackets); none is the empty string."""
        items = []
        while True:
            self.space(newlines=bool(depth) or not self.lark)
            if self.pos >= len(self.text) or self.text[self.pos] in "|)\n" or (self.lark and self.peek("]")):
                break
            if not self.lark and self.at_rule_end():
                break
            if self.lark and self.peek("->"):  # an alias names the tree node: no effect on the language
                m = re.compile(r"->\s*[A-Za-z_][A-Za-z0-9_]*").match(self.text, self.pos)
                if not m:
                    raise self.error("expected a name after '->'")
                self.pos = m.end()
                continue
            items.append(self.postfix(self.atom(depth)))
        return _seq(items)

    def atom(self, depth: int) -> Node:
        c = self.text[self.pos]
        if c == "(":
            self.pos += 1
            if self.peek("="):
                raise self.error("lookahead assertions '(= ...)' are not supported")
            inner = self.alternatives(depth + 1)
            self.space()
            if not self.peek(")"):
                raise self.error("expected ')'")
            self.pos += 1
            return inner
        if c == '"' or (c == "'" and self.lark):
            return Node("lit", text=self.string(c))
        if c == "[":
            if self.lark:  # [x]: optional
                self.pos += 1
                inner = self.alternatives(depth + 1)
                self.space()
                if not self.peek("]"):
                    raise self.error("expected ']'")
                self.pos += 1
                return Node("rep", items=(inner,), low=0, high=1)
            return Node("class", text=self.char_class())
        if c == "/" and self.lark:
            return Node("raw", text=self.lark_regex())
        if c == "." and not self.lark:
            self.pos += 1
            return Node("any")
        m = (_LARK_NAME if self.lark else _NAME).match(self.text, self.pos)
        if m:
            self.pos = m.end()
            return Node("ref", text=m.group(1) if self.lark else m.group(0))
        raise self.error(f"unexpected {c!r}")

    def postfix(self, node: Node) -> Node:
        while True:
            save = self.pos
            while self.pos < len(self.text) and self.text[self.pos] in " \t":
                self.pos += 1
            c = self.text[self.pos:self.pos + 1]
            if not c or c not in "*+?{~":
                self.pos = save
                break
            if c in "*+?":
                self.pos += 1
                node = Node("rep", items=(node,), low=int(c == "+"), high=1 if c == "?" else None)
            elif c == "{" and not self.lark:
                m = re.compile(r"\{\s*(\d*)\s*(,?)\s*(\d*)\s*\}").match(self.text, self.pos)
                if not m or (not m.group(1) and not m.group(2)):
                    raise self.error("expected a repetition {m}, {m,}, {m,n} or {,n}")
                self.pos = m.end()
                low = int(m.group(1) or 0)
                high = low if not m.group(2) else (int(m.group(3)) if m.group(3) else None)
                if high is not None and high < low:
                    raise self.error(f"repetition {{{low},{high}}}: the upper bound is below the lower")
                node = Node("rep", items=(node,), low=low, high=high)
            elif c == "~" and self.lark:
                m = re.compile(r"~\s*(\d+)(?:\s*\.\.\s*(\d+))?").match(self.text, self.pos)
                if not m:
                    raise self.error("expected a repetition ~n or ~m..n")
                self.pos = m.end()
                low = int(m.group(1))
                high = int(m.group(2)) if m.group(2) else low
                if high < low:
                    raise self.error(f"repetition ~{low}..{high}: the upper bound is below the lower")
                node = Node("rep", items=(node,), low=low, high=high)
            else:
                self.pos = save
                break
        return node

    def escape(self) -> str:
        """The character of the escape at pos (just after the backslash)."""
        c = self.text[self.pos:self.pos + 1]
        if not c:
            raise self.error("a backslash ends the grammar")
        for prefix, digits in (("x", 2), ("u", 4), ("U", 8)):
            if c == prefix:
                h = self.text[self.pos + 1:self.pos + 1 + digits]
                if len(h) != digits or not all(x in "0123456789abcdefABCDEF" for x in h):
                    raise self.error(f"\\{prefix} needs {digits} hex digits")
                self.pos += 1 + digits
                return chr(int(h, 16))
        self.pos += 1
        return _ESCAPES.get(c, c)

    def string(self, quote: str) -> str:
        self.pos += 1
        out = []
        while True:
            if self.pos >= len(self.text) or self.text[self.pos] == "\n":
                raise self.error(f"unterminated string (no closing {quote})")
            c = self.text[self.pos]
            if c == quote:
                self.pos += 1
                break
            if c == "\\":
                self.pos += 1
                out.append(self.escape())
            else:
                out.append(c)
                self.pos += 1
        if self.lark and self.pos < len(self.text) and self.text[self.pos] == "i":
            raise self.error("string flags (the 'i' of case-insensitive strings) are not supported")
        return "".join(out)

    def char_class(self) -> str:
        """A [...] class as a regex class of \\x{...} escapes (nothing in it read as regex syntax)."""
        self.pos += 1
        negated = self.peek("^")
        self.pos += negated
        parts = []
        while True:
            if self.pos >= len(self.text):
                raise self.error("unterminated character class (no closing ])")
            if self.peek("]") and (parts or negated):
                self.pos += 1
                break
            lo = self.class_char()
            if self.peek("-") and not self.text.startswith("-]", self.pos):
                self.pos += 1
                hi = self.class_char()
                if ord(hi) < ord(lo):
                    raise self.error(f"character range {lo!r}-{hi!r} is reversed")
                parts.append(f"\\x{{{ord(lo):x}}}-\\x{{{ord(hi):x}}}")
            else:
                parts.append(f"\\x{{{ord(lo):x}}}")
        if not parts:  # [^]: any character
            return ANY_CHAR
        return "[" + "^" * negated + "".join(parts) + "]"

    def class_char(self) -> str:
        c = self.text[self.pos]
        self.pos += 1
        if c == "\\":
            return self.escape()
        return c

    def lark_regex(self) -> str:
        m = re.compile(r"/((?:[^/\\\n]|\\.)+)/([imslux]*)").match(self.text, self.pos)
        if not m:
            raise self.error("unterminated /regex/")
        if m.group(2):
            raise self.error(f"regex flags ({m.group(2)}) are not supported")
        self.pos = m.end()
        return m.group(1).replace("\\/", "/")


# ------------------------------------------------------------------------------------------------- regex

def escape(text: str) -> str:
    """`text` as a regex that matches it literally (Rust regex syntax: Python's re.escape escapes characters that
    regex-automata refuses to see escaped)."""
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


def _refs(node: Node) -> list[str]:
    if node.kind == "ref":
        return [node.text]
    return [r for item in node.items for r in _refs(item)]


def _mentions(name: str, parts: tuple[Node, ...]) -> bool:
    return any(name in _refs(part) for part in parts)


def _optional_tail(name: str, node: Node) -> tuple[Node, ...] | None:
    """Q where node is (Q name)? (Q possibly empty), else None."""
    if node.kind != "rep" or (node.low, node.high) != (0, 1):
        return None
    parts = _parts(node.items[0])
    return parts[:-1] if parts and parts[-1] == Node("ref", text=name) else None


def _alternatives(node: Node) -> tuple[Node, ...]:
    return node.items if node.kind == "alt" else (node,)


def _parts(node: Node) -> tuple[Node, ...]:
    return node.items if node.kind == "seq" else (node,)


def _seq(parts) -> Node:
    parts = tuple(parts)
    return parts[0] if len(parts) == 1 else Node("seq", items=parts)


def _alt(alts) -> Node:
    alts = tuple(alts)
    return alts[0] if len(alts) == 1 else Node("alt", items=alts)


def _without_self_recursion(name: str, body: Node) -> Node | None:
    """The rule's body with its own name gone when it is only at the end (or start) of alternatives; None when
    there is no such form (the caller reports the recursion)."""
    me = Node("ref", text=name)
    tails, heads, base = [], [], []
    for alt in _alternatives(body):
        parts = _parts(alt)
        if name not in _refs(alt):
            base.append(alt)
        elif len(parts) > 1 and parts[-1] == me and not _mentions(name, parts[:-1]):
            tails.append(_seq(parts[:-1]))
        elif len(parts) > 1 and (opt := _optional_tail(name, parts[-1])) is not None \
                and not _mentions(name, parts[:-1] + opt):
            tails.append(_seq(parts[:-1] + opt))  # P (Q R)? is P | P Q R: P is a base too
            base.append(_seq(parts[:-1]))
        elif len(parts) > 1 and parts[0] == me and not _mentions(name, parts[1:]):
            heads.append(_seq(parts[1:]))
        else:
            return None
    if not base or (tails and heads):
        return None
    if tails:  # R ::= P R | B  is  P* B
        return _seq([Node("rep", items=(_alt(tails),), low=0, high=None), _alt(base)])
    return _seq([_alt(base), Node("rep", items=(_alt(heads),), low=0, high=None)])  # R ::= R S | B  is  B S*


class _Inliner:
    """Rules inlined into one regex from the root, each rule's regex made once."""

    def __init__(self, rules: dict[str, Node]):
        self.rules = {}
        for name, body in rules.items():
            flat = _without_self_recursion(name, body) if name in _refs(body) else body
            self.rules[name] = body if flat is None else flat
        self.done: dict[str, str] = {}
        self.path: list[str] = []

    def regex(self, name: str) -> str:
        if name in self.done:
            return self.done[name]
        if name in self.path:
            cycle = " -> ".join(self.path[self.path.index(name):] + [name])
            raise GrammarError(
                f"rule '{name}' is recursive ({cycle}): its language is context-free, and jaxspec runs grammars as a "
                "finite automaton, which holds regular languages only; write the repetition with *, +, ? or {m,n}, "
                "or give the constraint as a JSON schema or a regex")
        self.path.append(name)
        out = self.emit(self.rules[name])
        self.path.pop()
        if len(out) > MAX_REGEX_CHARS:
            raise GrammarError(f"rule '{name}' inlines to a regex of over {MAX_REGEX_CHARS:,} characters")
        self.done[name] = out
        return out

    def emit(self, node: Node) -> str:
        if node.kind == "lit":
            return escape(node.text)
        if node.kind == "class":
            return node.text
        if node.kind == "any":
            return ANY_CHAR
        if node.kind == "raw":
            return "(" + node.text + ")"
        if node.kind == "ref":
            return "(" + self.regex(node.text) + ")"
        if node.kind == "seq":
            return "".join("(" + r + ")" if item.kind == "alt" else r
                           for item, r in zip(node.items, map(self.emit, node.items)))
        if node.kind == "alt":
            return "|".join(self.emit(item) for item in node.items)
        inner = self.emit(node.items[0])  # rep
        if node.items[0].kind not in ("class", "any", "ref", "raw") and not (
                node.items[0].kind == "lit" and len(node.items[0].text) == 1):
            inner = "(" + inner + ")"
        if (node.low, node.high) == (0, None):
            return inner + "*"
        if (node.low, node.high) == (1, None):
            return inner + "+"
        if (node.low, node.high) == (0, 1):
            return inner + "?"
        return inner + ("{%d}" % node.low if node.high == node.low else
                        "{%d,}" % node.low if node.high is None else "{%d,%d}" % (node.low, node.high))
