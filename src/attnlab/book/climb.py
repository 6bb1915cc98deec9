"""Chapter 7's pages in steps: what the overview and each step page share.

The steps themselves (kernel ids, techniques, pages) are the registry's STEPS_07; their code and
diffs come from attnlab.kernels.steps. Here: the chapter's target shapes, the step's diff as a
highlighted block, the timings of a step against the step before it (from a GPU record, never
written by hand), and the climb at a glance for the overview page.
"""
from __future__ import annotations

from ..gpus import floor
from ..kernels import steps as code
from ..kernels.registry import PARTS_07, STEPS_07, Step
from ..shapes import CH07_TARGET_SHAPES, MISSION, Shape
from . import measured
from .predicted import _without_executor, predictions
from .predicted import climb_figure as predicted_climb_figure

STEP_IDS = [s.kernel_id for s in STEPS_07]
SPLITS = ["07_mma_split2", "07_mma_split4"]          # two of the launcher's choices, fixed
ABLATIONS = ["07_mma_noswizzle", "07_mma_split_ctas"]  # the last kernel with one thing changed
EARLIER = ["06_warp_specialized", "05_wmma"]          # the chapters it replaces
# The chapter's goal at each of its target shapes (CH07_TARGET_SHAPES, in order): a ratio to the
# fastest SDPA backend of the same run at the mission shape, to SDPA's flash backend at the long ones.
GOALS = (("fastest", 1.5), ("flash", 1.0), ("flash", 0.8))
TARGET_SHAPES = list(CH07_TARGET_SHAPES)
# (shape, causal, baseline, factor): every goal, causal and not
TARGETS = [(s, c, base, factor) for s, (base, factor) in zip(TARGET_SHAPES, GOALS, strict=True) for c in (False, True)]
MISSING = "not timed"  # a kernel a record holds no time for (a failed check is never timed)


def case_name(shape: Shape, causal: bool) -> str:
    return f"{shape.label()}{' causal' if causal else ''}"


def floor_cell(shape: Shape, gpu, causal: bool) -> str:
    f = floor(shape, gpu, causal)
    return f"{measured.fmt_us(f.us)} ({f.bound})"


def diff_block(number: str) -> str:
    """The step's diff against the step before, as a highlighted MyST block."""
    s = code.step_of(number)
    before = code.previous(s)
    if s.rule is not None:
        return (f"Step {s.number} changes no line of the kernel: it runs the entries of steps it already has, "
                f"and changes which launch runs a shape. The launcher's rule, from "
                f"`src/attnlab/kernels/chapters/ch07_mma.py`:\n\n```python\n{code.rule_source(s)}```")
    diff = code.step_diff(before, s)
    n = code.changed_lines(diff)
    return (f"The diff from step {before.number} (`{before.kernel_id}`), {n} changed lines, generated from "
            f"`kernels/07_mma_swizzle.cu` with each step's switches:\n\n```diff\n{diff}```")


def dropdown(title: str, body: str) -> str:
    """`body` (MyST) in a dropdown headed `title`: detail a reader opens, off the page's length."""
    return f"::::{{dropdown}} {title}\n{body}\n::::"


def code_dropdown(number: str) -> str:
    """The step's whole kernel, as the compiler sees it with the step's switches, in a dropdown."""
    s = code.step_of(number)
    return dropdown(f"The kernel of step {s.number} (`{s.kernel_id}`), with its switches applied",
                    f"```cuda\n{code.step_source(s)}```")


