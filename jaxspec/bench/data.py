"""What a benchmark runs on: model configs for random-weight runs and prompt sets. No jax here (the HF baseline
runs before jax claims the GPU, and it needs the prompts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from jaxspec.chat import encode_chat
from jaxspec import prompts
from jaxspec.json_config import read_json

_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
          "attention_bias": False, "mlp_bias": False, "rms_norm_eps": 1e-5}

# `--hf-config NAME`: config.json dicts of real models, for `--load-format dummy` (random weights, real shapes).
HF_CONFIGS: dict[str, dict] = {
    # meta-llama/Meta-Llama-3-8B-Instruct
    "llama-3-8b": _LLAMA | {
        "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 500000.0, "tie_word_embeddings": False,
        "max_position_embeddings": 8192, "bos_token_id": 128000, "eos_token_id": 128009, "torch_dtype": "bfloat16"},
    # meta-llama/Llama-3.1-8B-Instruct: Llama 3 with rope scaling and a 128k context
    "llama-3.1-8b": _LLAMA | {
        "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 500000.0, "tie_word_embeddings": False,
        "max_position_embeddings": 131072, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}, "torch_dtype": "bfloat16"},
    # HuggingFaceTB/SmolLM2-135M-Instruct (the embedded default), for shape-only runs
    "smollm2-135m": _LLAMA | {
        "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "rope_theta": 100000.0,
        "tie_word_embeddings": True, "max_position_embeddings": 8192, "bos_token_id": 1, "eos_token_id": 2},
    # a toy for tests and smoke runs on CPU
    "tiny": _LLAMA | {
        "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2},
}


def load_hf_config(name_or_path: str) -> tuple[str, dict]:
    """(label, config.json dict) from a built-in name, a config.json file, or a directory holding one."""
    if name_or_path in HF_CONFIGS:
        return name_or_path, dict(HF_CONFIGS[name_or_path])
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise ValueError(f"--hf-config {name_or_path!r}: neither a built-in name ({sorted(HF_CONFIGS)}) "
                         "nor a config.json")
    label = path.parent.name if path.name == "config.json" else path.stem
    return label, read_json(path)


def random_prompts(n: int, input_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    """vLLM's random dataset: n prompts of input_len token ids drawn uniformly from the vocabulary."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab_size, (n, input_len)).tolist()


def read_conversations(path: str | Path, n: int) -> list[list[dict]]:
    """The first n conversations of a JSONL file (jaxspec.prompts), cycled when it has fewer."""
    convs = prompts.read_conversations(path, n)
    if not convs:
        raise ValueError(f"--dataset {path}: no rows")
    return [convs[i % len(convs)] for i in range(n)]


def dataset_prompts(path: str | Path, n: int, tokenizer: Any) -> list[list[int]]:
    """The first n conversations of a JSONL file (read_conversations), chat-formatted and tokenized."""
    if tokenizer is None:
        raise ValueError(f"--dataset {path}: text prompts need a tokenizer (pass --tokenizer)")
    return [encode_chat(tokenizer, conv) for conv in read_conversations(path, n)]
