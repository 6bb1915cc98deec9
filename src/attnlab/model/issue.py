"""Warp instructions a CTA issues, from the binary's SASS and the executor's counts: the time model's
instruction-issue bound (attnlab.model.bounds).

The executor runs the CUDA C++ on a CPU and never sees SASS; cuobjdump's listing shows each
instruction once, not how often it runs. The two meet at source lines. The key-tile loop is the
loop of the entry's SASS that holds the most of HMMA (or, with none, MUFU.EX2); its closing
branch names the loop's `for` line (nvdisasm -gi, attnlab.kernels.sass_lines). Each instruction in
the loop is placed at the outermost of its source lines that lies inside that `for` statement's
body: the copy under `if (next < tile1)`, the mask under `if (need_mask)`, Q's fragments under
`if (j == tile0)`. The executor counts, per CTA, on how many trips of the same `for` each
line ran, summed over warps (attnlab.executor.trips): the trips on which any block of the CPU
build holding its code ran, the loop's entry and latch (where the host compiler hoists what the
body computes once) left out. A CTA then issues

    sum over the loop's instructions of the trips their line ran on  +  the rest x warps,

an instruction with no line inside the body (the loop's own test and increment, code hoisted into
it), or at a line whose CPU code the host compiler hoisted, counted on every trip, and every
instruction outside the loop once per warp. The HMMA among them, so counted, must come to the
executor's own count of mma.sync (those outside the loop, such as step 7.13's last O += P V after it,
once per warp): a SASS loop that is not one trip of the source's (unrolled) fails it. That holds where
the loop is the whole of the hot path: no loop inside it (whose trip count the listing does not
give), none around it (whose other instructions it would miss) and no second copy of it (a version
the compiler made for another path, of which the listing does not say which runs). Elsewhere the
issue bound is not given, and says why.

The same trips weigh the stall ptxas wrote into each instruction of the loop
(attnlab.kernels.sass_control): the cycles a warp waits out on its path through the loop, the
model's latency bound (stall_cycles). Outside the loop the listing holds paths that not every warp
takes (a split's merge, a masked row's exit), whose stalls would add up as if each warp ran them
all, so the latency bound leaves them out and stays a bound (stall_cycles's `outside` counts them on
every warp: chapter 7's steps at the mission shape then mostly ran faster than predicted, model.ipynb).

A predicated instruction issues whether its predicate holds or not, so its line must run on the
trips of the instruction before it (predicated_anchors): where the host compiler keeps as a branch
a test that ptxas predicates, the model would count the line on too few trips.
"""
from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..executor.counts import LaunchCounts
from ..executor.trace import MMA_FLOPS
from ..executor.trips import for_statements
from ..kernels import registry, sass_control, sass_lines, sass_loop
from ..kernels.static import build, opcode
from ..paths import kernels_dir

MARKERS = ("HMMA", "MUFU.EX2")


@dataclass(frozen=True)
class LoopShape:
    """The key-tile loop of one entry point's SASS, or why it cannot stand for the hot path."""
    entry: str
    arch: str
    marker: str | None           # HMMA or MUFU.EX2
    markers_per_trip: int        # of the marker in the loop body
    inside: int                  # instructions in the loop body
    outside: int                 # instructions of the entry outside it (on a converged warp's path)
    why_not: str | None = None   # set where the loop is not the whole hot path
    head: str | None = None      # the loop's `for` line, "file:line"
    # (line inside the loop's body, "file:line", or None: every trip; instructions placed there)
    parts: tuple[tuple[str | None, int], ...] = ()
    marker_parts: tuple[tuple[str | None, int], ...] = ()  # the same, of the marker instructions alone
    # The same lines with the cycles their instructions hold a warp (sass_control: each one's stall,
    # at least 1).
    stall_parts: tuple[tuple[str | None, int], ...] = ()
    markers_outside: int = 0     # of the marker outside the loop, on a converged warp's path
    stalls_outside: int = 0      # the cycles the stalls of those instructions outside it hold a warp (sass_control)

    @property
    def every_trip(self) -> int:
        """Instructions of the loop with no line inside its body: issued on every trip."""
        return sum(n for line, n in self.parts if line is None)


def _body_end(file: str, line: int) -> int | None:
    """The last line of the `for` statement at `file`:`line` of the kernel sources, or None."""
    path = kernels_dir() / file
    if not path.is_file():
        return None
    return next((last for first, last in for_statements(path.read_text()) if first == line), None)


def _place(frames, file: str, first: int, last: int) -> str | None:
    """The outermost of an instruction's source lines inside the body first < line <= last."""
    inside = [f"{f}:{n}" for f, n in frames if f == file and first < n <= last]
    return inside[-1] if inside else None


def _body_lines(spec, arch: str, entry: str, loop: tuple[int, int]):
    """(the loop's `for` line, "file:line", named by its closing branch; a function that places an
    offset of the loop's body at a line of that `for` statement's body, _place), each None where the
    listing does not give it (no line at the closing branch; a `for` line no kernel source has)."""
    table = sass_lines.line_table(spec, arch, entry)
    closing = table.get(loop[1], ())
    if not closing:
        return None, None
    file, first = closing[0]
    last = _body_end(file, first)
    if last is None:
        return f"{file}:{first}", None
    return f"{file}:{first}", lambda offset: _place(table.get(offset, ()), file, first, last)


