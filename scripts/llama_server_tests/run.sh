#!/usr/bin/env bash
# `make llama-server-tests`: llama.cpp's own server tests against this checkout's llamba-server, offline, with
# the local models, scored against the real llama-server's outcomes (baseline.json). Not part of `make test`:
# a whole run takes 15-30 minutes on 2 cores.
#
# usage: run.sh [pytest args...]        (PEER_IDS_FILE=FILE runs only the node ids listed in FILE)
# Everything it writes goes under $LLAMBA_LLAMA_SERVER_TESTS (default ~/.cache/llamba/llama-server-tests):
# the laid-out tests, their virtual environment, the fake HF cache and runs/<timestamp>/ with every test's outcome.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
work=${LLAMBA_LLAMA_SERVER_TESTS:-$HOME/.cache/llamba/llama-server-tests}
models=$("$repo/.venv/bin/llamba-models" path)

"$here/prep.sh" "$work"
if [ ! -x "$work/venv/bin/python" ] || [ "$here/run.sh" -nt "$work/venv/.installed" ]; then
    python3 -m venv "$work/venv"
    "$work/venv/bin/pip" install -q pytest-timeout anthropic jsonschema \
        -r "$work/llama.cpp/tools/server/tests/requirements.txt"
    touch "$work/venv/.installed"
fi
export PEER_PYTHON="$work/venv/bin/python"
export PEER_TESTS_DIR="$work/llama.cpp/tools/server/tests"
export PEER_LLAMA_CACHE="$work/hf_cache"
export PEER_MODEL_DIR="$models"
export PEER_MODEL_SMOL="$models/SmolLM2-135M-Instruct.Q4_1.gguf"
export PEER_MODEL_GEMMA="$models/gemma-3-270m-q4_k_m.gguf"
export PEER_START_TIMEOUT="${PEER_START_TIMEOUT:-300}"
export PYTHONPATH="$repo"   # the checkout's server, whatever is installed in .venv
exec "$here/run_suite.sh" "$repo/.venv/bin/llamba-server" "$work/runs/$(date +%Y%m%d-%H%M%S)/junit.xml" "$@"
