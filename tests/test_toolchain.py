"""The CUDA compiler comes from the project's own requirements, and every build is cached by what
decides it: these run nvcc for real, with no GPU and no system CUDA toolkit needed."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from attnlab.kernels import compile as build
from attnlab.kernels import registry, static, toolchain
from attnlab.paths import repo_root

REQUIREMENTS = [Requirement(line.split("#")[0].strip())
                for line in (repo_root() / "requirements.txt").read_text().splitlines()
                if line.split("#")[0].strip()]


def _pin(name: str) -> str:
    req = next(r for r in REQUIREMENTS if r.name == name)
    spec = next(iter(req.specifier))
    assert spec.operator == "==", f"{name} must be pinned exactly, not {req.specifier}"
    return spec.version


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    static._BUILDS.clear()
    yield tmp_path / "cache"
    static._BUILDS.clear()


@pytest.fixture
def decoy_nvcc(tmp_path, monkeypatch):
    """An `nvcc` first on PATH that only leaves a mark: a system toolkit attnlab must not use
    unless asked."""
    bin_dir = tmp_path / "system-bin"
    bin_dir.mkdir()
    mark = tmp_path / "decoy-ran"
    decoy = bin_dir / "nvcc"
    decoy.write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    decoy.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("ATTNLAB_NVCC", raising=False)
    return decoy, mark


def test_nvcc_comes_from_the_environment_not_path(decoy_nvcc, fresh_cache):
    decoy, mark = decoy_nvcc
    found = Path(toolchain.nvcc())
    assert found.is_relative_to(sys.prefix), f"{found} is not inside this environment ({sys.prefix})"
    assert found.parent.parent.name == toolchain.WHEEL_TREE
    build.nvcc_cubin(registry.get("01_scalar"), "sm_90")
    assert not mark.exists(), "the nvcc on PATH ran although nobody asked for it"
    assert build.backend() == "nvcc"


def test_system_nvcc_only_when_asked(decoy_nvcc, monkeypatch, tmp_path):
    decoy, _ = decoy_nvcc
    monkeypatch.setenv("ATTNLAB_NVCC", "system")
    assert toolchain.nvcc() == str(decoy)
    monkeypatch.setenv("ATTNLAB_NVCC", str(decoy))
    assert toolchain.nvcc() == str(decoy)
    monkeypatch.setenv("ATTNLAB_NVCC", str(tmp_path / "no-such-nvcc"))
    with pytest.raises(toolchain.ToolMissing, match="is not an executable file"):
        toolchain.nvcc()
    monkeypatch.setenv("ATTNLAB_NVCC", "system")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    with pytest.raises(toolchain.ToolMissing, match="no nvcc on PATH"):
        toolchain.nvcc()
    assert not toolchain.has_nvcc() and build.backend() == "nvrtc"


def test_no_wheel_says_how_to_get_one(monkeypatch):
    monkeypatch.delenv("ATTNLAB_NVCC", raising=False)
    monkeypatch.setattr(toolchain, "wheel_bin_dirs", lambda: [])
    with pytest.raises(toolchain.ToolMissing, match="pip install -r requirements.txt"):
        toolchain.nvcc()


def test_pinned_nvcc_is_the_gpu_hosts_release():
    """The GPU hosts' driver is CUDA 13.0: the pinned compiler and the one installed are that
    release, and nvcc's companions (which it asks for unversioned) are pinned to it as well."""
    nvcc_pin = _pin("nvidia-cuda-nvcc")
    assert nvcc_pin.startswith(toolchain.GPU_HOST_CUDA + ".")
    for companion in ("nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-runtime", "nvidia-cuda-cccl"):
        assert _pin(companion).startswith(toolchain.GPU_HOST_CUDA + "."), companion
    assert toolchain.nvcc_version() == nvcc_pin
    assert toolchain.nvcc_release() == toolchain.GPU_HOST_CUDA


def test_cuda_wheels_and_cupy_share_a_cuda_major():
    cupy = next(r for r in REQUIREMENTS if r.name.startswith("cupy-cuda"))
    major = re.fullmatch(r"cupy-cuda(\d+)x", cupy.name).group(1)
    assert toolchain.WHEEL_TREE == f"cu{major}"
    for name in ("nvidia-cuda-nvcc", "nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm"):
        assert _pin(name).split(".")[0] == major, name
    assert toolchain.cuobjdump_version().split(".")[0] == major


