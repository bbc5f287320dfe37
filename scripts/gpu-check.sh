#!/usr/bin/env bash
# The CUDA backend on a real GPU, written up as a markdown report.
#
#   scripts/gpu-check.sh [REPORT]   default .bench/gpu-check-<UTC time>.md; also copied into $OUT when set
#
# Steps, each bounded by STEP_TIMEOUT seconds (default 600); a failing step is recorded and the rest run:
#   1. the machine: nvidia-smi, and the devices as `llamba-server --list-devices` sees them
#   2. numba-cuda with the toolkit wheels matching the driver (cu13 from driver 580 on, else cu12), unless
#      the venv has it; the models (`llamba-models fetch` is a no-op when LLAMBA_MODELS_DIR holds them)
#   3. every kernel compiled for the GPU's own compute capability (cli.cuda_check, as make cuda-check)
#   4. the CUDA parity tests on the GPU (tests/test_cuda_*.py with NUMBA_ENABLE_CUDASIM=0)
#   5. the engine's fidelity checks (tests/test_model.py) with every model loaded on the CUDA backend
#   6. llamba-bench --device cuda -p 512 -n 128 --batch-seqs 1,64,256 on SmolLM2 and Gemma 3
# Exit status: the number of failed steps (0 = all passed).
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
BIN=$(dirname "$PY")
STEP_TIMEOUT=${STEP_TIMEOUT:-600}
REPORT=${1:-.bench/gpu-check-$(date -u +%Y%m%dT%H%M%SZ).md}
REPS=${REPS:-3}
export NUMBA_ENABLE_CUDASIM=0
failures=0

mkdir -p "$(dirname "$REPORT")"
{
    echo "# Llamba gpu-check"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
} > "$REPORT"

# run TITLE CMD...: the command and its output as a code block, then its exit status and duration.
run() {
    local title=$1
    shift
    echo "gpu-check: $title" >&2
    printf '\n## %s\n\n```\n$ %s\n' "$title" "$*" >> "$REPORT"
    local start=$SECONDS
    timeout "$STEP_TIMEOUT" "$@" >> "$REPORT" 2>&1
    local rc=$?
    printf '```\n\nexit %s after %s s\n' "$rc" "$((SECONDS - start))" >> "$REPORT"
    if [ "$rc" -ne 0 ]; then
        failures=$((failures + 1))
    fi
    return 0
}

# The fidelity checks as written, but every LLM.load on the CUDA backend (a CPU fallback fails them).
FIDELITY=$(mktemp --suffix=.py)
trap 'rm -f "$FIDELITY"' EXIT
cat > "$FIDELITY" <<'EOF'
import sys

import pytest


class OnCuda:
    def pytest_configure(self, config):
        from engine import llm

        load = llm.LLM.load.__func__

        def load_on_cuda(cls, *args, **kwargs):
            kwargs.setdefault("device", "cuda")
            model = load(cls, *args, **kwargs)
            assert model.backend.name == "CUDA", f"loaded on {model.backend.name}, not CUDA"
            return model

        llm.LLM.load = classmethod(load_on_cuda)


sys.exit(pytest.main(["-p", "no:cacheprovider", "-ra", *sys.argv[1:]], plugins=[OnCuda()]))
EOF

[ -x "$PY" ] || make .venv/.installed

run "GPU" nvidia-smi
run "Devices" "$BIN/llamba-server" --list-devices

if ! "$PY" -c "import numba_cuda" 2>/dev/null; then
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 | cut -d. -f1)
    extra=cu13
    if [ "${driver:-0}" -lt 580 ]; then
        extra=cu12
    fi
    run "Install numba-cuda[$extra]" "$PY" -m pip install -q "numba-cuda[$extra]>=0.30"
fi
run "Models" "$BIN/llamba-models" fetch smollm2 gemma3

cc=$("$PY" -c "from numba import cuda; print('%d.%d' % cuda.get_current_device().compute_capability)" 2>/dev/null)
run "Compile every kernel for compute capability ${cc:-9.0}" "$PY" -m cli.cuda_check --cc "${cc:-9.0}"
run "CUDA parity tests on the GPU" "$PY" -m pytest -p no:cacheprovider -q tests/test_cuda_kernels.py tests/test_cuda_backend.py
run "Fidelity checks with --device cuda" "$PY" "$FIDELITY" -q tests/test_model.py

for model in smollm2 gemma3; do
    run "llamba-bench $model" "$BIN/llamba-bench" -m "$model" --device cuda -p 512 -n 128 \
        --batch-seqs 1,64,256 -r "$REPS" --progress
done

printf '\n## Summary\n\n%s failed step(s)\n' "$failures" >> "$REPORT"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    cp "$REPORT" "$OUT/"
fi
echo "gpu-check: report in $REPORT ($failures failed step(s))" >&2
exit "$failures"
