"""What a page says about its records: one notice at its top when nothing is measured, a measured
paragraph or nothing in its prose, and the landing page's climb (from records, or from the binaries
when there are none)."""
from __future__ import annotations

import pytest

from attnlab import MISSION
from attnlab.book import page, scoreboard


@pytest.fixture
def notices(monkeypatch):
    """The notices a page prints, captured, on a machine without a GPU."""
    said: list[str] = []
    monkeypatch.setattr(page, "has_gpu", lambda: False)
    monkeypatch.setattr(page, "notice", said.append)
    return said


def test_page_without_records_says_so_once_with_the_command(results, notices):
    assert page.page_status(["01_scalar"], "ch01_scalar") is False
    assert len(notices) == 1
    text = notices[0]
    assert text.startswith("**No time on this page is measured yet.**")
    assert "No bench record of 01_scalar is committed" in text
    assert "`python tools/run_book.py ch01_scalar --save-results`" in text


def test_page_with_a_fresh_record_shows_the_mode_line_only(results, notices):
    from synthetic import synthetic_record

    from attnlab.records.results import write_record

    write_record(synthetic_record(), results)
    assert page.page_status(["01_scalar"], "ch01_scalar") is True
    assert notices == [page.mode_line()]
    assert "Nothing on this page" not in notices[0]


def test_page_of_several_kernels_counts_any_fresh_record(results, notices):
    from synthetic import synthetic_record

    from attnlab.records.results import write_record

    assert page.page_status(["01_scalar", "02_block_tiling"], "ch09_scoreboard") is False
    assert "None of its 2 kernels" in notices[-1]
    write_record(synthetic_record(kernel="02_block_tiling"), results)
    assert page.page_status(["01_scalar", "02_block_tiling"], "ch09_scoreboard") is True


def test_bench_without_a_record_prints_nothing(results, notices, capsys):
    assert page.bench(["01_scalar"]) is None
    assert notices == [] and capsys.readouterr().out == ""


def test_glue_md_glues_markdown_or_nothing(monkeypatch):
    import myst_nb

    glued = {}
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display: glued.__setitem__(name, value))
    page.glue_md("a", "**Measured.** 1 µs.")
    page.glue_md("b", None)
    assert glued["a"].data == "**Measured.** 1 µs."
    assert glued["b"].data == ""


def test_chapter_kernels_are_each_chapters_own():
    own = scoreboard.chapter_kernels()
    assert list(own) == list(range(1, 8))
    assert own[7] == "07_mma" and own[3] == "03_warp_rows_4w"
    from attnlab.kernels.registry import KERNELS
    assert all(KERNELS[k].variant_of is None and KERNELS[k].chapter == c for c, k in own.items())


def test_climb_in_time_draws_each_chapter_and_every_sdpa_backend_of_the_newest_run():
    from synthetic import synthetic_record

    old = synthetic_record(created="2026-01-01T00:00:00Z", kernel="01_scalar", kernel_us=300.0)
    new = synthetic_record(created="2026-02-01T00:00:00Z", kernel="07_mma", kernel_us=10.0,
                           also=("07_mma_nosplit",))
    table = scoreboard.rows(records=[old, new])
    gpu = scoreboard.gpus(table)[0]
    fig = scoreboard.plot_climb_times(table, gpu)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["ch1 01_scalar", "ch7 07_mma", "SDPA flash", "SDPA efficient", "SDPA math"]
    assert "run of 2026-02-01" in " ".join(t.get_text() for t in fig.axes[0].get_legend().get_texts())
    with pytest.raises(KeyError):
        scoreboard.plot_climb_times(table, gpu, shape=MISSION._replace(L=4096))


def test_climb_in_time_leaves_a_failed_kernel_out():
    from synthetic import synthetic_record

    rec = synthetic_record(kernel="01_scalar", also=("02_block_tiling",))
    for case in rec["cases"]:
        case["kernels"]["02_block_tiling"] = {"check": {"passed": False, "max_err": 1.0, "tolerance": 1e-3,
                                                        "reason": "wrong"}}
    table = scoreboard.rows(records=[rec])
    fig = scoreboard.plot_climb_times(table, scoreboard.gpus(table)[0])
    assert "ch2 02_block_tiling" not in [t.get_text() for t in fig.axes[0].get_yticklabels()]


def test_static_climb_reads_every_chapters_binary():
    fig = scoreboard.plot_static_climb("sm_89")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"ch{c} {k}" for c, k in scoreboard.chapter_kernels().items()]
    classes = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "tensor core" in classes and "fp32 math" in classes
    shares = {}  # each bar's segments add up to the whole binary
    for patch in ax.patches:
        y = round(patch.get_y() + patch.get_height() / 2)
        shares[y] = shares.get(y, 0) + patch.get_width()
    assert all(abs(v - 1) < 1e-9 for v in shares.values()) and len(shares) == 7


def test_landing_page_names_the_command_that_measures_every_chapter(results, notices):
    assert page.page_status(["01_scalar", "07_mma"], None) is False
    assert "None of the chapters' 2 kernels" in notices[-1]
    assert "`python tools/run_book.py --save-results`" in notices[-1]


def test_a_bar_in_a_table_cell_stays_in_its_cell(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj.data))
    page.md_table(["claim", "figure"], [["max |diff|", "0.002"]])
    row = shown[0].splitlines()[-1]
    assert row == r"| max \|diff\| | 0.002 |"
