"""What Nsight Compute counted of a kernel's run on a GPU, read from fresh profile records: the
pages use it to say why a prediction missed a measurement. Every number here is a measurement of a
real GPU (attnlab.gpu.profile records), never a prediction; a page without such a record says so.

ncu runs each kernel with its clocks locked to base and its caches flushed, so its durations are
not bench times: only ratios between kernels of one record and the rates below are read here.
"""
from __future__ import annotations

from ..gpu.profile import fresh_profile_rows
from ..shapes import Shape
from .measured import fmt_us

INSTRUCTIONS = "smsp__inst_executed.sum"
ISSUE = "smsp__issue_active.avg.per_cycle_active"  # instructions a scheduler issued per cycle it was active
# Why a warp did not issue, in cycles per instruction issued (ncu's warp-state statistics):
STALLS = {
    "wait": "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    "short scoreboard": "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
    "math pipe throttle": "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
    "not selected": "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio",
    "dispatch stall": "smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio",
    "barrier": "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
}
STALL_MEANING = {
    "wait": "a fixed-latency dependency (an FFMA's result, say)",
    "short scoreboard": "a shared-memory or special-function (ex2) result",
    "math pipe throttle": "a busy math pipe (the tensor cores, the ex2 unit)",
    "not selected": "another warp of its scheduler issued instead",
    "dispatch stall": "the dispatcher held a ready instruction back",
    "barrier": "a block barrier",
}


def row(kernel_id: str, shape: Shape, causal: bool = False, gpu: str | None = None) -> dict | None:
    """The newest fresh profile row of the kernel at this case (its GPU, date, metrics by name), on
    `gpu` (a device name, as records hold it) where given: a sentence that sets counters beside a
    measurement, or beside another kernel's counters, reads them from one GPU. None without one."""
    rows = [r for r in fresh_profile_rows() if r["kernel"] == kernel_id and r["shape"] == tuple(shape)
            and r["causal"] == causal and gpu in (None, r["gpu"])]
    if len(rows) > 1:  # on several GPUs: the one profiled last, to the second (two may share a day)
        at = _profiled_at()
        return max(rows, key=lambda r: at.get((r["gpu"], r["kernel"], r["shape"], r["causal"]), r["date"]))
    return rows[0] if rows else None


def _profiled_at() -> dict[tuple, str]:
    """When each (GPU, kernel, shape, causal) was last profiled, as its fresh records say."""
    from ..records.results import fresh_records

    return {(rec["gpu"]["name"], case["kernel"], tuple(case["shape"]), case["causal"]): rec["created_utc"]
            for rec in sorted(fresh_records("profile"), key=lambda r: r["created_utc"]) for case in rec["cases"]}


def issue_row(kernel_id: str, shape: Shape, causal: bool = False, gpu: str | None = None) -> dict | None:
    """The row, where it holds the issue counters; else None."""
    r = row(kernel_id, shape, causal, gpu)
    return r if r is not None and r.get(ISSUE) is not None else None


def occupancy_row(kernel_id: str, shape: Shape, causal: bool = False, gpu: str | None = None) -> dict | None:
    """The row, where it holds how busy the SMs were and how many warps they held; else None."""
    r = row(kernel_id, shape, causal, gpu)
    return r if r is not None and None not in (r.get("SMs active %"), r.get("achieved occupancy %")) else None


def has_issue(kernel_id: str, shape: Shape, causal: bool = False, gpu: str | None = None) -> bool:
    """True where a fresh profile row of the kernel at this case holds the issue counters."""
    return issue_row(kernel_id, shape, causal, gpu) is not None


