"""What the book's notebooks share: the dual-mode steps of a chapter, figures and glue.

Every chapter runs the same steps: inspect the build, check against SDPA, time next to SDPA.
On a GPU each step measures now. Without one it shows the committed records under results/,
labelled with their GPU and date, and only the kernels whose source still hashes to what was
measured; where no such record exists it says so plainly. The code lives here once, so a chapter
notebook is a sequence of calls, and every number the prose quotes is glued from what a call
returned, never typed.
"""
from __future__ import annotations

import io
import os

from . import registry
from .env import has_gpu
from .gpus import REFERENCE_GPU, Floor, GpuSpec, by_key, floor, lookup
from .shapes import MISSION, QUICK_SWEEP_LENGTHS, SWEEP_LENGTHS, Shape, sweep

FIGURE_DPI = 110


# --- display -------------------------------------------------------------------------------

def notice(text: str) -> None:
    """A plain statement in the page (a Markdown block quote), e.g. that no record exists."""
    from IPython.display import Markdown, display

    display(Markdown("> " + text.replace("\n", "\n> ")))


def show(fig) -> None:
    """Show a matplotlib figure as a PNG and close it.

    PNG, because nbval does not compare PNG data and an SVG differs on every run; no software
    metadata, so re-executing with nothing changed rewrites the same bytes.
    """
    import matplotlib.pyplot as plt
    from IPython.display import Image, display

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=FIGURE_DPI, metadata={"Software": None})
    plt.close(fig)
    display(Image(data=buf.getvalue(), format="png"))


def glue(name: str, value) -> None:
    """myst-nb's glue without the visible output: the page pastes `value` where the prose asks."""
    from myst_nb import glue as _glue

    _glue(name, value, display=False)


def fmt_us(us: float) -> str:
    return f"{us:.1f} µs" if us >= 10 else f"{us:.2f} µs"


# --- the machine -----------------------------------------------------------------------------

def device_name() -> str | None:
    if not has_gpu():
        return None
    import torch
    return torch.cuda.get_device_name()


def gpu_at_hand() -> tuple[GpuSpec, str]:
    """The table entry of this machine's GPU, or the L4's, and a sentence saying which and why."""
    name = device_name()
    if name is None:
        return by_key(REFERENCE_GPU), (f"No CUDA GPU on this machine (torch.cuda.is_available() is False): "
                                       f"the figures use the {REFERENCE_GPU}, the book's reference card.")
    spec = lookup(name)
    if spec is None:
        return by_key(REFERENCE_GPU), (f"This machine's GPU, {name}, is not in attnlab.gpus.GPUS: "
                                       f"the figures use the {REFERENCE_GPU}; add a row for yours.")
    return spec, f"This machine's GPU: {name}, read as the {spec.key} ({spec.arch}, {spec.sms} SMs)."


def mode_line() -> str:
    """What the GPU-dependent cells of a page will do on this machine."""
    name = device_name()
    if name is None:
        return ("**No CUDA GPU on this machine.** Cells that measure show the committed records under "
                "`results/` instead, labelled with their GPU and date, or say that none exists.")
    return f"**CUDA GPU: {name}.** Cells that measure run now, on this GPU."


# --- records ---------------------------------------------------------------------------------

def record_label(rec: dict) -> str:
    commit = str(rec["git"].get("commit") or "unknown")[:8]
    dirty = ", uncommitted changes" if rec["git"].get("dirty") else ""
    return f"{rec['gpu']['name']}, {rec['created_utc'][:10]} (commit {commit}{dirty})"


def fresh_records(kind: str, kernel_id: str) -> list[dict]:
    """Committed records of `kind` in which `kernel_id` is fresh (attnlab.results: bound to this
    repository, physical, and measured from what would run now), each reduced to its fresh
    kernels: the reference GPU's first, then the latest commit first."""
    from .results import fresh_records as shown

    recs = list(reversed(shown(kind, kernel_id=kernel_id)))
    return sorted(recs, key=lambda r: lookup(r["gpu"]["name"]) != by_key(REFERENCE_GPU))


def reuse_records() -> bool:
    """True when a GPU session's book stage asks the pages to take this GPU's fresh records
    (measured by its check and bench stages a few minutes earlier) instead of measuring again."""
    return os.environ.get("ATTNLAB_REUSE_RECORDS", "") == "1" and has_gpu()


def _this_gpu(records: list[dict]) -> list[dict]:
    """The records measured on the GPU at hand, newest first."""
    name = device_name()
    return [r for r in records if r["gpu"]["name"] == name]  # fresh_records: latest commit first


def reusable_check(kernel_id: str, seeds) -> dict | None:
    """The newest fresh check record of `kernel_id` on this GPU that ran every seed asked for."""
    for rec in _this_gpu(fresh_records("check", kernel_id)):
        if set(seeds) <= {c["seed"] for c in rec["cases"] if c["kernel"] == kernel_id}:
            return rec
    return None


def covers(rec: dict, kernel_ids: list[str], shapes, entry: str | None = None) -> bool:
    """Whether a bench record has a case at every shape, causal and not, and (given `entry`, e.g.
    "check" or "device") that entry for every kernel in each."""
    from .plot import find_case

    cases = [find_case(rec, s, c) for s in shapes for c in (False, True)]
    return all(case and (entry is None or all(entry in case["kernels"].get(k, {}) for k in kernel_ids))
               for case in cases)


def reusable_bench(kernel_ids: list[str], shapes) -> dict | None:
    """The newest fresh bench record on this GPU holding every kernel's check (and time, where it
    passed) at every shape, causal and not."""
    return next((rec for rec in _this_gpu(fresh_records("bench", kernel_ids[0]))
                 if covers(rec, kernel_ids, shapes, "check")), None)


