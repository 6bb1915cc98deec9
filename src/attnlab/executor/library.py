"""Load a kernel library built by attnlab.executor.build and launch its kernels.

A launch runs the whole grid on this thread and returns what the executor found: never a time.
Arguments are ctypes values in the kernel's parameter order; pointer arguments must be buffers
this library allocated (`alloc`), so that every global access can be checked against exact sizes.
"""
from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .build import build_library, source_lines
from .counts import LaunchCounts, declare, read_counts
from .trips import EntryBlocks, entry_blocks

# Launch options (runtime/runtime.h).
OPT_RACES = 1
OPT_BANKS = 2
OPT_PREEMPT = 4
OPT_COUNT = 8

BANK_KINDS = ("ldmatrix", "cp.async", "ld/st")
# thunk.h's parameter letters -> the ctypes value passed ('h', a __half, goes as its 16 bits).
_CTYPE_OF = {"p": ctypes.c_void_p, "P": ctypes.c_void_p, "b": ctypes.c_bool, "c": ctypes.c_int8,
             "C": ctypes.c_uint8, "s": ctypes.c_int16, "S": ctypes.c_uint16, "i": ctypes.c_int32,
             "u": ctypes.c_uint32, "l": ctypes.c_int64, "L": ctypes.c_uint64, "f": ctypes.c_float,
             "d": ctypes.c_double, "h": ctypes.c_uint16}
# Tokens in the runtime's messages (runtime.h, report): a code address, a byte of a global buffer.
_PC_TOKEN = re.compile(r"\{pc:([0-9a-f]+)\}")
_GLOBAL_TOKEN = re.compile(r"\{global:(\d+):(-?\d+)\}")


@dataclass(frozen=True)
class BufferInfo:
    """What a global buffer holds, so that a finding can name its bytes: `name[i][j]`."""
    name: str
    itemsize: int = 1
    shape: tuple[int, ...] | None = None

    def element(self, offset: int) -> str:
        index, byte = divmod(offset, self.itemsize)
        count = 1
        for extent in self.shape or ():
            count *= extent
        if self.shape and 0 <= index < count:
            idx = []
            for extent in reversed(self.shape):
                idx.append(index % extent)
                index //= extent
            text = self.name + "".join(f"[{i}]" for i in reversed(idx))
        else:
            text = f"{self.name}[{index}]"
        return text + (f" (byte {byte})" if byte else "")


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
    bytes: int = 0        # distinct bytes the hazard touched (0: not a memory hazard)
    threads: int = 0      # distinct threads that met it

    def hazard(self) -> str:
        """The hazard: its kind at its pair of source sites (as racecheck groups them)."""
        return f"{self.kind} at {self.where}" + (f" and {self.other_where}" if self.other_where else "")

    def line(self, kernel: str = "") -> str:
        head = f"{kernel}: " if kernel else ""
        who = f"block {self.block}" + (f", warp {self.warp} lane {self.lane}" if self.warp >= 0 else "")
        text = f"{head}{self.kind}: {self.message} ({who}, at {self.where}"
        if self.other_warp >= 0:
            text += f"; the other side: warp {self.other_warp} lane {self.other_lane}"
            text += f" at {self.other_where}" if self.other_where else ""
        elif self.other_where:
            text += f"; the other side at {self.other_where}"
        text += ")"
        tally = [f"x{self.count}"] if self.count > 1 else []
        if self.bytes:
            tally.append(f"{self.bytes} byte{'s' * (self.bytes != 1)}")
        if self.threads > 1:
            tally.append(f"{self.threads} threads")
        return text + (f" [{', '.join(tally)}]" if tally else "")


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
    stdout: str = ""                      # what the kernel's printf calls wrote

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
                            self.counts + later.counts, self.stdout + later.stdout)


