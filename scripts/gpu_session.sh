#!/usr/bin/env bash
# One stage (or several) of a GPU session, on a GPU machine with no network (scripts/README.md).
#
#   bash scripts/gpu_session.sh --list            # the stages, what each does, predicted minutes
#   bash scripts/gpu_session.sh check             # run one stage; its archive lands in $OUT
#   bash scripts/gpu_session.sh check bench       # or several, one after the other
#   bash scripts/gpu_session.sh check+sanitize    # or side by side (stages that time nothing)
#
# Before the first call, on a machine with the package index and nvcc:
#   bash scripts/gpu_prepare.sh                   # wheels into .whl/, prebuilt-sm_90.tar.xz into .attnlab-cache/
# and carry .whl and .attnlab-cache with the working tree. Each stage's first step unpacks the
# archive into the cache and builds there what the stage needs and does not find. What the machine
# lacks (the Jupyter stack, papermill, nbval, myst-nb) is installed from .whl/ into /tmp/site, once
# per machine.
# Each stage runs every kernel in its own process under a timeout, goes on past any failure, and
# ends with a table of its failures; records, logs and executed notebooks come back in
# $OUT/<stage>.tar.gz (python -m attnlab import-evidence brings them into a checkout).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 ATTNLAB_ROOT=$PWD
export ATTNLAB_CACHE=${ATTNLAB_CACHE:-$PWD/.attnlab-cache}
# The GPU image has a CUDA toolkit and none of the CUDA wheels: its nvcc is asked for by name.
export ATTNLAB_NVCC=${ATTNLAB_NVCC:-system}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
if [ "${1:-}" = "--list" ] || [ $# -eq 0 ]; then
  exec "$PY" -m attnlab.session.stages --list
fi
# Stages side by side (check+sanitize) must time nothing: a timing wants the GPU to itself.
for stage in "$@"; do
  if [[ $stage == *+* ]]; then
    IFS=+ read -ra parts <<< "$stage"
    for part in "${parts[@]}"; do
      case $part in bench|extras) echo "$part times kernels: run it alone, not in $stage" >&2; exit 2 ;; esac
    done
  fi
done
# A copy whose git lacks the stamped commit (no .git, or the repository as last landed, behind the
# commits made since): the commit stamped by gpu_prepare.sh names what the records measured
# (attnlab.records.provenance).
if [ -f .attnlab-cache/git.env ]; then
  stamped=$(sed -n 's/^ATTNLAB_GIT_COMMIT=//p' .attnlab-cache/git.env)
  if ! git cat-file -e "${stamped}^{commit}" 2>/dev/null; then
    set -a; . .attnlab-cache/git.env; set +a
  fi
fi
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  SITE=${ATTNLAB_SITE:-/tmp/site}
  stamp=$(ls .whl/*.whl | sha256sum | cut -c1-16)
  if [ "$(cat "$SITE/.attnlab-wheels" 2>/dev/null)" != "$stamp" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
      || { echo "installing .whl/ into $SITE failed" >&2; exit 1; }
    echo "$stamp" > "$SITE/.attnlab-wheels"
  fi
  export PYTHONPATH=$PYTHONPATH:$SITE
fi
run_stage() {
  "$PY" -m attnlab.session.stages "$1" --out "$OUT" ${ATTNLAB_REHEARSE:+--rehearse} \
    ${ATTNLAB_SESSION_DEADLINE:+--deadline "$ATTNLAB_SESSION_DEADLINE"}
}
status=0
for stage in "$@"; do
  if [[ $stage == *+* ]]; then
    # check+sanitize: stages that time nothing run side by side (the GPU has room for both); each
    # one's output is shown whole once all have ended.
    IFS=+ read -ra parts <<< "$stage"
    logs=$(mktemp -d)
    pids=()
    for part in "${parts[@]}"; do
      run_stage "$part" > "$logs/$part.log" 2>&1 &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || status=1; done
    for part in "${parts[@]}"; do cat "$logs/$part.log"; done
  else
    run_stage "$stage" || status=1
  fi
done
exit $status
