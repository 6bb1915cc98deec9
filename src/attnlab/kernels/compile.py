"""Turn kernels/*.cu into launchable CuPy functions on the GPU at hand, cached.

Two back ends, both through `cupy.RawModule`:
- nvcc (the default; `attnlab.kernels.toolchain` finds it in this environment's CUDA wheels): compile a
  cubin for the exact GPU, then load it. The binary that runs is then built by the same compiler
  and flags as the one `attnlab inspect` reads registers and SASS from.
- NVRTC (`ATTNLAB_BACKEND=nvrtc`, or no nvcc): CuPy compiles the source in process.

Every nvcc build is cached on disk (ATTNLAB_CACHE) under a key of everything that decides its
output: the kernel's source and headers, its configuration, the target, the flags and nvcc's
version. A second `inspect`, a prebuilt GPU session or a re-run chapter reads the cubin and
ptxas's report back instead of compiling. Loaded functions are cached in memory too, so compile
time never reaches a timing.

A configured kernel (chapter 8: `spec.with_config(...)`) is the same source built with its knobs
as preprocessor defines, `-DNAME=VALUE`; the defines are part of every cache key.
"""
from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import tempfile
import threading
from pathlib import Path

from ..env import require_gpu
from ..paths import cache_dir, kernels_dir
from . import toolchain
from .registry import KernelSpec
from .sources import kernel_hash, read_source

# One set of flags for every build, static or not. -lineinfo lets Nsight Compute and
# compute-sanitizer point at source lines; it does not change the code generated.
NVCC_FLAGS = ("-std=c++17", "-O3", "-lineinfo")


class KernelBuildError(RuntimeError):
    """The CUDA compiler rejected a kernel; the message carries its log."""


def backend() -> str:
    choice = os.environ.get("ATTNLAB_BACKEND", "").lower()
    if choice in ("nvcc", "nvrtc"):
        return choice
    if choice:
        raise ValueError(f"ATTNLAB_BACKEND must be 'nvcc' or 'nvrtc', not {choice!r}")
    return "nvcc" if toolchain.has_nvcc() else "nvrtc"


def define_flags(defines) -> list[str]:
    """The compiler flags of a configuration: -DNAME=VALUE for each (name, value); none for ()."""
    return [f"-D{name}={value}" for name, value in defines]


def config_tag(defines) -> str:
    """A short, stable name for a configuration in cache file names ("" for the chapter's own)."""
    if not defines:
        return ""
    text = ",".join(f"{n}={v}" for n, v in sorted(defines))
    return "-cfg" + hashlib.sha256(text.encode()).hexdigest()[:12]


def build_inputs(spec: KernelSpec, arch: str) -> tuple[str, str, str]:
    """What decides an nvcc build besides the flags and nvcc itself, which are the same for every
    build of one machine: source and headers, configuration, target. Needs no nvcc."""
    return kernel_hash(spec), repr(sorted(spec.defines)), arch


