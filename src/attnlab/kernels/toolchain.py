"""The CUDA tools that build and read the kernels: nvcc (with ptxas), cuobjdump and nvdisasm.

They come from this Python environment. requirements.txt installs NVIDIA's CUDA wheels
(`nvidia-cuda-nvcc` and the packages it pulls in: `nvidia-nvvm`, `nvidia-cuda-crt`,
`nvidia-cuda-runtime`; `nvidia-cuda-cuobjdump`), which unpack a small CUDA tree under
site-packages/nvidia/cu13: bin/nvcc, bin/ptxas, nvvm/, include/. attnlab runs the tools from there
by their full path, so a machine with no CUDA toolkit builds every kernel and nothing depends on
PATH.

A toolkit installed on the system is used only when asked for:
  ATTNLAB_NVCC=system          nvcc on PATH, else $CUDA_HOME/bin/nvcc (a GPU session's image)
  ATTNLAB_NVCC=/path/to/nvcc   that one
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

# The CUDA major of the wheels' tree (site-packages/nvidia/cu13): the one CuPy (cupy-cuda13x) is
# built for.
WHEEL_TREE = "cu13"
# The CUDA release of the GPU hosts' driver. A cubin from a newer nvcc than the driver may not
# load, so the pinned nvcc is this release (requirements.txt) and prebuilt cubins must come from it.
GPU_HOST_CUDA = "13.0"


class ToolMissing(RuntimeError):
    """A CUDA tool attnlab needs is not installed where it looks; the message says how to get it."""


def wheel_bin_dirs() -> list[Path]:
    """site-packages/nvidia/cu13/bin of this interpreter's environment, where it exists."""
    paths = sysconfig.get_paths()
    dirs = []
    for base in dict.fromkeys((paths["purelib"], paths["platlib"])):
        d = Path(base, "nvidia", WHEEL_TREE, "bin")
        if d.is_dir():
            dirs.append(d)
    return dirs


def _from_wheels(name: str) -> str | None:
    for d in wheel_bin_dirs():
        exe = d / name
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    return None


def _system(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and os.access(Path(root, "bin", name), os.X_OK):
            return str(Path(root, "bin", name))
    return None


def nvcc() -> str:
    """The nvcc that builds every kernel (see the module's docstring for the order)."""
    choice = os.environ.get("ATTNLAB_NVCC", "").strip()
    if choice == "system":
        found = _system("nvcc")
        if found is None:
            raise ToolMissing("ATTNLAB_NVCC=system, but there is no nvcc on PATH or in $CUDA_HOME/bin")
        return found
    if choice:
        if not (Path(choice).is_file() and os.access(choice, os.X_OK)):
            raise ToolMissing(f"ATTNLAB_NVCC={choice} is not an executable file")
        return choice
    found = _from_wheels("nvcc")
    if found is None:
        raise ToolMissing("nvcc is not in this Python environment: `pip install -r requirements.txt` installs "
                          "it (nvidia-cuda-nvcc); ATTNLAB_NVCC=system uses a CUDA toolkit's instead")
    return found


def has_nvcc() -> bool:
    try:
        nvcc()
    except ToolMissing:
        return False
    return True


def cuobjdump() -> str:
    """cuobjdump, from the environment's wheel first (the one the static pages were made with),
    else a toolkit's on PATH (a GPU session's image carries one and no wheel)."""
    found = _from_wheels("cuobjdump") or _system("cuobjdump")
    if found is None:
        raise ToolMissing("cuobjdump not found: `pip install -r requirements.txt` installs it "
                          "(nvidia-cuda-cuobjdump)")
    return found


def nvdisasm() -> str:
    """nvdisasm, which places each SASS instruction at its source lines (-gi), from the
    environment's wheel first, else a toolkit's on PATH."""
    found = _from_wheels("nvdisasm") or _system("nvdisasm")
    if found is None:
        raise ToolMissing("nvdisasm not found: `pip install -r requirements.txt` installs it (nvidia-cuda-nvdisasm)")
    return found


def nvdisasm_version() -> str:
    exe = nvdisasm()
    return _version(exe, _stamp(exe))


def _stamp(path: str) -> tuple:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=16)
def _version(exe: str, stamp: tuple) -> str:
    """The x.y.z a CUDA tool prints for --version ("Cuda compilation tools, release 13.0, V13.0.88")."""
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True)
    m = re.search(r"\bV(\d+\.\d+\.\d+)", proc.stdout)
    if proc.returncode != 0 or m is None:
        raise ToolMissing(f"{exe} --version did not say which release it is: {proc.stderr.strip()[:200]}")
    return m.group(1)


def nvcc_version() -> str:
    """nvcc's full version, e.g. "13.0.88": part of every build's cache key."""
    exe = nvcc()
    return _version(exe, _stamp(exe))


def nvcc_release() -> str:
    """nvcc's CUDA release, e.g. "13.0"."""
    return ".".join(nvcc_version().split(".")[:2])


def cuobjdump_version() -> str:
    exe = cuobjdump()
    return _version(exe, _stamp(exe))


def include_dirs() -> list[str]:
    """Where NVRTC finds cuda_fp16.h and mma.h: the wheels' include/, then a toolkit's."""
    dirs = [str(d.parent / "include") for d in wheel_bin_dirs() if (d.parent / "include" / "cuda_fp16.h").exists()]
    for root in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and Path(root, "include", "cuda_fp16.h").exists():
            dirs.append(str(Path(root, "include")))
    return list(dict.fromkeys(dirs))

