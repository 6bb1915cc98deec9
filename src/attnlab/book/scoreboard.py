"""Chapter 9: every kernel against every baseline, on every GPU that has a fresh record.

Rows come from the fresh bench records under results/ (attnlab.records.results): one per GPU, kernel,
shape and causal flag, from the newest record that timed it, with the SDPA backends, the Triton
reference and the floor of the same GPU beside it. Ratios are taken within one record (one run).
Nothing here measures; the chapter's GPU cell runs attnlab.gpu.bench over `scoreboard_shapes` first.

It also holds the computations behind the chapter's tests of the earlier study's claims that need
no GPU (the x0.1 inputs), so that the notebook only calls and prints.
"""
from __future__ import annotations

from collections import defaultdict

from ..gpus import floor, lookup, tflops
from ..kernels import registry
from ..reference import SDPA_BACKENDS
from ..shapes import MISSION, Shape

LENGTHS = (128, 256, 512, 1024, 2048, 4096, 8192)
QUICK_LENGTHS = (128, 512, 2048, 8192)
HEAD_DIMS = (64, 128)


def scoreboard_shapes(quick: bool = True) -> list[Shape]:
    """The mission shape, then a sequence-length sweep at B=1, H=8 for D = 64 and 128."""
    lengths = QUICK_LENGTHS if quick else LENGTHS
    return list(dict.fromkeys([MISSION] + [Shape(MISSION.B, MISSION.H, L, D) for D in HEAD_DIMS for L in lengths]))


def rows(root=None, records: list[dict] | None = None) -> list[dict]:
    """Every checked kernel case of the fresh bench records (or of `records`), the latest commit's
    record winning per (GPU, kernel, shape, causal), with the same run's baselines and the GPU's
    floor. A kernel whose output FAILED its check has a row with passed False and no time."""
    from ..records.results import fresh_bench_records

    out: dict[tuple, dict] = {}
    for rec in fresh_bench_records(root) if records is None else records:  # oldest first
        gpu_name = rec["gpu"]["name"]
        gpu = lookup(gpu_name)
        for case in rec["cases"]:
            shape, causal = Shape(*case["shape"]), bool(case["causal"])
            sdpa = {n: t["median_us"] for n, t in case["sdpa"].items()}
            sdpa_host = {n: t["host"]["median_us"] for n, t in case["sdpa"].items() if "host" in t}
            triton = (case.get("baselines") or {}).get("triton", {})
            best_sdpa = min(sdpa, key=sdpa.get) if sdpa else None
            for kid, entry in case["kernels"].items():
                if "check" not in entry:  # skipped: the kernel does not take this shape
                    continue
                passed = bool(entry["check"]["passed"])
                t = entry["device"]["median_us"] if passed and "device" in entry else None
                spec = registry.KERNELS.get(kid)
                f = floor(shape, gpu, causal) if gpu else None
                out[(gpu_name, kid, tuple(shape), causal)] = {
                    "gpu": gpu_name, "kernel": kid, "chapter": spec.chapter if spec else None,
                    "shape": shape, "causal": causal, "median_us": t,
                    "host_us": entry.get("host", {}).get("median_us") if t else None,
                    "passed": passed,
                    "sdpa": sdpa, "sdpa_host": sdpa_host, "best_sdpa": best_sdpa,
                    "best_sdpa_us": sdpa.get(best_sdpa),
                    "vs_sdpa": sdpa[best_sdpa] / t if best_sdpa and t else None,
                    "triton_us": triton.get("device", {}).get("median_us"),
                    "tflops": tflops(shape, causal, t) if t else None,
                    "floor_us": f.us if f else None, "floor_bound": f.bound if f else None,
                    "share_of_peak": tflops(shape, causal, t) / gpu.fp16_tflops if gpu and t else None,
                    "recorded_utc": rec["created_utc"],
                }
    return [out[k] for k in sorted(out, key=lambda k: (k[0], k[2], k[3], registry.KERNELS[k[1]].chapter
                                                        if k[1] in registry.KERNELS else 99, k[1]))]


def gpus(table: list[dict]) -> list[str]:
    return sorted({r["gpu"] for r in table})


