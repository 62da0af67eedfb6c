"""Scale-out on the CPU: tensor parallelism across two jax.distributed processes (localhost, two CPU devices each,
gloo collectives) gives the greedy outputs of one process with tensor_parallel_size=1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from jaxspec import LLM, SamplingParams
from jaxspec.convert.checkpoint import save_checkpoint
from tests.tiny import TINY, tiny_weights
from tests.tp_process import GREEDY, LLM_ARGS, prompts

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_tp4_equal_one_process_tp1(tmp_path):
    # each child sets its own device count (jax_num_cpu_devices = 2); conftest's count of 4 is for this process
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(flags)}
    ckpt = save_checkpoint(tmp_path / "ckpt", TINY, tiny_weights())
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "tests.tp_process", str(port), str(i), str(ckpt)], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        llm = LLM(str(ckpt), **LLM_ARGS)  # the reference, one process, while the children start
        reference = [o.outputs[0].token_ids for o in llm.generate(prompts(), SamplingParams(**GREEDY),
                                                                    use_tqdm=False)]
        results = [p.communicate(timeout=170) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err[-4000:]
        outputs = json.loads(next(line for line in out.splitlines() if line.startswith("OUTPUTS "))[8:])
        assert outputs == reference
