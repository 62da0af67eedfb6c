"""The persistent compilation cache (jaxspec/compile_cache.py): on by default in the user's cache directory, and a
second process building the same LLM loads every step program from it instead of compiling (told by jax's own
cache-hit and cache-miss events, not by timing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from jaxspec import compile_cache

ROOT = Path(__file__).resolve().parents[1]
BUILD = """
import collections, json
import jax
events = collections.Counter()
jax.monitoring.register_event_listener(lambda name, **kw: events.update([name.rsplit("/", 1)[-1]]))
from jaxspec import LLM
from tests.tiny import TINY, tiny_weights
llm = LLM.from_weights(TINY, tiny_weights(), max_model_len=32, max_num_seqs=1, max_num_batched_tokens=16,
                       decode_buckets=[1], prefill_buckets=[16], warmup=True)
print(json.dumps({"compiled": llm.num_compiled, "hits": events["cache_hits"], "misses": events["cache_misses"],
                  "dir": jax.config.jax_compilation_cache_dir}))
"""


def build_in_a_new_process(env: dict) -> dict:
    run = subprocess.run([sys.executable, "-c", BUILD], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_second_process_loads_the_step_programs_from_the_default_cache(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"} | {
        "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    first = build_in_a_new_process(env)
    # 9 decode and 5 prefill variants of one bucket each (model_runner.ALL_KINDS), the two admissions and page copy
    assert first["dir"] == str(tmp_path / "jaxspec" / "xla") and first["compiled"] == 9 + 5 + 3
    assert first["hits"] == 0 and first["misses"] >= first["compiled"]
    second = build_in_a_new_process(env)
    assert second["misses"] == 0 and second["hits"] == first["misses"]


@pytest.fixture
def restore_jax_cache_config():
    from jax.experimental.compilation_cache import compilation_cache
    saved = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    yield
    jax.config.update("jax_compilation_cache_dir", saved[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[1])
    compilation_cache.reset_cache()


def test_configure_values(tmp_path, monkeypatch, restore_jax_cache_config):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    jax.config.update("jax_compilation_cache_dir", None)  # nothing configured: auto is ours
    assert compile_cache.configure() == tmp_path / "jaxspec" / "xla"
    assert jax.config.jax_persistent_cache_min_compile_time_secs == compile_cache.MIN_COMPILE_TIME_S
    assert (tmp_path / "jaxspec" / "xla").stat().st_mode & 0o077 == 0  # its user's only: jax trusts its contents
    assert compile_cache.configure(tmp_path / "mine") == tmp_path / "mine"
    assert compile_cache.configure("auto") == tmp_path / "mine"  # auto keeps what is configured
    assert compile_cache.configure(False) is None and jax.config.jax_compilation_cache_dir is None
    jax.config.update("jax_compilation_cache_dir", "")  # as JAX_COMPILATION_CACHE_DIR="" leaves it: off
    assert compile_cache.configure(None) is None