def _sorted(parts: Counter) -> tuple[tuple[str | None, int], ...]:
    return tuple(sorted(parts.items(), key=lambda kv: (kv[0] is not None, kv[0] or "")))


@functools.lru_cache(maxsize=4)
def _controls(kernel: str, arch: str) -> dict:
    """The control codes of every function of `kernel`'s build for `arch` (one parse per build)."""
    return sass_control.controls(build(registry.get(kernel, arch), arch).sass)


@functools.lru_cache(maxsize=None)
def loop_shape(kernel: str, arch: str, entry: str) -> LoopShape:
    """The key-tile loop of `entry` in `kernel`'s build for `arch` (nvcc, cuobjdump and nvdisasm, cached)."""
    spec = registry.get(kernel, arch)
    lines = sass_loop.listing(build(spec, arch).sass, entry)
    for marker in MARKERS:
        try:
            loop = sass_loop.main_loop(lines, marker)
        except ValueError:
            continue
        loops = sass_loop.loops(lines)

        def markers(x):
            return sum(1 for off, ins in lines if x[0] <= off <= x[1] and opcode(ins).startswith(marker))

        inner = [x for x in loops if x != loop and loop[0] <= x[0] and x[1] <= loop[1]]
        outer = [x for x in loops if x != loop and x[0] <= loop[0] and loop[1] <= x[1]]
        versions = [x for x in loops if x != loop and x not in outer and markers(x)]
        ins, out = sass_loop.inside_and_outside(lines, loop)
        why = (f"{len(inner)} loop(s) inside the key-tile loop, whose trip counts the SASS does not give" if inner
               else "the key-tile loop sits inside another loop" if outer
               else f"{1 + len(versions)} loops hold {marker} (the compiler's versions of the key-tile loop), "
                    f"and which of them runs the listing does not say" if versions else None)
        head, place_of = _body_lines(spec, arch, entry, loop)
        if why is None and place_of is None:
            why = (f"the key-tile loop's closing branch comes from {head or 'no source line'}, "
                   f"which is not a `for` statement of the kernel sources")
        parts: Counter = Counter()
        marked: Counter = Counter()
        stalls: Counter = Counter()
        control = _controls(spec.id, arch).get(entry, {})
        if place_of is not None:
            for off, instruction in sass_loop.loop_body(lines, loop):
                place = place_of(off)
                parts[place] += 1
                marked[place] += opcode(instruction).startswith(marker)
                stalls[place] += control[off].cycles
        return LoopShape(entry, arch, marker, markers(loop), sum(ins.values()), sum(out.values()), why, head,
                         _sorted(parts), _sorted(+marked), _sorted(stalls),
                         sum(n for op, n in out.items() if op.startswith(marker)),
                         sum(control[off].cycles for off, _ in sass_loop.outside_loop(lines, loop) if off in control))
    return LoopShape(entry, arch, None, 0, 0, 0, "no loop holds an HMMA or a MUFU.EX2")


def predicated_anchors(kernel: str, arch: str, entry: str) -> dict[str, set[str | None]]:
    """Per line inside the key-tile loop's body (as LoopShape.parts places them) holding predicated
    instructions of `entry`'s loop (branches and never-run padding aside), the lines of their anchors:
    for each, the nearest unpredicated instruction before it, where no branch and no
    branch target lies between them, so that a warp that issues the anchor issues it too, its
    predicate true or not (None: an instruction on no line of the body, issued on every trip). The
    model counts an instruction on the trips the executor ran its line, so a predicated line must run
    on at least its anchors' trips: a test the host compiler keeps as a branch (such as
    `if (scale < 0.f)`) where ptxas predicates its body would have it counted on too few. The flip of
    Q's sign at every k-step of a two-row entry at D = 128 was such a line: ptxas predicated its
    XORs, and the executor ran it on no trip of a positive scale."""
    spec = registry.get(kernel, arch)
    marker = loop_shape(kernel, arch, entry).marker
    if marker is None:
        return {}
    lines = sass_loop.listing(build(spec, arch).sass, entry)
    loop = sass_loop.main_loop(lines, marker)
    _, place_of = _body_lines(spec, arch, entry, loop)
    if place_of is None:
        return {}
    body = sass_loop.loop_body(lines, loop)  # never-run padding (@!PT) left out
    targets = {sass_loop.branch_target(ins) for _, ins in body} - {None}
    out: dict[str, set[str | None]] = {}
    for k, (off, instruction) in enumerate(body):
        line = place_of(off)
        if not instruction.startswith("@") or sass_loop.branch_target(instruction) is not None or line is None \
                or off in targets:  # control may join at it: no anchor
            continue
        for before, other in reversed(body[:k]):
            if sass_loop.branch_target(other) is not None or before + 16 in targets:
                break  # control may leave or join between them: no anchor
            if not other.startswith("@"):
                out.setdefault(line, set()).add(place_of(before))
                break
    return out


