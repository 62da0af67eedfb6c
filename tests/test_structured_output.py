"""Structured outputs: the parameters, the token automaton against outlines-core's index, the device pool against
the host automaton, lossless sampling under a constraint by chi-square (tests/test_processors.py's harness), and
the engine's outputs against a plain full-sequence loop that masks with the automaton."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import re
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec import SamplingParams
from jaxspec.engine import grammar, processors
from jaxspec.engine.grammar_pool import GrammarPool
from jaxspec.sampling_params import GuidedDecodingParams, StructuredOutputsParams
from jaxspec.structured_output import Automaton, Compiler, StructuredOutputsConfig, build_automaton, escape
from tests import test_processors as harness
from tests.test_grammar_regex import SQL_EBNF  # vLLM's documentation's example
from tests.test_sampler import ALPHA, N, joint_pvalue
from tests.tiny import TINY, make_llm, tiny_weights, write_chat_tokenizer, write_random_head

V = harness.V
# A hand-made automaton over the harness's 6 tokens: every state allows 2 to 4 of them, each token leads somewhere
# else, and the harness's committed output (2, 2, 5) is a path of it (to state 4)
TRANSITIONS = {0: {2: 1, 0: 2, 4: 0}, 1: {2: 3, 1: 0, 3: 2}, 3: {5: 4, 0: 0}, 4: {0: 2, 1: 4, 3: 5, 5: 1},
               2: {1: 1, 2: 2, 4: 4, 5: 0}, 5: {0: 4, 2: 1, 3: 5}}
SMALL = build_automaton(TRANSITIONS, 0, set(), set(), V)


class Owner:
    is_finished = False


def pool_state(automata: list[Automaton], max_states: int = 64, max_transitions: int = 512,
               vocab_size: int = V) -> tuple[grammar.GrammarTables, list[int]]:
    """The device tables holding these automata (placed by GrammarPool, written by grammar.place) and each one's
    pool state offset."""
    pool = GrammarPool(max_states, max_transitions)
    tables = grammar.GrammarTables.init(max_states, max_transitions, vocab_size)
    offsets = []
    for i, a in enumerate(automata):
        assert pool.reserve(str(i), a, Owner())
        for chunk in pool.uploads(str(i)):
            tables = jax.jit(grammar.place)(tables, *chunk)
        offsets.append(pool.placement(str(i)).state_at)
    return tables, offsets


# ---- parameters


def test_params_name_what_is_wrong():
    for kwargs, words in [({}, "exactly one constraint"), (dict(regex="a", choice=["b"]), "exactly one"),
                          (dict(grammar='root ::= "(" root ")" | "a"'), "grammar: rule 'root' is recursive"),
                          (dict(structural_tag="{}"), "structural_tag is not supported"),
                          (dict(json="{not json"), "json is not valid JSON"), (dict(choice=[]), "choice must be"),
                          (dict(choice=["a", ""]), "choice must be"), (dict(json=3), "json must be"),
                          (dict(regex="a", disable_any_whitespace=1), "disable_any_whitespace must be a bool")]:
        with pytest.raises(ValueError, match=words):
            StructuredOutputsParams(**kwargs)
    with pytest.raises(ValueError, match="backend must be one of"):
        GuidedDecodingParams(regex="a", backend="nope")
    old = SamplingParams(guided_decoding=GuidedDecodingParams(choice=["x"], backend="xgrammar"))
    assert old.structured_outputs.choice == ["x"] and old.guided_decoding is None and old.needs_processors
    with pytest.raises(ValueError, match="not both"):
        SamplingParams(structured_outputs=StructuredOutputsParams(regex="a"),
                       guided_decoding=GuidedDecodingParams(regex="b"))
    with pytest.raises(ValueError, match="must be a StructuredOutputsParams"):
        SamplingParams(structured_outputs={"regex": "a"})
    with pytest.raises(ValueError, match="unknown keys"):
        StructuredOutputsConfig.parse({"max_state": 3})


def test_regexes_of_each_kind():
    assert re.fullmatch(StructuredOutputsParams(choice=["a.b", "c|d", "e f"]).to_regex(), "c|d")
    assert escape("a.b*(c)") == r"a\.b\*\(c\)"
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
    spaced, tight = (StructuredOutputsParams(json=schema, disable_any_whitespace=d).to_regex() for d in (False, True))
    assert re.fullmatch(spaced, '{ "a": true }') and not re.fullmatch(tight, '{ "a": true }')
    assert re.fullmatch(tight, '{"a":false}')
    assert re.fullmatch(StructuredOutputsParams(json=json.dumps(schema)).to_regex(), '{"a": true}')
    assert re.fullmatch(StructuredOutputsParams(json_object=True).to_regex(), '{"x": [1, {"y": null}]}')
    assert StructuredOutputsParams(regex="^[a-c]+$").to_regex() == "[a-c]+"  # anchors: the answer matches whole
    assert StructuredOutputsParams(regex=r"\Aa\$\z").to_regex() == r"a\$"


# ---- the automaton


@pytest.mark.parametrize("pattern", ["(ab|c)+ [A-C]?x", "((ab|c) )+", "[a-d]*(B[a-c]+)?x?", "(a|bc)*", "^(ab)+$"])
def test_automaton_holds_the_regex_language(tmp_path, pattern):
    """Against the `regex` module's partial matching, over a tokenizer of one character a token: from each state
    (the text that first reaches it), a token is allowed iff text + token can still become a match, EOS (allowed
    and kept) iff text matches. Among them: tokens that leave an accepting state for one that is not (outlines-core's
    own index drops those), and anchors (outlines-core refuses them)."""
    import regex as oracle

    tok = _chat_tokenizer(tmp_path)
    a = Compiler(tok, TINY.vocab_size, {127}).compile(StructuredOutputsParams(regex=pattern), wait_s=None)[1]
    chars = {i: tok.convert_tokens_to_string([t]) for t, i in tok.get_vocab().items() if i < 126}
    seen, todo = {a.initial: ""}, [a.initial]
    while todo:
        state = todo.pop()
        text = seen[state]
        allowed = set(np.flatnonzero(np.unpackbits(a.allowed[state].view(np.uint8), bitorder="little")).tolist())
        assert (127 in allowed) == bool(oracle.fullmatch(pattern, text)), (pattern, text)
        for i, c in chars.items():
            assert (i in allowed) == bool(oracle.fullmatch(pattern, text + c, partial=True)), (pattern, text + c)
            if i in allowed and a.step(state, i) not in seen:
                seen[a.step(state, i)] = text + c
                todo.append(a.step(state, i))
    assert a.step(a.initial, 127) == -1 or oracle.fullmatch(pattern, "")


def test_device_pool_walks_as_the_host_automaton():
    """grammar.step / allowed / allowed_rows on a pool holding two automata at offsets equal the host automaton's
    step and allowed bits, for every state and token (and NONE: everything allowed, NONE after)."""
    other = build_automaton({0: {1: 1}, 1: {0: 0, 5: 1}}, 0, {1}, {3}, V)
    tables, (off_other, off_small) = pool_state([other, SMALL])
    assert off_small == other.num_states
    states = np.array([-1] + [off_small + s for s in range(SMALL.num_states)], np.int32)
    s, t = np.meshgrid(states, np.arange(V), indexing="ij")
    got = np.asarray(jax.jit(grammar.step)(tables, jnp.asarray(s), jnp.asarray(t)))
    ok = np.asarray(grammar.allowed(tables, jnp.asarray(s), jnp.asarray(t)))
    rows = np.asarray(grammar.allowed_rows(tables, jnp.asarray(states), V))
    for i, state in enumerate(states):
        for token in range(V):
            want = -1 if state < 0 else SMALL.step(state - off_small, token)
            assert got[i, token] == (want if want < 0 else want + off_small)
            assert ok[i, token] == rows[i, token] == (state < 0 or want >= 0)
    assert np.asarray(grammar.step(tables, jnp.int32(off_other + 1), jnp.int32(3))) == off_other + 1  # EOS keeps
    assert bool(grammar.only_end(tables, jnp.int32(off_other + 1))) is False


def test_default_pool_holds_a_json_object_automaton_at_any_vocabulary(byte_dir):
    """A JSON object automaton has ~67 transitions a vocabulary entry (3.3 M at SmolLM2's 49,152; measured here
    on a byte tokenizer too); the default pool holds one with room to spare at Llama-3's 128,256 and past it."""
    from transformers import PreTrainedTokenizerFast

    from jaxspec.config import EngineConfig

    tok = PreTrainedTokenizerFast.from_pretrained(str(byte_dir))
    a = Compiler(tok, BYTE_TINY.vocab_size, {256}).compile(StructuredOutputsParams(json_object=True), wait_s=None)[1]
    pool = EngineConfig(max_model_len=128).grammar_max_transitions
    assert pool(BYTE_TINY.vocab_size) >= 1.5 * a.num_transitions  # (a byte vocabulary: ~140 an entry)
    for vocab in (49152, 128256, 262144):
        assert pool(vocab) >= 1.5 * 67 * vocab


