"""Where a kernel's instructions sit relative to its main loop, from cuobjdump's SASS listing.

attnlab.kernels.static counts a function's instructions in the binary; this module splits those counts
into the key-tile loop and the rest. The loop is found from the branches alone: every backward
branch (a `BRA` whose target lies before it) closes a loop, from its target to itself, and the main
loop is the one that holds the most tensor-core instructions (`HMMA`). Offsets and registers move
between toolkits; which instructions fall inside that range does not, unless the compiler
restructures the loop, which a test then reports.
"""
from __future__ import annotations

import re
from collections import Counter

from .static import _PREDICATE, function_opcodes, main_path, opcode, sass_listing

# BRA, BRA.U, BRA.DIV ...: an optional predicate operand (`BRA P2, 0x...`, `BRA ~URZ, 0x...`), then
# the absolute target.
_BRANCH = re.compile(r"^BRA(?:\.[A-Z]+)*\s+(?:[!~]?U?[PR][TZ0-9]*\s*,\s*)?(0x[0-9a-f]+)")


def listing(sass: str, function: str) -> list[tuple[int, str]]:
    """(offset, instruction) of one function of a cuobjdump listing, in program order, the
    instruction with its predicate and operands (e.g. "@P0 BRA P2, 0x1d40")."""
    lines = sass_listing(sass).get(function)
    if not lines:
        raise KeyError(f"no function {function!r} in the listing")
    return lines


def branch_target(instruction: str) -> int | None:
    """The offset a branch instruction jumps to (its predicate aside), or None for any other."""
    m = _BRANCH.match(_PREDICATE.sub("", instruction))
    return int(m.group(1), 16) if m else None


def loops(lines: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(first, last) offsets of each loop: a backward branch at `last` to `first`."""
    return [(target, offset) for offset, instruction in lines
            if (target := branch_target(instruction)) is not None and target <= offset]


def main_loop(lines: list[tuple[int, str]], marker: str = "HMMA") -> tuple[int, int]:
    """The loop holding the most `marker` instructions (the key-tile loop of an attention kernel:
    its matrix products); a loop nested in it holds fewer, one around it as many and is longer,
    so among those with the most the shortest is taken."""
    def count(loop):
        return sum(1 for off, ins in lines if loop[0] <= off <= loop[1] and opcode(ins).startswith(marker))

    candidates = loops(lines)
    if not candidates:
        raise ValueError("no backward branch: the function has no loop")
    best = max(count(loop) for loop in candidates)
    if best == 0:
        raise ValueError(f"no loop holds a {marker} instruction")
    return min((loop for loop in candidates if count(loop) == best), key=lambda loop: loop[1] - loop[0])


def loop_body(lines: list[tuple[int, str]], loop: tuple[int, int]) -> list[tuple[int, str]]:
    """(offset, instruction) of `loop` on the path a converged warp runs (static.main_path: up to
    the last EXIT), without never-executed padding (@!PT)."""
    kept = lines[:len(main_path([ins for _, ins in lines]))]  # main_path cuts the list at its last EXIT
    return [(off, ins) for off, ins in kept if loop[0] <= off <= loop[1] and not ins.startswith("@!PT ")]


def outside_loop(lines: list[tuple[int, str]], loop: tuple[int, int]) -> list[tuple[int, str]]:
    """(offset, instruction) outside `loop` on the path a converged warp runs, without
    never-executed padding (@!PT): loop_body's complement."""
    kept = lines[:len(main_path([ins for _, ins in lines]))]
    return [(off, ins) for off, ins in kept if not loop[0] <= off <= loop[1] and not ins.startswith("@!PT ")]


def inside_and_outside(lines: list[tuple[int, str]], loop: tuple[int, int]) -> tuple[Counter, Counter]:
    """Opcode counts inside `loop` (loop_body) and outside it (outside_loop)."""
    return (function_opcodes([ins for _, ins in loop_body(lines, loop)]),
            function_opcodes([ins for _, ins in outside_loop(lines, loop)]))


def loop_split(sass: str, function: str, marker: str = "HMMA") -> tuple[Counter, Counter]:
    """Opcode counts of `function` inside its main loop (the one with the most `marker`
    instructions) and outside it, on the path a converged warp runs."""
    lines = listing(sass, function)
    return inside_and_outside(lines, main_loop(lines, marker))
