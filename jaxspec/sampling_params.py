"""Per-request sampling parameters, modelled on vLLM's `SamplingParams` (same names, defaults, order and checks).

Values are normalized and checked when the object is built (as vLLM does) and again when a request is admitted
(`validate`), so a field changed after construction cannot reach the device unchecked. Every check raises a
ValueError naming the parameter; the device sees only values that fit its int32/uint32/fp32 columns. Checks that
need the model (vocabulary ids, `max_logprobs`, tokenizing `bad_words`) run at admission
(engine/input_processor.py).
"""

from __future__ import annotations

import copy
import enum
import math
import numbers
from dataclasses import dataclass, field

from jaxspec.structured_output import GuidedDecodingParams, StructuredOutputsParams

INT32_MAX = 2**31 - 1
MAX_N = 16384  # vLLM's VLLM_MAX_N_SEQUENCES default
MAX_LOGIT_BIAS = 100.0  # vLLM clamps each bias to [-100, 100]


class RequestOutputKind(enum.Enum):
    """What `LLMEngine.step` returns for a request (vLLM's enum)."""
    CUMULATIVE = 0  # everything generated so far, at every step that adds to it
    DELTA = 1  # only what is new since the request's last output (streaming)
    FINAL_ONLY = 2  # one output, when the request finishes (what `LLM.generate` asks for)


def _int(name: str, value, lo: int, hi: int, owner: str = "SamplingParams") -> int:
    if type(value) is not int:  # (a plain int skips the ABC checks: a request's validation runs a dozen of these)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"{owner}.{name} must be an integer, got {value!r} ({type(value).__name__})")
        value = int(value)
    if not lo <= value <= hi:
        raise ValueError(f"{owner}.{name} must be in [{lo}, {hi}], got {value}")
    return value


def _real(name: str, value, lo: float = -math.inf, hi: float = math.inf, owner: str = "SamplingParams") -> float:
    plain = type(value) is float or type(value) is int
    if (not plain and (isinstance(value, bool) or not isinstance(value, numbers.Real))) or not math.isfinite(value):
        raise ValueError(f"{owner}.{name} must be a finite number, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{owner}.{name} must be in [{lo:g}, {hi:g}], got {value}")
    return float(value)


def _int_list(name: str, values, lo: int, hi: int) -> list[int]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"SamplingParams.{name} must be a list of integers, got {values!r}")
    return [_int(f"{name}[{i}]", v, lo, hi) for i, v in enumerate(values)]


def _bool(name: str, value, owner: str = "SamplingParams") -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name} must be a bool, got {value!r}")
    return value


def _num_logprobs(name: str, value) -> int | None:
    """None (off), -1 (the whole vocabulary) or a count >= 0; True means 1, as in vLLM."""
    if value is None:
        return None
    return 1 if value is True else _int(name, value, -1, INT32_MAX)


def _token_id(name: str, key) -> int:
    """A logit_bias key: an integer, or a string of one (OpenAI's JSON keys are strings)."""
    if isinstance(key, str):
        try:
            key = int(key)
        except ValueError:
            raise ValueError(f"SamplingParams.{name} keys must be token ids, got {key!r}") from None
    return _int(f"{name} key", key, 0, INT32_MAX)


