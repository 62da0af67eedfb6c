"""Incremental detokenization: tokenizers' DecodeStream (the fast path) gives, token by token, the same deltas as
the Python window scheme it replaces, on the tests' tokenizers: characters, special tokens (skipped or not) and
bytes of multi-byte characters split over tokens."""

from __future__ import annotations

import numpy as np
import pytest

from jaxspec import SamplingParams
from jaxspec.engine.detokenizer import WINDOW, Detokenizer, decode_outputs, pending_text, window_delta
from jaxspec.engine.sequence import Sequence
from jaxspec.tokenizer import load_tokenizer
from tests.tiny import write_byte_tokenizer, write_char_tokenizer, write_chat_tokenizer


def _streams(tokenizer, ids: list[int], skip_special_tokens: bool) -> tuple[list[str], list[str]]:
    """Each token's delta through the Detokenizer (DecodeStream) and through window_delta, plus the held-back
    tail at the end."""
    params = SamplingParams(skip_special_tokens=skip_special_tokens)
    fast, slow = Sequence("a", [1], params, 0), Sequence("b", [1], params, 0)
    detok = Detokenizer(tokenizer)
    out_fast, out_slow = [], []
    for t in ids:
        fast.output_token_ids.append(t)
        slow.output_token_ids.append(t)
        out_fast.append(detok.new_text(fast))
        out_slow.append(window_delta(tokenizer, slow))
    assert fast.decode_stream is not None and fast.decode_stream is not WINDOW  # the fast path ran throughout
    return out_fast + [pending_text(tokenizer, fast)], out_slow + [pending_text(tokenizer, slow)]


@pytest.mark.parametrize("kind", ["chars", "chat", "bytes"])
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_stream_deltas_equal_the_window_scheme(tmp_path, kind, skip_special_tokens):
    write = {"chars": write_char_tokenizer, "chat": write_chat_tokenizer, "bytes": write_byte_tokenizer}[kind]
    tokenizer = load_tokenizer(write(tmp_path / kind))
    vocab = len(tokenizer)
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 40, 200):
        ids = rng.integers(0, vocab, n).tolist()
        if kind == "bytes":  # mostly whole UTF-8 characters (with now and then a stray byte), split over tokens
            text = "".join(rng.choice(list("aé€😀bжz ")) for _ in range(n))
            ids = list(text.encode())[:n] + ids[:n // 10]
        fast, slow = _streams(tokenizer, ids, skip_special_tokens)
        assert fast == slow, (kind, ids)
        assert "".join(fast) == tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def test_tokenizers_that_post_process_decode_keep_the_window_scheme(tmp_path):
    tokenizer = load_tokenizer(write_char_tokenizer(tmp_path))
    assert Detokenizer(tokenizer).backend is not None
    tokenizer.clean_up_tokenization_spaces = True  # decode then differs from the backend's
    assert Detokenizer(tokenizer).backend is None


@pytest.mark.parametrize("kind", ["chars", "chat", "bytes"])
def test_whole_outputs_decoded_together_equal_one_by_one(tmp_path, kind):
    """decode_outputs (one decode_batch per skip_special_tokens value) gives each sequence tokenizer.decode's text,
    in order, with the options mixed; and without an exact backend, the same through transformers."""
    write = {"chars": write_char_tokenizer, "chat": write_chat_tokenizer, "bytes": write_byte_tokenizer}[kind]
    tokenizer = load_tokenizer(write(tmp_path / kind))
    rng = np.random.default_rng(1)
    seqs = []
    for i, n in enumerate((0, 1, 7, 40, 200, 3)):
        seq = Sequence(str(i), [1], SamplingParams(skip_special_tokens=bool(i % 2)), 0)
        seq.output_token_ids = rng.integers(0, len(tokenizer), n).tolist()
        seqs.append(seq)
    expect = [tokenizer.decode(s.output_token_ids, skip_special_tokens=s.params.skip_special_tokens) for s in seqs]
    assert decode_outputs(tokenizer, Detokenizer(tokenizer).backend, seqs) == expect
    assert decode_outputs(tokenizer, None, seqs) == expect
