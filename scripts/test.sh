#!/usr/bin/env bash
# Install, then run every test: the package's tests (static builds for sm_80/89/90 included),
# the book build with warnings as errors and its browser check, and nbval over the chapters.
# Tests that need a GPU skip, saying so, on a machine without one.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
if ! command -v chromium >/dev/null; then  # the browser check of the built pages (Debian's package)
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium is missing: install Debian's chromium package (or set ATTNLAB_SKIP_BROWSER=1)" >&2
  fi
fi
python -m pytest --nbval --nbval-current-env --nbval-sanitize-with book/nbval_sanitize.cfg tests book
