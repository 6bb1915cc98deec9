"""What travels to a GPU machine with the working tree, and the proof that it fits.

The device takes 64 MiB a call: the working tree (git's tracked and untracked-not-ignored files),
the wheels the stages import (.whl, scripts/fetch_device_wheels.sh) and the prebuilt cache
(.attnlab-cache). The carry is held to BUDGET_MIB, well under that, so that the next chapter's
kernels do not break the next lease.

The cache travels as one solid xz archive, `prebuilt-<arch>.tar.xz` (attnlab.session.prebuild's `carried`
builds; each file once, however many ids launch it): cubins of one source differ little, and xz
sees the whole archive at once. The session's first step unpacks it into attnlab's cache
(`unpack`) and builds there whatever else the stage needs.

`estimate` bounds the carry from the registry and the search space alone, building and
downloading nothing: the tree as git lists it, the wheels at the most fetch_device_wheels.sh
accepts (WHEELS_MAX_MIB), and per carried file a bound of what it adds to the archive (a cubin at
most CUBIN_XZ_MAX compressed alone, or CUBIN_XZ_MAX_EARLY for chapters 1-6, a report at most
REPORT_MAX uncompressed, ENTRY_BYTES of tar header and padding each). `pack` holds every archive it writes to that bound and to the per-file
ones, so each prepare shows the estimate to be an upper bound on the real builds, and
tests/test_carry.py shows it on the registered kernels' builds in CI.
"""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from . import prebuild

MiB = 2**20
LIMIT_MIB = 64           # what the device accepts in one call (its tool's limits)
BUDGET_MIB = 60          # what scripts/gpu_prepare.sh may carry: the rest is room to grow (a GPU session adds ~3 MiB of
                         # records; the pages grew 4.4 MiB of figures when the first timings arrived, 2026-11-27)
WHEELS_MAX_MIB = 34      # scripts/fetch_device_wheels.sh fails above this (55 wheels: 32.3 MiB)
# A bound of one cubin compressed alone, by the chapter of its source. Measured for sm_90: chapter
# 7's source 475 KiB with the 37 entries of its steps up to 7.11 (321 KiB with 25, 164 KiB with 16),
# and 1.22x that with the 49 up to 7.12 (xz -9 of both builds here), 766 KiB with the 61 up to 7.13
# and its ablation (step 7.13's loop holds O += P V's code twice, in the loop and after it);
# chapters 1-6 10-87 KiB (02_block_tiling the largest), one entry or a few each. A chapter from 7 on
# takes the large bound: the one source the book grows a step at a time.
CUBIN_XZ_MAX = 832 * 1024
CUBIN_XZ_MAX_EARLY = 160 * 1024   # chapters 1-6
LARGE_FROM_CHAPTER = 7
REPORT_MAX = 24 * 1024   # ptxas's report of one build, uncompressed: 12.6 KiB with chapter 7's 37 entries, ~17 with 49, 20.6 with 61
ENTRY_BYTES = 1024       # a tar header (512 B) and the padding of the file's last block (< 512 B)
XZ_PRESET = 9            # a 64 MiB window: the whole archive's cubins in sight of each other
MANIFEST = "manifest.json"
CACHE_FOLDER = ".attnlab-cache"


def archive_name(arch: str) -> str:
    return f"prebuilt-{arch}.tar.xz"


# --- sizes -------------------------------------------------------------------------------------------

def tree_bytes(root: Path) -> int:
    """The working tree as the device tool sends it: tracked and untracked-not-ignored files."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout
    return sum((root / name).stat().st_size for name in out.decode().split("\0")
               if name and (root / name).is_file())


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def cubin_bound(build: prebuild.Build) -> int:
    """The most the build's cubin weighs compressed alone (by its chapter)."""
    return CUBIN_XZ_MAX if build.spec.chapter >= LARGE_FROM_CHAPTER else CUBIN_XZ_MAX_EARLY


def file_bound(build: prebuild.Build) -> int:
    """The most a build's files add to the archive."""
    return (cubin_bound(build) + REPORT_MAX + 2 * ENTRY_BYTES) if build.cubin else REPORT_MAX + ENTRY_BYTES


def archive_bound(builds: list[prebuild.Build]) -> int:
    """The most the archive of `builds` can weigh: each file's bound, the manifest, xz's framing."""
    return sum(file_bound(b) for b in builds) + 64 * 1024


@dataclass
class Estimate:
    arch: str
    tree: int
    wheels: int
    cubins: int
    reports: int
    cache: int

    @property
    def total(self) -> int:
        return self.tree + self.wheels + self.cache

    def text(self) -> str:
        return (f"carry bound for {self.arch}: tree {self.tree / MiB:.1f} MiB + wheels at most "
                f"{self.wheels / MiB:.0f} MiB + {archive_name(self.arch)} at most {self.cache / MiB:.1f} MiB "
                f"({self.cubins} cubins, {self.reports} reports alone) = {self.total / MiB:.1f} MiB "
                f"of the {BUDGET_MIB} MiB budget ({LIMIT_MIB} MiB the device accepts)")


