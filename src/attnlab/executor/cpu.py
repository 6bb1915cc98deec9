"""Registered kernels on the CPU executor (attnlab.executor): the same .cu files, run on CPU tensors
and checked against PyTorch's SDPA on the CPU by the GPU check's pass rule, with what a sanitizer
would find. A CPU run proves correctness and finds races; it never produces a timing.

    out, report = attention_cpu("07_mma", q, k, v, causal=True)   # q, k, v: CPU fp16 [B, H, L, D]
    result = check_case_cpu(registry.get("07_mma"), Shape(1, 2, 129, 64), causal=True, seed=0)
"""
from __future__ import annotations

import ctypes
import math
import os
from dataclasses import asdict, dataclass, field

from ..kernels import registry
from ..kernels.registry import KernelSpec
from ..pass_rule import ATOL_FLOOR, INPUT_OFFSET, judge, make_inputs
from ..shapes import Shape

# The CPU suite's shapes (small: the executor runs every thread of every block on one core).
# L covers 1, tile edges plus and minus one for every chapter's tiles (16, 32, 64, 128), and a
# length that is no multiple of anything; one shape has several batches, heads and query blocks.
CPU_LENGTHS: tuple[int, ...] = (1, 2, 15, 17, 63, 65, 127, 129, 200)
CPU_HEAD_DIMS: tuple[int, ...] = (64, 128)
CPU_SCHEDULE_SEEDS: tuple[int, ...] = (0, 1, 2)

# Lengths past a kernel's largest internal chunk, for the kernels whose chunk L = 200 stays inside
# (0.1 to 3 s a case, where chapters 1-3 take 1 to 10 s a case at L = 300 and need no longer row:
# their key tiles are at most 32 keys and their query blocks 128 rows):
#  - chapter 4's row softmax takes 256 columns per warp step (32 lanes x 8): 300 and 513 are two
#    and three steps of its 2-byte path (L % 8 != 0), 520 three of its 16-byte path;
#  - chapter 7's split across CTAs gives each CTA one or two key tiles at L <= 200: at 641 (ten
#    64-key tiles and one key) each runs 5 or 6, so its key loop comes round its ring of K/V stages
#    (three on sm_90 at D = 64, where 641 is the shortest row of two heads that wraps it).
#  - chapter 7's steps 7.7 and 7.8 (128-row query tiles at D = 64) split the keys 4 ways at every
#    base length of two heads on 58 SMs, and 2 ways first at L = 984: without it their 2-way entries
#    never run. Steps 7.11's, 7.12's and 7.13's two kernels likewise: the two-row one at 984, the one-row one
#    (64-row tiles, whose 2-way entries only the fixed-split ids run for step 7.6) at 500 (eight tiles
#    a head).
# Every other kernel's loop unit (key tile x K/V stages: at most 64 x 3 = 192 keys) wraps inside
# L = 200 already; tests/test_executor_kernels.py holds the grid to these claims.
CPU_LONG_LENGTHS: dict[str, tuple[int, ...]] = {"04_cublas_hybrid": (300, 513, 520), "07_mma_split_ctas": (641,),
                                                "07_mma_two_row_blocks": (984,), "07_mma_across_heads": (984,),
                                                "07_mma_lean": (500,), "07_mma_lean_across_heads": (984,),
                                                "07_mma_whole_tiles": (500,), "07_mma_whole_tiles_across_heads": (984,),
                                                "07_mma_deferred_pv": (500,), "07_mma_deferred_pv_across_heads": (984,),
                                                "07_mma_deferred_pv_two_rows": (984,)}


def cpu_shapes(spec: KernelSpec) -> list[Shape]:
    """The CPU suite's shapes a kernel supports: every length at B = 1, H = 2 (with the kernel's
    CPU_LONG_LENGTHS), and a batch of several heads and query blocks, for each head dim in
    CPU_HEAD_DIMS it takes."""
    lengths = CPU_LENGTHS + CPU_LONG_LENGTHS.get(spec.id, ())
    shapes = []
    for D in CPU_HEAD_DIMS:
        if not spec.supports_head_dim(D):
            continue
        shapes += [Shape(1, 2, L, D) for L in lengths] + [Shape(2, 3, 130, D)]
    return shapes


