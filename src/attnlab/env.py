"""What machine this is: GPU or not, its properties, and the software versions records carry."""
from __future__ import annotations

import functools
import platform
import subprocess
from importlib import metadata


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


def device_name() -> str | None:
    """torch's name of this machine's GPU, or None without one."""
    if not has_gpu():
        return None
    import torch
    return torch.cuda.get_device_name()


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
