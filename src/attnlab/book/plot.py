"""Figures the book reuses, drawn from records only (never from numbers typed by hand)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # the book and the tests render off-screen; notebooks still show the PNG
import matplotlib.pyplot as plt  # noqa: E402

from ..gpus import GpuSpec, arithmetic_intensity, floor, lookup  # noqa: E402
from ..reference import SDPA_BACKENDS  # noqa: E402
from ..shapes import Shape  # noqa: E402

SDPA_COLORS = {"flash": "#1f77b4", "efficient": "#2ca02c", "cudnn": "#9467bd", "math": "#7f7f7f"}
KERNEL_COLOR = "#d62728"


def _caption(rec: dict) -> str:
    return f"{rec['gpu']['name']}, {rec['created_utc'][:10]}, commit {str(rec['git'].get('commit'))[:8]}"


def find_case(rec: dict, shape, causal: bool) -> dict | None:
    for case in rec["cases"]:
        if list(case["shape"]) == list(shape) and case["causal"] == causal:
            return case
    return None


def failed(entry: dict) -> bool:
    """A bench entry whose output failed its check: it has no time, and figures say FAILED."""
    return "check" in entry and not entry["check"]["passed"]


def failed_labels(rec: dict, shape: Shape) -> list[str]:
    """The kernels (with " causal") whose output FAILED its check at `shape` in a record."""
    out = []
    for causal in (False, True):
        case = find_case(rec, shape, causal) or {"kernels": {}}
        out += [f"{kid}{' causal' if causal else ''}" for kid, e in case["kernels"].items() if failed(e)]
    return out


def latency_bars(rec: dict, shape: Shape, causal: bool = False, ax=None):
    """Median device time (p10-p90 whiskers) of each kernel and SDPA backend at one shape; a
    kernel whose output failed its check gets no bar, only the word FAILED."""
    case = find_case(rec, shape, causal)
    if case is None:
        raise KeyError(f"record has no case {shape.label()} causal={causal}")
    labels, med, lo, hi, colors = [], [], [], [], []
    failures = []
    for kid, entry in case["kernels"].items():
        if failed(entry):
            failures.append(len(labels))
            labels.append(kid), med.append(0.0), lo.append(0.0), hi.append(0.0)
            colors.append(KERNEL_COLOR)
        elif "device" in entry:
            t = entry["device"]
            labels.append(kid), med.append(t["median_us"]), lo.append(t["p10_us"]), hi.append(t["p90_us"])
            colors.append(KERNEL_COLOR)
    for name in SDPA_BACKENDS:
        if name in case["sdpa"]:
            t = case["sdpa"][name]
            labels.append(f"SDPA {name}"), med.append(t["median_us"]), lo.append(t["p10_us"]), hi.append(t["p90_us"])
            colors.append(SDPA_COLORS[name])
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 0.45 * len(labels) + 1.6))
    y = range(len(labels))
    err = [[m - l for m, l in zip(med, lo)], [h - m for m, h in zip(med, hi)]]
    ax.barh(list(y), med, xerr=err, color=colors, capsize=3)
    ax.set_yticks(list(y), labels)
    ax.invert_yaxis()
    ax.set_xscale("log")
    timed = [m for i, m in enumerate(med) if i not in failures]
    for i in failures:  # no bar: the word, at the left edge of the timed bars
        ax.text(min(timed) / 2 if timed else 1.0, i, "FAILED its check: no time", va="center", fontsize=8,
                color="tab:red")
    ax.set_xlabel("device time per call, µs (median, p10-p90)")
    gpu = lookup(rec["gpu"]["name"])
    if gpu is not None:
        f = floor(shape, gpu, causal)
        ax.axvline(f.us, color="black", ls="--", lw=1, label=f"floor on {gpu.key} ({f.bound}-bound)")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_title(f"{shape.label()} causal={causal}\n{_caption(rec)}", fontsize=9)
    if fig is not None:
        fig.tight_layout()
    return fig or ax.figure


def length_sweep(rec: dict, B: int, H: int, D: int, causal: bool = False, ax=None):
    """Device time against sequence length for every kernel and SDPA backend in a record."""
    cases = sorted((c for c in rec["cases"] if c["causal"] == causal and c["shape"][0] == B
                    and c["shape"][1] == H and c["shape"][3] == D), key=lambda c: c["shape"][2])
    if not cases:
        raise KeyError(f"record has no sweep at B={B}, H={H}, D={D}, causal={causal}")
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 4.2))
    series: dict[str, list[tuple[int, float]]] = {}
    failures: dict[str, list[int]] = {}
    for c in cases:
        for kid, entry in c["kernels"].items():
            if failed(entry):
                failures.setdefault(kid, []).append(c["shape"][2])
            elif "device" in entry:
                series.setdefault(kid, []).append((c["shape"][2], entry["device"]["median_us"]))
        for name, t in c["sdpa"].items():
            series.setdefault(f"SDPA {name}", []).append((c["shape"][2], t["median_us"]))
    for label, pts in series.items():
        name = label.removeprefix("SDPA ")
        style = dict(color=SDPA_COLORS.get(name, KERNEL_COLOR), marker="o", ms=3)
        if label.startswith("SDPA"):
            style["ls"] = "--"
        if label in failures:
            label += f" (FAILED its check at L={', '.join(map(str, failures[label]))}: not drawn there)"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
    for kid in failures.keys() - series.keys():
        ax.plot([], [], color=KERNEL_COLOR, label=f"{kid} (FAILED its check at every L: no time)")
    gpu = lookup(rec["gpu"]["name"])
    if gpu is not None:
        Ls = [c["shape"][2] for c in cases]
        ax.plot(Ls, [floor(Shape(B, H, L, D), gpu, causal).us for L in Ls], color="black", lw=1,
                label=f"floor ({gpu.key})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length L")
    ax.set_ylabel("device time, µs")
    ax.set_title(f"B={B}, H={H}, D={D}, causal={causal}\n{_caption(rec)}", fontsize=9)
    ax.legend(fontsize=8)
    if fig is not None:
        fig.tight_layout()
    return fig or ax.figure


def roofline(gpu: GpuSpec, points: list[tuple[str, Shape, bool, float]] = (), ceilings: dict | None = None, ax=None):
    """The GPU's roofline with measured points (label, shape, causal, device time in µs).

    `ceilings` (a bench record's measured matmul and copy rates) draws the reachable roof too.
    """
    import numpy as np

    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 4.2))
    ai = np.logspace(0, 4, 200)
    ax.plot(ai, np.minimum(gpu.fp16_tflops, ai * gpu.dram_gbps / 1e3), color="black",
            label=f"{gpu.key} datasheet: {gpu.fp16_tflops:g} TFLOP/s, {gpu.dram_gbps:g} GB/s")
    if ceilings:
        peak, bw = ceilings["matmul"]["tflops"], ceilings["copy"]["gbps"]
        ax.plot(ai, np.minimum(peak, ai * bw / 1e3), color="gray", ls="--",
                label=f"measured: matmul {peak:.0f} TFLOP/s, copy {bw:.0f} GB/s")
    for label, shape, causal, t_us in points:
        x = arithmetic_intensity(shape, causal)
        ax.scatter([x], [shape.flops(causal) / (t_us * 1e-6) / 1e12], zorder=3)
        ax.annotate(label, (x, shape.flops(causal) / (t_us * 1e-6) / 1e12), fontsize=7,
                    xytext=(4, 2), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity, FLOP per DRAM byte")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"Roofline, fp16 tensor cores with fp32 accumulation: {gpu.key}", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    if fig is not None:
        fig.tight_layout()
    return fig or ax.figure


# One colour per SASS instruction class (attnlab.kernels.static.CLASSES), the same in every figure of the
# book whatever classes a figure shows: compute in reds and blues, integer and control in browns,
# memory in greens (global) and oranges (shared), synchronization in pinks, spills in black.
CLASS_COLORS = {
    "tensor core": "#d62728",
    "fp32 math": "#1f77b4",
    "fp16 math": "#aec7e8",
    "conversion": "#17becf",
    "integer & address": "#8c564b",
    "global load": "#2ca02c",
    "global store": "#98df8a",
    "async copy": "#bcbd22",
    "shared load": "#ff7f0e",
    "shared store": "#ffbb78",
    "local (spill)": "#000000",
    "shuffle": "#9467bd",
    "barrier": "#e377c2",
    "convergence": "#f7b6d2",
    "control flow": "#c49c94",
    "other": "#c7c7c7",
}

# Two targets' binaries of one kernel have "the same mix" when no class differs by more than this
# share of the shown target's instruction count: a sliver of a stacked bar, and what one toolkit's
# scheduling of address arithmetic moves between targets (the largest differences between sm_80,
# sm_89 and sm_90 in chapters 1 to 6 are in "integer & address").
MIX_TOLERANCE = 0.05


def mix_difference(rep, ref) -> float:
    """The largest difference of one class between two static reports, as a share of `ref`'s
    instruction count (0: the same counts in every class)."""
    a, b = rep.sass_by_class(), ref.sass_by_class()
    return max(abs(a[c] - b[c]) for c in b) / max(1, sum(b.values()))


def mix_targets(reports, shown: str = "sm_89", tolerance: float = MIX_TOLERANCE):
    """Which of one kernel's reports (one per target) a mix figure draws: the `shown` target's (the
    L4's sm_89), then every other whose mix differs from it by more than `tolerance`; and the
    targets left out because their mix matches it. Returns (drawn reports, left-out arch names)."""
    ref = next((r for r in reports if r.arch == shown), reports[0])
    drawn = [ref] + [r for r in reports if r is not ref and mix_difference(r, ref) > tolerance]
    return drawn, [r.arch for r in reports if r not in drawn]


def sass_mix(reports, ax=None, labels=None, counts: bool = False):
    """Stacked SASS instruction classes, one bar per static report (`labels`, default each report's
    kernel), every class in its colour of CLASS_COLORS and in the order of attnlab.kernels.static.CLASSES;
    classes with no instruction in any bar are left out of the bars and the legend. `counts`: write
    each class's count in its segment where the segment is wide enough to hold it."""
    from ..kernels.static import CLASSES

    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 0.5 * len(reports) + 1.8))
    names = list(labels) if labels is not None else [r.kernel for r in reports]
    mixes = [r.sass_by_class() for r in reports]
    widest = max(sum(m.values()) for m in mixes)
    left = [0] * len(reports)
    for cls in CLASSES:
        vals = [m[cls] for m in mixes]
        if not any(vals):
            continue
        ax.barh(names, vals, left=left, label=cls, color=CLASS_COLORS[cls])
        if counts:
            dark = cls in ("tensor core", "fp32 math", "integer & address", "global load", "shuffle", "local (spill)")
            for y, (x0, v) in enumerate(zip(left, vals)):
                if v >= 0.05 * widest:
                    ax.text(x0 + v / 2, y, f"{v}", ha="center", va="center", fontsize=7,
                            color="white" if dark else "black")
        left = [a + b for a, b in zip(left, vals)]
    ax.invert_yaxis()
    arches = sorted({r.arch for r in reports})
    ax.set_xlabel(f"SASS instructions in the binary ({', '.join(arches)})")
    ax.legend(fontsize=7, ncol=3, loc="lower right")
    if fig is not None:
        fig.tight_layout()
    return fig or ax.figure


def mix_figure(reports, labels, title: str):
    """sass_mix as a figure of its own, with each class's count in its segment, laid out in inches
    (title, bars, axis, then the legend four classes a row) so that no part overlaps another."""
    from ..kernels.static import CLASSES

    present = [c for c in CLASSES if any(r.sass_by_class()[c] for r in reports)]
    top, bars, axis, legend = 0.5, 0.42 * len(reports) + 0.2, 0.5, 0.16 * -(-len(present) // 4) + 0.12
    height = top + bars + axis + legend
    fig = plt.figure(figsize=(7, height))
    left = 0.1 if max(len(str(x)) for x in labels) <= 6 else 0.2
    ax = fig.add_axes((left, (axis + legend) / height, 0.96 - left, bars / height))
    sass_mix(reports, ax=ax, labels=labels, counts=True)
    ax.set_xlabel("SASS instructions in the binary", fontsize=9)
    ax.get_legend().remove()
    fig.legend(*ax.get_legend_handles_labels(), fontsize=7, ncol=4, loc="lower center",
               bbox_to_anchor=(0.53, 0.01), frameon=False, handlelength=1.5, columnspacing=1.5)
    ax.set_title(title, fontsize=8)
    return fig