def cpu_label(spec: KernelSpec, arch: str | None = None) -> str:
    """How the CPU suite names a kernel: "<id>@sm_XY" where its tiles follow the target (`arch`,
    else the build's own, else the GPU at hand's: the L4's sm_89 without one), "<id>" where they
    are the same on every target. registry.by_label reads it back."""
    if not spec.tiles_follow_arch:
        return spec.id
    if arch is None:
        from ..gpus import arch_at_hand

        arch = spec.arch or arch_at_hand()[0]
    return f"{spec.id}@{arch}"


@dataclass
class CpuCase:
    """One CPU run of a kernel, judged like a GPU case, plus the executor's findings."""
    kernel: str
    shape: tuple
    causal: bool
    seed: int                     # inputs and the executor's schedule
    passed: bool
    max_err: float
    tolerance: float
    fp16_err: float
    sdpa_err: float
    findings: list[str] = field(default_factory=list)
    reason: str = ""
    hazards: list[str] = field(default_factory=list)  # per finding, its kind and pair of source sites

    def to_dict(self) -> dict:
        return asdict(self)


def _entries(spec: KernelSpec) -> list[str]:
    """Every entry of the kernel: one per head dim and key split, and the runner's helpers."""
    if not spec.entries_by_head_dim:
        return [spec.entry, *spec.helper_entries]
    return sorted({e for D in spec.entries_by_head_dim for e in spec.entries_at_head_dim(D)} | set(spec.helper_entries))


def _library_inputs(spec: KernelSpec) -> tuple:
    """What decides a kernel's executor library: its source, entries and defines."""
    return spec.source, tuple(_entries(spec)), tuple(sorted(spec.defines))


def library_for(spec: KernelSpec, src_dir=None):
    """The kernel's executor library (built on first use, cached on disk), from kernels/ or from
    `src_dir`, a copy of it (the mutation check's scratch copies)."""
    from .library import load
    return load(*_library_inputs(spec), src_dir)


def build_libraries(specs, jobs: int | None = None) -> None:
    """Build the executor libraries of `specs` (those not cached yet) side by side, `jobs` compilers
    at a time (every core by default): each is one long compile, and built one after another they
    would leave all cores but one idle."""
    from concurrent.futures import ThreadPoolExecutor

    from .build import build_library

    todo = {_library_inputs(spec) for spec in specs}  # ids that share a library build it once
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        for built in [pool.submit(build_library, *inputs) for inputs in todo]:
            built.result()


class _Buffers:
    """Executor-owned copies of CPU tensors, freed when the launch is done."""

    def __init__(self, lib):
        self.lib = lib
        self.names: list[str] = []  # the buffers' names, in allocation order (the runtime's indices)

    def __enter__(self):
        return self

    def put(self, tensor=None, nbytes=None, fill=None, name: str = "?", itemsize: int = 1, shape=None) -> int:
        """A buffer holding `tensor` (or `nbytes` filled with `fill`); its name, element size and shape
        name its bytes in findings (`O[0][1][17][3]`)."""
        nbytes = nbytes if nbytes is not None else tensor.numel() * tensor.element_size()
        if tensor is not None:
            itemsize, shape = tensor.element_size(), tuple(tensor.shape)
        ptr = self.lib.alloc(nbytes, name, itemsize, shape)
        self.names.append(name)
        if tensor is not None:
            ctypes.memmove(ptr, tensor.data_ptr(), nbytes)
        elif fill is not None:
            ctypes.memset(ptr, fill, nbytes)
        return ptr

    @staticmethod
    def get(ptr: int, into) -> None:
        ctypes.memmove(into.data_ptr(), ptr, into.numel() * into.element_size())

    def __exit__(self, *exc):
        self.lib.free_all()


