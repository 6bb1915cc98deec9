"""What one launch did on the CPU executor, counted as it ran (runtime/instrument.cpp): per
instruction site, per block (CTA), the distinct global bytes, and the events of one traced block.

These are measurements of execution, exact and the same on every run: how many bytes, requests,
wavefronts, sectors, tensor-core instructions, exponentials, barriers and shuffles the kernel's
threads made. They are never times.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .build import source_lines
from .trips import EntryBlocks

# runtime.h SiteKind, in order.
SITE_KINDS = ("shared load", "shared store", "global load", "global store", "ldmatrix", "cp.async", "mma.sync",
              "wmma load", "wmma store", "wmma mma", "shuffle", "__syncwarp", "bar.sync", "bar.arrive", "exp",
              "cp.async commit", "cp.async wait")
# runtime.h EventKind, in order.
EVENT_KINDS = ("access", "ldmatrix", "mma.sync", "wmma load", "wmma store", "wmma mma", "shuffle", "__syncwarp",
               "cp.async", "commit", "wait_group", "bar.sync", "bar.arrive", "exit")
# instrument.cpp BlockCounts, in order.
BLOCK_FIELDS = ("global_read", "global_write", "shared_requests", "shared_wavefronts", "shared_ideal",
                "tensor_flops", "exps", "barriers", "shuffles", "cp_async_bytes", "global_sectors")
# instrument.cpp Event (48 bytes). buffer: -1 shared memory, -2 none, else a global buffer's index.
# An access event is `count` accesses of `bytes` each at offset, offset + stride, ...; `epoch`
# numbers its warp's meetings: the k-th accesses of the lanes at one site in one epoch are one request.
# A cp.async event writes `bytes` (16) of shared memory at offset and reads `extra` of them from global.
EVENT_DTYPE = np.dtype([("offset", "<u8"), ("seq", "<u4"), ("site", "<u4"), ("bytes", "<u4"), ("count", "<u4"),
                        ("stride", "<i4"), ("arg", "<i4"), ("step", "<u2"), ("buffer", "<i2"), ("warp", "u1"),
                        ("lane", "u1"), ("kind", "u1"), ("write", "u1"), ("epoch", "<u4"), ("extra", "<u4")])
WARP_EVENT_LANE = 255  # the lane of an event that belongs to the whole warp (mma, shuffle, ...)
# The units a memory site's requests are served in.
UNIT_OF = {"shared load": "wavefronts", "shared store": "wavefronts", "ldmatrix": "wavefronts",
           "cp.async": "wavefronts", "global load": "sectors", "global store": "sectors"}


@dataclass(frozen=True)
class SiteCount:
    """One instruction site (a source line; a line with several accesses has several sites) and
    kind: lanes that executed it, the warp-wide instructions (requests) it made, the bytes they
    moved, and for memory the units a GPU serves them in (shared: wavefronts, global: 32-byte
    sectors) next to the fewest possible (ideal)."""
    where: str
    kind: str
    lanes: int
    requests: int
    bytes: int
    units: int
    ideal: int

    @property
    def excess(self) -> int:
        """Units past the ideal: bank-conflict wavefronts, or sectors an uncoalesced request wastes."""
        return self.units - self.ideal


@dataclass
class LaunchCounts:
    """The counts of one launch (a kernel entry over its whole grid)."""
    entry: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    sites: list[SiteCount]
    blocks: np.ndarray                      # [blocks in linear order, len(BLOCK_FIELDS)] int64
    distinct: list[tuple[int, int]]         # per global buffer (allocation order): bytes read, written
    events: np.ndarray                      # EVENT_DTYPE, the traced block's (empty without one)
    traced_block: int | None = None
    truncated: bool = False                 # the trace stopped at its cap (the counts did not)
    buffers: list[str] = field(default_factory=list)  # names of the global buffers, when the caller gave them
    # for merging the counts of launches that each ran a share of one grid (attnlab.executor.trace):
    site_pcs: list[int] = field(default_factory=list)  # each site's instruction, as a module offset
    touched: list[np.ndarray] | None = None            # per buffer, per byte: 1 read, 2 written
    # per block (CTA), per (line, loop) pair of trip_blocks.pairs: on how many trips of the loop
    # the CTA's warps ran the line, summed over warps (runtime/trips.cpp)
    trip_runs: np.ndarray | None = None
    trip_blocks: EntryBlocks | None = None

    def block_field(self, name: str) -> np.ndarray:
        return self.blocks[:, BLOCK_FIELDS.index(name)]

    def total(self, name: str) -> int:
        return int(self.block_field(name).sum())


def _array(lib, fn: str, width: int, dtype=ctypes.c_longlong):
    n = getattr(lib, fn)(None, 0)
    buf = (dtype * max(1, n * width))()
    getattr(lib, fn)(buf, n)
    return np.frombuffer(buf, dtype=np.int64)[: n * width].reshape(n, width).copy() if n else np.zeros((0, width), np.int64)


# The C API that reads them (instrument.cpp): each takes (out, capacity) and returns how many rows it has.
COUNT_FUNCTIONS = ("attn_cpu_sites", "attn_cpu_block_counts", "attn_cpu_distinct_bytes", "attn_cpu_trace")


def declare(lib) -> None:
    """Give `lib` (a ctypes.CDLL of a kernel library) the prototypes of COUNT_FUNCTIONS, once."""
    for fn in COUNT_FUNCTIONS:
        getattr(lib, fn).restype = ctypes.c_long
        getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.c_long]
    lib.attn_cpu_touched.restype = ctypes.c_long
    lib.attn_cpu_touched.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_long]
    lib.attn_cpu_set_block_range.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_long]
    lib.attn_cpu_set_trip_sites.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p,
                                            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long,
                                            ctypes.c_int]
    lib.attn_cpu_trip_runs.restype = ctypes.c_long
    lib.attn_cpu_trip_runs.argtypes = [ctypes.c_void_p, ctypes.c_long]
    lib.attn_cpu_trip_pairs.restype = ctypes.c_long


def _touched(lib, buffers: int) -> list[np.ndarray]:
    out = []
    for i in range(buffers):
        flags = np.zeros(lib.attn_cpu_touched(i, None, 0), np.uint8)
        if len(flags):
            lib.attn_cpu_touched(i, flags.ctypes.data, len(flags))
        out.append(flags)
    return out


def _trip_runs(lib, blocks: int) -> np.ndarray | None:
    """Per block, per (line, loop) pair, the trips counted; None where the runtime's rows are not
    the launch's blocks (then no trip count is given, rather than zeros)."""
    pairs = lib.attn_cpu_trip_pairs()
    out = np.zeros((blocks, pairs), np.uint32)
    if pairs == 0:
        return out.astype(np.int64)
    if lib.attn_cpu_trip_runs(None, 0) != blocks:
        return None
    lib.attn_cpu_trip_runs(out.ctypes.data, blocks)
    return out.astype(np.int64)


