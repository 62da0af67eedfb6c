"""`jaxspec generate` on a tiny model and head: it compiles exactly the programs its run uses before timing, prints
that compile time on its own line, and the timed run compiles nothing."""

from __future__ import annotations

import json
import re

import pytest

from jaxspec.cli import main
from tests.tiny import write_model_dir, write_random_head


@pytest.mark.parametrize("spec", [True, False])
def test_generate_compiles_first_and_times_the_steady_state(tmp_path, capsys, spec):
    model = write_model_dir(tmp_path / "tiny")
    argv = ["generate", "--model", str(model), "--max-tokens", "12", "--max-model-len", "64",
            "--prompt", "abcabc", "--prompt", "xyz", "--prompt", "hello"]
    if spec:
        head = {"method": "eagle", "model": str(write_random_head(tmp_path / "head")), "num_speculative_tokens": 2}
        argv += ["--speculative-config", json.dumps(head)]
    else:
        argv += ["--no-spec"]
    main(argv)
    out = capsys.readouterr().out
    # three prompts: decode buckets 1, 2, 3 as requests finish; one prefill bucket for all prompt tokens (16); the
    # page copy of parallel samples
    assert re.search(r"^compiled 5 programs in [\d.]+ s \(decode buckets \[1, 2, 3\], prefill bucket 16, greedy; "
                     r"compilation cache off\)$",
                     out, re.M), out
    assert re.search(r"^3 requests, \d+ output tokens in [\d.]+ s: [\d.]+ output tokens/s \(steady state", out, re.M)
    assert "WARNING" not in out  # nothing compiled after the programs above
    assert ("mean acceptance length" in out) == spec and ("no draft head" in out) != spec
