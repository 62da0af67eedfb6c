"""`jaxspec train-eagle`: regenerate data with the target (or load it from --dataset-cache), train, export.

    jaxspec train-eagle --model smollm2-135m-instruct --method eagle3 --data self:10000 --data gsm8k_train.jsonl \
        --exclude gsm8k_test.jsonl --prompts-out weights/.cache/self-prompts --max-tokens 384 --seq-len 512 \
        --steps 20000 --batch-size 32 --lr 3e-4 --out weights/eagle3-smollm2 --ckpt-dir /tmp/ckpt \
        --dataset-cache /tmp/mix.npz

`--data self:N` has the target write N user prompts itself (magpie.py); their held-out split stays in
`--prompts-out` for evaluation. All sources are deduplicated together before the answers are regenerated.
"""

from __future__ import annotations

import argparse
import gc
import logging
import shlex
import sys
import time
from pathlib import Path

from jaxspec import compile_cache
import numpy as np

from jaxspec.models import eagle
from jaxspec.prompts import read_prompts
from jaxspec.train.data import TokenDataset, chat_token_ids, generate_dataset, generation_llm, mix_prompts
from jaxspec.train.magpie import PromptSet, format_report, prompts_from_args

logger = logging.getLogger("jaxspec")


def build_dataset(args: argparse.Namespace, model_path: Path) -> TokenDataset:
    """The cached token dataset when --dataset-cache exists, else the target's greedy answers (then cached)."""
    cache = Path(args.dataset_cache) if args.dataset_cache else None
    if cache is not None and cache.exists():
        data = TokenDataset.load(cache)
        if data.seq_len != args.seq_len:
            raise ValueError(f"{cache}: rows have {data.seq_len} tokens but --seq-len is {args.seq_len}; "
                             "use another --dataset-cache or the same --seq-len")
        print(f"loaded {len(data)} sequences from {cache}")
        return data
    from jaxspec.tokenizer import eos_token_ids

    num_self, files = parse_data(args.data)
    if num_self and not args.prompts_out:
        raise ValueError("--data self:N needs --prompts-out (where its prompts and their held-out split go)")
    llm = generation_llm(model_path, max_model_len=args.seq_len + 1, max_num_seqs=args.gen_batch, seed=args.seed,
                         dtype=args.target_dtype, speculative_config=args.gen_speculative_config)
    if llm.tokenizer is None:
        raise ValueError(f"{model_path}: no tokenizer, so prompts cannot be formatted with a chat template")
    sources = [(str(path), prompts) for path, prompts in zip(files, read_each(files, args.num_prompts))]
    meta = {"model": str(args.model), "sources": list(args.data), "target_dtype": args.target_dtype,
            "eos_token_ids": sorted(eos_token_ids(llm.tokenizer, model_path)),
            "gen_speculative_config": args.gen_speculative_config}
    if num_self:
        # the self prompts never overlap the other training sources or --exclude: the held-out split stays unseen
        pset = self_prompts(llm, args, num_self, files + list(args.exclude))
        sources.insert(0, (f"self:{num_self}", [r["prompt"] for r in pset.train]))
        meta["self_prompts"] = {"dir": str(args.prompts_out), **{k: pset.meta[k] for k in (
            "seed", "num_drawn", "num_train", "num_held_out", "sampling", "filter_counts", "generate_s")}}
    prompts, meta["mix"] = mix_prompts(sources, args.seed)
    print(f"{len(prompts)} prompts after deduplication: "
          + ", ".join(f"{name} {c['num_kept']}/{c['num_prompts']}" for name, c in meta["mix"]["sources"].items()))
    start = time.perf_counter()
    data = generate_dataset(llm, chat_token_ids(llm.tokenizer, prompts), args.max_tokens, args.seq_len, meta,
                            time_budget_s=args.gen_time_budget_s)
    data.meta["generate_s"] = round(time.perf_counter() - start, 1)
    del llm  # free its weights and KV pool before training
    gc.collect()
    n_resp = int(data.loss_mask.sum())
    print(f"generated {len(data)} sequences ({n_resp} response tokens) in {data.meta['generate_s']} s"
          + (f", {data.meta['num_cut_by_time_budget']} prompts left out by the time budget"
             if data.meta["num_cut_by_time_budget"] else ""))
    if cache is not None:
        data.save(cache)
        print(f"wrote {cache}")
    return data


def parse_data(items: list[str]) -> tuple[int, list[str]]:
    """--data values: (N of at most one `self:N`, 0 without; the JSONL files)."""
    selfs = [item for item in items if item.startswith("self:")]
    if len(selfs) > 1 or any(not s[5:].isdigit() or int(s[5:]) < 1 for s in selfs):
        raise ValueError(f"--data: at most one self:N with N >= 1, got {selfs}")
    files = [item for item in items if not item.startswith("self:")]
    if not selfs and not files:
        raise ValueError("--data is required to generate a dataset (no --dataset-cache file to load)")
    return (int(selfs[0][5:]) if selfs else 0), files


def read_each(paths: list[str], num_prompts: int | None) -> list[list[str]]:
    """Each file's prompts; `num_prompts` caps them all together, in file order (the first N)."""
    out, left = [], num_prompts
    for path in paths:
        out.append(read_prompts([path], left))
        left = None if left is None else left - len(out[-1])
    return out


