#!/usr/bin/env bash
# Real llama-server clients from PyPI, run against a server binary that takes llama-server's command line.
#
# usage: run.sh <server-binary> [model.gguf]
#   <server-binary>  e.g. .venv/bin/llamba-server, or a llama.cpp build's bin/llama-server
#   [model.gguf]     default: SmolLM2-135M-Instruct Q4_1 from ~/.cache/llamba/models
# env:   LLSC_ONLY="stillwarm kvprof"   run only these clients
#        LLSC_HOME (default ~/.cache/llamba/llama-server-clients): venv, sdists, runs/<timestamp>-<binary>/
#        LLSC_PORT (default 18470): first of the ports used (stillwarm's own test always uses 8213)
#
# Prints one line per client (PASS/FAIL counts or what broke); each client's full output is in
# runs/<timestamp>-<binary>/<client>.log. One server runs at a time. Exit status 1 if any client failed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:?usage: run.sh <server-binary> [model.gguf]}
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
model=${2:-$HOME/.cache/llamba/models/SmolLM2-135M-Instruct.Q4_1.gguf}
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")
[ -x "$bin" ] || { echo "not an executable: $bin" >&2; exit 2; }
[ -f "$model" ] || { echo "no model file: $model" >&2; exit 2; }
work=${LLSC_HOME:-$HOME/.cache/llamba/llama-server-clients}
port=${LLSC_PORT:-18470}
clients=${LLSC_ONLY:-"stillwarm langchain-llama-cpp llamastat kvprof hearth-llm"}

# The clients, pinned (the versions this folder's drivers were written against).
PINNED="stillwarm==0.1.1 langchain-llama-cpp==0.1.0 llamastat==0.3.0 kvprof==0.2.0 hearth-llm==0.1.1"

mkdir -p "$work"
venv=$work/venv
if [ ! -x "$venv/bin/python" ] || [ "$here/run.sh" -nt "$venv/.installed" ]; then
    echo "setting up $venv ..." >&2
    python3 -m venv "$venv" || exit 2
    "$venv/bin/pip" install $PINNED pytest >"$work/pip.log" 2>&1 \
        || { tail -20 "$work/pip.log" >&2; exit 2; }
    touch "$venv/.installed"
fi
py=$venv/bin/python
"$py" "$here/fetch_sdists.py" "$work/sdists" >/dev/null || { echo "could not fetch the sdists" >&2; exit 2; }

run=$work/runs/$(date +%Y%m%d-%H%M%S)-$(basename "$bin")
mkdir -p "$run"
echo "server: $bin"
echo "model:  $model"
echo "logs:   $run"

# one start and stop first: a binary's first start can be slow (Llamba compiles and caches its kernels after a
# code change) and stillwarm's tests give each start only 30 s
"$py" "$here/common.py" --bin "$bin" --model "$model" --port "$port" --workdir "$run" | tee "$run/warmup.txt"

status=0
result_line() {  # the driver's last "RESULT:" line, or the last line of its log
    local r
    r=$(grep '^RESULT: ' "$1" | tail -1)
    [ -n "$r" ] || r="RESULT: FAIL (no result) $(tail -1 "$1")"
    echo "${r#RESULT: }"
}

for client in $clients; do
    log=$run/$client.log
    wd=$run/$client
    mkdir -p "$wd"
    case $client in
    stillwarm)
        # its own integration tests: each test starts the binary itself (port 8213, -fa on/off, --cache-ram 0,
        # --slot-save-path), asks, restarts it, restores the KV state from disk
        sdist=$work/sdists/stillwarm-0.1.1
        (cd "$sdist" && STILLWARM_TEST_SERVER_BIN=$bin STILLWARM_TEST_MODEL=$model \
            timeout 1800 "$py" -m pytest -p no:cacheprovider -q -rfE --basetemp="$wd/tmp" \
            tests/test_integration.py) >"$log" 2>&1
        rc=$?
        # a test whose server misses its 30 s start deadline leaves that server running (the test raises before
        # stopping it): stop those, found by the slot-save path under this run's folder
        for pid in $(pgrep -f -- "--slot-save-path $wd/tmp/" || true); do kill "$pid" 2>/dev/null; done
        summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped)|(passed|failed|errors?|skipped).* in [0-9.]+s' "$log" | tail -1 | sed 's/=//g;s/^ *//;s/ *$//')
        failed=$(grep -E '^(FAILED|ERROR) ' "$log" | sed -E 's/^(FAILED|ERROR) tests\/test_integration.py::/ /' | cut -c1-160 | tr '\n' ';')
        if [ $rc -eq 0 ] && ! grep -q skipped <<<"$summary"; then line="PASS ($summary)"
        else line="FAIL ($summary)${failed:+ failed:$failed}"; fi
        ;;
    langchain-llama-cpp|llamastat|kvprof|hearth-llm)
        drv=$here/drive_${client//-/_}.py
        timeout 1800 "$py" "$drv" --bin "$bin" --model "$model" --port "$port" --workdir "$wd" >"$log" 2>&1
        rc=$?
        line=$(result_line "$log")
        ;;
    *) echo "unknown client $client" >&2; rc=2; line="unknown client" ;;
    esac
    [ $rc -eq 0 ] || status=1
    printf '%-22s %s\n' "$client" "$line" | tee -a "$run/summary.txt"
done
exit $status
