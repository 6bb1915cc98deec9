#!/usr/bin/env bash
# Download into .whl/ (ignored) the wheels the GPU machine ("the device") needs to execute the
# book's notebooks: the Jupyter kernel stack, papermill, nbval, jupytext and myst-nb, pinned in
# scripts/device_wheels.txt, for its CPython 3.12 on x86-64 manylinux. The device has no network;
# the wheels travel with the working tree (carry .whl; attnlab.session.carry holds the whole carry to 60 MiB).
#
#   bash scripts/fetch_device_wheels.sh        # from any directory; needs the package index
#
# On the device, from the repository root (as scripts/gpu_session.sh does), install them into a
# folder of their own and put it first on the path; nothing else is needed. No kernelspec to
# install and no JUPYTER_PATH: the notebooks' kernel "python3" resolves, because ipykernel is
# importable, to [sys.executable, -m, ipykernel_launcher, -f, {connection_file}], and the kernel
# inherits PYTHONPATH. These commands worked (CPython 3.12.1, x86-64, glibc 2.36, a venv holding
# only packages of the device's image, HOME an empty folder, no Jupyter variables set):
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl                      # 55 wheels, about 5 s
#   export PYTHONPATH=/tmp/site:$PWD/src
#   python3 -c "import papermill, nbclient, nbformat, ipykernel, nbval, jupytext, myst_nb; from myst_nb import glue"
#   python3 -m papermill --no-progress-bar --cwd book book/intro.ipynb /tmp/intro.out.ipynb
#   python3 -m pytest -q -p no:cacheprovider --nbval --nbval-current-env \
#       --nbval-sanitize-with book/nbval_sanitize.cfg book/intro.ipynb
#   python3 scripts/check_device_wheels.py --device-freeze <(python3 -m pip list --format=freeze)
#
# (the last one checks the device's own versions against what the wheels require). debugpy
# 1.8.22 exists only as manylinux_2_34: the device needs glibc >= 2.34, else pip refuses the whole
# install ("not a supported wheel on this platform").
#
# Idempotent: a wheel already in .whl/ is not fetched again, and when every pin has its wheel the
# index is not asked at all. A wheel of a pinned name at another version is removed (two versions
# of one name stop the whole install). At the end scripts/check_device_wheels.py checks that the set
# is closed (every requirement is a wheel here or a package of the device's image); the total size
# is printed, and more than attnlab.session.carry.WHEELS_MAX_MIB fails.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LIST=$ROOT/scripts/device_wheels.txt
DEST=$ROOT/.whl
PYTHON=${PYTHON:-python3}  # with pip, and `packaging` for the checker (the project's .venv has both)
# The most the wheels may weigh: attnlab.session.carry counts them at this in the carry's bound (read from
# its source: this script needs no more than pip and `packaging`).
MAX_MIB=$(sed -n 's/^WHEELS_MAX_MIB *= *\([0-9][0-9]*\).*/\1/p' "$ROOT/src/attnlab/session/carry.py")
[ -n "$MAX_MIB" ] || { echo "no WHEELS_MAX_MIB in src/attnlab/session/carry.py" >&2; exit 1; }

mkdir -p "$DEST"

# Every pin as "normalized-name version", and what is missing from .whl/.
pins=$(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$LIST" | grep -v '^$' |
       awk -F'==' '{n=tolower($1); gsub(/[-_.]+/, "-", n); print n, $2}')
[ -n "$pins" ] || { echo "no pins in $LIST" >&2; exit 1; }

missing=()
shopt -s nullglob
for whl in "$DEST"/*.whl; do
  base=$(basename "$whl")
  name=$(echo "${base%%-*}" | tr 'A-Z' 'a-z' | sed -E 's/[-_.]+/-/g')
  version=$(echo "$base" | cut -d- -f2)
  pinned=$(echo "$pins" | awk -v n="$name" '$1 == n {print $2}')
  if [ -n "$pinned" ] && [ "$pinned" != "$version" ]; then
    echo "removing $base: $name is pinned at $pinned"
    rm -f -- "$whl"
  fi
done
while read -r name version; do
  found=""
  for whl in "$DEST"/*.whl; do
    base=$(basename "$whl")
    wname=$(echo "${base%%-*}" | tr 'A-Z' 'a-z' | sed -E 's/[-_.]+/-/g')
    [ "$wname" = "$name" ] && [ "$(echo "$base" | cut -d- -f2)" = "$version" ] && { found=1; break; }
  done
  [ -n "$found" ] || missing+=("$name==$version")
done <<< "$pins"

if [ ${#missing[@]} -eq 0 ]; then
  echo "all $(echo "$pins" | wc -l) pinned wheels already in .whl/: nothing to download"
else
  echo "downloading ${#missing[@]} wheel(s): ${missing[*]}"
  platforms=()
  for tag in manylinux1 manylinux2010 manylinux2014 manylinux_2_5 manylinux_2_12 manylinux_2_17 \
             manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34; do
    platforms+=(--platform "${tag}_x86_64")
  done
  "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 "${platforms[@]}" -d "$DEST" "${missing[@]}"
fi

total=$(cat "$DEST"/*.whl | wc -c)
count=$(ls "$DEST"/*.whl | wc -l)
awk -v t="$total" -v c="$count" 'BEGIN {printf "%d wheels in .whl/, %.1f MiB in all\n", c, t / 1048576}'
"$PYTHON" "$ROOT/scripts/check_device_wheels.py" --wheels "$DEST" --list "$LIST"
if [ "$total" -gt $((MAX_MIB * 1024 * 1024)) ]; then
  echo "FAIL: .whl/ holds more than $MAX_MIB MiB, the wheels' share of the carry (attnlab.session.carry)" >&2
  exit 1
fi