class Timings:
    """The rows of one bench record (or none), read as chapter 7's pages read them."""

    def __init__(self, rec: dict | None):
        self.rec = rec
        self.rows = measured.record_rows(rec) if rec else []
        self.label = measured.record_label(rec) if rec else None

    def row(self, kid: str, shape: Shape, causal: bool) -> dict | None:
        return next((r for r in self.rows if r["kernel"] == kid and tuple(r["shape"]) == tuple(shape)
                     and r["causal"] == causal), None)

    def ratio(self, kid: str, other: str, shape: Shape, causal: bool) -> float | None:
        """`kid`'s time over `other`'s, same run (> 1: kid is slower)."""
        a, b = self.row(other, shape, causal), self.row(kid, shape, causal)
        return b["median_us"] / a["median_us"] if a and b else None

    def sentence(self, kid: str, other: str, what: str, cases=None) -> str | None:
        """**Measured.** `what` over `other` at each case, or None without a record."""
        if self.label is None:
            return None
        parts = [f"{x:.2f}x at {case_name(s, c)}" for s, c in (cases or [(s, c) for s, c, _, _ in TARGETS])
                 if (x := self.ratio(kid, other, s, c)) is not None]
        if not parts:
            return None
        return f"**Measured.** On {self.label}, {what} took " + ", ".join(parts) + f" the time of `{other}`."

    def step_sentence(self, number: str) -> str | None:
        s = code.step_of(number)
        before = code.previous(s)
        return self.sentence(s.kernel_id, before.kernel_id,
                             f"step {s.number} (`{s.kernel_id}`)")


def measured_or(text: str | None, without: str) -> str:
    """The measured sentence, or what the page can say without one (never a number of time)."""
    return text if text is not None else f"**Not measured here.** {without}"


def parts() -> list[tuple[str, tuple[Step, ...]]]:
    """The climb in its parts (the registry's PARTS_07): each part's title and its steps, in order."""
    numbers = [s.number for s in STEPS_07]
    starts = [numbers.index(first) for first, _ in PARTS_07]
    if starts[0] != 0 or starts != sorted(starts):
        raise ValueError(f"PARTS_07 must start at step {numbers[0]} and follow the steps' order: {PARTS_07}")
    ends = [*starts[1:], len(STEPS_07)]
    return [(title, STEPS_07[a:b]) for (_, title), a, b in zip(PARTS_07, starts, ends, strict=True)]


def tables_by_part(header: list[str], steps, rows: list[list]) -> str:
    """`rows`, one per step of `steps`, as one Markdown table per part of the climb that holds any
    of them, each under its part's title: no table grows with every step."""
    from .page import md_table_text

    by_step = dict(zip((s.number for s in steps), rows, strict=True))
    out = []
    for title, members in parts():
        mine = [by_step[s.number] for s in members if s.number in by_step]
        if mine:
            out.append(f"**{title}** (steps {members[0].number}–{members[-1].number})\n\n" + md_table_text(header, mine))
    return "\n\n".join(out)


def climb_rows(traces: dict, preds: dict) -> tuple[list[str], list[list]]:
    """The climb at a glance: per step, what it adds, what the executor counted of its launch at
    the mission shape (block barriers met, summed over warps; extra bank wavefronts) and the model's
    prediction from those counts on each GPU it predicts for."""
    gpus = list(next(iter(preds.values())))
    header = ["step", "adds", "block barriers met, all warps", "extra wavefronts", *(f"{g}, predicted" for g in gpus)]
    rows = []
    for s in STEPS_07:
        tot = traces[s.kernel_id].totals()
        rows.append([f"{s.number} `{s.kernel_id}`", s.technique, f"{tot['barriers']:,}",
                     f"{tot['shared_excess_wavefronts']:,}",
                     *(f"{preds[s.kernel_id][g].time_us:,.1f} µs" for g in gpus)])
    return header, rows


@_without_executor
def climb_table() -> None:
    """Show the climb at a glance (counted and predicted at the mission shape; no time measured)."""
    from ..executor.trace import trace
    from .page import md

    traces = {kid: trace(kid, MISSION, False) for kid in STEP_IDS}
    print(f"Counted on the CPU executor at {MISSION.label()} (every CTA; counts, never times), and predicted "
          "from those counts by the book's time model (predictions, not measurements):")
    header, rows = climb_rows(traces, {kid: predictions(kid) for kid in STEP_IDS})
    md(tables_by_part(header, STEPS_07, rows))


def climb_figure():
    """Each step's predicted time on each GPU the model predicts for (predicted.climb_figure)."""
    return predicted_climb_figure(STEP_IDS)


