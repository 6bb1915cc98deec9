"""The executor's instrument (attnlab.executor.trace, runtime/instrument.cpp): counts of execution held
to closed forms a reader can derive from the kernels' sources, the trace of one CTA held to what
that CTA must touch, and the whole chapter 1-7 set counted at the mission shape within its time."""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from attnlab.book.scoreboard import chapter_kernels
from attnlab.executor.counts import EVENT_KINDS, WARP_EVENT_LANE
from attnlab.executor.trace import MMA_FLOPS, format_trace, ideal_counts, short_places, to_json, trace
from attnlab.kernels import registry
from attnlab.shapes import MISSION, Shape

# Each chapter's kernel, in the order the book climbs, as the book names them.
CHAPTER_KERNELS = tuple(chapter_kernels().values())


def _ctas(t, launch=0) -> int:
    return int(np.prod(t.launches[launch].grid))


@pytest.mark.parametrize("causal", [False, True])
def test_scalar_global_bytes_match_its_loop(causal):
    """01_scalar: each of the L rows reads its own Q row once, then K and V of every key it sees (L,
    or i + 1 for row i with the mask), 2 bytes an element; it writes its O row. Every byte of Q, K,
    V is read by someone, and O written once."""
    B, H, L, D = shape = Shape(1, 2, 40, 16)
    t = trace("01_scalar", shape, causal, cache=False)
    keys_seen = L * (L + 1) // 2 if causal else L * L
    tot = t.totals()
    assert tot["global_read"] == B * H * (L * D * 2 + 2 * keys_seen * D * 2)
    assert tot["global_write"] == B * H * L * D * 2
    assert tot["global_distinct_read"] == 3 * B * H * L * D * 2
    assert tot["tensor_instructions"] == 0 and tot["barriers"] == 0


def test_mma_global_bytes_and_tensor_instructions_match_its_tiles():
    """07_mma, non-causal, L a multiple of its tiles: every CTA reads its Q tile once and all of K
    and V of its head once (the in-CTA key split divides keys among warps, not CTAs), writes its O
    tile; the tensor cores do exactly the 4 B H L^2 D FLOPs, one m16n8k16 per 4096."""
    B, H, L, D = shape = Shape(1, 2, 128, 64)
    t = trace("07_mma", shape, cache=False)
    tot = t.totals()
    q_tiles = t.launches[0].grid[0]
    assert t.launches[0].grid[1] == B * H
    assert tot["global_read"] == B * H * (L * D * 2 + q_tiles * 2 * L * D * 2)
    assert tot["global_write"] == B * H * L * D * 2
    assert tot["tensor_instructions"] == 4 * B * H * L * L * D // MMA_FLOPS == ideal_counts(shape, False)["tensor_instructions"]
    assert tot["cp_async_bytes"] == tot["global_read"]  # every global read of 07_mma is a cp.async
    assert tot["global_excess_sectors"] == 0


def test_swizzle_removes_the_eightfold_ldmatrix_conflict():
    """At D = 64 a K/V row is 128 bytes: without the swizzle the 8 row addresses of each 8x8 matrix
    of an ldmatrix fall in the same 4 banks (8 wavefronts for 1); with it, none conflict."""
    shape = Shape(1, 2, 128, 64)
    for kid, factor in (("07_mma", 1), ("07_mma_noswizzle", 8)):
        ld = [s for s in trace(kid, shape, cache=False).sites() if s.kind == "ldmatrix"]
        assert ld and all(s.ideal == 4 * s.requests for s in ld)  # x4: four 8x8 matrices a request
        assert all(s.units == factor * s.ideal for s in ld), (kid, [(s.units, s.ideal) for s in ld])


def test_per_cta_counts_add_up_and_do_not_depend_on_the_schedule():
    shape = Shape(1, 1, 200, 64)  # two CTAs of 128 rows
    a = trace("02_block_tiling", shape, True, seed=0, cache=False)
    b = trace("02_block_tiling", shape, True, seed=5, cache=False)
    assert a.totals() == b.totals()
    assert a.per_cta("global_read").sum() == a.totals()["global_read"]
    assert a.per_cta("global_sectors").sum() == a.totals()["global_sectors"]  # per CTA, as per site
    assert len(a.per_cta("exps")) == _ctas(a)
    # causal: the CTA of the later rows sees more keys, so it computes more exponentials
    assert a.per_cta("exps")[1] > a.per_cta("exps")[0]


