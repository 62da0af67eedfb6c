"""Training data for EAGLE heads: the target regenerates answers to prompts (the EAGLE recipe), kept as tokens.

A dataset is fixed-shape rows, one sequence per row: `tokens [N, seq_len]` int32 (prompt then response, zero
padding after `lengths`) and `loss_mask [N, seq_len]` (1 on response tokens). Rows are padded, not packed: the
target's dense forward has no document mask, so packed sequences would attend across each other. Hidden states
are not stored; the train step recomputes them from the frozen target (cheap next to the head's backward).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jaxspec.chat import encode_chat
from jaxspec.train.prompt_filters import Deduplicator


@dataclass
class TokenDataset:
    tokens: np.ndarray  # [N, seq_len] int32
    loss_mask: np.ndarray  # [N, seq_len] uint8: 1 where the token is part of the response
    lengths: np.ndarray  # [N] int32: tokens before the padding
    meta: dict = field(default_factory=dict)  # provenance: sources, model, max_tokens, eos ids, ...

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:  # a file object, so numpy does not append ".npz" to the name
            np.savez_compressed(f, tokens=self.tokens, loss_mask=self.loss_mask, lengths=self.lengths,
                                meta=np.array(json.dumps(self.meta)))
        return path

    @classmethod
    def load(cls, path: str | Path) -> TokenDataset:
        with np.load(path) as z:
            missing = {"tokens", "loss_mask", "lengths"} - set(z.files)
            if missing:
                raise ValueError(f"{path}: not a token dataset (missing {sorted(missing)})")
            meta = json.loads(str(z["meta"])) if "meta" in z.files else {}
            return cls(z["tokens"].astype(np.int32), z["loss_mask"].astype(np.uint8), z["lengths"].astype(np.int32),
                       meta)


def pack(sequences: list[tuple[list[int], list[int]]], seq_len: int, meta: dict | None = None) -> TokenDataset:
    """(prompt ids, response ids) pairs -> padded rows, truncated to seq_len. Rows whose response would be empty
    after truncation are dropped."""
    kept = [(p, r[:seq_len - len(p)]) for p, r in sequences if len(p) < seq_len and r]
    kept = [(p, r) for p, r in kept if r]
    tokens = np.zeros((len(kept), seq_len), np.int32)
    mask = np.zeros((len(kept), seq_len), np.uint8)
    lengths = np.zeros((len(kept),), np.int32)
    for i, (p, r) in enumerate(kept):
        n = len(p) + len(r)
        tokens[i, :n] = p + r
        mask[i, len(p):n] = 1
        lengths[i] = n
    return TokenDataset(tokens, mask, lengths, dict(meta or {}, num_dropped=len(sequences) - len(kept)))


# ---------------------------------------------------------------- prompts

def chat_token_ids(tokenizer: Any, prompts: list[str]) -> list[list[int]]:
    """Each prompt as one user turn through the chat template, ready for generation (as `LLM.chat` does)."""
    return [encode_chat(tokenizer, [{"role": "user", "content": text}]) for text in prompts]


def mix_prompts(sources: list[tuple[str, list[str]]], seed: int,
                near_duplicate_jaccard: float = 0.7) -> tuple[list[str], dict]:
    """One training mix from several named prompt lists: exact and near duplicates dropped within and across
    sources (the first occurrence, in source order, stays), then shuffled by `seed`, so that a time budget that cuts
    the answers short still keeps every source's share. Returns (prompts, provenance)."""
    dedup = Deduplicator(near_duplicate_jaccard)
    kept: list[str] = []
    counts: dict[str, dict] = {}
    for name, prompts in sources:
        mine = [p for p in prompts if dedup.add(p) is None]
        counts[name] = {"num_prompts": len(prompts), "num_kept": len(mine)}
        kept += mine
    order = np.random.default_rng(seed).permutation(len(kept))
    return [kept[i] for i in order], {"sources": counts, "num_duplicates": sum(len(p) for _, p in sources) - len(kept),
                                      "near_duplicate_jaccard": near_duplicate_jaccard, "shuffle_seed": seed}


# ---------------------------------------------------------------- generating with the engine

def generation_llm(model: str | Path, max_model_len: int, max_num_seqs: int, seed: int = 0,
                   dtype: str = "bfloat16", speculative_config: dict | None = None) -> Any:
    """A jaxspec `LLM` for one-off bulk generation: scanned layers (seconds to compile), one decode and one prefill
    bucket, each program compiled on first use. A small target's step is launch-bound, so padding a batch's tail to
    the full bucket costs about what the full batch does, and less than compiling more buckets would. A prefill
    step carries up to 4,096 tokens (16 per slot for small batches: CPU tests). `speculative_config` (vLLM's
    dict, e.g. an earlier head of the target) drafts while generating: lossless, so the data is the target's
    own either way, only made in fewer steps."""
    from jaxspec.llm import LLM

    prefill = min(4096, 16 * max_num_seqs)
    return LLM(str(model), dtype=dtype, max_model_len=max_model_len, max_num_seqs=max_num_seqs, seed=seed,
               layer_loop="scan", max_num_batched_tokens=prefill, max_prefill_seqs=min(32, max_num_seqs),
               prefill_buckets=[prefill], decode_buckets=[max_num_seqs], warmup=False,
               speculative_config=speculative_config)


