"""The page machinery every chapter shares: its dual-mode steps, its display and glue.

Every chapter runs the same steps: inspect the build, check against SDPA, time next to SDPA.
On a GPU each step measures now. Without one it shows the committed records under results/,
labelled with their GPU and date, and only the kernels whose source still hashes to what was
measured; where no such record exists it says so plainly. The code lives here once, so a chapter
notebook is a sequence of calls, and every number the prose quotes is glued from what a call
returned, never typed.

What a page quotes from a record lives in attnlab.book.measured; the teaching figures of single
chapters in attnlab.book.fragments, attnlab.book.swizzle, attnlab.book.ring and attnlab.book.kernel_view.
"""
from __future__ import annotations

import io
import os

from ..env import device_name, has_gpu
from ..gpus import REFERENCE_GPU, GpuSpec, by_key, lookup
from ..kernels import registry
from ..shapes import MISSION, QUICK_SWEEP_LENGTHS, SWEEP_LENGTHS, Shape, sweep
from .measured import record_label

FIGURE_DPI = 110


# --- display -------------------------------------------------------------------------------

def notice(text: str) -> None:
    """A plain statement in the page (a Markdown block quote), e.g. that no record exists."""
    from IPython.display import Markdown, display

    display(Markdown("> " + text.replace("\n", "\n> ")))


def show(fig) -> None:
    """Show a matplotlib figure as a PNG and close it (None, a figure a cell could not draw, and
    said why: nothing).

    PNG, because nbval does not compare PNG data and an SVG differs on every run; no software
    metadata, so re-executing with nothing changed rewrites the same bytes.
    """
    import matplotlib.pyplot as plt
    from IPython.display import Image, display

    if fig is None:
        return
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=FIGURE_DPI, metadata={"Software": None})
    plt.close(fig)
    display(Image(data=buf.getvalue(), format="png"))


def glue(name: str, value) -> None:
    """myst-nb's glue without the visible output: the page pastes `value` where the prose asks."""
    from myst_nb import glue as _glue

    _glue(name, value, display=False)


def glue_md(name: str, text: str | None) -> None:
    """Glue a Markdown paragraph for a `{glue:md}` block of the prose, or nothing: a sentence that
    reports a measurement exists only where a record does, and a page without one says so once, at
    its top (page_status), rather than in every paragraph."""
    from IPython.display import Markdown

    from myst_nb import glue as _glue

    _glue(name, Markdown(text or ""), display=False)


def md_table_text(header: list[str], rows: list[list]) -> str:
    """A Markdown table (cells converted with str; a "|" in a cell is escaped, not a column)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def md(text: str) -> None:
    """Show Markdown text as a cell's output."""
    from IPython.display import Markdown, display

    display(Markdown(text))


def md_table(header: list[str], rows: list[list]) -> None:
    """Show a Markdown table (md_table_text) as a cell's output."""
    md(md_table_text(header, rows))


# --- the machine -----------------------------------------------------------------------------

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


def page_status(kernel_ids: list[str], notebook: str | None, kind: str = "bench") -> bool:
    """The top of a page: what its measuring cells do on this machine and, on one without a GPU
    where no fresh record of `kind` ("bench", "search", "profile", ...) holds any of the page's
    kernels, the page's one notice: no time below is measured (counts on the CPU executor are), and
    the command that measures the times.
    Returns whether the page has measurements to show (a GPU, or a fresh record); without them its
    cells leave times, ratios, and the tables and figures drawn from them out, and every
    prediction stays a prediction. `notebook` None: a page drawn from every chapter's records
    (the landing page), measured by re-executing them all."""
    if has_gpu() or any(fresh_records(kind, k) for k in kernel_ids):
        notice(mode_line())
        return True
    whose = "the chapters'" if notebook is None else "its"
    why = (_stale_note(kind, kernel_ids[0]) if len(kernel_ids) == 1 else
           f"None of {whose} {len(kernel_ids)} kernels has a {kind} record under results/ that is fresh.")
    notice(f"**No time on this page is measured yet.** This machine has no CUDA GPU. {why} The page "
           "measures what needs no GPU: builds, checks on the CPU executor and, where a chapter shows them, "
           "its kernel's counts of execution there (bytes, requests, instructions: never times). Times, "
           "ratios and the tables and figures drawn from them are left out; predictions stay predictions. "
           f"On a CUDA GPU, `python tools/run_book.py "
           f"{notebook + ' ' if notebook else ''}--save-results` measures them and writes the records "
           "under `results/`.")
    return False


# --- records ---------------------------------------------------------------------------------