def attention_cpu(kernel_id: str | KernelSpec, q, k, v, causal: bool = False, scale: float | None = None, *,
                  seed: int = 0, races: bool = True, banks: bool = False, time_limit: float = 300.0,
                  src_dir=None, count: bool = False, trace_block: int | None = None, sms: int | None = None,
                  block_range: tuple[int, ...] | None = None):
    """softmax(q k^T * scale [+ causal mask]) v by a registered kernel on the CPU executor.

    q, k, v: contiguous fp16 CPU tensors [B, H, L, D]. Returns (out, report): the output (NaN
    where the kernel wrote nothing) and the executor's LaunchReport (findings, bank counts).
    `seed` picks the order the executor runs warps and lanes in, and its WMMA layouts; `src_dir`
    builds the kernel from a copy of kernels/ instead. `count`: the report's `counts` hold what each
    launch did (attnlab.executor.counts), with every event of block `trace_block` of each launch.
    `sms`: launch as the launcher would on a GPU of that many SMs (chapter 7's key split follows it;
    default: the GPU at hand's, the L4's 58 without one). `block_range`: run only those blocks of a
    one-launch kernel's grid, (lo, hi) or (lo, hi, step) (a share of a counted launch:
    attnlab.executor.trace), the rest of the output left NaN."""
    import torch

    from ..kernels.contract import validate

    spec = registry.get(kernel_id) if isinstance(kernel_id, str) else kernel_id
    shape = validate(spec, q, k, v, causal, scale, device="cpu")
    scale = 1.0 / math.sqrt(shape.D) if scale is None else float(scale)
    lib = library_for(spec, src_dir)
    out = torch.full_like(q, float("nan"))
    options = dict(seed=seed, races=races, banks=banks, time_limit=time_limit, count=count, trace_block=trace_block)
    if block_range is not None:
        if spec.runner is not None:
            raise ValueError(f"{spec.id} makes more than one launch: a share of its grid would not run alone")
        options["block_range"] = tuple(block_range)
    with _Buffers(lib) as buf:
        run = _CPU_RUNNERS[spec.runner] if spec.runner is not None else _fused_cpu
        out, report = run(spec, shape, lib, buf, q, k, v, causal, scale, out, options, sms=sms)
        for launch in report.counts:
            launch.buffers = list(buf.names)
        return out, report


def _fused_cpu(spec, shape, lib, buf, q, k, v, causal, scale, out, options, cfg=None, sms=None):
    """The fused (q, k, v, o, L, D, scale, causal) launch of `cfg` (by default the launcher's at
    `shape`) on the executor, o filled with NaN so that a row the kernel never writes shows."""
    cfg = cfg or spec.launch_config(shape, sms)
    ptrs = [buf.put(t, name=n) for t, n in ((q, "Q"), (k, "K"), (v, "V"))] + \
        [buf.put(nbytes=out.numel() * 2, fill=0xFF, name="O", itemsize=2, shape=out.shape)]
    report = lib.launch(cfg["entry"], cfg["grid"], cfg["block"], cfg["dynamic_smem"],
                        ptrs + [shape.L, shape.D, scale, int(bool(causal))], **options)
    buf.get(ptrs[3], out)
    return out, report


def _hybrid_cpu(spec, shape, lib, buf, q, k, v, causal, scale, out, options, sms=None):
    """Chapter 4 on the CPU: the GEMMs in torch at cuBLAS's precisions on the GPU path (fp16 inputs,
    fp32 accumulation, fp16 S and O), the row softmax on the executor."""
    import torch

    s = (q.float() @ k.float().transpose(-2, -1)).half().contiguous()
    s_ptr = buf.put(s, name="S")
    cfg = spec.launch_config(shape, sms)
    report = lib.launch(spec.entry, cfg["grid"], cfg["block"], cfg["dynamic_smem"],
                        [s_ptr, shape.L, scale, int(bool(causal))], **options)
    p = torch.empty_like(s)
    buf.get(s_ptr, p)
    out.copy_((p.float() @ v.float()).half())
    return out, report


