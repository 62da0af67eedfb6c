"""Engine configuration (host side): sizes of the batch, the KV pool and the compiled buckets."""

from __future__ import annotations

from dataclasses import dataclass, field

from jaxspec.models.eagle import check_method

MAX_SPECULATIVE_TOKENS = 16


NGRAM_METHODS = ("ngram", "[ngram]", "ngram_gpu")  # vLLM's names of prompt lookup (the last its GPU proposer's)
LOOKUP_KEYS = {"prompt_lookup_min", "prompt_lookup_max"}


def has_lookup_fallback(spec: dict) -> bool:
    """Whether a speculative_config dict asks for a head with prompt lookup as its fallback (vLLM: a config
    without a method whose model is "ngram" is ngram speculation, no head)."""
    ngram = spec.get("method") in NGRAM_METHODS or (spec.get("method") is None and spec.get("model") in NGRAM_METHODS)
    return not ngram and bool(LOOKUP_KEYS & set(spec))


@dataclass
class SpeculativeConfig:
    method: str  # "eagle", "eagle3" or "ngram" (jaxspec.engine.ngram: drafts looked up in the sequence, no head)
    model: str | None  # path of the draft head (HF-style directory); None for ngram
    num_speculative_tokens: int  # K: the most drafts a step verifies
    # How each step picks its k in 0..K (jaxspec.engine.spec_policy): always K (neither set), the k that maximizes
    # expected tokens/s from live acceptance and measured step times (dynamic), or a table from a step's number
    # of decode rows to k (keys: batch sizes, each the smallest it applies to).
    dynamic: bool = False
    num_speculative_tokens_per_batch_size: dict[int, int] | None = None
    # ngram: the n-gram lengths looked up, longest first (vLLM's defaults: both 5, or the one given). With a head
    # (eagle, eagle3), either one given turns on prompt lookup as the head's fallback (engine/step.py,
    # _lookup_fallback): a row drafts by lookup only where the lookup's drafts were, or would have been, accepted
    # strictly further than the head's along the tokens the target emitted
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None

    @property
    def is_ngram(self) -> bool:
        return self.method == "ngram"

    @classmethod
    def parse(cls, spec: dict | "SpeculativeConfig" | None) -> "SpeculativeConfig | None":
        if spec is None or isinstance(spec, SpeculativeConfig):
            return spec
        if not isinstance(spec, dict):
            raise ValueError(f"speculative_config must be a dict, got {type(spec).__name__}")
        method = spec.get("method")
        if method is None:  # vLLM: model "ngram" or "[ngram]" alone selects the method
            method = "ngram" if spec.get("model") in NGRAM_METHODS else "eagle"
        method = "ngram" if method in NGRAM_METHODS else check_method(method, "speculative_config.method")
        spec = _from_vllm(spec)
        unknown = set(spec) - {"method", "model", "num_speculative_tokens", "dynamic",
                               "num_speculative_tokens_per_batch_size"} - LOOKUP_KEYS
        if unknown:
            raise ValueError(f"speculative_config: unknown keys {sorted(unknown)}")
        if method == "ngram":
            if spec.get("model") not in (None, *NGRAM_METHODS):
                raise ValueError(f"speculative_config.model={spec['model']!r}: method 'ngram' uses no draft model")
            if spec.get("dynamic"):
                raise ValueError("speculative_config.dynamic is for draft heads (eagle, eagle3): ngram drafts a "
                                 "varying number of tokens per row; num_speculative_tokens_per_batch_size works")
        elif not spec.get("model"):
            raise ValueError("speculative_config.model (the draft head's path) is required")
        k = spec.get("num_speculative_tokens")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"speculative_config.num_speculative_tokens must be an integer in "
                             f"[1, {MAX_SPECULATIVE_TOKENS}], got {k!r}")
        dynamic = spec.get("dynamic", False)
        if not isinstance(dynamic, bool):
            raise ValueError(f"speculative_config.dynamic must be true or false, got {dynamic!r}")
        table = spec.get("num_speculative_tokens_per_batch_size")
        if table is not None:
            if dynamic:
                raise ValueError("speculative_config: dynamic and num_speculative_tokens_per_batch_size exclude "
                                 "each other")
            table = _k_table(table, k)
        lookup_min, lookup_max = _lookup_lengths(spec) if method == "ngram" or LOOKUP_KEYS & set(spec) else (None, None)
        return cls(method=method, model=None if method == "ngram" else str(spec["model"]),
                   num_speculative_tokens=k, dynamic=dynamic, num_speculative_tokens_per_batch_size=table,
                   prompt_lookup_min=lookup_min, prompt_lookup_max=lookup_max)