def test_pool_evicts_only_what_no_unfinished_request_uses():
    """Requests with one constraint share its placement; another that does not fit waits (reserve False) while
    an unfinished request holds the room, and takes it once they finish; one that can never fit is named."""
    pool = GrammarPool(10, 30)
    a, b = (build_automaton({0: {i: 0 for i in range(n)}}, 0, set(), set(), 32) for n in (20, 15))
    first, second = Owner(), Owner()
    assert pool.reserve("a", a, first) and pool.reserve("a", a, second)
    assert len(list(pool.uploads("a"))) == 1 and not list(pool.uploads("a"))  # written once
    assert not pool.reserve("b", b, Owner())  # 20 + 15 transitions > 30
    first.is_finished = True
    assert not pool.reserve("b", b, Owner())
    second.is_finished = True
    assert pool.reserve("b", b, Owner()) and list(pool.placements) == ["b"]
    assert pool.placement("b").edge_at == 0  # a's range was given back and merged
    with pytest.raises(ValueError, match="its automaton has 1 states and 40 transitions"):
        pool.check(build_automaton({0: {i: 0 for i in range(40)}}, 0, set(), set(), 64), "its")


# ---- lossless under speculative decoding (the processors' chi-square harness, with a constraint)


def grammar_rows(B: int, output=harness.OUTPUT) -> grammar.GrammarState:
    tables, (offset,) = pool_state([SMALL])
    return grammar.GrammarState(tables, jnp.full((B,), offset + SMALL.walk(output), jnp.int32))