def _split_ctas_cpu(spec, shape, lib, buf, q, k, v, causal, scale, out, options, sms=None):
    """Chapter 7's split across CTAs on the CPU: the partial kernel over every split, then the
    combine, both on the executor (its findings and bank counts merged), the scratch filled with
    NaN so that a partial the combine reads unwritten shows."""
    from ..kernels import split_ctas

    cfg = spec.launch_config(shape, sms)
    splits = cfg["kv_split"]
    if splits == 1:  # the unsplit kernel, straight into out
        return _fused_cpu(spec, shape, lib, buf, q, k, v, causal, scale, out, options, cfg)
    q_ptr, k_ptr, v_ptr = (buf.put(t, name=n) for t, n in ((q, "Q"), (k, "K"), (v, "V")))
    o_ptr = buf.put(nbytes=out.numel() * 2, fill=0xFF, name="O", itemsize=2, shape=out.shape)
    o_shape, ml_shape = split_ctas.scratch_shapes(shape, splits)
    o_part = buf.put(nbytes=4 * math.prod(o_shape), fill=0xFF, name="O partials", itemsize=4, shape=o_shape)
    ml = buf.put(nbytes=4 * math.prod(ml_shape), fill=0xFF, name="m, l partials", itemsize=4, shape=ml_shape)
    first = lib.launch(cfg["entry"], cfg["grid"], cfg["block"], cfg["dynamic_smem"],
                       list(split_ctas.partial_args(shape, q_ptr, k_ptr, v_ptr, o_part, ml, causal, scale)), **options)
    combine = split_ctas.combine_config(shape)
    second = lib.launch(combine["entry"], combine["grid"], combine["block"], combine["dynamic_smem"],
                        list(split_ctas.combine_args(shape, o_part, ml, o_ptr, splits, scale)), **options)
    buf.get(o_ptr, out)
    return out, first.merged(second)


# spec.runner -> its CPU counterpart (the GPU runner's launches on the executor).
_CPU_RUNNERS = {"attnlab.gpu.hybrid:run_cublas_hybrid": _hybrid_cpu,
                "attnlab.gpu.launch:run_split_ctas": _split_ctas_cpu}


def bank_claims_broken(spec: KernelSpec, report) -> list[str]:
    """The kinds of shared access the registry says are conflict-free (spec.conflict_free) that
    took more wavefronts than ideal in this launch, one line each."""
    broken = []
    for kind in spec.conflict_free:
        counts = report.banks.get(kind)
        if counts is not None and counts.wavefronts > counts.ideal:
            broken.append(f"{kind} bank conflicts: {counts.wavefronts} wavefronts for {counts.ideal} ideal "
                          f"({counts.conflict_ratio:.2f}x), where the kernel promises none")
    return broken


