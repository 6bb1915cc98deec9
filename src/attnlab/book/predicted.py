"""Predicted times as the pages show them (attnlab.model.bounds): a chapter's one line, the model
page's tables, and the climb. Every time here says "predicted"; where a fresh GPU record holds the
kernel, the measured time stands beside it with the model's error, and the record is never
replaced by a prediction.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..gpus import lookup
from ..model.bounds import ARCH_RATES, LAUNCH_US, PREDICTED_GPUS, Prediction, predict
from ..shapes import MISSION, Shape

PREDICTED_HATCH = "///"


def _without_executor(fn):
    """A figure or table of predictions on a machine without a C++ compiler (the model needs the
    executor's counts): one notice saying so, and nothing drawn."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from ..executor.build import ExecutorUnavailable
        from .page import notice

        try:
            return fn(*args, **kwargs)
        except ExecutorUnavailable as exc:
            notice(f"**Not predicted here.** {exc}: the model needs the CPU executor's counts.")
            return None
    return wrapper


def fmt(us: float) -> str:
    import math

    return f"{us:,.1f} µs predicted" if math.isfinite(us) else "not given"


def predictions(kernel_id: str, shape: Shape = MISSION, causal: bool = False, gpus=PREDICTED_GPUS) -> dict[str, Prediction]:
    return {g: predict(kernel_id, shape, causal, g) for g in gpus}


def line(kernel_id: str, shape: Shape = MISSION, causal: bool = False) -> str:
    """One sentence: the predicted time on each of PREDICTED_GPUS and what bounds it."""
    parts = [f"{fmt(p.time_us)} on the {g}, bound by {p.bottleneck}"
             + (f" (its own launch; {', '.join(b.resource for b in p.extra)} added)" if p.extra else "")
             for g, p in predictions(kernel_id, shape, causal).items()]
    return (f"Predicted on {' and '.join(PREDICTED_GPUS)} by the book's time model, not measured, for {kernel_id} at "
            f"{shape.label()}{', causal' if causal else ''}: " + "; ".join(parts) + ".")


@_without_executor
def show_line(kernel_id: str, shape: Shape = MISSION, causal: bool = False) -> None:
    """The prediction, and under it, where a fresh GPU record holds the case, the measured time
    beside it with what the GPU's counters say of the difference (versus)."""
    from .page import notice

    notice(line(kernel_id, shape, causal) + " The page \"The time model\" states what it assumes.")
    for text in versus(kernel_id, shape, causal):
        notice(text)


# A measured time within this share of the prediction is a hit; further off, a miss to explain.
HIT = 0.05


def versus(kernel_id: str, shape: Shape = MISSION, causal: bool = False) -> list[str]:
    """Per GPU with a fresh bench record of the case that the model knows: the measured time beside
    the prediction, and where they differ, what Nsight Compute counted of the kernel on that GPU
    (attnlab.book.counters): the measurement that says why."""
    from . import counters
    from .measured import fmt_us, record_label

    out = []
    for rec, gpu, measured_us, p in _measured_cases(kernel_id, shape, causal):
        ratio = measured_us / p.time_us
        head = (f"**Measured against predicted.** On {record_label(rec)}, {fmt_us(measured_us)} measured at "
                f"{shape.label()}{', causal' if causal else ''}, where the model predicted {p.time_us:,.1f} µs for "
                f"the {gpu.key}, bound by {p.bottleneck}:")
        times = f"{ratio:.1f}" if ratio >= 2 else f"{ratio:.2f}"
        if abs(ratio - 1) <= HIT:
            out.append(f"{head} within {HIT:.0%}.")
        elif ratio < 1:
            launch = p.launches * LAUNCH_US
            out.append(f"{head} {1 / ratio:.2f} times faster than predicted. The model charges each of the "
                       f"{p.launches} launches {LAUNCH_US:g} µs, {launch / p.time_us:.0%} of its prediction; the bench "
                       f"replays the launches in a CUDA graph, whose cost per launch the book has not measured, "
                       f"so this is where to look first, not yet a finding.")
        elif (r := counters.occupancy_row(kernel_id, shape, causal, rec["gpu"]["name"])) is None:
            out.append(f"{head} {times} times the prediction. No profile record of this kernel at this case "
                       f"on that GPU holds the counters that would say why (`python -m attnlab profile {kernel_id}` on a GPU).")
        else:
            out.append(f"{head} {times} times the prediction. " + _counted_why(r))
    return out


# Below these, ncu's counts name a cause the model leaves out: SMs left idle, or too few warps.
BUSY_SMS = 90.0     # % of the kernel's cycles an SM held a warp
MANY_WARPS = 16.0   # warps resident per SM (of 64), enough to hide most latencies


def _counted_why(r: dict) -> str:
    """What Nsight Compute counted of the kernel (a profile row), read against the model's premise
    that every SM is busy at the bound's full rate."""
    from . import counters

    held = counters.warps(r)
    issue = (f", and its schedulers issued {r[counters.ISSUE]:.2f} instructions per active cycle"
             if r.get(counters.ISSUE) is not None else "")
    causes = [f"SMs idle {100 - r['SMs active %']:.0f}% of the kernel's cycles"] if r["SMs active %"] < BUSY_SMS else []
    causes += [f"{held:.1f} warps per SM, too few to hide the waits on each other and on results whose latency "
               "varies (shared memory, `ex2`, global memory)"] if held < MANY_WARPS else []
    return (f"Nsight Compute counted (`{r['function']}`, {r['gpu']}, {r['date']}): its SMs held a warp "
            f"{r['SMs active %']:.0f}% of the kernel's cycles, each SM {held:.1f} of the 64 warps it can hold{issue}. "
            "The model takes every SM busy at the bound's full rate"
            + (f"; what it leaves out here: {' and '.join(causes)}." if causes else
               "; these counts do not show what it leaves out here."))


@_without_executor
def show_bounds(kernel_id: str, shape: Shape = MISSION, causal: bool = False) -> None:
    """The table of bounds_rows on the page."""
    from .page import md_table

    md_table(*bounds_rows(kernel_id, shape, causal))


def bounds_rows(kernel_id: str, shape: Shape = MISSION, causal: bool = False) -> tuple[list[str], list[list]]:
    """Resource by GPU: each bound (predicted), the largest marked, then the launches and total."""
    preds = predictions(kernel_id, shape, causal)
    header = ["resource", *[f"{g} (predicted)" for g in preds]]
    names = [b.resource for b in next(iter(preds.values())).bounds]
    extra = [b.resource for b in next(iter(preds.values())).extra]
    rows = []
    for name in names + extra:
        cells = []
        for p in preds.values():
            b = next(b for b in p.bounds + p.extra if b.resource == name)
            mark = " **(bottleneck)**" if b is p.top else ""
            cells.append(f"{fmt(b.time_us)}{mark}")
        rows.append([name, *cells])
    rows.append(["launches", *[f"{p.launches} x {fmt(LAUNCH_US)}" for p in preds.values()]])
    rows.append(["**total**", *[f"**{fmt(p.time_us)}**" for p in preds.values()]])
    return header, rows


def _measured(kernel_id: str, shape: Shape, causal: bool):
    """(record, GPU, measured µs) per GPU the model knows, from the newest fresh bench record of the
    kernel holding the case (fresh_records' order): one per GPU."""
    from .measured import case_time
    from .page import fresh_records

    seen = set()
    for rec in fresh_records("bench", kernel_id):
        measured_us = case_time(rec, kernel_id, shape, causal)
        gpu = lookup(rec["gpu"]["name"])
        if measured_us is None or gpu is None or gpu.arch not in ARCH_RATES or gpu.key in seen:
            continue
        seen.add(gpu.key)
        yield rec, gpu, measured_us


def _measured_cases(kernel_id: str, shape: Shape, causal: bool):
    """_measured's (record, GPU, measured µs), each with the prediction for that GPU."""
    for rec, gpu, measured_us in _measured(kernel_id, shape, causal):
        yield rec, gpu, measured_us, predict(kernel_id, shape, causal, gpu.key)


def measured_rows(kernel_ids, shape: Shape = MISSION, causal: bool = False) -> list[list]:
    """Kernel, GPU, measured (from the freshest record holding it, one row per GPU), predicted for
    that GPU, error; only where a fresh record exists and the model knows the GPU's architecture."""
    from .measured import record_label

    rows = []
    for kid in kernel_ids:
        for rec, _, measured_us, p in _measured_cases(kid, shape, causal):
            rows.append([f"`{kid}`", record_label(rec), f"{measured_us:,.1f} µs measured", fmt(p.time_us),
                         f"{(p.time_us - measured_us) / measured_us:+.0%}"])
    return rows


@_without_executor
def climb_figure(kernel_ids, shape: Shape = MISSION, causal: bool = False, gpus=PREDICTED_GPUS):
    """Each chapter's kernel, its predicted time on each GPU (hatched, labelled predicted), log
    scale, the bottleneck written on each bar."""
    import matplotlib.pyplot as plt
    import numpy as np

    from .executor_view import FIGURE_WIDTH

    preds = {kid: predictions(kid, shape, causal, gpus) for kid in kernel_ids}
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, 3.6))
    width = 0.8 / len(gpus)
    colors = plt.get_cmap("tab10").colors
    x = np.arange(len(kernel_ids))
    for i, g in enumerate(gpus):
        times = [preds[k][g].time_us for k in kernel_ids]
        bars = ax.bar(x + (i - (len(gpus) - 1) / 2) * width, times, width, fill=False, hatch=PREDICTED_HATCH,
                      edgecolor=colors[i], label=f"{g}, predicted")
        for bar, kid in zip(bars, kernel_ids):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() * 1.08, preds[kid][g].bottleneck,
                    rotation=90, ha="center", va="bottom", fontsize=6)
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels(kernel_ids, rotation=20, ha="right", fontsize=7.5)
    ax.set_ylabel("time, µs (predicted, log scale)", fontsize=8)
    ax.set_ylim(top=ax.get_ylim()[1] * 8)
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(f"Predicted by the book's time model from the executor's counts, {shape.label()}"
                 f"{', causal' if causal else ''}: not measured", fontsize=8.5)
    fig.tight_layout()
    return fig


