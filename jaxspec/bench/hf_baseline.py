"""The peer: transformers `generate` (torch) on the same prompts, greedy, batched with left padding.

It runs in a child process (`python -m jaxspec.bench.hf_baseline JOB.json OUT.json`) started before the parent
touches jax: torch gets the GPU memory jax would otherwise preallocate, and a crash or a timeout costs only this
row of the table. The child writes OUT.json after every prompt count, so a timeout keeps the counts done.

Weights: the model's Hugging Face directory (the same weights as ours, in bf16 on a GPU, fp32 on CPU) or, for
`--hf-config` runs, a randomly initialised LlamaForCausalLM of that config (speed only: the tokens cannot agree).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_hf_baseline(job: dict, timeout_s: float) -> dict:
    """Run the job in a child process; returns its results (possibly partial) plus `error` when it failed."""
    with tempfile.TemporaryDirectory(prefix="jaxspec-hf-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))
        cmd = [sys.executable, "-m", "jaxspec.bench.hf_baseline", str(job_path), str(out_path)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                           os.environ.get("PYTHONPATH", "")]))
        error = None
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
            if run.returncode:
                error = f"exit {run.returncode}: {run.stderr[-1500:]}"
        except subprocess.TimeoutExpired:
            error = f"timed out after {timeout_s:.0f} s (--hf-timeout)"
        result = json.loads(out_path.read_text()) if out_path.exists() else {"runs": {}}
    if error:
        result["error"] = error
    return result


def _load_model(job: dict, device: str, dtype):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if job.get("hf_dir"):
        try:
            model = AutoModelForCausalLM.from_pretrained(job["hf_dir"], dtype=dtype)
        except TypeError:  # transformers < 4.56 spells it torch_dtype
            model = AutoModelForCausalLM.from_pretrained(job["hf_dir"], torch_dtype=dtype)
        return model.to(device).eval()
    config = LlamaConfig(**{k: v for k, v in job["hf_config"].items() if k not in ("architectures", "torch_dtype")})
    torch.manual_seed(job.get("seed", 0))
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialise in the target dtype: no fp32 copy of an 8B model
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def _pad_id(job: dict) -> int:
    cfg = job["hf_config"]
    for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
        v = cfg.get(key)
        v = v[0] if isinstance(v, list) and v else v
        if isinstance(v, int):
            return v
    return 0


def _eos_ids(job: dict) -> set[int]:
    eos = job["hf_config"].get("eos_token_id")
    return set(eos if isinstance(eos, list) else [] if eos is None else [eos])


def generate(model, prompts: list[list[int]], job: dict, device: str, max_tokens: int) -> list[list[int]]:
    """Greedy outputs, batch_size prompts at a time, left-padded; each cut after its first EOS unless ignore_eos."""
    import torch

    pad, eos = _pad_id(job), _eos_ids(job)
    outputs = []
    for start in range(0, len(prompts), job["batch_size"]):
        chunk = prompts[start:start + job["batch_size"]]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, p in enumerate(chunk):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        with torch.inference_mode():
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_tokens,
                                 do_sample=False, pad_token_id=pad)
        for row in out[:, width:].tolist():
            cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row)) if not job["ignore_eos"] else len(row)
            outputs.append(row[:cut])
    if device == "cuda":
        torch.cuda.synchronize()
    return outputs


def _configure(model, job: dict) -> None:
    """Greedy, and no EOS at all under ignore_eos (None on the model's own config: generate fills a request's
    unset fields from it)."""
    gc = model.generation_config
    gc.do_sample, gc.temperature, gc.top_p, gc.top_k = False, None, None, None
    gc.pad_token_id = _pad_id(job)
    if job["ignore_eos"]:
        gc.eos_token_id = None
        model.config.eos_token_id = None


def main(argv: list[str]) -> None:
    import torch

    job = json.loads(Path(argv[0]).read_text())
    out_path = Path(argv[1])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {"auto": torch.bfloat16 if device == "cuda" else torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16, "float32": torch.float32}[job["dtype"]]
    t0 = time.perf_counter()
    model = _load_model(job, device, dtype)
    _configure(model, job)
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "dtype": str(dtype),
              "random_weights": not job.get("hf_dir"), "load_s": time.perf_counter() - t0,
              "batch_size": job["batch_size"], "runs": {}}
    generate(model, job["prompts"][:2], job, device, 4)  # warm up kernels and the allocator
    k = job["agree_tokens"]
    for n in job["counts"]:
        prompts = job["prompts"][:n]
        t = time.perf_counter()
        outs = generate(model, prompts, job, device, job["max_tokens"])
        elapsed = time.perf_counter() - t
        n_out = sum(len(o) for o in outs)
        result["runs"][str(n)] = {"num_prompts": n, "elapsed_s": elapsed, "output_tokens": n_out,
                                  "output_tokens_per_s": n_out / elapsed, "first_tokens": [o[:k] for o in outs]}
        tmp = out_path.with_suffix(".part")
        tmp.write_text(json.dumps(result))
        tmp.replace(out_path)


if __name__ == "__main__":
    main(sys.argv[1:])
