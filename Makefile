# The README's two commands: `make run` (set up, fetch the default model, generate with its EAGLE head) and
# `make test` (set up, run the test suite on the CPU).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# pytest-xdist workers for `make test`: the suite is mostly single-threaded XLA compiles, so two workers on two cores
# take ~15 instead of ~23 minutes; work stealing keeps the longest tests from ending up queued on one worker
TEST_WORKERS ?= 2
# jax with CUDA when this machine has an NVIDIA driver, the CPU build otherwise
EXTRA := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo "dev,cuda13" || echo "dev")

.PHONY: setup run test

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(EXTRA)]"
	touch $@

setup: $(VENV)/.installed

run: setup
	$(PY) -m jaxspec generate

test: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal
