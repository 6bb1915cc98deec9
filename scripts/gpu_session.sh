#!/usr/bin/env bash
# Everything a GPU session must produce, in one run: static builds, the correctness suite,
# compute-sanitizer, timings next to SDPA, Nsight Compute counters, a short search of the
# chapters' knobs (chapter 8), the GPU tests, and every notebook re-executed.
# Records land under results/, executed notebooks under book/; both are packed with the logs
# into $OUT/evidence.tar.gz so they can be committed from the machine that has git.
#
# Usage (repo root, on a machine with a CUDA GPU):   bash scripts/gpu_session.sh [--quick]
# Where Jupyter's kernel stack is missing and there is no network, first put offline wheels in
# .whl/ on a machine with the index; the notebooks also need myst-nb (for glue):
#   EXTRA="myst-nb matplotlib tqdm" shared/gpu-host/prepare-offline-wheels.sh .whl 3.12
set -uo pipefail
quick=""
[ "${1:-}" = "--quick" ] && quick="--quick"
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNLAB_ROOT=$PWD
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
status=0
missing=$(python3 - <<'PY'
import importlib.util
need = ["torch", "cupy", "numpy", "matplotlib", "tqdm", "papermill", "ipykernel", "nbval", "myst_nb"]
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))
PY
)
[ -z "$missing" ] || echo "WARNING: missing Python modules: $missing (the steps that need them will fail)"
step() {  # step NAME CMD...: run, log to $OUT/NAME.log, remember failures, keep going
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - t0)) s"; tail -n 25 "$OUT/$name.log"
  [ $rc -eq 0 ] || status=1
}
step gpu nvidia-smi
step inspect python3 -m attnlab inspect
step check python3 -m attnlab check $quick
step sanitize python3 -m attnlab sanitize
step bench python3 -m attnlab bench $quick
step report python3 -m attnlab report
step profile python3 -m attnlab profile
step search python3 -m attnlab search 07_mma --causal false true --budget 120
step search-5-6 python3 -m attnlab search 05_wmma 06_warp_specialized --budget 60
step tuned python3 -m attnlab tuned
step pytest-gpu python3 -m pytest -q -m gpu tests
if [ -f tools/run_book.py ]; then
  step book python3 tools/run_book.py $([ -z "$quick" ] && echo --full) --save-results
fi
tar czf "$OUT/evidence.tar.gz" results book/*.ipynb "$OUT"/*.log 2>/dev/null
ls -la "$OUT"
exit $status
