"""Load a kernel library built by attnlab.executor.build and launch its kernels.

A launch runs the whole grid on this thread and returns what the executor found: never a time.
Arguments are ctypes values in the kernel's parameter order; pointer arguments must be buffers
this library allocated (`alloc`), so that every global access can be checked against exact sizes.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path

from .build import build_library, source_lines
from .counts import LaunchCounts, declare, read_counts

# Launch options (runtime/runtime.h).
OPT_RACES = 1
OPT_BANKS = 2
OPT_PREEMPT = 4
OPT_COUNT = 8

BANK_KINDS = ("ldmatrix", "cp.async", "ld/st")
_CTYPE_OF = {"p": ctypes.c_void_p, "i": ctypes.c_int32, "u": ctypes.c_uint32, "f": ctypes.c_float,
             "l": ctypes.c_int64, "d": ctypes.c_double}


@dataclass(frozen=True)
class Finding:
    """One thing a sanitizer would report (deduplicated by kind and place; `count` repeats)."""
    kind: str
    message: str
    block: tuple[int, int, int]
    warp: int
    lane: int
    where: str
    count: int = 1
    other_warp: int = -1
    other_lane: int = -1
    other_where: str = ""

    def line(self, kernel: str = "") -> str:
        head = f"{kernel}: " if kernel else ""
        who = f"block {self.block}" + (f", warp {self.warp} lane {self.lane}" if self.warp >= 0 else "")
        text = f"{head}{self.kind}: {self.message} ({who}, at {self.where}"
        if self.other_warp >= 0 or self.other_where:
            text += f"; the other side: warp {self.other_warp} lane {self.other_lane}"
            text += f" at {self.other_where}" if self.other_where else ""
        text += ")"
        return text + (f" [x{self.count}]" if self.count > 1 else "")


@dataclass
class BankCounts:
    requests: int
    wavefronts: int
    ideal: int

    @property
    def conflict_ratio(self) -> float:
        """Wavefronts per ideal wavefront: 1.0 means no bank conflicts."""
        return self.wavefronts / self.ideal if self.ideal else 1.0


@dataclass
class LaunchReport:
    completed: bool                       # every block ran to its end (no deadlock, abort or timeout)
    findings: list[Finding] = field(default_factory=list)
    banks: dict[str, BankCounts] = field(default_factory=dict)
    counts: list[LaunchCounts] = field(default_factory=list)  # one per launch made with count=True

    @property
    def clean(self) -> bool:
        return self.completed and not self.findings

    def merged(self, later: "LaunchReport") -> "LaunchReport":
        """This launch and a later one of the same computation as one report: completed if both did,
        both launches' findings, bank counts summed."""
        banks = {kind: BankCounts(*(getattr(self.banks[kind], f) + getattr(later.banks[kind], f)
                                    for f in ("requests", "wavefronts", "ideal")))
                 for kind in self.banks.keys() & later.banks.keys()}
        return LaunchReport(self.completed and later.completed, self.findings + later.findings, banks,
                            self.counts + later.counts)


