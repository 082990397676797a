# The two commands a user types on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast lint clean gpu-suite

install: $(STAMP)

# Reinstall when the dependency set changes. torch/torchvision are a pinned pair (constraints).
$(STAMP): pyproject.toml requirements/constraints.txt
	@echo "installing the pinned set into $(VENV) (about two minutes)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements/constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: install
	PYTHON=$(BIN)/python VIDFORGE=$(BIN)/vidforge bash commands/demo.sh runs/demo

# A worker per core; a file's tests stay on one worker, so module fixtures are built once.
TEST_WORKERS ?= auto
test: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check src tests examples
	$(BIN)/ruff format --check src tests examples

# The GPU suite (bench/gpu/, docs/developer.md "The GPU suite"), no install step: on the GPU machine it runs under
# the image's python3. Here: GPU_SUITE=gather (the device's locked wheels) or GPU_SUITE=--cpu-smoke;
# there: GPU_SUITE="--part headline", then GPU_SUITE="--part rest" (one device command each).
GPU_SUITE ?=
gpu-suite:
	PYTHON=$$(test -x $(BIN)/python && echo $(BIN)/python || echo python3) bash bench/gpu/run.sh $(GPU_SUITE)

clean:
	rm -rf $(VENV) runs build *.egg-info