def check_case_cpu(spec: KernelSpec, shape: Shape, causal: bool, seed: int, races: bool = True,
                   src_dir=None, time_limit: float = 300.0, label: str | None = None) -> CpuCase:
    """One case of the CPU suite: the pass rule of attnlab.gpu.check against the fp64 reference, no
    finding, and no bank conflict where the kernel promises none. `seed` draws the inputs and the
    executor's schedule; `label` names the kernel in the case and its findings (default: its id;
    cpu_label names the target as well)."""
    from ..reference import naive_fp16, reference_attention, sdpa

    q, k, v = make_inputs(shape, seed, device="cpu", offset=INPUT_OFFSET)
    ref = reference_attention(q, k, v, causal)
    fp16_err = float((naive_fp16(q, k, v, causal).double() - ref).abs().max())
    sdpa_err = float((sdpa(q, k, v, causal).double() - ref).abs().max())
    out, report = attention_cpu(spec, q, k, v, causal, seed=seed, races=races, banks=bool(spec.conflict_free),
                                src_dir=src_dir, time_limit=time_limit)
    verdict = judge(out, ref, fp16_err, ATOL_FLOOR)
    name = label or spec.id
    banks_broken = bank_claims_broken(spec, report)
    findings = [f.line(name) for f in report.findings] + [f"{name}: {b}" for b in banks_broken]
    # A broken bank claim's hazard is its kind of access ("ld/st bank conflicts"), whatever the counts.
    hazards = [f"{name}: {f.hazard()}" for f in report.findings] + [f"{name}: {b.split(':')[0]}" for b in banks_broken]
    reasons = [] if verdict.passed else [verdict.reason]
    if not report.completed:
        reasons.append("the launch did not complete")
    if findings:
        reasons.append(f"{len(findings)} finding(s)")
    return CpuCase(name, tuple(shape), causal, seed, verdict.passed and report.completed and not findings, verdict.max_err,
                   verdict.tolerance, fp16_err, sdpa_err, findings, "; ".join(reasons), hazards)


def run_suite_cpu(specs, shapes=None, seeds=(0,), progress: bool = True, labels=None) -> list[CpuCase]:
    """check_case_cpu over kernels x shapes (default: cpu_shapes; a shape a kernel cannot take,
    by contract.shape_problem, is left out for it) x causal x seeds. `labels`, one per spec, name
    the kernels in the cases (default: their ids)."""
    from ..kernels.contract import shape_problem

    labels = list(labels) if labels is not None else [spec.id for spec in specs]
    if len(labels) != len(specs):
        raise ValueError(f"{len(labels)} labels for {len(specs)} kernels")
    work = [(spec, shape, causal, seed, label) for spec, label in zip(specs, labels)
            for shape in (shapes if shapes is not None else cpu_shapes(spec))
            for causal in ((False, True) if spec.causal else (False,))
            if shape_problem(spec, shape, causal) is None for seed in seeds]
    if progress:  # (tqdm.auto warns on stderr in a notebook without ipywidgets: the pages pass False)
        from tqdm.auto import tqdm

        work = tqdm(work, desc="check --cpu", unit="case")
    return [check_case_cpu(spec, shape, causal, seed, label=label) for spec, shape, causal, seed, label in work]


def format_table_cpu(cases: list[CpuCase]) -> str:
    """One line per kernel, shape and causal flag (seeds folded), then every finding once."""
    rows: dict[tuple, list[CpuCase]] = {}
    for c in cases:
        rows.setdefault((c.kernel, c.shape, c.causal), []).append(c)
    kw = max([len(c.kernel) for c in cases] + [22])
    lines = [f"{'kernel':<{kw}} {'shape':<20} {'causal':<6} {'pass':>5} {'max err':>9} {'tol':>9}  note"]
    for (kernel, shape, causal), group in rows.items():
        passed = sum(c.passed for c in group)
        errs = [c.max_err for c in group]
        err = float("nan") if any(e != e for e in errs) else max(errs)
        note = next((c.reason for c in group if not c.passed), "")
        lines.append(f"{kernel:<{kw}} {str(shape):<20} {str(causal):<6} {passed}/{len(group):<3} {err:>9.2e} "
                     f"{min(c.tolerance for c in group):>9.2e}  {note}")
    # One line per hazard (a kind at a pair of source sites), as racecheck prints it: the first
    # case's line, and in how many cases it came back.
    hazards: dict[str, list[str]] = {}
    for c in cases:
        for text, key in zip(c.findings, c.hazards or c.findings):
            hazards.setdefault(key, []).append(text)
    lines.append(f"{sum(c.passed for c in cases)}/{len(cases)} cases passed on the CPU executor "
                 f"(CPU run: correctness and findings, no timing); {len(hazards)} distinct finding(s)")
    lines += [texts[0] + (f" (in {len(texts)} cases)" if len(texts) > 1 else "") for texts in hazards.values()]
    return "\n".join(lines)
