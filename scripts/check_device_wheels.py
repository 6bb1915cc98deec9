#!/usr/bin/env python3
"""Check that the wheels in .whl/ form a closed set for the GPU machine ("the device").

The device runs CPython 3.12.3 on x86-64 Linux with a fixed image (DEVICE_HAS below) and no
network; the wheels are installed there with `pip install --no-index --no-deps --target`, so pip
checks nothing and a missing or doubled package shows only when a notebook runs. This reads each
wheel's METADATA (with `packaging`, which pip's own reading of versions and markers follows,
and which the project's .venv and the device both hold) and reports, exiting 1 on any:

- a requirement (Requires-Dist, its marker evaluated for CPython 3.12 on x86-64 Linux, extras
  followed where a requirement names them) that is neither among the wheels nor in DEVICE_HAS;
- a wheel whose version does not meet a requirement on it;
- two wheels of one name (pip stops the whole install on that);
- a wheel that is not for CPython 3.12 on x86-64 manylinux, or whose Requires-Python excludes 3.12;
- with the pin list (scripts/device_wheels.txt, the default): a pin without its wheel, or a wheel
  that is not pinned.

The device's packages are known by name only. Given `--device-freeze FILE` (the device's
`python3 -m pip list --format=freeze`), their versions are checked as well, and what the device
has is read from that file instead of DEVICE_HAS.

    python3 scripts/check_device_wheels.py [--wheels DIR] [--list FILE | --no-list]
                                           [--device-freeze FILE] [-v]
"""
from __future__ import annotations

import argparse
import re
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[1]

