"""Checkpoint conversion: HF (safetensors, sharded, .bin), GGUF and orbax, against transformers on tiny models."""

from __future__ import annotations

import json
import pickle
import zipfile
from functools import partial
from pathlib import Path

import gguf
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from jaxspec.cli import main as cli_main
from jaxspec.convert.checkpoint import load_checkpoint, load_model, save_checkpoint
from jaxspec.convert.gguf_llama import convert_gguf
from jaxspec.convert.hf_llama import load_hf_llama, save_hf_llama
from jaxspec.convert.tensors import read_safetensors
from jaxspec.convert.torch_bin import load_torch_bin
from jaxspec.models import llama
from jaxspec.models.attention import AttnBatch, init_cache
from tests.numerics import FP32_EPS, assert_close_scaled

V, H, I, L, HEADS = 256, 64, 96, 2, 4
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256}


def tiny_hf(kv_heads: int = 2, tied: bool = False, rope: dict | None = None, theta: float = 10000.0,
            seed: int = 0) -> LlamaForCausalLM:
    """A random tiny Llama with weights far from init (norms too), so a mis-mapped tensor shows in the logits."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=L,
                      num_attention_heads=HEADS, num_key_value_heads=kv_heads, tie_word_embeddings=tied,
                      rms_norm_eps=1e-5, max_position_embeddings=16384,
                      rope_parameters={"rope_theta": theta, **(rope or {"rope_type": "default"})},
                      attn_implementation="eager")
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else 0.15 * torch.randn_like(p))
    return model


def hf_logits(model: LlamaForCausalLM, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.tensor(tokens), position_ids=torch.tensor(positions)).logits
    return out.float().numpy()


@partial(jax.jit, static_argnames="cfg")
def dense_logits(w: llama.Weights, tokens: jax.Array, positions: jax.Array, cfg: llama.Config) -> jax.Array:
    hidden, _, _ = llama.forward(w, cfg, tokens, positions)
    return llama.lm_head(w, hidden)


@partial(jax.jit, static_argnames="cfg")
def paged_logits(w, tokens, positions, kv, batch, cfg: llama.Config):
    hidden, _, kv = llama.forward(w, cfg, tokens, positions, kv, batch)
    return llama.lm_head(w, hidden), kv


def jaxspec_paged_logits(cfg: llama.Config, w: llama.Weights, tokens: np.ndarray, split: int,
                         page_size: int = 4) -> np.ndarray:
    """Prefill tokens [B, T] in two chunks through the paged cache, pages scattered over the pool.

    The second chunk attends to the first through the cache; equal chunk sizes keep it to one compile.
    """
    B, T = tokens.shape
    per_seq = -(-T // page_size)
    block_tables = np.random.default_rng(0).permutation(B * per_seq + 3)[: B * per_seq].reshape(B, per_seq)
    positions = np.broadcast_to(np.arange(T), (B, T))
    slots = np.take_along_axis(block_tables, positions // page_size, axis=1) * page_size + positions % page_size
    kv = init_cache(cfg.num_layers, cfg.num_kv_heads, B * per_seq + 3, page_size, cfg.head_dim, cfg.jnp_dtype)
    out = []
    for chunk in (slice(0, split), slice(split, T)):
        batch = AttnBatch(jnp.asarray(block_tables, jnp.int32), jnp.asarray(slots[:, chunk], jnp.int32))
        logits, kv = paged_logits(w, jnp.asarray(tokens[:, chunk]), jnp.asarray(positions[:, chunk]), kv, batch,
                                  cfg)
        out.append(np.asarray(logits))
    return np.concatenate(out, axis=1)


def assert_logits_match(model: LlamaForCausalLM, cfg: llama.Config, w: llama.Weights) -> None:
    """Each row of logits as transformers' (fp32 in XLA and in torch: sums of up to I = 96 terms, L = 2 layers
    deep, rounded in other orders)."""
    rel = L * I * FP32_EPS
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, V, (2, 12))
    offset = np.array([[0], [300]])  # the second row reaches the llama3-scaled frequencies
    positions = np.arange(12)[None] + offset
    ref = hf_logits(model, tokens, positions)
    assert_close_scaled(dense_logits(w, tokens, positions, cfg), ref, rel, err_msg="dense")
    ref0 = hf_logits(model, tokens, np.broadcast_to(np.arange(12), (2, 12)))
    assert_close_scaled(jaxspec_paged_logits(cfg, w, tokens, split=6), ref0, rel, err_msg="paged")


def to_legacy_config(path: Path) -> None:
    """Rewrite a transformers-5 config.json (`rope_parameters`) in the transformers-4 form Hub checkpoints use."""
    hf = json.loads((path / "config.json").read_text())
    rope = hf.pop("rope_parameters")
    hf["rope_theta"] = rope.pop("rope_theta")
    if rope["rope_type"] != "default":
        hf["rope_scaling"] = rope
    (path / "config.json").write_text(json.dumps(hf))


def save_bin(model: LlamaForCausalLM, path: Path) -> None:
    """What transformers 4 wrote with safe_serialization=False (transformers 5 always writes safetensors)."""
    model.config.save_pretrained(path)
    torch.save(model.state_dict(), path / "pytorch_model.bin")


CASES = {  # name: (tiny_hf arguments, how the checkpoint is written)
    "gqa-untied": ({"kv_heads": 2}, "safetensors"),
    "mha-tied": ({"kv_heads": 4, "tied": True}, "safetensors"),
    "llama3-rope": ({"rope": LLAMA3_ROPE, "theta": 500000.0}, "safetensors"),
    "sharded": ({"kv_heads": 1}, "sharded"),
    "bin-tied": ({"tied": True}, "bin"),
    "legacy-config-llama3": ({"rope": LLAMA3_ROPE}, "legacy"),
}


@pytest.mark.parametrize("case", CASES)
def test_hf_logits_match_transformers(case, tmp_path):
    model_args, save = CASES[case]
    model = tiny_hf(**model_args)
    if save == "bin":
        save_bin(model, tmp_path)
    else:
        model.save_pretrained(tmp_path, max_shard_size="40KB" if save == "sharded" else "5GB")
    if save == "legacy":
        to_legacy_config(tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert ("rope_parameters" in hf) == (save != "legacy")  # transformers 5 writes rope_parameters
    if save == "sharded":
        assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 2
    cfg, w = load_hf_llama(tmp_path)
    assert (w.lm_head is None) == model.config.tie_word_embeddings
    assert_logits_match(model, cfg, w)


def test_bf16_checkpoint(tmp_path):
    model = tiny_hf().to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    cfg, w = load_hf_llama(tmp_path, dtype="bfloat16")
    assert w.embed.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(w.embed.view(np.uint16),
                                  model.model.embed_tokens.weight.view(torch.int16).numpy().view(np.uint16))
    save_hf_llama(cfg, w, tmp_path / "again")  # the inverse map, bit for bit
    _, w2 = load_hf_llama(tmp_path / "again", dtype="bfloat16")
    for a, b in zip(jax.tree.leaves(w), jax.tree.leaves(w2)):
        np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))
    cfg32, w32 = load_hf_llama(tmp_path, dtype="float32")
    # reload rather than model.float(): .to(bfloat16) also rounded transformers' RoPE inv_freq buffer
    ref = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager")
    assert_logits_match(ref, cfg32, w32)


def test_torch_bin_strides_and_dtypes(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {"t": base.t(), "view": base[1:, 2:5], "bf16": torch.randn(3, 5).to(torch.bfloat16),
             "half": torch.randn(7).half(), "long": torch.arange(5), "shared": base}
    torch.save(state, tmp_path / "x.bin")
    out = load_torch_bin(tmp_path / "x.bin")
    for k, v in state.items():
        expect = v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy()
        np.testing.assert_array_equal(out[k].astype(expect.dtype), expect, err_msg=k)
    assert out["bf16"].dtype == ml_dtypes.bfloat16


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tied", [False, True])
def test_orbax_round_trip_bit_exact(dtype, tied, tmp_path):
    cfg = llama.Config(vocab_size=V, hidden_size=H, intermediate_size=I, num_layers=L, num_heads=HEADS,
                       num_kv_heads=2, head_dim=H // HEADS, tie_word_embeddings=tied, dtype=dtype,
                       rope_scaling=tuple((k, float(v)) for k, v in LLAMA3_ROPE.items() if k != "rope_type"))
    w = llama.init(cfg, jax.random.PRNGKey(0))
    save_checkpoint(tmp_path / "ckpt", cfg, w)
    cfg2, w2 = load_checkpoint(tmp_path / "ckpt")
    assert cfg2 == cfg
    assert jax.tree.structure(w2) == jax.tree.structure(w)
    for a, b in zip(jax.tree.leaves(w), jax.tree.leaves(w2)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def test_load_model_detects_format(tmp_path):
    model = tiny_hf()
    model.save_pretrained(tmp_path / "hf")
    cfg, w = load_model(tmp_path / "hf")
    save_checkpoint(tmp_path / "ckpt", cfg, w)
    cfg2, w2 = load_model(tmp_path / "ckpt", dtype="bfloat16")
    assert cfg2.dtype == "bfloat16" and w2.embed.dtype == jnp.bfloat16
    cfg3, _ = load_model(tmp_path)  # holding ckpt/ and hf/, as a preset's weights directory does: the checkpoint
    assert cfg3 == cfg
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty: neither a jaxspec checkpoint"):
        load_model(tmp_path / "empty")


# ---- bad input: every error names the file and the tensor or field --------------------------------------------

@pytest.fixture
def hf_dir(tmp_path) -> Path:
    tiny_hf().save_pretrained(tmp_path)
    return tmp_path


def edit_tensors(path: Path, edit) -> None:
    tensors = {k: np.array(v) for k, v in read_safetensors(path).items()}
    edit(tensors)
    save_file(tensors, path)


def test_missing_tensor(hf_dir):
    edit_tensors(hf_dir / "model.safetensors", lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=rf"{hf_dir}.*model\.layers\.1\.mlp\.up_proj\.weight"):
        load_hf_llama(hf_dir)


def test_wrong_shape(hf_dir):
    def edit(t):
        t["model.layers.0.self_attn.k_proj.weight"] = np.zeros((H, H), np.float32)
    edit_tensors(hf_dir / "model.safetensors", edit)
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor 'model\.layers\.0\.self_attn\.k_proj\.weight' "
                                         r"has shape \(64, 64\), the config implies \(32, 64\)"):
        load_hf_llama(hf_dir)


def test_unexpected_tensor(hf_dir):
    def edit(t):
        t["model.layers.0.self_attn.q_proj.bias"] = np.zeros(H, np.float32)
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.zeros(8, np.float32)  # harmless: ignored
    edit_tensors(hf_dir / "model.safetensors", edit)
    with pytest.raises(ValueError, match=r"model\.safetensors: unexpected tensor 'model\.layers\.0\.self_attn\.q_proj"
                                         r"\.bias'"):
        load_hf_llama(hf_dir)


def test_untied_config_without_lm_head(hf_dir):
    edit_tensors(hf_dir / "model.safetensors", lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ValueError, match=rf"{hf_dir}: missing tensors \['lm_head\.weight'\]"):
        load_hf_llama(hf_dir)


def test_tied_config_with_different_lm_head(tmp_path):
    model = tiny_hf(tied=True)
    model.config.save_pretrained(tmp_path)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    state["lm_head.weight"] = state["lm_head.weight"] + 1
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor 'lm_head\.weight' differs from the embedding"):
        load_hf_llama(tmp_path)


def test_duplicate_tensor_across_shards(tmp_path):
    tiny_hf().save_pretrained(tmp_path, max_shard_size="40KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    first = read_safetensors(shards[0])
    name = next(iter(first))
    edit_tensors(shards[-1], lambda t: t.update({name: np.array(first[name])}))
    with pytest.raises(ValueError, match=rf"tensor '{name}' is also in .*{shards[0].name}"):
        load_hf_llama(tmp_path)


def test_truncated_safetensors(hf_dir):
    path = hf_dir / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor '.+' is truncated"):
        load_hf_llama(hf_dir)
    path.write_bytes(data[:100])
    with pytest.raises(ValueError, match=r"model\.safetensors: truncated safetensors file"):
        load_hf_llama(hf_dir)


@pytest.mark.parametrize("model_type,field", [("gpt2", "model_type"), ("llama", "hidden_size")])
def test_bad_config(hf_dir, model_type, field):
    hf = json.loads((hf_dir / "config.json").read_text())
    if field == "model_type":
        hf.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    else:
        del hf[field]
    (hf_dir / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match=rf"config\.json: .*{field}"):
        load_hf_llama(hf_dir)


@pytest.mark.parametrize("module,name", [("os", "system"), ("posix", "system"), ("builtins", "eval")])
def test_malicious_bin_is_not_executed(tmp_path, module, name):
    marker = tmp_path / "pwned"
    code = f"touch {marker}" if name == "system" else f"open({str(marker)!r}, 'w').close()"
    payload = f"c{module}\n{name}\n(".encode() + pickle.dumps(code, protocol=0)[:-1] + b"tR."
    bad = tmp_path / "pytorch_model.bin"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("archive/data.pkl", payload)
    pickle.loads(payload)  # the payload is live: plain pickle runs it
    assert marker.exists()
    marker.unlink()
    with pytest.raises(ValueError, match=rf"{bad}: refusing to unpickle forbidden global {module}\.{name}"):
        load_torch_bin(bad)
    assert not marker.exists()


# ---- GGUF ------------------------------------------------------------------------------------------------------

def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py `LlamaModel.permute` (q and k rows to interleaved RoPE pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_cpp_rope_freqs(theta: float, head_dim: int, rope: dict) -> np.ndarray:
    """llama.cpp's `rope_freqs` tensor for Llama 3 scaling (`generate_extra_tensors`), in its own arithmetic."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    old, low, high, factor = (rope["original_max_position_embeddings"], rope["low_freq_factor"],
                              rope["high_freq_factor"], rope["factor"])
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def byte_tokens() -> list[str]:
    """GPT-2 byte-level vocabulary: each byte as the printable character GPT-2 maps it to."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"


def write_gguf(model: LlamaForCausalLM, path: Path, rope: dict | None = None, arch: str = "llama") -> None:
    c = model.config
    kv, head_dim = c.num_key_value_heads, c.hidden_size // c.num_attention_heads
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(V)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(byte_tokens()[: V - 2] + ["<s>", "</s>"])
    w.add_token_types([1] * (V - 2) + [3, 3])
    w.add_token_scores([0.0] * V)  # no merges: transformers derives them (none) from the vocabulary and scores
    w.add_bos_token_id(V - 2)
    w.add_eos_token_id(V - 1)
    w.add_chat_template(TEMPLATE)
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    sd = {k: v.float().numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        w.add_tensor("output.weight", sd["lm_head.weight"])
    if rope:
        w.add_tensor("rope_freqs.weight", llama_cpp_rope_freqs(c.rope_parameters["rope_theta"], head_dim, rope))
    for i in range(c.num_hidden_layers):
        for hf_name, gg_name in names.items():
            t = sd[f"model.layers.{i}.{hf_name}.weight"]
            if gg_name in ("attn_q", "attn_k"):
                t = llama_cpp_permute(t, c.num_attention_heads if gg_name == "attn_q" else kv)
            w.add_tensor(f"blk.{i}.{gg_name}.weight", t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_llama_cpp_permutation_inverse():
    from jaxspec.convert.gguf_llama import unpermute_qk

    w = np.random.default_rng(0).standard_normal((6 * 8, 5))
    np.testing.assert_array_equal(unpermute_qk(llama_cpp_permute(w, 6), 6), w)


def test_gguf_matches_transformers(tmp_path):
    model = tiny_hf(kv_heads=2)
    write_gguf(model, tmp_path / "tiny.gguf")
    cli_main(["convert", str(tmp_path / "tiny.gguf"), str(tmp_path / "ckpt")])  # also keeps tmp_path/ckpt-hf
    cfg, w = load_model(tmp_path / "ckpt")
    assert_logits_match(model, cfg, w)
    # transformers' own GGUF loader reads the same file to the same model
    ref = LlamaForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf", dtype=torch.float32)
    ours = LlamaForCausalLM.from_pretrained(tmp_path / "ckpt-hf", dtype=torch.float32)
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[k], v, rtol=0, atol=0, msg=k)
    # tokenizer, chat template and special ids survive
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "ckpt-hf")
    assert tok.chat_template == TEMPLATE
    assert tok.decode(tok("hello").input_ids) == "hello"
    gen = json.loads((tmp_path / "ckpt-hf" / "generation_config.json").read_text())
    assert gen == {"bos_token_id": V - 2, "eos_token_id": V - 1}


def test_gguf_tied_llama3_rope(tmp_path):
    model = tiny_hf(tied=True, rope=LLAMA3_ROPE | {"original_max_position_embeddings": 8192}, theta=500000.0)
    write_gguf(model, tmp_path / "tiny.gguf", rope=LLAMA3_ROPE | {"original_max_position_embeddings": 8192})
    convert_gguf(tmp_path / "tiny.gguf", tmp_path / "hf")
    cfg, w = load_hf_llama(tmp_path / "hf")
    assert w.lm_head is None and dict(cfg.rope_scaling)["factor"] == 8.0
    assert_logits_match(model, cfg, w)


def test_gguf_other_architecture(tmp_path):
    w = gguf.GGUFWriter(tmp_path / "gpt2.gguf", "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"gpt2\.gguf: general\.architecture is 'gpt2'"):
        convert_gguf(tmp_path / "gpt2.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()
