"""The nvcc builds a GPU session needs, and building those that are missing, many at once.

A build is one nvcc run of a kernel (with a configuration, for a target): a cubin and ptxas's
report beside it, or the report alone (the search's static gate keeps no cubin), cached by
attnlab.kernels.compile under a key of everything that decides it. Ids that share a build (chapter 7's
ablations launch other entries of 07_mma's cubin) share its file. The sets:

- `registered`: every registered kernel for the GPU's target, what check, bench and sanitize load;
- `searched`: every configuration of chapter 8's timed search (07_mma at D = 64) that the
  arithmetic rules let through (the search never builds the others);
- `static_reports`: ptxas's reports of every searchable kernel's space at D = 64 and 128 for the
  L4's target, which chapter 8's page draws on any machine;
- `inspected`: every registered kernel for each target the chapters inspect (sm_80, sm_89, sm_90).

`carried` is what travels to the GPU machine, prebuilt here (attnlab.session.carry packs it): the
registered kernels for its target and the static reports. The rest is built on the GPU machine by
the first step of the stage that needs it (attnlab.session.stages), on all of its cores: a build a stage
needs and does not find is built there, never a failure. So is everything when that machine's nvcc
is another build than the one that made the carry (the cache keys hold nvcc's version).
"""
from __future__ import annotations

import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..kernels import registry
from ..kernels.registry import KernelSpec

# Chapter 8's page searches on the GPU (its quick setting): (kernel, head dim).
SEARCHED = (("07_mma", 64),)
# Chapter 8's page draws the static space of every searchable kernel for the L4's target.
STATIC_ONLY_ARCH = "sm_89"
# What one build costs, for the stages' predicted minutes: nvcc is one process on one core. On the
# two otherwise idle cores of an AMD EPYC here, 24 configurations of 07_mma for sm_90, the heaviest
# builds, took 43 s (3.6 core-seconds each) with chapter 7's 16 entries; with the 25 of its eight
# steps four of its configurations took 5.4 to 8.1 s (6.5 on average). The 26 other inspected targets
# of the registered kernels took 24 s (1.8 each). The GPU machine has 16 cores (its kind's page).
BUILD_CORE_SECONDS = 6.5
DEVICE_CORES = 16


@dataclass(frozen=True)
class Build:
    spec: KernelSpec
    arch: str
    cubin: bool = True     # False: ptxas's report alone
    # False: a configuration of a searched space, where nvcc's refusal is the static gate's verdict
    # on it (attnlab.gpu.search), not a failure
    required: bool = True

    @property
    def identity(self) -> tuple:
        """Its output (the cache files' names follow the source file), known without nvcc."""
        from ..kernels.compile import build_inputs

        return (self.spec.path.name, *build_inputs(self.spec, self.arch), self.cubin)

    def files(self) -> list[Path]:
        """The cache files it leaves: the cubin and its report, or the report."""
        from ..kernels.compile import cubin_path

        cubin = cubin_path(self.spec, self.arch)
        return [cubin, cubin.with_suffix(".ptxas")] if self.cubin else [cubin.with_suffix(".ptxas")]

    def done(self) -> bool:
        return all(p.exists() for p in self.files())

    def run(self) -> None:
        from ..kernels.compile import nvcc_cubin, ptxas_report

        if self.cubin:
            nvcc_cubin(self.spec, self.arch)
        else:
            ptxas_report(self.spec, self.arch)

    def label(self) -> str:
        config = f" {self.spec.config_label()}" if self.spec.defines else ""
        return f"{self.spec.id}{config} {self.arch}{'' if self.cubin else ' (report)'}"


def unique(builds) -> list[Build]:
    """One build per output, in first-seen order (a cubin also gives its report)."""
    builds = list(builds)
    seen, out = set(), []
    cubins = {b.identity[:-1] for b in builds if b.cubin}
    for b in builds:
        if b.identity in seen or (not b.cubin and b.identity[:-1] in cubins):
            continue
        seen.add(b.identity)
        out.append(b)
    return out


def registered(arch: str) -> list[Build]:
    # each with the tiles of `arch` (chapter 7's key tile follows the architecture)
    return unique(Build(s, arch) for s in registry.select(None, arch))


def searched(arch: str, kernels=SEARCHED) -> list[Build]:
    from ..gpu import search

    return unique(Build(registry.get(kid, arch).with_config(c), arch, required=False)
                  for kid, D in kernels for c in search.valid_space(kid, D, arch))


def static_reports(arch: str = STATIC_ONLY_ARCH) -> list[Build]:
    from ..gpu import search

    return unique(Build(registry.get(kid, arch).with_config(c), arch, cubin=False, required=False)
                  for kid in search.searchable() for D in (64, 128) for c in search.valid_space(kid, D, arch))


def inspected() -> list[Build]:
    from ..kernels.static import ARCHES

    return unique(b for arch in ARCHES for b in registered(arch))


SETS = {"registered": registered, "searched": searched, "static_reports": lambda arch: static_reports(),
        "inspected": lambda arch: inspected()}


def builds(names, arch: str) -> list[Build]:
    """The union of the named sets for a GPU of target `arch`."""
    return unique(b for name in names for b in SETS[name](arch))


def carried(arch: str) -> list[Build]:
    """What travels to a GPU of target `arch`, prebuilt."""
    return builds(("registered", "static_reports"), arch)


def build_missing(wanted: list[Build], workers: int | None = None, progress: bool = True,
                  desc: str = "builds") -> tuple[list[Build], dict[Build, str], float]:
    """Build what is not in the cache, `workers` nvcc processes at once (default: one per core);
    returns (what was tried, {build: the first line of nvcc's refusal}, seconds)."""
    from tqdm import tqdm

    from ..kernels.compile import KernelBuildError

    todo = [b for b in wanted if not b.done()]

    def one(b: Build) -> str | None:
        try:
            b.run()
        except KernelBuildError as exc:
            return f"{b.label()}: {str(exc).splitlines()[0]}"
        return None

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2) as pool:
        results = list(tqdm(pool.map(one, todo), total=len(todo), desc=desc, unit="build", disable=not progress))
    return todo, {b: line for b, line in zip(todo, results) if line}, time.monotonic() - t0


def predicted_seconds(n_builds: int, cores: int = DEVICE_CORES) -> float:
    """Wall seconds of `n_builds` nvcc runs on `cores` cores, in waves (a prediction)."""
    return math.ceil(n_builds / cores) * BUILD_CORE_SECONDS if n_builds else 0.0