# The device's image ('cuda' kind, as read on 2026-11-17): names only, normalized below.
DEVICE_HAS_NAMES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp
"""

# The device's interpreter, for markers (PEP 508 environment).
MARKER_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "platform_python_implementation": "CPython",
    "os_name": "posix",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "platform_release": "",
    "platform_version": "",
}
PY_TAGS = {"py3", "py312", "cp312", "py2.py3", "py3.py2"}
ABI_TAGS = {"none", "abi3", "cp312"}


def normalize(name: str) -> str:
    return canonicalize_name(name)


DEVICE_HAS = {normalize(n) for n in DEVICE_HAS_NAMES.split()}


# --- versions, specifiers, markers and requirements: packaging's (PEP 440, 508), as pip reads them --

def satisfies(version_text: str, spec: str) -> bool:
    """Whether a version meets a specifier such as '>=5.1,!=6.0.*'; pre-releases count (a wheel
    here is what gets installed). A version or specifier that cannot be read is not judged."""
    try:
        return SpecifierSet(spec).contains(Version(version_text), prereleases=True)
    except (InvalidVersion, InvalidSpecifier):
        return True


def marker_applies(marker: str, extra: str = "") -> bool:
    """Evaluate a marker for the device. 'extra' is the extra being followed ('' for none)."""
    return Marker(marker).evaluate({**MARKER_ENV, "extra": extra})


def parse_requirement(text: str) -> tuple[str, set[str], str, str | None]:
    """'name[extras] (spec) ; marker' -> (normalized name, extras, spec, marker or None)."""
    req = Requirement(text)
    return (normalize(req.name), {normalize(e) for e in req.extras}, str(req.specifier),
            str(req.marker) if req.marker else None)


class Wheel:
    def __init__(self, path: Path):
        self.path = path
        parts = path.name[: -len(".whl")].split("-")
        if len(parts) not in (5, 6):
            raise ValueError(f"{path.name}: not a wheel file name")
        self.name, self.version = normalize(parts[0]), parts[1]
        self.py_tags, self.abi_tags, self.plat_tags = (set(t.split(".")) for t in parts[-3:])
        with zipfile.ZipFile(path) as z:
            metas = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            if len(metas) != 1:
                raise ValueError(f"{path.name}: {len(metas)} METADATA files")
            meta = Parser().parsestr(z.read(metas[0]).decode("utf-8"), headersonly=True)
        self.meta_name = normalize(meta["Name"])
        self.meta_version = meta["Version"]
        self.requires_python = (meta.get("Requires-Python") or "").replace(" ", "")
        self.requires = meta.get_all("Requires-Dist") or []

    def tag_problems(self) -> list[str]:
        problems = []
        py_ok = bool(self.py_tags & PY_TAGS)
        abi3_ok = "abi3" in self.abi_tags and any(
            re.fullmatch(r"cp3(\d+)", t) and int(t[3:]) <= 12 for t in self.py_tags)
        if not (py_ok or abi3_ok) or not (self.abi_tags & ABI_TAGS):
            problems.append(f"{self.path.name}: not for CPython 3.12 (tags {'.'.join(sorted(self.py_tags))}-"
                            f"{'.'.join(sorted(self.abi_tags))})")
        if not any(p == "any" or re.fullmatch(r"(manylinux\d*|manylinux_\d+_\d+|linux)_x86_64", p)
                   for p in self.plat_tags):
            problems.append(f"{self.path.name}: not for x86-64 Linux ({'.'.join(sorted(self.plat_tags))})")
        if self.requires_python and not satisfies(MARKER_ENV["python_full_version"], self.requires_python):
            problems.append(f"{self.path.name}: Requires-Python {self.requires_python} excludes 3.12.3")
        if self.meta_name != self.name or Version(self.meta_version) != Version(self.version):
            problems.append(f"{self.path.name}: METADATA says {self.meta_name} {self.meta_version}")
        return problems


def read_pins(path: Path) -> tuple[dict[str, str], list[str]]:
    pins, problems = {}, []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*(\S+)", line)
        if not m:
            problems.append(f"{path.name}:{n}: not 'name==version': {line!r}")
            continue
        name = normalize(m[1])
        if name in pins:
            problems.append(f"{path.name}:{n}: {name} pinned twice")
        pins[name] = m[2]
    return pins, problems


def read_freeze(path: Path) -> dict[str, str]:
    has = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*(\S+)|\s+(\S+)\s*$|@)", line)
        if m:
            has[normalize(m[1])] = m[2] or m[3] or ""
    return has


def check(wheel_dir: Path, pin_file: Path | None, freeze: Path | None, verbose: bool) -> list[str]:
    problems: list[str] = []
    wheels: dict[str, Wheel] = {}
    for path in sorted(wheel_dir.glob("*.whl")):
        try:
            w = Wheel(path)
        except (ValueError, zipfile.BadZipFile, KeyError) as exc:
            problems.append(f"{path.name}: unreadable: {exc}")
            continue
        problems += w.tag_problems()
        if w.name in wheels:
            problems.append(f"two versions of {w.name}: {wheels[w.name].path.name} and {path.name}")
            continue
        wheels[w.name] = w
    if not wheels:
        return problems + [f"no wheels in {wheel_dir}"]

    device = read_freeze(freeze) if freeze else {n: "" for n in DEVICE_HAS}

    if pin_file:
        pins, pin_problems = read_pins(pin_file)
        problems += pin_problems
        for name, version in pins.items():
            if name not in wheels:
                problems.append(f"{name}=={version} is pinned but has no wheel in {wheel_dir.name}/")
            elif Version(wheels[name].version) != Version(version):
                problems.append(f"{name}: pinned {version}, wheel is {wheels[name].path.name}")
        for name, w in wheels.items():
            if name not in pins:
                problems.append(f"{w.path.name} is not pinned in {pin_file.name}")

    # Follow every requirement that applies on the device, with the extras that requirements name.
    todo = [(name, "") for name in wheels]
    done = set()
    while todo:
        name, extra = todo.pop()
        if (name, extra) in done:
            continue
        done.add((name, extra))
        w = wheels[name]
        for text in w.requires:
            try:
                req, extras, spec, marker = parse_requirement(text)
                if not extra:
                    applies = marker is None or marker_applies(marker)
                else:  # only what the extra adds to the base requirements, already checked
                    applies = (marker is not None and marker_applies(marker, extra)
                               and not marker_applies(marker))
            except ValueError as exc:
                problems.append(f"{w.path.name}: {exc}; assumed to apply")
                req, extras, spec, applies = normalize(re.split(r"[\s\[(<>=!~;@]", text.strip())[0]), set(), "", True
            if not applies:
                continue
            why = f"{w.name} {w.version}{f'[{extra}]' if extra else ''} requires {text.split(';')[0].strip()}"
            if req in wheels:
                if spec and not satisfies(wheels[req].version, spec):
                    problems.append(f"{why}, but the wheel is {wheels[req].version}")
                todo += [(req, e) for e in extras]
                if verbose:
                    print(f"  ok  {why} (wheel {wheels[req].version})")
            elif req in device:
                have = device[req]
                if have and spec and not satisfies(have, spec):
                    problems.append(f"{why}, but the device has {have}")
                if extras:
                    print(f"NOTE: {why}: the device package's extras {sorted(extras)} are not checked")
                if verbose:
                    print(f"  ok  {why} (device{' ' + have if have else ''})")
            else:
                problems.append(f"{why}: neither a wheel here nor on the device")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wheels", type=Path, default=ROOT / ".whl", help="folder of wheels (default: .whl/)")
    p.add_argument("--list", type=Path, default=ROOT / "scripts" / "device_wheels.txt",
                   help="pin list to compare with (default: scripts/device_wheels.txt)")
    p.add_argument("--no-list", action="store_true", help="check the wheels' closure only")
    p.add_argument("--device-freeze", type=Path, help="the device's `pip list --format=freeze`")
    p.add_argument("-v", "--verbose", action="store_true", help="print every requirement met")
    args = p.parse_args(argv)
    problems = check(args.wheels, None if args.no_list else args.list, args.device_freeze, args.verbose)
    n = len(list(args.wheels.glob("*.whl")))
    for problem in problems:
        print(f"PROBLEM: {problem}")
    if problems:
        print(f"{len(problems)} problem(s) in {n} wheels under {args.wheels}")
        return 1
    print(f"OK: {n} wheels under {args.wheels}: one version each, every requirement met "
          f"by a wheel or the device")
    return 0


if __name__ == "__main__":
    sys.exit(main())