def test_trace_of_one_cta_touches_its_rows_and_steps_at_barriers():
    """CTA 1 of 02_block_tiling (rows 128..255 of head 0) reads only its Q rows and writes only its O
    rows; its step counter goes up by one at each barrier: two per key tile."""
    B, H, L, D = shape = Shape(1, 1, 200, 64)
    t = trace("02_block_tiling", shape, cta=1, cache=False)
    ev = t.events
    names = t.launches[0].buffers
    acc = ev[ev["kind"] == EVENT_KINDS.index("access")]
    row_bytes = D * 2

    def rows(buffer: str, write: bool) -> set[int]:
        sel = acc[(acc["buffer"] == names.index(buffer)) & (acc["write"] == int(write))]
        out = set()
        for e in sel:
            for i in range(int(e["count"])):
                start = int(e["offset"]) + i * int(e["stride"])
                out.update(range(start // row_bytes, (start + int(e["bytes"]) - 1) // row_bytes + 1))
        return out

    assert rows("Q", False) == set(range(128, 200))
    assert rows("O", True) == set(range(128, 200))
    assert rows("K", False) == set(range(L)) and rows("V", False) == set(range(L))
    bars = ev[ev["kind"] == EVENT_KINDS.index("bar.sync")]
    tiles = -(-L // 32)  # KEYS in kernels/02_block_tiling.cu
    threads = registry.get("02_block_tiling").block(shape)[0]
    assert len(bars) == threads * 2 * tiles
    for lane_bars in (bars[(bars["warp"] == w) & (bars["lane"] == 5)] for w in range(threads // 32)):
        assert lane_bars["step"].tolist() == list(range(2 * tiles))  # the k-th barrier ends step k
    assert ev["step"].max() == 2 * tiles  # the output rows are written after the last one


def test_warp_events_carry_no_lane_and_pipeline_events_their_groups():
    t = trace("07_mma", Shape(1, 1, 256, 64), cache=False)
    ev = t.events
    mma = ev[ev["kind"] == EVENT_KINDS.index("mma.sync")]
    assert len(mma) and (mma["lane"] == WARP_EVENT_LANE).all()
    issue = ev[ev["kind"] == EVENT_KINDS.index("cp.async")]
    commit = ev[ev["kind"] == EVENT_KINDS.index("commit")]
    assert len(issue) and len(commit)
    # every copy joins a group its thread commits later
    assert issue["arg"].max() <= commit["arg"].max()
    per_warp = {w: len(mma[mma["warp"] == w]) for w in np.unique(mma["warp"])}
    assert sum(per_warp.values()) == t.per_cta("tensor_flops")[0] // MMA_FLOPS


def test_counts_are_cached_and_read_back_equal(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    shape = Shape(1, 1, 64, 64)
    first = trace("07_mma", shape)
    assert list((tmp_path / "counts").glob("*.npz"))
    again = trace("07_mma", shape)
    assert again.totals() == first.totals() and again.sites() == first.sites()
    assert np.array_equal(again.events, first.events)


def test_format_and_json_say_counts_not_times():
    t = trace("05_wmma", Shape(1, 1, 64, 64), cache=False)
    text = format_trace(t)
    assert "not times" in text and "bank conflicts" in text
    record = to_json(t)
    assert record["totals"]["tensor_instructions"] == t.totals()["tensor_instructions"] > 0
    assert "never times" in record["measured"]


def test_short_places_drop_shared_frames():
    places = short_places(["a.cuh:3 < k.cu:10 < k.cu:96 < k.cu:120", "k.cu:40 < k.cu:96 < k.cu:120"])
    assert places == {"a.cuh:3 < k.cu:10 < k.cu:96 < k.cu:120": "a.cuh:3 < k.cu:10",
                      "k.cu:40 < k.cu:96 < k.cu:120": "k.cu:40"}
    assert short_places(["x.cu:1 < x.cu:2 < y.cu:3"]) == {"x.cu:1 < x.cu:2 < y.cu:3": "x.cu:1"}


def test_cli_trace_prints_and_refuses_in_one_line():
    run = lambda *a: subprocess.run([sys.executable, "-m", "attnlab", "trace", *a], capture_output=True, text=True)  # noqa: E731
    ok = run("07_mma", "--shape", "1", "1", "64", "64")
    assert ok.returncode == 0, ok.stderr
    assert "tensor-core work" in ok.stdout and "ldmatrix" in ok.stdout
    bad = run("07_mmx")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "07_mma" in bad.stderr
    far = run("07_mma", "--shape", "1", "1", "64", "64", "--cta", "99")
    assert far.returncode == 2 and "--cta 99" in far.stderr


def test_mma_trace_at_the_mission_shape_is_cheap():
    """One CTA traced in full, counts for all 64: well under 30 s on two cores."""
    start = time.perf_counter()
    t = trace("07_mma", MISSION, cache=False)
    assert time.perf_counter() - start < 30
    assert t.completed and not t.findings and not t.launches[0].truncated


def test_every_chapter_counted_at_the_mission_shape_within_five_minutes():
    """The pages' counts: each chapter's kernel at the mission shape, every CTA counted and CTA 0
    traced, in under 5 minutes together on two cores (the results stay cached for the pages)."""
    start = time.perf_counter()
    for kid in CHAPTER_KERNELS:
        t = trace(kid, MISSION)
        assert t.completed and not t.findings, (kid, t.findings)
        assert t.totals()["global_write"] >= MISSION.B * MISSION.H * MISSION.L * MISSION.D * 2
    assert time.perf_counter() - start < 300


@pytest.mark.parametrize("kid,causal,cta", [("02_block_tiling", True, 5), ("07_mma", True, 1), ("06_warp_specialized", False, 0)])
def test_a_grid_split_across_processes_counts_the_same(kid, causal, cta):
    """Every block runs once in one of the processes and counts what it would in one launch: the
    merged counts, sites, distinct bytes and the traced CTA's events equal one process's run."""
    shape = Shape(1, 2, 333, 64)
    one = trace(kid, shape, causal, cta=cta, cache=False, jobs=1)
    split = trace(kid, shape, causal, cta=cta, cache=False, jobs=3)
    a, b = one.launches[0], split.launches[0]
    assert one.totals() == split.totals()
    assert a.sites == b.sites and a.distinct == b.distinct and (a.blocks == b.blocks).all()
    assert len(a.events) == len(b.events) and (a.events == b.events).all()


def test_a_share_of_a_two_launch_grid_is_refused():
    from attnlab.executor.cpu import attention_cpu
    from attnlab.pass_rule import make_inputs

    q, k, v = make_inputs(Shape(1, 1, 64, 64), 0, device="cpu")
    with pytest.raises(ValueError, match="more than one launch"):
        attention_cpu("07_mma_split_ctas", q, k, v, count=True, block_range=(0, 1))


@pytest.mark.parametrize("kid,causal,D", [("07_mma", True, 64), ("07_mma_two_row_blocks", False, 64),
                                          ("03_warp_rows_4w", True, 64), ("07_mma_across_heads", True, 64),
                                          ("07_mma_across_heads", False, 64), ("07_mma_two_rows_at_d128", False, 128)])
def test_one_heads_counts_stand_for_every_heads_exactly(kid, causal, D):
    """The large shapes' counts run the first head's CTAs and take every head's to be theirs: at a
    shape small enough to run whole, the per-CTA counts, the sites and the distinct bytes agree
    with every CTA's own run."""
    from attnlab.executor.trace import one_head_grid, trace_one_head

    shape = Shape(2, 3, 200, D)
    spec = registry.get(kid)
    assert one_head_grid(spec, shape) is not None
    whole = trace(kid, shape, causal, cache=False, jobs=2)
    one = trace_one_head(kid, shape, causal, cache=False, jobs=2)
    a, b = whole.launches[0], one.launches[0]
    assert one.heads_run == 1 and whole.heads_run is None
    assert (a.blocks == b.blocks).all() and a.distinct == b.distinct
    assert sorted(a.sites, key=lambda s: (s.where, s.kind)) == sorted(b.sites, key=lambda s: (s.where, s.kind))
    assert whole.totals() == one.totals()


def test_one_head_is_refused_where_the_heads_are_not_grid_y():
    from attnlab.executor.trace import trace_one_head

    with pytest.raises(ValueError, match="grid y"):
        trace_one_head("07_mma_split_ctas", Shape(1, 2, 64, 64))
