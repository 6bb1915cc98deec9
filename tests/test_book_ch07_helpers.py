"""The helpers chapter 7's page draws on (attnlab.fragments, attnlab.swizzle, attnlab.kernel_view): PTX fragment maps, the swizzle's bank
model, the occupancy arithmetic, and the target-shape bench in both modes (the GPU's measurement
replaced by a synthetic record)."""
from __future__ import annotations

import numpy as np
import pytest

from attnlab import book, fragments, kernel_view, measured, swizzle
from attnlab.registry import _MMA07_BLOCK_M, _MMA07_BLOCK_N, get
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
            counts = swizzle.ldmatrix_wavefronts_07(D, _MMA07_BLOCK_M, _MMA07_BLOCK_N[D], sw)
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

    from attnlab.results import write_record

    monkeypatch.setattr(book, "has_gpu", lambda: False)
    targets = [Shape(1, 8, 512, 64), Shape(4, 16, 4096, 64)]
    assert book.bench_at(["07_mma"], targets) is None
    write_record(_record(targets[:1]), results)
    assert book.bench_at(["07_mma"], targets) is None, "a record missing a shape is not shown"
    write_record({**_record(targets), "created_utc": "2026-01-03T00:00:00Z"}, results)
    rec = book.bench_at(["07_mma"], targets)
    assert rec is not None and "Committed bench record" in capsys.readouterr().out
    rows = measured.record_rows(rec)
    assert len(rows) == 4 and all(r["sdpa_flash_us"] == pytest.approx(20.0 * scale(r["shape"])) for r in rows)
    assert all(r["share_of_matmul"] is not None and r["speedup_vs_sdpa"] > 0 for r in rows)
    assert measured.record_rows(None) == []


def test_bench_at_on_a_gpu_measures_saves_and_refuses_wrong_output(results, monkeypatch, capsys):
    import attnlab.bench

    monkeypatch.setattr(book, "has_gpu", lambda: True)
    seen = {}

    def fake_run_bench(specs, shapes, quick, progress):
        seen["shapes"] = list(shapes)
        return _record(shapes)

    monkeypatch.setattr(attnlab.bench, "run_bench", fake_run_bench)
    targets = [Shape(2, 16, 4096, 128)]
    rec = book.bench_at(["07_mma"], targets, save=True)
    assert seen["shapes"] == targets and rec["cases"]
    assert "Measured now" in capsys.readouterr().out and len(list(results.rglob("*.json"))) == 1

    def wrong(specs, shapes, quick, progress):
        rec = _record(shapes)
        rec["cases"][0]["kernels"]["07_mma"]["check"]["passed"] = False
        return rec

    monkeypatch.setattr(attnlab.bench, "run_bench", wrong)
    with pytest.raises(AssertionError, match="no result"):
        book.bench_at(["07_mma"], targets)
