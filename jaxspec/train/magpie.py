"""Prompts written by the target itself, by the Magpie recipe (Xu et al. 2024, arXiv:2406.08464): an aligned chat
model given its chat template up to the start of a user turn (the "pre-query template") writes a plausible user
request, and stops at its end-of-turn token.

    jaxspec make-prompts --model smollm2-135m-instruct --num-prompts 10000 --out weights/.cache/self-prompts \
        --exclude gsm8k_test.jsonl

The pre-query template comes from the tokenizer's own chat template (a conversation whose user turn is a sentinel,
cut at the sentinel), so any template works. To widen the topics, rows cycle over task categories, each a system
prompt of our own (`CATEGORIES`; "general" keeps the template's default). Each row's sampling seed derives from
the run's seed and the row's index, so a run is reproducible and a longer run extends a shorter one. Rows go
through the screens of prompt_filters.py in index order; a hash of the text sends about `held_out_fraction` of
them to a held-out split that training never sees. `--out` gets train.jsonl and held_out.jsonl (rows
{"prompt", "source": "magpie", "category"}, readable by every JSONL prompt reader here) and meta.json: seed,
model, sampling, categories, counts per filter, diversity.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from jaxspec.prompts import read_prompts
from jaxspec.train.data import CHUNK_BATCHES, generate_in_chunks
from jaxspec.train.prompt_filters import (Deduplicator, FilterConfig, OverlapIndex, diversity_report, is_held_out,
                                          quality_reason)

# Generic task categories and the system prompt that steers the target towards each (ours; no benchmark's).
CATEGORIES: dict[str, str | None] = {
    "general": None,  # the chat template's default system prompt
    "writing": "You are a helpful assistant. Users ask you to write or edit texts: stories, emails, essays, poems "
               "and posts.",
    "coding": "You are a helpful assistant. Users ask you programming questions, and to write, explain or fix code.",
    "math": "You are a helpful assistant. Users ask you math questions and word problems to solve step by step.",
    "science": "You are a helpful assistant. Users ask you questions about physics, chemistry, biology, medicine "
               "and the natural world.",
    "advice": "You are a helpful assistant. Users ask you for advice on work, money, health, relationships, "
              "travel and daily life.",
    "trivia": "You are a helpful assistant. Users ask you factual questions about history, geography, culture, "
              "sports and famous people.",
    "reasoning": "You are a helpful assistant. Users give you logic puzzles, riddles and questions that need "
                 "careful reasoning.",
    "summarization": "You are a helpful assistant. Users paste a text and ask you to summarize it or list its key "
                     "points.",
    "brainstorming": "You are a helpful assistant. Users ask you for ideas, names, plans and lists of "
                     "suggestions.",
    "explanation": "You are a helpful assistant. Users ask you to explain a concept or how something works, in "
                   "simple words.",
    "rewriting": "You are a helpful assistant. Users give you a text and ask you to rewrite, translate, shorten, "
                 "classify or extract information from it.",
}


@dataclass(frozen=True)
class MagpieSampling:
    # Magpie samples at temperature 1 to get the model's own spread of requests. Its paper keeps top_p 1 for 8B+
    # models; a 135M target's tail is noise (made-up words, language switches), which top_p 0.95 cuts.
    temperature: float = 1.0
    top_p: float = 0.95
    # user requests are short: on SmolLM2-135M at these settings 70-80 % end within 128 tokens, and those that
    # do not are mostly run-on texts, dropped as unterminated
    max_tokens: int = 128


SENTINEL = "<<magpie user turn>>"


@dataclass(frozen=True)
class PreQuery:
    """The prompt that makes the target write a user turn, and what ends that turn."""
    text: str  # the chat template up to where the user's words start
    token_ids: list[int]
    stop_token_ids: list[int]  # the end-of-turn token, when the template closes a user turn with a special token
    stop: list[str]  # else the text that closes it


def pre_query(tokenizer: Any, system: str | None = None) -> PreQuery:
    """The pre-query template of the tokenizer's chat template, with `system` as the system prompt (None: the
    template's default)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("Magpie needs a chat template: the tokenizer has none")
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": SENTINEL}]
    try:
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    except Exception as e:  # templates raise their own errors, e.g. on a system role they do not support
        raise ValueError(f"the chat template cannot render a {'system and ' if system else ''}user turn: {e}") from e
    if rendered.count(SENTINEL) != 1:
        raise ValueError("the chat template does not place the user's message verbatim: no pre-query template")
    head, tail = rendered.split(SENTINEL)
    tail_ids = tokenizer.encode(tail, add_special_tokens=False)
    if tail_ids and tail_ids[0] in set(tokenizer.all_special_ids):
        return PreQuery(head, tokenizer.encode(head, add_special_tokens=False), [tail_ids[0]], [])
    if not tail.strip():
        raise ValueError("the chat template closes a user turn with nothing: no end-of-turn to stop at")
    return PreQuery(head, tokenizer.encode(head, add_special_tokens=False), [], [tail.strip()])


