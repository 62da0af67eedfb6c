"""A request's prompt and params -> validated `Sequence`s (one per sample), or a ValueError naming the problem;
nothing is queued.

Prompts come as vLLM takes them: a string, a list of token ids, or a dict with `prompt` or `prompt_token_ids`
(jaxspec.inputs); a dict's other fields (multi_modal_data, cache_salt, ...) are refused, not ignored.
Checks that need the model run here: token ids against the vocabulary, logprobs against max_logprobs, bad words
tokenized. Seeds: a request without one gets (LLM seed * 1_000_003 + admission index) mod 2^32, where the index
advances by n per request; sample i of a request with seed s is seeded (s + i) mod 2^32, as vLLM seeds its
child requests, so n samples equal n single requests with those seeds.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np

from jaxspec import structured_output
from jaxspec.engine.sequence import Sequence
from jaxspec.engine.slot_spec import MAX_BAD_WORD_TOKENS, MAX_BAD_WORDS, SlotSpec
from jaxspec.inputs import PROMPT_KEYS
from jaxspec.sampling_params import SamplingParams
from jaxspec.structured_output import Compiler, StructuredOutputsConfig


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample `index` of a request seeded `seed`."""
    return (seed + index) % 2**32


class InputProcessor:
    def __init__(self, tokenizer: Any | None, vocab_size: int, max_model_len: int, seed: int,
                 eos_token_ids: set[int] = frozenset(), max_logprobs: int = 20,
                 structured_outputs: StructuredOutputsConfig | None = None, grammar_pool: Any | None = None):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.seed = seed
        self.eos_token_ids = set(eos_token_ids)
        self.max_logprobs = max_logprobs
        self.structured_outputs = structured_outputs or StructuredOutputsConfig()
        self.grammar_pool = grammar_pool  # engine/grammar_pool.py: what an automaton must fit
        self._compiler: Compiler | None = None
        self._num_made = 0  # samples made so far: the default seed of each request is derived from its index

    def process(self, request_id: str, prompt, params: SamplingParams | None) -> Sequence:
        """The request's first sample; all n are its `group`. Raises ValueError (no request prefix: the caller
        names the request)."""
        if params is None:
            params = SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        text, ids = self.tokenize(prompt)
        params.validate()
        if params.truncate_prompt_tokens is not None:  # vLLM's left truncation, before every length check
            keep = self.max_model_len if params.truncate_prompt_tokens == -1 else params.truncate_prompt_tokens
            ids = ids[-keep:]
        self._check(ids, params)
        slot_spec = self._slot_spec(params) if params.needs_extended_step else None
        seed = params.seed if params.seed is not None else (self.seed * 1_000_003 + self._num_made) % 2**32
        self._num_made += params.n
        group: list[Sequence] = []
        for i in range(params.n):
            group.append(Sequence(request_id=request_id, prompt_token_ids=ids, params=params,
                                  seed=sample_seed(seed, i), prompt=text, index=i, group=group,
                                  slot_spec=slot_spec))
        return group[0]

    def tokenize(self, prompt) -> tuple[str | None, list[int]]:
        """A prompt as (its text or None, its token ids, checked against the vocabulary)."""
        given_text = None
        if isinstance(prompt, dict):
            other = sorted(set(prompt) - PROMPT_KEYS)
            if other:  # multi_modal_data, cache_salt, ...: features jaxspec does not have, so not ignored
                raise ValueError(f"prompt fields {other} are not supported (a prompt dict takes 'prompt' and "
                                 "'prompt_token_ids', vLLM's TextPrompt and TokensPrompt)")
            if "prompt_token_ids" in prompt:
                given_text = prompt.get("prompt") if isinstance(prompt.get("prompt"), str) else None
                prompt = prompt["prompt_token_ids"]
            elif isinstance(prompt.get("prompt"), str):
                prompt = prompt["prompt"]
            else:
                raise ValueError(f"a dict prompt needs 'prompt' (a string) or 'prompt_token_ids', got keys "
                                 f"{sorted(prompt)}")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; pass token ids instead")
            ids, text = self.tokenizer.encode(prompt), prompt
        else:
            if prompt is None or isinstance(prompt, (bytes, bytearray)) or not hasattr(prompt, "__len__"):
                raise ValueError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")
            try:
                a = np.asarray(prompt)
            except ValueError:  # ragged nesting
                a = np.asarray(prompt, dtype=object)
            if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
                raise ValueError(f"prompt token ids must be a flat sequence of integers, got shape {a.shape} of "
                                 f"{a.dtype}")
            ids, text = a.tolist(), given_text
        if not ids:
            raise ValueError("the prompt is empty")
        a = np.asarray(ids)
        bad = a[(a < 0) | (a >= self.vocab_size)]  # one vectorized check: a Python loop costs ms per batch
        if bad.size:
            raise ValueError(f"token ids {bad[:5].tolist()} are outside the vocabulary [0, {self.vocab_size})")
        return text, ids

    def _check(self, ids: list[int], p: SamplingParams) -> None:
        if p.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this model has none")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens, but max_model_len={self.max_model_len} leaves no "
                             "room to generate")
        for name, values in (("stop_token_ids", p.stop_token_ids), ("logit_bias", list(p.logit_bias or ())),
                             ("allowed_token_ids", p.allowed_token_ids or [])):
            bad = [t for t in values if t >= self.vocab_size]
            if bad:
                raise ValueError(f"SamplingParams.{name} {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        for name in ("logprobs", "prompt_logprobs"):
            num = getattr(p, name)
            num = self.vocab_size if num == -1 else num
            if num is not None and num > self.max_logprobs:
                raise ValueError(f"SamplingParams.{name}={num} is more than max_logprobs={self.max_logprobs} "
                                 "(the LLM's max_logprobs argument)")

    def _slot_spec(self, p: SamplingParams) -> SlotSpec:
        stop_ids = sorted(set(p.stop_token_ids) | self.eos_token_ids) if p.min_tokens else []
        return SlotSpec(dict(p.logit_bias or {}), p.allowed_token_ids, self._bad_words(p.bad_words), stop_ids,
                        self._grammar(p))

    def _grammar(self, p: SamplingParams):
        """The request's constraint compiled (structured_output.Compiler; a Future while it takes longer than
        COMPILE_WAIT_S), checked against the device pool."""
        if p.structured_outputs is None:
            return None
        if self.tokenizer is None:
            raise ValueError("SamplingParams.structured_outputs need a tokenizer; this model has none")
        if self._compiler is None:
            self._compiler = Compiler(self.tokenizer, self.vocab_size, self.eos_token_ids)
        key, automaton = self._compiler.compile(self.structured_outputs.applied(p.structured_outputs),
                                                structured_output.COMPILE_WAIT_S)
        if not isinstance(automaton, Future):  # (else checked when built: settle_grammar)
            self._check_fits(automaton, p)
        return key, automaton

    def _check_fits(self, automaton, p: SamplingParams) -> None:
        if self.grammar_pool is not None:
            self.grammar_pool.check(automaton, f"SamplingParams.structured_outputs.{p.structured_outputs.kind}")

    def settle_grammar(self, seq: Sequence, wait: bool = False) -> bool:
        """A request whose automaton was still building when it was added (structured_output.Compiler): True once
        its slot spec holds the automaton (shared by its samples); a ValueError if the build failed or the
        automaton can never fit the pool. False: still building (wait: block until it is built)."""
        key, future = seq.slot_spec.grammar
        if not isinstance(future, Future):
            return True
        try:
            automaton = self._compiler.settle(key, future, None if wait else 0)
        except TimeoutError:
            return False
        self._check_fits(automaton, seq.params)
        seq.slot_spec.grammar = (key, automaton)
        return True

    def _bad_words(self, words: list[str]) -> list[list[int]]:
        """vLLM's tokenization of bad words: each word as it is and with a leading space (when that gives another
        first token and as many tokens), so a word is banned at the start of the text and after a space."""
        if words and self.tokenizer is None:
            raise ValueError("SamplingParams.bad_words need a tokenizer; this model has none")
        seqs: list[list[int]] = []
        for word in words:
            for prefix in ("", " "):
                ids = self.tokenizer.encode(prefix + word.lstrip(), add_special_tokens=False)
                if not ids:
                    if not prefix:
                        raise ValueError(f"SamplingParams.bad_words entry {word!r} tokenizes to no tokens")
                    continue
                if not prefix or (ids[0] != seqs[-1][0] and len(ids) == len(seqs[-1])):
                    if len(ids) > MAX_BAD_WORD_TOKENS:
                        raise ValueError(f"SamplingParams.bad_words entry {word!r} is {len(ids)} tokens; at most "
                                         f"{MAX_BAD_WORD_TOKENS} are supported")
                    seqs.append(ids)
        if len(seqs) > MAX_BAD_WORDS:
            raise ValueError(f"SamplingParams.bad_words make {len(seqs)} token sequences; at most {MAX_BAD_WORDS} "
                             "are supported")
        bad = [t for ids in seqs for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"SamplingParams.bad_words tokenize to ids {bad[:5]} outside the vocabulary "
                             f"[0, {self.vocab_size})")
        return seqs
