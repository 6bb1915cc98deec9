"""Static inspection without a GPU: build each kernel with nvcc for a target, read ptxas's
resource report (registers, shared memory, stack, spills) and count the SASS instructions.

nvcc and cuobjdump come from this environment's CUDA wheels (`attnlab.kernels.toolchain`). Builds and SASS
listings are cached on disk by everything that decides them (`attnlab.kernels.compile.build_key`, and
cuobjdump's version), so a second inspection of unchanged kernels compiles nothing.
"""
from __future__ import annotations

import re
import subprocess
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from . import toolchain
from .compile import nvcc_cubin, write_atomic
from .registry import KernelSpec

ARCHES = ("sm_80", "sm_89", "sm_90")

# Instruction classes a reader cares about, by SASS opcode (before the first dot), in the order the
# figures stack them (attnlab.book.plot.CLASS_COLORS gives each its one colour in every figure). A dotted
# member (HADD2.F32) is matched exactly and wins over its base opcode (HADD2).
SASS_CLASSES = {
    "tensor core": {"HMMA", "IMMA", "HGMMA"},
    "fp32 math": {"FFMA", "FMUL", "FADD", "FMNMX", "FSETP", "FSEL", "MUFU", "FCHK", "FSWZADD"},
    "fp16 math": {"HFMA2", "HMUL2", "HADD2", "HMNMX2", "HSETP2"},
    "conversion": {"F2F", "F2FP", "I2F", "I2FP", "F2I", "HADD2.F32"},
    # integer arithmetic, compares and predicate logic (addresses, loop counters, the bounds guards),
    # on the vector and the uniform datapath, and register moves: HFMA2.MMA with zero operands is the
    # compiler's move of a constant, and CS2R ..., SRZ zeroes a register pair
    "integer & address": {"IMAD", "IADD3", "IADD", "IMUL", "LEA", "LOP3", "LOP", "SHF", "SHL", "SHR",
                          "ISETP", "IMNMX", "IABS", "VIADD", "VIMNMX", "VIADDMNMX", "POPC", "FLO", "BREV",
                          "BMSK", "SEL", "PRMT", "MOV", "CS2R", "P2R", "R2P", "PLOP3", "R2UR", "HFMA2.MMA",
                          "UIMAD", "UIADD3", "ULEA", "ULOP3", "ULOP", "USHF", "UISETP", "USEL", "UMOV",
                          "UPRMT", "UFLO", "UPOPC", "UBREV", "UPLOP3", "UP2UR"},
    "global load": {"LDG"},
    "global store": {"STG"},
    "async copy": {"LDGSTS", "LDGDEPBAR", "DEPBAR"},
    "shared load": {"LDS", "LDSM"},
    "shared store": {"STS"},
    "local (spill)": {"LDL", "STL"},
    "shuffle": {"SHFL"},
    # block-level synchronization only: BAR.SYNC (__syncthreads, a named bar.sync) and BAR.ARV
    "barrier": {"BAR"},
    # warp convergence, which ptxas inserts around divergent branches and collectives: no thread
    # of another warp waits on these
    "convergence": {"BSSY", "BSYNC", "BREAK", "BMOV", "WARPSYNC", "ENDCOLLECTIVE"},
    "control flow": {"BRA", "BRX", "JMP", "JMX", "CALL", "RET", "EXIT", "YIELD", "KILL", "BPT"},
}
# Everything else (NOP padding, S2R/S2UR special-register reads, LDC/ULDC constant loads) is "other".
CLASSES = (*SASS_CLASSES, "other")

_FUNC = re.compile(r"Function properties for (\S+)")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


@dataclass
class FunctionResources:
    name: str
    registers: int
    static_smem: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int
    # The most dynamic shared memory the registry id launches this function with (0 for a helper
    # such as FlashAttention-2's combine, and as parsed, before inspect_kernel attributes it).
    dynamic_smem: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


@dataclass
class StaticReport:
    kernel: str
    arch: str
    functions: list[FunctionResources]         # the functions this id launches, nothing else of its file
    sass: dict[str, int]                       # full opcode -> count, over those functions
    build_seconds: float
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def sass_by_class(self) -> dict[str, int]:
        return classify(self.sass)

    def sass_base(self) -> Counter:
        base = Counter()
        for op, n in self.sass.items():
            base[op.split(".")[0]] += n
        return base

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sass_by_class"] = self.sass_by_class()
        return d