def climb_measured_rows(timings: Timings) -> tuple[list[str], list[list]]:
    """Per step, its time over the step before's at each target case, from one record."""
    cases = [(s, c) for s, c, _, _ in TARGETS]
    header = ["step", *(case_name(s, c) for s, c in cases)]
    rows = []
    for s in STEPS_07[1:]:
        before = code.previous(s)
        rows.append([f"{s.number} over {before.number}",
                     *((f"{x:.2f}x" if (x := timings.ratio(s.kernel_id, before.kernel_id, sh, c)) is not None
                        else MISSING) for sh, c in cases)])
    return header, rows


def goal_ratio(row: dict | None, base: str) -> float | None:
    """A timed row's ratio toward a goal on `base` (above 1: faster than that SDPA backend): to the
    fastest backend of the run, or to flash; None where the row is missing, failed its check or
    the run has no flash time."""
    if row is None or row["median_us"] is None:  # report_rows gives a failed check no time
        return None
    if base == "fastest":
        return row["speedup_vs_sdpa"]
    return row["sdpa_flash_us"] / row["median_us"] if row["sdpa_flash_us"] else None


def goal_ratios(timings: Timings, kid: str) -> list[float | None] | None:
    """Per target (TARGETS, in order), `kid`'s goal_ratio in the record; None where the record does
    not time it at every target case."""
    rows = [timings.row(kid, s, c) for s, c, _, _ in TARGETS]
    if any(r is None for r in rows):
        return None
    return [goal_ratio(r, base) for r, (_, _, base, _) in zip(rows, TARGETS, strict=True)]


def goals_met(timings: Timings, kid: str) -> list[bool] | None:
    """Per target (TARGETS, in order), whether `kid` met its goal in the record; None where the
    record does not time it at every target case."""
    ratios = goal_ratios(timings, kid)
    if ratios is None:
        return None
    return [x is not None and x >= factor for x, (_, _, _, factor) in zip(ratios, TARGETS, strict=True)]


def _geomean_us(timings: Timings, kid: str) -> float:
    import math

    times = [timings.row(kid, s, c)["median_us"] for s, c, _, _ in TARGETS]
    return math.exp(sum(math.log(t) for t in times) / len(times)) if all(times) else math.inf


def best_step(timings: Timings) -> Step | None:
    """The step the record judges best: of the steps it times at every target case with every check
    passed (a failed check is no result), the one that met the most goals, then the least geometric
    mean of its times over the cases; None without a record that times any step so."""
    met = {s: m for s in STEPS_07 if (m := goals_met(timings, s.kernel_id)) is not None
           and all(timings.row(s.kernel_id, sh, c)["check_passed"] for sh, c, _, _ in TARGETS)}
    if not met:
        return None
    return min(met, key=lambda s: (-sum(met[s]), _geomean_us(timings, s.kernel_id)))


def goal_rows(timings: Timings) -> tuple[list[str], list[list]]:
    """Per step, its ratio toward each goal in the record (headed by the target case; the goals are
    GOALS), in bold where it met the goal, and how many it met (MISSING where the record does not
    time the step at every target case)."""
    header = ["step", *(case_name(s, c) for s, c, _, _ in TARGETS), "met"]
    rows = []
    for step in STEPS_07:
        ratios, met = goal_ratios(timings, step.kernel_id), goals_met(timings, step.kernel_id)
        if met is None:
            rows.append([f"{step.number} `{step.kernel_id}`", *[MISSING] * len(TARGETS), MISSING])
            continue
        cells = []
        for (s, c, _, _), x, ok in zip(TARGETS, ratios, met, strict=True):
            text = "failed its check" if x is None and not timings.row(step.kernel_id, s, c)["check_passed"] \
                else ("no flash" if x is None else f"{x:.2f}x")
            cells.append(f"**{text}**" if ok else text)
        rows.append([f"{step.number} `{step.kernel_id}`", *cells, f"{sum(met)} of {len(met)}"])
    return header, rows


# A step's measured ratio (its time over the step before's) that differs from the predicted one by
# more than this is a miss: two runs of one record's kernels agree to about 1 %.
MISS = 0.05