def read_counts(lib, path: Path, entry: str, grid, block, trace_block: int | None,
                touched: bool = False, trip_blocks: EntryBlocks | None = None) -> LaunchCounts:
    """The counts of the launch `lib` (a ctypes.CDLL of a kernel library, declare()d) just ran;
    `touched`, with each buffer's bytes as the launch touched them (to merge shares of a grid);
    `trip_blocks`, the basic blocks it counted trips for (attnlab.executor.trips)."""
    raw_sites = _array(lib, "attn_cpu_sites", 7)
    places = source_lines(path, [int(r[0]) for r in raw_sites])
    sites = [SiteCount(places.get(int(r[0]), "?"), SITE_KINDS[int(r[1])], *(int(x) for x in r[2:])) for r in raw_sites]
    width = lib.attn_cpu_block_fields()
    assert width == len(BLOCK_FIELDS), "runtime and attnlab.executor.counts disagree on the block counts"
    blocks = _array(lib, "attn_cpu_block_counts", width)
    distinct = [tuple(int(x) for x in r) for r in _array(lib, "attn_cpu_distinct_bytes", 2)]
    n = lib.attn_cpu_trace(None, 0)
    events = np.zeros(n, dtype=EVENT_DTYPE)
    if n:
        lib.attn_cpu_trace(events.ctypes.data, n)
    return LaunchCounts(entry, tuple(grid), tuple(block), sites, blocks, distinct, events,
                        trace_block, bool(lib.attn_cpu_trace_truncated()),
                        site_pcs=[int(r[0]) for r in raw_sites],
                        touched=_touched(lib, len(distinct)) if touched else None,
                        trip_runs=_trip_runs(lib, len(blocks)) if trip_blocks is not None else None, trip_blocks=trip_blocks)