def estimate(arch: str, root: Path | None = None) -> Estimate:
    """An upper bound of the carry to a GPU of target `arch`, from the registry and the search
    space (no build, no download)."""
    from ..paths import repo_root

    builds = prebuild.carried(arch)
    return Estimate(arch, tree_bytes(root or repo_root()), WHEELS_MAX_MIB * MiB, sum(b.cubin for b in builds),
                    sum(not b.cubin for b in builds), archive_bound(builds))


# --- the archive -----------------------------------------------------------------------------------

def xz_alone(data: bytes) -> int:
    import lzma  # here, not above: a Python without it still bounds the carry, and a session builds instead

    return len(lzma.compress(data, preset=XZ_PRESET))


def pack(builds: list[prebuild.Build], dest: Path, arch: str) -> tuple[Path, int]:
    """The files of `builds` (built) as dest/prebuilt-<arch>.tar.xz, with a manifest naming the
    nvcc that made them; returns (the archive, the number of files). Raises ValueError when a file
    or the whole passes its bound: then the estimate is no bound, and the file's bound must grow."""
    import lzma

    from ..kernels.toolchain import nvcc_version

    files = list(dict.fromkeys(p for b in builds for p in b.files()))
    missing = [p.name for p in files if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"not built: {', '.join(missing[:5])}")
    contents = {p: p.read_bytes() for p in files}
    bounds = {b.files()[0]: cubin_bound(b) for b in builds if b.cubin}
    for path, data in contents.items():
        if path.suffix == ".ptxas" and len(data) > REPORT_MAX:
            raise ValueError(f"{path.name}: {len(data)} B, over REPORT_MAX ({REPORT_MAX} B)")
        if path.suffix == ".cubin" and (alone := xz_alone(data)) > bounds[path]:
            name = "CUBIN_XZ_MAX" if bounds[path] == CUBIN_XZ_MAX else "CUBIN_XZ_MAX_EARLY"
            raise ValueError(f"{path.name}: {alone} B compressed alone, over {name} ({bounds[path]} B)")
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / archive_name(arch)
    manifest = json.dumps({"arch": arch, "nvcc": nvcc_version(), "files": [p.name for p in files]}).encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in [(MANIFEST, manifest)] + [(f"cubin/{p.name}", d) for p, d in contents.items()]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    packed = lzma.compress(raw.getvalue(), preset=XZ_PRESET)
    bound = archive_bound(builds)
    if len(packed) > bound:
        raise ValueError(f"{target.name}: {len(packed)} B, over its estimate ({bound} B)")
    target.write_bytes(packed)
    return target, len(files)


_PLAIN = re.compile(r"cubin/[A-Za-z0-9_][A-Za-z0-9_.-]*")


def unpack(archive: Path, cache: Path) -> dict:
    """The archive's files into `cache` (attnlab's cache folder); returns its manifest. Only plain
    files under cubin/ with plain names are taken; anything else is refused whole."""
    with tarfile.open(archive, mode="r:xz") as tar:
        members = tar.getmembers()
        for m in members:
            if not (m.isfile() and (m.name == MANIFEST or _PLAIN.fullmatch(m.name))):
                raise ValueError(f"{archive.name}: refused entry {m.name!r}")
        manifest = json.loads(tar.extractfile(MANIFEST).read())
        for m in members:
            if m.name == MANIFEST:
                continue
            target = cache / m.name
            if target.is_file() and target.stat().st_size == m.size:  # unpacked by an earlier stage of the call
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
            tmp.write_bytes(tar.extractfile(m).read())
            tmp.replace(target)
    return manifest


def carried_archives(root: Path | None = None) -> list[Path]:
    """The prebuilt archives a copy of the tree holds (what gpu_prepare.sh made and the call carried)."""
    from ..paths import repo_root

    folder = (root or repo_root()) / CACHE_FOLDER
    return sorted(folder.glob("prebuilt-*.tar.xz"))


def main(argv=None) -> int:
    """python -m attnlab.session.carry [--arch sm_90]: the bound, then what is carried now; 1 over budget."""
    import argparse

    from ..paths import repo_root

    p = argparse.ArgumentParser(prog="python -m attnlab.session.carry", description=main.__doc__)
    p.add_argument("--arch", default="sm_90")
    args = p.parse_args(argv)
    bound = estimate(args.arch)
    print(bound.text())
    # what is carried now: the same tree the bound counted, .whl and .attnlab-cache as they are
    wheels = folder_bytes(repo_root() / ".whl")
    cache_files = [p for p in (repo_root() / CACHE_FOLDER).rglob("*") if p.is_file()]
    cache = sum(p.stat().st_size for p in cache_files)
    total = bound.tree + wheels + cache
    print(f"carried now: tree {bound.tree / MiB:.1f} MiB + .whl {wheels / MiB:.1f} MiB + {CACHE_FOLDER} "
          f"{cache / MiB:.1f} MiB ({len(cache_files)} files) = {total / MiB:.1f} MiB of the {BUDGET_MIB} MiB budget")
    problems = []
    if bound.total > BUDGET_MIB * MiB:
        problems.append(f"its bound passes the {BUDGET_MIB} MiB budget")
    if total > BUDGET_MIB * MiB:
        problems.append(f"the carry passes the {BUDGET_MIB} MiB budget")
    if wheels > bound.wheels:
        problems.append(f".whl holds more than WHEELS_MAX_MIB ({WHEELS_MAX_MIB} MiB)")
    for line in problems:
        print(f"too much to carry: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
