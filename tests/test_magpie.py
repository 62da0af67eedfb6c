"""Prompts the target writes itself (Magpie) and their screens: quality rules and duplicates on hand-written
strings, the pre-query template of several chat templates, a reproducible run on a tiny model, a held-out split
that never meets training, and `train-eagle --data self:N --data FILE` end to end.

The tiny target is random, so its "prompts" are random characters: the runs relax `min_words` (they have few
spaces) and check bookkeeping, determinism and the splits, not prose.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from tiny import CHATML, TINY, tiny_weights, write_chat_tokenizer

from jaxspec.train import magpie
from jaxspec.train.data import TokenDataset, mix_prompts
from jaxspec.train.prompt_filters import (Deduplicator, FilterConfig, OverlapIndex, diversity_report, is_held_out,
                                          normalize, quality_reason)

GSM = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips "
       "did Natalia sell altogether in April and May?")
LOOSE = FilterConfig(min_words=1)  # random characters have few spaces
CATEGORIES = {"general": None, "brief": "Answer briefly"}


@pytest.mark.parametrize("text, reason", [
    ("   ", "empty"),
    ("Hi?", "too_short"),
    ("Tell me more", None),
    ("x" * 9 + " y", "too_short"),
    ("Write " + "a very long story " * 200, "too_long"),
    ("1 + 2 = 3, 4 * 5 = 20, 6 / 3 = 2 ???", "non_text"),
    ("🌟🌟🌟🌟 🎉🎉🎉 wow so cool 🌟🌟🌟🌟 🎉🎉🎉🎉 🌟🌟🌟", "non_text"),
    ("tell me a story " * 12, "repetitive"),
    ("What is the best way to learn Python!!!!!!!!!!!!", "repetitive"),
    ("Write a Python function `is_power_of_two(n)` that returns True when n is a power of two.", None),
    ("def f(x):\n    return x ** 2\n\nWhy does f(3) return 9 and not 6?", None),
    ("Summarize: the cat sat on the mat. The dog sat on the log. Then the cat sat on the log.", None),
])
def test_quality_rules(text, reason):
    assert quality_reason(text) == reason


def test_exact_and_near_duplicates():
    """Normalized exact matches, near duplicates against brute-force word 3-gram Jaccard, and distinct prompts."""
    base = ("Can you help me plan a three day trip to Lisbon with a small budget, good food and some museums, "
            "and tell me which neighborhoods are best to stay in as a first time visitor?")
    near = base.replace("small budget", "tight budget")  # Jaccard 0.80
    far = "Explain how vaccines train the immune system to recognize a virus it has never met before."
    other_trip = ("Can you help me plan a three day trip to Lisbon with a small budget, but I want to spend most of "
                  "it hiking along the coast and swimming, so where should I go?")  # Jaccard 0.33
    dedup = Deduplicator(0.7)
    assert dedup.add(base) is None
    assert dedup.add("  CAN you help me plan a three-day trip to Lisbon with a small budget good food, and some "
                     "museums and tell me which neighborhoods are best to stay in as a first time visitor ") \
        == "duplicate"
    assert dedup.add(near) == "near_duplicate"
    assert dedup.add(far) is None and dedup.add(other_trip) is None

    def jaccard(a, b):
        grams = lambda t: set(zip(*(normalize(t).split()[i:] for i in range(3))))  # noqa: E731
        return len(grams(a) & grams(b)) / len(grams(a) | grams(b))
    assert jaccard(base, near) >= 0.75 and jaccard(base, other_trip) < 0.4


def test_overlap_with_excluded_texts():
    index = OverlapIndex([GSM, "Short one here"], n=10)
    assert index.overlaps(GSM.upper())
    assert index.overlaps(GSM.replace("48", "50").replace("April", "June"))  # "then she sold half as many ..."
    assert index.overlaps("short ONE here!")
    assert not index.overlaps("Natalia sold clips to her friends. How many did she sell in May?")
    assert len(index) == 2


def test_held_out_split_is_by_text():
    texts = [f"Question number {i}: what is {i} plus {i * 7}?" for i in range(3000)]
    held = [t for t in texts if is_held_out(t, 0.1)]
    assert 0.08 < len(held) / len(texts) < 0.12
    assert all(is_held_out(t.upper() + " ", 0.1) for t in held)  # normalized text decides, not the row
    assert not any(is_held_out(t, 0.0) for t in texts)


def test_mix_deduplicates_across_sources_and_shuffles():
    a = ["Write a short poem about the sea at night and the boats", "How do I sort a list in Python by key?"]
    b = ["how do I sort a list in python by key", GSM, GSM.replace("friends", "classmates")]
    mixed, info = mix_prompts([("self", a), ("gsm", b)], seed=0)
    assert sorted(mixed) == sorted(a + [GSM])
    assert info["sources"] == {"self": {"num_prompts": 2, "num_kept": 2}, "gsm": {"num_prompts": 3, "num_kept": 1}}
    assert info["num_duplicates"] == 2 and mix_prompts([("self", a), ("gsm", b)], seed=0)[0] == mixed


def test_diversity_report():
    rows = [{"prompt": "Write a poem", "category": "writing"}, {"prompt": "Write code now", "category": "coding"},
            {"prompt": "How are you", "category": "writing"}]
    d = diversity_report(rows)
    assert d["categories"] == {"coding": 1, "writing": 2} and d["top_first_words"][0] == ("write", 2)
    assert d["distinct_first_words"] == round(2 / 3, 4) and d["mean_words"] == 3.0


# ---------------------------------------------------------------- the pre-query template

def test_pre_query_from_the_chat_template(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(write_chat_tokenizer(tmp_path / "chatml"))
    default = magpie.pre_query(tok)
    assert default.text == "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\n"
    assert default.token_ids == tok.encode(default.text, add_special_tokens=False)
    assert default.stop_token_ids == [127] and default.stop == []
    assert magpie.pre_query(tok, "Be brief").text == "<|im_start|>system\nBe brief<|im_end|>\n<|im_start|>user\n"
    # a template without special tokens: the text after the user's words ends the turn
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\nEND\n{% endfor %}"
    plain = magpie.pre_query(tok, "sys")
    assert plain.text == "system: sys\nEND\nuser: " and plain.stop == ["END"] and plain.stop_token_ids == []
    tok.chat_template = "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}"
    with pytest.raises(ValueError, match="verbatim"):
        magpie.pre_query(tok)
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template|has none"):
        magpie.pre_query(tok)
    assert CHATML in json.loads((tmp_path / "chatml" / "tokenizer_config.json").read_text())["chat_template"]


# ---------------------------------------------------------------- runs on the tiny model

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from jaxspec.convert.checkpoint import save_checkpoint

    path = save_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", TINY, tiny_weights(0))
    write_chat_tokenizer(path)
    return path


def draw(model, seed):
    """Up to 24 draws in one engine batch (as many as fit), 8 prompts at most."""
    from jaxspec.train.data import generation_llm

    llm = generation_llm(model, max_model_len=192, max_num_seqs=24, seed=99, dtype="float32")
    return magpie.make_prompts(llm, 8, seed=seed, sampling=magpie.MagpieSampling(max_tokens=96),
                               categories=CATEGORIES, filters=LOOSE, held_out_fraction=0.3,
                               chunk_size=24, use_tqdm=False)


def test_make_prompts_is_reproducible(tiny_model, tmp_path):
    """Same seed, fresh LLM: the same files byte for byte; another seed: other prompts. Every draw is counted once;
    the splits are disjoint and follow the hash."""
    a, b = draw(tiny_model, 1), draw(tiny_model, 1)
    for pset, d in ((a, tmp_path / "a"), (b, tmp_path / "b")):
        pset.meta["generate_s"] = 0.0
        pset.save(d)
    for name in magpie.PromptSet.FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    m = a.meta
    assert m["num_kept"] == len(a.train) + len(a.held_out) >= 4 and sum(m["filter_counts"].values()) == m["num_drawn"]
    assert m["filter_counts"]["kept"] == m["num_kept"] and m["sampling"]["max_tokens"] == 96
    assert {r["category"] for r in a.train + a.held_out} <= set(CATEGORIES) and a.held_out
    assert all(r["source"] == "magpie" for r in a.train + a.held_out)
    assert all(is_held_out(r["prompt"], 0.3) for r in a.held_out) and not any(
        is_held_out(r["prompt"], 0.3) for r in a.train)
    assert {r["prompt"] for r in a.train}.isdisjoint(r["prompt"] for r in a.held_out)
    other = draw(tiny_model, 2)
    assert {r["prompt"] for r in other.train}.isdisjoint(r["prompt"] for r in a.train)
    back = magpie.PromptSet.load(tmp_path / "a")
    assert back.train == a.train and back.meta["seed"] == 1


def test_screen_of_one_drawn_turn():
    """The screens in order: unterminated, a special token inside the turn, quality, excluded texts, duplicates."""
    out = lambda text, ids=(5, 6, 127), finish="stop": SimpleNamespace(text=text, token_ids=list(ids),  # noqa: E731
                                                                        finish_reason=finish)
    special, excluded, dedup = {126, 127}, OverlapIndex([GSM]), Deduplicator()
    screen = lambda o: magpie._screen(o, special, FilterConfig(), excluded, dedup)  # noqa: E731
    assert screen(out("Plan a trip to Rome", finish="length")) == "unterminated"
    assert screen(out("Plan a trip to Rome", ids=(5, 126, 6, 127))) == "template_leak"
    assert screen(out("Rome?")) == "too_short"
    assert screen(out("Please solve: " + GSM)) == "overlaps_excluded"
    assert screen(out("Plan a trip to Rome")) is None
    assert screen(out("plan a trip to rome!")) == "duplicate"


def test_train_eagle_on_self_prompts_and_a_file(tiny_model, tmp_path):
    """`train-eagle --data self:N --data FILE`: the prompt files, one deduplicated mix, answers for the train split
    only (no held-out prompt is in the dataset), training, and provenance in training.json. A second run reuses the
    prompt files; a different N is refused."""
    from transformers import AutoTokenizer

    from jaxspec.cli import main

    rows = ["Write a story", "Write a story!", "Name three colors", "Plan a trip to Rome for me"]
    file = tmp_path / "file.jsonl"
    file.write_text("".join(json.dumps({"question": q}) + "\n" for q in rows))
    test_file = tmp_path / "test.jsonl"
    test_file.write_text(json.dumps({"question": "Plan a trip to Rome"}) + "\n")
    prompts, cache, out = tmp_path / "self", tmp_path / "data.npz", tmp_path / "head"
    args = ["train-eagle", "--model", str(tiny_model), "--data", "self:6", "--data", str(file), "--exclude",
            str(test_file), "--prompts-out", str(prompts), "--prompt-categories", "general",
            "--prompt-filter", "min_words=1", "--prompt-max-tokens", "96", "--held-out-fraction", "0.3",
            "--gen-batch", "24", "--seq-len", "160", "--max-tokens", "16", "--target-dtype", "float32", "--seed", "3"]
    main(args + ["--method", "eagle", "--dataset-cache", str(cache), "--steps", "2", "--batch-size", "4",
                 "--out", str(out)])
    pset = magpie.PromptSet.load(prompts)
    assert pset.meta["seed"] == 3 and pset.meta["exclude"] == [str(file), str(test_file)]
    info = json.loads((out / "training.json").read_text())
    mix = info["data"]["mix"]["sources"]
    assert mix[str(file)] == {"num_prompts": 4, "num_kept": 3}  # "Write a story!" is a duplicate
    assert mix["self:6"]["num_prompts"] == len(pset.train) and info["data"]["self_prompts"]["num_train"] == len(
        pset.train)
    data = TokenDataset.load(cache)
    assert len(data) == len(pset.train) - (len(pset.train) - mix["self:6"]["num_kept"]) + 3
    tok = AutoTokenizer.from_pretrained(tiny_model)
    dataset_prompts = {tok.decode(data.tokens[i, :data.loss_mask[i].argmax()].tolist()) for i in range(len(data))}
    assert all(any(r["prompt"] in p for p in dataset_prompts) for r in pset.train)
    assert not any(r["prompt"] in p for r in pset.held_out for p in dataset_prompts)
    # the prompt files are reused (same seed and N), a different N is refused
    main(args + ["--data-only", "--dataset-cache", str(tmp_path / "again.npz")])
    np.testing.assert_array_equal(TokenDataset.load(tmp_path / "again.npz").tokens, data.tokens)
    # drafting with the head just trained while answering is lossless: the same greedy rows
    spec = {"method": "eagle", "model": str(out), "num_speculative_tokens": 2}
    main(args + ["--data-only", "--dataset-cache", str(tmp_path / "spec.npz"), "--gen-speculative-config",
                 json.dumps(spec)])
    drafted = TokenDataset.load(tmp_path / "spec.npz")
    np.testing.assert_array_equal(drafted.tokens, data.tokens)
    assert drafted.meta["gen_speculative_config"] == spec and data.meta["gen_speculative_config"] is None
    with pytest.raises(ValueError, match=r"\(seed, N\)"):  # --debug: the error itself, not the CLI's one line
        main(["--debug"] + [a if a != "self:6" else "self:7" for a in args] + ["--data-only", "--dataset-cache",
                                                                               str(tmp_path / "third.npz")])
