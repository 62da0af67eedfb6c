"""Draft heads' mean acceptance length on held-out prompts (greedy), with per-position acceptance, per data set
and per k; --sampling adds SamplingParams options (penalties, logit_bias, ...: the drafts follow the processed target).

    python bench/acceptance.py --model smollm2-135m-instruct \
        --speculative-config '{"method": "eagle3", "model": "weights/eagle3-smollm2-135m-instruct"}' \
        --k 1,2,3,4,5 --dataset gsm8k_test=gsm8k_test.jsonl --dataset held_out=held_out.jsonl \
        --num-prompts 200 --max-tokens 256 --output-json acceptance.json

The target's weights are loaded once. Each k is its own program, so each k builds one LLM on those weights
(seconds with scanned layers, the default here: identical results to unrolled ones, a fraction of the compile
time), with one decode bucket and one prefill bucket; every data set runs on it, and `stats()` differences
tell their counts apart. Points run in the order of --k (put the k that matter first when time is short); the JSON
is rewritten after each, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxspec import LLM, SamplingParams, compile_cache  # noqa: E402
from jaxspec.bench.data import dataset_prompts  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="preset name, a preset's weights directory, a jaxspec checkpoint or an HF Llama directory")
    ap.add_argument("--speculative-config", required=True,
                    help="JSON: method, model (the head), num_speculative_tokens (unless --k)")
    ap.add_argument("--k", help="comma-separated numbers of speculative tokens, e.g. 3,5,1,2,4 (default: the "
                    "config's num_speculative_tokens)")
    ap.add_argument("--dataset-path", "--dataset", dest="dataset", action="append", required=True,
                    metavar="[NAME=]PATH",
                    help="JSONL with question / prompt / turns / messages; repeatable (NAME defaults to the stem)")
    ap.add_argument("--num-prompts", type=int, default=200, help="first N prompts of each data set")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, help="default: the longest prompt + max tokens + 2k + 1, rounded up "
                    "to 128")
    ap.add_argument("--max-num-batched-tokens", type=int, default=4096,
                    help="prompt tokens per prefill step: the one prefill bucket compiled")
    ap.add_argument("--layer-loop", default="scan", choices=["scan", "unroll", "auto"],
                    help="scan: same results as unroll, compiles in seconds")
    ap.add_argument("--dtype", default="auto", help="target dtype (auto: bfloat16 on a GPU, the stored one elsewhere)")
    ap.add_argument("--sampling", default="{}", help="JSON: more SamplingParams options, e.g. "
                    "'{\"repetition_penalty\": 1.2}' (default: plain greedy)")
    ap.add_argument("--time-budget-s", type=float, help="start no new point after this many seconds")
    ap.add_argument("--output-json")
    compile_cache.add_argument(ap)
    return ap.parse_args(argv)


def parse_k(args: argparse.Namespace, spec: dict) -> list[int]:
    if args.k:
        return [int(k) for k in args.k.split(",") if k]
    if "num_speculative_tokens" not in spec:
        raise ValueError("--speculative-config has no num_speculative_tokens: pass --k")
    return [int(spec["num_speculative_tokens"])]


def parse_datasets(items: list[str]) -> dict[str, Path]:
    sets: dict[str, Path] = {}
    for item in items:
        name, _, path = item.rpartition("=")
        name = name or Path(path).stem
        if name in sets:
            raise ValueError(f"--dataset: two data sets named {name!r}; name them NAME=PATH")
        if not Path(path).exists():
            raise ValueError(f"--dataset {item}: {path} does not exist")
        sets[name] = Path(path)
    return sets


def main(argv: list[str] | None = None) -> dict:
    import jax

    from jaxspec.bench.engine import load_target
    from jaxspec.engine.llm_engine import metrics_delta
    from jaxspec.bench.throughput import model_source
    from jaxspec.tokenizer import load_tokenizer

    args = parse_args(argv)
    start = time.perf_counter()
    spec = json.loads(args.speculative_config)
    ks, sets = parse_k(args, spec), parse_datasets(args.dataset)
    extra = json.loads(args.sampling)  # a bad option fails here, before anything loads
    params = SamplingParams.from_json(extra, temperature=0.0, max_tokens=args.max_tokens)
    src = model_source(argparse.Namespace(model=args.model, hf_config=None, load_format="auto", tokenizer=None))
    tokenizer = load_tokenizer(src.tokenizer_dir or src.ckpt)
    prompts = {name: unique(dataset_prompts(path, args.num_prompts, tokenizer)) for name, path in sets.items()}
    batch = max(map(len, prompts.values()))
    need = max(len(p) for ps in prompts.values() for p in ps) + args.max_tokens + 2 * max(ks) + 1
    max_model_len = args.max_model_len or -(-need // 128) * 128
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if jax.default_backend() == "gpu" else None)
    target = load_target(src.ckpt, src.hf_config, False, dtype)
    result = {"command": shlex.join(["bench/acceptance.py"] + (sys.argv[1:] if argv is None else argv)),
              "date": time.strftime("%Y-%m-%d"), "model": args.model,
              "speculative_config": {k: v for k, v in spec.items() if k != "num_speculative_tokens"},
              "max_tokens": args.max_tokens, "temperature": params.temperature, "sampling": extra,
              "layer_loop": args.layer_loop,
              "device": f"{jax.devices()[0].platform}:{getattr(jax.devices()[0], 'device_kind', '')}",
              "datasets": {name: {"path": str(path), "num_prompts": len(prompts[name])} for name, path in sets.items()},
              "results": [], "build_s": {}, "errors": [], "skipped": []}
    for k in ks:
        if args.time_budget_s is not None and time.perf_counter() - start > args.time_budget_s:
            result["skipped"].append({"k": k, "reason": "time budget"})
            continue
        try:
            t0 = time.perf_counter()
            llm = LLM.from_weights(
                *target, tokenizer=src.tokenizer_dir, layer_loop=args.layer_loop,
                speculative_config={**spec, "num_speculative_tokens": k}, max_model_len=max_model_len,
                max_num_seqs=batch, decode_buckets=[batch], max_num_batched_tokens=args.max_num_batched_tokens,
                prefill_buckets=[args.max_num_batched_tokens], max_prefill_seqs=min(batch, 64),
                num_pages=batch * -(-max_model_len // 16) + 1, warmup=False,
                compilation_cache_dir=args.compilation_cache_dir)
            result["build_s"][str(k)] = round(time.perf_counter() - t0, 1)
            for name, ps in prompts.items():
                before, t0 = llm.stats(), time.perf_counter()
                outs = llm.generate([{"prompt_token_ids": p} for p in ps], params, use_tqdm=False)
                row = {"dataset": name, "k": k, "num_prompts": len(ps), "wall_s": round(time.perf_counter() - t0, 2),
                       "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs)}
                delta = metrics_delta(before, llm.stats())
                row |= {key: delta[key] for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens",
                                                    "acceptance_rate_per_position", "mean_acceptance_length")}
                result["results"].append(row)
                print(f"{spec['method']} k={k} {name} ({len(ps)} prompts): mean acceptance length "
                      f"{row['mean_acceptance_length']:.3f}, per position "
                      f"{[round(r, 3) for r in row['acceptance_rate_per_position']]}", flush=True)
                save(args.output_json, result)
            del llm
            gc.collect()
        except Exception as e:  # one k failing (e.g. out of memory) must not lose the others
            result["errors"].append({"k": k, "error": f"{type(e).__name__}: {e}"[:2000]})
            print(f"k={k} failed: {type(e).__name__}: {e}", flush=True)
        save(args.output_json, result)
    result["wall_s"] = round(time.perf_counter() - start, 1)
    save(args.output_json, result)
    print(acceptance_table(result))
    return result


def unique(prompts: list[list[int]]) -> list[list[int]]:
    """Without repeats: dataset_prompts cycles a short file, and a repeated greedy prompt would count twice."""
    return [list(p) for p in dict.fromkeys(map(tuple, prompts))]


def save(path: str | None, result: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=2) + "\n")


def acceptance_table(result: dict) -> str:
    """Mean acceptance length (per-position acceptance) per data set and k, as a Markdown table."""
    ks = sorted({r["k"] for r in result["results"]})
    head = f"{result['speculative_config'].get('method', '')} {result['speculative_config'].get('model', '')}"
    mode = "greedy" if not result.get("temperature") else f"temperature {result['temperature']}"
    mode += "".join(f", {k} {v}" for k, v in result.get("sampling", {}).items() if k != "temperature")
    lines = [f"{head}: mean acceptance length (per-position acceptance), {mode}, {result['max_tokens']} tokens",
             "| data set (prompts) | " + " | ".join(f"k = {k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for name, info in result["datasets"].items():
        cells = {r["k"]: f"**{r['mean_acceptance_length']:.2f}** ("
                 + " / ".join(f"{a:.2f}" for a in r["acceptance_rate_per_position"]) + ")"
                 for r in result["results"] if r["dataset"] == name}
        lines.append(f"| {name} ({info['num_prompts']}) | " + " | ".join(cells.get(k, "-") for k in ks) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
