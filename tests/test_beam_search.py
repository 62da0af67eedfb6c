"""`LLM.beam_search` (vLLM's) against an oracle written here: the same search over the tiny model's full-sequence
log-probabilities (no engine, no cache), with EOS, length penalty and max_model_len; the state machine's rules on
hand-made logprobs; bad parameters."""

from __future__ import annotations

import numpy as np
import pytest

from jaxspec import BeamSearchParams
from jaxspec.beam_search import BeamSearch, beam_search_score
from jaxspec.outputs import Logprob
from tests.numerics import FP32_EPS, assert_close_scaled
from tests.tiny import TINY, logprobs_reference, make_llm, tiny_weights, write_char_tokenizer

WIDTH, STEPS = 3, 6
PROMPTS = [[33, 13, 38, 52, 104, 57, 11, 42], [10, 22, 30, 23, 102, 111, 74], [120, 112, 65, 120, 124, 124, 10]]
# a tie between two candidates closer than this could fall either way under another CPU's rounding
MARGIN = 1e-4


def oracle(w, prompt: list[int], width: int, steps: int, eos: set[int], length_penalty: float,
           margins: list[float]) -> list[tuple[list[int], float]]:
    """transformers' beam search as vLLM runs it, on log-softmaxes of whole sequences: each beam's 2 * width most
    likely next tokens are candidates, EOS completes one, the best `width` of the others go on. Appends to
    `margins` the gap at every cut it makes (the tests need clear cuts)."""
    def score(beam):
        return beam_search_score(beam[0], beam[1], eos, length_penalty)

    beams, done = [(list(prompt), 0.0)], []
    for _ in range(steps):
        candidates = []
        for tokens, cum in beams:
            lp = logprobs_reference(w, TINY, tokens)[-1]
            order = np.argsort(-lp)
            margins.append(lp[order[2 * width - 1]] - lp[order[2 * width]])
            for t in order[:2 * width]:
                (done if int(t) in eos else candidates).append((tokens + [int(t)], cum + lp[t]))
        ranked = sorted(candidates, key=score, reverse=True)
        if len(ranked) > width:
            margins.append(score(ranked[width - 1]) - score(ranked[width]))
        beams = ranked[:width]
    return sorted(done + beams, key=score, reverse=True)[:width]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The EOS is a token the oracle's first step ranks among the candidates, so that beams do end on it."""
    w = tiny_weights()
    eos = int(np.argsort(-logprobs_reference(w, TINY, PROMPTS[0])[-1])[1])
    path = write_char_tokenizer(tmp_path_factory.mktemp("beam"), eos_token_id=eos)
    return w, eos, make_llm(w, path, max_model_len=64)


@pytest.mark.parametrize("length_penalty", [1.0, 0.5])
def test_beam_search_equals_a_full_sequence_oracle(setup, length_penalty):
    w, eos, llm = setup
    params = BeamSearchParams(beam_width=WIDTH, max_tokens=STEPS, length_penalty=length_penalty)
    outs = llm.beam_search(PROMPTS, params)
    tok = llm.get_tokenizer()
    ended = 0
    for prompt, out in zip(PROMPTS, outs):
        margins: list[float] = []
        want = oracle(w, prompt, WIDTH, STEPS, {eos}, length_penalty, margins)
        assert min(margins) > MARGIN, "the test's prompts leave a near tie"
        assert [s.tokens for s in out.sequences] == [t for t, _ in want]
        # fp32 log-softmaxes summed over up to 6 steps; the paged engine rounds its sums differently
        assert_close_scaled([s.cum_logprob for s in out.sequences], [c for _, c in want], 256 * FP32_EPS, axis=None)
        for s in out.sequences:
            assert s.text == tok.decode(s.tokens) and len(s.logprobs) == len(s.tokens) - len(prompt)
            assert s.finish_reason == ("stop" if s.tokens[-1] == eos else "length")
            assert s.stop_reason == (eos if s.tokens[-1] == eos else None)
            assert sum(d[t].logprob for d, t in zip(s.logprobs, s.tokens[len(prompt):])) == pytest.approx(
                s.cum_logprob, rel=1e-6)
            ended += s.tokens[-1] == eos
    assert ended, "no beam ended with EOS: the test does not cover completion"
    # prompts searched one at a time give the same beams
    again = llm.beam_search(PROMPTS, params, concurrency_limit=1)
    assert [[s.tokens for s in o.sequences] for o in again] == [[s.tokens for s in o.sequences] for o in outs]