def parse_ptxas(report: str) -> list[FunctionResources]:
    """Resources per entry function from `-Xptxas -v` output."""
    out: list[FunctionResources] = []
    current = None
    spill = (0, 0, 0)
    for line in report.splitlines():
        if m := _FUNC.search(line):
            current, spill = m.group(1), (0, 0, 0)
        elif (m := _SPILL.search(line)) and current:
            spill = tuple(int(x) for x in m.groups())
        elif (m := _USED.search(line)) and current:
            out.append(FunctionResources(current, int(m.group(1)), int(m.group(3) or 0), *spill))
            current = None
    return out


@dataclass(frozen=True)
class Build:
    """One nvcc build of a kernel for one target: ptxas's report and cuobjdump's SASS listing."""
    ptxas: str
    sass: str
    seconds: float                             # this call's wall time: near 0 when it came from the cache


_BUILDS: dict[tuple, Build] = {}


def build(spec: KernelSpec, arch: str) -> Build:
    """Build `spec` (with its configuration, if any) for `arch`: from the disk cache when this
    source, configuration, target and toolchain were built before, and once per process either way
    (a chapter that prints resources, then opcode counts, then a listing reads the build once)."""
    from .sources import kernel_hash

    key = (spec.id, spec.defines, arch, kernel_hash(spec))
    if key not in _BUILDS:
        t0 = time.perf_counter()
        cubin, report = nvcc_cubin(spec, arch)
        _BUILDS[key] = Build(report, _sass(cubin, spec, arch), round(time.perf_counter() - t0, 2))
    return _BUILDS[key]


def _sass(cubin: Path, spec: KernelSpec, arch: str) -> str:
    """cuobjdump's SASS listing of a cached cubin, cached beside it per cuobjdump version."""
    listing = cubin.with_suffix(f".cuobjdump-{toolchain.cuobjdump_version()}.sass")
    if listing.exists():
        return listing.read_text()
    proc = subprocess.run([toolchain.cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"cuobjdump failed on {spec.id} ({arch}): {proc.stderr}")
    write_atomic(listing, proc.stdout)
    return proc.stdout


def opcode_counts(sass: str, functions) -> Counter:
    """Full opcodes (with modifiers, e.g. HMMA.16816.F32) of the functions named in `functions`,
    predicates dropped; unlike function_opcodes, never-executed padding (@!PT) is counted."""
    by_function = sass_by_function(sass)
    return Counter(opcode(line) for name in functions for line in by_function.get(name, []))


_FUNCTION = re.compile(r"Function : (\S+)")
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P[T0-9]+\s+)?[A-Z].*?)\s*;")
_PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")
_BARRIER = re.compile(r"\bBAR\.(SYNC|ARV)[.A-Z_]*\s+0x([0-9a-f]+)(?:\s*,\s*0x([0-9a-f]+))?")


def sass_listing(sass: str) -> dict[str, list[tuple[int, str]]]:
    """A SASS listing split by function: (offset, instruction) in program order, the instruction
    with its operands and predicate, e.g. (0x1d40, "@P0 BRA P2, 0x1d40")."""
    out: dict[str, list[tuple[int, str]]] = {}
    current = None
    for line in sass.splitlines():
        if m := _FUNCTION.search(line):
            current = m.group(1)
            out[current] = []
        elif current and (m := _INSTRUCTION.search(line)):
            out[current].append((int(m.group(1), 16), m.group(2)))
    return out


def sass_by_function(sass: str) -> dict[str, list[str]]:
    """A SASS listing split by function: one instruction a line with its operands and predicate,
    e.g. "DEPBAR.LE SB0, 0x1"."""
    return {name: [ins for _, ins in lines] for name, lines in sass_listing(sass).items()}


def opcode(instruction: str) -> str:
    """The full opcode of one instruction, predicate dropped: "@P0 BRA P2, 0x1d40" -> "BRA"."""
    return _PREDICATE.sub("", instruction).split()[0]


def main_path(lines: list[str]) -> list[str]:
    """One function's SASS up to its last EXIT. Where ptxas cannot prove a warp converged before a
    shuffle it appends a fallback after EXIT (BRA.DIV to WARPSYNC.COLLECTIVE and register-operand
    SHFLs) that a converged warp never takes; counts of the path a warp runs leave it out."""
    exits = [i for i, line in enumerate(lines) if re.match(r"(@!?U?P\w+ )?EXIT\b", line)]
    return lines[:exits[-1] + 1] if exits else lines