def grid_fill(kernel_id: str, gpu: str, shape: Shape = MISSION, causal: bool = False):
    """(owner SM of each CTA, each CTA's predicted µs on its largest resource, the launch's grid) of
    the launcher's real grid for `gpu` at `shape`, placed as the model places it."""
    import numpy as np

    from ..gpus import by_key
    from ..model.bounds import counted, per_cta_counted, placement

    g = by_key(gpu)
    t = counted(kernel_id, shape, causal, g)  # every CTA run, or at the large shapes one head's
    per_cta = per_cta_counted(t, kernel_id, g)
    return placement(per_cta, g.sms), np.max(np.stack(list(per_cta.values())), axis=0) * 1e6, t.launches[0].grid


def _stack_ctas(ax, owner, us, sms: int, color):
    """Each CTA as a bar on its SM, stacked on those before it in launch order, coloured by
    color(its height, the height below it); the height each SM reaches."""
    import numpy as np

    base = np.zeros(sms)
    for sm, h in zip(owner, us):
        ax.bar(sm, h, bottom=base[sm], width=0.9, color=color(h, base[sm]), edgecolor="white", linewidth=0.3)
        base[sm] += h
    return base


@_without_executor
def grid_fill_figure(kernel_id: str, shape: Shape = MISSION, gpus=PREDICTED_GPUS):
    """Per SM, the CTAs the launcher's grid puts on it (stacked, in the order they arrive), each as
    tall as its predicted time on its largest resource: non-causal and causal, on each GPU. Idle SMs
    and a second wave show as gaps and towers."""
    import matplotlib.pyplot as plt

    from ..gpus import by_key
    from .executor_view import FIGURE_WIDTH

    fig, axes = plt.subplots(2, len(gpus), figsize=(FIGURE_WIDTH, 4.6), squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for col, gpu in enumerate(gpus):
        for row, causal in enumerate((False, True)):
            ax = axes[row][col]
            owner, us, grid = grid_fill(kernel_id, gpu, shape, causal)
            sms = by_key(gpu).sms
            base = _stack_ctas(ax, owner, us, sms, lambda h, below: colors[2] if below > 0 else colors[0])
            idle = int((base == 0).sum())
            ax.set_title(f"{gpu}{', causal' if causal else ''}: grid {tuple(grid)}, {len(owner)} CTAs on {sms} SMs"
                         f"{f', {idle} idle' if idle else ''}", fontsize=7.5)
            ax.set_xlim(-1, sms)
            ax.tick_params(labelsize=6.5)
            if col == 0:
                ax.set_ylabel("µs predicted per CTA", fontsize=7)
            if row == 1:
                ax.set_xlabel("SM", fontsize=7.5)
    fig.suptitle(f"{kernel_id} at {shape.label()}: where the launcher's CTAs land, each as tall as its predicted "
                 "time (blue: an SM's first CTA; green: those after it)", fontsize=8)
    fig.tight_layout()
    return fig


@_without_executor
def launch_order_figure(kernel_ids, gpu: str = "L4", shape: Shape = MISSION, causal: bool = True):
    """Per SM, the CTAs of each kernel's grid as the model places them (in launch order, each on
    the SM with the least work so far), stacked, each as tall as its predicted time: side by side,
    the same work launched in two orders. The SM that finishes last sets the time."""
    import matplotlib.pyplot as plt

    from ..gpus import by_key
    from .executor_view import FIGURE_WIDTH

    sms = by_key(gpu).sms
    fig, axes = plt.subplots(1, len(kernel_ids), figsize=(FIGURE_WIDTH, 3.0), sharey=True, squeeze=False)
    colors = plt.get_cmap("viridis")
    for ax, kid in zip(axes[0], kernel_ids):
        owner, us, grid = grid_fill(kid, gpu, shape, causal)
        base = _stack_ctas(ax, owner, us, sms, lambda h, below: colors(h / us.max()))
        ax.axhline(base.max(), color="black", lw=0.8, ls=":")
        ax.set_title(f"{kid}: the busiest SM's CTAs, {base.max():.1f} µs predicted", fontsize=7.5)
        ax.set_xlim(-1, sms)
        ax.set_xlabel("SM", fontsize=7.5)
        ax.tick_params(labelsize=6.5)
    axes[0][0].set_ylabel("µs predicted, stacked CTAs", fontsize=7)
    fig.suptitle(f"{gpu}, {shape.label()}{', causal' if causal else ''}: each CTA on the SM with the least work "
                 "so far, in launch order; colour and height: its predicted time (the launch not included)", fontsize=8)
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class Rules:
    """Two rules for the latency bound, to set against the records (the model's first, then the
    other: how to weigh the stalls, or which to count): each as the keyword arguments of
    bounds.predict, the key its ratios take in rule_summary's by_gpu, and its column heading."""
    first: dict
    second: dict
    keys: tuple[str, str]
    headings: tuple[str, str]


# On sm_90, a tensor-core loop's stalls of a scheduler's warps in turn (the model's rule there), or
# an SM's CTAs overlapping theirs as many at a time as it holds (bounds.STALLS_IN_TURN).
TURN = Rules({"turn": True}, {"turn": False}, ("turn", "overlap"), ("stalls in turn", "stalls overlapped"))
# The key-tile loop's stalls alone (the model's rule), or also those of the code outside the loop on
# every warp (issue.stall_cycles's `outside`).
OUTSIDE = Rules({}, {"outside": True}, ("loop", "outside"),
                ("the loop's stalls", "with the code outside the loop"))


def rule_cases(rules: Rules, kernel_ids, shapes, causals=(False, True)):
    """What the records say of `rules`: per kernel, shape, mask and GPU of a fresh record holding
    the case (_measured: the newest per GPU), (record, GPU, kernel, shape, causal, measured µs, the
    prediction by the first rule, the prediction by the second)."""
    for kid in kernel_ids:
        for shape in shapes:
            for causal in causals:
                for rec, gpu, measured_us in _measured(kid, shape, causal):
                    yield (rec, gpu, kid, shape, causal, measured_us, predict(kid, shape, causal, gpu.key, **rules.first),
                           predict(kid, shape, causal, gpu.key, **rules.second))


def _spread(xs) -> str:
    import numpy as np

    return f"{min(xs):.2f}–{max(xs):.2f} (median {float(np.median(xs)):.2f})"


def rule_summary(rules: Rules, cases) -> tuple[list[str], list[list], dict]:
    """rule_cases, one row per GPU: the cases, and measured over predicted by each rule (least,
    median, most); and per GPU key those ratios under rules.keys, for the prose to quote."""
    from .measured import record_label

    by_gpu: dict[str, dict] = {}
    for rec, gpu, _, _, _, measured_us, first, second in cases:
        got = by_gpu.setdefault(gpu.key, {"label": record_label(rec), **{k: [] for k in rules.keys}})
        got[rules.keys[0]].append(measured_us / first.time_us)
        got[rules.keys[1]].append(measured_us / second.time_us)
    header = ["record", "cases", *(f"measured / predicted, {h}" for h in rules.headings)]
    rows = [[g["label"], len(g[rules.keys[0]]), *(_spread(g[k]) for k in rules.keys)] for g in by_gpu.values()]
    return header, rows, by_gpu


def rule_rows(rules: Rules, cases) -> tuple[list[str], list[list]]:
    """rule_cases, one row per case: kernel, record's GPU, shape, mask, measured, and both predictions."""
    header = ["kernel", "GPU", "shape", "causal", "measured", *rules.headings]
    rows = [[f"`{kid}`", gpu.key, shape.label(), "yes" if causal else "no", f"{measured_us:,.1f} µs measured",
             fmt(first.time_us), fmt(second.time_us)]
            for _, gpu, kid, shape, causal, measured_us, first, second in cases]
    return header, rows


@_without_executor
def show_rules(rules: Rules, kernel_ids, shapes) -> dict | None:
    """rule_summary's table of the kernels at `shapes` as a cell's output, or a notice that no fresh
    record holds them; returns {"cases": rule_cases, "by_gpu": rule_summary's ratios}, or None."""
    from .page import md_table, notice

    cases = list(rule_cases(rules, kernel_ids, shapes))
    if not cases:
        notice("No fresh GPU record holds these kernels at these shapes: the records cannot weigh the rules here.")
        return None
    header, rows, by_gpu = rule_summary(rules, cases)
    md_table(header, rows)
    return {"cases": cases, "by_gpu": by_gpu}


def _sentence(parts) -> str:
    text = "; ".join(parts)
    return text[:1].upper() + text[1:] + "." if text else ""


def turn_sentence(by_gpu: dict) -> str:
    """rule_summary's ratios under TURN per GPU as the prose quotes them: medians, spreads, and how
    many of the cases ran slower than the prediction with the stalls in turn; empty where no GPU has a case."""
    import numpy as np

    def one(g: dict) -> str:
        turn, overlap = g["turn"], g["overlap"]
        slower = sum(r > 1 for r in turn)
        return (f"on {g['label']}, the {len(turn)} step times ran at a median {float(np.median(turn)):.2f}x the "
                f"prediction with the stalls in turn ({min(turn):.2f}x to {max(turn):.2f}x; {slower} of them slower "
                f"than predicted), and at a median {float(np.median(overlap)):.2f}x the prediction with them "
                f"overlapped ({min(overlap):.2f}x to {max(overlap):.2f}x)")
    return _sentence(one(g) for g in by_gpu.values())


def outside_sentence(by_gpu: dict) -> str:
    """rule_summary's ratios under OUTSIDE per GPU as the prose quotes them: medians and spreads,
    and how many cases ran faster than the prediction with the code outside the loop counted, which
    a bound never does; empty where no GPU has a case."""
    import numpy as np

    def one(g: dict) -> str:
        loop, outside = g["loop"], g["outside"]
        faster = sum(r < 1 for r in outside)
        return (f"on {g['label']}, the {len(loop)} step times ran at a median {float(np.median(loop)):.2f}x the "
                f"prediction from the loop's stalls ({min(loop):.2f}x to {max(loop):.2f}x), and at a median "
                f"{float(np.median(outside)):.2f}x the prediction with the code outside the loop counted on every warp "
                f"({min(outside):.2f}x to {max(outside):.2f}x; {faster} of them faster than that prediction)")
    return _sentence(one(g) for g in by_gpu.values())