def fresh_records(kind: str, kernel_id: str) -> list[dict]:
    """Committed records of `kind` in which `kernel_id` is fresh (attnlab.records.results: bound to this
    repository, physical, and measured from what would run now), each reduced to its fresh
    kernels: the reference GPU's first, then the latest commit first."""
    from ..records.results import fresh_records as shown

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
    "check" or "device") that entry for every kernel in each, or the run's word that the kernel
    cannot take that shape on its GPU ("skipped": chapter 7's 64-key split at D = 128 on an L4)."""
    from .plot import find_case

    def has(case, k):
        return any(key in case["kernels"].get(k, {}) for key in (entry, "skipped"))

    cases = [find_case(rec, s, c) for s in shapes for c in (False, True)]
    return all(case and (entry is None or all(has(case, k) for k in kernel_ids)) for case in cases)


def reusable_bench(kernel_ids: list[str], shapes) -> dict | None:
    """The newest fresh bench record on this GPU holding every kernel's check (and time, where it
    passed) at every shape, causal and not."""
    return next((rec for rec in _this_gpu(fresh_records("bench", kernel_ids[0]))
                 if covers(rec, kernel_ids, shapes, "check")), None)


def _stale_note(kind: str, kernel_id: str) -> str:
    from ..records.results import as_bound, load_records

    loaded, _ = load_records()
    old = [item for item in loaded if item.record.get("kind") == kind and kernel_id in item.record.get("kernels", {})]
    if not old:
        return f"No {kind} record of {kernel_id} is committed under results/."
    last = old[-1]
    why = ("it is refused: " + last.refused[0] if last.refused else
           "it measured uncommitted changes" if last.local else "; ".join(last.stale.get(kernel_id, [])))
    return (f"The committed {kind} records of {kernel_id} ({len(old)}) are not shown; the latest, "
            f"{record_label(as_bound(dict(last.record), last))}, is not fresh: {why}.")


# --- chapter steps ---------------------------------------------------------------------------

def inspect(kernel_id: str, arches=None) -> list:
    """Build the kernel for each target with nvcc, print what ptxas and the SASS say, draw the
    instruction mix and assert the contract (no spills, shared memory within the L4's limit).
    Needs nvcc and cuobjdump, not a GPU."""
    from ..kernels.static import ARCHES, inspect_kernel

    # each target built with its own tiles (chapter 7's key tile follows the architecture)
    reports = [inspect_kernel(registry.get(kernel_id, arch), arch) for arch in (arches or ARCHES)]
    # one row per function the id launches, with the most dynamic shared memory it is launched with
    w = max(len(f.name) for rep in reports for f in rep.functions)
    for rep in reports:
        cls = rep.sass_by_class()
        print(f"{rep.arch:<6} {'function':<{w}} {'registers':>9} {'static smem':>11} {'dynamic smem':>12} "
              f"{'stack':>5} {'spilled':>7}")
        for f in rep.functions:
            print(f"{'':<6} {f.name:<{w}} {f.registers:>9} {f.static_smem:>9} B {f.dynamic_smem:>10} B "
                  f"{f.stack_bytes:>3} B {f.spill_stores + f.spill_loads:>5} B")
        print(f"{'':<6} SASS: {sum(rep.sass.values())} instructions, {cls['fp32 math']} fp32 math, "
              f"{cls['tensor core']} tensor core, {cls['global load']} global load,\n"
              f"{'':<6} {cls['shared load']} shared load, {cls['shared store']} shared store, "
              f"{cls['barrier']} BAR (block barrier), {cls['local (spill)']} local")
    problems = [p for rep in reports for p in rep.problems]
    assert not problems, "\n".join(problems)
    show(mix_figure(reports))
    return reports


def mix_figure(reports, shown: str | None = None):
    """The instruction mix of one kernel's builds: the L4's target (sm_89) and any other target
    whose mix differs from it by more than plot.MIX_TOLERANCE, with each class's count; the title
    names the targets left out, and by how much they differ at most."""
    from .plot import MIX_TOLERANCE, mix_difference, mix_figure as figure, mix_targets

    drawn, same = mix_targets(reports, shown or by_key(REFERENCE_GPU).arch)
    ref = drawn[0]
    if len(drawn) == 1:
        title = f"{ref.kernel}: SASS instruction classes of its {ref.arch} binary (the {REFERENCE_GPU}'s)"
    else:
        title = f"{ref.kernel}: SASS instruction classes, {ref.arch} (the {REFERENCE_GPU}'s) and the targets that differ"
    if same:
        worst = max(mix_difference(r, ref) for r in reports if r.arch in same)
        title += (f"\n{' and '.join(same)}: the same mix, every class within {worst:.1%} of "
                  f"{ref.arch}'s {sum(ref.sass.values())} instructions (not drawn; tolerance {MIX_TOLERANCE:.0%})")
    return figure(drawn, [rep.arch for rep in drawn], title)


def check(kernel_id: str, quick: bool = True, save: bool = False):
    """On a GPU: run the correctness suite now, print it, assert it passed (and write a record if
    `save`). Without one: run the same .cu on the CPU executor at small shapes (check_cpu), then
    print the freshest committed GPU check record if there is one. Returns the cases run."""
    from ..gpu.check import CHECK_SEEDS, CaseResult, format_table, run_suite
    from ..records.results import new_record, write_record

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
    from ..executor.build import ExecutorUnavailable
    from ..executor.cpu import format_table_cpu, run_suite_cpu

    spec = registry.get(kernel_id)
    try:  # (run_suite_cpu leaves out the shapes whose head dim the kernel does not take)
        cases = run_suite_cpu([spec], shapes=shapes, seeds=(seed,), progress=False)
    except ExecutorUnavailable as exc:
        notice(f"**No CUDA GPU and no CPU run.** {exc}.")
        return None
    print(f"The same kernels/{spec.source}, run on attnlab's CPU executor (never a timing):")
    print(format_table_cpu(cases))
    failed = [c for c in cases if not c.passed]
    assert not failed, f"{len(failed)} CPU cases of {kernel_id} failed"
    return cases


def bank_counts_cpu(kernel_ids: list[str], shape: Shape, causal: bool = False) -> dict[str, dict]:
    """Shared-memory bank counts of each kernel over one launch on the CPU executor:
    kernel -> kind ("ldmatrix", "cp.async", "ld/st") -> BankCounts (requests, wavefronts, ideal)."""
    from ..executor.cpu import attention_cpu
    from ..pass_rule import make_inputs

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
    from ..gpu.bench import failed_cases, run_bench
    from ..records.results import reduce_to, write_record

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
    record shown, or None, silently: the page's one notice (page_status) already said so."""
    from .plot import latency_bars, length_sweep

    chapter_kernel = kernel_ids[0]
    if has_gpu():
        rec = _measure_now(kernel_ids, bench_shapes(quick), quick, save)
    else:
        recs = fresh_records("bench", chapter_kernel)
        if not recs:  # the page said so once, at its top (page_status)
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


def bench_at(kernel_ids: list[str], shapes: list[Shape], quick: bool = True, save: bool = False,
             record_of: list[str] | None = None) -> dict | None:
    """book.bench for shapes of one's choosing (book.bench times the mission shape and a length sweep
    only). On a GPU: time the kernels next to every SDPA backend at `shapes`, causal and not, now
    (record written if `save`) and assert their outputs passed. Without one: the freshest committed
    bench record that holds every one of `shapes` both ways, reduced to its fresh kernels, of the
    first kernel of `record_of` that has one (default: the first of `kernel_ids` alone), or None.
    A page comparing one kernel with others names only that kernel; a page that judges a series
    names the series, newest first, so that a kernel added since the last GPU run does not hide the
    record of the ones before it."""
    if has_gpu():
        return _measure_now(kernel_ids, list(shapes), quick, save)
    return _committed_bench(kernel_ids, shapes, record_of or kernel_ids[:1])


def bench_covering(kernel_ids: list[str], shapes: list[Shape], quick: bool = True, save: bool = False) -> dict | None:
    """bench_at for a comparison that needs every kernel in one run (a sweep of variants). On a GPU
    it measures now, as bench_at does. Without one it shows only a committed bench record that timed
    every kernel of `kernel_ids` from its current source at every one of `shapes`, causal and not;
    None when there is none."""
    if has_gpu():
        return bench_at(kernel_ids, shapes, quick=quick, save=save)
    return _committed_bench(kernel_ids, shapes, kernel_ids[:1], "device")


def _committed_bench(kernel_ids: list[str], shapes: list[Shape], record_of: list[str],
                     entry: str | None = None) -> dict | None:
    """Without a GPU: the freshest committed bench record covering `kernel_ids` at `shapes` (with
    `entry` for each, see covers) among those of the first kernel of `record_of` that has one,
    announced as such; None when there is none."""
    for kernel_id in record_of:
        for rec in fresh_records("bench", kernel_id):
            if covers(rec, kernel_ids, shapes, entry):
                print(f"No CUDA GPU here. Committed bench record:\n  {record_label(rec)}")
                return rec
    return None


# --- the environment page ----------------------------------------------------------------------

def environment_lines() -> list[str]:
    """GPU, driver, CUDA, torch and CuPy as attnlab records them, one 'name: value' a line."""
    from ..env import device_info, software_versions

    lines = []
    if has_gpu():
        lines += [f"gpu {k}: {v}" for k, v in device_info().items()]
    else:
        lines.append("gpu: none (torch.cuda.is_available() is False)")
    lines += [f"{k}: {v}" for k, v in software_versions().items()]
    return lines