def test_ignore_eos_and_max_model_len(setup):
    """With ignore_eos, EOS is an ordinary token; a beam that reaches max_model_len ends there ("length")."""
    w, eos, llm = setup
    long = list(range(2, 61))
    (out,) = llm.beam_search([long], BeamSearchParams(beam_width=2, max_tokens=20, ignore_eos=True))
    assert all(len(s.tokens) == 64 and s.finish_reason == "length" for s in out.sequences)
    margins: list[float] = []
    want = oracle(w, long, 2, 5, set(), 1.0, margins)
    assert min(margins) > MARGIN
    assert [s.tokens for s in out.sequences] == [t for t, _ in want]


def _step(*pairs: tuple[int, float]) -> dict[int, Logprob]:
    return {t: Logprob(lp, rank) for rank, (t, lp) in enumerate(pairs, 1)}


def test_the_search_rules_on_given_logprobs():
    """EOS candidates complete (and still compete at the end), the others are cut to the beam width by score, and
    the final ranking mixes completed and live beams."""
    search = BeamSearch([[7]], BeamSearchParams(beam_width=2, max_tokens=2), {0}, max_model_len=100)
    assert search.step_params().logprobs == 4 and search.step_params().max_tokens == 1
    search.advance([_step((5, -0.1), (0, -0.5), (6, -1.0), (8, -3.0))])
    assert [b.tokens for b in search.live()] == [[7, 5], [7, 6]]  # 8 cut, 0 (EOS) completed
    assert [b.tokens for b in search.completed[0]] == [[7, 0]]
    search.advance([_step((1, -2.0), (2, -2.5)), _step((3, -0.1), (4, -0.2))])
    assert search.done()
    (out,) = search.outputs(lambda ids: "".join(map(str, ids)))
    # scores: [7, 0] -0.5 / 1 (EOS not counted) = -0.5; [7, 6, 3] -1.1 / 3; [7, 6, 4] -1.2 / 3; [7, 5, 1] -2.1 / 3
    assert [s.tokens for s in out.sequences] == [[7, 6, 3], [7, 6, 4]]
    assert [s.text for s in out.sequences] == ["763", "764"]
    short = BeamSearch([[7]], BeamSearchParams(beam_width=2, max_tokens=2, length_penalty=0.0), {0}, 100)
    short.advance([_step((5, -0.1), (0, -0.5), (6, -1.0), (8, -3.0))])
    short.advance([_step((1, -2.0), (2, -2.5)), _step((3, -0.1), (4, -0.2))])
    (out,) = short.outputs(None)  # no length normalization: the short EOS beam wins
    assert [s.tokens for s in out.sequences] == [[7, 0], [7, 6, 3]] and out.sequences[0].finish_reason == "stop"


@pytest.mark.parametrize("kw,name", [(dict(beam_width=0, max_tokens=4), "beam_width"),
                                     (dict(beam_width=2, max_tokens=0), "max_tokens"),
                                     (dict(beam_width=2, max_tokens=4, temperature=-1), "temperature"),
                                     (dict(beam_width=2, max_tokens=4, ignore_eos=1), "ignore_eos")])
def test_bad_beam_search_params_name_the_field(kw, name):
    with pytest.raises(ValueError, match=f"BeamSearchParams.{name}"):
        BeamSearchParams(**kw)


def test_bad_calls_fail_before_anything_runs(setup):
    _, _, llm = setup
    with pytest.raises(ValueError, match="max_logprobs"):
        llm.beam_search(PROMPTS, BeamSearchParams(beam_width=11, max_tokens=2))
    with pytest.raises(ValueError, match="prompt 1 has 64 tokens"):
        llm.beam_search([[1], [2] * 64], BeamSearchParams(beam_width=2, max_tokens=2))
    with pytest.raises(ValueError, match="prompt 0: token ids"):
        llm.beam_search([[1000]], BeamSearchParams(beam_width=2, max_tokens=2))
    with pytest.raises(ValueError, match="concurrency_limit"):
        llm.beam_search(PROMPTS, BeamSearchParams(beam_width=2, max_tokens=2), concurrency_limit=0)