class Library:
    """One built kernel library: its buffers and its launches (not thread-safe: one launch at a time)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lib = ctypes.CDLL(str(self.path), mode=ctypes.RTLD_LOCAL)
        self._lib.attn_cpu_alloc.restype = ctypes.c_void_p
        self._lib.attn_cpu_alloc.argtypes = [ctypes.c_size_t]
        self._lib.attn_cpu_launch.restype = ctypes.c_int
        self._lib.attn_cpu_launch.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)] + \
            [ctypes.c_uint] * 6 + [ctypes.c_size_t, ctypes.c_uint64, ctypes.c_uint, ctypes.c_double]
        self._lib.attn_cpu_report.restype = ctypes.c_size_t
        self._lib.attn_cpu_report.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        self._lib.attn_cpu_banks.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
        declare(self._lib)

    def signature(self, entry: str) -> str:
        fn = getattr(self._lib, f"attn_cpu_signature_{entry}")
        fn.restype = ctypes.c_char_p
        return fn().decode()

    def alloc(self, nbytes: int) -> int:
        ptr = self._lib.attn_cpu_alloc(int(nbytes))
        if not ptr:
            raise MemoryError(f"the executor could not map {nbytes} bytes")
        return ptr

    def free_all(self) -> None:
        self._lib.attn_cpu_free_all()

    def launch(self, entry: str, grid, block, shared_bytes: int, args, seed: int = 0, races: bool = True,
               banks: bool = False, preempt: bool = True, time_limit: float = 300.0, count: bool = False,
               trace_block: int | None = None, block_range: tuple[int, int] | None = None) -> LaunchReport:
        """Run the grid. `count`: also count what it did, per instruction site and per block
        (attnlab.executor.counts), and record every event of block `trace_block` (its linear index;
        None: no trace). `block_range`: run only the blocks [lo, hi) of the grid, and read back the
        bytes each buffer had touched (a share of a counted launch; attnlab.executor.trace)."""
        sig = self.signature(entry)
        if len(args) != len(sig):
            raise TypeError(f"{entry} takes {len(sig)} arguments ({sig}); got {len(args)}")
        values = []
        for i, (code, value) in enumerate(zip(sig, args)):
            ctype = _CTYPE_OF.get(code)
            if ctype is None:
                raise TypeError(f"{entry}: parameter {i} has a type the executor does not pass")
            values.append(ctype(value))
        argv = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        options = (OPT_RACES if races else 0) | (OPT_BANKS if banks else 0) | (OPT_PREEMPT if preempt else 0) | \
            (OPT_COUNT if count else 0)
        thunk = ctypes.cast(getattr(self._lib, f"attn_cpu_thunk_{entry}"), ctypes.c_void_p)
        self._lib.attn_cpu_set_trace_block(ctypes.c_long(-1 if trace_block is None else int(trace_block)))
        self._lib.attn_cpu_set_block_range(*(block_range or (0, -1)))
        try:
            rc = self._lib.attn_cpu_launch(thunk, argv, *grid, *block, int(shared_bytes), int(seed) & (2**64 - 1),
                                           options, float(time_limit))
        finally:
            self._lib.attn_cpu_set_block_range(0, -1)
        counts = [read_counts(self._lib, self.path, entry, grid, block, trace_block,
                              touched=block_range is not None)] if count else []
        return LaunchReport(completed=rc == 0, findings=self._findings(), banks=self._banks(), counts=counts)

    def _findings(self) -> list[Finding]:
        n = self._lib.attn_cpu_report(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        self._lib.attn_cpu_report(buf, n + 1)
        rows = [line.split("\t", 9) for line in buf.value.decode(errors="replace").splitlines() if line]
        places = source_lines(self.path, [int(r[5], 16) for r in rows] + [int(r[8], 16) for r in rows])
        out = []
        for kind, count, block, warp, lane, pc, owarp, olane, pc2, message in rows:
            out.append(Finding(kind=kind, message=message, block=tuple(int(x) for x in block.split(",")),
                               warp=int(warp), lane=int(lane), where=places.get(int(pc, 16), "?"), count=int(count),
                               other_warp=int(owarp), other_lane=int(olane),
                               other_where=places.get(int(pc2, 16), "") if int(pc2, 16) else ""))
        return out

    def _banks(self) -> dict[str, BankCounts]:
        raw = (ctypes.c_longlong * 9)()
        self._lib.attn_cpu_banks(raw)
        return {name: BankCounts(raw[3 * i], raw[3 * i + 1], raw[3 * i + 2]) for i, name in enumerate(BANK_KINDS)}


_loaded: dict[Path, Library] = {}


def load(source: str, entries, defines=(), src_dir=None) -> Library:
    """The library of `source` with `entries`, built if needed, loaded once per process."""
    path = build_library(source, entries, defines, src_dir)
    if path not in _loaded:
        _loaded[path] = Library(path)
    return _loaded[path]
