#!/usr/bin/env bash
# Rehearse a GPU session on this machine, with no GPU, before any device time is spent on it.
#
#   bash scripts/gpu_rehearse.sh [STAGE...]     # default: every stage of `gpu_session.sh --list`
#
# 1. Builds (once) .rehearse/venv: CPython 3.12 holding only what the GPU image holds of what the
#    stages touch (torch 2.11.0, CuPy 14.2.0, Triton 3.6.0, numpy, matplotlib, tqdm, pytest and the
#    image's packages the carried wheels lean on) and nothing from requirements.txt.
# 2. Makes what would be carried (scripts/gpu_prepare.sh: .whl/ and prebuilt-sm_90.tar.xz).
# 3. Copies the working tree as the device tool does (tracked and untracked-not-ignored files, plus
#    .whl and .attnlab-cache) and runs, in the copy, with the 3.12 venv's python:
#    - the process isolation: a child that hangs and one that dies of a CUDA-like fault are
#      recorded and the stage goes on;
#    - every stage through scripts/gpu_session.sh, each GPU command expected to refuse cleanly,
#      papermill running every notebook in its no-GPU mode;
#    - the archives' layout and size (at most 8 files back per call, 16 MiB each).
# 4. Imports the archives into a second copy with `python -m attnlab import-evidence` (this
#    machine's .venv: the checkout's own tools).
# A missing module, a wrong path or a command line that no longer parses fails here.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${REHEARSE_WORK:-/tmp/attnlab-rehearse}
VENV=$ROOT/.rehearse/venv
DEV_PY=$ROOT/.venv/bin/python
[ -x "$DEV_PY" ] || { echo "no .venv: run 'source scripts/setup_env.sh' first" >&2; exit 1; }

py312=""
for candidate in ${PYTHON312:-} python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
  if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
    py312=$candidate; break
  fi
done
[ -n "$py312" ] || { echo "CPython 3.12 not found (the GPU image's Python): install it, or set PYTHON312" >&2; exit 1; }
image=$(sha256sum scripts/device_image.txt | cut -c1-16)
if [ "$(cat "$VENV/.complete" 2>/dev/null)" != "$image" ]; then  # made anew when the image list changes
  rm -rf "$VENV"
  "$py312" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -r scripts/device_image.txt
  echo "$image" > "$VENV/.complete"
fi
PY=$VENV/bin/python

ATTNLAB_ALLOW_DIRTY=1 bash scripts/gpu_prepare.sh   # a rehearsal makes no record
# The rehearsal's 3.12 venv holds no CUDA wheels, like the image, and this machine may have no
# toolkit: the stages use the nvcc that built the carried cubins (the image's is a system one).
export ATTNLAB_NVCC=${ATTNLAB_NVCC:-$("$DEV_PY" -c 'from attnlab.kernels import toolchain; print(toolchain.nvcc())')}

echo "== a copy of the working tree, as the GPU machine gets it"
rm -rf "$WORK"; mkdir -p "$WORK/tree" "$WORK/out"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$WORK/tree"
cp -r .whl .attnlab-cache "$WORK/tree/"

stages=("$@")
[ ${#stages[@]} -gt 0 ] || mapfile -t stages < <(PYTHONPATH=src "$PY" -c \
  'from attnlab.session.stages import STAGES; print("\n".join(s.name for s in STAGES))')

status=0
cd "$WORK/tree"
echo "== process isolation"
PYTHONPATH=src "$PY" -m attnlab.session.stages --isolation-demo || status=1
echo "== the stages: $(PYTHONPATH=src "$PY" -m attnlab.session.stages --list | grep "^total")"
for stage in "${stages[@]}"; do
  rm -rf "$WORK/out/$stage"; mkdir -p "$WORK/out/$stage"
  # The rehearsal gives each stage more time than the device would: papermill on a CPU runs the
  # pages' CPU-executor checks, and a CPU is slower than the GPU at everything the pages do.
  OUT=$WORK/out/$stage PYTHON=$PY ATTNLAB_REHEARSE=1 ATTNLAB_SESSION_DEADLINE=3600 ATTNLAB_SESSION_TIMEOUT_SCALE=4 \
    ATTNLAB_SITE=$WORK/site bash scripts/gpu_session.sh "$stage" || status=1
  PYTHONPATH=src "$PY" -m attnlab.session.stages --check-out "$WORK/out/$stage" || status=1
done
cd "$ROOT"

echo "== import-evidence into a second copy"
rm -rf "$WORK/import"; mkdir -p "$WORK/import"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$WORK/import"
(cd "$WORK/import" && ATTNLAB_ROOT=$PWD PYTHONPATH=$PWD/src "$DEV_PY" -m attnlab import-evidence --allow-rehearsal \
  "$WORK"/out/*/*.tar.gz) || status=1
echo "== rehearsal $([ $status -eq 0 ] && echo passed || echo FAILED); archives in $WORK/out"
exit $status
