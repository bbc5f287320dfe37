#!/usr/bin/env bash
# Run llama.cpp's server test suite (tools/server/tests, non-slow tests) against
# SERVER_BIN, offline, with local models, and score it against the baseline
# recorded with the real llama-server (baseline.json).
#
# usage: run_suite.sh SERVER_BIN [JUNIT_OUT] [extra pytest args...]
#
#   SERVER_BIN  executable that accepts llama-server's CLI flags
#   JUNIT_OUT   junit xml path (must end in .xml); the per-test outcomes are written next to it
#               (<JUNIT_OUT minus .xml>.outcomes.json / .outcomes.jsonl / .score.json / .log)
#               default: runs/<timestamp>/junit.xml next to this script
#
# environment knobs:
#   PEER_RUN_ALL=1        run every non-slow test, not only the baseline-passing ones
#                         (the score still counts only baseline-passing tests)
#   PEER_MAKE_BASELINE=1  run every non-slow test and (re)write baseline.json from the result
#   PEER_IDS_FILE=FILE    run only the test node ids listed in FILE (one per line)
#   PEER_TESTS_DIR        the laid-out tools/server/tests (default llama.cpp/... next to this script)
#   PEER_PYTHON           python with pytest & deps   (default python3)
#   PORT                  server port                 (default 18200; use distinct ports for concurrent runs)
#   PEER_LLAMA_CACHE      fake HF cache dir           (default hf_cache/ next to this script)
#   PEER_TEST_TIMEOUT     per-test timeout, seconds   (default 300)
#   PEER_START_TIMEOUT    server start (/health) deadline, seconds (default 60)
#   PEER_SUITE_TIMEOUT    whole-run timeout, seconds  (default 14400)
#
# The last line printed is:
#   peer-suite: P passed of B baseline-passing tests (F failed, S skipped)
# (F includes errors and tests that did not run, e.g. after a whole-run timeout)

set -u

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
TESTS_DIR="${PEER_TESTS_DIR:-$SCRIPT_DIR/llama.cpp/tools/server/tests}"
BASELINE="$SCRIPT_DIR/baseline.json"
PY="${PEER_PYTHON:-python3}"

if [ $# -lt 1 ]; then
    sed -n '2,/^$/p' "$0"
    exit 2
fi

SERVER_BIN="$1"; shift
if [[ "$SERVER_BIN" == */* ]]; then
    SERVER_BIN="$(realpath -ms -- "$SERVER_BIN")"   # absolute, symlinks kept (argv[0] may matter)
else
    SERVER_BIN="$(command -v -- "$SERVER_BIN" || echo "$SERVER_BIN")"
fi
if [ ! -x "$SERVER_BIN" ]; then
    echo "warning: SERVER_BIN '$SERVER_BIN' is not an executable file; every test will fail" >&2
fi

if [ $# -ge 1 ] && [[ "$1" == *.xml ]]; then
    JUNIT_OUT="$(realpath -ms -- "$1")"; shift
else
    JUNIT_OUT="$SCRIPT_DIR/runs/$(date +%Y%m%d-%H%M%S)/junit.xml"
fi
mkdir -p "$(dirname "$JUNIT_OUT")"
STEM="${JUNIT_OUT%.xml}"
OUT_JSON="$STEM.outcomes.json"
OUT_JSONL="$STEM.outcomes.jsonl"
SCORE_JSON="$STEM.score.json"
LOG="$STEM.log"
SELECT_FILE="$STEM.selected.txt"
rm -f "$OUT_JSON" "$OUT_JSONL" "$SCORE_JSON"

MODE="subset"
if [ "${PEER_MAKE_BASELINE:-0}" = "1" ] || [ "${PEER_RUN_ALL:-0}" = "1" ]; then
    MODE="all"
elif [ -n "${PEER_IDS_FILE:-}" ]; then
    MODE="ids"
fi
if [ "$MODE" = "subset" ] && [ ! -f "$BASELINE" ]; then
    echo "no $BASELINE yet: running all non-slow tests" >&2
    MODE="all"
fi

export LLAMA_SERVER_BIN_PATH="$SERVER_BIN"
export PORT="${PORT:-18200}"
export PEER_LLAMA_CACHE="${PEER_LLAMA_CACHE:-$SCRIPT_DIR/hf_cache}"   # fake HF cache (the plugin sets LLAMA_CACHE to it)
export PYTHONPATH="$SCRIPT_DIR${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export PEER_OUTCOMES_JSON="$OUT_JSON"
export PEER_OUTCOMES_JSONL="$OUT_JSONL"
unset PEER_SELECT_FILE SLOW_TESTS DEBUG_EXTERNAL
if [ "$MODE" = "subset" ]; then
    "$PY" "$SCRIPT_DIR/peer_score.py" select "$BASELINE" "$SELECT_FILE" || exit 3
    export PEER_SELECT_FILE="$SELECT_FILE"
elif [ "$MODE" = "ids" ]; then
    cp -- "$PEER_IDS_FILE" "$SELECT_FILE" || exit 3
    export PEER_SELECT_FILE="$SELECT_FILE"
fi

echo "run_suite: server=$SERVER_BIN mode=$MODE port=$PORT log=$LOG" >&2

PGID=""
cleanup() {
    # stop only what this run started: the pytest session group (pytest + its servers)
    if [ -n "$PGID" ]; then
        kill -TERM -- "-$PGID" 2>/dev/null
        sleep 1
        kill -KILL -- "-$PGID" 2>/dev/null
    fi
}
trap 'cleanup; exit 130' INT TERM

cd "$TESTS_DIR" || exit 3
# own session/process group, so every server the run leaves behind can be reaped by group id
setsid -w timeout -k 30 "${PEER_SUITE_TIMEOUT:-14400}" \
    "$PY" -m pytest \
        -p peer_suite_plugin -p no:xdist -p no:cacheprovider \
        -m "not slow" \
        --timeout="${PEER_TEST_TIMEOUT:-300}" --timeout-method=signal \
        -o junit_family=xunit1 --junitxml="$JUNIT_OUT" \
        -q -rfE --no-header -p no:randomly \
        "$@" >"$LOG" 2>&1 &
PGID=$!
wait "$PGID"
RC=$?
cleanup
PGID=""

grep -E "^(FAILED|ERROR) |passed|failed" "$LOG" | tail -3 >&2

if [ "${PEER_MAKE_BASELINE:-0}" = "1" ]; then
    [ -f "$BASELINE" ] && cp -- "$BASELINE" "$BASELINE.bak.$(date +%Y%m%d-%H%M%S)"
    "$PY" "$SCRIPT_DIR/peer_score.py" baseline "$OUT_JSON" "$OUT_JSONL" "$BASELINE" "$SERVER_BIN" >&2
fi

echo "pytest exit code: $RC; outcomes: $OUT_JSON (junit: $JUNIT_OUT)" >&2
"$PY" "$SCRIPT_DIR/peer_score.py" score "$BASELINE" "$OUT_JSON" "$OUT_JSONL" "$SCORE_JSON"
