"""What machine this is: GPU or not, its properties, and the software versions records carry."""
from __future__ import annotations

import functools
import platform
import subprocess
from importlib import metadata

from .paths import repo_root


class NoGpuError(RuntimeError):
    """Raised when something that needs a CUDA GPU runs without one."""


def _torch():
    import torch
    return torch


@functools.lru_cache(maxsize=1)
def has_gpu() -> bool:
    try:
        return bool(_torch().cuda.is_available())
    except Exception:  # torch missing or broken: no GPU as far as attnlab is concerned
        return False


def require_gpu(what: str = "this") -> None:
    if not has_gpu():
        raise NoGpuError(f"{what} needs a CUDA GPU, and torch sees none on this machine "
                         "(torch.cuda.is_available() is False)")


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def software_versions() -> dict:
    torch = _torch()
    cupy_version = None
    for name in ("cupy-cuda13x", "cupy-cuda12x", "cupy"):
        cupy_version = cupy_version or _version(name)
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if has_gpu() else None,
        "cupy": cupy_version,
        "triton": _version("triton"),
        "attnlab": _version("attnlab"),
    }


def device_info() -> dict:
    """The GPU a record was measured on; raises NoGpuError without one."""
    require_gpu("device_info()")
    torch = _torch()
    idx = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(idx)
    info = {
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "driver": nvidia_smi("driver_version"),
        "cuda_runtime": torch.version.cuda,
    }
    l2 = getattr(props, "L2_cache_size", None)
    if l2:
        info["l2_mib"] = round(l2 / 2**20, 1)
    return info


def nvidia_smi(field: str) -> str | None:
    """One `nvidia-smi --query-gpu` field of the first GPU, or None without nvidia-smi or a GPU."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def tree_digest() -> str:
    """sha256 over kernels/ and src/ (paths and contents): what a commit stamp vouches for."""
    import hashlib

    h = hashlib.sha256()
    root = repo_root()
    for folder in ("kernels", "src"):
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and ".egg-info" not in str(path):
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def git_commit() -> dict:
    """The commit a run measured, and whether the tree had uncommitted changes. A copy of the tree
    without .git (a GPU machine's) takes them from ATTNLAB_GIT_COMMIT and ATTNLAB_GIT_DIRTY, which
    scripts/gpu_prepare.sh stamps where the repository is."""
    import os

    def git(*args):
        return subprocess.run(["git", *args], cwd=repo_root(), capture_output=True, text=True, timeout=20)
    try:
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--", "kernels", "src")
    except (OSError, subprocess.TimeoutExpired):
        head = dirty = None
    if head is None or head.returncode != 0:
        stamped = os.environ.get("ATTNLAB_GIT_COMMIT") or None
        flag, tree = os.environ.get("ATTNLAB_GIT_DIRTY"), os.environ.get("ATTNLAB_GIT_TREE")
        if flag is None:
            return {"commit": stamped, "dirty": None}
        # An edit after the stamp was made leaves the commit's name but makes the tree dirty.
        return {"commit": stamped, "dirty": flag == "1" or (tree is not None and tree != tree_digest())}
    return {"commit": head.stdout.strip() or None,
            "dirty": bool(dirty.stdout.strip()) if dirty.returncode == 0 else None}
