"""What the book's notebooks share: the dual-mode steps of a chapter, figures and glue.

Every chapter runs the same steps: inspect the build, check against SDPA, time next to SDPA.
On a GPU each step measures now. Without one it shows the committed records under results/,
labelled with their GPU and date, and only the kernels whose source still hashes to what was
measured; where no such record exists it says so plainly. The code lives here once, so a chapter
notebook is a sequence of calls, and every number the prose quotes is glued from what a call
returned, never typed.
"""
from __future__ import annotations

import copy
import io

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


def only_fresh(rec: dict) -> dict:
    """A copy of a record keeping only the kernels whose source still hashes to what was measured."""
    from .results import current_hashes

    hashes = current_hashes()
    keep = {kid for kid, meta in rec["kernels"].items() if hashes.get(kid) == meta["sha256"]}
    out = copy.deepcopy(rec)
    out["kernels"] = {kid: meta for kid, meta in out["kernels"].items() if kid in keep}
    for case in out["cases"]:
        if "kernels" in case:  # bench
            case["kernels"] = {kid: e for kid, e in case["kernels"].items() if kid in keep}
    if rec["kind"] == "check":
        out["cases"] = [c for c in out["cases"] if c["kernel"] in keep]
    return out


def fresh_records(kind: str, kernel_id: str) -> list[dict]:
    """Committed records of `kind` that measured `kernel_id` from its current source, each reduced
    to its fresh kernels: the reference GPU's first, then newest first."""
    from .results import current_hashes, load_records

    want = current_hashes()[kernel_id]
    loaded, _ = load_records()
    recs = [only_fresh(item.record) for item in reversed(loaded)
            if item.record["kind"] == kind and item.record["kernels"].get(kernel_id, {}).get("sha256") == want]
    return sorted(recs, key=lambda r: lookup(r["gpu"]["name"]) != by_key(REFERENCE_GPU))


def _stale_note(kind: str, kernel_id: str) -> str:
    from .results import load_records

    loaded, _ = load_records()
    old = [item.record for item in loaded if item.record["kind"] == kind and kernel_id in item.record["kernels"]]
    if not old:
        return f"No {kind} record of {kernel_id} is committed under results/."
    return (f"The committed {kind} records of {kernel_id} ({len(old)}, newest: {record_label(old[-1])}) "
            f"measured an older kernels/{registry.get(kernel_id).source}; their numbers are not shown.")


# --- chapter steps ---------------------------------------------------------------------------

def inspect(kernel_id: str, arches=None) -> list:
    """Build the kernel for each target with nvcc, print what ptxas and the SASS say, draw the
    instruction mix and assert the contract (no spills, shared memory within the L4's limit).
    Needs nvcc and cuobjdump, not a GPU."""
    from dataclasses import replace

    from .plot import sass_mix
    from .static import ARCHES, inspect_kernel

    spec = registry.get(kernel_id)
    reports = [inspect_kernel(spec, arch) for arch in (arches or ARCHES)]
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
    `save`). Without one: print the freshest committed check record, or say that none exists.
    Returns the case results shown, or None."""
    from .check import CHECK_SEEDS, CaseResult, format_table, run_suite
    from .results import new_record, write_record

    spec = registry.get(kernel_id)
    if has_gpu():
        seeds = CHECK_SEEDS[:1] if quick else CHECK_SEEDS
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
    recs = fresh_records("check", kernel_id)
    if not recs:
        notice(f"**No fresh check record.** {_stale_note('check', kernel_id)} Without a GPU there is "
               f"no result to show: `python -m attnlab check {kernel_id}` on a GPU writes one.")
        return None
    rec = recs[0]
    results = [CaseResult(**{**c, "shape": tuple(c["shape"])}) for c in rec["cases"] if c["kernel"] == kernel_id]
    assert results, f"record {record_label(rec)} lists {kernel_id} but has no case for it"
    print(f"No CUDA GPU here. Committed check record:\n  {record_label(rec)}")
    print(format_table(results))
    return results


def bench_shapes(quick: bool) -> list[Shape]:
    return list(dict.fromkeys((MISSION,) + sweep(QUICK_SWEEP_LENGTHS if quick else SWEEP_LENGTHS)))


def bench(kernel_ids: list[str], quick: bool = True, save: bool = False) -> dict | None:
    """On a GPU: time the kernels next to every SDPA backend now (and write the record if `save`).
    Without one: the freshest committed bench record of the first kernel, reduced to fresh kernels.
    Either way draw the mission shape's bars and the length sweep, causal and not; return the
    record shown, or None after saying plainly that none exists."""
    from .plot import latency_bars, length_sweep
    from .results import write_record

    chapter_kernel = kernel_ids[0]
    if has_gpu():
        from .bench import run_bench

        rec = run_bench([registry.get(k) for k in kernel_ids], bench_shapes(quick), quick=quick, progress=False)
        print(f"Measured now:\n  {record_label(rec)}")
        if save:
            print(f"record: {write_record(rec)}")
        failed = [(k, c["shape"], c["causal"]) for c in rec["cases"] for k, e in c["kernels"].items()
                  if "check" in e and not e["check"]["passed"]]
        assert not failed, f"wrong output, so these times are no result: {failed}"
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
    """The newest committed bench record taken on `gpu`, reduced to its fresh kernels."""
    from .results import load_records

    loaded, _ = load_records()
    for item in reversed(loaded):
        if item.record["kind"] == "bench" and lookup(item.record["gpu"]["name"]) == gpu:
            return only_fresh(item.record)
    return None


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
    if not entry["check"]["passed"]:
        text += f". Its output FAILED the check in that run ({entry['check']['reason']}), so the time is no result"
    return text


# --- the roofline ------------------------------------------------------------------------------

def floor_text(shape: Shape, gpu: GpuSpec, causal: bool) -> str:
    """Two lines: the floor and its bound, then the compute and memory times it is the larger of."""
    f: Floor = floor(shape, gpu, causal)
    return (f"{gpu.key} {shape.label()} causal={causal}: floor {fmt_us(f.us)}, {f.bound}-bound\n"
            f"  compute {fmt_us(f.compute_us)}, memory {fmt_us(f.memory_us)}")


def roofline_points(rec: dict, shape: Shape = MISSION) -> list[tuple[str, Shape, bool, float]]:
    """(label, shape, causal, µs) of every kernel and SDPA backend a record timed at `shape`."""
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
    from .plot import roofline as draw

    fig = draw(gpu, roofline_points(rec, shape) if rec else [], ceilings=(rec or {}).get("ceilings"))
    ax = fig.axes[0]
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
    lines += [f"malformed: {p}" for p in problems]
    return lines
