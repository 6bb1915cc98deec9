"""Where a prediction missed a measurement, the pages say why from what Nsight Compute counted
(attnlab.book.counters, attnlab.book.predicted.versus, attnlab.book.climb.prediction_rows): read
from fresh records only, and silent without them."""
from __future__ import annotations

import pytest

from attnlab.book import climb, counters, predicted
from attnlab.shapes import MISSION, Shape

LARGE = Shape(4, 16, 4096, 64)


def _profile(rows, gpu="NVIDIA L4", created="2026-01-05T00:00:00Z"):
    """A fresh profile record: rows of (kernel, shape, {metric name or short name: value})."""
    from synthetic import new_test_record

    from attnlab.gpu.profile import METRICS
    from attnlab.kernels.registry import get
    from attnlab.records.results import seal

    by_short = {m.short: name for name, m in METRICS.items()}
    kids = list(dict.fromkeys(k for k, _, _ in rows))
    rec = new_test_record("profile", [get(k, "sm_89") for k in kids], {"metrics": list(METRICS)}, gpu=gpu,
                          created=created)
    rec["cases"] = [{"kernel": k, "shape": list(shape), "causal": False, "function": f"attn_fwd_{k}", "grid": "(1, 1, 1)",
                     "block": "(128, 1, 1)", "metrics": {by_short.get(n, n): {"value": v, "unit": ""} for n, v in m.items()}}
                    for k, shape, m in rows]
    return seal(rec)


def _counts(issue, wait, warps=8.0, sms_active=98.0, instructions=1e8):
    return {"duration": 1e6, "SMs active %": sms_active, "achieved occupancy %": warps / 64 * 100,
            counters.INSTRUCTIONS: instructions, counters.ISSUE: issue,
            **{m: (wait if s == "wait" else 0.2) for s, m in counters.STALLS.items()}}


def test_nothing_is_said_without_a_profile_record(results):
    assert counters.row("07_mma", MISSION) is None and not counters.has_issue("07_mma", MISSION)
    assert counters.issue_rows(["07_mma_even_split", "07_mma_lean_loop"], LARGE) is None
    assert counters.occupancy_rows(["07_mma"], MISSION) == []
    assert counters.latency_paragraph(("07_mma", MISSION), ("07_mma_lean_loop", LARGE), (1, 2), "NVIDIA L4") is None
    assert predicted.versus("07_mma") == []


def test_the_counters_table_and_the_latency_paragraph_read_the_record(results):
    from attnlab.records.results import write_record

    write_record(_profile([("07_mma", MISSION, _counts(0.30, 1.1, warps=3.8, sms_active=72.0)),
                           ("07_mma_even_split", LARGE, _counts(0.48, 1.25, instructions=4e8)),
                           ("07_mma_lean_loop", LARGE, _counts(0.40, 1.80, instructions=3e8))]), results)
    header, rows = counters.issue_rows(["07_mma_even_split", "07_mma_lean_loop"], LARGE)
    assert header == ["counted by ncu", "`07_mma_even_split`", "`07_mma_lean_loop`"]
    got = {r[0]: r[1:] for r in rows}
    assert got["instructions a scheduler issued per active cycle"] == ["0.48", "0.40"]
    assert got["instructions issued, all warps"] == ["400,000,000", "300,000,000"]
    assert got["warps resident per SM (of 64)"] == ["8.0", "8.0"]
    assert [v for k, v in got.items() if "(wait)" in k] == [["1.25", "1.80"]]
    text = counters.latency_paragraph(("07_mma", MISSION), ("07_mma_lean_loop", LARGE), (9, 10), "NVIDIA H200")
    assert text.startswith("**Measured.** Nsight Compute on NVIDIA L4 (2026-01-05)")
    assert "issued 0.30 instructions per active cycle" in text and "holding a warp 72%" in text
    assert "idle 60% of its active cycles" in text and "9 of the 10 step times the NVIDIA H200 record holds" in text
    # a kernel profiled without the issue counters has no table, and says nothing of issue
    assert counters.issue_rows(["07_mma", "07_mma_nosplit"], MISSION) is None


def test_a_measured_time_stands_beside_its_prediction_with_what_ncu_counted(results):
    from synthetic import synthetic_record

    from attnlab.model.bounds import predict
    from attnlab.records.results import write_record

    want = predict("01_scalar", MISSION, False, "L4").time_us
    write_record(synthetic_record(gpu="NVIDIA L4", kernel_us=want * 1.02, created="2026-01-01T00:00:00Z"), results)
    [hit] = predicted.versus("01_scalar")
    assert hit.startswith("**Measured against predicted.** On NVIDIA L4") and hit.endswith("within 5%.")
    write_record(synthetic_record(gpu="NVIDIA L4", kernel_us=want * 3, created="2026-01-02T00:00:00Z"), results)
    [unexplained] = predicted.versus("01_scalar")
    assert "3.0 times the prediction" in unexplained and "No profile record" in unexplained
    write_record(_profile([("01_scalar", MISSION, {"SMs active %": 24.0, "achieved occupancy %": 6.25})]), results)
    [why] = predicted.versus("01_scalar")
    assert "SMs idle 76% of the kernel's cycles and 4.0 warps per SM" in why
    assert "instructions per active cycle" not in why, "issue was not counted"