def ref_probs(logits, prompt, output, c):
    """The harness's oracle, then the constraint's mask after `output` (renormalized)."""
    state = SMALL.walk(output)
    allowed = np.array([SMALL.step(state, t) >= 0 for t in range(V)])
    if c.get("temperature", 1.0) == 0:
        return np.eye(V)[np.argmax(np.where(allowed, harness.ref_logits(logits, prompt, output, c), -np.inf))]
    return harness.ref_probs(np.where(allowed, logits, -np.inf), prompt, output, c)


def run(c, drafts, seed0: int, wrong=None):
    """The harness's run with the constraint's grammar state."""
    return harness.run(c, drafts, seed0, wrong, grammar_rows(len(drafts)))


def lossless_pvalues(c, tokens, n_acc, drafts):
    return harness.lossless_pvalues(c, tokens, n_acc, drafts, ref_probs)


CONSTRAINED = {"alone": {}, "with_processors": dict(harness.PENALTIES, top_p=0.9, min_p=0.05,
                                                    logit_bias={1: 1.0, 3: -0.5}, temperature=0.9)}


@pytest.mark.parametrize("name", list(CONSTRAINED))
def test_lossless_under_a_constraint(name):
    """Each emitted token (first, second, bonus) follows the processed target masked by the constraint after its
    history, drafts often refused by the automaton; the drafts accepted were allowed."""
    c = CONSTRAINED[name]
    drafts = harness.random_drafts(0)
    tokens, n_acc = run(c, drafts, 1000)
    assert min(lossless_pvalues(c, tokens, n_acc, drafts)) > ALPHA
    assert 0.1 < (n_acc >= 1).mean() < 0.9
    for b in range(N):
        assert SMALL.walk(harness.OUTPUT + tokens[b, :n_acc[b] + 1].tolist()) >= 0


