# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Each creates the virtualenv and installs the pinned dependencies on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench serve clean

$(BIN)/.installed: pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Ballast needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $@

demo: $(BIN)/.installed
	$(BIN)/ballast demo

test: $(BIN)/.installed
	scripts/test.sh

lint: $(BIN)/.installed
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

bench: $(BIN)/.installed
	$(BIN)/python bench/run.py --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .agent-clis
