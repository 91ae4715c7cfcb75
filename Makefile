# `make demo` and `make test` both create .venv if missing and (re)install the package
# only when pyproject.toml changed since the last install.
# The first interpreter that actually runs and is 3.10-3.12 (pyenv shims may exist but fail).
PYTHON ?= $(shell for p in python3.12 python3.11 python3.10 python3; do \
	$$p -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 12))' 2>/dev/null \
	&& { echo $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The parity tests' reference (the [reference] extra: torch, transformers) on PyTorch's CPU build.
# An exact pin: where pip.conf's find-links offers the local torch-2.13.0+cpu wheel, pip takes it
# (2.13.0+cpu sorts above PyPI's 2.13.0); a plain `torch` would pull a CUDA build of several GB.
# Elsewhere pip takes PyPI's 2.13.0 (a CUDA build on Linux x86_64), or, with
# `make install TORCH_INDEX=https://download.pytorch.org/whl/cpu`, the CPU build.
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install demo test lint bench

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "error: Python 3.10-3.12 is needed" >&2; exit 2; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,reference]' '$(TORCH)' \
		$(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python scripts/quickstart.py

# The package's bytecode, written once: the test run's 30-odd Python processes (scripts, workers,
# server replicas) then skip compiling it, also where PYTHONDONTWRITEBYTECODE is set.
BYTECODE := nlp vision tfx_transformer scripts

test: $(STAMP)
	$(BIN)/python -m compileall -q $(BYTECODE) >/dev/null
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .

# Every case of the suite at its standard size: JSON in benchmarks/results, the README's tables.
bench: $(STAMP)
	$(BIN)/python benchmarks/harness.py
