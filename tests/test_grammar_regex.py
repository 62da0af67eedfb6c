"""Grammars (vLLM's `StructuredOutputsParams.grammar`, EBNF or Lark) as regexes: each test grammar's language is
checked against strings written by hand (in and out of it), through Python's re and through the automaton
outlines-core builds from the same regex (as the engine builds it); what a finite automaton cannot hold is refused
by name."""

from __future__ import annotations

import re

import pytest

from jaxspec.grammar_regex import GrammarError, is_lark, to_regex
from jaxspec.structured_output import END_MARK, END_MARK_REGEX, end_marked

SQL_EBNF = """
    root ::= select_statement

    select_statement ::= "SELECT " column " from " table " where " condition

    column ::= "col_1 " | "col_2 "

    table ::= "table_1 " | "table_2 "

    condition ::= column "= " number

    number ::= "1 " | "2 "
"""
SQL_LARK = """
?start: select_statement
?select_statement: "SELECT " column_list " FROM " table_name
?column_list: column_name ("," column_name)*
?table_name: identifier
?column_name: identifier
?identifier: /[a-zA-Z_][a-zA-Z0-9_]*/
"""
CASES = [  # grammar, in its language, not in it
    (SQL_EBNF, ["SELECT col_1  from table_2  where col_2 = 1 "],
     ["SELECT col_1 from table_2 where col_2 = 1", "SELECT col_3  from table_1  where col_1 = 1 "]),
    (SQL_LARK, ["SELECT a,b_2 FROM t", "SELECT _x FROM users"], ["SELECT a, b FROM t", "SELECT 1a FROM t"]),
    ('root ::= digits  # a comment\ndigits ::= [0-9] digits | [0-9]', ["7", "0123"], ["", "1a"]),
    ('root ::= list\nlist ::= list "," item | item\nitem ::= [a-z]+', ["a", "ab,c,d"], ["", "a,", ",a"]),
    ('root ::= item ("," root)?\nitem ::= "i" | "j"', ["i", "i,j,i"], ["i,", ""]),
    ('root ::= item "," root?\nitem ::= "i"', ["i,", "i,i,"], ["i", "i,i"]),
    ('root ::= "a" . [^"\\\\] "\\x41\\n" {2,3}', ['a!bA\nA\n', 'a\n?A\nA\nA\n'], ['a!"A\nA\n', 'a!bA\n']),
    ('root ::= ("ab" | "c"){2,} "x"{,3} "y"?', ["abc", "ccxxxy"], ["ab", "ccxxxx"]),
    ('root ::= [a-c\\]-]* "\\u00e9"', ["a]-c\u00e9", "\u00e9"], ["d\u00e9", "a"]),
    ('root ::= "" | "a"{3}', ["", "aaa"], ["a", "aaaa"]),
    (r'root ::= w-c+ (" " w-c+)*  # words' + "\n" + r'w-c ::= [a-c\]\\]', ["ab] \\c", "]"], ["a  b", "d", "a "]),
    ("start: 'a' [b] | 'c'\n    | 'd' -> dd\nb: \"x\"~2..3", ["a", "axx", "axxx", "c", "d"], ["ax", "ac"]),
]


def python_regex(regex: str) -> str:
    """The emitted regex (Rust syntax) in Python's: \\x{h} escapes are the only difference in what is emitted."""
    return re.sub(r"\\x\{([0-9a-f]+)\}", lambda m: "\\U%08x" % int(m.group(1), 16), regex)


@pytest.mark.parametrize("grammar,members,others", CASES)
def test_languages(grammar, members, others):
    regex = python_regex(to_regex(grammar))
    for text in members:
        assert re.fullmatch(regex, text, re.DOTALL), (text, regex)
    for text in others:
        assert not re.fullmatch(regex, text, re.DOTALL), (text, regex)


@pytest.mark.parametrize("grammar,members,others", CASES)
def test_outlines_builds_the_same_language(grammar, members, others):
    """The regex as outlines-core reads it (Rust's syntax), end-marked as the engine's compiler builds it: a
    vocabulary of one token per byte accepts exactly the same strings."""
    from outlines_core import Index, Vocabulary

    texts = members + others
    data = {b for t in texts for b in t.encode()} | set(range(32, 127)) | {10}
    mark = 1000
    vocab = Vocabulary(0, {bytes([b]): [b + 1] for b in sorted(data)} | {END_MARK: [mark]})
    index = Index(f"(?:{to_regex(grammar)}){END_MARK_REGEX}", vocab)
    transitions, final = end_marked(index.get_transitions(), set(index.get_final_states()),
                                    index.get_initial_state(), mark, 0)

    def accepts(text: str) -> bool:
        state = index.get_initial_state()
        for b in text.encode():
            state = transitions.get(state, {}).get(b + 1)
            if state is None:
                return False
        return state in final

    assert all(accepts(t) for t in members) and not any(accepts(t) for t in others)


def test_lark_is_told_apart_as_vllm_does():
    assert is_lark(SQL_LARK) and not is_lark(SQL_EBNF) and is_lark("start: 'a'  # root ::= x in a comment")


@pytest.mark.parametrize("grammar,words", [
    ('root ::= expr\nexpr ::= "(" expr ")" | "x"', r"rule 'expr' is recursive \(expr -> expr\)"),
    ('root ::= a\na ::= b "x"\nb ::= a "y" | "z"', r"rule 'a' is recursive \(a -> b -> a\)"),
    ("root ::= x", "rule 'root' refers to 'x', which is not defined"),
    ('foo ::= "a"', "no 'root' rule"),
    ('root ::= "a', "line 1, column 12: unterminated string"),
    ('root ::= "a"\n  | [b-a]', "line 2, column 9: character range 'b'-'a' is reversed"),
    ('root ::= "a"{3,1}', "upper bound is below the lower"),
    ('root ::= "a"\nroot ::= "b"', "line 2, column 1: rule 'root' is defined twice"),
    ('root ::= (= "a") "b"', "lookahead assertions"),
    ('root ::= "a" ~', "unexpected '~'"),
    ("start: 'a'i", "string flags"),
    ("%import common.WS\nstart: WS", r"Lark directives \(%import\)"),
    ("start: /a/i", r"regex flags \(i\)"),
    ("  ", "non-empty string"),
])
def test_errors_say_what_and_where(grammar, words):
    with pytest.raises(GrammarError, match=words):
        to_regex(grammar)