def test_lossless_joint_under_a_constraint():
    c = CONSTRAINED["with_processors"]
    d0, d1 = 3, 2  # allowed after the output (state 4 -> 5 -> 1)
    out, P = harness.OUTPUT, harness.PROMPT
    p0, p1, p2 = (ref_probs(harness.LOGITS[j], P, out + [d0, d1][:j], c) for j in range(3))
    tokens, n_acc = run(c, np.tile([[d0, d1]], (N, 1)), 77)
    assert joint_pvalue(tokens, n_acc, d0, d1, p0, p1, p2) > ALPHA


def test_negative_control_without_the_drafts_history_fails():
    drafts = harness.random_drafts(0)
    tokens, n_acc = run(CONSTRAINED["alone"], drafts, 1000, wrong="no_draft_history")
    refused = [SMALL.walk(harness.OUTPUT + tokens[b, :n_acc[b] + 1].tolist()) < 0 for b in range(N)]
    assert any(refused) and min(lossless_pvalues(CONSTRAINED["alone"], tokens, n_acc, drafts)) < ALPHA


def test_drafts_follow_the_constraint():
    """process_draft leaves out what the automaton refuses after the committed output and the earlier drafts."""
    B, k = 16, 3
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(B, k, V)).astype(np.float32)
    drafts = rng.integers(0, V, (B, k)).astype(np.int32)
    c = {}
    state, params = harness.make_rows(c, B), processors.Params.unpack(harness.packed_params(c, np.zeros(B)))
    g = grammar_rows(B)
    for i in range(k):
        earlier = [jnp.asarray(drafts[:, m]) for m in range(i)]
        position = jnp.full((B,), len(harness.PROMPT) + len(harness.OUTPUT) + i)
        got = np.asarray(processors.process_draft(jnp.asarray(logits[:, i]), None, earlier, position, state,
                                                  jnp.arange(B), params, g))
        for b in range(B):
            s = SMALL.walk(harness.OUTPUT + drafts[b, :i].tolist())
            allowed = [s < 0 or SMALL.step(s, t) >= 0 for t in range(V)]
            np.testing.assert_array_equal(np.isfinite(got[b]), allowed)


# ---- the engine


def _chat_tokenizer(tmp_path: Path):
    from transformers import PreTrainedTokenizerFast

    write_chat_tokenizer(tmp_path / "tok")
    return PreTrainedTokenizerFast.from_pretrained(str(tmp_path / "tok"))


EOS = 127  # the chat tokenizer's <|im_end|>
PROMPTS = ["hello there", "abc", "the quick brown fox jumps over", "Bx", "zeta"]
CONSTRAINTS = [StructuredOutputsParams(regex="(ab|c)+ [A-C]?x+"), StructuredOutputsParams(choice=["abc", "Bcd ef"]),
               None, StructuredOutputsParams(regex="[a-e ]{3,40}"), StructuredOutputsParams(regex="(ab|c)+ [A-C]?x+")]


def masked_greedy_reference(w, tok, prompt: str, constraint, max_tokens: int) -> list[int]:
    """The oracle: a plain full-sequence greedy loop whose every step takes the argmax over the tokens the
    constraint's automaton allows after the output so far (EOS in its final states), until EOS."""
    from tests.tiny import _last_logits

    automaton = None
    if constraint is not None:
        automaton = Compiler(tok, TINY.vocab_size, {EOS}).compile(constraint, wait_s=None)[1]
    ids, out = tok.encode(prompt), []
    while len(out) < max_tokens:
        padded = np.zeros((1, 128), np.int32)
        padded[0, :len(ids)] = ids
        logits = _last_logits(w, TINY, padded, len(ids) - 1).astype(np.float64)
        if automaton is not None:
            state = automaton.walk(out)
            logits = np.where([automaton.step(state, t) >= 0 for t in range(TINY.vocab_size)], logits, -np.inf)
        token = int(np.argmax(logits))
        ids.append(token)
        out.append(token)
        if token == EOS:
            break
    return out


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory) -> Path:
    return write_chat_tokenizer(tmp_path_factory.mktemp("chat"))


