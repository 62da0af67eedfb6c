"""Test setup: CPU, quick XLA compiles (the tests compile many small programs and run each briefly)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    # 4 CPU devices for tests/test_tp.py (tensor parallelism); everything else runs on the first one. XLA reads
    # this when jax first initializes, so it must be set here, before any test module imports jax.
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=4"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# LLM's default persistent compilation cache (~/.cache/jaxspec/xla) off: the suite writes nothing to the user's
# cache and each test compiles what it checks. tests/test_compile_cache.py turns it on where it is the subject.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", "")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def trained_heads(tmp_path_factory):
    """EAGLE-1 and EAGLE-3 heads trained for seconds on the tiny target's (tests.tiny.tiny_weights()) own greedy
    continuations of their prompts (a tiny random target is chaotic, so they draft well only there): acceptance
    well between 0 and 1. {method: TinyHead}, each exported to a directory (speculative_config "model")."""
    from tests.tiny_heads import train_tiny_head
    from tests.tiny import TINY, tiny_weights

    root = tmp_path_factory.mktemp("heads")
    return {m: train_tiny_head(m, TINY, tiny_weights(), root / m) for m in ("eagle", "eagle3")}


@pytest.fixture(scope="module", autouse=True)
def _free_compiled_programs():
    """After each module, drop the programs it compiled. Every XLA:CPU executable maps its code into memory
    regions of its own, and one process compiling the whole suite's programs (thousands) reaches the kernel's
    limit of 65,530 maps (vm.max_map_count), where the next compile crashes with a segmentation fault."""
    yield
    import gc

    import jax

    gc.collect()
    jax.clear_caches()
    gc.collect()