def build_key(spec: KernelSpec, arch: str) -> str:
    """sha256 of everything that decides an nvcc build: its inputs, the flags, nvcc's version.
    Raises ToolMissing without an nvcc."""
    parts = [*build_inputs(spec, arch), repr(NVCC_FLAGS), toolchain.nvcc_version()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def cubin_path(spec: KernelSpec, arch: str) -> Path:
    """Where the cached cubin of a kernel (and configuration) for `arch` lives; ptxas's report of
    the same build sits beside it (`.ptxas`). Named after the source file, not the id: ids that
    share a build (chapter 7's ablations launch other entries of one cubin) share its file."""
    name = f"{spec.path.stem}{config_tag(spec.defines)}-{arch}-{build_key(spec, arch)[:16]}"
    return cache_dir() / "cubin" / f"{name}.cubin"


def _compile(spec: KernelSpec, arch: str, out: Path) -> str:
    """Run nvcc once; returns ptxas's report."""
    cmd = [toolchain.nvcc(), f"-arch={arch}", "-cubin", "-Xptxas", "-v", *NVCC_FLAGS, *define_flags(spec.defines),
           "-I", str(kernels_dir()), "-o", str(out), str(spec.path)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        what = f"{spec.id} ({arch}{', ' + spec.config_label() if spec.defines else ''})"
        raise KernelBuildError(f"nvcc failed for {what}:\n{proc.stderr}")
    return proc.stderr


def scratch_path(path: Path) -> Path:
    """A name beside `path` that no other process or thread writes. Parallel builds (prebuild, the
    search's static gate, inspect) may race for one key: each writes its own file and renames it
    over `path`, so a reader never sees half a file."""
    return path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def write_atomic(path: Path, text: str) -> None:
    tmp = scratch_path(path)
    tmp.write_text(text)
    tmp.replace(path)


def nvcc_cubin(spec: KernelSpec, arch: str, out: Path | None = None, defines=None) -> tuple[Path, str]:
    """Compile one kernel to a cubin for `arch` (sm_XY); returns (path, ptxas report).

    Without `out`, the build comes from the cache when it is there and goes into it when not.
    `defines` (a dict or (name, value) pairs) builds the kernel with that configuration, as
    `spec.with_config(defines)` would; by default the spec's own (none for a registered kernel)."""
    if defines is not None:
        spec = spec.with_config(defines)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        return out, _compile(spec, arch, out)
    cubin = cubin_path(spec, arch)
    report = cubin.with_suffix(".ptxas")
    if cubin.exists() and report.exists():
        return cubin, report.read_text()
    cubin.parent.mkdir(parents=True, exist_ok=True)
    tmp = scratch_path(cubin)
    text = _compile(spec, arch, tmp)
    write_atomic(report, text)
    tmp.replace(cubin)  # last: a cubin in the cache means its report is there too
    return cubin, text


def ptxas_report(spec: KernelSpec, arch: str) -> str:
    """ptxas's resource report of one build, from the cache when it is there. A miss builds the
    cubin in a scratch folder and keeps only the report: the search's static gate asks this of
    hundreds of configurations whose cubins nothing loads."""
    report = cubin_path(spec, arch).with_suffix(".ptxas")
    if report.exists():
        return report.read_text()
    report.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        text = _compile(spec, arch, Path(tmp) / "kernel.cubin")
    write_atomic(report, text)
    return text


def _device_index(device=None) -> int:
    """The CUDA device index of `device` (a torch.device, an int, or None: torch's current one)."""
    import torch
    index = device if isinstance(device, int) or device is None else device.index
    return torch.cuda.current_device() if index is None else index


@functools.lru_cache(maxsize=None)
def _device_arch(index: int) -> str:
    import torch
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


@functools.lru_cache(maxsize=None)
def _load(kernel_id: str, source_hash: str, arch: str, which: str, defines: tuple = ()):
    import cupy
    from .registry import get

    spec = get(kernel_id).with_config(defines)
    if which == "nvcc":
        cubin, _ = nvcc_cubin(spec, arch)
        return cupy.RawModule(path=str(cubin))
    options = ("-std=c++17", f"--include-path={kernels_dir()}",
               *(f"--include-path={d}" for d in toolchain.include_dirs()), *define_flags(defines))
    try:
        module = cupy.RawModule(code=read_source(spec), options=options)
        module.compile()
    except Exception as exc:  # CuPy raises its own CompileException with the NVRTC log
        raise KernelBuildError(f"NVRTC failed for {spec.id}:\n{exc}") from exc
    return module


# Loaded kernels: (kernel id, defines, entry, source hash, arch, backend, device index) -> RawKernel.
# get_function makes a new RawKernel (and a cuModuleGetFunction) each call, and the opt-in to more
# shared memory is per function, so each is made once; the source hash in the key makes an
# edited kernel load anew.
_functions: dict[tuple, object] = {}


def load_function(spec: KernelSpec, entry: str | None = None, device=None):
    """The compiled `cupy.RawKernel` for a registered kernel's entry point on `device` (torch's
    current device by default), built with the spec's configuration (`spec.defines`; none for the
    chapter's own). Loaded once per source version, configuration, entry and device."""
    require_gpu(f"loading kernel {spec.id}")
    index = _device_index(device)
    key = (spec.id, tuple(spec.defines), entry or spec.entry, kernel_hash(spec), _device_arch(index),
           backend(), index)
    fn = _functions.get(key)
    if fn is None:
        import cupy

        kernel_id, defines, name, source_hash, arch, which, _ = key
        module = _load(kernel_id, source_hash, arch, which, defines)
        with cupy.cuda.Device(index):  # get_function loads the module on the current device
            fn = module.get_function(name)
        _functions[key] = fn
    return fn
