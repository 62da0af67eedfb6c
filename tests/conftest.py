"""Test setup: CPU, quick XLA compiles (the tests compile many small programs and run each briefly)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
