"""attnlab.kernels.sass_control: the control codes ptxas writes into each SASS instruction, decoded
from cuobjdump's second word, and read back as a schedule that holds together on a real build."""
from __future__ import annotations

import pytest

from attnlab.kernels import sass_control

# Three instructions of an sm_90 build of chapter 7 (cuobjdump -sass, nvcc 12.x-13.x): S2R sets
# scoreboard 1 (a variable-latency read of a special register), the VIADD that reads its result
# waits on that scoreboard with operand reuse, and an IMAD waits on scoreboard 2.
LISTING = """
	code for sm_90
		Function : first
	.headerflags	@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                          /* 0x00000a00ff017b82 */
                                                                                   /* 0x000fe20000000800 */
        /*0010*/                   S2R R12, SR_TID.X ;                             /* 0x00000000000c7919 */
                                                                                   /* 0x000e6e0000002100 */
		..........


		Function : second
	.headerflags	@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   VIADD R0, R12.reuse, 0x80 ;                     /* 0x000000800c007836 */
                                                                                   /* 0x042fe40000000000 */
        /*0010*/              @P0  IMAD.U32 R5, RZ, RZ, UR5 ;                      /* 0x00000005ff057e24 */
                                                                                   /* 0x004fe2000f8e00ff */
"""


def test_decode_reads_each_field_at_its_bits():
    assert sass_control.decode(0x000E6E0000002100) == sass_control.Control(
        stall=7, yield_=True, write=1, read=None, wait=0, reuse=0)
    viadd = sass_control.decode(0x042FE40000000000)
    assert (viadd.stall, viadd.write, viadd.wait, viadd.reuse) == (2, None, 0b000010, 0b0001)
    imad = sass_control.decode(0x004FE2000F8E00FF)
    assert (imad.stall, imad.wait) == (1, 0b000100)
    # The low 41 bits of the word are the instruction's own (operands, opcode): no field reads them.
    assert sass_control.decode(0x004FE2000F8E00FF & ~((1 << 41) - 1)) == imad


@pytest.mark.parametrize("stall, yield_, write, read, wait, reuse", [
    (13, 1, 5, 3, 0b101101, 0b1010), (0, 0, 0, 0, 0b111111, 0b1111), (15, 1, 7, 7, 0b100000, 0b0100)])
def test_decode_round_trips_every_field_at_its_width(stall, yield_, write, read, wait, reuse):
    """A control code built field by field (bits 105-125 of the instruction) decodes to the same
    fields, with scoreboard 7 read as none; the low bits (the instruction's own) set to ones."""
    code = stall | yield_ << 4 | write << 5 | read << 8 | wait << 11 | reuse << 17
    got = sass_control.decode(code << 41 | ((1 << 41) - 1))
    assert got == sass_control.Control(stall, bool(yield_), None if write == 7 else write,
                                       None if read == 7 else read, wait, reuse)


def test_cycles_are_the_stall_and_never_less_than_the_issue_cycle():
    assert sass_control.decode(0x000E6E0000002100).cycles == 7
    assert sass_control.decode(0).cycles == 1  # stall 0: still the cycle it issues in


def test_controls_splits_the_listing_by_function_and_offset():
    got = sass_control.controls(LISTING)
    assert set(got) == {"first", "second"}
    assert sorted(got["first"]) == [0x0, 0x10] and sorted(got["second"]) == [0x0, 0x10]
    assert got["first"][0x10].write == 1 and got["second"][0x0].wait == 0b10
    assert got["second"][0x10].wait == 0b100  # a predicated instruction is read too


@pytest.mark.parametrize("arch", ["sm_89", "sm_90"])
def test_a_real_build_waits_only_on_scoreboards_it_set(arch):
    """Every instruction of chapter 7's D = 64 entry has a control code, and each scoreboard an
    instruction waits on was set (by a result or a source read) by an instruction of the function:
    a layout read at the wrong bits would wait on scoreboards nothing sets."""
    from attnlab.kernels import registry
    from attnlab.kernels.static import build, sass_listing

    spec = registry.get("07_mma", arch)
    sass = build(spec, arch).sass
    entry = "attn_fwd_07_mma_d64"
    offsets = [off for off, _ in sass_listing(sass)[entry]]
    control = sass_control.controls(sass)[entry]
    assert sorted(control) == sorted(offsets)
    # In program order, the first wait on each scoreboard comes after an instruction that sets it.
    first_set, first_wait = {}, {}
    for off in sorted(control):
        c = control[off]
        for b in range(6):
            if c.wait >> b & 1:
                first_wait.setdefault(b, off)
        for b in (c.write, c.read):
            if b is not None:
                first_set.setdefault(b, off)
    assert first_wait and all(b in first_set and first_set[b] < off for b, off in first_wait.items())
    # Most instructions hold their warp a cycle or two; some (a result needed right after) far longer.
    stalls = [c.stall for c in control.values()]
    assert sum(s <= 2 for s in stalls) > len(stalls) / 2 and max(stalls) >= 8
    # The tensor-core instructions' results are fixed-latency: ptxas schedules them by stalls alone.
    hmma = [control[off] for off, ins in sass_listing(sass)[entry] if ins.split()[0].startswith("HMMA")]
    assert hmma and all(c.write is None for c in hmma)
