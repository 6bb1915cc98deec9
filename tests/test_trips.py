"""Where loops are, in a kernel's source and in its two builds: the `for` statements the executor
counts trips of (attnlab.executor.trips), and the source lines nvdisasm gives each SASS
instruction (attnlab.kernels.sass_lines). The time model's issue bound weighs each instruction of a
key-tile loop by these (attnlab.model.issue)."""
from __future__ import annotations

from attnlab.executor.trips import for_statements
from attnlab.kernels.sass_lines import parse

SOURCE = """\
__global__ void k(int n) {
    for (int j = 0; j < n; ++j) {       // 2: a body in braces, "}" in a comment: {
        const char* s = "for (;;) {";
#pragma unroll
        for (int a = 0; a < 2; ++a)     // 6: no braces, a for inside
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                if (a) x(); else { y(); }
            }
        /* for (int c = 0; c < 9; ++c) { */
        if (j) z();
    }
    for (int i = 0; i < n; ++i) w(i);   // 13: one statement
    do { for (int d = 0; d < 2; ++d) v(); } while (n--);
}
"""


def test_each_for_statement_spans_its_line_to_the_end_of_its_body():
    assert for_statements(SOURCE) == ((2, 12), (5, 9), (7, 9), (13, 13), (14, 14))


LISTING = """\
.text.kern:
\t//## File "/a/k.cu", line 40 inlined at "/a/k.cu", line 90
\t//## File "/a/k.cu", line 90
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
\t//## File "/a/h.cuh", line 7 inlined at "/a/k.cu", line 41
\t//## File "/a/k.cu", line 41 inlined at "/a/k.cu", line 90
\t//## File "/a/k.cu", line 90
        /*0020*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
.text.other:
        /*0000*/                   EXIT ;
"""


def test_nvdisasm_frames_are_read_innermost_first_and_carry_to_the_next_instruction():
    got = parse(LISTING)
    assert got["kern"] == {0x0: (("k.cu", 40), ("k.cu", 90)), 0x10: (("k.cu", 40), ("k.cu", 90)),
                           0x20: (("h.cuh", 7), ("k.cu", 41), ("k.cu", 90))}
    assert got["other"] == {0x0: ()}


def test_a_saved_trace_keeps_its_trip_counts(tmp_path):
    """The counts cache (attnlab.executor.trace) writes the trips and the blocks they belong to, and
    reads back the same: a model run from the cache weighs the loop as a fresh run does."""
    from attnlab.executor.trace import _load, _save, trace
    from attnlab.shapes import Shape

    t = trace("07_mma", Shape(1, 1, 128, 64), True, arch="sm_89", cache=False)
    launch = t.launches[0]
    assert launch.trip_runs is not None and launch.trip_runs.shape == (len(launch.blocks), len(launch.trip_blocks.pairs))
    assert launch.trip_runs.any()
    _save(tmp_path / "t.npz", t)
    back = _load(tmp_path / "t.npz").launches[0]
    assert back.trip_blocks == launch.trip_blocks
    assert (back.trip_runs == launch.trip_runs).all()
