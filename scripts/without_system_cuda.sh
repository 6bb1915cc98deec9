#!/usr/bin/env bash
# Run a command as on a machine with no CUDA toolkit: every PATH directory that holds an nvcc is
# dropped and CUDA_HOME and CUDA_PATH are unset, so only the environment's CUDA wheels can build.
# CI runs the README's test command this way (.ci/run), whatever the CI machine has installed.
#   bash scripts/without_system_cuda.sh bash scripts/test.sh
set -euo pipefail
keep=()
IFS=: read -r -a dirs <<< "$PATH"
for d in "${dirs[@]}"; do
  if [ -n "$d" ] && [ ! -e "$d/nvcc" ]; then keep+=("$d"); fi
done
PATH=$(IFS=:; echo "${keep[*]}")
export PATH
unset CUDA_HOME CUDA_PATH
if found=$(command -v nvcc); then echo "an nvcc is still on PATH: $found" >&2; exit 1; fi
exec "$@"
