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
