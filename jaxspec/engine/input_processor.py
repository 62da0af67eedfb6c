"""A request's prompt and params -> a validated `Sequence`, or a ValueError naming the problem; nothing is queued.

Prompts come as vLLM takes them: a string, a list of token ids, or a dict with `prompt` or `prompt_token_ids`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxspec.engine.sequence import Sequence
from jaxspec.sampling_params import SamplingParams


class InputProcessor:
    def __init__(self, tokenizer: Any | None, vocab_size: int, max_model_len: int, seed: int):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.seed = seed
        self._num_made = 0  # requests made so far: the default seed of each is derived from its index

    def process(self, request_id: str, prompt, params: SamplingParams | None) -> Sequence:
        """Raises ValueError (no request prefix: the caller names the request)."""
        if params is None:
            params = SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        text, ids = self._tokenize(prompt)
        params.validate()
        self._check(ids, params)
        seed = params.seed if params.seed is not None else (self.seed * 1_000_003 + self._num_made) % 2**32
        self._num_made += 1
        return Sequence(request_id=request_id, prompt_token_ids=ids, params=params, seed=seed, prompt=text)

    def _tokenize(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
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
            ids, text = a.tolist(), None
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
        bad = [t for t in p.stop_token_ids if t >= self.vocab_size]
        if bad:
            raise ValueError(f"SamplingParams.stop_token_ids {bad[:5]} are outside the vocabulary "
                             f"[0, {self.vocab_size})")