def _stale_note(kind: str, kernel_id: str) -> str:
    from .results import load_records

    loaded, _ = load_records()
    old = [item for item in loaded if item.record.get("kind") == kind and kernel_id in item.record.get("kernels", {})]
    if not old:
        return f"No {kind} record of {kernel_id} is committed under results/."
    last = old[-1]
    why = ("it is refused: " + last.refused[0] if last.refused else
           "it measured uncommitted changes" if last.local else "; ".join(last.stale.get(kernel_id, [])))
    return (f"The committed {kind} records of {kernel_id} ({len(old)}) are not shown; the latest, "
            f"{record_label(last.record)}, is not fresh: {why}.")


# --- chapter steps ---------------------------------------------------------------------------

def inspect(kernel_id: str, arches=None) -> list:
    """Build the kernel for each target with nvcc, print what ptxas and the SASS say, draw the
    instruction mix and assert the contract (no spills, shared memory within the L4's limit).
    Needs nvcc and cuobjdump, not a GPU."""
    from dataclasses import replace

    from .plot import sass_mix
    from .static import ARCHES, inspect_kernel

    # each target built with its own tiles (chapter 7's key tile follows the architecture)
    reports = [inspect_kernel(registry.get(kernel_id, arch), arch) for arch in (arches or ARCHES)]
    for rep in reports:
        cls = rep.sass_by_class()
        for f in rep.functions:
            print(f"{rep.arch}  {f.name}\n"
                  f"  {f.registers} registers, {f.static_smem} B static + {rep.dynamic_smem_max} B dynamic "
                  f"shared memory\n"
                  f"  {f.stack_bytes} B stack, {f.spill_stores + f.spill_loads} B spilled")
        print(f"  {sum(rep.sass.values())} instructions: {cls['fp32 math']} fp32 math, "
              f"{cls['tensor core']} tensor core,\n"
              f"  {cls['global load']} global load, {cls['shared load']} shared load, "
              f"{cls['shared store']} shared store, {cls['local (spill)']} local")
    problems = [p for rep in reports for p in rep.problems]
    assert not problems, "\n".join(problems)
    labelled = [replace(rep, kernel=f"{rep.kernel} {rep.arch}") for rep in reports]
    fig = sass_mix(labelled)
    ax = fig.axes[0]
    ax.set_xlabel("SASS instructions in the binary")
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    fig.set_figheight(fig.get_figheight() + 0.6)
    fig.tight_layout()
    show(fig)
    return reports


def check(kernel_id: str, quick: bool = True, save: bool = False):
    """On a GPU: run the correctness suite now, print it, assert it passed (and write a record if
    `save`). Without one: run the same .cu on the CPU executor at small shapes (check_cpu), then
    print the freshest committed GPU check record if there is one. Returns the cases run."""
    from .check import CHECK_SEEDS, CaseResult, format_table, run_suite
    from .results import new_record, write_record

    spec = registry.get(kernel_id)
    if has_gpu():
        seeds = CHECK_SEEDS[:1] if quick else CHECK_SEEDS
        rec = reusable_check(kernel_id, seeds) if reuse_records() else None
        if rec is not None:
            results = [CaseResult(**{**c, "shape": tuple(c["shape"])}) for c in rec["cases"]
                       if c["kernel"] == kernel_id and c["seed"] in seeds]
            print(f"Checked on this GPU in this session:\n  {record_label(rec)}")
            print(format_table(results))
            failed = [r for r in results if not r.passed]
            assert not failed, f"{len(failed)} cases failed"
            return results
        results = run_suite([spec], seeds=seeds, progress=False)
        print(f"Checked now on {device_name()}:")
        print(format_table(results))
        if save:
            record = new_record("check", [spec], settings={"quick": quick, "seeds": list(seeds)})
            record["cases"] = [r.to_dict() for r in results]
            print(f"record: {write_record(record)}")
        failed = [r for r in results if not r.passed]
        assert not failed, f"{len(failed)} cases failed"
        return results
    cpu_cases = check_cpu(kernel_id)
    recs = fresh_records("check", kernel_id)
    if recs:
        rec = recs[0]
        results = [CaseResult(**{**c, "shape": tuple(c["shape"])}) for c in rec["cases"] if c["kernel"] == kernel_id]
        assert results, f"record {record_label(rec)} lists {kernel_id} but has no case for it"
        print(f"\nCommitted GPU check record:\n  {record_label(rec)}")
        print(format_table(results))
    return cpu_cases


# The pages' CPU runs: one length past two tiles of every chapter's sizes, one that is no multiple
# of 8 at the other head dim. The full CPU grid is the test suite's (tests/test_executor_kernels.py).
BOOK_CPU_SHAPES = (Shape(1, 2, 129, 64), Shape(1, 2, 65, 128))


def check_cpu(kernel_id: str, shapes=BOOK_CPU_SHAPES, seed: int = 0):
    """The kernel's .cu on the CPU executor: the GPU check's pass rule against the fp64 reference,
    causal and not, and what a sanitizer would report. Prints the table and asserts it passed;
    without a C++ compiler, says what to install and returns None."""
    from .cpu import format_table_cpu, run_suite_cpu
    from .executor import ExecutorUnavailable

    spec = registry.get(kernel_id)
    try:  # (run_suite_cpu leaves out the shapes whose head dim the kernel does not take)
        cases = run_suite_cpu([spec], shapes=shapes, seeds=(seed,), progress=False)
    except ExecutorUnavailable as exc:
        notice(f"**No CUDA GPU and no CPU run.** {exc}.")
        return None
    print(f"No CUDA GPU here. The same kernels/{spec.source}, run on attnlab's CPU executor "
          "(a correctness check; never a timing):")
    print(format_table_cpu(cases))
    failed = [c for c in cases if not c.passed]
    assert not failed, f"{len(failed)} CPU cases of {kernel_id} failed"
    return cases


def bank_counts_cpu(kernel_ids: list[str], shape: Shape, causal: bool = False) -> dict[str, dict]:
    """Shared-memory bank counts of each kernel over one launch on the CPU executor:
    kernel -> kind ("ldmatrix", "cp.async", "ld/st") -> BankCounts (requests, wavefronts, ideal)."""
    from .check import make_inputs
    from .cpu import attention_cpu

    q, k, v = make_inputs(shape, 0, device="cpu")
    counts = {}
    for kid in kernel_ids:
        _, report = attention_cpu(kid, q, k, v, causal, banks=True)
        assert report.clean, [f.line(kid) for f in report.findings]
        counts[kid] = report.banks
    return counts