@pytest.fixture(scope="module")
def reference(chat_dir):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(chat_dir))
    return [masked_greedy_reference(tiny_weights(), tok, p, c, 40) for p, c in zip(PROMPTS, CONSTRAINTS)]


def random_eagle3_head(path: Path) -> Path:
    """A random EAGLE-3 head drafting over 96 of the 128 ids (its draft vocabulary maps to target ids)."""
    from jaxspec.convert.eagle import save_eagle
    from jaxspec.models import eagle
    from tests.tiny_heads import tiny_aux_layers

    head = eagle.EagleConfig.from_target(TINY, "eagle3", draft_vocab_size=96,
                                         aux_layers=tiny_aux_layers(TINY.num_layers))
    save_eagle(str(path), head, eagle.init(head, jax.random.key(5), scale=0.2))
    return path


@pytest.mark.parametrize("mode", ["async", "sync", "eagle", "eagle3", "preempt", "small_pool", "multi_step"])
def test_engine_greedy_equals_the_masked_full_sequence_loop(chat_dir, reference, tmp_path, mode):
    """Constrained and unconstrained requests in one batch: each output is the oracle's, with and without
    speculative decoding (random heads: drafts often refused), async and sync, through preemption (the state
    walked again on the host), with a pool that holds one automaton at a time (requests wait for room), and with
    multi-step decoding."""
    kw = {"async_scheduling": mode != "sync"}
    if mode.startswith("eagle"):
        head = write_random_head(tmp_path / "head") if mode == "eagle" else random_eagle3_head(tmp_path / "head")
        kw["speculative_config"] = {"method": mode, "model": str(head), "num_speculative_tokens": 3}
    if mode == "preempt":
        kw["num_pages"] = 16
    if mode == "multi_step":  # several decode steps a dispatch once nothing waits
        kw["num_scheduler_steps"] = 4
    if mode == "small_pool":
        kw["structured_outputs_config"] = {"max_states": 45, "max_transitions": 4000}  # the largest: 41
    llm = make_llm(tiny_weights(), chat_dir, **kw)
    params = [SamplingParams(temperature=0, max_tokens=40, structured_outputs=c) for c in CONSTRAINTS]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference
    if mode == "preempt":
        assert llm.get_metrics()["num_preemptions"] > 0
    assert outs[1].outputs[0].text in ("abc", "Bcd ef")


def test_sampled_outputs_follow_the_constraint(chat_dir, tmp_path):
    """Seeded sampling (top-p, penalties) with speculation: every answer that ended is in the regex's language,
    every one cut by max_tokens a prefix of it; n samples each."""
    head = write_random_head(tmp_path / "head")
    llm = make_llm(tiny_weights(), chat_dir, speculative_config={"method": "eagle", "model": str(head),
                                                                 "num_speculative_tokens": 3})
    regex = "(ab|c)+ [A-C]?(x|yz)+"
    params = SamplingParams(n=4, temperature=1.0, top_p=0.9, presence_penalty=0.5, seed=5, max_tokens=30,
                            structured_outputs=StructuredOutputsParams(regex=regex))
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    ended = 0
    for o in outs:
        for c in o.outputs:
            if c.finish_reason == "stop":
                ended += 1
                assert re.fullmatch(regex, c.text), c.text
            else:
                assert re.fullmatch("(ab|c)*(a|(ab|c)+( [A-C]?((x|yz)*y?)?)?)?", c.text), c.text
    assert ended > 0


BYTE_TINY = dataclasses.replace(TINY, vocab_size=264)
JSON_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["cat", "dog"]}},
               "required": ["ok", "kind"]}


