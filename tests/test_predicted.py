"""Predicted times on the pages (attnlab.book.predicted): every time says predicted, and a fresh
record's measured time stands beside the prediction with the model's error, never replaced."""
from __future__ import annotations

import re

from attnlab.book import predicted
from attnlab.model.bounds import predict
from attnlab.shapes import MISSION


def test_every_time_in_a_line_or_table_says_predicted():
    text = predicted.line("07_mma")
    assert "not measured" in text and text.count("µs predicted") == 2
    header, rows = predicted.bounds_rows("04_cublas_hybrid")
    assert all("(predicted)" in h for h in header[1:])
    for row in rows:
        for cell in row[1:]:
            assert not re.search(r"\d\s*µs", cell) or "predicted" in cell
    assert any(r[0].startswith("GEMM") for r in rows)


def test_measured_stands_beside_the_prediction_with_its_error(results):
    from synthetic import synthetic_record

    from attnlab.records.results import write_record

    assert predicted.measured_rows(["01_scalar"]) == []
    write_record(synthetic_record(gpu="NVIDIA L4", kernel_us=200.0), results)
    rows = predicted.measured_rows(["01_scalar"])
    assert len(rows) == 1
    kid, label, measured, pred, error = rows[0]
    assert measured == "200.0 µs measured" and "NVIDIA L4" in label
    want = predict("01_scalar", MISSION, False, "L4").time_us
    assert pred == predicted.fmt(want) and error == f"{(want - 200.0) / 200.0:+.0%}"


def test_one_measured_row_per_gpu_from_its_newest_record(results):
    """Two bench runs of one GPU (a GPU session's book and chapter-7 runs both hold the mission
    shape) give one row, the newer run's, not one row per record."""
    from synthetic import synthetic_record

    from attnlab.records.results import write_record

    write_record(synthetic_record(gpu="NVIDIA L4", kernel_us=200.0, created="2026-01-01T00:00:00Z"), results)
    write_record(synthetic_record(gpu="NVIDIA L4", kernel_us=300.0, created="2026-01-02T00:00:00Z"), results)
    rows = predicted.measured_rows(["01_scalar"])
    assert [r[2] for r in rows] == ["300.0 µs measured"]


def test_grid_fill_places_the_launchers_real_grid():
    """The L4's 58 SMs take 07_mma's 64 CTAs at the mission shape as one full wave and 6 more; the
    H100's 132 take the 128 of the launcher's split for them, leaving 4 idle: the launcher's grid,
    not a model's."""
    import numpy as np

    from attnlab.gpus import by_key
    from attnlab.kernels import registry

    for gpu in ("L4", "H100 SXM"):
        g = by_key(gpu)
        owner, us, grid = predicted.grid_fill("07_mma", gpu)
        cfg = registry.get("07_mma", g.arch).launch_config(MISSION, g.sms)
        assert tuple(grid) == tuple(cfg["grid"]) + (1,) * (3 - len(cfg["grid"]))
        n = int(np.prod(grid))
        per_sm = np.bincount(owner, minlength=g.sms)
        assert per_sm.sum() == n and len(us) == n and (us > 0).all()
        if n <= g.sms:
            assert per_sm.max() == 1 and (per_sm == 0).sum() == g.sms - n
        else:
            assert (per_sm == 2).sum() == n - g.sms


def test_the_records_weigh_a_tensor_core_loops_stalls_in_turn_against_overlapped(results):
    """rule_cases under TURN sets a record's time beside the model's prediction (a tensor-core loop's stalls
    taken in turn) and the same prediction with an SM's CTAs overlapping them: at (4, 16, 4096, 64)
    an H100 holds two of step 7.12's CTAs per SM, so in turn they take longer. rule_summary's
    ratios are measured over each, and turn_sentence counts the cases slower than the model."""
    from synthetic import synthetic_record

    from attnlab.records.results import write_record
    from attnlab.shapes import Shape

    kid, large = "07_mma_whole_tile_copy", Shape(4, 16, 4096, 64)
    assert list(predicted.rule_cases(predicted.TURN, [kid], [large])) == []
    write_record(synthetic_record(gpu="NVIDIA H100 80GB HBM3", cc="9.0", sms=132, kernel=kid,
                                  shapes=(tuple(large),), kernel_us=5.0), results)
    cases = list(predicted.rule_cases(predicted.TURN, [kid], [large]))
    assert [(c[1].key, c[2], c[3], c[4]) for c in cases] == [("H100 SXM", kid, large, False), ("H100 SXM", kid, large, True)]
    for _, _, _, shape, causal, _, turned, overlapped in cases:
        assert turned.time_us == predict(kid, shape, causal, "H100 SXM").time_us
        assert turned.ctas_per_sm == 2 and overlapped.time_us < turned.time_us
    _, rows, by_gpu = predicted.rule_summary(predicted.TURN, cases)
    ratios = [measured / turned.time_us for *_, measured, turned, _ in cases]
    assert by_gpu["H100 SXM"]["turn"] == ratios and len(rows) == 1 and rows[0][1] == 2
    assert by_gpu["H100 SXM"]["overlap"] == [measured / over.time_us for *_, measured, _, over in cases]
    sentence = predicted.turn_sentence(by_gpu)
    assert sentence.startswith("On NVIDIA H100") and "the 2 step times" in sentence
    assert f"{sum(r > 1 for r in ratios)} of them slower than predicted" in sentence


def test_the_records_weigh_the_code_outside_the_loop(results):
    """rule_cases under OUTSIDE sets a record's time beside the model's prediction (the key-tile
    loop's stalls alone) and the same with the stalls of the code outside the loop counted on every
    warp, which at the mission shape adds to step 7.12's latency bound; outside_sentence counts the
    cases that ran faster than that second prediction."""
    from synthetic import synthetic_record

    from attnlab.records.results import write_record

    kid = "07_mma_whole_tile_copy"
    write_record(synthetic_record(gpu="NVIDIA H100 80GB HBM3", cc="9.0", sms=132, kernel=kid,
                                  shapes=(tuple(MISSION),), kernel_us=6.0), results)
    cases = list(predicted.rule_cases(predicted.OUTSIDE, [kid], [MISSION]))
    assert [(c[1].key, c[4]) for c in cases] == [("H100 SXM", False), ("H100 SXM", True)]
    for _, _, _, shape, causal, _, loop, outside in cases:
        assert loop.time_us == predict(kid, shape, causal, "H100 SXM").time_us
        assert loop.bottleneck == outside.bottleneck == "latency" and outside.time_us > loop.time_us
    header, rows, by_gpu = predicted.rule_summary(predicted.OUTSIDE, cases)
    assert header[2:] == ["measured / predicted, the loop's stalls", "measured / predicted, with the code outside the loop"]
    ratios = [6.0 / outside.time_us for *_, outside in cases]
    assert by_gpu["H100 SXM"]["outside"] == ratios and rows[0][1] == 2
    sentence = predicted.outside_sentence(by_gpu)
    assert sentence.startswith("On NVIDIA H100") and sentence.endswith(".")
    assert f"{sum(r < 1 for r in ratios)} of them faster than that prediction" in sentence