def bench_shapes(quick: bool) -> list[Shape]:
    return list(dict.fromkeys((MISSION,) + sweep(QUICK_SWEEP_LENGTHS if quick else SWEEP_LENGTHS)))


def _measure_now(kernel_ids: list[str], shapes, quick: bool, save: bool) -> dict:
    """Time the kernels next to every SDPA backend at `shapes` on this GPU, write the record if
    `save`, and refuse (assert) if any output failed its check."""
    from .bench import failed_cases, run_bench
    from .results import reduce_to, write_record

    rec = reusable_bench(kernel_ids, shapes) if reuse_records() else None
    if rec is not None:
        rec = reduce_to(rec, kernel_ids)
        print(f"Measured on this GPU in this session:\n  {record_label(rec)}")
    else:
        rec = run_bench([registry.get(k) for k in kernel_ids], shapes, quick=quick, progress=False)
        print(f"Measured now:\n  {record_label(rec)}")
        if save:
            print(f"record: {write_record(rec)}")
    failed = failed_cases(rec)
    assert not failed, f"wrong output, so these times are no result: {failed}"
    return rec


def bench(kernel_ids: list[str], quick: bool = True, save: bool = False) -> dict | None:
    """On a GPU: time the kernels next to every SDPA backend now (and write the record if `save`).
    Without one: the freshest committed bench record of the first kernel, reduced to fresh kernels.
    Either way draw the mission shape's bars and the length sweep, causal and not; return the
    record shown, or None after saying plainly that none exists."""
    from .plot import latency_bars, length_sweep

    chapter_kernel = kernel_ids[0]
    if has_gpu():
        rec = _measure_now(kernel_ids, bench_shapes(quick), quick, save)
    else:
        recs = fresh_records("bench", chapter_kernel)
        if not recs:
            notice(f"**No fresh timing.** {_stale_note('bench', chapter_kernel)} This machine has no GPU, "
                   f"so this page shows no time for {chapter_kernel}: `python -m attnlab bench "
                   f"{chapter_kernel}` on a GPU, or `python tools/run_book.py --save-results`, writes one.")
            return None
        rec = recs[0]
        others = sorted({r["gpu"]["name"] for r in recs[1:]} - {rec["gpu"]["name"]})
        print(f"No CUDA GPU here. Committed bench record:\n  {record_label(rec)}"
              + (f"\n  fresh records also exist for: {', '.join(others)}" if others else ""))
    for causal in (False, True):
        show(latency_bars(rec, MISSION, causal))
    for causal in (False, True):
        show(length_sweep(rec, MISSION.B, MISSION.H, MISSION.D, causal))
    return rec


def latest_bench(gpu: GpuSpec) -> dict | None:
    """The fresh bench record of the latest commit taken on `gpu`, reduced to its fresh kernels."""
    from .results import fresh_records as shown

    return next((rec for rec in reversed(shown("bench")) if lookup(rec["gpu"]["name"]) == gpu), None)


def case_time(rec: dict | None, kernel_id: str, shape: Shape = MISSION, causal: bool = False) -> float | None:
    """The median device time (µs) a record holds for a kernel at one shape, or None."""
    from .plot import find_case

    case = find_case(rec, shape, causal) if rec else None
    entry = (case or {}).get("kernels", {}).get(kernel_id, {})
    return entry["device"]["median_us"] if "device" in entry else None


def measured_sentence(rec: dict | None, kernel_id: str, shape: Shape = MISSION, causal: bool = False) -> str:
    """One sentence for the prose: the kernel's time at a shape, the fastest SDPA backend of the
    same run, the floor on that GPU; or a plain statement that there is no measurement."""
    if rec is None:
        return (f"No fresh measurement of {kernel_id} exists yet: no GPU run has timed the current "
                f"kernels/{registry.get(kernel_id).source}, so this page quotes no time for it")
    from .gpus import tflops
    from .plot import find_case

    case = find_case(rec, shape, causal)
    entry = (case or {}).get("kernels", {}).get(kernel_id, {})
    if "check" in entry and not entry["check"]["passed"]:
        return (f"On {record_label(rec)}, {kernel_id} FAILED its check at {shape.label()} (causal={causal}): "
                f"{entry['check']['reason']}; a wrong output is never timed")
    if "device" not in entry:
        return f"The record {record_label(rec)} has no time for {kernel_id} at {shape.label()}, causal={causal}"
    t = entry["device"]["median_us"]
    text = f"On {record_label(rec)}, {kernel_id} took {fmt_us(t)} at {shape.label()} (causal={causal}), " \
           f"{tflops(shape, causal, t):.2f} TFLOP/s"
    if case["sdpa"]:
        best = min(case["sdpa"], key=lambda n: case["sdpa"][n]["median_us"])
        tb = case["sdpa"][best]["median_us"]
        pace = f"{t / tb:.1f}× slower" if t >= tb else f"{tb / t:.2f}× faster"
        text += f", {pace} than the fastest SDPA backend of the same run ({best}, {fmt_us(tb)})"
    gpu = lookup(rec["gpu"]["name"])
    if gpu is not None:
        f = floor(shape, gpu, causal)
        text += f"; the {gpu.key}'s floor is {fmt_us(f.us)} ({f.bound}-bound)"
    return text


# --- the roofline ------------------------------------------------------------------------------

def floor_text(shape: Shape, gpu: GpuSpec, causal: bool) -> str:
    """Two lines: the floor and its bound, then the compute and memory times it is the larger of."""
    f: Floor = floor(shape, gpu, causal)
    return (f"{gpu.key} {shape.label()} causal={causal}: floor {fmt_us(f.us)}, {f.bound}-bound\n"
            f"  compute {fmt_us(f.compute_us)}, memory {fmt_us(f.memory_us)}")


