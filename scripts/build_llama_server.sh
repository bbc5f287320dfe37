#!/usr/bin/env bash
# Build llama.cpp's own llama-server (0c1e570, from the llama-cpp-python 0.3.36 sdist that `make reference`
# fetches and checks) into the reference folder's llama-server-build/bin/llama-server: the reference the
# side-by-side goldens are recorded against (scripts/llama_server_fields.py, scripts/llama_server_clients).
# About 20 minutes on 2 cores. Run it as `make llama-server`.
# `scripts/build_llama_server.sh portable` builds llama.cpp's libraries for plain x86-64 instead (every
# GGML x86 extension off: SSE2 only) into llama-portable-build/bin, the llama.cpp that Llamba's portable
# level is compared with (scripts/bench_qwen35_speed.py --lib portable=DIR, through llama-cpp-python).
set -euo pipefail
cd "$(dirname "$0")/.."
SDIST="$(.venv/bin/python -c "from engine.reference_data import fetch_sdist; print(fetch_sdist())")"
REF="$(dirname "$SDIST")"
SRC="$REF/llama.cpp-0c1e570"
BUILD="$REF/llama-server-build"
TARGET=llama-server
BUILT="$BUILD/bin/llama-server"
FLAGS=()
if [ "${1:-}" = portable ]; then
  BUILD="$REF/llama-portable-build"
  TARGET=llama
  BUILT="$BUILD/bin"
  FLAGS=(-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF
    -DGGML_SSE42=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_FMA=OFF
    -DGGML_F16C=OFF -DGGML_BMI2=OFF)
fi
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  mkdir -p "$SRC"
  tar -xzf "$SDIST" -C "$SRC" --strip-components=3 llama_cpp_python-0.3.36/vendor/llama.cpp
fi
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "${FLAGS[@]}" >/dev/null
ninja -C "$BUILD" "$TARGET"
echo "$BUILT"
# On a VM that lists AMX without enabling its tiles, run it with LLAMA_ARG_REPACK=0 (--no-repack), and
# with OMP_WAIT_POLICY=PASSIVE on a busy 2-core machine.
