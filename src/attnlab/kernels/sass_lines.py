"""Where each SASS instruction of a kernel comes from in its source: nvdisasm's -gi listing of the
cubin (built with -lineinfo, attnlab.kernels.compile) names, above each instruction, its source line
and every line it was inlined at.

attnlab.model.issue reads it to tell the instructions of a key-tile loop's guarded parts (a copy
under `if (next < tile1)`, a mask under `if (need_mask)`) from those that run on every trip.
The table of one cubin is cached beside attnlab's other caches, per nvdisasm version.
"""
from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path

from ..paths import cache_dir
from . import toolchain
from .compile import nvcc_cubin, write_atomic
from .registry import KernelSpec

Frame = tuple[str, int]  # (file name, line)

_SECTION = re.compile(r"^\.text\.(\S+):")
_FRAME = re.compile(r'^\s*//## File "([^"]+)", line (\d+)(?: inlined at "[^"]+", line \d+)?')
_OFFSET = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/")


def parse(listing: str) -> dict[str, dict[int, tuple[Frame, ...]]]:
    """Per function, offset -> its frames innermost first ((file name, line); the file's path
    dropped), from nvdisasm -gi's listing: a chain of comments, each line "inlined at" the next,
    the last one without. An instruction with no comment above it keeps the frames before it."""
    out: dict[str, dict[int, tuple[Frame, ...]]] = {}
    table: dict[int, tuple[Frame, ...]] | None = None
    frames: tuple[Frame, ...] = ()
    chain: list[Frame] = []
    complete = True  # the chain being read has reached its outermost line
    for line in listing.splitlines():
        if m := _SECTION.match(line):
            table = out.setdefault(m.group(1), {})
            frames, chain, complete = (), [], True
        elif table is None:
            continue
        elif m := _FRAME.match(line):
            if complete:
                chain = []
            chain.append((Path(m.group(1)).name, int(m.group(2))))
            complete = "inlined at" not in line
        elif m := _OFFSET.match(line):
            if chain:
                frames, chain, complete = tuple(chain), [], True
            table[int(m.group(1), 16)] = frames
    return out


@functools.lru_cache(maxsize=16)
def _tables(cubin: Path) -> dict:
    """Every function's line table of one cubin, as cached on disk (JSON: offsets as strings), read
    once per process however many of its entries are asked for."""
    cached = cache_dir() / "sass-lines" / f"{cubin.stem}-nvdisasm-{toolchain.nvdisasm_version()}.json"
    if cached.exists():
        return json.loads(cached.read_text())
    proc = subprocess.run([toolchain.nvdisasm(), "-gi", str(cubin)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"nvdisasm failed on {cubin.name}: {proc.stderr.strip()[:300]}")
    tables = {name: {str(off): [list(f) for f in frames] for off, frames in table.items()}
              for name, table in parse(proc.stdout).items()}
    cached.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(cached, json.dumps(tables, separators=(",", ":")))
    return tables


def line_table(spec: KernelSpec, arch: str, function: str) -> dict[int, tuple[Frame, ...]]:
    """offset -> frames (innermost first) of each instruction of `function` in `spec`'s cubin for
    `arch` (nvcc and nvdisasm, cached)."""
    cubin, _ = nvcc_cubin(spec, arch)
    return {int(off): tuple((f, int(line)) for f, line in frames)
            for off, frames in _tables(cubin).get(function, {}).items()}