def roofline_points(rec: dict, shape: Shape = MISSION) -> list[tuple[str, Shape, bool, float]]:
    """(label, shape, causal, µs) of every kernel and SDPA backend a record timed at `shape`: only
    outputs that passed their check carry a time (failed_labels names the others)."""
    from .plot import find_case

    points = []
    for causal in (False, True):
        case = find_case(rec, shape, causal)
        if case is None:
            continue
        tag = " causal" if causal else ""
        points += [(f"{kid}{tag}", shape, causal, e["device"]["median_us"])
                   for kid, e in case["kernels"].items() if "device" in e]
        points += [(f"SDPA {name}{tag}", shape, causal, t["median_us"]) for name, t in case["sdpa"].items()]
    return points


def roofline(gpu: GpuSpec, rec: dict | None = None, shape: Shape = MISSION):
    """The GPU's roofline with the shape's arithmetic intensity marked (causal and not), and the
    points and measured ceilings of a record when there is one."""
    from .gpus import arithmetic_intensity
    from .plot import failed_labels
    from .plot import roofline as draw

    fig = draw(gpu, roofline_points(rec, shape) if rec else [], ceilings=(rec or {}).get("ceilings"))
    ax = fig.axes[0]
    failed = failed_labels(rec, shape) if rec else []
    if failed:
        ax.text(0.01, 0.01, "FAILED its check, not drawn: " + ", ".join(failed), transform=ax.transAxes,
                fontsize=7, color="tab:red", va="bottom")
    for causal, style in ((False, "-."), (True, ":")):
        ax.axvline(arithmetic_intensity(shape, causal), color="tab:orange", ls=style, lw=1,
                   label=f"{shape.label()}{' causal' if causal else ''}")
    ax.axvline(gpu.ridge_flop_per_byte, color="gray", lw=0.8, alpha=0.6, label="ridge point")
    ax.legend(fontsize=7, loc="lower right")
    if rec:
        ax.set_title(ax.get_title() + f"\npoints: {record_label(rec)}", fontsize=9)
    return fig


# --- the environment page ----------------------------------------------------------------------

def environment_lines() -> list[str]:
    """GPU, driver, CUDA, torch and CuPy as attnlab records them, one 'name: value' a line."""
    from .env import device_info, software_versions

    lines = []
    if has_gpu():
        lines += [f"gpu {k}: {v}" for k, v in device_info().items()]
    else:
        lines.append("gpu: none (torch.cuda.is_available() is False)")
    lines += [f"{k}: {v}" for k, v in software_versions().items()]
    return lines


def recorded_gpus() -> list[str]:
    """One line per GPU with committed records: how many of each kind, the newest date, which
    kernels are fresh there. Empty when results/ holds none."""
    from .results import load_records, verify

    loaded, problems = load_records()
    loaded = [item for item in loaded if item.shown]
    v = verify()
    lines = []
    for name in sorted({item.record["gpu"]["name"] for item in loaded}):
        recs = [item.record for item in loaded if item.record["gpu"]["name"] == name]
        kinds = ", ".join(f"{sum(r['kind'] == k for r in recs)} {k}" for k in ("check", "bench"))
        fresh = sorted(kid for gpu, kid, _ in v.fresh if gpu == name) or ["none"]
        g = recs[-1]["gpu"]
        lines.append(f"{name} (sm_{g['compute_capability'].replace('.', '')}, {g['sm_count']} SMs, "
                     f"driver {g['driver']}, CUDA {g['cuda_runtime']}): {kinds} records, newest "
                     f"{recs[-1]['created_utc'][:10]}; fresh kernels: {', '.join(fresh)}")
    lines += [f"not shown: {p}" for p in problems]
    return lines


# --- chapter 7: fragment layouts, the swizzle, per-function SASS, occupancy, target shapes ------
# Pure Python (NumPy, matplotlib) except sass_by_function (nvcc, cuobjdump) and bench_at (a GPU
# or committed records). The swizzle formulas are those of kernels/swizzle.cuh, checked against
# its text by swizzle_header_matches() so that the page fails rather than drift from the kernel.

