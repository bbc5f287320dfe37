#!/usr/bin/env bash
# usage: prep.sh [DIR]
# Lay out llama.cpp's own server test suite (tools/server/tests + models/templates) next to this script,
# taken from the llama-cpp-python 0.3.36 sdist on PyPI (it vendors llama.cpp 0c1e570). Data for testing
# only: nothing here is built, and none of it goes into a commit (it is git-ignored).
set -eu
here=${1:-$(cd "$(dirname "$0")" && pwd)}   # where to lay it out (default: next to this script)
mkdir -p "$here"
[ -d "$here/llama.cpp/tools/server/tests" ] && exit 0
tmp=$(mktemp -d)
pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$tmp" >/dev/null
tar -xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp" \
  llama_cpp_python-0.3.36/vendor/llama.cpp/tools/server/tests llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates
mkdir -p "$here/llama.cpp"
mv "$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp/tools "$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp/models "$here/llama.cpp/"
rm -rf "$tmp"
echo "peer suite laid out in $here/llama.cpp"
