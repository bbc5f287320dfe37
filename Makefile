# The README's two commands: `make serve` and `make test`. Both set everything up on a fresh machine.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PORT    ?= 8080
PYTEST_ARGS ?= --durations=20
export NUMBA_CACHE_DIR ?= $(HOME)/.cache/llamba/numba

.PHONY: serve test test-all models reference browser bytecode bench cuda-check lint format clean cluster-demo \
	llama-server-tests llama-server

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

models: $(STAMP)
	$(BIN)/llamba-models fetch

# llama.cpp's chat templates and grammars (the llama-cpp-python sdist, sha256-checked) for the tests.
reference: $(STAMP)
	$(BIN)/python -m engine.reference_data

# The default model's kernels compiled for this CPU's level before the server starts (cli/compile.py):
# a fresh install pays the JIT here (~45 s on two cores), not on its first request; warm, this only loads.
serve: models
	$(BIN)/llamba-compile
	$(BIN)/llamba-server --port $(PORT)

# Headless Chromium for the web UI tests: Debian's package (Playwright never downloads a browser). Best effort
# on a workstation: where it cannot be installed, those tests skip and say why, the rest of the suite runs.
# Under CI=true a missing browser is an error here (and those tests fail, never skip).
CHROMIUM := /usr/bin/chromium
browser:
	@if [ ! -x $(CHROMIUM) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's chromium for the web UI tests"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
	      || { echo "apt-get could not install chromium"; [ "$$CI" != true ] || exit 1; \
	           echo "note: the web UI browser tests will skip"; }; \
	  else \
	    echo "$(CHROMIUM) is missing (as root: apt-get install chromium)"; [ "$$CI" != true ] || exit 1; \
	    echo "note: the web UI browser tests will skip"; \
	  fi; \
	fi

# Scale-out on Ray, locally (docs/scale-out.md): `--cluster ray:local` starts a local Ray head inside the
# router process (stopped with it: no `ray stop` that would end other users' Ray processes), two SmolLM2
# replicas of one thread each as Ray actors, and the router in front of them.
cluster-demo: models
	@echo "Llamba on Ray: http://127.0.0.1:$(PORT)  (GET /models lists the replicas; Ctrl-C stops it all)"
	$(BIN)/llamba-server --cluster ray:local --replicas 2 -m smollm2 -t 1 --port $(PORT)

# Llamba's own bytecode, written once (cli/compile.py): under PYTHONDONTWRITEBYTECODE every server the
# suite starts compiled ~250 modules again (~0.7 s a start on two cores).
bytecode: $(STAMP)
	$(BIN)/python -c "from cli.compile import compile_bytecode; compile_bytecode()"

# The CI suite: everything but tests marked slow.
test: models browser bytecode
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

test-all: models browser bytecode
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# llama.cpp's own server tests (tools/server/tests) against this checkout, scored against the real
# llama-server's outcomes: scripts/llama_server_tests/README.md. Not part of `make test` (15-30 minutes).
llama-server-tests: $(STAMP)
	$(BIN)/llamba-models fetch smollm2 gemma3
	scripts/llama_server_tests/run.sh

# llama.cpp's own llama-server (0c1e570, from the reference sdist): what the side-by-side goldens are
# recorded against (scripts/llama_server_fields.py, scripts/llama_server_clients). ~20 minutes on 2 cores.
llama-server: $(STAMP)
	scripts/build_llama_server.sh

bench: models
	$(BIN)/llamba-bench -p 512 -n 128 -t 2
	$(BIN)/llamba-bench -p 512 -n 128 -t 2 -m gemma3
	$(BIN)/llamba-bench-serve --concurrency 1,4,16

# Compile every CUDA kernel for compute capability 9.0 (H100/H200) with NVVM: no GPU needed. The cuda
# extra (numba-cuda with the CUDA 13 toolkit wheels, ~0.5 GB) is installed here only, not by `make test`.
CUDA_STAMP := $(VENV)/.cuda-installed
$(CUDA_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,cuda]'
	touch $(CUDA_STAMP)

cuda-check: $(CUDA_STAMP)
	$(BIN)/python -m cli.cuda_check --cc 9.0

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
