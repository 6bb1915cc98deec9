"""Warp instructions a CTA issues, from the binary's SASS and the executor's counts: the time model's
instruction-issue bound (attnlab.model.bounds).

The executor runs the CUDA C++ on a CPU and never sees SASS; cuobjdump's listing shows each
instruction once, not how often it runs. The two meet at the key-tile loop: the loop of the entry's
SASS that holds the most of a marker instruction whose executions the executor counts, HMMA (one
per mma.sync.m16n8k16 a warp runs: its tensor-core FLOPs over 4096) or MUFU.EX2 (one per 32
exponentials, a full warp's). A CTA then issues

    loop instructions x (markers the CTA ran / markers in the loop)  +  the rest x warps,

every instruction outside the loop counted once per warp. That holds where the loop is the whole
of the hot path: no loop inside it (whose trip count the listing does not give), none around it
(whose other instructions it would miss) and no second copy of it (a version the compiler made for
another path, of which the listing does not say which runs). Elsewhere the issue bound is not
given, and says why.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..executor.trace import MMA_FLOPS
from ..kernels import registry, sass_loop
from ..kernels.static import build, opcode

MARKERS = ("HMMA", "MUFU.EX2")
LANES_PER_MUFU = 32            # a full warp's exponentials per MUFU.EX2 (divergent rows issue more)


@dataclass(frozen=True)
class LoopShape:
    """The key-tile loop of one entry point's SASS, or why it cannot stand for the hot path."""
    entry: str
    arch: str
    marker: str | None           # HMMA or MUFU.EX2
    markers_per_trip: int        # of the marker in the loop body
    inside: int                  # instructions in the loop body (one trip)
    outside: int                 # instructions of the entry outside it (on a converged warp's path)
    why_not: str | None = None   # set where the loop is not the whole hot path


@functools.lru_cache(maxsize=None)
def loop_shape(kernel: str, arch: str, entry: str) -> LoopShape:
    """The key-tile loop of `entry` in `kernel`'s build for `arch` (nvcc and cuobjdump, cached)."""
    spec = registry.get(kernel, arch)
    lines = sass_loop.listing(build(spec, arch).sass, entry)
    for marker in MARKERS:
        try:
            loop = sass_loop.main_loop(lines, marker)
        except ValueError:
            continue
        loops = sass_loop.loops(lines)

        def markers(x):
            return sum(1 for off, ins in lines if x[0] <= off <= x[1] and opcode(ins).startswith(marker))

        inner = [x for x in loops if x != loop and loop[0] <= x[0] and x[1] <= loop[1]]
        outer = [x for x in loops if x != loop and x[0] <= loop[0] and loop[1] <= x[1]]
        versions = [x for x in loops if x != loop and x not in outer and markers(x)]
        per_trip = markers(loop)
        ins, out = sass_loop.inside_and_outside(lines, loop)
        why = (f"{len(inner)} loop(s) inside the key-tile loop, whose trip counts the SASS does not give" if inner
               else "the key-tile loop sits inside another loop" if outer
               else f"{1 + len(versions)} loops hold {marker} (the compiler's versions of the key-tile loop), "
                    f"and which of them runs the listing does not say" if versions else None)
        return LoopShape(entry, arch, marker, per_trip, sum(ins.values()), sum(out.values()), why)
    return LoopShape(entry, arch, None, 0, 0, 0, "no loop holds an HMMA or a MUFU.EX2")


def marker_runs(shape: LoopShape, tensor_flops: np.ndarray, exps: np.ndarray) -> np.ndarray:
    """Per CTA, how many of the loop's marker instructions its warps ran, from the executor's counts."""
    if shape.marker == "HMMA":
        return tensor_flops / MMA_FLOPS  # one HMMA.16816 per mma.sync.m16n8k16 of a warp
    return exps / LANES_PER_MUFU


def warp_instructions(shape: LoopShape, tensor_flops: np.ndarray, exps: np.ndarray, warps: int) -> np.ndarray | None:
    """Per CTA, the warp instructions it issues (None where the loop does not stand for the hot path)."""
    if shape.why_not:
        return None
    trips = marker_runs(shape, np.asarray(tensor_flops, float), np.asarray(exps, float)) / shape.markers_per_trip
    return shape.inside * trips + shape.outside * warps
