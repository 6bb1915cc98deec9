#!/usr/bin/env bash
# Install, re-execute every chapter on a GPU (writing fresh records), then build the book into
# _build/html. Without a GPU the committed notebooks and records are rendered as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  python tools/run_book.py --full --save-results
else
  echo "No CUDA GPU: building from the committed notebooks and records (nothing re-executed)."
fi
jupyter-book build . -W -n --keep-going
echo "Book: $PWD/_build/html/index.html"
