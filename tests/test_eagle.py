"""EAGLE-1/EAGLE-3 heads: conversion from the published layouts, forward against an independent torch reference,
paged (chunked, drafting) == dense, save -> load exactness, and clear errors for heads that do not fit.

The reference below is written from the EAGLE papers' / reference code's math (EAGLE `cnets.py`, sglang
`llama_eagle3.py`) in float64 torch over the HF-layout state dict: it shares no code with jaxspec.
"""

from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.torch import save_file as torch_save_file

from jaxspec.convert.eagle import load_eagle, save_eagle
from jaxspec.models import eagle, llama
from jaxspec.models.attention import AttnBatch, init_cache
from tests.numerics import FP32_EPS, assert_close_scaled

H, I, V, VD, HEADS, KV_HEADS, HD = 64, 128, 160, 96, 4, 2, 16
TARGET = llama.Config(vocab_size=V, hidden_size=H, intermediate_size=I, num_layers=8, num_heads=HEADS,
                      num_kv_heads=KV_HEADS, head_dim=HD, rope_theta=10000.0)
# The EAGLE-3 head uses Llama 3 RoPE scaling with a short original context so all three frequency bands occur.
SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 32}
AUX_IDS = [1, 3, 5]  # SpecForge output-of-layer ids -> inputs of layers (2, 4, 6)
FWD = jax.jit(eagle.forward, static_argnames=("from_target",))
# Eager init compiles one tiny program per leaf shape; one jitted program is much faster on CPU.
LLAMA_INIT = jax.jit(llama.init, static_argnames=("scale",))
EAGLE_INIT = jax.jit(eagle.init)
LOGITS, DRAFTS = jax.jit(eagle.draft_logits), jax.jit(eagle.draft_tokens)
# fp32 against the float64 reference, or paged against dense: sums of up to 3H = 192 terms (EAGLE-3's fc) rounded
# in fp32, in other orders
ROUNDING = 3 * H * FP32_EPS


# ---------------------------------------------------------------- head files in the published layouts

