# The two commands a user types on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast lint clean

install: $(STAMP)

# Reinstall when the dependency set changes. torch/torchvision are a pinned pair (constraints).
$(STAMP): pyproject.toml requirements/constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements/constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: install
	PYTHON=$(BIN)/python VIDFORGE=$(BIN)/vidforge bash commands/demo.sh runs/demo

test: install
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check src tests examples
	$(BIN)/ruff format --check src tests examples

clean:
	rm -rf $(VENV) runs build *.egg-info