def test_the_build_key_covers_source_flags_target_and_toolchain(monkeypatch, tmp_path):
    spec = registry.get("07_mma")
    key = build.build_key(spec, "sm_90")
    assert build.build_key(spec, "sm_90") == key
    assert build.build_key(spec, "sm_89") != key
    assert build.build_key(spec.with_config({"ATTN07_WARPS": 8}), "sm_90") != key
    monkeypatch.setattr(build, "NVCC_FLAGS", build.NVCC_FLAGS + ("-DEXTRA",))
    assert build.build_key(spec, "sm_90") != key
    monkeypatch.undo()
    monkeypatch.setattr(toolchain, "nvcc_version", lambda: "13.0.48")
    assert build.build_key(spec, "sm_90") != key
    monkeypatch.undo()
    # An edit to a header the kernel includes, in a copy of the repository.
    copy = tmp_path / "repo"
    (copy / "kernels").mkdir(parents=True)
    for f in (repo_root() / "kernels").iterdir():
        if f.is_file():
            (copy / "kernels" / f.name).write_bytes(f.read_bytes())
    monkeypatch.setenv("ATTNLAB_ROOT", str(copy))
    moved = registry.get("07_mma")
    assert build.build_key(moved, "sm_90") == key
    with open(copy / "kernels" / "ptx.cuh", "a") as fh:
        fh.write("\n// an edit\n")
    assert build.build_key(moved, "sm_90") != key


def test_a_cached_build_runs_no_compiler(fresh_cache, monkeypatch):
    spec = registry.get("05_wmma")
    first = static.inspect_kernel(spec, "sm_90")
    static._BUILDS.clear()

    def refuse(*args, **kwargs):
        raise AssertionError(f"a process ran for a cached build: {args[0] if args else kwargs}")

    monkeypatch.setattr(build, "_compile", refuse)
    monkeypatch.setattr(static.subprocess, "run", refuse)
    again = static.inspect_kernel(spec, "sm_90")
    assert again.functions == first.functions and again.sass == first.sass and again.sass
    assert build.ptxas_report(spec, "sm_90") == build.nvcc_cubin(spec, "sm_90")[1]


def _counting_nvcc(tmp_path: Path) -> tuple[Path, Path]:
    """A wrapper around the environment's nvcc that logs each compile (not --version)."""
    log = tmp_path / "nvcc.log"
    wrapper = tmp_path / "nvcc"
    wrapper.write_text(f'#!/bin/sh\n[ "$1" = --version ] || echo compile >> {log}\nexec {toolchain.nvcc()} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, log


def _compiles(log: Path) -> int:
    """How many compiles the wrapper logged since the last call."""
    count = len(log.read_text().splitlines()) if log.exists() else 0
    log.unlink(missing_ok=True)
    return count


def test_a_second_inspect_compiles_nothing(tmp_path):
    wrapper, log = _counting_nvcc(tmp_path)
    env = {**os.environ, "ATTNLAB_CACHE": str(tmp_path / "cache"), "ATTNLAB_NVCC": str(wrapper)}
    argv = [sys.executable, "-m", "attnlab", "inspect", "01_scalar", "07_mma", "--arch", "sm_89", "sm_90"]

    def inspect() -> str:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout

    first = inspect()
    assert _compiles(log) == 4, "the first inspect builds each kernel once per target"
    assert inspect() == first
    assert _compiles(log) == 0, "the second inspect compiled again"


def _path_without_nvcc() -> str:
    return os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if d and not Path(d, "nvcc").exists())


def test_kernels_build_with_no_cuda_toolkit_in_sight(tmp_path):
    """No nvcc on PATH, no CUDA_HOME: the static build of a tensor-core kernel still works."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "ATTNLAB_NVCC")}
    env.update(PATH=_path_without_nvcc(), ATTNLAB_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "attnlab", "inspect", "05_wmma", "--arch", "sm_90"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "attn_fwd_05_wmma" in proc.stdout
