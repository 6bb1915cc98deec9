"""The timed ring schedule of chapter 6's warp-specialized kernel: when each key tile is copied and
consumed under its FULL/EMPTY hand-off, for given copy and math times, and the timeline figure.
Pure Python and matplotlib: a latency model, not a measurement.
"""
from __future__ import annotations

from typing import NamedTuple


class RingSpan(NamedTuple):
    """One bar of the ring timeline. lane "copy": the tile's cp.async group in flight (issued by the
    producers) into ring stage `stage`; lane "math": the consumers working on the tile."""
    lane: str
    tile: int
    stage: int
    start: float
    end: float


def ring_protocol(stages: int, n_tiles: int) -> tuple[list[tuple], list[tuple]]:
    """The hand-off of kernels/06_warp_specialized.cu as each role runs it, in program order: the
    producers' ("sync", EMPTY id), ("copy", stage, tile), ("commit", group), ("wait", LAG) and
    ("arrive", FULL id), and the consumers' ("sync", FULL id), ("read", stage) and ("arrive", EMPTY
    id). FULL[s] is named barrier 1 + s, EMPTY[s] 1 + STAGES + s; a tile's group is its step.
    ring_schedule times this order; the executor's trace of the kernel shows it (a test holds the two
    equal)."""
    lag = stages - 1
    producer: list[tuple] = []
    for t in range(n_tiles + lag):
        if t < n_tiles:
            if t >= stages:
                producer.append(("sync", 1 + stages + t % stages))
            producer.append(("copy", t % stages, t))
        producer.append(("commit", t))
        if t >= lag:
            producer += [("wait", lag), ("arrive", 1 + (t - lag) % stages)]
    consumer: list[tuple] = []
    for t in range(n_tiles):
        consumer += [("sync", 1 + t % stages), ("read", t % stages)]
        if t + stages < n_tiles:
            consumer.append(("arrive", 1 + stages + t % stages))
    return producer, consumer


def ring_schedule(stages: int, n_tiles: int, copy_time: float, math_time: float,
                  issue_time: float = 0.0) -> list[RingSpan]:
    """When each key tile is copied and consumed under the hand-off of kernels/06_warp_specialized.cu,
    if one tile's copy takes `copy_time` from issue to landing, the consumers' math on a tile takes
    `math_time`, and issuing a tile's copies keeps the producers busy for `issue_time`.

    The producers follow produce() step by step: step t waits on EMPTY for tile t - STAGES (the
    consumers' release), issues tile t, then waits for tile t - LAG (LAG = STAGES - 1) to land and
    arrives on its FULL barrier. The consumers follow the compute loop: wait on FULL for tile t,
    compute, release the stage. Copies in flight do not slow each other (a latency model: no
    bandwidth limit), and the producer warps act as one. Asserts the two safety rules the CPU
    simulation in tests/test_model_05_06.py checks under every interleaving: a tile is consumed only
    after it landed, a stage is refilled only after the consumers released it."""
    if stages < 1 or n_tiles < 0 or min(copy_time, math_time, issue_time) < 0:
        raise ValueError("stages >= 1, n_tiles >= 0 and non-negative times")
    lag = stages - 1
    land: dict[int, float] = {}
    full: dict[int, float] = {}
    released: dict[int, float] = {}
    spans: list[RingSpan] = []
    producer = consumer = 0.0
    next_tile = 0

    def consume_through(last: int) -> None:
        nonlocal consumer, next_tile
        while next_tile <= last:
            t = next_tile
            start = max(consumer, full[t])                       # bar.sync FULL[t % STAGES]
            assert start >= land[t], f"tile {t} consumed before it landed"
            consumer = start + math_time
            spans.append(RingSpan("math", t, t % stages, start, consumer))
            released[t] = consumer                               # bar.arrive EMPTY[t % STAGES]
            next_tile += 1

    for t in range(n_tiles + lag):
        if t < n_tiles:
            if t >= stages:
                consume_through(t - stages)
                producer = max(producer, released[t - stages])   # bar.sync EMPTY[t % STAGES]
            start = producer
            producer += issue_time                               # the cp.async instructions
            land[t] = start + max(copy_time, issue_time)
            spans.append(RingSpan("copy", t, t % stages, start, land[t]))
        if t >= lag:                                             # cp.async.wait_group LAG
            producer = max(producer, land[t - lag])
            full[t - lag] = producer                             # bar.arrive FULL
    consume_through(n_tiles - 1)
    for s in spans:
        if s.lane == "copy" and s.tile >= stages:
            assert s.start >= released[s.tile - stages], f"stage {s.stage} refilled before release"
    return spans


def ring_makespan(spans: list[RingSpan]) -> float:
    """The time the consumers finish the last tile of a ring_schedule."""
    return max((s.end for s in spans if s.lane == "math"), default=0.0)


def ring_timeline_figure(rows: list[tuple[str, list[RingSpan]]], unit: str = "one tile's math"):
    """One panel per (title, ring_schedule(...)): a row per ring stage with the copies in flight into
    it, and a row with the consumers' math, each bar labelled with its key tile, on a common axis."""
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab10").colors
    heights = [1 + max((s.stage for s in spans), default=0) + 1 for _, spans in rows]
    fig, axes = plt.subplots(len(rows), 1, figsize=(9, 0.42 * sum(heights) + 0.55 * len(rows) + 0.6),
                             sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights})
    for ax, (title, spans), n_rows in zip(axes[:, 0], rows, heights):
        for s in spans:
            y = 0 if s.lane == "math" else 1 + s.stage
            ax.barh(y, s.end - s.start, left=s.start, height=0.62, color=colors[s.tile % 10],
                    edgecolor="black", lw=0.5, alpha=0.95 if s.lane == "math" else 0.4,
                    hatch=None if s.lane == "math" else "//")
            ax.text((s.start + s.end) / 2, y, str(s.tile), ha="center", va="center", fontsize=7)
        end = ring_makespan(spans)
        ax.axvline(end, color="black", lw=0.8, ls=":")
        ax.set_yticks(range(n_rows), ["consumers: math"] + [f"stage {k}: copy" for k in range(n_rows - 1)],
                      fontsize=7)
        ax.set_ylim(-0.6, n_rows - 0.4)
        ax.set_title(f"{title}: last tile done at {end:.2f}", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel(f"time, in units of {unit} (hatched: a copy in flight; label and colour: key tile)")
    fig.tight_layout()
    return fig