def self_prompts(llm, args: argparse.Namespace, num_prompts: int, exclude: list[str]) -> PromptSet:
    """The Magpie prompt set in --prompts-out: loaded when it is there (from the same seed and N), else drawn from
    the target and written."""
    out = Path(args.prompts_out)
    if (out / "meta.json").exists():
        pset = PromptSet.load(out)
        made = (pset.meta.get("seed"), pset.meta.get("num_requested"))
        if made != (args.seed, num_prompts):
            raise ValueError(f"{out}: prompts made with (seed, N) = {made}, not ({args.seed}, {num_prompts}); "
                             "use another --prompts-out")
        print(f"loaded {len(pset.train)} train / {len(pset.held_out)} held-out prompts from {out}")
        return pset
    pset = prompts_from_args(llm, args, num_prompts, exclude)
    pset.save(out)
    print(format_report(pset.meta))
    print(f"wrote {out}")
    return pset


def train_from_args(args: argparse.Namespace) -> Path:
    from jaxspec.convert.checkpoint import load_model
    from jaxspec.resolve import resolve_model
    from jaxspec.train.trainer import export_head, target_config, train_eagle, training_info

    compile_cache.configure(args.compilation_cache_dir)  # the training step is cached too
    if args.data_only and not args.dataset_cache:
        raise ValueError("--data-only needs --dataset-cache (where to write the data)")
    if not args.data_only and not args.out:
        raise ValueError("--out is required (the directory for the exported head)")
    if args.soft_labels and args.method != "eagle3":
        raise ValueError("--soft-labels is EAGLE-3's: EAGLE-1's cross-entropy is always against the distribution")
    model_path = resolve_model(args.model).weights
    if args.init_from:  # checked before the data is made; its tensors against the target after (data is cached)
        check_head_dir(args.init_from)
    data = build_dataset(args, model_path)
    if args.data_only:
        return Path(args.dataset_cache)
    tcfg, tw = load_model(model_path, args.target_dtype)
    tcfg = target_config(tcfg)
    aux = tuple(int(i) for i in args.aux_layers.split(",")) if args.aux_layers else None
    draft_vocab = min(args.draft_vocab_size, tcfg.vocab_size) if args.method == "eagle3" else None
    hcfg = eagle.EagleConfig.from_target(tcfg, args.method, draft_vocab_size=draft_vocab, aux_layers=aux)
    warm_from = None
    if args.init_from:
        from jaxspec.convert.eagle import load_eagle

        init_cfg, init = load_eagle(args.init_from, tcfg, args.method)
        warm_from = (init_cfg, init, str(args.init_from))
    start = time.perf_counter()
    weights, history = train_eagle(
        tcfg, tw, hcfg, data, args.steps, args.batch_size, args.lr, ttt_steps=args.ttt_steps, noise=args.noise,
        soft_labels=args.soft_labels, compute_dtype=args.compute_dtype, warmup_steps=args.warmup_steps,
        ckpt_dir=args.ckpt_dir, ckpt_every=args.ckpt_every, resume=args.resume, time_budget_s=args.time_budget_s,
        seed=args.seed, warm_from=warm_from)
    wall = time.perf_counter() - start
    every = max(1, len(history) // 200)
    info = training_info(
        history, wall, command=shlex.join(["jaxspec"] + sys.argv[1:]), method=args.method, model=str(args.model),
        data=data.meta | {"num_sequences": len(data), "seq_len": data.seq_len,
                          "response_tokens": int(data.loss_mask.sum())},
        init_from=args.init_from, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        soft_labels=args.soft_labels, target_dtype=args.target_dtype,
        compute_dtype=args.compute_dtype, export_dtype=args.dtype, aux_layers=list(hcfg.aux_layers),
        draft_vocab_size=hcfg.draft_vocab_size, draft_vocab_coverage=draft_vocab_coverage(data, weights),
        curve=[{"step": h["step"], "loss": round(h["loss"], 5), "acc": [round(a, 4) for a in h["acc"]]}
               for h in history[::every]])
    out = export_head(args.out, hcfg, weights, args.dtype, info)
    print(f"wrote {out} (final loss {info['final_loss_avg50']:.4f}, top-1 acc per step {info['final_acc_avg50']})")
    return out


def check_head_dir(head: str) -> None:
    """--init-from names a head directory (or a shipped head) with a config.json; ValueError naming it if not."""
    from jaxspec.resolve import resolve_head

    try:
        path = resolve_head(head)
    except ValueError:
        path = None
    if path is None or not (path / "config.json").exists():
        raise ValueError(f"--init-from {head}: not an EAGLE head directory (no config.json) nor a shipped head")


def draft_vocab_coverage(data: TokenDataset, weights: eagle.EagleWeights) -> float | None:
    """EAGLE-3: the share of the data's response tokens inside the draft vocabulary (the others can never be
    drafted); None for EAGLE-1."""
    if weights.d2t is None:
        return None
    d2t = np.asarray(weights.d2t)
    return round(float(np.isin(data.tokens[data.loss_mask > 0], np.arange(len(d2t)) + d2t).mean()), 4)
