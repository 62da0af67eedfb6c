"""One process of tests/test_multiprocess.py's two-process tensor-parallel run:
`python -m tests.tp_process PORT ID CHECKPOINT`.

Two CPU devices per process, jax.distributed over localhost; each process loads the same jaxspec checkpoint, as
users on several hosts do, into an LLM that spans both processes' devices (tensor_parallel_size=4), and prints its
greedy outputs as one JSON line after "OUTPUTS " (gloo writes to stdout too).
"""

from __future__ import annotations

import json
import sys

import jax

GREEDY = dict(temperature=0, max_tokens=12, ignore_eos=True)
LLM_ARGS = dict(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64, page_size=8, warmup=False,
                decode_buckets=[4], prefill_buckets=[64])


def prompts() -> list[list[int]]:
    from tests.tiny import random_prompts
    return random_prompts(5, 1, 40, seed=21)


def main(port: int, process_id: int, checkpoint: str) -> None:
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 2)
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
                               initialization_timeout=60)
    assert (jax.process_count(), jax.device_count(), jax.local_device_count()) == (2, 4, 2)
    from jaxspec import LLM, SamplingParams

    llm = LLM(checkpoint, tensor_parallel_size=4, **LLM_ARGS)
    outs = llm.generate(prompts(), SamplingParams(**GREEDY), use_tqdm=False)
    print("OUTPUTS", json.dumps([o.outputs[0].token_ids for o in outs]), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
