"""What a page quotes and draws from a timing record: its label (GPU, date, commit), a kernel's time
at a shape, the sentence the prose glues, the rows of a comparison table, the roofline with the
record's points, and speed ratios over a length sweep. A time appears only where the kernel's
output passed its check in the same run; a failed check is named instead.
"""
from __future__ import annotations

from ..gpus import Floor, GpuSpec, floor, lookup
from ..kernels import registry
from ..shapes import MISSION, Shape


def fmt_us(us: float) -> str:
    return f"{us:.1f} µs" if us >= 10 else f"{us:.2f} µs"


def record_label(rec: dict) -> str:
    commit = str(rec["git"].get("commit") or "unknown")[:8]
    dirty = ", uncommitted changes" if rec["git"].get("dirty") else ""
    return f"{rec['gpu']['name']}, {rec['created_utc'][:10]} (commit {commit}{dirty})"


def latest_bench(gpu: GpuSpec) -> dict | None:
    """The fresh bench record of the latest commit taken on `gpu`, reduced to its fresh kernels."""
    from ..records.results import fresh_records as shown

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
    from ..gpus import tflops
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


def record_rows(rec: dict | None) -> list[dict]:
    """attnlab.records.results.report_rows of one record (kernel time, fastest SDPA backend, speedup,
    TFLOP/s, share of the datasheet peak and of the matmul ceiling measured in the same run; no
    time where the check FAILED), each row with the record's flash-backend time added as
    `sdpa_flash_us` (None where flash did not run). Empty for None."""
    from ..records.results import report_rows
    from .plot import find_case

    if rec is None:
        return []
    rows = report_rows([rec])
    for row in rows:
        case = find_case(rec, Shape(*row["shape"]), row["causal"])
        flash = case["sdpa"].get("flash")
        row["sdpa_flash_us"] = flash["median_us"] if flash else None
    return rows


def recorded_gpus() -> list[str]:
    """One line per GPU with committed records: how many of each kind, the newest date, which
    kernels are fresh there. Empty when results/ holds none."""
    from ..records.results import load_records, verify

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
    from ..gpus import arithmetic_intensity
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