def issue_rows(kernel_ids, shape: Shape, causal: bool = False) -> tuple[list[str], list[list[str]]] | None:
    """One row per counter, one column per kernel: the duration under ncu, instructions issued, the
    rate a scheduler issued them at, resident warps, and why a warp did not issue; None unless every
    kernel has a row with the issue counters on one GPU (the first kernel's newest)."""
    first = issue_row(kernel_ids[0], shape, causal)
    rows = [first and issue_row(k, shape, causal, first["gpu"]) for k in kernel_ids]
    if None in rows:
        return None
    header = ["counted by ncu", *(f"`{k}`" for k in kernel_ids)]
    lines = [("duration under ncu (base clocks)", "duration", lambda r: fmt_us(r["duration"] / 1e3)),
             ("instructions issued, all warps", INSTRUCTIONS, lambda r: f"{r[INSTRUCTIONS]:,.0f}"),
             ("instructions a scheduler issued per active cycle", ISSUE, lambda r: f"{r[ISSUE]:.2f}"),
             ("warps resident per SM (of 64)", "achieved occupancy %", lambda r: f"{warps(r):.1f}")]
    lines += [(f"cycles stalled per instruction: {STALL_MEANING[s]} ({s})", m, lambda r, m=m: f"{r[m]:.2f}")
              for s, m in STALLS.items()]
    # a counter one of the runs did not collect is left out, not shown as missing
    body = [[name, *(show(r) for r in rows)] for name, key, show in lines
            if all(r.get(key) is not None for r in rows)]
    return header, body


def occupancy_rows(kernel_ids, shape: Shape, causal: bool = False) -> list[list[str]]:
    """Per kernel with a fresh profile row at this case: the function ncu captured, its GPU and date,
    the share of cycles its SMs held a warp, warps per SM, and the issue rate where counted."""
    out = []
    for k in kernel_ids:
        if (r := occupancy_row(k, shape, causal)) is None:
            continue
        out.append([f"`{k}`", f"`{r['function']}`", f"{r['gpu']}, {r['date']}", f"{r['SMs active %']:.0f}%",
                    f"{warps(r):.1f}", f"{r[ISSUE]:.2f}" if r.get(ISSUE) is not None else "not counted"])
    return out


def warps(r: dict) -> float:
    """Warps resident per SM, from ncu's achieved occupancy (a share of the SM's 64 warp slots)."""
    return r["achieved occupancy %"] * 64 / 100


def label(kernel_id: str, shape: Shape, causal: bool = False, gpu: str | None = None) -> str | None:
    """"<GPU>, <date>" of the row issue_rows reads, for the sentence under its table."""
    r = row(kernel_id, shape, causal, gpu)
    return f"{r['gpu']}, {r['date']}" if r else None


def latency_paragraph(mission: tuple[str, Shape], large: tuple[str, Shape], slower: tuple[int, int],
                      timed_on: str) -> str | None:
    """Why chapter 7's steps missed their predictions, from the ncu counters of the last step's
    kernel at the mission shape and of a step at a large shape; `slower` is how many of how many
    step times the bench record of GPU `timed_on` holds ran slower than predicted (named, since the
    profiles may be another GPU's). None unless both rows hold the issue counters."""
    (mk, ms), (lk, ls) = mission, large
    lg = issue_row(lk, ls)
    m = lg and issue_row(mk, ms, gpu=lg["gpu"])  # both from the GPU the sentence names
    if m is None or lg is None or None in (lg.get(STALLS["wait"]), lg.get(STALLS["math pipe throttle"])):
        return None
    return (
        f"**Measured.** Nsight Compute on {lg['gpu']} ({lg['date']}): at the mission shape `{mk}`'s schedulers "
        f"issued {m[ISSUE]:.2f} instructions per active cycle, with its SMs holding a warp {m['SMs active %']:.0f}% "
        f"of the kernel's cycles; at {ls.label()} `{lk}`'s issued {lg[ISSUE]:.2f}, with {warps(lg):.1f} warps per "
        f"SM (two per scheduler), each instruction waiting {lg[STALLS['wait']]:.2f} cycles on a fixed-latency "
        f"dependency and {lg[STALLS['math pipe throttle']]:.2f} on a busy math pipe. With two warps a scheduler, "
        f"the warps wait on each other as well as on their own dependencies, and leave it idle "
        f"{1 - lg[ISSUE]:.0%} of its active cycles. The bench records chose the model's rule for this: on "
        f"`sm_90` it takes a tensor-core loop's fixed waits warp after warp, not overlapped (the page on the time "
        f"model sets the two rules against the records), and these counters agree. The waits it still leaves out, "
        f"on the fragment loads and at barriers, may be why {slower[0]} of the {slower[1]} step times the "
        f"{timed_on} record holds ran slower than predicted, why a step that removed work from the resource the "
        f"model found binding gained less than predicted, and why one that hides a wait the model does not weigh "
        f"gained where it predicted none.")
