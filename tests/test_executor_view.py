"""The pages' executor figures and tables (attnlab.book.executor_view) against the executor's own
counters and the book's hand models: what a figure draws from the trace of one CTA must add up to
what the counters counted for that CTA, and a planted wrong trace must draw something else."""
from __future__ import annotations

import copy
import io

import numpy as np
import pytest

from attnlab.book import banks, executor_view, swizzle
from attnlab.executor.counts import EVENT_KINDS
from attnlab.executor.trace import trace
from attnlab.model.bounds import gemm_operands
from attnlab.shapes import Shape

SMALL = Shape(1, 1, 256, 64)


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=60, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


@pytest.mark.parametrize("kid", ["02_block_tiling", "03_warp_rows_4w", "05_wmma", "06_warp_specialized", "07_mma",
                                 "07_mma_noswizzle"])
def test_bank_map_adds_up_to_the_counters_of_its_cta(kid):
    """Wavefronts and ideal regrouped from the trace's addresses (requests by site, epoch and
    occurrence; phases by width) equal the counters' own for the traced CTA, exactly."""
    t = trace(kid, Shape(1, 1, 200, 64), cta=0, cache=False)
    sites = executor_view.shared_sites(t)
    assert sites
    assert sum(s.wavefronts for s in sites) == t.per_cta("shared_wavefronts")[0]
    assert sum(s.ideal for s in sites) == t.per_cta("shared_ideal")[0]
    assert sum(s.requests for s in sites) == t.per_cta("shared_requests")[0]


def test_scalar_q_read_from_the_trace_is_the_hand_model():
    """Chapter 1's bank figure draws banks.column_major_halves (warp 0 reads q_s[d * 128 + lane]);
    the executor's first request of warp 0 at the q_s read is that access."""
    t = trace("01_scalar", Shape(1, 1, 64, 64), cache=False)
    site = next(s for s in executor_view.shared_sites(t) if s.kind == "shared load")
    got = executor_view.warp_access_at(t, site.where, "shared load", warp=0, occurrence=0)
    want = banks.column_major_halves(d=0, threads=128, warp=0)
    assert got.offsets[1] - got.offsets[0] == 2 and got.size == want.size == 2
    assert got.banks == want.banks and got.wavefronts == want.wavefronts == 1


def test_swizzle_wavefronts_from_the_trace_match_the_address_formulas():
    """attnlab.book.swizzle's formulas (chapter 7's page) give every ldmatrix.x4 at D = 64 4
    wavefronts with the swizzle and 32 without; the trace's regrouped addresses say the same."""
    for kid, swz in (("07_mma", True), ("07_mma_noswizzle", False)):
        formula = [w for ws in swizzle.ldmatrix_wavefronts_07(64, 64, 64, swz).values() for w in ws]
        ld = [s for s in executor_view.shared_sites(trace(kid, SMALL, cache=False)) if s.kind == "ldmatrix"]
        assert ld
        for s in ld:
            assert s.wavefronts == s.requests * formula[0] and len(set(formula)) == 1, (kid, s)
        assert all(s.words_per_bank.max() == (1 if swz else 8) for s in ld)


def test_double_buffer_reads_one_stage_while_copying_the_other():
    """07_mma with two stages (the L4's tiles): at every step after the first, each warp reads
    one stage and issues its copies into the other."""
    t = trace("07_mma", SMALL, cache=False)
    assert len(executor_view.stage_regions(t)) == 2
    cells = executor_view.pipeline_events(t)
    both = [(copies, reads) for (w, s), (copies, reads) in cells.items() if copies and reads]
    assert both and all(not (copies & reads) for copies, reads in both)


def test_warp_specialized_ring_copies_before_it_is_read():
    """06: only the producer warp copies, only the consumers read, and every stage a consumer
    reads at a step was filled at an earlier step."""
    t = trace("06_warp_specialized", SMALL, cache=False)
    cells = executor_view.pipeline_events(t)
    warps = t.launches[0].block[0] // 32
    producers = {w for (w, _), (copies, _) in cells.items() if copies}
    consumers = {w for (w, _), (_, reads) in cells.items() if reads}
    assert producers == {warps - 1} and consumers == set(range(warps - 1))
    filled = {}
    for (w, s), (copies, _) in cells.items():
        for st in copies:
            filled.setdefault(st, []).append(s)
    for (w, s), (_, reads) in cells.items():
        for st in reads:
            assert min(filled[st]) < s