@dataclass
class SamplingParams:
    n: int = 1  # samples of the prompt; the prompt is prefilled once and sample i is seeded seed + i
    presence_penalty: float = 0.0  # in [-2, 2]: subtracted from tokens already generated
    frequency_penalty: float = 0.0  # in [-2, 2]: subtracted once per time a token was generated
    repetition_penalty: float = 1.0  # > 0: CTRL's rule on tokens of the prompt or the output (1: off)
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # nucleus mass in (0, 1]; 1 disables
    top_k: int = 0  # 0 (or -1) disables
    min_p: float = 0.0  # in [0, 1]: drop tokens below min_p times the most likely token's probability
    seed: int | None = None  # None: derived from the LLM's seed and the request's admission order
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = field(default_factory=list)
    bad_words: list[str] | None = None  # words never generated (the last token of each, when it would complete it)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0  # EOS and stop_token_ids cannot be generated before this many tokens
    logprobs: int | None = None  # top log-probabilities per output token (plus the sampled one's); -1: all
    prompt_logprobs: int | None = None  # the same per prompt token
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # (slow tokenizers only, as in vLLM)
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit (clamped to [-100, 100])
    allowed_token_ids: list[int] | None = None  # only these tokens can be generated
    # only the last k prompt tokens are kept (left truncation); -1: the last max_model_len; None: the whole prompt
    truncate_prompt_tokens: int | None = None
    # vLLM V1 dropped best_of (beam-style ranking of extra samples): None or n is accepted, anything else rejected
    best_of: int | None = None
    # the output follows a JSON schema, regex or choice (jaxspec.structured_output); guided_decoding is vLLM's name
    # before 0.11, moved here when given
    structured_outputs: StructuredOutputsParams | None = None
    guided_decoding: GuidedDecodingParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop) if isinstance(self.stop, (list, tuple)) else self.stop or []
        self.stop_token_ids = self.stop_token_ids if self.stop_token_ids is not None else []
        self.bad_words = self.bad_words if self.bad_words is not None else []
        if self.seed == -1:  # vLLM's spelling of "no seed"
            self.seed = None
        if self.guided_decoding is not None:
            if self.structured_outputs is not None:
                raise ValueError("SamplingParams takes structured_outputs or guided_decoding (its old name), not both")
            self.structured_outputs, self.guided_decoding = self.guided_decoding, None
        self.validate()
        if self.top_k == -1:
            self.top_k = 0

    def validate(self) -> None:
        """Normalize and check every field; a ValueError names the bad parameter (also run at admission)."""
        self.n = _int("n", self.n, 1, MAX_N)
        if self.best_of is not None and _int("best_of", self.best_of, 1, MAX_N) != self.n:
            raise ValueError(f"SamplingParams.best_of={self.best_of} is not supported (as in vLLM V1): it must be "
                             f"None or equal to n={self.n}")
        self.presence_penalty = _real("presence_penalty", self.presence_penalty, -2.0, 2.0)
        self.frequency_penalty = _real("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        self.repetition_penalty = _real("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(f"SamplingParams.repetition_penalty must be > 0, got {self.repetition_penalty}")
        self.temperature = _real("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if self.n > 1 and self.temperature == 0:
            raise ValueError(f"SamplingParams.n must be 1 when using greedy sampling (temperature 0), got {self.n}")
        self.top_p = _real("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        self.top_k = _int("top_k", self.top_k, -1, INT32_MAX)
        self.min_p = _real("min_p", self.min_p, 0.0, 1.0)
        if self.max_tokens is not None:
            self.max_tokens = _int("max_tokens", self.max_tokens, 1, INT32_MAX)
        self.min_tokens = _int("min_tokens", self.min_tokens, 0, self.max_tokens or INT32_MAX)
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise ValueError(f"SamplingParams.stop must be a string or a list of strings, got {self.stop!r}")
        if any(not s for s in self.stop):
            raise ValueError("SamplingParams.stop must not contain empty strings")
        self.stop_token_ids = list(dict.fromkeys(_int_list("stop_token_ids", self.stop_token_ids, 0, INT32_MAX)))
        if not isinstance(self.bad_words, list) or not all(isinstance(w, str) and w for w in self.bad_words):
            raise ValueError(f"SamplingParams.bad_words must be a list of non-empty strings, got {self.bad_words!r}")
        self.bad_words = list(dict.fromkeys(self.bad_words))  # duplicates dropped, as vLLM does
        for name in ("include_stop_str_in_output", "ignore_eos", "detokenize", "skip_special_tokens",
                     "spaces_between_special_tokens"):
            _bool(name, getattr(self, name))
        if self.stop and not self.detokenize:
            raise ValueError("SamplingParams.stop strings need detokenize=True (the text is what they match)")
        self.logprobs = _num_logprobs("logprobs", self.logprobs)
        self.prompt_logprobs = _num_logprobs("prompt_logprobs", self.prompt_logprobs)
        if self.seed is not None:
            self.seed = _int("seed", self.seed, 0, 2**32 - 1)
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"SamplingParams.output_kind must be a RequestOutputKind, got {self.output_kind!r}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"SamplingParams.logit_bias must be a dict of token id -> bias, got "
                                 f"{self.logit_bias!r}")
            self.logit_bias = {_token_id("logit_bias", t): min(MAX_LOGIT_BIAS, max(-MAX_LOGIT_BIAS, _real(
                f"logit_bias[{t!r}]", b))) for t, b in self.logit_bias.items()}
        if self.truncate_prompt_tokens is not None:
            self.truncate_prompt_tokens = _int("truncate_prompt_tokens", self.truncate_prompt_tokens, -1, INT32_MAX)
            if self.truncate_prompt_tokens == 0:
                raise ValueError("SamplingParams.truncate_prompt_tokens must be >= 1 or -1 (None: no truncation)")
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = _int_list("allowed_token_ids", self.allowed_token_ids, 0, INT32_MAX)
            if not self.allowed_token_ids:
                raise ValueError("SamplingParams.allowed_token_ids must not be empty (None allows every token)")
        if self.structured_outputs is not None:
            if not isinstance(self.structured_outputs, StructuredOutputsParams):
                raise ValueError(f"SamplingParams.structured_outputs must be a StructuredOutputsParams, got "
                                 f"{type(self.structured_outputs).__name__}")
            self.structured_outputs.validate()

    @classmethod
    def from_json(cls, values: dict, **defaults) -> "SamplingParams":
        """SamplingParams from JSON values (a command line's, a config file's): `structured_outputs` as the
        StructuredOutputsParams fields."""
        values = {**defaults, **values}
        if isinstance(values.get("structured_outputs"), dict):
            values["structured_outputs"] = StructuredOutputsParams(**values["structured_outputs"])
        return cls(**values)

    def clone(self) -> "SamplingParams":
        """A deep copy (vLLM's), so that changing one request's params leaves another's alone."""
        return copy.deepcopy(self)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def needs_processors(self) -> bool:
        """Whether a logits processor changes this request's distribution (penalties, min_p, min_tokens, bias,
        masks, a structured-output constraint)."""
        return (self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1
                or self.min_p > 0 or self.min_tokens > 0 or bool(self.logit_bias) or bool(self.bad_words)
                or self.allowed_token_ids is not None or self.structured_outputs is not None)

    @property
    def needs_extended_step(self) -> bool:
        """Whether a processor applies or log-probabilities are wanted: the steps that run it then take the
        extended path (a batch of logprobs alone skips the processors)."""
        return self.needs_processors or self.logprobs is not None


@dataclass
class BeamSearchParams:
    """vLLM's parameters of `LLM.beam_search` (jaxspec.beam_search): beam_width beams of up to max_tokens tokens,
    ranked by cum_logprob / length ** length_penalty."""
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0  # each step's sampled token joins its 2 * beam_width most likely as a candidate
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False  # the server's text keeps the EOS token's text

    def __post_init__(self) -> None:
        owner = type(self).__name__
        self.beam_width = _int("beam_width", self.beam_width, 1, MAX_N, owner)
        self.max_tokens = _int("max_tokens", self.max_tokens, 1, INT32_MAX, owner)
        self.temperature = _real("temperature", self.temperature, 0.0, owner=owner)
        self.length_penalty = _real("length_penalty", self.length_penalty, owner=owner)
        _bool("ignore_eos", self.ignore_eos, owner)
        _bool("include_stop_str_in_output", self.include_stop_str_in_output, owner)