def best_per_chapter(table: list[dict], gpu: str, shape: Shape, causal: bool) -> dict[int, dict]:
    """Chapter -> its fastest kernel that passed the check, at one GPU, shape and causal flag."""
    best: dict[int, dict] = {}
    for r in table:
        if r["gpu"] == gpu and r["shape"] == shape and r["causal"] == causal and r["passed"]:
            if r["chapter"] not in best or r["median_us"] < best[r["chapter"]]["median_us"]:
                best[r["chapter"]] = r
    return dict(sorted(best.items()))


def plot_climb(table: list[dict], gpu: str, shape: Shape = MISSION):
    """Chapter by chapter: the fastest SDPA backend's time over the chapter's best kernel's, causal
    and not (above 1: faster than SDPA), from one GPU's records."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.38
    for i, causal in enumerate((False, True)):
        best = best_per_chapter(table, gpu, shape, causal)
        xs = list(best)
        ax.bar([x + (i - 0.5) * width for x in xs], [best[x]["vs_sdpa"] for x in xs], width,
               label=f"causal={causal}")
        for x in xs:
            ax.annotate(best[x]["kernel"], (x + (i - 0.5) * width, best[x]["vs_sdpa"]), fontsize=5.5,
                        rotation=90, ha="center", va="bottom", xytext=(0, 2), textcoords="offset points")
    ax.axhline(1.0, color="black", lw=1, ls="--", label="fastest SDPA backend")
    ax.set_yscale("log")
    ax.set_xlabel("chapter")
    ax.set_ylabel("SDPA time / kernel time (same run)")
    ax.set_title(f"The climb at {shape.label()} on {gpu}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_climb_times(table: list[dict], gpu: str, shape: Shape = MISSION, causal: bool = False):
    """The climb in time, for the landing page: each chapter's fastest kernel that passed at `shape`
    on one GPU, next to every SDPA backend of the newest run among those rows (log scale, µs)."""
    import matplotlib.pyplot as plt

    best = best_per_chapter(table, gpu, shape, causal)
    if not best:
        raise KeyError(f"no passed kernel at {shape.label()} causal={causal} on {gpu}")
    newest = max(best.values(), key=lambda r: r["recorded_utc"])
    labels = [f"ch{c} {r['kernel']}" for c, r in best.items()]
    times = [r["median_us"] for r in best.values()]
    sdpa = sorted(newest["sdpa"].items(), key=lambda kv: kv[1])
    fig, ax = plt.subplots(figsize=(7, 0.32 * (len(labels) + len(sdpa)) + 1.4))
    ax.barh(labels, times, color="tab:blue", label="the book's kernels")
    ax.barh([f"SDPA {n}" for n, _ in sdpa], [t for _, t in sdpa], color="tab:gray",
            label=f"SDPA, run of {newest['recorded_utc'][:10]}")
    for y, t in enumerate(times + [t for _, t in sdpa]):
        ax.annotate(f"{t:.1f} µs" if t >= 10 else f"{t:.2f} µs", (t, y), fontsize=6.5, va="center",
                    xytext=(3, 0), textcoords="offset points")
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("device time, µs (median of CUDA-graph replays; shorter is faster)")
    ax.set_title(f"The climb at {shape.label()}, causal={causal}, on {gpu}", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def chapter_kernels() -> dict[int, str]:
    """Chapter -> its own kernel: the first registered that is no ablation or sweep variant."""
    own: dict[int, str] = {}
    for kid, spec in registry.KERNELS.items():
        if spec.variant_of is None:
            own.setdefault(spec.chapter, kid)
    return dict(sorted(own.items()))


def plot_static_climb(arch: str = "sm_89"):
    """The climb as the binaries tell it, with no GPU and no record: the share of each SASS
    instruction class in the binary of each chapter's own kernel built for `arch` (nvcc and
    cuobjdump, from the build cache), with the instruction count at the right."""
    import matplotlib.pyplot as plt

    from ..kernels.static import CLASSES, inspect_kernel
    from .plot import CLASS_COLORS

    reports = {f"ch{c} {kid}": inspect_kernel(registry.get(kid, arch), arch) for c, kid in chapter_kernels().items()}
    mixes = {label: rep.sass_by_class() for label, rep in reports.items()}
    classes = [c for c in CLASSES if any(m[c] for m in mixes.values())]
    fig, ax = plt.subplots(figsize=(7, 0.42 * len(mixes) + 2.2))
    left = [0.0] * len(mixes)
    for cls in classes:  # each class in its colour of every mix figure of the book
        shares = [m[cls] / sum(m.values()) for m in mixes.values()]
        ax.barh(list(mixes), shares, left=left, label=cls, color=CLASS_COLORS[cls])
        left = [a + b for a, b in zip(left, shares)]
    for y, m in enumerate(mixes.values()):
        ax.annotate(f"{sum(m.values())} instructions", (1.0, y), fontsize=7, va="center", xytext=(4, 0),
                    textcoords="offset points")
    ax.invert_yaxis()
    ax.set_xlim(0, 1.28)
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0], ["0", "25%", "50%", "75%", "100%"])
    ax.set_xlabel(f"share of the SASS instructions in the binary ({arch})")
    ax.set_title(f"What each chapter's kernel asks of the GPU, read from its {arch} binary", fontsize=9)
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    fig.tight_layout()
    return fig


def plot_tflops(table: list[dict], gpu: str, D: int = 64, causal: bool = False):
    """TFLOP/s against L for each chapter's best kernel, SDPA's fastest backend and the Triton
    reference, under the floor's rate (FLOPs over the floor time) of the same GPU; None where the
    records hold no passed time of this head dim and mask at the mission's batch and heads."""
    import matplotlib.pyplot as plt

    spec = lookup(gpu)
    sel = [r for r in table if r["gpu"] == gpu and r["shape"].D == D and r["causal"] == causal
           and r["shape"].B == MISSION.B and r["shape"].H == MISSION.H and r["passed"]]
    if not sel:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    by_chapter: dict[int, dict[int, float]] = defaultdict(dict)
    sdpa: dict[int, float] = {}
    triton: dict[int, float] = {}
    for r in sel:
        L, c = r["shape"].L, r["chapter"]
        by_chapter[c][L] = max(by_chapter[c].get(L, 0.0), r["tflops"])
        sdpa[L] = tflops(r["shape"], causal, r["best_sdpa_us"]) if r["best_sdpa_us"] else sdpa.get(L)
        if r["triton_us"]:
            triton[L] = tflops(r["shape"], causal, r["triton_us"])
    for c, pts in sorted(by_chapter.items()):
        Ls = sorted(pts)
        ax.plot(Ls, [pts[L] for L in Ls], marker="o", ms=3, label=f"chapter {c}")
    for label, pts, style in (("SDPA (fastest backend)", sdpa, "--"), ("Triton reference", triton, ":")):
        Ls = sorted(L for L in pts if pts[L])
        if Ls:
            ax.plot(Ls, [pts[L] for L in Ls], ls=style, color="black", label=label)
    if spec and sel:
        Ls = sorted({r["shape"].L for r in sel})
        ax.plot(Ls, [Shape(MISSION.B, MISSION.H, L, D).flops(causal) / (floor(Shape(MISSION.B, MISSION.H, L, D), spec,
                     causal).us * 1e-6) / 1e12 for L in Ls], color="gray", lw=2, alpha=0.6,
                label=f"the floor's rate ({spec.key})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length L")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"B={MISSION.B}, H={MISSION.H}, D={D}, causal={causal} on {gpu}", fontsize=9)
    ax.legend(fontsize=6.5, ncol=2)
    fig.tight_layout()
    return fig


