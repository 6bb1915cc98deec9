"""The schedule ptxas writes into every SASS instruction (sm_70 and later), read from cuobjdump's listing.

Each instruction is 128 bits, printed by cuobjdump as two 64-bit words; bits 105-125 (the top 21
bits of the second word but two) hold its control code (Jia et al., "Dissecting the NVIDIA Volta GPU
Architecture via Microbenchmarking", 2018, section 2.2; the same layout on Turing, Ampere, Ada and
Hopper):

    bits 105-108  stall    cycles the warp waits before it may issue its next instruction
    bit  109      yield    a hint to let another warp issue
    bits 110-112  write    the scoreboard (0-5, 7: none) this variable-latency result sets
    bits 113-115  read     the scoreboard released once its source registers are read
    bits 116-121  wait     the scoreboards (a mask) that must clear before it issues
    bits 122-125  reuse    operand-reuse cache flags

Fixed-latency dependencies (an FFMA's result read four cycles on) are the compiler's to keep: it
sets the stall so that the consumer issues no sooner. A warp therefore spends at least the sum of
its instructions' stalls on a path, whatever else the SM does; variable-latency results (shared
memory, `ex2`, global memory) add scoreboard waits on top, which the binary does not bound.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_FUNCTION = re.compile(r"Function : (\S+)")
# "/*0a40*/   HMMA.16816.F32 R4, R8, R12, R4 ;   /* 0x000000080c04723c */" then "/* 0x004fde0000001804 */"
_FIRST = re.compile(r"/\*([0-9a-f]{4,})\*/\s+[@A-Z].*;\s*/\*\s*0x[0-9a-f]{16}\s*\*/")
_SECOND = re.compile(r"^\s*/\*\s*(0x[0-9a-f]{16})\s*\*/\s*$")


@dataclass(frozen=True)
class Control:
    """One instruction's control code."""
    stall: int
    yield_: bool
    write: int | None   # scoreboard set by a variable-latency result, None where none
    read: int | None
    wait: int           # mask of the scoreboards waited on
    reuse: int

    @property
    def cycles(self) -> int:
        """The cycles this instruction holds its warp: its stall, at least the one it issues in."""
        return max(self.stall, 1)


def decode(second_word: int) -> Control:
    """The control code in the second 64-bit word of an instruction (its bits 64-127)."""
    c = second_word >> 41  # instruction bit 105
    write, read = (c >> 5) & 7, (c >> 8) & 7
    return Control(stall=c & 15, yield_=bool((c >> 4) & 1), write=None if write == 7 else write,
                   read=None if read == 7 else read, wait=(c >> 11) & 63, reuse=(c >> 17) & 15)


def controls(sass: str) -> dict[str, dict[int, Control]]:
    """Per function of a cuobjdump -sass listing, offset -> control code of each instruction."""
    out: dict[str, dict[int, Control]] = {}
    table: dict[int, Control] | None = None
    pending: int | None = None  # the offset whose second word comes on the next line
    for line in sass.splitlines():
        if m := _FUNCTION.search(line):
            table, pending = out.setdefault(m.group(1), {}), None
        elif table is None:
            continue
        elif m := _FIRST.search(line):
            pending = int(m.group(1), 16)
        elif pending is not None and (m := _SECOND.match(line)):
            table[pending] = decode(int(m.group(1), 16))
            pending = None
    return out