def _hf_config(method: str) -> dict:
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": I,
          "num_hidden_layers": 1, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
          "rms_norm_eps": 1e-5, "vocab_size": V, "max_position_embeddings": 256, "hidden_act": "silu"}
    if method == "eagle":
        return hf | {"rope_theta": 10000.0, "bias": True}
    return hf | {"architectures": ["LlamaForCausalLMEagle3"], "rope_theta": 10000.0, "rope_scaling": SCALING,
                 "draft_vocab_size": VD, "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX_IDS}}


def _state_dict(method: str, seed: int) -> dict[str, torch.Tensor]:
    """A random head in HF layout ([out, in]); norms away from one so their weights matter."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s, scale=0.08: scale * torch.randn(*s, generator=g)  # noqa: E731
    norm = lambda: 1.0 + 0.2 * torch.randn(H, generator=g)  # noqa: E731
    p = "layers.0." if method == "eagle" else "midlayer."
    attn_in = H if method == "eagle" else 2 * H
    sd = {
        "fc.weight": rnd(H, 2 * H if method == "eagle" else 3 * H),
        f"{p}self_attn.q_proj.weight": rnd(HEADS * HD, attn_in),
        f"{p}self_attn.k_proj.weight": rnd(KV_HEADS * HD, attn_in),
        f"{p}self_attn.v_proj.weight": rnd(KV_HEADS * HD, attn_in),
        f"{p}self_attn.o_proj.weight": rnd(H, HEADS * HD),
        f"{p}post_attention_layernorm.weight": norm(),
        f"{p}mlp.gate_proj.weight": rnd(I, H), f"{p}mlp.up_proj.weight": rnd(I, H),
        f"{p}mlp.down_proj.weight": rnd(H, I),
    }
    if method == "eagle":
        sd["fc.bias"] = rnd(H)
    else:
        hot = torch.sort(torch.randperm(V, generator=g)[:VD]).values
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[hot] = True
        sd |= {f"{p}input_layernorm.weight": norm(), f"{p}hidden_norm.weight": norm(), "norm.weight": norm(),
               "lm_head.weight": rnd(VD, H, scale=0.5), "d2t": hot - torch.arange(VD), "t2d": t2d}
    return sd


def _write_head(path: str, method: str, sd: dict[str, torch.Tensor], hf: dict) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf, f)
    if method == "eagle":
        torch.save(sd, os.path.join(path, "pytorch_model.bin"))  # as the yuhuili/EAGLE-* heads ship
    else:
        torch_save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(path, "model.safetensors"))
    return path


@pytest.fixture(scope="module")
def target() -> llama.Weights:
    return LLAMA_INIT(TARGET, jax.random.PRNGKey(0), scale=0.1)


@pytest.fixture(scope="module", params=["eagle", "eagle3"])
def head(request, tmp_path_factory):
    """(method, HF state dict, directory) of a head written the way it ships."""
    method = request.param
    sd = _state_dict(method, seed=1 if method == "eagle" else 2)
    path = _write_head(str(tmp_path_factory.mktemp(method)), method, sd, _hf_config(method))
    return method, sd, path


# ---------------------------------------------------------------- independent float64 reference

def _t(x) -> torch.Tensor:
    return torch.from_numpy(np.asarray(x, dtype=np.float64))


def ref_rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def ref_inv_freq(scaling: dict | None) -> torch.Tensor:
    """RoPE frequencies; Llama 3.1's `apply_scaling` (Meta reference code) when scaled."""
    freqs = [1.0 / 10000.0 ** (i / HD) for i in range(0, HD, 2)]
    if scaling:
        f, lo, hi, old = (scaling[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                                 "original_max_position_embeddings"))
        out = []
        for freq in freqs:
            wavelen = 2 * math.pi / freq
            if wavelen < old / hi:
                out.append(freq)
            elif wavelen > old / lo:
                out.append(freq / f)
            else:
                smooth = (old / wavelen - lo) / (hi - lo)
                out.append((1 - smooth) * freq / f + smooth * freq)
        freqs = out
    return torch.tensor(freqs, dtype=torch.float64)


def ref_rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x [B, T, n, D]: rotate the pairs (i, i + D/2) by pos * inv_freq[i] (the HF layout)."""
    ang = pos[..., None].double() * inv_freq  # [B, T, D/2]
    cos, sin = ang.cos()[:, :, None], ang.sin()[:, :, None]
    x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def ref_attention(x: torch.Tensor, sd: dict, p: str, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Causal GQA self-attention (query head j reads KV head j // (heads / kv_heads))."""
    B, T, _ = x.shape
    w = lambda n: _t(sd[f"{p}self_attn.{n}_proj.weight"])  # noqa: E731
    q = ref_rope((x @ w("q").T).view(B, T, HEADS, HD), pos, inv_freq)
    k = ref_rope((x @ w("k").T).view(B, T, KV_HEADS, HD), pos, inv_freq)
    v = (x @ w("v").T).view(B, T, KV_HEADS, HD)
    k, v = (a.repeat_interleave(HEADS // KV_HEADS, dim=2) for a in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(HD)
    causal = pos[:, None, None, :] <= pos[:, None, :, None]  # key position <= query position
    probs = torch.softmax(scores.masked_fill(~causal, -math.inf), dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(B, T, HEADS * HD) @ w("o").T


def ref_mlp(x: torch.Tensor, sd: dict, p: str) -> torch.Tensor:
    w = lambda n: _t(sd[f"{p}mlp.{n}_proj.weight"])  # noqa: E731
    return (torch.nn.functional.silu(x @ w("gate").T) * (x @ w("up").T)) @ w("down").T


def ref_fc(sd: dict, x) -> torch.Tensor:
    y = _t(x) @ _t(sd["fc.weight"]).T
    return y + _t(sd["fc.bias"]) if "fc.bias" in sd else y


def ref_forward(method: str, sd: dict, embed: np.ndarray, tokens, h, pos) -> torch.Tensor:
    """`h`: EAGLE-1 the fc input's feature half [B, T, H]; EAGLE-3 the residual stream after fc (or fed back)."""
    e, pos = _t(embed)[torch.from_numpy(np.array(tokens))], torch.from_numpy(np.array(pos))
    if method == "eagle":  # cnets.py: fc(cat(embed, hidden)), then the layer with no input_layernorm
        p, inv_freq = "layers.0.", ref_inv_freq(None)
        x = ref_fc(sd, torch.cat([e, _t(h)], dim=-1))
        x = x + ref_attention(x, sd, p, pos, inv_freq)
    else:  # llama_eagle3.py: attention over cat(input_layernorm(embed), hidden_norm(h)), residual h
        p, inv_freq = "midlayer.", ref_inv_freq(SCALING)
        h = _t(h)
        a_in = torch.cat([ref_rms(e, _t(sd[f"{p}input_layernorm.weight"])),
                          ref_rms(h, _t(sd[f"{p}hidden_norm.weight"]))], dim=-1)
        x = h + ref_attention(a_in, sd, p, pos, inv_freq)
    return x + ref_mlp(ref_rms(x, _t(sd[f"{p}post_attention_layernorm.weight"])), sd, p)


def ref_logits(method: str, sd: dict, target: llama.Weights, out: torch.Tensor) -> torch.Tensor:
    if method == "eagle":  # the target's lm_head, no norm
        head = target.embed.T if target.lm_head is None else target.lm_head
        return out @ _t(head)
    return ref_rms(out, _t(sd["norm.weight"])) @ _t(sd["lm_head.weight"]).T


def ref_target_ids(method: str, sd: dict, logits: torch.Tensor) -> np.ndarray:
    ids = logits.argmax(-1)
    return (ids if method == "eagle" else ids + sd["d2t"][ids]).numpy()


# ---------------------------------------------------------------- tests

def _inputs(method: str, B: int, T: int, from_target: bool, seed: int = 3):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, V, (B, T)).astype(np.int32)
    width = 3 * H if (method == "eagle3" and from_target) else H
    hidden = rng.normal(0, 1.0, (B, T, width)).astype(np.float32)
    positions = (np.arange(T)[None] + np.arange(B)[:, None] * 5).astype(np.int32)  # rows at different offsets
    return tokens, hidden, positions


@pytest.mark.parametrize("from_target", [True, False])
def test_forward_matches_reference(head, target, from_target):
    method, sd, path = head
    cfg, w = load_eagle(path, TARGET)
    assert cfg.method == method
    if method == "eagle3":
        assert cfg.aux_layers == (2, 4, 6) and cfg.draft_vocab_size == VD and cfg.rope_scaling is not None
    tokens, hidden, positions = _inputs(method, 2, 10, from_target)
    out, kv = FWD(w, cfg, target.embed, tokens, hidden, positions, from_target=from_target)
    assert kv is None and out.shape == (2, 10, H)

    h = ref_fc(sd, hidden) if (method == "eagle3" and from_target) else hidden
    ref_out = ref_forward(method, sd, np.asarray(target.embed), tokens, h, positions)
    assert_close_scaled(out, ref_out.numpy(), ROUNDING, err_msg="head output")

    logits = LOGITS(w, cfg, target, out)
    ref = ref_logits(method, sd, target, ref_out)
    assert logits.dtype == jnp.float32 and logits.shape == (2, 10, V if method == "eagle" else VD)
    assert_close_scaled(logits, ref.numpy(), ROUNDING, err_msg="draft logits")
    drafts = DRAFTS(w, cfg, target, out)
    assert drafts.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(drafts), ref_target_ids(method, sd, ref))


def _paged(B: int, page_size: int = 4, pages_per_seq: int = 4, seed: int = 0):
    """A one-layer cache and shuffled block tables (pages of different rows interleave)."""
    perm = np.random.default_rng(seed).permutation(B * pages_per_seq + 2)[: B * pages_per_seq]
    block_tables = perm.reshape(B, pages_per_seq).astype(np.int32)
    kv = init_cache(1, KV_HEADS, B * pages_per_seq + 2, page_size, HD, jnp.float32)

    def slots(positions: np.ndarray, valid: np.ndarray) -> np.ndarray:
        page = np.take_along_axis(block_tables, positions // page_size, axis=1)
        return np.where(valid, page * page_size + positions % page_size, -1).astype(np.int32)

    return kv, block_tables, slots


@pytest.mark.parametrize("from_target", [True, False])
def test_paged_chunks_equal_dense(head, target, from_target):
    """Prefill in two chunks of 5 (row 1 is 7 long: padding in its second chunk) == one dense pass."""
    method, _, path = head
    if method == "eagle" and not from_target:
        pytest.skip("EAGLE-1 applies fc to either kind of hidden: same computation as from_target=True")
    cfg, w = load_eagle(path, TARGET)
    B, T, lengths = 2, 10, np.array([10, 7])
    tokens, hidden, _ = _inputs(method, B, T, from_target, seed=4)
    positions = np.broadcast_to(np.arange(T, dtype=np.int32), (B, T))
    dense, _ = FWD(w, cfg, target.embed, tokens, hidden, positions, from_target=from_target)

    kv, block_tables, slots = _paged(B)
    outs = []
    for start, stop in ((0, 5), (5, 10)):
        pos = positions[:, start:stop]
        mapping = slots(pos, pos < lengths[:, None])  # padding tokens get slot -1: not written
        batch = AttnBatch(block_tables=jnp.asarray(block_tables), slot_mapping=jnp.asarray(mapping))
        out, kv = FWD(w, cfg, target.embed, tokens[:, start:stop], hidden[:, start:stop], pos, kv, batch,
                      from_target=from_target)
        outs.append(np.asarray(out))
    paged = np.concatenate(outs, axis=1)
    valid = positions < lengths[:, None]
    assert_close_scaled(paged[valid], np.asarray(dense)[valid], ROUNDING, err_msg="paged vs dense")


def test_drafting_loop_matches_reference(head, target):
    """The engine's pattern: one pass over target features, then single-token passes feeding `out` back as
    `hidden` (from_target=False) and the greedy draft as the next token; checked position by position against
    the dense reference run over the same (mixed) inputs."""
    method, sd, path = head
    cfg, w = load_eagle(path, TARGET)
    B, T0, steps = 2, 5, 4
    tokens, feats, _ = _inputs(method, B, T0, from_target=True, seed=5)
    kv, block_tables, slots = _paged(B, seed=1)
    bt = jnp.asarray(block_tables)

    pos = np.broadcast_to(np.arange(T0, dtype=np.int32), (B, T0))
    batch = AttnBatch(block_tables=bt, slot_mapping=jnp.asarray(slots(pos, pos >= 0)))
    out, kv = FWD(w, cfg, target.embed, tokens, feats, pos, kv, batch, from_target=True)
    all_tokens, all_outs = [tokens], [np.asarray(out)]
    h_ref = [ref_fc(sd, feats).numpy() if method == "eagle3" else feats]  # the reference's per-position h
    for step in range(steps):
        last = out[:, -1:]  # [B, 1, H]
        tok = DRAFTS(w, cfg, target, last)  # [B, 1]
        p = np.full((B, 1), T0 + step, np.int32)
        batch = AttnBatch(block_tables=bt, slot_mapping=jnp.asarray(slots(p, p >= 0)))
        out, kv = FWD(w, cfg, target.embed, tok, last, p, kv, batch, from_target=False)
        all_tokens.append(np.asarray(tok))
        all_outs.append(np.asarray(out))
        h_ref.append(np.asarray(last))
    tokens, outs, h = (np.concatenate(a, axis=1) for a in (all_tokens, all_outs, h_ref))
    positions = np.broadcast_to(np.arange(T0 + steps, dtype=np.int32), (B, T0 + steps))
    ref = ref_forward(method, sd, np.asarray(target.embed), tokens, h, positions)
    assert_close_scaled(outs, ref.numpy(), ROUNDING, err_msg="drafting loop")


@pytest.mark.parametrize("method,dtype", [("eagle", "float32"), ("eagle3", "float32"), ("eagle3", "bfloat16")])
def test_save_load_roundtrip_is_exact(tmp_path, method, dtype):
    tgt = TARGET.replace(dtype=dtype)
    cfg = eagle.EagleConfig.from_target(tgt, method, draft_vocab_size=VD if method == "eagle3" else None,
                                        fc_bias=method == "eagle", own_embed=True)
    w = EAGLE_INIT(cfg, jax.random.PRNGKey(7))
    save_eagle(str(tmp_path), cfg, w)
    cfg2, w2 = load_eagle(str(tmp_path), tgt)
    assert cfg2 == cfg
    assert jax.tree.structure(w2) == jax.tree.structure(w)
    for a, b in zip(jax.tree.leaves(w), jax.tree.leaves(w2)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    if method == "eagle3":
        hf = json.load(open(tmp_path / "config.json"))
        assert hf["architectures"] == ["LlamaForCausalLMEagle3"]
        assert hf["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # default (2, 4, 5), minus one


def test_abstract_matches_loaded(head):
    _, _, path = head
    cfg, w = load_eagle(path, TARGET)
    shapes = eagle.abstract(cfg)
    assert jax.tree.structure(shapes) == jax.tree.structure(w)
    assert [(x.shape, x.dtype) for x in jax.tree.leaves(shapes)] == [(x.shape, x.dtype) for x in jax.tree.leaves(w)]


# ---------------------------------------------------------------- heads that do not fit

def _bad(tmp_path, method: str, hf_changes: dict | None = None, drop: str | None = None,
         reshape: str | None = None) -> str:
    sd = _state_dict(method, seed=9)
    if drop:
        del sd[drop]
    if reshape:
        sd[reshape] = sd[reshape][:-1]
    return _write_head(str(tmp_path / method), method, sd, _hf_config(method) | (hf_changes or {}))


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_hidden_size_mismatch(tmp_path, method):
    with pytest.raises(ValueError, match="hidden_size=64 but the target has 96"):
        load_eagle(_bad(tmp_path, method), TARGET.replace(hidden_size=96, head_dim=24))


def test_vocab_mismatch(tmp_path):
    with pytest.raises(ValueError, match="vocab_size=160 but the target has 200"):
        load_eagle(_bad(tmp_path, "eagle3"), TARGET.replace(vocab_size=200))


def test_head_dim_mismatch(tmp_path):
    with pytest.raises(ValueError, match="head_dim"):
        load_eagle(_bad(tmp_path, "eagle"), TARGET.replace(num_heads=8, num_kv_heads=4, head_dim=8))


def test_aux_layer_out_of_range(tmp_path):
    with pytest.raises(ValueError, match=r"aux layer\(s\) \[6\].*5-layer target"):
        load_eagle(_bad(tmp_path, "eagle3"), TARGET.replace(num_layers=5))


@pytest.mark.parametrize("method,name", [("eagle", "layers.0.mlp.up_proj.weight"), ("eagle3", "d2t"),
                                         ("eagle3", "midlayer.hidden_norm.weight")])
def test_missing_tensor(tmp_path, method, name):
    with pytest.raises(ValueError, match=rf"(pytorch_model.bin|model.safetensors): missing tensor.*{name}"):
        load_eagle(_bad(tmp_path, method, drop=name), TARGET)


def test_wrong_shape(tmp_path):
    with pytest.raises(ValueError, match=r"model.safetensors: tensor midlayer.self_attn.k_proj.weight has shape"):
        load_eagle(_bad(tmp_path, "eagle3", reshape="midlayer.self_attn.k_proj.weight"), TARGET)


def test_unexpected_tensor(tmp_path):
    path = _bad(tmp_path, "eagle", hf_changes={"bias": False})  # the file has fc.bias, the config says none
    with pytest.raises(ValueError, match=r"unexpected tensor.*fc.bias"):
        load_eagle(path, TARGET)


def test_method_errors(tmp_path):
    path = _bad(tmp_path, "eagle")
    with pytest.raises(ValueError, match="EAGLE method must be one of \\['eagle', 'eagle3'\\], got 'medusa'"):
        load_eagle(path, TARGET, method="medusa")
    with pytest.raises(ValueError, match="method 'eagle3' was asked for but the file holds an 'eagle' head"):
        load_eagle(path, TARGET, method="eagle3")
    with pytest.raises(ValueError, match="EAGLE method must be one of"):
        eagle.EagleConfig.from_target(TARGET, "medusa")


def test_forward_rejects_wrong_feature_width(target):
    cfg = eagle.EagleConfig.from_target(TARGET, "eagle3", draft_vocab_size=VD)
    tokens, hidden, positions = _inputs("eagle3", 1, 3, from_target=False)  # [.., H] given as target features
    with pytest.raises(ValueError, match="expected 192"):  # raised while tracing: shapes are static
        jax.eval_shape(lambda w: eagle.forward(w, cfg, target.embed, tokens, hidden, positions, from_target=True),
                       eagle.abstract(cfg))


def test_reads_target_features(target):
    """llama.forward(aux_layers=cfg.aux_layers) produces exactly what EAGLE-3's from_target pass reads."""
    cfg = eagle.EagleConfig.from_target(TARGET, "eagle3", draft_vocab_size=VD)
    w = EAGLE_INIT(cfg, jax.random.PRNGKey(1))
    tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6)
    positions = jnp.broadcast_to(jnp.arange(6, dtype=jnp.int32), (2, 6))
    target_fwd = jax.jit(llama.forward, static_argnames=("cfg", "aux_layers"))
    hidden, aux, _ = target_fwd(target, TARGET, tokens, positions, aux_layers=cfg.aux_layers)
    feats = eagle.target_features(cfg, hidden, aux)
    assert feats.shape == (2, 6, 3 * H)
    np.testing.assert_array_equal(np.asarray(eagle.target_features(cfg.replace(method="eagle", aux_layers=(),
                                                                                draft_vocab_size=V), hidden, aux)),
                                  np.asarray(hidden))
    out, _ = FWD(w, cfg, target.embed, tokens, feats, positions, from_target=True)
    assert out.shape == (2, 6, H) and bool(jnp.all(jnp.isfinite(out)))