def test_each_step_ratio_is_marked_where_the_measurement_missed_the_prediction(results):
    """Every step timed at its predicted time on an L4, but one step at 1.5 times it: that step's
    ratio over the step before and the next step's over it miss, and no other."""
    from synthetic import synthetic_record

    from attnlab.gpus import by_key

    assert climb.prediction_rows(climb.Timings(None)) is None
    l4 = by_key("L4")
    slow = climb.STEPS_07[4]
    rec = synthetic_record(gpu="NVIDIA L4", kernel=climb.STEP_IDS[0], also=climb.STEP_IDS[1:],
                           shapes=[tuple(s) for s in climb.TARGET_SHAPES])
    for case in rec["cases"]:
        for kid in climb.STEP_IDS:
            t = predicted.predictions(kid, Shape(*case["shape"]), case["causal"], (l4.key,))[l4.key].time_us
            case["kernels"][kid]["device"]["median_us"] = t * (1.5 if kid == slow.kernel_id else 1.0)
    header, rows, misses, slower = climb.prediction_rows(climb.Timings(rec))
    assert header[0] == "step: predicted / measured" and len(rows) == len(climb.STEPS_07) - 1
    nxt = climb.STEPS_07[5].number
    assert {n for n, _ in misses} == {slow.number, nxt}
    assert len(misses) == 2 * len(climb.TARGETS)
    assert slower == (len(climb.TARGETS), len(climb.STEP_IDS) * len(climb.TARGETS)), "the slow step's times alone"
    row = next(r for r in rows if r[0].startswith(f"{slow.number} over"))
    assert all(c.endswith("**") for c in row[1:])
    ratio = float(row[1].split(" / ")[1].strip("*"))
    assert ratio == pytest.approx(1.5 * float(row[1].split(" / ")[0]), abs=0.02)
    hit = next(r for r in rows if r[0].startswith(f"{climb.STEPS_07[2].number} over"))
    assert not any("**" in c for c in hit[1:])


def test_counters_are_read_from_the_gpu_they_are_set_beside(results):
    """Two GPUs' records: a measurement is explained by its own GPU's counters or by none, a table
    of kernels reads one GPU, and the latency paragraph reads both of its rows from one GPU."""
    from synthetic import synthetic_record

    from attnlab.model.bounds import predict
    from attnlab.records.results import write_record

    want = predict("01_scalar", MISSION, False, "L4").time_us
    write_record(synthetic_record(gpu="NVIDIA L4", kernel_us=want * 3, created="2026-01-01T00:00:00Z"), results)
    other = _profile([("01_scalar", MISSION, {"SMs active %": 24.0, "achieved occupancy %": 6.25}),
                      ("07_mma", MISSION, _counts(0.30, 1.1)),
                      ("07_mma_even_split", LARGE, _counts(0.48, 1.25))], gpu="NVIDIA H100 80GB HBM3")
    write_record(other, results)
    [unexplained] = predicted.versus("01_scalar")
    assert "No profile record of this kernel at this case on that GPU" in unexplained, "the H100's counts beside an L4"
    assert counters.row("01_scalar", MISSION)["gpu"] == "NVIDIA H100 80GB HBM3"
    assert counters.row("01_scalar", MISSION, gpu="NVIDIA L4") is None
    # the L4 profiles one step at the large shape: a table of both steps has no GPU with both
    write_record(_profile([("07_mma_lean_loop", LARGE, _counts(0.40, 1.80))]), results)
    assert counters.issue_rows(["07_mma_even_split", "07_mma_lean_loop"], LARGE) is None
    assert counters.latency_paragraph(("07_mma", MISSION), ("07_mma_lean_loop", LARGE), (1, 2), "NVIDIA L4") is None
    write_record(_profile([("01_scalar", MISSION, {"SMs active %": 50.0, "achieved occupancy %": 6.25})]), results)
    [why] = predicted.versus("01_scalar")
    assert "NVIDIA L4" in why.split("Nsight Compute counted")[1] and "SMs idle 50%" in why


def test_the_newest_row_is_the_latest_profiled_not_the_first_gpu_of_the_day(results):
    from attnlab.records.results import write_record

    for gpu, hour in (("NVIDIA H200", "09"), ("NVIDIA H100 80GB HBM3", "08")):
        write_record(_profile([("07_mma", MISSION, _counts(0.30, 1.1))], gpu=gpu,
                              created=f"2026-01-05T{hour}:00:00Z"), results)
    assert counters.row("07_mma", MISSION)["gpu"] == "NVIDIA H200"


def test_a_counter_one_run_did_not_collect_is_left_out_of_the_table(results):
    from attnlab.records.results import write_record

    partial = _counts(0.40, 1.80)
    del partial["duration"], partial[counters.STALLS["not selected"]]
    write_record(_profile([("07_mma_even_split", LARGE, _counts(0.48, 1.25)),
                           ("07_mma_lean_loop", LARGE, partial)]), results)
    _, rows = counters.issue_rows(["07_mma_even_split", "07_mma_lean_loop"], LARGE)
    names = [r[0] for r in rows]
    assert "duration under ncu (base clocks)" not in names and not any("(not selected)" in n for n in names)
    assert "cycles stalled per instruction: a fixed-latency dependency (an FFMA's result, say) (wait)" in names
    assert len(rows) == 4 + len(counters.STALLS) - 2
