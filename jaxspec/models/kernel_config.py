"""Kernel and GEMM settings: static, part of every jit key through the model config, so a changed setting always
compiles anew. Environment variables may set the defaults; they are read when `from_env` is called (when an LLM is
built), never at import."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import Field, dataclass, fields

import jax


@jax.tree_util.register_static
@dataclass(frozen=True)
class KernelConfig:
    # Paged-attention launch parameters, measured on the H200 with bench/attn_kernel.py (which tunes them for
    # another GPU): keys per loop iteration, warps, pipeline stages.
    attn_block_tokens: int = 128
    attn_num_warps: int = 4
    attn_num_stages: int = 2
    # Programs to aim for. The H200 keeps 3 of the kernel's programs per SM resident (ncu: 74 KB of shared memory
    # each), 396 in all; fewer, longer programs also write and merge fewer partial results. Measured there
    # (bench/step_time.py, steps back to back): 512 against 2048 gave Llama-3-8B plain decoding 5.34 against
    # 5.65 ms at batch 32, 4.88 against 5.00 at 16, 4.67 against 4.68 at 8 (1 to 4: the same splits); SmolLM2 with
    # k = 3 at batch 96, 2.18 against 2.81 ms; the Llama-3-8B EAGLE sweep 2 to 4 % more tokens/s.
    attn_programs: int = 512
    # The GEMM backend, chosen per program by the tokens a step runs through the model. XLA's default fuses GEMMs
    # into Triton kernels it writes itself; with the flag off it calls cuBLAS. On the H200 (bench/step_time.py,
    # Llama-3-8B shapes, steps back to back) XLA's Triton GEMMs were faster when a step's matrices have few rows
    # (4.41 against 4.61 ms at 1 token per step, 5.63 against 5.80 at 32; even at 16) and cuBLAS far faster with
    # many (12.5 against 17.8 ms for the fused EAGLE step at 96 rows x 3 tokens = 288). At 72 tokens the two were
    # within 2 % (7.09 ms with cuBLAS, 6.96 without); the threshold between is a choice, not a measurement.
    cublas_min_tokens: int = 64
    # XLA:GPU's command-buffer update mode SKIP_TEMP, where this XLA has it: the step's scratch buffer keeps one
    # (remapped) address, so the CUDA graphs are not re-recorded on every dispatch. Without it the scratch buffer
    # moved between steps and every node was updated: on the H200 (bench/step_time.py, SmolLM2 shapes, no
    # speculation) launching one batch-96 step took 3.2 ms of host time against 0.83 ms with it.
    stable_scratch: bool = True
    # Keep each step's plan arrays (block tables, sampling params...) in device buffers of their own per bucket,
    # overwritten by a small donated program before each dispatch, so the step reads them at the same addresses
    # every time: XLA updates every CUDA-graph node that reads a buffer whose address changed since the last run,
    # and arrays passed fresh each step have new ones. On the H200 (SmolLM2 shapes, k = 3, batch 96, with
    # stable_scratch) launching a step took 3.0 ms of host time with fresh plan arrays, 1.0 ms with the same ones.
    # A plan equal to the one the buffers hold is not written again (ModelRunner._place).
    resident_plan: bool = True
    # Run each step program as two executables, alternating from call to call, each writing its output over a
    # buffer it keeps (donated back when it next runs: two calls later, once the engine has read that output), so
    # that nothing a step's kernels touch ever moves (one device, on a GPU: elsewhere there are no CUDA graphs).
    # XLA re-records a program's whole CUDA graph whenever one of its buffers has moved since its last launch, and
    # a fresh output buffer did at every call: re-recording took 0.4-1.0 ms of host time per step (traced). On the
    # H200 (SmolLM2 shapes, steps dispatched as the async engine does): 1.57 -> 1.20 ms a step at batch 1 without
    # speculation, 3.06 -> 2.59 at 96 rows with k = 3, 3.35 -> 2.73 with logprobs and a presence penalty; the engine
    # end to end: 792 -> 829 output tok/s at batch 1, no change beyond the runs' spread at 96 prompts. On an H100
    # with page_reserve_whole (EAGLE k = 3, synthetic acceptance, 96 prompts, single steps): 73,714 -> 76,769 output
    # tok/s, host work 1.83 -> 1.47 ms a step; with 4 steps a dispatch no change (bench/results/20261207-twins-busy/).
    # The second executable of each program comes from the persistent compilation cache when it is on.
    twin_programs: bool = True
    # Decode forwards of at most fused_decode_tokens tokens (one by default: batch 1 without speculation, the draft
    # head's rollout passes at batch 1) run each Llama layer, the target's and the draft head's, as five Pallas
    # kernels (models/fused_layer.py) instead of the ~17 XLA makes of it at batch 1, where the kernels' number, not
    # their bytes, sets the step time. Needs the Pallas attention and one device. On an H100 (random SmolLM2
    # weights, batch 1, 1,024 tokens; bench/results/20261206-h100-gemv-layer/): a step 0.948 against 1.188 ms
    # (0.944 against 1.157 ms of kernels, 172 against 561 launches); the engine 941 against 725 output tok/s, 1,034
    # against 946 with 8 scheduler steps a dispatch, 1,699 against 1,288 with EAGLE k = 3 at synthetic acceptance
    # 0.6. Before its kernels multiplied row by row (16-row tensor-core dots, 5-9 us each) it was slower: on the
    # H200 1.41 against 1.21 ms a step (bench/results/20261205-h200-fused-layer/).
    fused_decode: bool = True
    # The most tokens (rows x tokens a row) a forward may have to run the fused layer (16 at most: its block of
    # rows). Its kernels for one token multiply row by row on the CUDA cores; for 2-4 tokens the same, once per row;
    # for 5-16, 16-row tensor-core dots. On an H100 (SmolLM2 shapes, each kernel alone) one token took 5.4-6.7 us a
    # kernel where XLA's ops for the same work took 4.8-8.4 us in 2-4 kernels (and its layer has others besides),
    # four tokens 10.7-16.7 us against XLA's 3.2-7.4; EAGLE k = 3 at batch 1 ran 1,699 output tok/s with one token,
    # 1,051 with four (the verify fused too), 1,032 with sixteen.
    fused_decode_tokens: int = 1
    # ... and only for models whose layer weights (q, k, v, o, gate, up, down in the model's dtype) take at most this
    # many MiB: the fused kernels wait on memory latency well, not on bandwidth (one wave of ~64-96 programs, ~1.6
    # TB/s on large matrices against XLA's ~2.9). On an H100, batch 1: SmolLM2-135M (6.75 MiB a layer) a step 0.940
    # against 1.196 ms with XLA's layers; Llama-3-8B shapes (416 MiB) 10.0 against 5.7 ms
    # (bench/results/20261206-loads-first/). Between the two, unmeasured: the bound keeps where it was measured to win.
    fused_decode_max_layer_mib: int = 16
    # An all-greedy decode step with logits processors or logprobs runs its pass over the vocabulary as one Pallas
    # kernel (engine/greedy_pass.py): processing, argmax, log-sum-exp, ties and block maxima from one read of the
    # logits and the slots' processor rows, where XLA writes the processed logits out and reads them twice more.
    # Needs the Pallas attention (a GPU) and one device; processors.sample is the XLA path and the oracle. On an H100
    # (SmolLM2 shapes, 96 rows, k = 3, logprobs=5 and a presence penalty): 52 us against XLA's 119, the step's device
    # time over greedy 0.092 ms instead of 0.144 (bench/results/20261205-greedy-pass/).
    greedy_pass: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if _is_flag(f):
                if not isinstance(value, bool):
                    raise ValueError(f"KernelConfig.{f.name} must be True or False, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"KernelConfig.{f.name} must be a positive integer, got {value!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "KernelConfig":
        """The defaults, each overridden by JAXSPEC_<FIELD> (JAXSPEC_ATTN_PROGRAMS, JAXSPEC_CUBLAS_MIN_TOKENS...; 0 or 1
        for a flag such as JAXSPEC_RESIDENT_PLAN)."""
        environ = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            name = f"JAXSPEC_{f.name.upper()}"
            if name in environ:
                try:
                    values[f.name] = int(environ[name])
                except ValueError:
                    raise ValueError(f"{name}={environ[name]!r} is not an integer") from None
                if _is_flag(f):
                    if values[f.name] not in (0, 1):
                        raise ValueError(f"{name}={environ[name]!r}: expected 0 or 1")
                    values[f.name] = bool(values[f.name])
        return cls(**values)


def _is_flag(f: Field) -> bool:
    """A boolean field (its annotation is a string under `from __future__ import annotations`)."""
    return f.type in ("bool", bool)