@pytest.fixture(scope="module")
def byte_dir(tmp_path_factory) -> Path:
    """A byte-level tokenizer (token id = byte) with an EOS (256) and a chat template: JSON's punctuation."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from tests.tiny import _bytes_to_unicode

    path = tmp_path_factory.mktemp("bytes")
    table = _bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={table[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<eos>", special=True)])
    tok.save(str(path / "tokenizer.json"))
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant: "
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>", "chat_template": template}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 256}))
    return path


def check_answer(text: str) -> None:
    answer = json.loads(text)
    assert set(answer) == {"ok", "kind"} and isinstance(answer["ok"], bool) and answer["kind"] in ("cat", "dog")


def test_json_schema_answers_parse(byte_dir):
    """Answers to a JSON schema (its language finite: every answer ends) parse and hold the schema's keys and
    values, greedy and sampled, with and without whitespace."""
    llm = make_llm(tiny_weights(cfg=BYTE_TINY), byte_dir, cfg=BYTE_TINY)
    params = [SamplingParams(temperature=t, seed=s, max_tokens=60, structured_outputs=StructuredOutputsParams(
        json=JSON_SCHEMA, disable_any_whitespace=s % 2 == 0)) for t, s in [(0, 0), (1.0, 1), (1.0, 2), (0.7, 3)]]
    for o in llm.generate(["{", "a", "b", "c"], params, use_tqdm=False):
        assert o.outputs[0].finish_reason == "stop"
        check_answer(o.outputs[0].text)


SQL_ANSWER = "SELECT (col_1 |col_2 ) from (table_1 |table_2 ) where (col_1 |col_2 )= (1 |2 )"
LIST_LARK = 'start: item ("," item)*\nitem: /[a-c]+/ | "none"'


def test_grammar_answers_follow_it(byte_dir):
    """vLLM's grammar option, its documentation's SQL grammar (EBNF) and a list in Lark: every answer, greedy and
    sampled, is in the language (a regex written by hand) when it ended, a prefix of it when cut."""
    import regex as oracle

    llm = make_llm(tiny_weights(cfg=BYTE_TINY), byte_dir, cfg=BYTE_TINY)
    for grammar, answer in [(SQL_EBNF, SQL_ANSWER), (LIST_LARK, "([a-c]+|none)(,([a-c]+|none))*")]:
        params = [SamplingParams(temperature=t, seed=s, max_tokens=60, structured_outputs=StructuredOutputsParams(
            grammar=grammar)) for t, s in [(0, 0), (1.0, 1), (1.0, 2), (0.8, 3)]]
        for o in llm.generate(["q", "r", "s", "t"], params, use_tqdm=False):
            out = o.outputs[0]
            assert out.finish_reason == "stop" or grammar != SQL_EBNF  # a finite language: every answer ends
            if out.finish_reason == "stop":
                assert re.fullmatch(answer, out.text), out.text
            else:
                assert oracle.fullmatch(answer, out.text, partial=True), out.text


def byte_llm(path: str):
    """The byte-level tiny LLM (importable: an engine process builds its own)."""
    return make_llm(tiny_weights(cfg=BYTE_TINY), Path(path), cfg=BYTE_TINY)


@pytest.mark.parametrize("engine", ["thread", "process"])
def test_server_takes_every_form_of_the_constraint(byte_dir, engine):
    """The OpenAI server, its engine on a thread or in its own process: response_format json_schema /
    json_object, vLLM's structured_outputs and guided_* fields, forced tool calls, streamed and not; each answer
    the offline LLM's with the same constraint; conflicting or unknown forms are 400s naming the field."""
    import httpx
    import openai

    from jaxspec.serve.app import build_app
    from jaxspec.serve.engine_process import EngineProcess
    from tests.test_serve import running

    llm = byte_llm(str(byte_dir))
    choice = StructuredOutputsParams(choice=["yes", "no way"])
    want_choice = llm.generate(["q"], SamplingParams(temperature=0, max_tokens=20, structured_outputs=choice),
                               use_tqdm=False)[0].outputs[0].text
    sql = StructuredOutputsParams(grammar=SQL_EBNF)
    want_sql = llm.generate(["q"], SamplingParams(temperature=0, max_tokens=60, structured_outputs=sql),
                            use_tqdm=False)[0].outputs[0].text
    want_json = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(
        temperature=0, max_tokens=60, structured_outputs=StructuredOutputsParams(json=JSON_SCHEMA)),
        use_tqdm=False)[0].outputs[0].text
    served = EngineProcess.launch(functools.partial(byte_llm, str(byte_dir))) if engine == "process" else llm
    with running(build_app(served, served_model_name="m")) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none")
        chat = dict(model="m", messages=[{"role": "user", "content": "hi"}], temperature=0, max_tokens=60)
        fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": JSON_SCHEMA}}
        assert client.chat.completions.create(**chat, response_format=fmt).choices[0].message.content == want_json
        streamed = client.chat.completions.create(**chat, response_format=fmt, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == want_json
        assert client.chat.completions.create(**chat, extra_body={"guided_json": JSON_SCHEMA}).choices[
            0].message.content == want_json
        answer = client.chat.completions.create(**chat, response_format={"type": "json_object"}).choices[0]
        if answer.finish_reason == "stop":
            assert isinstance(json.loads(answer.message.content), dict)
        tools = [{"type": "function", "function": {"name": "pet", "parameters": JSON_SCHEMA}},
                 {"type": "function", "function": {"name": "other"}}]
        named = client.chat.completions.create(**chat, tools=tools, tool_choice={
            "type": "function", "function": {"name": "pet"}}).choices[0]
        assert named.finish_reason == "stop" and not named.message.content
        assert [(c.function.name, c.function.arguments) for c in named.message.tool_calls] == [("pet", want_json)]
        streamed = list(client.chat.completions.create(**chat, tools=tools, stream=True, tool_choice={
            "type": "function", "function": {"name": "pet"}}))
        calls = [c for chunk in streamed if chunk.choices for c in chunk.choices[0].delta.tool_calls or []]
        assert [(c.function.name, c.function.arguments) for c in calls] == [("pet", want_json)]
        assert streamed[-1].choices[0].finish_reason == "stop"
        required = client.chat.completions.create(**chat, tools=tools, tool_choice="required").choices[0]
        if required.finish_reason == "stop":  # (a random model may run out of tokens inside the list)
            assert required.message.tool_calls and all(c.function.name in ("pet", "other")
                                                       for c in required.message.tool_calls)
        done = dict(model="m", prompt="q", temperature=0, max_tokens=20)
        for extra in ({"guided_choice": ["yes", "no way"]}, {"structured_outputs": {"choice": ["yes", "no way"]}}):
            assert client.completions.create(**done, extra_body=extra).choices[0].text == want_choice
        for extra in ({"guided_grammar": SQL_EBNF}, {"structured_outputs": {"grammar": SQL_EBNF}}):
            assert client.completions.create(**done | {"max_tokens": 60}, extra_body=extra).choices[0].text == want_sql
        for body, param in [({"response_format": {"type": "xml"}}, "response_format"),
                            ({"structured_outputs": {"grammar": 'root ::= "(" root ")" | "a"'}}, "structured_outputs"),
                            ({"guided_grammar": "root ::= x"}, "guided_grammar"),
                            ({"structured_outputs": {"regex": "a", "nope": 1}}, "structured_outputs"),
                            ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "response_format"),
                            ({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "x"}}},
                             "tool_choice"),
                            ({"tools": tools, "tool_choice": "required", "guided_regex": "a"}, "tool_choice")]:
            r = httpx.post(url + "/v1/chat/completions", json=chat | body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_automata_that_build_slowly_leave_the_engine_running(chat_dir, reference, monkeypatch):
    """With no wait for a build (as for an automaton that takes seconds), requests are added at once and wait in
    the queue while theirs build on the compiler's thread; outputs are the oracle's. A build that fails aborts its
    request alone (its error logged); the others finish."""
    import jaxspec.structured_output as so

    monkeypatch.setattr(so, "COMPILE_WAIT_S", 0.0)
    llm = make_llm(tiny_weights(), chat_dir)
    params = [SamplingParams(temperature=0, max_tokens=40, structured_outputs=c) for c in CONSTRAINTS]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference
    digits = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(regex="[0-9]{2,}"))
    outs = llm.generate(["abc", "abc"], [SamplingParams(temperature=0, max_tokens=40), digits], use_tqdm=False)
    assert outs[1].outputs[0].finish_reason == "abort" and not outs[1].outputs[0].token_ids
    assert outs[0].outputs[0].token_ids == masked_greedy_reference(tiny_weights(), llm.get_tokenizer(), "abc",
                                                                   None, 40)
    # nothing else runs: a failed build first, then another still building (the engine waits for it)
    longer = StructuredOutputsParams(regex="[a-e ]{3,400}")
    outs = llm.generate(["abc", "zeta"], [digits, SamplingParams(temperature=0, max_tokens=40,
                                                                 structured_outputs=longer)], use_tqdm=False)
    assert outs[0].outputs[0].finish_reason == "abort"
    assert outs[1].outputs[0].token_ids == masked_greedy_reference(tiny_weights(), llm.get_tokenizer(), "zeta",
                                                                   longer, 40)


