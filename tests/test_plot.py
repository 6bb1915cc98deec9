import matplotlib

from attnlab import plot
from attnlab.gpus import by_key
from attnlab.shapes import MISSION, Shape
from synthetic import synthetic_record


def _png_ok(fig, tmp_path, name):
    path = tmp_path / f"{name}.png"
    fig.savefig(path)
    matplotlib.pyplot.close(fig)
    assert path.stat().st_size > 5000


def test_latency_bars(tmp_path):
    _png_ok(plot.latency_bars(synthetic_record(), MISSION, causal=False), tmp_path, "bars")


def test_length_sweep(tmp_path):
    rec = synthetic_record(shapes=[(1, 8, L, 64) for L in (128, 256, 512, 1024)])
    _png_ok(plot.length_sweep(rec, 1, 8, 64, causal=True), tmp_path, "sweep")


def test_roofline_with_points_and_ceilings(tmp_path):
    rec = synthetic_record()
    fig = plot.roofline(by_key("L4"), [("01_scalar", MISSION, False, 900.0), ("long", Shape(1, 8, 4096, 64), False, 3000.0)],
                        ceilings=rec["ceilings"])
    _png_ok(fig, tmp_path, "roofline")


def test_missing_case_is_an_error():
    import pytest
    with pytest.raises(KeyError):
        plot.latency_bars(synthetic_record(), Shape(9, 9, 9, 64))