def prediction_rows(timings: Timings) -> tuple[list[str], list[list], list[tuple[str, str]], tuple[int, int]] | None:
    """Per step, its time over the step before's at each target case: the model's for the record's
    GPU, then the record's, in bold where the measurement missed the prediction; the misses as
    (step, case); and how many of how many step times the record holds ran slower than predicted.
    None without a record or where the model does not know the record's GPU."""
    from ..gpus import lookup
    from ..model.bounds import ARCH_RATES

    gpu = lookup(timings.rec["gpu"]["name"]) if timings.rec else None
    if gpu is None or gpu.arch not in ARCH_RATES:
        return None
    cases = [(s, c) for s, c, _, _ in TARGETS]
    predicted = {(k, sh, c): predictions(k, sh, c, (gpu.key,))[gpu.key].time_us for k in STEP_IDS for sh, c in cases}
    times = [(predicted[(k, sh, c)], r["median_us"]) for k, sh, c in predicted if (r := timings.row(k, sh, c))]
    header = ["step: predicted / measured", *(case_name(s, c) for s, c in cases)]  # bold: a miss
    rows, misses = [], []
    for s in STEPS_07[1:]:
        before = code.previous(s)
        cells = []
        for sh, c in cases:
            m = timings.ratio(s.kernel_id, before.kernel_id, sh, c)
            p = predicted[(s.kernel_id, sh, c)] / predicted[(before.kernel_id, sh, c)]
            if m is None:
                cells.append(f"{p:.2f} / {MISSING}")
                continue
            missed = abs(m / p - 1) > MISS
            cells.append(f"{p:.2f} / **{m:.2f}**" if missed else f"{p:.2f} / {m:.2f}")
            if missed:
                misses.append((s.number, case_name(sh, c)))
        rows.append([f"{s.number} over {before.number}", *cells])
    return header, rows, misses, (sum(m > p for p, m in times), len(times))


def glue_climb_measured(timings: Timings) -> None:
    """The climb as measured: each step's time over the step before's, beside the model's ratio for
    the record's GPU with every miss marked, and why they missed from the ncu counters
    (attnlab.book.counters) in a dropdown of its own; the measured ratios alone where the model does
    not know the GPU; without a record, the sentence that says where they will be."""
    from . import counters
    from .page import glue_md

    if timings.label is None:
        glue_md("ch07_why_missed", None)
        glue_md("ch07_climb_measured", "Each step's page gives its time against the step before where a GPU record "
                                       "holds both; without one, the climb above is counted and predicted only.")
        return
    checked = prediction_rows(timings)
    if checked is None:
        header, rows = climb_measured_rows(timings)
        glue_md("ch07_why_missed", None)
        glue_md("ch07_climb_measured", f"**Measured.** On {timings.label}, each step's time over the step before's, "
                                       "in the same run (below 1: the step made the kernel faster):\n\n"
                                       + dropdown("Each step's time over the step before's",
                                                  tables_by_part(header, STEPS_07[1:], rows)))
        return
    header, rows, misses, slower = checked
    timed = sum(MISSING not in cell for row in rows for cell in row[1:])
    glue_md("ch07_climb_measured", f"**Measured.** On {timings.label}, each step's time over the step before's, in "
                                   f"the same run, against the model's ratio for that GPU: {len(misses)} of the "
                                   f"{timed} ratios the record holds missed the prediction by more than {MISS:.0%}."
                                   "\n\n" + dropdown("Each step's time over the step before's, predicted / measured",
                                   "Below 1: the step made the kernel faster; a measurement in bold missed the "
                                   "prediction.\n\n" + tables_by_part(header, STEPS_07[1:], rows)))
    large = TARGET_SHAPES[1]  # (4, 16, 4096, 64): the latest step a GPU session profiled there
    profiled = next((k for k in reversed(STEP_IDS) if counters.has_issue(k, large)), None)
    why = profiled and counters.latency_paragraph(("07_mma", MISSION), (profiled, large), slower,
                                                  timings.rec["gpu"]["name"])
    # a detail beside the tables it explains, in its own dropdown: the page stays one sitting long
    glue_md("ch07_why_missed", why and dropdown("Why the steps missed: what Nsight Compute counted", why))
