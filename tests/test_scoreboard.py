"""Chapter 9 without a GPU: the scoreboard's rows and figures from (synthetic) records, the Triton
baseline's place in a bench case, and the x0.1-inputs experiment, which needs no GPU at all."""
from __future__ import annotations

import pytest

from attnlab.book import scoreboard
from attnlab.records.results import validate_record, write_record
from attnlab.shapes import MISSION, Shape


def _record(with_triton=True):
    from synthetic import scale, synthetic_record, timing

    rec = synthetic_record(shapes=[(1, 8, L, 64) for L in (128, 512, 2048)])
    for case in rec["cases"]:
        triton = {"check": {"passed": True}, "device": timing(15.0 * scale(case["shape"]))}
        case["baselines"] = {"triton": triton} if with_triton else {}
        case["baselines_unavailable"] = {} if with_triton else {"triton": "triton is not installed"}
    return rec


def test_shapes_cover_the_mission_the_sweep_and_both_head_dims():
    full = scoreboard.scoreboard_shapes(quick=False)
    assert full[0] == MISSION and len(full) == len(set(full))
    assert {s.L for s in full} == {128, 256, 512, 1024, 2048, 4096, 8192} and {s.D for s in full} == {64, 128}
    assert set(scoreboard.scoreboard_shapes(quick=True)) < set(full)


def test_rows_put_each_kernel_beside_its_run(results):
    rec = _record()
    assert validate_record(rec) == []
    write_record(rec, results)
    table = scoreboard.rows()
    assert len(table) == 6 and scoreboard.gpus(table) == ["TEST GPU (NVIDIA L4 table entry)"]
    row = next(r for r in table if r["shape"] == MISSION and not r["causal"])
    assert row["best_sdpa"] == "flash" and row["vs_sdpa"] == pytest.approx(20.0 / 100.0)
    assert row["triton_us"] == 15.0 and row["host_us"] == 130.0 and row["chapter"] == 1
    assert row["floor_us"] > 0 and row["tflops"] == pytest.approx(MISSION.flops(False) / 100e-6 / 1e12)
    best = scoreboard.best_per_chapter(table, row["gpu"], MISSION, False)
    assert list(best) == [1] and best[1]["kernel"] == "01_scalar"
    for fig in (scoreboard.plot_climb(table, row["gpu"]), scoreboard.plot_tflops(table, row["gpu"], 64, True),
                scoreboard.plot_host_vs_device(table, row["gpu"])):
        assert fig.axes and fig.axes[0].has_data()
    assert scoreboard.plot_tflops(table, row["gpu"], 128, True) is None, "no time at D = 128: no empty figure"


def test_stale_records_stay_off_the_board(results):
    from synthetic import synthetic_record

    write_record(synthetic_record(older_source=True), results)
    assert scoreboard.rows() == []


def test_bench_case_records_why_triton_is_missing():
    """On a machine without Triton (or without a GPU) the baseline is absent with its reason."""
    import torch

    from attnlab.gpu import triton_ref
    from attnlab.gpu.bench import time_baselines

    q = torch.zeros(1, 1, 4, 64, dtype=torch.float16)
    timed, missing = time_baselines(q, q, q, False, None, 0.0, reps=1)
    if triton_ref.available() is None:
        pytest.skip("Triton can run here; tests/test_triton_ref.py checks it")
    assert timed == {} and "triton" in missing and missing["triton"] == triton_ref.available()


def test_the_averaging_kernel_passes_the_studys_check_only_with_its_inputs():
    """The study's x0.1 inputs make softmax nearly uniform, so a kernel that just averages V
    passes its acceptance check; with unit-variance inputs plus an offset it fails by far, and the
    book's pass rule (relative to fp16's own error) fails it either way."""
    rows = scoreboard.input_scale_experiment(Shape(1, 2, 128, 64), seeds=(0,))
    study, book = scoreboard.INPUT_CHOICES
    for r in rows:
        assert not r["book_passes"]
        if r["inputs"] == study:
            assert r["study_passes"] and r["peak_weight_x_keys"] < 1.2 and r["score_std"] < 0.05
        else:
            assert not r["study_passes"] and r["abs_err"] > 100 * scoreboard.STUDY_TOLERANCE
            assert r["peak_weight_x_keys"] > 5
    assert {r["causal"] for r in rows} == {False, True} and {r["inputs"] for r in rows} == {study, book}


def test_static_climb_colours_each_class_as_every_mix_figure_does():
    """The landing page's climb and the chapters' mix figures share one class -> colour map."""
    from matplotlib.colors import to_rgba

    from attnlab.book.plot import CLASS_COLORS

    fig = scoreboard.plot_static_climb("sm_89")
    ax = fig.axes[0]
    for container in ax.containers:
        assert tuple(container.patches[0].get_facecolor()) == to_rgba(CLASS_COLORS[container.get_label()])
    import matplotlib.pyplot as plt
    plt.close(fig)