# Prompts per chunk of a time-budgeted generation, in engine batches: a chunk's tail (its last sequences finishing
# in a batch that is mostly padding) costs about max_tokens steps, so chunks are long; the last one is cut to fit.
CHUNK_BATCHES = 16


def generate_in_chunks(llm: Any, prompts: list, params: list, chunk_size: int, time_budget_s: float | None = None,
                       use_tqdm: bool = True) -> Iterator[tuple[int, list]]:
    """`llm.generate` over consecutive chunks, yielding (first index, outputs) in order. With a time budget (seconds
    from the first call, the caller's work between chunks included), each chunk is cut to the prompts that the time
    per prompt so far says still fit, and generation stops when none do; the first chunk's compile time makes that
    estimate err on the safe side."""
    start, done = time.perf_counter(), 0
    while done < len(prompts):
        n = min(chunk_size, len(prompts) - done)
        if time_budget_s is not None and done:
            elapsed = time.perf_counter() - start
            n = min(n, int((time_budget_s - elapsed) / (elapsed / done)))
            if n < 1:
                return
        yield done, llm.generate(prompts[done:done + n], params[done:done + n], use_tqdm=use_tqdm)
        done += n


def generate_dataset(llm: Any, prompt_ids: list[list[int]], max_tokens: int, seq_len: int,
                     meta: dict | None = None, use_tqdm: bool = True, time_budget_s: float | None = None,
                     chunk_size: int | None = None) -> TokenDataset:
    """The target's greedy responses through our engine (`llm` is a jaxspec `LLM`); prompt + response rows.

    Each request asks for at most what still fits in seq_len, so no generated token is thrown away; responses
    keep their EOS (the head learns to draft it too). Put the EOS ids in `meta["eos_token_ids"]`: EAGLE-3's
    draft vocabulary always keeps them. With `time_budget_s`, prompts go in chunks (default 16 engine batches) and
    those that no longer fit are left out (`meta["num_cut_by_time_budget"]`).
    """
    from jaxspec.sampling_params import SamplingParams

    fit = [p for p in prompt_ids if len(p) < seq_len - 1]
    params = [SamplingParams(temperature=0, max_tokens=min(max_tokens, seq_len - len(p))) for p in fit]
    chunk = chunk_size or (CHUNK_BATCHES * llm.engine_config.max_num_seqs if time_budget_s is not None
                           else max(len(fit), 1))
    pairs = [(list(p), list(o.outputs[0].token_ids))
             for lo, outs in generate_in_chunks(llm, fit, params, chunk, time_budget_s, use_tqdm)
             for p, o in zip(fit[lo:], outs)]
    info = {"num_prompts": len(prompt_ids), "num_too_long": len(prompt_ids) - len(fit), "max_tokens": max_tokens,
            "seq_len": seq_len, "num_cut_by_time_budget": len(fit) - len(pairs)}
    return pack(pairs, seq_len, {**(meta or {}), **info})


# ---------------------------------------------------------------- EAGLE-3's reduced vocabulary

def draft_vocab(dataset: TokenDataset, vocab_size: int, draft_vocab_size: int,
                keep: tuple[int, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """EAGLE-3's draft vocabulary: the `keep` ids (EOS) plus the most frequent response tokens of the data, then
    prompt tokens, then the lowest unused ids to fill up. Returns (d2t [draft_V] with target id = draft id +
    d2t[draft id], t2d [V] int32: the draft id of each target id or -1), draft ids ascending in target id."""
    if not 0 < draft_vocab_size <= vocab_size:
        raise ValueError(f"draft_vocab_size must be in [1, {vocab_size}], got {draft_vocab_size}")
    valid = np.arange(dataset.seq_len)[None, :] < dataset.lengths[:, None]
    response = np.bincount(dataset.tokens[dataset.loss_mask > 0], minlength=vocab_size)[:vocab_size]
    anywhere = np.bincount(dataset.tokens[valid], minlength=vocab_size)[:vocab_size]
    # one sort key: keep first, then response counts, then all counts, then low ids (stable sort keeps id order)
    score = response.astype(np.float64) * (anywhere.max() + 1) + anywhere
    score[list(keep)] = np.inf
    chosen = np.sort(np.argsort(-score, kind="stable")[:draft_vocab_size])
    d2t = (chosen - np.arange(draft_vocab_size)).astype(np.int32)
    t2d = np.full((vocab_size,), -1, np.int32)
    t2d[chosen] = np.arange(draft_vocab_size, dtype=np.int32)
    return d2t, t2d