def line_trips(shape: LoopShape, launch: LaunchCounts) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
    """Per line inside the loop's body, per CTA, on how many trips of the loop its warps ran it
    (summed over warps), and per CTA the trips themselves (its busiest line's); None where the
    executor did not count trips of that loop, or counted another entry than the SASS read. A
    line whose CPU code lies only in the loop's entry or latch (hoisted: computed once) has no
    count, and runs on every trip."""
    blocks = launch.trip_blocks
    if blocks is None or launch.trip_runs is None or launch.entry != shape.entry or shape.head not in blocks.loops:
        return None
    loop = blocks.loops.index(shape.head)
    columns = [p for p, (_, h) in enumerate(blocks.pairs) if h == loop]
    if not columns:
        return None
    runs = launch.trip_runs
    out = {line: runs[:, p] for line, _ in shape.parts
           if line is not None and (p := blocks.pair(line, shape.head)) is not None}
    return out, runs[:, columns].max(axis=1)


def _issued(parts, per_line: dict[str, np.ndarray], trips: np.ndarray) -> np.ndarray:
    """Per CTA, the instructions of `parts` issued: each on the trips its line ran on."""
    out = np.zeros(len(trips))
    for line, n in parts:
        out = out + n * per_line.get(line, trips)
    return out


def marker_runs(shape: LoopShape, launch: LaunchCounts) -> np.ndarray | None:
    """Per CTA, the loop's marker instructions (HMMA, MUFU.EX2) issued by the lines' trips: for HMMA,
    the same number as the executor's tensor-core FLOPs over one mma.sync's where the trips are right."""
    measured = line_trips(shape, launch)
    return None if measured is None else _issued(shape.marker_parts, *measured)


def _warps(launch: LaunchCounts) -> int:
    """Warps in a CTA of `launch` (whole warps: the kernels' blocks are multiples of 32 threads)."""
    return launch.block[0] * launch.block[1] * launch.block[2] // 32


def _problem(shape: LoopShape, launch: LaunchCounts, measured) -> str | None:
    """trip_problem, given line_trips(shape, launch)."""
    if measured is None:
        return (f"the executor counted no trips of the key-tile loop ({shape.head}) for {shape.entry}"
                if launch.entry == shape.entry else f"the counts are {launch.entry}'s, the SASS {shape.entry}'s")
    if shape.marker == "HMMA":
        outside = shape.markers_outside * _warps(launch) * (measured[1] > 0).sum()  # once per warp of each CTA that loops
        got = _issued(shape.marker_parts, *measured).sum() + outside
        want = launch.block_field("tensor_flops").sum() / MMA_FLOPS
        if abs(got - want) > 0.01 * max(want, 1):
            return (f"the loop's HMMA issued on its lines' trips, with those outside it ({got:,.0f}), are not the "
                    f"executor's mma.sync count ({want:,.0f}): the SASS loop is not one trip of the source's")
    return None


def trip_problem(shape: LoopShape, launch: LaunchCounts) -> str | None:
    """Why the executor's trips cannot weigh the loop's SASS for this launch, or None. Where the
    marker is HMMA, the lines' trips must give back the tensor-core instructions the executor
    counted (within 1 %): an unrolled SASS loop, or one the compiler versioned, would not."""
    return _problem(shape, launch, line_trips(shape, launch))


def _on_trips(shape: LoopShape, launch: LaunchCounts, parts) -> np.ndarray | None:
    """Per CTA, `parts` ((line, count) pairs of the loop's body) weighed by the trips each line ran
    on; None where the loop does not stand for the hot path or trip_problem says the executor's
    trips cannot weigh it."""
    if shape.why_not:
        return None
    measured = line_trips(shape, launch)
    if _problem(shape, launch, measured):
        return None
    return _issued(parts, *measured)


def warp_instructions(shape: LoopShape, launch: LaunchCounts, warps: int) -> np.ndarray | None:
    """Per CTA, the warp instructions it issues (None where the loop does not stand for the hot path
    or trip_problem says the executor's trips cannot weigh it). A line the CPU build records no trip
    of (the GPU's compiler made instructions the host compiler needed none for, or hoisted) runs on
    every trip."""
    in_loop = _on_trips(shape, launch, shape.parts)
    return None if in_loop is None else in_loop + shape.outside * warps


def stall_cycles(shape: LoopShape, launch: LaunchCounts, outside: bool = False) -> np.ndarray | None:
    """Per CTA, the cycles its warps spend on the stalls ptxas wrote into the key-tile loop's
    instructions (summed over warps; None where warp_instructions is), each on the trips its line
    ran on. A warp cannot run its path through the loop in fewer cycles than its share of them.
    `outside`: also the stalls of every instruction outside the loop on the converged path, once per
    warp (stalls_outside): the rule the model does not take, since that path holds branches not every
    warp runs (model.ipynb sets it against the records)."""
    in_loop = _on_trips(shape, launch, shape.stall_parts) if shape.stall_parts else None
    if in_loop is None or not outside:
        return in_loop
    return in_loop + shape.stalls_outside * _warps(launch)
