"""Pallas kernels past lowering, on a machine without a GPU: capture the Triton IR that Pallas makes of each kernel
(what XLA compiles on a GPU) and compile it to H200 (sm_90) machine code with the triton package's compiler and
ptxas. A check of shapes, layouts and ops against Triton's own rules, which the interpreter does not apply; the
triton package is not jaxlib's Triton, so this is evidence, and tests/test_gpu.py the proof."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest


def capture_modules(monkeypatch: pytest.MonkeyPatch) -> list:
    """The list that every Triton module lowered from here on is appended to."""
    from jax._src.pallas.triton import lowering

    modules = []
    make = lowering.lower_jaxpr_to_triton_module
    monkeypatch.setattr(lowering, "lower_jaxpr_to_triton_module", lambda *a, **kw: modules.append(
        make(*a, **kw)) or modules[-1])
    return modules


def assert_compiles_without_spills(modules: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, num_warps: int,
                                   num_stages: int) -> None:
    """Each module compiles to sm_90 machine code, and ptxas reports no register spills (a spill goes through
    memory each time). Skips without the triton package."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    for i, result in enumerate(modules):
        path = tmp_path / f"kernel{i}.ttir"
        path.write_text(result.module.operation.get_asm(enable_debug_info=False))
        compiled = triton.compile(str(path), target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps,
                                                                                        "num_stages": num_stages})
        assert compiled.asm["cubin"], path
        (tmp_path / f"kernel{i}.ptx").write_text(compiled.asm["ptx"])
        usage = subprocess.run([str(ptxas), "-v", "--gpu-name", "sm_90a", str(tmp_path / f"kernel{i}.ptx"), "-o",
                                os.devnull], capture_output=True, text=True, check=True).stderr
        spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", usage)]
        assert spills and not any(spills), usage
