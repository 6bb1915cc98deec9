import matplotlib

from attnlab.book import plot
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


def _report(arch: str, sass: dict, kernel: str = "k"):
    from attnlab.kernels.static import StaticReport

    return StaticReport(kernel, arch, [], sass, build_seconds=0)


def _segment_colors(fig) -> dict[str, tuple]:
    """Legend label -> face colour of its bar segments, from a drawn mix figure."""
    ax = fig.axes[0]
    return {c.get_label(): tuple(c.patches[0].get_facecolor()) for c in ax.containers}


def test_a_class_has_one_colour_whatever_else_a_figure_shows():
    """Two figures with different class sets (one with tensor cores and shuffles, one without):
    the classes they share have the same colour in both, the one of plot.CLASS_COLORS."""
    from matplotlib.colors import to_rgba

    a = plot.sass_mix([_report("sm_89", {"FFMA": 10, "LDG.E": 4, "BAR.SYNC.DEFER_BLOCKING": 1})])
    b = plot.sass_mix([_report("sm_89", {"HMMA.16816.F32": 8, "SHFL.BFLY": 5, "FFMA": 3, "LDG.E": 2,
                                         "BAR.SYNC.DEFER_BLOCKING": 2})])
    ca, cb = _segment_colors(a), _segment_colors(b)
    matplotlib.pyplot.close(a), matplotlib.pyplot.close(b)
    assert set(ca) < set(cb)
    for cls in ca:
        assert ca[cls] == cb[cls] == to_rgba(plot.CLASS_COLORS[cls]), cls


def test_every_class_has_its_own_colour():
    from attnlab.kernels.static import CLASSES

    assert set(plot.CLASS_COLORS) == set(CLASSES)
    assert len(set(plot.CLASS_COLORS.values())) == len(CLASSES)


def test_mix_figure_draws_one_target_unless_another_differs():
    base = {"FFMA": 1000, "IMAD": 500, "LDG.E": 100, "BAR.SYNC.DEFER_BLOCKING": 1}
    near = {**base, "IMAD": 520}                      # 20 of 1601: within the tolerance
    far = {**base, "IMAD": 500 + int(0.2 * 1601)}     # a fifth more integer work
    reports = [_report("sm_80", near), _report("sm_89", base), _report("sm_90", far)]
    drawn, same = plot.mix_targets(reports, "sm_89")
    assert [r.arch for r in drawn] == ["sm_89", "sm_90"] and same == ["sm_80"]
    drawn, same = plot.mix_targets(reports[:2], "sm_89")
    assert [r.arch for r in drawn] == ["sm_89"] and same == ["sm_80"]