def test_the_constraint_wins_where_the_processors_leave_it_nothing(chat_dir, reference):
    """allowed_token_ids disjoint from every token the automaton allows: each position takes the constraint's
    tokens on the raw logits (the oracle's answer without allowed_token_ids), not a distribution of nothing."""
    llm = make_llm(tiny_weights(), chat_dir)
    params = SamplingParams(temperature=0, max_tokens=40, allowed_token_ids=[100], structured_outputs=CONSTRAINTS[1])
    assert llm.generate([PROMPTS[1]], params, use_tqdm=False)[0].outputs[0].token_ids == reference[1]


def test_bad_constraints_are_named_before_anything_runs(chat_dir):
    llm = make_llm(tiny_weights(), chat_dir, structured_outputs_config={"max_states": 4})
    cases = [(StructuredOutputsParams(regex="[0-9]+"), "cannot compile"),  # no digits in this vocabulary
             (StructuredOutputsParams(regex="(ab|c)+ [A-C]?x+"), "the engine's pool holds 4")]
    for constraint, words in cases:
        with pytest.raises(ValueError, match=f"request 1: .*{words}"):
            llm.generate(["abc", "abc"], [SamplingParams(max_tokens=4),
                                          SamplingParams(max_tokens=4, structured_outputs=constraint)])
    assert not llm.llm_engine.has_unfinished_requests()
    no_tokenizer = make_llm(tiny_weights())
    with pytest.raises(ValueError, match="need a tokenizer"):
        no_tokenizer.generate([[1, 2]], SamplingParams(structured_outputs=StructuredOutputsParams(regex="a")))