def test_figures_drawn_from_a_planted_trace_differ():
    """A figure is drawn from the trace, not from a model: move every shared access of warp 0 onto
    one bank, or hand CTA 0's Q rows to another warp, and the figure changes."""
    t = trace("07_mma", SMALL, cache=False)
    planted = copy.deepcopy(t)
    ev = planted.launches[0].events
    ldsm = ev["kind"] == EVENT_KINDS.index("ldmatrix")
    ev["offset"][ldsm] = ev["offset"][ldsm] // 128 * 128  # every row address at the start of a 128-byte line
    assert max(s.words_per_bank.max() for s in executor_view.shared_sites(planted)) > 1
    assert _png(executor_view.bank_heatmap(planted)) != _png(executor_view.bank_heatmap(t))
    moved = copy.deepcopy(t)
    ev = moved.launches[0].events
    ev["warp"][(ev["kind"] == EVENT_KINDS.index("access")) & (ev["buffer"] == 0)] = 0
    assert _png(executor_view.tiling_figure(moved)) != _png(executor_view.tiling_figure(t))


def test_tiling_figure_data_are_the_ctas_rows():
    """CTA 1 of 01_scalar reads rows 128..255 of Q and writes the same rows of O, one lane per row."""
    t = trace("01_scalar", SMALL, cta=1, cache=False)
    rows, cols, warp, lane = executor_view.touched(t, "Q", write=False)
    assert set(rows.tolist()) == set(range(128, 256)) and set(cols.tolist()) == set(range(64))
    assert (lane == (rows - 128) % 32).all() and (warp == (rows - 128) // 32).all()
    rows_o, _, _, _ = executor_view.touched(t, "O", write=True)
    assert set(rows_o.tolist()) == set(range(128, 256))


def test_page_table_leaves_out_rows_no_kernel_has():
    traces = executor_view.counts(["01_scalar", "02_block_tiling"], SMALL)
    header, rows = executor_view.counts_rows(traces, SMALL)
    labels = [r[0] for r in rows]
    assert header[2:] == ["`01_scalar`", "`02_block_tiling`"]
    assert not any("tensor-core" in x or "cp.async" in x or "shuffles" in x for x in labels)
    assert any("barriers" in x for x in labels)  # chapter 2 has them
    with_tc = executor_view.counts_rows(executor_view.counts(["07_mma"], SMALL), SMALL)[1]
    assert any("tensor-core" in r[0] for r in with_tc)


def test_site_bars_show_the_redundant_exponentials():
    t = trace("03_warp_rows_4w", SMALL, cache=False)
    exps = sum(s.lanes for s in t.sites() if s.kind == "exp")
    assert exps == t.totals()["exps"] > 4 * SMALL.L * SMALL.L  # each score's exp on D / 8 = 8 lanes
    assert _png(executor_view.site_bars(t))


def test_fragment_maps_read_back_from_execution_are_the_isa_tables():
    """kernels/probe_fragments.cu, run on the executor with the kernel's own ldmatrix addressing,
    gives every lane the A, B and C/D elements the PTX ISA's mma.m16n8k16 tables assign it."""
    from attnlab.book import fragments

    executed, isa = fragments.executed_maps(), fragments.mma_m16n8k16_maps()
    for name in ("A", "B", "C"):
        for got, want in zip(executed[name], isa[name]):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=name)
    # lane 5: groupID 1, threadID_in_group 1 -> a0, a1 at row 1, columns 2, 3; c2, c3 at row 9
    assert list(executed["A"][1][5, :2]) == [2, 3] and list(executed["C"][0][5, 2:]) == [9, 9]


