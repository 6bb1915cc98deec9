"""The helpers chapters 5 and 6 draw on (attnlab.book: ring, kernel_view): the timed ring schedule,
the named-barrier reader, the variant-sweep ratios and the record search that needs every kernel
of a sweep."""
import pytest

from attnlab.book import kernel_view, measured, page, ring


@pytest.mark.parametrize("stages", [1, 2, 3])
@pytest.mark.parametrize("copy", [0.0, 0.25, 1.0, 3.0])
@pytest.mark.parametrize("n_tiles", [0, 1, 2, 5, 8])
def test_ring_schedule_follows_the_protocol(stages, copy, n_tiles):
    spans = ring.ring_schedule(stages, n_tiles, copy_time=copy, math_time=1.0)
    copies = {s.tile: s for s in spans if s.lane == "copy"}
    maths = {s.tile: s for s in spans if s.lane == "math"}
    assert sorted(copies) == sorted(maths) == list(range(n_tiles))
    for t in range(n_tiles):
        assert maths[t].start >= copies[t].end                      # consumed after it landed
        assert copies[t].stage == maths[t].stage == t % stages
        if t >= stages:
            assert copies[t].start >= maths[t - stages].end         # refilled after release
        if t:
            assert maths[t].start >= maths[t - 1].end               # the consumers work in order
    if n_tiles and stages == 1:
        assert ring.ring_makespan(spans) == pytest.approx(n_tiles * (copy + 1.0))


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("copy", [0.25, 1.0, 3.0])
def test_ring_schedule_steady_state(stages, copy):
    """Each added tile costs max(math, (copy + math) / STAGES) once the ring is full."""
    per_tile = max(1.0, (copy + 1.0) / stages)
    a = ring.ring_makespan(ring.ring_schedule(stages, 60, copy, 1.0))
    b = ring.ring_makespan(ring.ring_schedule(stages, 120, copy, 1.0))
    assert (b - a) / 60 == pytest.approx(per_tile)  # 60 tiles: whole periods of 2 and 3


def test_ring_schedule_rejects_nonsense():
    with pytest.raises(ValueError):
        ring.ring_schedule(0, 4, 1.0, 1.0)
    with pytest.raises(ValueError):
        ring.ring_schedule(2, 4, -1.0, 1.0)


def test_ring_timeline_figure_has_a_panel_per_schedule():
    rows = [(f"{s} stages", ring.ring_schedule(s, 4, 0.5, 1.0)) for s in (1, 2, 3)]
    fig = ring.ring_timeline_figure(rows)
    assert len(fig.axes) == 3


def test_named_barriers_reads_ids_and_counts():
    lines = ["/*07b0*/ BAR.SYNC.DEFER_BLOCKING 0x1, 0xa0 ;", "/*3550*/ @!P0 BAR.ARV 0x3, 0xa0 ;",
             "/*0100*/ BAR.SYNC.DEFER_BLOCKING 0x0 ;", "/*0200*/ LDGSTS.E.BYPASS.128 [R12], [R30.64], !P1 ;"]
    assert kernel_view.named_barriers(lines) == [("SYNC", 1, 160), ("ARV", 3, 160), ("SYNC", 0, None)]


def _sweep_record():
    from synthetic import synthetic_record, timing

    rec = synthetic_record(shapes=[(1, 8, L, 64) for L in (256, 512)])
    for case in rec["cases"]:
        case["kernels"] = {"base": {"device": timing(100.0)}, "fast": {"device": timing(50.0)}}
    return rec


def test_sweep_ratios_and_figure(scratch_repository):
    from synthetic import timing

    rec = _sweep_record()
    ratios = measured.sweep_ratios(rec, ["fast", "missing"], "base")
    assert list(ratios) == ["fast"]
    assert [(L, r) for L, r, _ in ratios["fast"]] == [(256, 2.0), (512, 2.0)]
    t = timing(100.0)
    assert all(n == pytest.approx((t["p90_us"] - t["p10_us"]) / 2 / t["median_us"]) for _, _, n in ratios["fast"])
    assert len(measured.sweep_ratio_figure(rec, ["fast"], "base").axes) == 1
    with pytest.raises(KeyError):
        measured.sweep_ratio_figure(rec, ["fast"], "nobody")


def test_bench_covering_needs_every_kernel(results, monkeypatch):
    from synthetic import synthetic_record

    from attnlab.records.results import write_record
    from attnlab.shapes import Shape

    monkeypatch.setattr(page, "has_gpu", lambda: False)
    shapes = [Shape(1, 8, 512, 64)]
    only_one = synthetic_record(kernel="05_wmma")
    write_record(only_one, results)
    assert page.bench_covering(["05_wmma", "06_ws_s1_p1"], shapes) is None
    both = synthetic_record(kernel="05_wmma", created="2026-01-03T00:00:00Z", also=["06_ws_s1_p1"])
    write_record(both, results)
    found = page.bench_covering(["05_wmma", "06_ws_s1_p1"], shapes)
    assert found is not None and found["created_utc"] == "2026-01-03T00:00:00Z"


@pytest.mark.parametrize("kernel,stages,producers", [("06_ws_s1_p1", 1, 1), ("06_warp_specialized", 2, 1),
                                                     ("06_ws_s3_p1", 3, 1), ("06_ws_s2_p2", 2, 2)])
def test_the_ring_model_is_the_order_the_executor_ran(kernel, stages, producers):
    """The hand model (ring.ring_protocol, which ring_schedule times) against the trace of the real
    kernel: every producer warp and a consumer warp of a CTA with six key tiles (L = 333, 64-key
    tiles) run exactly the protocol's barriers, copies, commits, waits and stage reads, in order."""
    from attnlab.book import executor_view
    from attnlab.executor.trace import trace
    from attnlab.shapes import Shape

    t = trace(kernel, Shape(1, 1, 333, 64), False)
    assert len(executor_view.stage_regions(t)) == stages
    producer, consumer = ring.ring_protocol(stages, 6)
    warps = t.launches[0].block[0] // 32
    for warp in range(warps - producers, warps):
        assert executor_view.ring_ops(t, warp) == producer
    assert executor_view.ring_ops(t, 0) == consumer
    # and ring_schedule puts each tile in the protocol's stage, consumed in the protocol's order
    spans = ring.ring_schedule(stages, 6, copy_time=1.0, math_time=1.0)
    assert [(s.stage, s.tile) for s in spans if s.lane == "copy"] == [op[1:] for op in producer if op[0] == "copy"]
    assert [s.stage for s in sorted((s for s in spans if s.lane == "math"), key=lambda s: s.start)] == \
        [op[1] for op in consumer if op[0] == "read"]


def test_a_planted_protocol_differs_from_the_trace():
    """The comparison can fail: one stage fewer, or a consumer that releases the last tiles too."""
    from attnlab.book import executor_view
    from attnlab.executor.trace import trace
    from attnlab.shapes import Shape

    t = trace("06_warp_specialized", Shape(1, 1, 333, 64), False)
    assert executor_view.ring_ops(t, 4) != ring.ring_protocol(1, 6)[0]
    released_all = [op for k in range(6) for op in (("sync", 1 + k % 2), ("read", k % 2), ("arrive", 3 + k % 2))]
    assert executor_view.ring_ops(t, 0) != released_all
