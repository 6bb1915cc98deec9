#!/usr/bin/env bash
# Create (or reuse) .venv with everything in requirements.txt and attnlab itself, editable.
# VENV=path overrides the location. Sourced by book.sh and test.sh.
set -euo pipefail
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# ATTNLAB_TORCH=cpu: on a machine without a GPU, torch's CPU-only build from PyTorch's own index
# (PyPI's Linux wheel is the CUDA build, with several GB of CUDA libraries). Installed first, the
# pin in requirements.txt (==2.13.0 matches 2.13.0+cpu) then leaves it in place.
if [ "${ATTNLAB_TORCH:-}" = cpu ] && ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q "$(grep -E '^torch==' requirements.txt)" \
    --index-url https://download.pytorch.org/whl/cpu
fi
"$VENV/bin/python" -m pip install -q -r requirements.txt
"$VENV/bin/python" -m pip install -q --no-deps -e .
export PATH="$PWD/$VENV/bin:$PATH"
# The CPU executor compiles the kernels with the host C++ compiler (the one nvcc needs too).
if ! command -v "${CXX:-g++}" >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq g++ >/dev/null
  else
    echo "g++ is missing: the CPU executor needs it (Debian/Ubuntu: apt-get install g++), or set CXX" >&2
  fi
fi
