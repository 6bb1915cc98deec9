#!/usr/bin/env bash
# Create (or reuse) .venv with everything in requirements.txt and attnlab itself, editable.
# VENV=path overrides the location. Sourced by book.sh and test.sh.
set -euo pipefail
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
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