def row_seed(seed: int, row: int) -> int:
    """The sampling seed of row `row` of a run seeded `seed`."""
    return int(np.random.SeedSequence([seed, row]).generate_state(1)[0])


@dataclass
class PromptSet:
    train: list[dict]
    held_out: list[dict]
    meta: dict

    FILES = ("train.jsonl", "held_out.jsonl", "meta.json")

    def save(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, rows in (("train.jsonl", self.train), ("held_out.jsonl", self.held_out)):
            (out / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        (out / "meta.json").write_text(json.dumps(self.meta, indent=2, ensure_ascii=False) + "\n")
        return out

    @classmethod
    def load(cls, out_dir: str | Path) -> PromptSet:
        out = Path(out_dir)
        missing = [f for f in cls.FILES if not (out / f).exists()]
        if missing:
            raise ValueError(f"{out}: not a prompt set (missing {missing})")
        rows = lambda name: [json.loads(line) for line in (out / name).read_text().splitlines() if line.strip()]
        return cls(rows("train.jsonl"), rows("held_out.jsonl"), json.loads((out / "meta.json").read_text()))


def make_prompts(llm: Any, num_prompts: int, *, seed: int = 0, sampling: MagpieSampling = MagpieSampling(),
                 categories: dict[str, str | None] | None = None, filters: FilterConfig = FilterConfig(),
                 exclude: list[str] = (), held_out_fraction: float = 0.1, max_draws: int | None = None,
                 chunk_size: int | None = None, time_budget_s: float | None = None, model: str = "",
                 use_tqdm: bool = True) -> PromptSet:
    """Draw user turns from `llm` (a jaxspec LLM with a chat template) until `num_prompts` pass the screens, or
    `max_draws` (default 3 x num_prompts) were drawn, or `time_budget_s` is spent. `exclude` texts (e.g. a test
    split) are never kept, nor anything sharing a word n-gram with them."""
    categories = CATEGORIES if categories is None else categories
    if num_prompts < 1 or not categories:
        raise ValueError(f"make_prompts needs num_prompts >= 1 and a category (got {num_prompts}, {categories})")
    if not 0 <= held_out_fraction < 1:
        raise ValueError(f"held_out_fraction must be in [0, 1), got {held_out_fraction}")
    tokenizer = llm.tokenizer
    if tokenizer is None:
        raise ValueError("make_prompts needs the model's tokenizer (and its chat template)")
    from jaxspec.sampling_params import SamplingParams

    names = list(categories)
    pre = {name: pre_query(tokenizer, categories[name]) for name in names}
    longest = max(len(p.token_ids) for p in pre.values()) + sampling.max_tokens
    if longest > llm.engine_config.max_model_len:
        raise ValueError(f"a pre-query template plus max_tokens={sampling.max_tokens} is {longest} tokens, more than "
                         f"the LLM's max_model_len={llm.engine_config.max_model_len}")
    max_draws = max_draws or 3 * num_prompts
    cat = [names[i % len(names)] for i in range(max_draws)]
    params = [SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens,
                             seed=row_seed(seed, i), stop_token_ids=pre[c].stop_token_ids, stop=pre[c].stop)
              for i, c in enumerate(cat)]
    special = set(tokenizer.all_special_ids)
    excluded, dedup = OverlapIndex(list(exclude), filters.overlap_ngram), Deduplicator(filters.near_duplicate_jaccard)
    counts: Counter = Counter()
    kept: list[dict] = []
    drawn, start = 0, time.perf_counter()
    chunks = generate_in_chunks(llm, [pre[c].token_ids for c in cat], params,
                                chunk_size or CHUNK_BATCHES * llm.engine_config.max_num_seqs, time_budget_s,
                                use_tqdm)
    for lo, outs in chunks:
        for i, out in enumerate(outs, lo):
            drawn = i + 1
            reason = _screen(out.outputs[0], special, filters, excluded, dedup)
            counts[reason or "kept"] += 1
            if reason is None:
                kept.append({"prompt": out.outputs[0].text.strip(), "source": "magpie", "category": cat[i]})
                if len(kept) == num_prompts:
                    break
        if len(kept) == num_prompts:
            break
    stopped_by = "num_prompts" if len(kept) == num_prompts else "max_draws" if drawn == max_draws else "time_budget"
    held = [is_held_out(r["prompt"], held_out_fraction) for r in kept]
    meta = {"generator": "magpie", "model": model, "seed": seed, "num_requested": num_prompts, "num_drawn": drawn,
            "num_kept": len(kept), "num_train": held.count(False), "num_held_out": held.count(True),
            "stopped_by": stopped_by, "generate_s": round(time.perf_counter() - start, 1),
            "time_budget_s": time_budget_s, "max_draws": max_draws, "sampling": asdict(sampling),
            "held_out_fraction": held_out_fraction, "held_out_rule": "sha256(normalized text) < fraction * 2**64",
            "categories": categories, "pre_query": {n: p.text for n, p in pre.items()},
            "filters": asdict(filters), "filter_counts": dict(counts.most_common()),
            "num_excluded_texts": len(excluded), "diversity": diversity_report(kept)}
    return PromptSet([r for r, h in zip(kept, held) if not h], [r for r, h in zip(kept, held) if h], meta)


def _screen(out: Any, special: set[int], filters: FilterConfig, excluded: OverlapIndex,
            dedup: Deduplicator) -> str | None:
    """Why a drawn user turn is dropped, or None to keep it. Dedup comes last: only kept prompts enter it."""
    if out.finish_reason != "stop":
        return "unterminated"
    body = out.token_ids[:-1]  # the last token is the one that ended the turn
    if any(t in special for t in body):
        return "template_leak"  # the model began another turn (or role) inside its request
    text = out.text.strip()
    reason = quality_reason(text, filters)
    if reason is None and excluded.overlaps(text):
        reason = "overlaps_excluded"
    return reason or dedup.add(text)


def format_report(meta: dict) -> str:
    """meta.json's counts as a short table: filters, categories, diversity."""
    d = meta["diversity"]
    lines = [f"magpie prompts: {meta['num_kept']} kept of {meta['num_drawn']} drawn ({meta['stopped_by']}), "
             f"{meta['num_train']} train / {meta['num_held_out']} held out, {meta['generate_s']} s",
             "| filter | count |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in meta["filter_counts"].items()]
    lines += ["| category | prompts |", "|---|---|"] + [f"| {k} | {v} |" for k, v in d["categories"].items()]
    lines += [f"mean {d['mean_words']} words ({d['mean_chars']} chars); distinct first words "
              f"{d['distinct_first_words']:.3f}, distinct bigrams {d['distinct_bigrams']:.3f}; top first words: "
              + ", ".join(f"{w} {c}" for w, c in d["top_first_words"])]
    return "\n".join(lines)


# ---------------------------------------------------------------- command line

def filter_config(overrides: list[str]) -> FilterConfig:
    """FilterConfig with `name=value` overrides (`--prompt-filter min_words=1`)."""
    types = {f.name: type(f.default) for f in fields(FilterConfig)}
    values = {}
    for item in overrides:
        name, _, value = item.partition("=")
        if name not in types or not value:
            raise ValueError(f"--prompt-filter {item!r}: expected NAME=VALUE with NAME one of {sorted(types)}")
        values[name] = types[name](value)
    return FilterConfig(**values)


def speculative_config_arg(text: str) -> dict:
    """--gen-speculative-config: a JSON object inline or in a .json file."""
    from jaxspec.json_config import read_json_arg

    try:
        return read_json_arg(text, "the value")  # argparse names the flag
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The Magpie settings, shared by `jaxspec make-prompts` and `jaxspec train-eagle --data self:N`, and how the
    target generates there."""
    p.add_argument("--gen-speculative-config", type=speculative_config_arg, default=None,
                   help='draft while generating prompts and answers (lossless: the same distribution, fewer steps), '
                   'vLLM\'s speculative_config as JSON, e.g. {"method": "eagle", "model": '
                   '"eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}')
    d = MagpieSampling()
    p.add_argument("--prompt-temperature", type=float, default=d.temperature)
    p.add_argument("--prompt-top-p", type=float, default=d.top_p)
    p.add_argument("--prompt-max-tokens", type=int, default=d.max_tokens,
                   help="longest user turn; longer ones are dropped as unterminated")
    p.add_argument("--prompt-categories", default=",".join(CATEGORIES),
                   help="comma-separated task categories to cycle over (magpie.CATEGORIES)")
    p.add_argument("--prompt-filter", action="append", default=[], metavar="NAME=VALUE",
                   help="override a screening threshold (prompt_filters.FilterConfig), e.g. min_words=1; repeatable")
    p.add_argument("--exclude", action="append", default=[],
                   help="JSONL prompts that must stay unseen (e.g. GSM8K test): overlapping prompts are dropped")
    p.add_argument("--held-out-fraction", type=float, default=0.1)
    p.add_argument("--prompts-time-budget-s", type=float, default=None,
                   help="wall-clock seconds for drawing prompts: fewer are kept when it runs out")


def prompts_from_args(llm: Any, args: argparse.Namespace, num_prompts: int, exclude: list[str]) -> PromptSet:
    sampling = MagpieSampling(args.prompt_temperature, args.prompt_top_p, args.prompt_max_tokens)
    names = [c for c in args.prompt_categories.split(",") if c]
    unknown = sorted(set(names) - set(CATEGORIES))
    if unknown or not names:
        raise ValueError(f"--prompt-categories: unknown {unknown}; choose from {list(CATEGORIES)}")
    pset = make_prompts(llm, num_prompts, seed=args.seed, sampling=sampling,
                        categories={c: CATEGORIES[c] for c in names},
                        filters=filter_config(args.prompt_filter), exclude=read_prompts(exclude),
                        held_out_fraction=args.held_out_fraction, time_budget_s=args.prompts_time_budget_s,
                        model=str(args.model))
    pset.meta["exclude"] = [str(p) for p in exclude]
    pset.meta["gen_speculative_config"] = args.gen_speculative_config
    return pset


def run(args: argparse.Namespace) -> PromptSet:
    """`jaxspec make-prompts`."""
    from jaxspec.llm import LLM
    from jaxspec.train.data import generation_llm

    llm = generation_llm(LLM._resolve(args.model), max_model_len=1024, max_num_seqs=args.gen_batch, seed=args.seed,
                         dtype=args.target_dtype, speculative_config=args.gen_speculative_config)
    pset = prompts_from_args(llm, args, args.num_prompts, args.exclude)
    out = pset.save(args.out)
    print(format_report(pset.meta))
    print(f"wrote {out}/{{{','.join(PromptSet.FILES)}}}")
    return pset
