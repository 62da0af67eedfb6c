"""Tiny models and a character tokenizer, made by the tests themselves."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import jax
import numpy as np

from jaxspec import LLM
from jaxspec.models import llama

TINY = llama.Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                    num_kv_heads=2, head_dim=16)
# Token i decodes to one character, so a stop string can be placed exactly across token (and step) boundaries.
CHARS = [chr(ord("a") + i) for i in range(26)] + [chr(ord("A") + i) for i in range(26)] + \
        [chr(0x3b1 + i) for i in range(24)] + [chr(0x410 + i) for i in range(52)]


def tiny_weights(seed: int = 0, cfg: llama.Config = TINY) -> llama.Weights:
    return llama.init(cfg, jax.random.key(seed), scale=0.2)


def bigram_weights() -> llama.Weights:
    """TINY's random weights with attention and MLP outputs zeroed: each token decides the next (a bigram model), so
    greedy text falls into cycles that prompt lookup predicts (and a head trained on the intact model does not)."""
    w = tiny_weights()
    return dataclasses.replace(w, layers=dataclasses.replace(w.layers, wo=w.layers.wo * 0,
                                                             w_down=w.layers.w_down * 0))


def async_and_sync_tokens(llm: LLM, prompts: list, params) -> list[list[list[int]]]:
    """Each output's token ids from one generate with async scheduling, then one without: [async, sync]."""
    return [[o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False, async_scheduling=a)]
            for a in (True, False)]


def make_llm(weights: llama.Weights | None, tokenizer: Path | str | None = None, cfg: llama.Config = TINY,
             **kw) -> LLM:
    """The tests' LLM over a tiny model: a 128-token context, small pages, programs compiled on first use. Any
    engine argument can be overridden."""
    args = dict(max_model_len=128, max_num_seqs=8, max_num_batched_tokens=64, page_size=8, warmup=False)
    return LLM.from_weights(cfg, weights, tokenizer=tokenizer, **{**args, **kw})


def write_char_tokenizer(path: Path, eos_token_id: int | None = None) -> Path:
    """A tokenizer.json whose vocabulary is CHARS (no merges, no spaces) plus a generation_config.json."""
    return _write_tokenizer(path, CHARS, [], {"tokenizer_class": "PreTrainedTokenizerFast"}, eos_token_id)


# A ChatML template as SmolLM2's, with a default system prompt the chat tokenizer can spell.
CHATML = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}{% endif %}"
          "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def write_chat_tokenizer(path: Path) -> Path:
    """A character tokenizer of TINY's vocabulary size with the ChatML template: 124 of CHARS, space (124) and
    newline (125), then the special tokens <|im_start|> (126) and <|im_end|> (127, the EOS)."""
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
              "chat_template": CHATML}
    return _write_tokenizer(path, CHARS[:124] + [" ", "\n"], ["<|im_start|>", "<|im_end|>"], config, 127)


