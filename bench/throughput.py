#!/usr/bin/env python
"""`python bench/throughput.py ...` is `jaxspec bench throughput ...`: the logic lives in jaxspec/bench/."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxspec.bench.throughput import main  # noqa: E402

if __name__ == "__main__":
    main()
