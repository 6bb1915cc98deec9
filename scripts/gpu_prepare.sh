#!/usr/bin/env bash
# Everything a GPU session needs that its machine lacks, made here (network and nvcc, no GPU):
#   .whl/            the Python wheels the stages import and the GPU image does not hold
#   .attnlab-cache/  prebuilt-sm_90.tar.xz: every registered kernel's sm_90 cubin and the ptxas
#                    reports chapter 8's page reads, built by the environment's nvcc
#                    (requirements.txt) and packed with xz (attnlab.session.carry); a GPU image whose nvcc
#                    is the same build finds them under its keys, and each stage builds there what
#                    it needs and does not find (attnlab.session.prebuild)
# Both are ignored by git and carried to the GPU machine with the working tree. The whole is held
# to attnlab.session.carry's budget (60 MiB of the 64 MiB the machine accepts): this script fails above it,
# and so does tests/test_carry.py, from the registry and the search space alone.
# Run from the repository (after scripts/setup_env.sh).
#   bash scripts/gpu_prepare.sh [ARCH]        # ARCH: sm_90 (H100, H200) by default
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${1:-sm_90}
# A record of uncommitted changes is never shown (attnlab.records.provenance): GPU minutes spent on one are
# lost. A rehearsal makes no record and may run on a dirty tree (ATTNLAB_ALLOW_DIRTY=1).
if [ -n "$(git status --porcelain -- kernels src)" ] && [ "${ATTNLAB_ALLOW_DIRTY:-0}" != 1 ]; then
  echo "kernels/ or src/ has uncommitted changes: commit them first, or no record of this session can be shown" >&2
  exit 1
fi
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
# The GPU machine's driver loads cubins of its own CUDA release (a newer nvcc's may not load).
read -r nvcc_release host_release < <(PYTHONPATH=$PWD/src "$PY" -c \
  'from attnlab.kernels import toolchain; print(toolchain.nvcc_release(), toolchain.GPU_HOST_CUDA)')
[ "$nvcc_release" = "$host_release" ] || { echo "nvcc here is release $nvcc_release; the GPU machine takes $host_release" >&2; exit 1; }
PYTHON=$PY bash scripts/fetch_device_wheels.sh   # its checker reads wheels with `packaging`
# Built in attnlab's own cache (kept between runs), then exactly what the session reads is packed
# into a fresh .attnlab-cache: no stale build travels.
rm -rf .attnlab-cache
PYTHONPATH=$PWD/src "$PY" -m attnlab prebuild --arch "$ARCH" --into .attnlab-cache
# The commit the carried tree is at, for records made in a copy that has no .git.
# ATTNLAB_GIT_TREE (kernels/ and src/ hashed) marks the copy dirty if either changes after this;
# ATTNLAB_GIT_TIME (the commit's time) lets the copy refuse a record dated before its commit.
{ echo "ATTNLAB_GIT_COMMIT=$(git rev-parse HEAD)"
  echo "ATTNLAB_GIT_TIME=$(git show -s --format=%ct HEAD)"
  echo "ATTNLAB_GIT_DIRTY=$([ -z "$(git status --porcelain -- kernels src)" ] && echo 0 || echo 1)"
  echo "ATTNLAB_GIT_TREE=$(PYTHONPATH=$PWD/src "$PY" -c 'from attnlab.records.provenance import tree_digest; print(tree_digest())')"
} > .attnlab-cache/git.env
PYTHONPATH=$PWD/src "$PY" -m attnlab.session.carry --arch "$ARCH"   # the bound and the real carry, within budget
echo 'carry: [".whl", ".attnlab-cache"]'