def _write_tokenizer(path: Path, chars: list[str], special: list[str], config: dict,
                     eos_token_id: int | None) -> Path:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True) for t in special])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_token_id}))
    return path


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the ByteLevel pre-tokenizer's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_byte_tokenizer(path: Path) -> Path:
    """A byte-level tokenizer (GPT-2's alphabet, token id = byte, no merges): characters of 2-4 bytes are split
    over tokens. No EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    table = _bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={table[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": None}))
    return path


def write_model_dir(root: Path, seed: int = 0, cfg: llama.Config = TINY) -> Path:
    """A preset-shaped weights directory of a tiny random model: root/hf (HF Llama layout with the character
    tokenizer) and root/ckpt (jaxspec checkpoint of the same weights)."""
    from jaxspec.convert.checkpoint import save_checkpoint
    from jaxspec.convert.hf_llama import save_hf_llama

    w = tiny_weights(seed, cfg)
    save_hf_llama(cfg, w, root / "hf")
    write_char_tokenizer(root / "hf")
    save_checkpoint(root / "ckpt", cfg, w)
    return root


def write_random_head(path: Path, method: str = "eagle", seed: int = 5, cfg: llama.Config = TINY) -> Path:
    """An EAGLE head of random weights for `cfg` (acceptance is then low, but every code path runs)."""
    from jaxspec.convert.eagle import save_eagle
    from jaxspec.models import eagle

    head = eagle.EagleConfig.from_target(cfg, method)
    save_eagle(str(path), head, eagle.init(head, jax.random.key(seed), scale=0.2))
    return path


@contextmanager
def compiles() -> Iterator[list[str]]:
    """The XLA compilations that happen inside the block (jax's monitoring events)."""
    events: list[str] = []
    listener = lambda event, duration, **kw: events.append(event) if "backend_compile" in event else None  # noqa
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


class _Watched:
    """A call's output that logs when the host reads it (np.asarray)."""

    def __init__(self, out, i: int, events: list):
        self.out, self.i, self.events = out, i, events

    def __array__(self, dtype=None, copy=None):
        self.events.append(("read", self.i))
        return np.asarray(self.out, dtype)


def watch_reads(obj, name: str) -> list[tuple[str, int]]:
    """Replace obj.<name> (a method that dispatches device work and returns its output) by one that logs
    ("dispatch", i) at its i-th call and ("read", i) when that call's output is read on the host: the order in which
    a benchmark reads the outputs of the dispatches it makes. Returns the log."""
    events: list[tuple[str, int]] = []
    call = getattr(obj, name)

    def watched(*args, **kwargs):
        i = sum(kind == "dispatch" for kind, _ in events)
        events.append(("dispatch", i))
        return _Watched(call(*args, **kwargs), i, events)

    setattr(obj, name, watched)
    return events


def read_before_reuse(events: list[tuple[str, int]]) -> bool:
    """Whether every output in a watch_reads log was read, each before the dispatch two later (which, with twin
    output buffers, writes over it) was made."""
    at = {event: n for n, event in enumerate(events)}
    dispatches = sum(kind == "dispatch" for kind, _ in events)
    return all(("read", i) in at and (("dispatch", i + 2) not in at or at[("read", i)] < at[("dispatch", i + 2)])
               for i in range(dispatches))


def random_prompts(n: int, lo: int, hi: int, seed: int = 0, vocab: int = TINY.vocab_size) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(rng.integers(lo, hi + 1))).tolist() for _ in range(n)]


def greedy_reference(w: llama.Weights, cfg: llama.Config, prompt: list[int], n: int, width: int = 128) -> list[int]:
    """The oracle: a plain full-sequence greedy loop (dense causal attention, no cache, no engine). The sequence is
    padded at the end to a fixed width, which causal attention never lets earlier positions see: one compile."""
    ids = list(prompt)
    for _ in range(n):
        padded = np.zeros((1, width), np.int32)
        padded[0, :len(ids)] = ids
        ids.append(int(np.argmax(_last_logits(w, cfg, padded, len(ids) - 1))))
    return ids[len(prompt):]


def logprobs_reference(w: llama.Weights, cfg: llama.Config, ids: list[int], width: int = 128) -> np.ndarray:
    """The oracle of prompt logprobs: the log-softmax of one full-sequence forward (dense causal attention, no
    cache, no engine), [len(ids), V] in fp64; row t is the distribution of the token after ids[t]."""
    padded = np.zeros((1, width), np.int32)
    padded[0, :len(ids)] = ids
    logits = np.asarray(_logits_all(w, cfg, padded), np.float64)[0, :len(ids)]
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


@jax.jit
def _logits_all(w, cfg, ids):
    hidden, _, _ = llama.forward(w, cfg, ids, np.arange(ids.shape[1])[None])
    return llama.lm_head(w, hidden)


def _last_logits(w, cfg, padded, at):
    return np.asarray(_logits_all(w, cfg, padded))[0, at]
