"""The time model (attnlab.model.bounds): each resource's bound equals the hand computation for a
planted launch (counts chosen here, the rates of the L4 and the H100), the busiest SM sets it
(waves and imbalance), and a prediction of a real kernel names its bottleneck and says predicted."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from attnlab.executor.counts import BLOCK_FIELDS, EVENT_DTYPE, LaunchCounts, SiteCount
from attnlab.executor.trace import MMA_FLOPS, Trace
from attnlab.gpus import by_key
from attnlab.kernels import registry
from attnlab.kernels.registry import STEPS_07
from attnlab.model import bounds
from attnlab.shapes import MISSION, Shape

L4, H100 = by_key("L4"), by_key("H100 SXM")


def _trace(ctas: int, shape=Shape(1, 1, 64, 64), sectors_per_byte: float = 1 / 32, **per_cta) -> Trace:
    """A launch of `ctas` CTAs of 128 threads, each with the counts given (BLOCK_FIELDS names)."""
    blocks = np.zeros((ctas, len(BLOCK_FIELDS)), np.int64)
    for name, value in per_cta.items():
        blocks[:, BLOCK_FIELDS.index(name)] = value
    moved = int(blocks[:, 0].sum() + blocks[:, 1].sum())
    blocks[:, BLOCK_FIELDS.index("global_sectors")] = (blocks[:, 0] + blocks[:, 1]) * sectors_per_byte
    sites = [SiteCount("k.cu:1", "global load", 0, 1, moved, int(moved * sectors_per_byte), int(moved / 32))]
    launch = LaunchCounts("k", (ctas, 1, 1), (128, 1, 1), sites, blocks, [(4096, 1024)], np.zeros(0, EVENT_DTYPE))
    return Trace("planted", shape, False, None, [launch])


def _bound(t, gpu, resource, resident=1, dot_products=True) -> float:
    return next(b.time_us for b in bounds.bounds_of(t, gpu, resident, dot_products) if b.resource == resource)


def test_clock_is_the_one_that_makes_the_datasheet_peak():
    assert bounds.clock_ghz(L4) == pytest.approx(121e12 / (58 * 1024) / 1e9)
    assert bounds.clock_ghz(H100) == pytest.approx(989e12 / (132 * 4096) / 1e9)


@pytest.mark.parametrize("gpu", [L4, H100], ids=lambda g: g.key)
def test_each_resource_bound_is_count_over_rate_on_one_sm(gpu):
    hz = bounds.clock_ghz(gpu) * 1e9
    rates = bounds.ARCH_RATES[gpu.arch]
    t = _trace(gpu.sms, tensor_flops=1 << 20, shared_wavefronts=5000, exps=8000, shuffles=300,
               global_read=64000, global_write=16000)
    assert _bound(t, gpu, "tensor cores") == pytest.approx((1 << 20) / (rates["tensor_flops"] * hz) * 1e6)
    assert _bound(t, gpu, "shared memory") == pytest.approx(5000 / hz * 1e6)
    assert _bound(t, gpu, "exponentials") == pytest.approx(8000 / (16 * hz) * 1e6)
    assert _bound(t, gpu, "shuffles") == pytest.approx(300 * 32 / (32 * hz) * 1e6)
    assert _bound(t, gpu, "L2 to SM") == pytest.approx(80000 / (64 * hz) * 1e6)
    assert _bound(t, gpu, "DRAM") == pytest.approx((4096 + 1024) / (gpu.dram_gbps * 1e9) * 1e6)
    assert _bound(t, gpu, "fp32 FMA") == 0  # tensor cores ran: no dot product on CUDA cores


def test_one_cta_too_many_doubles_the_busiest_sm():
    one_wave = _trace(L4.sms, tensor_flops=1 << 20)
    plus_one = _trace(L4.sms + 1, tensor_flops=1 << 20)
    assert _bound(plus_one, L4, "tensor cores") == pytest.approx(2 * _bound(one_wave, L4, "tensor cores"))


def test_uncoalesced_sectors_inflate_the_l2_bound():
    tight = _trace(L4.sms, global_read=32000)
    loose = _trace(L4.sms, global_read=32000, sectors_per_byte=4 / 32)
    assert _bound(loose, L4, "L2 to SM") == pytest.approx(4 * _bound(tight, L4, "L2 to SM"))


def test_fma_bound_follows_the_warps_a_scheduler_has():
    """4 D FLOPs per score on CUDA cores, as the CTAs' exponentials are spread; with one CTA of 4
    warps per SM each scheduler has one warp, so the pipe runs at 1/FMA_LATENCY."""
    shape = Shape(1, 1, 128, 64)
    t = _trace(1, shape, exps=128 * 128)
    hz = bounds.clock_ghz(L4) * 1e9
    flops = 4 * 64 * 128 * 128
    want = flops / 2 / (128 / bounds.FMA_LATENCY * hz) * 1e6
    assert _bound(t, L4, "fp32 FMA") == pytest.approx(want)
    assert _bound(t, L4, "fp32 FMA", dot_products=False) == 0


def test_prediction_of_the_last_chapter_names_its_bottleneck():
    p = bounds.predict("07_mma", MISSION, False, "L4")
    assert p.bottleneck in {b.resource for b in p.bounds}
    assert p.time_us == pytest.approx(p.top.time_us + bounds.LAUNCH_US)
    assert p.ctas == 64 and p.ctas_per_sm >= 1
    tensor = next(b for b in p.bounds if b.resource == "tensor cores")
    floor = MISSION.flops(False) / (L4.fp16_tflops * 1e12) * 1e6
    assert tensor.time_us >= floor * 0.999  # never under the datasheet peak
    h = bounds.predict("07_mma", MISSION, False, "H100 SXM")
    assert h.kernel == "07_mma@sm_90" and h.time_us < p.time_us


def test_freed_shared_memory_and_more_resident_ctas_are_weighed_with_the_same_counts():
    """launch_occupancy(smem_freed=) is the occupancy rule with that much less shared memory per
    CTA; predict(resident=) keeps the counts and changes only the CTAs an SM holds at a time. With
    the stalls overlapped (the L4's rule) the latency bound falls by the ratio and nothing else
    moves; taken in turn (turn=True: sm_90's rule for a tensor-core loop, asked for here on the L4's
    counts), more CTAs held hide none of them and no bound moves. Step 7.12's four-way split at the
    mission shape on the L4 takes 34 KB: two CTAs per SM by shared memory, three with 2 KB less."""
    kid = "07_mma_whole_tile_copy"
    now = bounds.launch_occupancy(kid, MISSION, L4)
    assert now.blocks_per_sm == bounds.ctas_per_sm(kid, MISSION, L4) == 2 and now.limiters == ("shared memory",)
    assert bounds.launch_occupancy(kid, MISSION, L4, smem_freed=2048).blocks_per_sm == 3
    assert bounds.launch_occupancy(kid, MISSION, L4, smem_freed=1024).blocks_per_sm == 2
    two, three = (bounds.predict(kid, MISSION, False, "L4", resident=r, turn=True) for r in (2, 3))
    assert {b.resource: b.time_us for b in two.bounds if b.resource != "fp32 FMA"} == \
        {b.resource: b.time_us for b in three.bounds if b.resource != "fp32 FMA"}
    two, three = (bounds.predict(kid, MISSION, False, "L4", resident=r) for r in (2, 3))
    assert bounds.predict(kid, MISSION, False, "L4").bounds == two.bounds and three.ctas_per_sm == 3
    latency = {p.ctas_per_sm: next(b.time_us for b in p.bounds if b.resource == "latency") for p in (two, three)}
    assert latency[3] == pytest.approx(latency[2] * 2 / 3)
    assert {b.resource: b.time_us for b in two.bounds if b.resource not in ("latency", "fp32 FMA")} == \
        {b.resource: b.time_us for b in three.bounds if b.resource not in ("latency", "fp32 FMA")}


def test_a_large_launch_is_predicted_from_one_heads_counts_and_says_so():
    small = bounds.predict("07_mma", MISSION, False, "H100 SXM")
    assert small.heads_run is None
    large = Shape(4, 16, 2048, 64)
    p = bounds.predict("07_mma", large, False, "H100 SXM")
    assert p.ctas > bounds.RUN_EVERY_CTA and p.heads_run == 1
    tensor = next(b for b in p.bounds if b.resource == "tensor cores")
    # every head's MMAs counted: the tensor-core bound holds the whole launch's FLOPs
    assert tensor.time_us >= large.flops(False) / (by_key("H100 SXM").fp16_tflops * 1e12) * 1e6 * 0.999


@pytest.mark.parametrize("gpu", bounds.PREDICTED_GPUS)
def test_the_large_shapes_smallest_launch_is_counted_by_one_head(gpu, monkeypatch):
    """The fewest CTAs any launch of chapter 7 takes at the large shapes, step 7.13's ablation at
    (2, 16, 4096, 128) with 32-key tiles' 1,024, is counted by one head: whole, it took a quarter of
    an hour. counted() decides; which count run it asks for is recorded instead of run."""
    g, large = by_key(gpu), Shape(2, 16, 4096, 128)
    grid = registry.get("07_mma_two_rows_at_d128", g.arch).launch_config(large, g.sms)["grid"]
    assert int(np.prod(grid)) == 1024
    asked = []
    done = Trace("07_mma_two_rows_at_d128", large, False, None, [], completed=True)
    monkeypatch.setattr(bounds, "trace", lambda *a, **k: asked.append("whole") or done)
    monkeypatch.setattr(bounds, "trace_one_head", lambda *a, **k: asked.append("one head") or done)
    bounds.counted("07_mma_two_rows_at_d128", large, False, g)
    assert asked == ["one head"]


def test_hybrid_adds_its_gemms_and_their_launches():
    p = bounds.predict("04_cublas_hybrid", MISSION, False, "L4")
    assert [b.resource for b in p.extra] == ["GEMM S = Q K^T", "GEMM O = P V"]
    assert p.launches == 3
    assert next(b for b in p.bounds if b.resource == "fp32 FMA").time_us == 0


def _with_trips(t: Trace, runs: dict[str, int]) -> Trace:
    """`t` with a planted trip count: one basic block per line of `runs` ("k.cu:N" -> the trips of
    loop k.cu:3 its warps ran it on, summed over warps), the same in every CTA."""
    from attnlab.executor.trips import EntryBlocks

    launch = t.launches[0]
    lines = list(runs)
    launch.trip_blocks = EntryBlocks(tuple(range(len(lines))), ("k.cu:3",), tuple(() for _ in lines),
                                     tuple((line, 0) for line in lines), tuple((i,) for i in range(len(lines))))
    launch.trip_runs = np.tile(np.array([runs[line] for line in lines], np.int64), (len(launch.blocks), 1))
    return t


def test_issue_bound_counts_each_loop_instruction_on_the_trips_its_line_ran():
    """A planted loop of 500 SASS instructions: 20 with no line in the body (every trip), 400 at a
    line run on all 32 warp-trips of a CTA, 80 at a guarded line run on 4 of them; 300 outside it.
    A CTA of 4 warps issues 20 x 32 + 400 x 32 + 80 x 4 + 300 x 4 warp instructions, at 4 per SM-clock."""
    from attnlab.model import issue

    loop = issue.LoopShape("k", L4.arch, "HMMA", 64, 500, 300, head="k.cu:3",
                           parts=((None, 20), ("k.cu:5", 400), ("k.cu:9", 80)), marker_parts=(("k.cu:5", 64),))
    t = _with_trips(_trace(L4.sms, tensor_flops=2048 * MMA_FLOPS), {"k.cu:5": 32, "k.cu:9": 4})
    issued = issue.warp_instructions(loop, t.launches[0], warps=4)
    want = 20 * 32 + 400 * 32 + 80 * 4 + 300 * 4
    assert issued == pytest.approx(np.full(L4.sms, want))
    hz = bounds.clock_ghz(L4) * 1e9
    got = next(b for b in bounds.bounds_of(t, L4, 1, issue=(issued, loop)) if b.resource == "instruction issue")
    assert got.time_us == pytest.approx(want / (4 * hz) * 1e6)
    # A line the CPU build records no trip of runs on every trip (the busiest line's).
    loop = issue.LoopShape("k", L4.arch, "HMMA", 64, 500, 300, head="k.cu:3", parts=((None, 20), ("k.cu:7", 480)),
                           marker_parts=(("k.cu:7", 64),))
    assert issue.warp_instructions(loop, t.launches[0], warps=4)[0] == 500 * 32 + 300 * 4
    # HMMA whose lines' trips do not come to the executor's mma.sync count (an unrolled SASS loop
    # would issue twice as many per trip): not given, and why.
    doubled = issue.LoopShape("k", L4.arch, "HMMA", 128, 500, 300, head="k.cu:3", parts=((None, 20), ("k.cu:5", 480)),
                              marker_parts=(("k.cu:5", 128),))
    assert issue.warp_instructions(doubled, t.launches[0], warps=4) is None
    assert "not one trip" in issue.trip_problem(doubled, t.launches[0])


def test_latency_bound_takes_each_warps_stalls_overlapped_or_in_turn():
    """The planted loop of the issue test with the stalls ptxas wrote: 10 cycles for each of the 400
    instructions at the line every trip runs, 1 for the rest. A warp waits 20 x 8 + 400 x 10 x 8 +
    80 x 1 cycles (8 trips, the guarded line on 1), the CTA's four warps alike. With the stalls
    overlapped, an SM overlaps its CTAs as many at a time as it holds: one CTA per SM, or two held
    two at a time, take one CTA's stalls; two where it holds one at a time take twice that. Taken in
    turn, two CTAs on an SM take twice one CTA's stalls however many it holds: the rule for a
    tensor-core loop on sm_90, the architecture whose records chose it, where a CTA's warps fill the
    four schedulers evenly, and for no other loop or architecture."""
    from attnlab.model import issue

    loop = issue.LoopShape("k", L4.arch, "HMMA", 64, 500, 300, head="k.cu:3",
                           parts=((None, 20), ("k.cu:5", 400), ("k.cu:9", 80)), marker_parts=(("k.cu:5", 64),),
                           stall_parts=((None, 20), ("k.cu:5", 4000), ("k.cu:9", 80)))
    hz = bounds.clock_ghz(L4) * 1e9
    per_warp = 20 * 8 + 4000 * 8 + 80 * 1
    assert not bounds.in_turn(loop, L4.arch, 4), "no record of sm_89 has chosen the rule"
    assert bounds.in_turn(loop, H100.arch, 4) and bounds.in_turn(loop, H100.arch, 8)
    assert not bounds.in_turn(loop, H100.arch, 2) and not bounds.in_turn(loop, H100.arch, 6), "uneven schedulers"
    assert not bounds.in_turn(dataclasses.replace(loop, marker="MUFU.EX2"), H100.arch, 4)
    for ctas, resident, overlapped, taken_in_turn in ((L4.sms, 1, per_warp, per_warp),
                                                      (2 * L4.sms, 2, per_warp, 2 * per_warp),
                                                      (L4.sms, 2, per_warp, per_warp),
                                                      (2 * L4.sms, 1, 2 * per_warp, 2 * per_warp)):
        t = _with_trips(_trace(ctas, tensor_flops=2048 * MMA_FLOPS), {"k.cu:5": 32, "k.cu:9": 4})
        assert issue.stall_cycles(loop, t.launches[0]) == pytest.approx(np.full(ctas, 4 * per_warp))
        issued = issue.warp_instructions(loop, t.launches[0], warps=4)
        turned = next(b for b in bounds.bounds_of(t, L4, resident, issue=(issued, loop), turn=True)
                      if b.resource == "latency")
        assert turned.time_us == pytest.approx(taken_in_turn / hz * 1e6), (ctas, resident)
        assert "in turn" in turned.work
        out = bounds.bounds_of(t, L4, resident, issue=(issued, loop))
        got = next(b for b in out if b.resource == "latency")
        assert got.time_us == pytest.approx(overlapped / hz * 1e6), (ctas, resident)
        assert "stalls ptxas wrote" in got.work
        # Here the stalls outlast the tensor cores' work: latency is the bottleneck, and the
        # prediction without it falls back to the next bound.
        p = bounds.Prediction("k", "L4", MISSION, False, out, 1, ctas, resident)
        assert p.bottleneck == "latency" and p.without("latency").bottleneck == "tensor cores"
        assert p.without("latency").time_us < p.time_us and len(p.bounds) == len(out)
    # Three CTAs on an SM that holds two at a time: 3/2 of one CTA's stalls on the busiest SM
    # overlapped, three times them in turn.
    t = _with_trips(_trace(3 * L4.sms, tensor_flops=2048 * MMA_FLOPS), {"k.cu:5": 32, "k.cu:9": 4})
    issued = issue.warp_instructions(loop, t.launches[0], warps=4)
    got = {turn: next(b for b in bounds.bounds_of(t, L4, 2, issue=(issued, loop), turn=turn)
                      if b.resource == "latency").time_us for turn in (False, True)}
    assert got[False] == pytest.approx(1.5 * per_warp / hz * 1e6) and got[True] == pytest.approx(3 * per_warp / hz * 1e6)
    # On sm_90 the tensor-core loop's stalls are taken in turn unasked; a loop that is not the
    # tensor cores' (MUFU.EX2, chapters 1 to 3) keeps them overlapped: two CTAs held two at a time
    # take one CTA's.
    hz = bounds.clock_ghz(H100) * 1e9
    for marker, want, words in (("HMMA", 2 * per_warp, "in turn"), ("MUFU.EX2", per_warp, "2 CTAs of an SM at a time")):
        hopper = dataclasses.replace(loop, arch=H100.arch, marker=marker)
        t = _with_trips(_trace(2 * H100.sms, tensor_flops=2048 * MMA_FLOPS), {"k.cu:5": 32, "k.cu:9": 4})
        issued = issue.warp_instructions(hopper, t.launches[0], warps=4)
        got = next(b for b in bounds.bounds_of(t, H100, 2, issue=(issued, hopper)) if b.resource == "latency")
        assert got.time_us == pytest.approx(want / hz * 1e6) and words in got.work, marker


def test_issue_bound_is_not_given_where_the_sass_hides_the_trip_counts():
    from attnlab.model import issue

    t = _with_trips(_trace(L4.sms, tensor_flops=1 << 20), {"k.cu:5": 32})
    loop = issue.LoopShape("k", L4.arch, "HMMA", 64, 500, 300, why_not="2 loops hold HMMA", head="k.cu:3",
                           parts=((None, 500),))
    assert issue.warp_instructions(loop, t.launches[0], 4) is None
    out = bounds.bounds_of(t, L4, 1, issue=(None, loop))
    missing = next(b for b in out if b.resource == "instruction issue")
    assert not missing.given and "2 loops hold HMMA" in missing.work
    latency = next(b for b in out if b.resource == "latency")
    assert not latency.given and "2 loops hold HMMA" in latency.work
    p = bounds.Prediction("k", "L4", MISSION, False, out, 1, L4.sms, 1)
    assert p.top.given and p.bottleneck != "instruction issue"
    # nor where the executor counted no trips of the loop the SASS names
    other = issue.LoopShape("k", L4.arch, "HMMA", 64, 500, 300, head="k.cu:40", parts=((None, 500),))
    assert issue.warp_instructions(other, t.launches[0], 4) is None


def _line_of(text: str, file: str = "07_mma_swizzle.cu", occurrence: int | None = None) -> str:
    """"file:line" of the one line of a kernel source that holds `text` (or of its `occurrence`-th
    such line, counting from 0)."""
    from attnlab.paths import kernels_dir

    found = [i + 1 for i, line in enumerate((kernels_dir() / file).read_text().splitlines()) if text in line]
    if occurrence is not None:
        return f"{file}:{found[occurrence]}"
    assert len(found) == 1, (text, found)
    return f"{file}:{found[0]}"


def test_issue_of_the_last_chapter_reads_its_key_tile_loop_from_the_sass():
    """07_mma's sm_89 loop: HMMA.16816 x 64 (Q K^T and P V of a 16 x 64 tile at D = 64), one loop,
    nothing nested, closed by the branch of its `for` over key tiles; every instruction of it is
    placed, and the bound is given."""
    from attnlab.model import issue

    loop = issue.loop_shape("07_mma", "sm_89", "attn_fwd_07_mma_d64")
    assert loop.why_not is None and loop.marker == "HMMA" and loop.markers_per_trip == 64
    assert loop.inside > 64 and loop.outside > 0
    assert loop.head == _line_of("for (int j = tile0; j < tile1; ++j)")
    assert sum(n for _, n in loop.parts) == loop.inside and loop.every_trip < loop.inside // 10
    assert sum(n for _, n in loop.marker_parts) == 64
    p = bounds.predict("07_mma", MISSION, False, "L4")
    b = next(b for b in p.bounds if b.resource == "instruction issue")
    assert b.given and f"{loop.inside} in the key-tile loop" in b.work


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kernel, arch", [("07_mma", "sm_89"), ("07_mma_two_row_blocks", "sm_90")])
def test_the_lines_trips_give_back_the_executors_tensor_core_count(kernel, arch, causal):
    """Each HMMA of the loop, issued on the trips its source line ran (the executor's CPU build),
    adds up per CTA to the mma.sync instructions the executor counted: the placing of SASS at source
    lines and the counting of trips agree where a check exists. Causal, warps skip the tiles past
    their rows, so the HMMA lines run on fewer trips than the loop makes."""
    from attnlab.executor.trace import trace
    from attnlab.model import issue

    t = trace(kernel, Shape(1, 2, 320, 64), causal, arch=arch)
    loop = issue.loop_shape(kernel, arch, t.launches[0].entry)
    got = issue.marker_runs(loop, t.launches[0])
    assert got is not None
    assert got == pytest.approx(t.per_cta("tensor_flops") / MMA_FLOPS)
    per_line, trips = issue.line_trips(loop, t.launches[0])
    hmma_lines = [line for line, _ in loop.marker_parts]
    assert all((per_line[line] < trips).any() == causal for line in hmma_lines)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_mma_after_step_7_13s_loop_counts_once_per_warp(causal):
    """Step 7.13 runs the last tile's O += P V after the key-tile loop: the loop's HMMA on their
    lines' trips, and those after it once per warp of every CTA, give back the executor's mma.sync
    count (trip_problem says nothing); the stalls after the loop are counted apart, and step 7.13's
    code there holds a warp longer than step 7.12's, which has no HMMA outside its loop."""
    from attnlab.executor.trace import trace
    from attnlab.model import issue

    t = trace("07_mma_deferred_pv", Shape(1, 2, 512, 64), causal, arch="sm_90", sms=8)  # no split
    launch = t.launches[0]
    loop = issue.loop_shape("07_mma_deferred_pv", "sm_90", launch.entry)
    assert launch.entry == "attn_fwd_07_mma_deferred_pv_d64" and loop.why_not is None
    assert loop.markers_outside == (64 // 16) * (64 // 8)  # one 64-key tile's O += P V at D = 64
    assert issue.trip_problem(loop, launch) is None
    in_loop = issue.marker_runs(loop, launch)
    assert in_loop + loop.markers_outside * 4 == pytest.approx(t.per_cta("tensor_flops") / MMA_FLOPS)
    before = issue.loop_shape("07_mma_whole_tiles", "sm_90", "attn_fwd_07_mma_whole_tiles_d64")
    assert before.markers_outside == 0 and 0 < before.stalls_outside < loop.stalls_outside


def test_the_code_outside_the_loop_adds_its_stalls_on_every_warp_only_when_asked():
    """stall_cycles leaves the code outside the key-tile loop out unless asked; asked, each CTA adds
    stalls_outside once per warp, and predict's latency bound (its text too) grows with it while
    the instruction count and every other bound stay as they were."""
    from attnlab.executor.trace import trace
    from attnlab.model import issue

    t = trace("07_mma_whole_tiles", Shape(1, 2, 512, 64), False, arch="sm_90", sms=8)
    launch = t.launches[0]
    loop = issue.loop_shape("07_mma_whole_tiles", "sm_90", launch.entry)
    alone, with_outside = issue.stall_cycles(loop, launch), issue.stall_cycles(loop, launch, outside=True)
    assert loop.stalls_outside > 0 and (with_outside - alone == loop.stalls_outside * 4).all()
    base = bounds.predict("07_mma_whole_tiles", MISSION, False, "H100 SXM")
    more = bounds.predict("07_mma_whole_tiles", MISSION, False, "H100 SXM", outside=True)
    by = {b.resource: b for b in base.bounds}
    assert {b.resource: b.time_us for b in more.bounds if b.resource != "latency"} == {
        r: b.time_us for r, b in by.items() if r != "latency"}
    latency = next(b for b in more.bounds if b.resource == "latency")
    assert latency.time_us > by["latency"].time_us and "code outside it" in latency.work and "outside" not in by["latency"].work


def test_the_copy_runs_on_all_but_the_last_stages_trips_and_q_on_the_first():
    """Step 7.8 on sm_90 (3 stages) at L = 512, 64-key tiles: 8 trips per warp (causal: as many as
    the CTA's diagonal needs). The copy of the next tile (under `if (next < tile1)`) runs on all
    but 2 of them, Q's fragments (under `if (j == tile0)`)
    on 1, the mask (under `if (need_mask)`) on none without causality and on the diagonal tile with it."""
    from attnlab.executor.trace import trace
    from attnlab.model import issue

    loop = issue.loop_shape("07_mma_two_row_blocks", "sm_90", "attn_fwd_07_mma_two_row_blocks_d64")
    warps = 4
    for causal, masked in ((False, 0), (True, 1)):
        t = trace("07_mma_two_row_blocks", Shape(1, 2, 512, 64), causal, arch="sm_90", sms=8)  # 8 CTAs fill 8 SMs: no split
        assert t.launches[0].entry == loop.entry
        per_line, trips = issue.line_trips(loop, t.launches[0])
        # causal: a CTA's key tiles end at its diagonal, 8 for the last query tile down to 1
        tiles = trips // warps
        assert (trips % warps == 0).all() and tiles.max() == 8 and (tiles.min() == 8 or causal)
        guard = _line_of("if (next < tile1) {  // so its stage")
        assert (per_line[guard] == trips).all()  # the test itself runs on every trip
        # the copy of K: of the source's lines that copy it, the one this entry's loop runs (not the
        # lean loop's, which this entry does not build)
        copies_of_k = {_line_of("load_tile<D, BLOCK_N, SWIZZLE>(k_tile(next_stage), k,", occurrence=i) for i in range(3)}
        (copy_k,) = copies_of_k & set(per_line)
        assert (per_line[copy_k] == np.maximum(tiles - 2, 0) * warps).all()
        assert (per_line[_line_of("attn::ldsm_x4(q_frag[mb][ks]")] == warps).all()
        assert (per_line[_line_of("s[mb][nb][e] = ATTN_NEG_INF;")] == masked * warps).all()


@pytest.mark.parametrize("step", STEPS_07, ids=lambda s: s.number)
def test_every_steps_q_fragments_are_counted_once_per_warp(step):
    """Q's A operands are read from the tile once, on each warp's first trip (`if (j == tile0)`).
    In every step's loop on sm_90 the instructions the SASS places on that ldmatrix's line run on
    one trip per warp of each CTA: a helper or lambda around the load would place them on a line
    of its own, which the executor counts elsewhere (and every prediction would rise)."""
    from attnlab.executor.trace import trace
    from attnlab.model import issue

    launch = trace(step.kernel_id, Shape(1, 2, 512, 64), False, arch="sm_90", sms=8).launches[0]
    loop = issue.loop_shape(step.kernel_id, "sm_90", launch.entry)
    q_line = _line_of("attn::ldsm_x4(q_frag[mb][ks]")
    assert dict(loop.parts).get(q_line, 0) > 0, f"no instruction of {launch.entry}'s loop placed at Q's load"
    per_line, trips = issue.line_trips(loop, launch)
    warps = launch.block[0] * launch.block[1] * launch.block[2] // 32
    assert (trips > 0).all() and (per_line[q_line] == warps).all()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("step", STEPS_07, ids=lambda s: s.number)
def test_every_steps_predicated_instructions_run_on_their_anchors_trips(step, head_dim, causal):
    """A predicated instruction issues whenever the instruction before it does, its predicate true or
    not; the model counts it on the trips the executor ran its line. In every step's sm_90 loop, at
    both head dims and either mask, each predicated line runs on at least the trips of its anchors
    (issue.predicated_anchors) in each CTA. A test ptxas turns into predicates and the host compiler
    keeps as a branch would have its instructions counted on too few trips and the step predicted
    too fast: a draft of two row blocks at D = 128 with O += P V a tile later looked 4% faster than
    step 7.13 on the H100 from 64 XORs a trip counted on none."""
    from attnlab.executor.trace import trace
    from attnlab.model import issue

    launch = trace(step.kernel_id, Shape(1, 2, 512, head_dim), causal, arch="sm_90", sms=8).launches[0]
    loop = issue.loop_shape(step.kernel_id, "sm_90", launch.entry)
    per_line, trips = issue.line_trips(loop, launch)
    short = {line: anchors for line, anchors in issue.predicated_anchors(step.kernel_id, "sm_90", launch.entry).items()
             if line in per_line and any((per_line[line] < per_line.get(a, trips)).any() for a in anchors)}
    assert not short, f"{launch.entry}: predicated lines run on fewer trips than their anchors: {short}"


def test_the_anchor_of_a_predicated_flip_is_the_load_it_follows():
    """The guard above, on the kind of loop it exists for: the ablation 07_mma_two_rows_at_d128 flips
    the sign of Q's fragments at every k-step of its two-row entry under `if (scale < 0.f)`, which
    ptxas predicates at D = 128; its XORs follow Q's ldmatrix, with nothing that branches between."""
    from attnlab.model import issue

    anchors = issue.predicated_anchors("07_mma_two_rows_at_d128", "sm_90", "attn_fwd_07_mma_q_from_tile_d128")
    flip = _line_of("for (int r = 0; r < 4; ++r) qf[mb][r] ^= 0x80008000u;")
    assert flip in anchors and anchors[flip] - {flip}, anchors


def test_a_line_the_host_compiler_splits_by_stage_runs_on_every_trip():
    """Step 7.6 on sm_89 has two stages; the host compiler builds parts of the loop twice, one copy
    per stage, each running on every other trip. A line runs on a trip when either copy ran: the
    lines the body runs unconditionally come to the loop's trips, causal or not. The test of the
    first trip (`j == tile0`) the host compiler may fold into the loop's entry, which counts no
    line: that line may miss the first trip of each warp, no more."""
    from attnlab.executor.trace import trace
    from attnlab.model import issue

    loop = issue.loop_shape("07_mma", "sm_89", "attn_fwd_07_mma_d64")
    every = [_line_of("attn::cp_async_commit();  // possibly empty: the wait at tile j + 1"),
             _line_of("const int k0 = j * BLOCK_N + key0;")]
    first = _line_of("if (j == tile0) {")
    assert all(line in dict(loop.parts) for line in every + [first])
    warps = 4
    for causal in (False, True):
        t = trace("07_mma", Shape(1, 2, 512, 64), causal, arch="sm_89", sms=8)
        assert t.launches[0].entry == loop.entry
        per_line, trips = issue.line_trips(loop, t.launches[0])
        assert trips.max() == 8 * warps
        for line in every:  # a line the CPU build records no trip of runs on every trip (the model's rule)
            assert (per_line.get(line, trips) == trips).all(), line
        got = per_line.get(first, trips)
        assert (trips - warps <= got).all() and (got <= trips).all()


def test_the_model_refuses_counts_of_a_run_that_did_not_complete(monkeypatch):
    """A count run stopped by its time limit holds part of the launch's counts: every bound would come
    out too small, so counted() raises instead of predicting from them."""
    stopped = Trace("07_mma", MISSION, False, None, [], completed=False)
    monkeypatch.setattr(bounds, "trace", lambda *a, **k: stopped)
    monkeypatch.setattr(bounds, "trace_one_head", lambda *a, **k: stopped)
    with pytest.raises(RuntimeError, match="did not complete"):
        bounds.counted("07_mma", MISSION, False, by_key("L4"))