def mma_m16n8k16_maps() -> dict[str, tuple]:
    """Which (row, col) of A (16x16), B (16x8, k x n) and C/D (16x8) each lane holds in
    mma.sync.aligned.m16n8k16 with .f16 inputs and .f32 accumulators, from the PTX ISA's formulas
    (groupID g = lane >> 2, threadID_in_group t = lane % 4). Returns name -> (rows, cols, regs):
    int arrays [32, n] over the lane's elements in register order (A: a0..a7 in 4 .f16x2
    registers, B: b0..b3 in 2, C: c0..c3 in 4 fp32 registers); regs[lane, i] is the register."""
    import numpy as np

    lane = np.arange(32)[:, None]
    g, t = lane >> 2, lane & 3
    i8, i4 = np.arange(8)[None, :], np.arange(4)[None, :]
    a_rows = g + 8 * ((i8 // 2) % 2)                 # a0,a1: g; a2,a3: g+8; a4,a5: g; a6,a7: g+8
    a_cols = 2 * t + (i8 & 1) + 8 * (i8 >= 4)
    b_rows = 2 * t + (i4 & 1) + 8 * (i4 >= 2)        # b0,b1: k = 2t, 2t+1; b2,b3: 2t+8, 2t+9
    b_cols = np.broadcast_to(g, (32, 4))
    c_rows = g + 8 * (i4 >= 2)                       # c0,c1: g; c2,c3: g+8
    c_cols = 2 * t + (i4 & 1)
    return {"A": (a_rows, a_cols, np.broadcast_to(i8 // 2, (32, 8))),
            "B": (b_rows, np.array(b_cols), np.broadcast_to(i4 // 2, (32, 4))),
            "C": (c_rows, c_cols, np.broadcast_to(i4, (32, 4)))}


def accumulator_pair_as_a() -> tuple:
    """The accumulators of two adjacent n8 blocks (keys 0-7 and 8-15), packed two fp32 values per
    .f16x2 register in the kernel's order (c0c1 and c2c3 of block 0, then of block 1), as
    (rows, cols, regs) [32, 8] over a 16x16 matrix: the same per-lane map as an A fragment when
    the repack is right."""
    import numpy as np

    c_rows, c_cols, _ = mma_m16n8k16_maps()["C"]
    rows = np.concatenate([c_rows, c_rows], axis=1)            # block 0: c0..c3, block 1: c0..c3
    cols = np.concatenate([c_cols, c_cols + 8], axis=1)
    regs = np.broadcast_to(np.arange(8) // 2, (32, 8))         # pa[0] = (c0, c1) of block 0, ...
    return rows, cols, regs


def mma_fragment_figure():
    """Four maps of lane ownership, each cell labelled with the lane that holds it and coloured by
    the register: A, B and C of m16n8k16, and two C blocks side by side packed as the kernel packs
    P, which must read exactly like A."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Patch

    maps = mma_m16n8k16_maps()
    panels = [("A (16x16, row): Q, or P", ("m", "k"), maps["A"], "a"),
              ("two C blocks of S packed as P\n(the A operand of O += P V)", ("m", "k"),
               accumulator_pair_as_a(), "pa"),
              ("B (16x8, col): K^T, or V", ("k", "n"), maps["B"], "b"),
              ("C/D (16x8, fp32): S, or O", ("m", "n"), maps["C"], "c")]
    colors = plt.get_cmap("Pastel1").colors
    fig = plt.figure(figsize=(10, 11))
    grid = fig.add_gridspec(2, 4)
    axes = [fig.add_subplot(grid[0, 0:2]), fig.add_subplot(grid[0, 2:4]),
            fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 2])]
    for ax, (title, (ylab, xlab), (rows, cols, regs), reg_name) in zip(axes, panels):
        nr, nc = int(rows.max()) + 1, int(cols.max()) + 1
        lane_at = np.full((nr, nc), -1)
        reg_at = np.full((nr, nc), -1)
        for lane in range(32):
            for e in range(rows.shape[1]):
                r, c = rows[lane, e], cols[lane, e]
                assert lane_at[r, c] == -1, f"{title}: ({r}, {c}) held twice"
                lane_at[r, c], reg_at[r, c] = lane, regs[lane, e]
        assert (lane_at >= 0).all(), f"{title}: a cell nobody holds"
        img = np.array([[colors[reg_at[r, c]] for c in range(nc)] for r in range(nr)])
        ax.imshow(img, aspect="equal")
        for r in range(nr):
            for c in range(nc):
                ax.text(c, r, str(lane_at[r, c]), ha="center", va="center", fontsize=7)
        ax.set_xticks(range(nc), [str(c) for c in range(nc)], fontsize=6)
        ax.set_yticks(range(nr), [str(r) for r in range(nr)], fontsize=6)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xlab)
        ax.set_ylabel(ylab)
        n_regs = int(regs.max()) + 1
        names = {"a": [f"{{a{2 * k},a{2 * k + 1}}}" for k in range(4)],
                 "b": [f"{{b{2 * k},b{2 * k + 1}}}" for k in range(2)],
                 "c": [f"c{k}" for k in range(4)], "pa": [f"pa[{k}]" for k in range(4)]}[reg_name]
        handles = [Patch(color=colors[k], label=names[k]) for k in range(n_regs)]
        ax.legend(handles=handles, fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.1),
                  frameon=False, handlelength=1, columnspacing=0.8)
    fig.suptitle("mma.sync.m16n8k16: the lane (0-31) that holds each element; colour = the 32-bit register "
                 "(A, B and P: two fp16 per register)", fontsize=10)
    fig.tight_layout()
    return fig


# kernels/swizzle.cuh, written again (swizzle_header_matches() holds the two together).
_SWIZZLE_HEADER_LINES = (
    "return row * ROW_BYTES + ((SWIZZLE ? (chunk ^ (row & 7)) : chunk) << 4);",
    "ldsm_row(int lane) { return lane & 15; }",
    "ldsm_chunk(int lane) { return lane >> 4; }",
    "ldsm_row_b(int lane) { return (lane & 7) + ((lane >> 4) << 3); }",
    "ldsm_chunk_b(int lane) { return (lane >> 3) & 1; }",
)


def swizzle_header_matches() -> bool:
    """True when kernels/swizzle.cuh still holds the formulas that swizzle_offset() and
    ldsm_lane_rows_chunks() compute."""
    from .paths import kernels_dir

    flat = " ".join((kernels_dir() / "swizzle.cuh").read_text().split())
    return all(line in flat for line in _SWIZZLE_HEADER_LINES)


def swizzle_offset(row, chunk, row_bytes: int, swizzle: bool = True):
    """attn::tile_offset<ROW_BYTES, SWIZZLE>: the byte offset of 16-byte chunk `chunk` of tile row
    `row` (NumPy arrays welcome)."""
    assert row_bytes % 128 == 0
    return row * row_bytes + (((chunk ^ (row & 7)) if swizzle else chunk) << 4)


def ldsm_lane_rows_chunks(order: str = "A"):
    """The (row, chunk) inside a 16-row x 2-chunk block whose address each lane gives ldmatrix.x4:
    order "A" (Q; V with .trans) or "B" (K), as kernels/swizzle.cuh defines them."""
    import numpy as np

    lane = np.arange(32)
    if order == "A":
        return lane & 15, lane >> 4
    if order == "B":
        return (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1
    raise ValueError(f"order must be 'A' or 'B', not {order!r}")


def smem_wavefronts(addr, width: int = 16) -> int:
    """Shared-memory wavefronts of one warp-wide access of `width` bytes per lane at byte addresses
    `addr` [32]: 16-byte accesses (ldmatrix rows, 16-byte loads) are served a quarter-warp (one
    8x8 matrix) per phase, 4-byte ones all 32 lanes at once; a phase needs as many wavefronts as
    its busiest of the 32 four-byte banks has distinct words. A conflict-free ldmatrix.x4: 4."""
    import numpy as np

    addr = np.asarray(addr)
    per_phase = 128 // width
    total = 0
    for p in range(len(addr) // per_phase):
        a = addr[p * per_phase:(p + 1) * per_phase]
        words = np.unique((a[:, None] // 4 + np.arange(width // 4)).ravel())
        total += int(np.bincount(words % 32, minlength=32).max())
    return total


def ldmatrix_wavefronts_07(D: int, block_m: int, block_n: int, swizzle: bool) -> dict[str, list[int]]:
    """Wavefronts of every ldmatrix.x4 chapter 7's kernel issues for one key tile (Q once, K and V
    per tile), by operand, from its address formulas (the tile bases are multiples of 128 bytes,
    so only the offset inside a tile decides the banks)."""
    rb = 2 * D
    out = {"Q": [], "K": [], "V (.trans)": []}
    ra, ca = ldsm_lane_rows_chunks("A")
    rb_, cb = ldsm_lane_rows_chunks("B")
    for warp in range(block_m // 16):
        for ks in range(D // 16):
            out["Q"].append(smem_wavefronts(swizzle_offset(warp * 16 + ra, 2 * ks + ca, rb, swizzle)))
    for np_ in range(block_n // 16):
        for ks in range(D // 16):
            out["K"].append(smem_wavefronts(swizzle_offset(16 * np_ + rb_, 2 * ks + cb, rb, swizzle)))
    for kp in range(block_n // 16):
        for dp in range(D // 16):
            out["V (.trans)"].append(smem_wavefronts(swizzle_offset(16 * kp + ra, 2 * dp + ca, rb, swizzle)))
    return out


def swizzle_figure(row_bytes: int = 128):
    """Rows 0-7 of a tile in shared memory, plain and swizzled: each cell is a 16-byte slot (a
    group of 4 banks), labelled with the chunk of the row stored there; the slots that one
    ldmatrix phase reads (chunk 0 of rows 0-7) are highlighted."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, sw in zip(axes, (False, True)):
        grid = np.zeros((8, 8), int)
        for r in range(8):
            for c in range(8):
                slot = (swizzle_offset(r, c, row_bytes, sw) % 128) // 16
                grid[r, slot] = c
        ax.imshow(grid == 0, cmap="Oranges", vmin=0, vmax=1.6, aspect="equal")
        for r in range(8):
            for s in range(8):
                ax.text(s, r, f"c{grid[r, s]}", ha="center", va="center", fontsize=9,
                        fontweight="bold" if grid[r, s] == 0 else "normal")
        ax.set_xticks(range(8), [f"{4 * s}-{4 * s + 3}" for s in range(8)], fontsize=7)
        ax.set_yticks(range(8), [str(r) for r in range(8)])
        ax.set_xlabel("banks (16-byte slot of a 128-byte line)")
        ax.set_ylabel("tile row")
        busiest = max(int((grid[:, s] == 0).sum()) for s in range(8))
        ax.set_title(("swizzled: chunk c at slot c ^ (row % 8)" if sw else "plain row-major: chunk c at slot c")
                     + f"\nldmatrix phase (chunk 0, rows 0-7): {busiest} row(s) per bank group", fontsize=9)
    fig.tight_layout()
    return fig


def sass_lines_by_function(kernel_id: str, arch: str) -> dict[str, list[str]]:
    """The SASS of each function in the kernel's nvcc build for `arch` (cuobjdump), one
    instruction a line with its operands, e.g. "DEPBAR.LE SB0, 0x1"."""
    from .static import build, sass_by_function

    return sass_by_function(build(registry.get(kernel_id, arch), arch).sass)


def sass_by_function(kernel_id: str, arch: str) -> dict:
    """Opcode counts (full opcode with modifiers, e.g. HMMA.16816.F32) of each function in the
    kernel's nvcc build for `arch`, from cuobjdump; predicates are dropped, never-executed padding
    (@!PT) is not counted. The loop bodies appear once: these are instructions in the binary, not
    instructions executed."""
    from .static import function_opcodes

    return {name: function_opcodes(lines) for name, lines in sass_lines_by_function(kernel_id, arch).items()}


def blocks_per_sm(arch: str, registers: int, smem_bytes: int, threads: int) -> tuple[int, str]:
    """Resident blocks per SM and what limits them ("shared memory", "registers and shared
    memory", ...), by attnlab.gpus.occupancy."""
    from .gpus import occupancy

    occ = occupancy(arch, threads, registers, smem_bytes)
    return occ.blocks_per_sm, " and ".join(occ.limiters)


def md_table(header: list[str], rows: list[list]) -> None:
    """Show a Markdown table (cells converted with str)."""
    from IPython.display import Markdown, display

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    display(Markdown("\n".join(lines)))


def bench_at(kernel_ids: list[str], shapes: list[Shape], quick: bool = True, save: bool = False) -> dict | None:
    """book.bench for shapes of one's choosing (book.bench times the mission shape and a length sweep
    only). On a GPU: time the kernels next to every SDPA backend at `shapes`, causal and not, now
    (record written if `save`) and assert their outputs passed. Without one: the freshest committed
    bench record of the first kernel that holds every one of `shapes` both ways, reduced to its
    fresh kernels, or None."""
    if has_gpu():
        return _measure_now(kernel_ids, list(shapes), quick, save)
    for rec in fresh_records("bench", kernel_ids[0]):
        if covers(rec, kernel_ids, shapes):
            print(f"No CUDA GPU here. Committed bench record:\n  {record_label(rec)}")
            return rec
    return None


def record_rows(rec: dict | None) -> list[dict]:
    """attnlab.results.report_rows of one record (kernel time, fastest SDPA backend, speedup,
    TFLOP/s, share of the datasheet peak and of the matmul ceiling measured in the same run; no
    time where the check FAILED), each row with the record's flash-backend time added as
    `sdpa_flash_us` (None where flash did not run). Empty for None."""
    from .plot import find_case
    from .results import report_rows

    if rec is None:
        return []
    rows = report_rows([rec])
    for row in rows:
        case = find_case(rec, Shape(*row["shape"]), row["causal"])
        flash = case["sdpa"].get("flash")
        row["sdpa_flash_us"] = flash["median_us"] if flash else None
    return rows


# --- chapters 2-4: a kernel's own constants, source diffs, opcode counts ---------------------------

def kernel_constant(source: str, name: str) -> int:
    """`constexpr int NAME = value;` read from kernels/`source`, so that a page quotes the kernel's
    own number rather than a copy of it."""
    import re

    from .paths import kernels_dir

    found = re.search(rf"constexpr int {name} = (\d+);", (kernels_dir() / source).read_text())
    if found is None:
        raise KeyError(f"kernels/{source} defines no `constexpr int {name} = ...;`")
    return int(found.group(1))


def source_diff(old: str, new: str, context: int = 3, new_dir=None, new_label: str | None = None) -> str:
    """Show the unified diff from kernels/`old` to kernels/`new` (or to `new` in `new_dir`, a
    scratch copy, named `new_label`) in the page as a highlighted block and return its text. The
    file names are relative to the repository, so the output is the same on every machine."""
    import difflib
    from pathlib import Path

    from IPython.display import Markdown, display

    from .paths import kernels_dir

    a = (kernels_dir() / old).read_text().splitlines(keepends=True)
    b = (Path(new_dir or kernels_dir()) / new).read_text().splitlines(keepends=True)
    label = new_label or f"kernels/{new}"
    text = "".join(difflib.unified_diff(a, b, f"kernels/{old}", label, n=context))
    display(Markdown(f"````diff\n{text}````"))
    return text


def count_ops(counts: dict[str, int], *prefixes: str) -> int:
    """How many instructions of `counts` (opcode -> count) start with one of the prefixes:
    count_ops(c, "LDG.E.128") counts LDG.E.128 and LDG.E.128.CONSTANT."""
    return sum(n for op, n in counts.items() if any(op == p or op.startswith(p + ".") for p in prefixes))


# --- chapters 5 and 6: SASS listings, named barriers, the ring schedule, variant sweeps ----------

from typing import NamedTuple as _NamedTuple  # noqa: E402

def sass_lines(kernel_id: str, arch: str, *prefixes: str) -> list[str]:
    """The SASS instructions of the kernel's nvcc build for `arch` whose opcode starts with one of
    `prefixes` (all of them when none is given), in program order, as `/*offset*/ OPCODE operands`
    without the encoding. Offsets and registers move between toolkits; opcodes and immediates
    (barrier ids, thread counts) do not."""
    import re

    from .static import build

    text = build(registry.get(kernel_id, arch), arch).sass
    line_re = re.compile(r"(/\*[0-9a-f]{4,}\*/)\s+((?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)[^;]*;)")
    out = []
    for m in line_re.finditer(text):
        if not prefixes or any(m.group(3) == p or m.group(3).startswith(p + ".") for p in prefixes):
            out.append(f"{m.group(1)} {' '.join(m.group(2).split())}")
    return out


def named_barriers(lines: list[str]) -> list[tuple[str, int, int | None]]:
    """(SYNC or ARV, barrier id, thread count or None) of each BAR.SYNC / BAR.ARV in SASS lines
    with immediate operands (`BAR.SYNC.DEFER_BLOCKING 0x1, 0xa0`: barrier 1, 160 threads)."""
    from . import static

    return static.named_barriers("\n".join(lines))


class RingSpan(_NamedTuple):
    """One bar of the ring timeline. lane "copy": the tile's cp.async group in flight (issued by the
    producers) into ring stage `stage`; lane "math": the consumers working on the tile."""
    lane: str
    tile: int
    stage: int
    start: float
    end: float


def ring_schedule(stages: int, n_tiles: int, copy_time: float, math_time: float,
                  issue_time: float = 0.0) -> list[RingSpan]:
    """When each key tile is copied and consumed under the hand-off of kernels/06_warp_specialized.cu,
    if one tile's copy takes `copy_time` from issue to landing, the consumers' math on a tile takes
    `math_time`, and issuing a tile's copies keeps the producers busy for `issue_time`.

    The producers follow produce() step by step: step t waits on EMPTY for tile t - STAGES (the
    consumers' release), issues tile t, then waits for tile t - LAG (LAG = STAGES - 1) to land and
    arrives on its FULL barrier. The consumers follow the compute loop: wait on FULL for tile t,
    compute, release the stage. Copies in flight do not slow each other (a latency model: no
    bandwidth limit), and the producer warps act as one. Asserts the two safety rules the CPU
    simulation in tests/test_model_05_06.py checks under every interleaving: a tile is consumed only
    after it landed, a stage is refilled only after the consumers released it."""
    if stages < 1 or n_tiles < 0 or min(copy_time, math_time, issue_time) < 0:
        raise ValueError("stages >= 1, n_tiles >= 0 and non-negative times")
    lag = stages - 1
    land: dict[int, float] = {}
    full: dict[int, float] = {}
    released: dict[int, float] = {}
    spans: list[RingSpan] = []
    producer = consumer = 0.0
    next_tile = 0

    def consume_through(last: int) -> None:
        nonlocal consumer, next_tile
        while next_tile <= last:
            t = next_tile
            start = max(consumer, full[t])                       # bar.sync FULL[t % STAGES]
            assert start >= land[t], f"tile {t} consumed before it landed"
            consumer = start + math_time
            spans.append(RingSpan("math", t, t % stages, start, consumer))
            released[t] = consumer                               # bar.arrive EMPTY[t % STAGES]
            next_tile += 1

    for t in range(n_tiles + lag):
        if t < n_tiles:
            if t >= stages:
                consume_through(t - stages)
                producer = max(producer, released[t - stages])   # bar.sync EMPTY[t % STAGES]
            start = producer
            producer += issue_time                               # the cp.async instructions
            land[t] = start + max(copy_time, issue_time)
            spans.append(RingSpan("copy", t, t % stages, start, land[t]))
        if t >= lag:                                             # cp.async.wait_group LAG
            producer = max(producer, land[t - lag])
            full[t - lag] = producer                             # bar.arrive FULL
    consume_through(n_tiles - 1)
    for s in spans:
        if s.lane == "copy" and s.tile >= stages:
            assert s.start >= released[s.tile - stages], f"stage {s.stage} refilled before release"
    return spans


def ring_makespan(spans: list[RingSpan]) -> float:
    """The time the consumers finish the last tile of a ring_schedule."""
    return max((s.end for s in spans if s.lane == "math"), default=0.0)


def ring_timeline_figure(rows: list[tuple[str, list[RingSpan]]], unit: str = "one tile's math"):
    """One panel per (title, ring_schedule(...)): a row per ring stage with the copies in flight into
    it, and a row with the consumers' math, each bar labelled with its key tile, on a common axis."""
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab10").colors
    heights = [1 + max((s.stage for s in spans), default=0) + 1 for _, spans in rows]
    fig, axes = plt.subplots(len(rows), 1, figsize=(9, 0.42 * sum(heights) + 0.55 * len(rows) + 0.6),
                             sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights})
    for ax, (title, spans), n_rows in zip(axes[:, 0], rows, heights):
        for s in spans:
            y = 0 if s.lane == "math" else 1 + s.stage
            ax.barh(y, s.end - s.start, left=s.start, height=0.62, color=colors[s.tile % 10],
                    edgecolor="black", lw=0.5, alpha=0.95 if s.lane == "math" else 0.4,
                    hatch=None if s.lane == "math" else "//")
            ax.text((s.start + s.end) / 2, y, str(s.tile), ha="center", va="center", fontsize=7)
        end = ring_makespan(spans)
        ax.axvline(end, color="black", lw=0.8, ls=":")
        ax.set_yticks(range(n_rows), ["consumers: math"] + [f"stage {k}: copy" for k in range(n_rows - 1)],
                      fontsize=7)
        ax.set_ylim(-0.6, n_rows - 0.4)
        ax.set_title(f"{title}: last tile done at {end:.2f}", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel(f"time, in units of {unit} (hatched: a copy in flight; label and colour: key tile)")
    fig.tight_layout()
    return fig


def sweep_ratios(rec: dict, kernel_ids: list[str], baseline: str, causal: bool = False,
                 B: int = MISSION.B, H: int = MISSION.H, D: int = MISSION.D) -> dict[str, list[tuple]]:
    """kernel -> [(L, baseline time / kernel time, noise)] over the record's cases at (B, H, *, D):
    above 1 the kernel is faster than `baseline` in the same run. `noise` is the larger of the two
    relative half-spreads ((p90 - p10) / 2 / median): a ratio within 1 +- noise is no difference."""
    out: dict[str, list[tuple]] = {}
    for case in sorted(rec["cases"], key=lambda c: c["shape"][2]):
        b, h, L, d = case["shape"]
        if case["causal"] != causal or (b, h, d) != (B, H, D):
            continue
        base = case["kernels"].get(baseline, {}).get("device")
        if base is None:
            continue
        for kid in kernel_ids:
            t = case["kernels"].get(kid, {}).get("device")
            if t is None:
                continue
            noise = max((x["p90_us"] - x["p10_us"]) / 2 / x["median_us"] for x in (t, base))
            out.setdefault(kid, []).append((L, base["median_us"] / t["median_us"], noise))
    return out


def sweep_ratio_figure(rec: dict, kernel_ids: list[str], baseline: str, causal: bool = False,
                       B: int = MISSION.B, H: int = MISSION.H, D: int = MISSION.D, labels: dict | None = None):
    """Speed relative to `baseline` (its time over each kernel's, same run) against L, one line per
    kernel, with the baseline's own p10-p90 band around 1."""
    import matplotlib.pyplot as plt

    ratios = sweep_ratios(rec, kernel_ids, baseline, causal, B, H, D)
    if not ratios:
        raise KeyError(f"record has no case with {baseline} and {kernel_ids} at B={B}, H={H}, D={D}")
    from .plot import failed

    failures: dict[str, list[int]] = {}  # a failed output has no time, so no ratio: named instead
    for case in sorted(rec["cases"], key=lambda c: c["shape"][2]):
        if case["causal"] == causal and (case["shape"][0], case["shape"][1], case["shape"][3]) == (B, H, D):
            for kid in [baseline, *kernel_ids]:
                if failed(case["kernels"].get(kid, {})):
                    failures.setdefault(kid, []).append(case["shape"][2])
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for kid, pts in ratios.items():
        label = (labels or {}).get(kid, kid)
        if kid in failures:
            label += f" (FAILED its check at L={', '.join(map(str, failures[kid]))})"
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[1] * p[2] for p in pts],
                    marker="o", ms=3, capsize=2, label=label)
    if baseline in failures:
        ax.plot([], [], color="black", label=f"{baseline} FAILED its check at L={', '.join(map(str, failures[baseline]))}")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length L")
    ax.set_ylabel(f"speed relative to {baseline} (>1: faster)")
    ax.set_title(f"B={B}, H={H}, D={D}, causal={causal}\n{record_label(rec)}", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def bench_covering(kernel_ids: list[str], shapes: list[Shape], quick: bool = True, save: bool = False) -> dict | None:
    """bench_at for a comparison that needs every kernel in one run (a sweep of variants). On a GPU
    it measures now, as bench_at does. Without one it shows only a committed bench record that timed
    every kernel of `kernel_ids` from its current source at every one of `shapes`, causal and not;
    None when there is none."""
    if has_gpu():
        return bench_at(kernel_ids, shapes, quick=quick, save=save)
    for rec in fresh_records("bench", kernel_ids[0]):
        if covers(rec, kernel_ids, shapes, "device"):
            print(f"No CUDA GPU here. Committed bench record:\n  {record_label(rec)}")
            return rec
    return None
