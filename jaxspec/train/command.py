"""`jaxspec train-eagle`: regenerate data with the target (or load it from --dataset-cache), train, export.

    jaxspec train-eagle --model smollm2-135m-instruct --method eagle3 --data gsm8k_train.jsonl \
        --num-prompts 7473 --max-tokens 512 --seq-len 512 --steps 20000 --batch-size 32 --lr 1e-4 \
        --out weights/smollm2-135m-instruct/eagle3 --ckpt-dir /tmp/ckpt --dataset-cache /tmp/gsm8k.npz
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
from jaxspec.models import eagle
from jaxspec.train.data import TokenDataset, chat_token_ids, generate_dataset, read_prompts

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
    from jaxspec.config import buckets_up_to
    from jaxspec.llm import LLM
    from jaxspec.tokenizer import eos_token_ids

    if not args.data:
        raise ValueError("--data is required to generate a dataset (no --dataset-cache file to load)")
    # scanned layers, few buckets, and only the greedy programs that are used, compiled on first use: a one-off
    # generation should not spend minutes compiling
    llm = LLM(str(model_path), dtype=args.target_dtype, max_model_len=args.seq_len + 1,
              max_num_seqs=args.gen_batch, seed=args.seed, layer_loop="scan", max_num_batched_tokens=4096,
              max_prefill_seqs=32, prefill_buckets=[1024, 4096], warmup=False,
              decode_buckets=buckets_up_to(args.gen_batch, smallest=max(1, args.gen_batch // 16)),
              compilation_cache_dir=args.compilation_cache_dir)
    if llm.tokenizer is None:
        raise ValueError(f"{model_path}: no tokenizer, so prompts cannot be formatted with a chat template")
    prompts = read_prompts(args.data, args.num_prompts)
    meta = {"model": str(args.model), "sources": [str(p) for p in args.data], "target_dtype": args.target_dtype,
            "eos_token_ids": sorted(eos_token_ids(llm.tokenizer, model_path))}
    start = time.perf_counter()
    data = generate_dataset(llm, chat_token_ids(llm.tokenizer, prompts), args.max_tokens, args.seq_len, meta)
    data.meta["generate_s"] = round(time.perf_counter() - start, 1)
    del llm  # free its weights and KV pool before training
    gc.collect()
    n_resp = int(data.loss_mask.sum())
    print(f"generated {len(data)} sequences ({n_resp} response tokens) in {data.meta['generate_s']} s")
    if cache is not None:
        data.save(cache)
        print(f"wrote {cache}")
    return data


def train_from_args(args: argparse.Namespace) -> Path:
    from jaxspec.convert.checkpoint import load_model
    from jaxspec.resolve import resolve_model
    from jaxspec.train.trainer import export_head, train_eagle, training_info

    compile_cache.configure(args.compilation_cache_dir)  # the training step is cached too
    if args.data_only and not args.dataset_cache:
        raise ValueError("--data-only needs --dataset-cache (where to write the data)")
    if not args.data_only and not args.out:
        raise ValueError("--out is required (the directory for the exported head)")
    model_path = resolve_model(args.model).weights
    data = build_dataset(args, model_path)
    if args.data_only:
        return Path(args.dataset_cache)
    tcfg, tw = load_model(model_path, args.target_dtype)
    # kv=None: dense attention whatever attn_impl says. Scanned layers: a training step is compute-bound, so the
    # per-layer weight copy a scan makes is noise, and the step compiles in seconds
    tcfg = tcfg.replace(attn_impl="xla", layer_loop="scan")
    aux = tuple(int(i) for i in args.aux_layers.split(",")) if args.aux_layers else None
    draft_vocab = min(args.draft_vocab_size, tcfg.vocab_size) if args.method == "eagle3" else None
    hcfg = eagle.EagleConfig.from_target(tcfg, args.method, draft_vocab_size=draft_vocab, aux_layers=aux)
    start = time.perf_counter()
    weights, history = train_eagle(
        tcfg, tw, hcfg, data, args.steps, args.batch_size, args.lr, ttt_steps=args.ttt_steps,
        noise=args.noise, compute_dtype=args.compute_dtype, warmup_steps=args.warmup_steps, ckpt_dir=args.ckpt_dir,
        ckpt_every=args.ckpt_every, resume=args.resume, time_budget_s=args.time_budget_s, seed=args.seed)
    wall = time.perf_counter() - start
    every = max(1, len(history) // 200)
    info = training_info(
        history, wall, command=shlex.join(["jaxspec"] + sys.argv[1:]), method=args.method, model=str(args.model),
        data=data.meta | {"num_sequences": len(data), "seq_len": data.seq_len,
                          "response_tokens": int(data.loss_mask.sum())},
        steps=args.steps, batch_size=args.batch_size, lr=args.lr, target_dtype=args.target_dtype,
        compute_dtype=args.compute_dtype, export_dtype=args.dtype, aux_layers=list(hcfg.aux_layers),
        draft_vocab_size=hcfg.draft_vocab_size,
        curve=[{"step": h["step"], "loss": round(h["loss"], 5), "acc": [round(a, 4) for a in h["acc"]]}
               for h in history[::every]])
    out = export_head(args.out, hcfg, weights, args.dtype, info)
    print(f"wrote {out} (final loss {info['final_loss_avg50']:.4f}, top-1 acc per step {info['final_acc_avg50']})")
    return out