def test_without_a_compiler_the_sections_say_so_and_draw_nothing(monkeypatch, tmp_path):
    """No C++ compiler (CXX names none): the counts table, its figures, the prediction line and the
    fragment maps each say so in one notice, or fall back to the ISA's table, and never raise."""
    from attnlab.book import fragments, page, predicted

    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))  # nothing cached either
    said = []
    monkeypatch.setattr(page, "notice", said.append)
    seen = executor_view.counts_table("07_mma", "06_warp_specialized")
    assert seen["07_mma"] is None and executor_view.tiling_figure(seen["07_mma"]) is None
    assert executor_view.bank_heatmap(seen["07_mma"], compare=seen["06_warp_specialized"]) is None
    assert executor_view.glue_counts("x", seen["07_mma"]) == {}
    predicted.show_line("07_mma")
    assert predicted.climb_figure(["07_mma"]) is None
    assert len(said) == 3 and all("no-such-compiler" in s for s in said)
    maps, source = fragments.maps_for_page()
    assert "ISA" in source and maps["A"][1][5, 0] == 2


def test_score_traffic_is_the_score_matrix_each_way():
    """Chapter 4's figure data: the hybrid softmax reads S's B H L^2 fp16 bytes twice (the row's max
    and sum, then P) and writes them once, over S; chapter 3 reads Q once, K and V once per CTA, and
    writes O once; the GEMMs' operands are the closed forms."""
    B, H, L, D = SMALL
    hybrid = executor_view.bytes_by_buffer(trace("04_cublas_hybrid", SMALL))
    assert hybrid == {"S": {"distinct_read": 2 * B * H * L * L, "distinct_write": 2 * B * H * L * L,
                            "asked_read": 2 * 2 * B * H * L * L, "asked_write": 2 * B * H * L * L}}
    t = trace("03_warp_rows_4w", SMALL)
    fused = executor_view.bytes_by_buffer(t)
    ctas = len(t.per_cta("global_read"))
    assert fused["Q"]["asked_read"] == fused["Q"]["distinct_read"] == 2 * B * H * L * D
    assert fused["K"]["asked_read"] == fused["V"]["asked_read"] == ctas // (B * H) * 2 * B * H * L * D
    assert fused["O"]["distinct_write"] == 2 * B * H * L * D
    gemms = gemm_operands(SMALL)
    assert sum(n for _, _, n in gemms) == 4 * 2 * B * H * L * L // 2 + 4 * 2 * B * H * L * D
    planted = copy.deepcopy(trace("04_cublas_hybrid", SMALL))
    planted.launches[0].distinct = [(1, 1)]
    f = trace("03_warp_rows_4w", SMALL)
    assert _png(executor_view.score_traffic_figure(f, planted, lengths=(128, 256))) != \
        _png(executor_view.score_traffic_figure(f, trace("04_cublas_hybrid", SMALL), lengths=(128, 256)))


def test_staging_follows_the_tiles_of_chapter_5():
    """05_wmma's first key tile, one warp: five tiles in shared memory (K and V filled from global,
    S, P and O), S written by a WMMA store then read by the lanes, P written by the lanes then read
    by a WMMA load: the round trips the chapter removes. A planted trace draws differently."""
    t = trace("05_wmma", SMALL)
    bands = executor_view.shared_bands(t, (1, 2))
    assert len(bands) == 5
    ev = t.launches[0].events
    kinds = [s.kind for s in t.launches[0].sites]
    w0 = ev[(ev["warp"] == 0) & (ev["step"] == 2) & (ev["kind"] == EVENT_KINDS.index("access"))]
    lo, _ = executor_view._run_spans(w0)

    def kinds_in(band):
        inside = w0[(lo >= band[0]) & (lo < band[1])]
        return {kinds[s] for s in inside["site"].tolist()}

    s_band, p_band = bands[2], bands[3]
    assert {"wmma store", "shared load"} <= kinds_in(s_band)
    assert {"shared store", "wmma load"} <= kinds_in(p_band)
    planted = copy.deepcopy(t)
    pev = planted.launches[0].events
    pev["offset"][(pev["warp"] == 0) & (pev["buffer"] == -1)] //= 2
    assert _png(executor_view.staging_figure(planted)) != _png(executor_view.staging_figure(t))
    assert executor_view.staging_figure(trace("03_warp_rows_4w", SMALL)) is None  # no tensor cores