def plot_host_vs_device(table: list[dict], gpu: str, shape: Shape = MISSION, causal: bool = False):
    """Per kernel and SDPA backend at one shape: device time (CUDA-graph replays) beside the
    latency a Python caller sees (perf_counter around call + synchronize), same run."""
    import matplotlib.pyplot as plt

    sel = [r for r in table if r["gpu"] == gpu and r["shape"] == shape and r["causal"] == causal and r["passed"]]
    labels, dev, host = [], [], []
    for r in sel:
        labels.append(r["kernel"]), dev.append(r["median_us"]), host.append(r["host_us"] or 0)
    if sel:
        for name in SDPA_BACKENDS:
            if name in sel[0]["sdpa"]:
                labels.append(f"SDPA {name}"), dev.append(sel[0]["sdpa"][name])
                host.append(sel[0]["sdpa_host"].get(name, 0))
    fig, ax = plt.subplots(figsize=(7, 0.32 * len(labels) + 1.6))
    y = range(len(labels))
    ax.barh([i - 0.2 for i in y], dev, 0.4, label="device time")
    ax.barh([i + 0.2 for i in y], host, 0.4, label="what a Python caller sees")
    ax.set_yticks(list(y), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("µs per call (median)")
    ax.set_title(f"{shape.label()} causal={causal} on {gpu}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# --- the study's claims that a CPU can test ------------------------------------------------------

def averaging_v(v, causal: bool = False):
    """The kernel that does not compute attention at all: every row's output is the mean of the
    value rows it may see (all of them, or rows 0..i when causal). fp16 out, like a kernel's."""
    import torch

    vf = v.double()
    if causal:
        seen = torch.arange(1, v.shape[-2] + 1, dtype=torch.float64).view(-1, 1)
        return (vf.cumsum(-2) / seen).to(torch.float16)
    return vf.mean(-2, keepdim=True).expand_as(vf).to(torch.float16)


# The earlier study's acceptance check (its bench_sdpa.py): a case passed if the largest absolute
# error or the largest relative error against SDPA was at most this.
STUDY_TOLERANCE = 5e-3
INPUT_CHOICES = ("randn × 0.1 (the study's inputs)", "randn + 0.5 (the book's inputs)")


def draw_inputs(choice: str, shape: Shape, gen):
    """One of q, k, v for an input choice of INPUT_CHOICES, fp16, from a seeded CPU generator."""
    import torch

    x = torch.randn(tuple(shape), generator=gen)
    return (x * 0.1 if choice == INPUT_CHOICES[0] else x + 0.5).to(torch.float16)


def input_scale_experiment(shape: Shape = MISSION, seeds=(0, 1, 2)) -> list[dict]:
    """The averaging 'kernel' against the fp64 reference, with each input choice, causal and not:
    its error, whether the study's check passes it, whether the book's pass rule does, and how far
    from uniform the softmax is (largest weight times the number of keys; 1 = uniform). CPU only."""
    import torch

    from ..pass_rule import judge
    from ..reference import naive_fp16, reference_attention

    out = []
    for label in INPUT_CHOICES:
        for causal in (False, True):
            for seed in seeds:
                gen = torch.Generator().manual_seed(seed)
                q, k, v = (draw_inputs(label, shape, gen) for _ in range(3))
                ref = reference_attention(q, k, v, causal)
                fp16_err = float((naive_fp16(q, k, v, causal).double() - ref).abs().max())
                avg = averaging_v(v, causal)
                diff = (avg.double() - ref).abs()
                abs_err = float(diff.max())
                rel_err = float((diff / ref.abs().clamp_min(1e-30)).max())
                scores = (q[0, 0].double() @ k[0, 0].double().T) / shape.D ** 0.5
                if causal:
                    scores = scores.masked_fill(~torch.ones_like(scores, dtype=torch.bool).tril(), float("-inf"))
                p = torch.softmax(scores, -1)
                visible = torch.arange(1, shape.L + 1, dtype=torch.float64) if causal else torch.full((shape.L,), float(shape.L))
                out.append({"inputs": label, "causal": causal, "seed": seed, "abs_err": abs_err, "rel_err": rel_err,
                            "study_passes": abs_err <= STUDY_TOLERANCE or rel_err <= STUDY_TOLERANCE,
                            "book_passes": judge(avg, ref, fp16_err).passed, "fp16_err": fp16_err,
                            "peak_weight_x_keys": float((p.max(-1).values * visible).max()),
                            "score_std": float(scores[torch.isfinite(scores)].std())})
    return out