def _lookup_lengths(spec: dict) -> tuple[int, int]:
    """(prompt_lookup_min, prompt_lookup_max) as vLLM settles them: both 5 when neither is given, else the missing
    one equal to the other; integers >= 1, min <= max."""
    lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
    for name, value in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"speculative_config.{name} must be an integer >= 1, got {value!r}")
    lo, hi = (5, 5) if lo is None and hi is None else (hi if lo is None else lo, lo if hi is None else hi)
    if lo > hi:
        raise ValueError(f"speculative_config.prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
    return lo, hi


# vLLM's other speculative_config keys: those whose value changes nothing here, at any value or at the ones listed
# (None: the key's default; a value that would change the drafts or their checking is refused by name)
VLLM_KEYS = {"enforce_eager": None, "disable_padded_drafter_batch": None, "draft_tensor_parallel_size": (None, 1),
             "quantization": (None,), "max_model_len": (None,), "revision": (None,), "code_revision": (None,),
             "speculative_token_tree": (None,), "spec_token_tree": (None,), "parallel_drafting": (None, False),
             "acceptance_method": (None, "rejection_sampler"), "disable_by_batch_size": None}


def _from_vllm(spec: dict) -> dict:
    """The config without vLLM's keys that change nothing here; disable_by_batch_size=N (no speculation from N
    decode rows up) becomes the schedule {1: K, N: 0}; any other value of such a key is a ValueError naming it."""
    out = {}
    for key, value in spec.items():
        if key not in VLLM_KEYS:
            out[key] = value
        elif VLLM_KEYS[key] is not None and value not in VLLM_KEYS[key]:
            hint = "; LLM(draft_tensor_parallel_size=...) sets it" if key == "draft_tensor_parallel_size" else ""
            raise ValueError(f"speculative_config.{key}={value!r} is not supported (jaxspec takes "
                             f"{' or '.join(map(repr, VLLM_KEYS[key]))}{hint})")
    n = spec.get("disable_by_batch_size")
    if n is not None:
        k = spec.get("num_speculative_tokens")
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ValueError(f"speculative_config.disable_by_batch_size must be an integer >= 2, got {n!r}")
        if "num_speculative_tokens_per_batch_size" in spec or spec.get("dynamic"):
            raise ValueError("speculative_config: disable_by_batch_size, dynamic and "
                             "num_speculative_tokens_per_batch_size exclude each other")
        out["num_speculative_tokens_per_batch_size"] = {1: k, n: 0}
    return out


def _k_table(table, max_k: int) -> dict[int, int]:
    """{batch size: k} with integer keys (JSON gives strings), k in [0, max_k], sizes >= 1; one entry for size 1."""
    name = "speculative_config.num_speculative_tokens_per_batch_size"
    if not isinstance(table, dict) or not table:
        raise ValueError(f"{name} must be a non-empty mapping from batch sizes to k, got {table!r}")
    out = {}
    for size, k in table.items():
        try:
            size = int(size)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: batch size {size!r} is not an integer") from None
        if size < 1 or isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= max_k:
            raise ValueError(f"{name}: {size}: {k!r} needs a batch size >= 1 and a k in [0, "
                             f"num_speculative_tokens={max_k}]")
        out[size] = k
    if min(out) != 1:
        raise ValueError(f"{name} must have an entry for batch size 1 (the smallest), got {sorted(out)}")
    return dict(sorted(out.items()))


def buckets_up_to(limit: int, smallest: int = 1, factor: int = 2) -> list[int]:
    """Geometric sizes from `smallest` below `limit`, then `limit`: the padded sizes we compile for."""
    sizes, b = [], smallest
    while b < limit:
        sizes.append(b)
        b *= factor
    return sizes + [limit]


def _trim(buckets: list[int], limit: int) -> list[int]:
    """Sorted, without duplicates, and nothing past the first size that reaches `limit` (never used, never compiled)."""
    sizes = sorted(set(buckets))
    reach = [b for b in sizes if b >= limit]
    return [b for b in sizes if b < limit] + reach[:1]


@dataclass
class EngineConfig:
    max_model_len: int
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048  # prefill tokens of one step (chunked prefill splits longer prompts)
    max_prefill_seqs: int = 8  # sequences whose chunks one prefill step may carry
    page_size: int = 16
    num_pages: int = 0  # KV pages in the pool; 0 = size from memory_fraction (GPU) or enough for max_num_seqs
    memory_fraction: float = 0.85  # of device memory, for weights + KV pool, when num_pages is 0
    seed: int = 0
    max_logprobs: int = 20  # the most logprobs / prompt_logprobs a request may ask for (vLLM's default)
    speculative: SpeculativeConfig | None = None
    decode_buckets: list[int] = field(default_factory=list)
    prefill_buckets: list[int] = field(default_factory=list)
    # decode steps one dispatch may run (multi-step decoding) while no request waits or prefills; 1: one per dispatch
    num_scheduler_steps: int = 1
    # when a decoding sequence needs a page, every decoding sequence gets pages for this many more positions (while
    # free pages stay plentiful): block tables, and so the plan arrays written to the device before a step, change
    # at one step in many instead of at nearly every step of a large batch (Scheduler._top_up); 0: pages as needed
    page_lookahead: int = 64
    # ... and first, while the free pages cover it for every one of them, pages for each one's whole length (prompt +
    # max_tokens, plus page_lookahead), as a prompt's last chunk is planned too: block tables, and with them the
    # step's plan, then stay put until sequences finish or join. A plan write made XLA update the CUDA graph of the
    # next step or two (random SmolLM2, batch 1, EAGLE k = 3, an H100: ~1.4 ms an update with single steps, ~9 ms
    # with 4 a dispatch, at every page_lookahead round). Pages taken ahead go back before a request would wait for
    # pages, a cached page be evicted or a sequence be preempted (Scheduler._make_room). False: rounds of
    # page_lookahead only
    page_reserve_whole: bool = True
    # vLLM's automatic prefix caching (on by default there too): full prompt pages reused across requests
    enable_prefix_caching: bool = True
    # structured outputs: the device pool of constraint automata (engine/grammar.py), in states and transitions;
    # grammar_transitions 0: max_states * vocab_size / 4, at most 2**23 or 128 per vocabulary entry, whichever is more
    # (a JSON object automaton has ~67 a vocabulary entry: 1,623 states and 3.3 M transitions on a 49k vocabulary, so
    # 2**23 alone would refuse it at Llama-3's 128k); the pool takes 4 * (vocab / 32 + 3) bytes a state, 8 a transition
    grammar_states: int = 4096
    grammar_transitions: int = 0

    def __post_init__(self) -> None:
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "max_prefill_seqs", "page_size",
                     "num_pages", "max_logprobs", "num_scheduler_steps", "page_lookahead", "grammar_states",
                     "grammar_transitions"):
            value, lo = getattr(self, name), 0 if name in ("num_pages", "max_logprobs", "page_lookahead",
                                                            "grammar_states", "grammar_transitions") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
        for name in ("decode_buckets", "prefill_buckets"):
            if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in getattr(self, name)):
                raise ValueError(f"{name} must be positive integers, got {getattr(self, name)!r}")
        self.max_prefill_seqs = min(self.max_prefill_seqs, self.max_num_seqs)
        # a prefill step carries at most max_prefill_seqs chunks, each shorter than max_model_len: no bucket past that
        self.max_num_batched_tokens = min(self.max_num_batched_tokens,
                                          self.max_prefill_seqs * max(1, self.max_model_len - 1))
        self.decode_buckets = _trim(self.decode_buckets or buckets_up_to(self.max_num_seqs), self.max_num_seqs)
        # prefill sizes grow by 4x: a prompt pays at most 4x its tokens in padding, and each bucket is a compile
        # (tens of seconds on a GPU with the unrolled layer loop)
        self.prefill_buckets = _trim(self.prefill_buckets or buckets_up_to(
            self.max_num_batched_tokens, min(16, self.max_num_batched_tokens), factor=4), self.max_num_batched_tokens)
        for name in ("enable_prefix_caching", "page_reserve_whole"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.decode_buckets[-1] < self.max_num_seqs:
            raise ValueError(f"decode_buckets {self.decode_buckets} must reach max_num_seqs={self.max_num_seqs}")
        if self.prefill_buckets[-1] < self.max_num_batched_tokens:
            raise ValueError(f"prefill_buckets {self.prefill_buckets} must reach max_num_batched_tokens="
                             f"{self.max_num_batched_tokens}")

    def grammar_max_transitions(self, vocab_size: int) -> int:
        return self.grammar_transitions or min(max(2**23, 128 * vocab_size), self.grammar_states * vocab_size // 4)

    @property
    def num_speculative_tokens(self) -> int:
        return self.speculative.num_speculative_tokens if self.speculative else 0

    @property
    def pages_per_seq(self) -> int:
        # Writes past max_model_len (draft look-ahead near the end) are dropped on the device.
        return -(-self.max_model_len // self.page_size)