def function_opcodes(lines: list[str]) -> Counter:
    """Opcode counts of one function's instructions (from sass_by_function), predicates dropped;
    never-executed padding (@!PT) is not counted."""
    return Counter(opcode(line) for line in lines if not line.startswith("@!PT "))


def named_barriers(sass: str) -> list[tuple[str, int, int | None]]:
    """(SYNC or ARV, barrier id, thread count or None) of each BAR.SYNC / BAR.ARV with immediate
    operands (`BAR.SYNC.DEFER_BLOCKING 0x1, 0xa0`: barrier 1, 160 threads)."""
    return [(kind, int(bar, 16), int(count, 16) if count else None) for kind, bar, count in _BARRIER.findall(sass)]


def classify(opcodes: dict[str, int]) -> dict[str, int]:
    """Counts per class of CLASSES (every class present, in its order) from opcode counts."""
    counts = {name: 0 for name in CLASSES}
    exact = {m: name for name, members in SASS_CLASSES.items() for m in members if "." in m}
    for op, n in opcodes.items():
        # An exact dotted match (HADD2.F32: a conversion) wins over the base opcode (HADD2).
        name = next((exact[m] for m in exact if op == m or op.startswith(m + ".")), None)
        if name is None:
            base = op.split(".")[0]
            name = next((c for c, members in SASS_CLASSES.items() if base in members), "other")
        counts[name] += n
    return counts


def launched_smem(spec: KernelSpec) -> dict[str, int]:
    """Every function the registry id launches, with the most dynamic shared memory it launches it
    with: its entry per head dim and key split over the lengths it takes, and its helpers (which take
    none). A source may hold other ids' entries too (chapter 7's ablations): they are not this id's."""
    from ..shapes import Shape

    if spec.alternatives:  # what each kernel it may launch launches
        out = {}
        for alt in spec.alternative_specs():
            for name, smem in launched_smem(alt).items():
                out[name] = max(out.get(name, 0), smem)
        return out
    dims = sorted(spec.head_dims) if spec.head_dims else [spec.max_head_dim]
    lengths = [1, 4096] if spec.max_len is None else [1, spec.max_len]
    out: dict[str, int] = {}
    for D in dims:
        splits = [1, *(s for s, by_d in (spec.entries_by_split or {}).items() if D in by_d)]
        for L in lengths:
            shape = Shape(1, 1, L, D)
            for split in splits:
                cfg = spec.launch_config(shape, split=split)
                out[cfg["entry"]] = max(out.get(cfg["entry"], 0), cfg["dynamic_smem"])
    for helper in spec.helper_entries:
        out.setdefault(helper, 0)
    return out


def inspect_kernel(spec: KernelSpec, arch: str) -> StaticReport:
    """The build of `spec` for `arch`, reduced to the functions the id launches, each with the
    dynamic shared memory of its own launches (pass registry.get(id, arch): chapter 7's tiles follow
    the architecture)."""
    b = build(spec, arch)
    launched = launched_smem(spec)
    built = {f.name: f for f in parse_ptxas(b.ptxas)}
    # in launch order: each head dim's entry, then its key splits', then the helpers
    functions = [replace(built[name], dynamic_smem=smem) for name, smem in launched.items() if name in built]
    rep = StaticReport(spec.id, arch, functions, dict(sorted(opcode_counts(b.sass, launched).items())), b.seconds)
    rep.problems = [f"entry point {name} not found in the build (found: {sorted(built)})"
                    for name in launched if name not in built]
    rep.problems += limit_problems(rep)
    return rep


def limit_problems(rep: StaticReport) -> list[str]:
    """What breaks the kernel contract in the functions of `rep`: a spill, or a function's static
    plus the dynamic shared memory it is launched with past one block's limit on the build's
    architecture (the L4's 99 KB on sm_89)."""
    from ..gpus import max_smem_per_block

    problems = []
    limit, whose = max_smem_per_block(rep.arch)
    for f in rep.functions:
        if f.spills:
            problems.append(f"{f.name} spills on {rep.arch}: {f.spill_stores} B stored, {f.spill_loads} B loaded")
        total = f.static_smem + f.dynamic_smem
        if total > limit:
            problems.append(f"{f.name} needs {total} B of shared memory on {rep.arch}, over "
                            f"{whose} {limit} B per block")
    return problems