def test_benchmarks_take_a_constraint_as_json():
    """bench/throughput.py --sweep-sampling and bench/acceptance.py --sampling give SamplingParams.from_json the
    StructuredOutputsParams fields as an object; bench/throughput.py --structured-outputs constrains every request."""
    from types import SimpleNamespace

    from jaxspec.bench import throughput

    p = SamplingParams.from_json({"structured_outputs": {"regex": "a+"}, "seed": 3}, temperature=0)
    assert p.structured_outputs == StructuredOutputsParams(regex="a+") and p.seed == 3 and p.temperature == 0
    args = SimpleNamespace(**{**throughput.PROCESSOR_OPTIONS, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                              "max_tokens": 8, "ignore_eos": False, "seed": 0,
                              "sweep_sampling": '{"structured_outputs": {"json_object": true}}'})
    (_, base), (label, options) = throughput.sampling_settings(args)
    params = throughput.sampling_params(args, 2, options=options)
    assert not base and "structured_outputs" in label and params[1].structured_outputs.json_object
    parser = argparse.ArgumentParser()
    throughput.add_arguments(parser)
    every = parser.parse_args(["--structured-outputs", '{"regex": "a+"}', "--no-ignore-eos"])  # all constrained
    assert throughput.sampling_params(every, 1)[0].structured_outputs == StructuredOutputsParams(regex="a+")
