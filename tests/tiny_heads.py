"""Test fixtures: tiny trained heads for engine tests, and the plain greedy loop their data comes from.

Tiny heads: a head that drafts some, but not all, of a tiny target's greedy tokens.

A tiny random target is chaotic (its next token depends on the whole context), so a head trained for seconds
on a CPU does not generalize to new prompts: it learns the sequences it was trained on, and drafts them about
as well as its training accuracy says (per TTT step: the engine's acceptance per position matches it). So
`train_tiny_head` also returns `prompts` to generate from: three training prompts for each fresh one. Drafts on
the first are mostly accepted, on the second almost never, so the batch's mean acceptance length sits well
inside (1, k + 1) for any k, whatever the exact training accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.models import eagle, llama
from jaxspec.models.attention import AttnBatch, init_cache
from jaxspec.train.data import TokenDataset, pack
from jaxspec.train.trainer import export_head, train_eagle


@partial(jax.jit, static_argnames=("cfg",))
def _greedy_fill(w: llama.Weights, cfg: llama.Config, tokens: jax.Array, prompt_lens: jax.Array) -> jax.Array:
    """Fill every row past its prompt with the target's greedy tokens: one token per step for all rows through a
    KV cache of one T-token page per row (prompt tokens are fed as they are, later ones as sampled)."""
    N, T = tokens.shape
    kv = init_cache(cfg.num_layers, cfg.num_kv_heads, N, T, cfg.head_dim, cfg.jnp_dtype)
    rows = jnp.arange(N, dtype=jnp.int32)

    def body(t, carry):
        tokens, kv = carry
        batch = AttnBatch(rows[:, None], (rows * T + t)[:, None])
        hidden, _, kv = llama.forward(w, cfg, jax.lax.dynamic_slice_in_dim(tokens, t, 1, axis=1),
                                      jnp.full((N, 1), t, jnp.int32), kv, batch)
        nxt = jnp.argmax(llama.lm_head(w, hidden[:, 0]), axis=-1).astype(jnp.int32)  # [N]
        return tokens.at[:, t + 1].set(jnp.where(t + 1 >= prompt_lens, nxt, tokens[:, t + 1])), kv

    return jax.lax.fori_loop(0, T - 1, body, (tokens, kv))[0]


def greedy_dataset(w: llama.Weights, cfg: llama.Config, prompt_ids: list[list[int]], seq_len: int) -> TokenDataset:
    """Greedy continuations to exactly seq_len tokens by a plain loop (no engine, no scheduler, no EOS): for tiny
    models in tests, where it compiles one small program."""
    tokens = np.zeros((len(prompt_ids), seq_len), np.int32)
    lens = np.array([len(p) for p in prompt_ids], np.int32)
    if lens.min() < 1 or lens.max() >= seq_len:
        raise ValueError(f"prompts must have 1 .. {seq_len - 1} tokens")
    for i, p in enumerate(prompt_ids):
        tokens[i, :len(p)] = p
    filled = np.asarray(_greedy_fill(w, cfg.replace(attn_impl="xla"), jnp.asarray(tokens), jnp.asarray(lens)))
    return pack([(p, filled[i, len(p):].tolist()) for i, p in enumerate(prompt_ids)], seq_len,
                {"source": "greedy_dataset", "eos_token_ids": []})


@dataclass
class TinyHead:
    cfg: eagle.EagleConfig
    weights: eagle.EagleWeights  # fp32, d2t attached for EAGLE-3
    path: Path | None  # the exported head directory (speculative_config "model"), when out_dir was given
    # to generate from: 3 training prompts, 1 fresh, 3 training, ...; prompts have at most 12 tokens, so up to
    # seq_len - 12 new tokens stay inside the memorized continuations
    prompts: list[list[int]]
    train_prompts: list[list[int]]
    history: list[dict]


def tiny_aux_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3 feature layers for any depth: the default (2, L//2, L-3) from 8 layers up, else (0, L//2-1, L-1)."""
    if num_layers >= 8:
        return eagle.default_aux_layers(num_layers)
    return tuple(sorted({0, max(num_layers // 2 - 1, 0), num_layers - 1}))


def train_tiny_head(method: str, target_cfg: llama.Config, target_weights: llama.Weights,
                    out_dir: str | Path | None = None, *, steps: int | None = None, num_prompts: int = 32,
                    seq_len: int = 64, batch_size: int = 8, lr: float = 1e-2, ttt_steps: int | None = None,
                    draft_vocab_size: int | None = None, num_eval_prompts: int = 16, seed: int = 0,
                    progress: bool = False) -> TinyHead:
    """Train (and, with out_dir, export in fp32) a head for a tiny target on its own greedy continuations of
    random prompts of 2-12 tokens. EAGLE-3 defaults to a draft vocabulary of 3/4 of the target's, so d2t is a
    real mapping."""
    rng = np.random.default_rng(seed)
    draw = lambda n: [rng.integers(0, target_cfg.vocab_size, int(rng.integers(2, 13))).tolist()
                      for _ in range(n)]
    prompts, fresh = draw(num_prompts), draw(num_eval_prompts)
    data = greedy_dataset(target_weights, target_cfg, prompts, seq_len)
    e3 = method == "eagle3"
    cfg = eagle.EagleConfig.from_target(
        target_cfg, method, aux_layers=tiny_aux_layers(target_cfg.num_layers) if e3 else None,
        draft_vocab_size=(draft_vocab_size or target_cfg.vocab_size * 3 // 4) if e3 else None)
    steps = steps or (120 if e3 else 200)
    # EAGLE-1 weighs its CE at 1.0 instead of the paper's 0.1: here it memorizes twice as fast (top-1 0.67 vs 0.45
    # after 200 steps), and top-1 agreement is all the engine tests look at
    weights, history = train_eagle(target_cfg, target_weights, cfg, data, steps, batch_size, lr,
                                   ttt_steps=ttt_steps or (3 if e3 else 1), w_cls=0.1 if e3 else 1.0, seed=seed,
                                   progress=progress)
    path = export_head(out_dir, cfg, weights, dtype="float32") if out_dir is not None else None
    mixed = [fresh[i] if i % 4 == 3 else prompts[i % len(prompts)] for i in range(num_eval_prompts)]
    return TinyHead(cfg.replace(dtype=target_cfg.dtype), weights, path, mixed, prompts, history)
