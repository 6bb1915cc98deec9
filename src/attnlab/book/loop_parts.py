"""Where a chapter-7 step's key-tile loop spends its instructions: the loop's SASS split into parts
by the source lines they come from, each part weighed by the trips the CPU executor ran its lines on
(attnlab.model.issue, the time model's instruction-issue bound), with the cycles the stalls ptxas
wrote into those instructions hold a warp (attnlab.kernels.sass_control). Instructions and stalls
in the binary and trips run are measurements; none of them is a time.

    loop_parts("07_mma_lean_loop", Shape(4, 16, 4096, 64), False, "H100 SXM",
               {"copy": ("load_tile<", "load_whole_tile<")})
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..gpus import by_key
from ..model import bounds, issue
from ..paths import kernels_dir
from ..shapes import Shape

REST = "the rest of the loop"


@dataclass(frozen=True)
class Part:
    name: str
    in_loop: int     # SASS instructions of the loop body placed at the part's source lines
    issued: float    # warp instructions the part issues per CTA (all its warps, every trip), on average
    stalled: float = 0.0  # the cycles those instructions' stalls hold their warps, per CTA, likewise

    @property
    def stall_per_instruction(self) -> float:
        """Cycles a warp waits past each of the part's instructions (its stall less the issue cycle)."""
        return self.stalled / self.issued - 1 if self.issued else 0.0


def _text(line: str) -> str:
    """The source text of "file:line"."""
    file, number = line.rsplit(":", 1)
    return (kernels_dir() / file.split("/")[-1]).read_text().splitlines()[int(number) - 1]


def _measured(kernel: str, shape: Shape, causal: bool, gpu: str):
    """(the loop's shape, its lines' trips per CTA, the loop's trips per CTA) for the launch; a
    ValueError where the time model gives no issue bound for it (issue.LoopShape.why_not)."""
    spec_gpu = by_key(gpu)
    t = bounds.counted(kernel, shape, causal, spec_gpu)
    issued, loop = bounds.warp_instructions(t, kernel, spec_gpu)
    if issued is None:
        raise ValueError(f"{kernel} at {shape.label()} on the {gpu}: {loop.why_not}")
    return (loop, *issue.line_trips(loop, t.launches[0]))


def line_ran(kernel: str, shape: Shape, causal: bool, gpu: str, text: str) -> float:
    """Of the loop's warp-trips, the share on which its first line (in the source) containing `text` ran."""
    loop, per_line, trips = _measured(kernel, shape, causal, gpu)
    lines = [line for line, _ in loop.parts if line is not None and text in _text(line)]
    if not lines:
        raise ValueError(f"no line of {kernel}'s key-tile loop contains {text!r}")
    line = min(lines, key=lambda x: int(x.rsplit(":", 1)[1]))
    return float(per_line.get(line, trips).sum() / trips.sum())


def loop_parts(kernel: str, shape: Shape, causal: bool, gpu: str, parts: dict[str, tuple[str, ...]]) -> list[Part]:
    """The key-tile loop of the entry `kernel` launches at `shape` on `gpu` (a key of gpus.GPUS), cut
    into `parts` (name -> texts: a source line inside the loop that contains one of them belongs
    to that part, the first that matches) and REST, with the launch's counts on the CPU executor.
    A ValueError where the time model gives no issue bound for the launch (issue.LoopShape.why_not)."""
    loop, per_line, trips = _measured(kernel, shape, causal, gpu)

    def part_of(line: str | None) -> str:
        text = "" if line is None else _text(line)
        return next((name for name, marks in parts.items() if any(m in text for m in marks)), REST)

    return weigh(loop.parts, per_line, trips, part_of, (*parts, REST), loop.stall_parts)


def weigh(loop_lines, per_line: dict[str, np.ndarray], trips: np.ndarray, part_of, names,
          stall_lines=()) -> list[Part]:
    """The parts `names` of a loop whose body places `loop_lines` ((line, instructions) pairs) as
    part_of(line) says: each line's instructions issued on the trips its line ran per CTA
    (`per_line`; a line without a count, or None, on every trip: `trips`), averaged over the CTAs;
    `stall_lines` ((line, stall cycles) pairs) weighed the same way."""
    def on_trips(pairs, name) -> tuple[int, float]:
        lines = [(line, n) for line, n in pairs if part_of(line) == name]
        weighed = sum((n * per_line.get(line, trips) for line, n in lines), np.zeros(len(trips)))
        return sum(n for _, n in lines), float(np.mean(weighed))

    return [Part(name, *on_trips(loop_lines, name), on_trips(stall_lines, name)[1]) for name in names]
