"""Build, ahead of time and on a machine without a GPU, every cubin a GPU session will load.

The cubins land in attnlab's cache (ATTNLAB_CACHE), under the very keys `attnlab.compile` looks
for on the GPU (sources, configuration, target, flags, nvcc's version), so a GPU whose nvcc is the
same release build never waits on a compiler. That nvcc must be one the GPU's driver accepts (a
cubin from a newer toolkit than the driver may not load): requirements.txt pins the GPU hosts'
release. Chapter 8's search also reads ptxas's report of each configuration through the same
cache; building it here saves the GPU those builds too. `export` then copies exactly those files
into the folder that travels (gpu_prepare.sh's .attnlab-cache), leaving stale builds behind.
"""
from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import registry

# What chapter 8's page searches on the GPU (its quick setting): (kernel, head dim). Its cubins and
# ptxas's reports for the GPU's target are built here.
SEARCHED = (("07_mma", 64),)
# Chapter 8's page also draws the static space of every searchable kernel for the L4's target.
STATIC_ONLY_ARCH = "sm_89"


def jobs(arch: str, searched=SEARCHED) -> list[registry.KernelSpec]:
    """Every registered kernel, then every configuration of the searched kernels that the
    arithmetic rules let through."""
    from . import search

    specs = list(registry.select(None, arch))  # each with the tiles of `arch` (chapter 7's follow it)
    for kid, D in searched:
        specs += [registry.get(kid, arch).with_config(c) for c in search.space(kid, D)]
    # The space holds the chapter's own configuration too (with_config gives the registered spec
    # back): one job per build, or two threads would write the same cubin.
    return list({(s.id, s.defines): s for s in specs}.values())


def prebuild(arch: str, searched=SEARCHED, workers: int | None = None, progress: bool = True) -> list[str]:
    """Build what is missing; returns the failures (one line each)."""
    import os

    from tqdm import tqdm

    from . import search
    from .compile import KernelBuildError, nvcc_cubin
    from .search import static_space

    def one(spec) -> str | None:
        try:
            nvcc_cubin(spec, arch)  # a cache hit costs a stat
        except KernelBuildError as exc:
            return f"{spec.id} {spec.config_label() if spec.defines else ''}: {str(exc).splitlines()[0]}"
        return None

    work = jobs(arch, searched)
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2) as pool:
        failures = [f for f in tqdm(pool.map(one, work), total=len(work), desc=f"cubins {arch}", unit="build",
                                    disable=not progress) if f]
    for kid, D in searched:  # ptxas's reports, read by the search's static gate on the GPU
        static_space(kid, D, arch, workers=workers, progress=progress)
    for kid in search.searchable():  # the page's static space (ptxas's reports only, no cubins kept)
        for D in (64, 128):
            static_space(kid, D, STATIC_ONLY_ARCH, workers=workers, progress=progress)
    return failures


def carried_files(arch: str, searched=SEARCHED) -> list[Path]:
    """The cache files a GPU session reads, after `prebuild`: each job's cubin and ptxas report,
    and the ptxas reports of the static spaces (the configurations the arithmetic rules refuse
    were never built and have none)."""
    from . import search
    from .compile import cubin_path

    files = []
    for spec in jobs(arch, searched):
        cubin = cubin_path(spec, arch)
        files += [cubin, cubin.with_suffix(".ptxas")]
    spaces = [(kid, D, arch) for kid, D in searched]
    spaces += [(kid, D, STATIC_ONLY_ARCH) for kid in search.searchable() for D in (64, 128)]
    for kid, D, target in spaces:
        for config in search.space(kid, D):
            report = cubin_path(registry.get(kid, target).with_config(config), target).with_suffix(".ptxas")
            if report.exists():
                files.append(report)
    return list(dict.fromkeys(files))


def export(dest: Path, files: list[Path]) -> tuple[int, int]:
    """Copy `files` (carried_files: exactly what a GPU session reads) into `dest`/cubin, emptied
    first, so that what is carried holds no stale build; returns (files, bytes)."""
    target = dest / "cubin"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for path in files:
        shutil.copy2(path, target / path.name)
    return len(files), sum(p.stat().st_size for p in files)
