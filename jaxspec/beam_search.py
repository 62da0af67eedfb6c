"""Beam search, vLLM's `LLM.beam_search`: the `beam_width` best continuations of each prompt by cumulative
log-probability, ranked with transformers' length penalty.

As in vLLM, a step extends every live beam by one token in one engine call: each beam asks for one token with its
2 * beam_width most likely alternatives (transformers' rule), every alternative becomes a candidate, a candidate
that ends in EOS is complete, and the others compete for the beam_width places. A beam's KV cache is not copied
between steps: the prefix cache finds the full pages an earlier step computed for its tokens, so a step prefills
at most about a page per beam. `BeamSearch` is the search as a state machine (the prompts to run next, then their
logprobs), so that `LLM.beam_search` and the server drive the same code.

Where vLLM leaves a case open: EOS is any of the model's EOS tokens (vLLM: the tokenizer's one), and a beam that
reaches max_model_len is complete with finish_reason "length" (vLLM's offline loop drops it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from jaxspec.outputs import Logprob
from jaxspec.sampling_params import BeamSearchParams, SamplingParams


@dataclass
class BeamSearchSequence:
    """One beam: its tokens (the prompt's, then the generated ones), the logprobs dict of each generated token,
    their sum, and, once returned, its text, why it ended and the token that ended it."""
    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None  # "stop" (it ended with EOS) or "length"
    stop_reason: int | None = None  # the EOS token that ended it


@dataclass
class BeamSearchOutput:
    """A prompt's best beams, best first (at most beam_width)."""
    sequences: list[BeamSearchSequence]


def beam_search_score(tokens: list[int], cum_logprob: float, eos_token_ids: set[int],
                      length_penalty: float = 1.0) -> float:
    """transformers' (and vLLM's) beam score: cum_logprob / length ** length_penalty, the length counting the
    prompt's tokens and not a final EOS."""
    length = len(tokens) - (tokens[-1] in eos_token_ids)
    return cum_logprob / (length ** length_penalty)


class BeamSearch:
    """The beam search of some prompts: `live()` lists the beams to extend next (each is one engine request,
    `step_params()`), `advance(logprobs)` takes each one's logprobs dict of its next token, in the same order, until
    `done()`; then `outputs(decode)`."""

    def __init__(self, prompts: list[list[int]], params: BeamSearchParams, eos_token_ids: set[int],
                 max_model_len: int):
        self.params, self.eos, self.max_model_len = params, set(eos_token_ids), max_model_len
        self.prompt_lens = [len(p) for p in prompts]
        self.beams = [[BeamSearchSequence(list(p))] for p in prompts]
        self.completed: list[list[BeamSearchSequence]] = [[] for _ in prompts]
        self.num_steps = 0

    def step_params(self) -> SamplingParams:
        p = self.params
        return SamplingParams(logprobs=2 * p.beam_width, max_tokens=1, temperature=p.temperature, detokenize=False)

    def live(self) -> list[BeamSearchSequence]:
        return [b for beams in self.beams for b in beams]

    def done(self) -> bool:
        return self.num_steps >= self.params.max_tokens or not any(self.beams)

    def _score(self, beam: BeamSearchSequence) -> float:
        return beam_search_score(beam.tokens, beam.cum_logprob, self.eos, self.params.length_penalty)

    def advance(self, logprobs: list[dict[int, Logprob]]) -> None:
        """One step: `logprobs[i]` is the dict (the token the engine sampled, then the 2 * beam_width most likely)
        of the next token of `live()[i]`."""
        it = iter(logprobs)
        for i, beams in enumerate(self.beams):
            candidates = []
            for beam in beams:
                step = next(it)
                for token, lp in step.items():
                    new = BeamSearchSequence(beam.tokens + [token], beam.logprobs + [step],
                                             beam.cum_logprob + lp.logprob)
                    if token in self.eos and not self.params.ignore_eos:
                        new.finish_reason, new.stop_reason = "stop", token
                        self.completed[i].append(new)
                    else:
                        candidates.append(new)
            self.beams[i] = sorted(candidates, key=self._score, reverse=True)[:self.params.beam_width]
        self.num_steps += 1
        self._finish_full()

    def _finish_full(self) -> None:
        """Beams with no room left under max_model_len are complete."""
        for i, beams in enumerate(self.beams):
            full = [b for b in beams if len(b.tokens) >= self.max_model_len]
            if full:
                self.completed[i].extend(full)
                self.beams[i] = [b for b in beams if len(b.tokens) < self.max_model_len]

    def outputs(self, decode: Callable[[list[int]], str] | None) -> list[BeamSearchOutput]:
        """Each prompt's best beam_width among its completed and live beams, best first; `decode` (token ids ->
        text) writes each one's text (vLLM's: the prompt and the generated tokens)."""
        outs = []
        for beams, done in zip(self.beams, self.completed):
            best = sorted(done + beams, key=self._score, reverse=True)[:self.params.beam_width]
            for beam in best:
                beam.finish_reason = beam.finish_reason or "length"
                beam.text = decode(beam.tokens) if decode is not None else None
            outs.append(BeamSearchOutput(best))
        return outs
