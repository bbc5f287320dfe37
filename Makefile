# The README's two commands: `make serve` and `make test`. Both set everything up on a fresh machine.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PORT    ?= 8080
PYTEST_ARGS ?=
export NUMBA_CACHE_DIR ?= $(HOME)/.cache/llamba/numba

.PHONY: serve test test-all models bench lint format clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

models: $(STAMP)
	$(BIN)/llamba-models fetch

serve: models
	$(BIN)/llamba-server --port $(PORT)

# The CI suite: everything but tests marked slow.
test: models
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

test-all: models
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: models
	$(BIN)/llamba-bench -p 512 -n 128 -t 2
	$(BIN)/llamba-bench -p 512 -n 128 -t 2 -m gemma3
	$(BIN)/llamba-bench-serve --concurrency 1,4,16

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