class Library:
    """One built kernel library: its buffers and its launches (not thread-safe: one launch at a time)."""

    def __init__(self, path: Path, src_dir: Path | None = None):
        self.path = Path(path)
        self.src_dir = src_dir  # where its sources are, when not kernels/ (their loops are read from there)
        self._lib = ctypes.CDLL(str(self.path), mode=ctypes.RTLD_LOCAL)
        self._lib.attn_cpu_alloc.restype = ctypes.c_void_p
        self._lib.attn_cpu_alloc.argtypes = [ctypes.c_size_t]
        self._lib.attn_cpu_launch.restype = ctypes.c_int
        self._lib.attn_cpu_launch.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)] + \
            [ctypes.c_uint] * 6 + [ctypes.c_size_t, ctypes.c_uint64, ctypes.c_uint, ctypes.c_double]
        self._lib.attn_cpu_report.restype = ctypes.c_size_t
        self._lib.attn_cpu_report.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        self._lib.attn_cpu_stdout.restype = ctypes.c_size_t
        self._lib.attn_cpu_stdout.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        self._lib.attn_cpu_mark_read_only.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self._lib.attn_cpu_buffer_base.restype = ctypes.c_void_p
        self._lib.attn_cpu_buffer_base.argtypes = [ctypes.c_void_p]
        self.buffers: list[BufferInfo] = []  # the live buffers, in allocation order (the runtime's indices)
        self._lib.attn_cpu_banks.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
        declare(self._lib)

    def signature(self, entry: str) -> str:
        fn = getattr(self._lib, f"attn_cpu_signature_{entry}")
        fn.restype = ctypes.c_char_p
        return fn().decode()

    def alloc(self, nbytes: int, name: str | None = None, itemsize: int = 1, shape=None) -> int:
        """A global buffer of `nbytes`; `name`, `itemsize` and `shape` name its bytes in findings."""
        ptr = self._lib.attn_cpu_alloc(int(nbytes))
        if not ptr:
            raise MemoryError(f"the executor could not map {nbytes} bytes")
        self.buffers.append(BufferInfo(name or f"global buffer {len(self.buffers)}", int(itemsize),
                                       tuple(int(x) for x in shape) if shape is not None else None))
        return ptr

    def free_all(self) -> None:
        self._lib.attn_cpu_free_all()
        self.buffers = []

    def launch(self, entry: str, grid, block, shared_bytes: int, args, seed: int = 0, races: bool = True,
               banks: bool = False, preempt: bool = True, time_limit: float = 300.0, count: bool = False,
               trace_block: int | None = None, block_range: tuple[int, ...] | None = None,
               buffers=None) -> LaunchReport:
        """Run the grid. `count`: also count what it did, per instruction site and per block
        (attnlab.executor.counts), and record every event of block `trace_block` (its linear index;
        None: no trace). `block_range`: run only the blocks [lo, hi) of the grid, or (lo, hi, step) every
        step-th of them, and read back the bytes each buffer had touched (a share of a counted launch;
        attnlab.executor.trace).
        `buffers`: (name, itemsize, shape) per global buffer in allocation order, naming their bytes
        in findings (default: what `alloc` was told)."""
        sig = self.signature(entry)
        if len(args) != len(sig):
            raise TypeError(f"{entry} takes {len(sig)} arguments ({sig}); got {len(args)}")
        values = []
        for i, (code, value) in enumerate(zip(sig, args)):
            ctype = _CTYPE_OF.get(code)
            if ctype is None:
                raise TypeError(f"{entry}: parameter {i} has a type the executor does not pass")
            if code == "h":  # a __half by value: its bits
                import numpy as np
                value = int(np.float16(value).view(np.uint16))
            values.append(ctype(value))
        self._mark_read_only(sig, args)
        argv = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        options = (OPT_RACES if races else 0) | (OPT_BANKS if banks else 0) | (OPT_PREEMPT if preempt else 0) | \
            (OPT_COUNT if count else 0)
        thunk = ctypes.cast(getattr(self._lib, f"attn_cpu_thunk_{entry}"), ctypes.c_void_p)
        self._lib.attn_cpu_set_trace_block(ctypes.c_long(-1 if trace_block is None else int(trace_block)))
        lo, hi, step = (tuple(block_range) + (1,))[:3] if block_range is not None else (0, -1, 1)
        self._lib.attn_cpu_set_block_range(lo, hi, step)
        blocks = self._count_trips(entry) if count else None
        try:
            rc = self._lib.attn_cpu_launch(thunk, argv, *grid, *block, int(shared_bytes), int(seed) & (2**64 - 1),
                                           options, float(time_limit))
        finally:
            self._lib.attn_cpu_set_block_range(0, -1, 1)
        counts = [read_counts(self._lib, self.path, entry, grid, block, trace_block,
                              touched=block_range is not None, trip_blocks=blocks)] if count else []
        names = [BufferInfo(*b) for b in buffers] if buffers is not None else list(self.buffers)
        return LaunchReport(completed=rc == 0, findings=self._findings(names), banks=self._banks(), counts=counts,
                            stdout=self._text(self._lib.attn_cpu_stdout))

    def _count_trips(self, entry: str) -> EntryBlocks:
        """Give the runtime the blocks `entry` reaches, the loops they end trips of and the (line,
        loop) pairs they record (attnlab.executor.trips), so that a counted launch counts on how many
        trips of each loop each line ran."""
        blocks = entry_blocks(self.path, entry, self.src_dir)
        n = len(blocks.offsets)

        def csr(rows):
            return (np.cumsum([0] + [len(r) for r in rows], dtype=np.int32),
                    np.asarray([x for r in rows for x in r] or [0], np.int32))

        arrays = (*csr(blocks.ends), *csr(blocks.records), np.asarray([h for _, h in blocks.pairs] or [0], np.int32))
        self._lib.attn_cpu_set_trip_sites(np.asarray(blocks.offsets, np.uint64).ctypes.data, n,
                                          *[a.ctypes.data for a in arrays], len(blocks.pairs), len(blocks.loops))
        return blocks

    def _mark_read_only(self, sig: str, args) -> None:
        """Tell the runtime which buffers this launch reaches only through pointers to const ('P'):
        their reads need no race shadow. A buffer also passed as a plain pointer is not one."""
        const, plain = set(), set()
        for code, value in zip(sig, args):
            if code in "pP" and value:
                (const if code == "P" else plain).add(int(value))
        for ptr in plain:
            self._lib.attn_cpu_mark_read_only(ctypes.c_void_p(ptr), 0)
        for ptr in const:
            self._lib.attn_cpu_mark_read_only(ctypes.c_void_p(ptr), 0 if self._same_buffer(ptr, plain) else 1)

    def _same_buffer(self, ptr: int, others) -> bool:
        """Whether `ptr` lies in a buffer that one of `others` also points into."""
        base = self._lib.attn_cpu_buffer_base(ctypes.c_void_p(ptr))
        return any(self._lib.attn_cpu_buffer_base(ctypes.c_void_p(o)) == base for o in others) if base else False

    @staticmethod
    def _text(api) -> str:
        n = api(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        api(buf, n + 1)
        return buf.raw[:n].decode(errors="replace")

    def _findings(self, buffers: list[BufferInfo]) -> list[Finding]:
        rows = [line.split("\t", 11) for line in self._text(self._lib.attn_cpu_report).splitlines() if line]
        token_pcs = [int(h, 16) for r in rows for h in _PC_TOKEN.findall(r[11])]
        places = source_lines(self.path, [int(r[5], 16) for r in rows] + [int(r[8], 16) for r in rows] + token_pcs)

        def global_name(m) -> str:
            index, offset = int(m.group(1)), int(m.group(2))
            if index < len(buffers):
                return buffers[index].element(offset)
            return f"byte {offset} of global buffer {index}"

        out = []
        for kind, count, block, warp, lane, pc, owarp, olane, pc2, nbytes, nthreads, message in rows:
            where, other_where = places.get(int(pc, 16), "?"), places.get(int(pc2, 16), "") if int(pc2, 16) else ""
            if kind == "divergent barrier" and where == other_where:
                continue  # one __syncthreads the compiler duplicated (a peeled loop), not two in the source
            message = _PC_TOKEN.sub(lambda m: places.get(int(m.group(1), 16), "?"), message)
            message = _GLOBAL_TOKEN.sub(global_name, message)
            out.append(Finding(kind=kind, message=message, block=tuple(int(x) for x in block.split(",")),
                               warp=int(warp), lane=int(lane), where=where, count=int(count),
                               other_warp=int(owarp), other_lane=int(olane), other_where=other_where,
                               bytes=int(nbytes), threads=int(nthreads)))
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
        _loaded[path] = Library(path, Path(src_dir) if src_dir is not None else None)
    return _loaded[path]
