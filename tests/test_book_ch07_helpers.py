"""The helpers chapter 7's page draws on (attnlab.book: fragments, swizzle, kernel_view): PTX
fragment maps, the swizzle's bank model, the occupancy arithmetic, and the target-shape bench in
both modes (the GPU's measurement replaced by a synthetic record); the lane-map figure's text
readable at the book's column width; and the committed page pointing only at measurements it
shows."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attnlab.book import fragments, kernel_view, measured, page, swizzle
from attnlab.kernels.chapters.ch07_mma import BLOCK_M, BLOCK_N
from attnlab.kernels.registry import STEPS_07, get
from attnlab.shapes import Shape


def test_fragment_maps_cover_each_matrix_once_and_p_repacks_as_a():
    maps = fragments.mma_m16n8k16_maps()
    for name, (n_rows, n_cols) in {"A": (16, 16), "B": (16, 8), "C": (16, 8)}.items():
        rows, cols, _ = maps[name]
        assert sorted((rows * n_cols + cols).ravel()) == list(range(n_rows * n_cols)), name
    a = maps["A"]
    for mine, want in zip(fragments.accumulator_pair_as_a(), a):
        np.testing.assert_array_equal(mine, want)
    # lane 5: groupID 1, threadID_in_group 1 -> a0, a1 at row 1, columns 2, 3 (PTX ISA figure)
    assert (a[0][5, :2] == 1).all() and list(a[1][5, :2]) == [2, 3]
    fragments.mma_fragment_figure()


def test_swizzle_model_is_the_header_and_removes_every_conflict():
    assert swizzle.swizzle_header_matches()
    for D in (64, 128):
        for sw, want in ((True, {4}), (False, {32})):
            counts = swizzle.ldmatrix_wavefronts_07(D, BLOCK_M, BLOCK_N[D], sw)
            assert {w for v in counts.values() for w in v} == want, (D, sw)
    lane = np.arange(32)
    assert swizzle.smem_wavefronts(lane * 4, width=4) == 1          # 32 consecutive words
    assert swizzle.smem_wavefronts(lane * 128, width=4) == 32       # one bank, 32 words
    swizzle.swizzle_figure()


def test_blocks_per_sm_follows_registers_and_shared_memory():
    spec = get("07_mma")
    smem64 = spec.dynamic_smem(Shape(1, 1, 1, 64))
    assert kernel_view.blocks_per_sm("sm_89", 152, smem64, 128) == (2, "shared memory")
    assert kernel_view.blocks_per_sm("sm_89", 255, 0, 128)[0] == 2           # 8192 registers per warp
    assert kernel_view.blocks_per_sm("sm_89", 32, 0, 32) == (24, "blocks")
    assert kernel_view.blocks_per_sm("sm_90", 152, smem64, 128)[0] == 3


def _record(shapes, kernel="07_mma"):
    from synthetic import synthetic_record

    return synthetic_record(kernel=kernel, shapes=[tuple(s) for s in shapes])


def test_bench_at_without_a_gpu_shows_only_a_record_holding_every_shape(results, monkeypatch, capsys):
    from synthetic import scale

    from attnlab.records.results import write_record

    monkeypatch.setattr(page, "has_gpu", lambda: False)
    targets = [Shape(1, 8, 512, 64), Shape(4, 16, 4096, 64)]
    assert page.bench_at(["07_mma"], targets) is None
    write_record(_record(targets[:1]), results)
    assert page.bench_at(["07_mma"], targets) is None, "a record missing a shape is not shown"
    write_record({**_record(targets), "created_utc": "2026-01-03T00:00:00Z"}, results)
    rec = page.bench_at(["07_mma"], targets)
    assert rec is not None and "Committed bench record" in capsys.readouterr().out
    rows = measured.record_rows(rec)
    assert len(rows) == 4 and all(r["sdpa_flash_us"] == pytest.approx(20.0 * scale(r["shape"])) for r in rows)
    assert all(r["share_of_matmul"] is not None and r["speedup_vs_sdpa"] > 0 for r in rows)
    assert measured.record_rows(None) == []


def test_bench_at_without_a_gpu_takes_the_record_of_the_newest_kernel_of_a_series_that_has_one(
        results, monkeypatch, capsys):
    from attnlab.records.results import write_record

    monkeypatch.setattr(page, "has_gpu", lambda: False)
    targets = [Shape(1, 8, 512, 64)]
    write_record(_record(targets, kernel="07_mma"), results)  # timed before the newest step existed
    series = [STEPS_07[-1].kernel_id, "07_mma"]
    assert series[0] != "07_mma"
    assert page.bench_at(series, targets) is None, "by default only the first kernel's record is shown"
    rec = page.bench_at(series, targets, record_of=series)
    assert rec is not None and "Committed bench record" in capsys.readouterr().out
    assert "07_mma" in rec["kernels"] and series[0] not in rec["kernels"]
    assert page.bench_at(series, targets, record_of=series[:1]) is None


def test_bench_at_on_a_gpu_measures_saves_and_refuses_wrong_output(results, monkeypatch, capsys):
    import attnlab.gpu.bench

    monkeypatch.setattr(page, "has_gpu", lambda: True)
    seen = {}

    def fake_run_bench(specs, shapes, quick, progress):
        seen["shapes"] = list(shapes)
        return _record(shapes)

    monkeypatch.setattr(attnlab.gpu.bench, "run_bench", fake_run_bench)
    targets = [Shape(2, 16, 4096, 128)]
    rec = page.bench_at(["07_mma"], targets, save=True)
    assert seen["shapes"] == targets and rec["cases"]
    assert "Measured now" in capsys.readouterr().out and len(list(results.rglob("*.json"))) == 1

    def wrong(specs, shapes, quick, progress):
        rec = _record(shapes)
        rec["cases"][0]["kernels"]["07_mma"]["check"]["passed"] = False
        return rec

    monkeypatch.setattr(attnlab.gpu.bench, "run_bench", wrong)
    with pytest.raises(AssertionError, match="no result"):
        page.bench_at(["07_mma"], targets)


ROOT = Path(__file__).resolve().parents[1]


def _png_width(data: bytes) -> int:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big")  # IHDR: width, then height


def test_the_lane_map_reads_at_the_books_column_width():
    """Every text of the mma.sync lane-map figure (the lane numbers in its cells above all) is at
    least READABLE_PX CSS px high once the page fits the figure to a COLUMN_PX column: fontsize in
    points x dpi / 72 x the scale, for the PNG book.show writes. The committed page holds that PNG."""
    import base64
    import io

    import matplotlib.pyplot as plt
    import nbformat

    fig = fragments.mma_fragment_figure()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=page.FIGURE_DPI, metadata={"Software": None})
    width = _png_width(buf.getvalue())
    assert abs(width - fig.get_size_inches()[0] * page.FIGURE_DPI) < 1
    smallest = fragments.smallest_text_px(fig, page.FIGURE_DPI)
    plt.close(fig)
    assert smallest >= fragments.READABLE_PX, f"{smallest:.1f} px at a {fragments.COLUMN_PX} px column"
    # the old figure (10 in wide, 7 pt digits) read at 7 px there: the measure sees it
    old = plt.figure(figsize=(10, 11))
    old.text(0.5, 0.5, "31", fontsize=7)
    assert fragments.smallest_text_px(old, page.FIGURE_DPI) < fragments.READABLE_PX
    plt.close(old)

    nb = nbformat.read(ROOT / "book" / "ch07_1_mma.ipynb", as_version=4)
    shown = [out for c in nb.cells if c.cell_type == "code" and "mma_fragment_figure(" in c.source
             for out in c.outputs if "image/png" in out.get("data", {})]
    assert len(shown) == 1
    assert _png_width(base64.b64decode(shown[0]["data"]["image/png"])) == width, "re-execute the page"


# Chapter 7's sentences that point at a measurement: a paragraph that names a table, a figure or a
# measured ratio lives in a glued paragraph that the page's code writes only where the record it
# points at exists; without one, the glue says what is true without it.
POINTERS = ("Measurement with it off", "the table below", "The table below", "Where a record exists", "**Measured.**")
# per page of the chapter, the glued paragraphs that must read in both modes (the record's
# sentence, or one true without it)
ALWAYS = {"ch07_mma_swizzle": ("ch07_climb_measured", "ch07_targets_intro"),
          **{s.page: (f"ch07_{s.number[2:]}_measured",) for s in STEPS_07}}


def _page_glue(nb) -> dict[str, str]:
    glued = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:
                data = out["data"]
                glued[name] = data.get("application/papermill.record/text/markdown",
                                       data.get("application/papermill.record/text/plain", ""))
    return glued


def test_chapter_7s_pages_are_the_overview_and_its_steps_in_order():
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    import run_book

    pages = [Path(f).name for f in run_book.toc_files()]
    at = pages.index("ch07_mma_swizzle")
    assert pages[at + 1:at + 1 + len(STEPS_07)] == [s.page for s in STEPS_07]
    assert set(ALWAYS) == {p for p in pages if p.startswith("ch07")}


@pytest.mark.parametrize("name", sorted(ALWAYS))
def test_chapter_7_points_only_at_what_the_page_shows(name):
    import re

    import nbformat

    nb = nbformat.read(ROOT / "book" / f"{name}.ipynb", as_version=4)
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for phrase in POINTERS:
        assert phrase not in prose, f"{phrase!r} is typed in the prose: glue it where its target is"
    glued = _page_glue(nb)
    blocks = re.findall(r"\{glue:md\} (\w+)", prose)
    assert set(blocks) <= set(glued), set(blocks) - set(glued)
    texts = set(re.findall(r"\{glue:text\}`(\w+)`", prose))
    assert texts <= set(glued), texts - set(glued)
    for block in ALWAYS[name]:
        assert block in blocks and glued[block].strip(), f"{block}: empty, so its section ends on nothing"
    top = "\n".join(out.get("data", {}).get("text/markdown", "") for out in nb.cells[2].outputs)
    if "No time on this page is measured yet" in top:  # no record: nothing may point at one
        for block in blocks:
            for phrase in POINTERS:
                assert phrase not in glued[block], f"{block} points at a measurement the page lacks: {glued[block]!r}"
        shown = [out["data"]["text/markdown"] for c in nb.cells if c.cell_type == "code"
                 for out in c.outputs if "text/markdown" in out.get("data", {})]
        assert not any("07_mma / floor" in t or "fastest SDPA" in t for t in shown), "a table of times without a record"


def test_loop_parts_weigh_each_line_by_its_own_trips():
    """attnlab.book.loop_parts: a line's instructions count on the trips its line ran (per CTA), a line
    without a count (or none: the loop's own test) on every trip; a part is the sum of its lines and
    every line lands in exactly one part."""
    from attnlab.book.loop_parts import REST, weigh

    lines = ((None, 2), ("k.cu:10", 4), ("k.cu:11", 8), ("k.cu:12", 1))
    per_line = {"k.cu:10": np.array([1.0, 3.0]), "k.cu:11": np.array([0.0, 2.0])}  # 12: no count
    trips = np.array([4.0, 4.0])
    part_of = {None: REST, "k.cu:10": "copy", "k.cu:11": "rescale", "k.cu:12": "rescale"}.get
    stalls = ((None, 2), ("k.cu:10", 12), ("k.cu:11", 8), ("k.cu:12", 5))
    parts = {p.name: p for p in weigh(lines, per_line, trips, part_of, ("copy", "rescale", REST), stalls)}
    assert {n: p.in_loop for n, p in parts.items()} == {"copy": 4, "rescale": 9, REST: 2}
    assert parts["copy"].stalled == pytest.approx(3 * parts["copy"].issued)  # 12 cycles for 4 instructions
    assert parts["copy"].stall_per_instruction == pytest.approx(2.0)
    assert parts["rescale"].stalled == pytest.approx((8 * 0 + 5 * 4 + 8 * 2 + 5 * 4) / 2)
    assert parts[REST].stalled == pytest.approx(2 * 4) and parts[REST].stall_per_instruction == 0
    assert parts["copy"].issued == pytest.approx((4 * 1 + 4 * 3) / 2)
    assert parts["rescale"].issued == pytest.approx((8 * 0 + 1 * 4 + 8 * 2 + 1 * 4) / 2)
    assert parts[REST].issued == pytest.approx(2 * 4)
    assert sum(p.in_loop for p in parts.values()) == sum(n for _, n in lines)
