"""The CPU executor's self-tests: a fault of every kind it promises to find is planted in a small
kernel (tests/executor/faults.cu) and must be reported, with its kind and source line; each
clean twin must report nothing. Then ldmatrix (x4, .trans) and mma.sync m16n8k16 are checked lane
by lane against the PTX ISA's fragment tables, written out here independently of the runtime."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from executor_launch import kinds, launch_arrays

from attnlab.executor.library import load

FAULTS = Path(__file__).parent / "executor"
ENTRIES = ["fault_global_oob", "fault_static_shared_oob", "fault_dynamic_shared_oob", "shared_neighbour",
           "async_copy", "fault_deadlock", "early_return_then_barrier", "fault_barrier_count",
           "fault_divergent_collective", "fault_shuffle_mask", "fault_uninitialized", "probe_ldmatrix", "probe_mma", "probe_half"]


@pytest.fixture(scope="module")
def lib():
    return load("faults.cu", ENTRIES, src_dir=FAULTS)


def run(lib, entry, block, args, smem=0, seed=0):
    """One block of `block` threads (see executor_launch.launch_arrays)."""
    return launch_arrays(lib, entry, (1,), (block,), args, smem, seed)



def test_global_out_of_bounds_is_reported_with_its_line(lib):
    report = run(lib, "fault_global_oob", 64, [np.zeros(64, np.float32), np.zeros(64, np.float32), 64])
    assert kinds(report) == {"global out of bounds"}
    finding = report.findings[0]
    assert finding.warp == 1 and finding.lane == 31
    assert finding.where.startswith("faults.cu:")
    assert "past the end of a 256-byte global buffer" in finding.message


def test_static_shared_out_of_bounds(lib):
    report = run(lib, "fault_static_shared_oob", 64, [np.zeros(64, np.float32), 64])
    assert "shared out of bounds" in kinds(report)
    assert "buf[64]" in report.findings[0].message  # by name and index, past its 64 elements


def test_dynamic_shared_out_of_bounds(lib):
    report = run(lib, "fault_dynamic_shared_oob", 64, [np.zeros(64, np.float32), 64], smem=64 * 4)
    assert kinds(report) == {"shared out of bounds"}
    assert "the launch has 256 bytes" in report.findings[0].message


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_missing_barrier_is_a_race_whatever_the_schedule(lib, seed):
    racy = run(lib, "shared_neighbour", 64, [np.zeros(64, np.float32), 0], seed=seed)
    # Whichever thread ran first, the read is unordered with the neighbour's write; a schedule
    # that runs the reader first also reads a value nobody has written yet.
    assert "race" in kinds(racy) and kinds(racy) <= {"race", "uninitialized shared read"}
    assert any("read after write" in f.message or "write after read" in f.message for f in racy.findings)
    clean = run(lib, "shared_neighbour", 64, [np.zeros(64, np.float32), 1], seed=seed)
    assert clean.clean


def test_reading_cp_async_data_before_its_wait(lib):
    src = np.arange(64, dtype=np.float32)
    out = np.zeros(16, np.float32)
    early = run(lib, "async_copy", 16, [src, out, 0], smem=256)
    assert "cp.async read before wait" in kinds(early)
    assert np.isnan(out).any()  # the destination holds the poison pattern until the wait
    out = np.zeros(16, np.float32)
    clean = run(lib, "async_copy", 16, [src, out, 1], smem=256)
    assert clean.clean
    assert np.array_equal(out, src[4 * ((np.arange(16) + 1) % 16)])


def test_deadlock_says_where_every_warp_waits(lib):
    report = run(lib, "fault_deadlock", 64, [np.zeros(64, np.float32)])
    assert not report.completed
    assert kinds(report) == {"deadlock"}
    assert "warp 1 lanes 0-31 wait at bar.sync 1 at ptx.cuh:" in report.findings[0].message
    assert "< faults.cu:" in report.findings[0].message  # the kernel's line that called it
    assert "0x" not in report.findings[0].message  # source lines, not addresses


def test_barrier_after_some_threads_returned_is_legal(lib):
    # `if (i >= n) return;` before __syncthreads: the exited threads release the barrier (PTX exit).
    out = np.zeros(64, np.float32)
    assert run(lib, "early_return_then_barrier", 64, [out, 32]).clean
    assert (out[:32] == 1).all() and (out[32:] == 0).all()
    assert run(lib, "early_return_then_barrier", 64, [np.zeros(64, np.float32), 64]).clean


def test_named_barrier_count_mismatch(lib):
    report = run(lib, "fault_barrier_count", 64, [np.zeros(64, np.float32)])
    assert "barrier count mismatch" in kinds(report)


def test_divergent_warp_collective(lib):
    report = run(lib, "fault_divergent_collective", 32, [np.zeros(32, np.float32)])
    assert not report.completed
    assert kinds(report) == {"divergent warp collective"}


def test_shuffle_mask_that_does_not_name_the_caller(lib):
    report = run(lib, "fault_shuffle_mask", 32, [np.zeros(32, np.float32)])
    assert "warp collective mask" in kinds(report)


def test_uninitialized_shared_read(lib):
    report = run(lib, "fault_uninitialized", 64, [np.zeros(64, np.float32)])
    assert kinds(report) == {"uninitialized shared read"}


# ---- lane tables (PTX ISA 9.7.14.5.15 ldmatrix, 9.7.14.5.8 mma.m16n8k16) -------------------------

def halves(words: np.ndarray) -> np.ndarray:
    return words.view(np.uint16)


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_x4_lane_by_lane(lib, trans):
    # 4 matrices of 8 rows x 8 halves; element (m, r, c) holds the number m*64 + r*8 + c.
    tile = np.arange(256, dtype=np.uint16)
    out = np.zeros(128, np.uint32)
    report = run(lib, "probe_ldmatrix", 32, [tile.view(np.uint32).copy(), out, int(trans)], smem=512)
    assert report.clean
    got = halves(out).reshape(32, 4, 2)  # lane, register, (low, high)
    for lane in range(32):
        for m in range(4):
            if not trans:  # row lane/4, elements 2(lane%4), 2(lane%4)+1
                want = [m * 64 + (lane // 4) * 8 + 2 * (lane % 4) + e for e in (0, 1)]
            else:  # (row 2(lane%4) + e, column lane/4)
                want = [m * 64 + (2 * (lane % 4) + e) * 8 + lane // 4 for e in (0, 1)]
            assert list(got[lane, m]) == want, (lane, m)


def test_mma_m16n8k16_lane_by_lane(lib):
    rng = np.random.default_rng(0)
    A = rng.integers(-4, 5, (16, 16)).astype(np.float16)  # small integers: every sum exact
    B = rng.integers(-4, 5, (16, 8)).astype(np.float16)
    C = rng.integers(-8, 9, (16, 8)).astype(np.float32)
    a_regs = np.zeros((32, 4, 2), np.float16)
    b_regs = np.zeros((32, 2, 2), np.float16)
    c_regs = np.zeros((32, 4), np.float32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(8):  # a_i: rows g (i in 0,1,4,5) or g+8; columns 2t + (i & 1), +8 for i >= 4
            row = g + (8 if i in (2, 3, 6, 7) else 0)
            col = 2 * t + (i & 1) + (8 if i >= 4 else 0)
            a_regs[lane, i // 2, i % 2] = A[row, col]
        for i in range(4):  # b_i: k = 2t + (i & 1), +8 for i >= 2; n = g
            b_regs[lane, i // 2, i % 2] = B[2 * t + (i & 1) + (8 if i >= 2 else 0), g]
        for i in range(4):  # c_i: row g (i < 2) or g+8, column 2t + (i & 1)
            c_regs[lane, i] = C[g + (8 if i >= 2 else 0), 2 * t + (i & 1)]
    d = np.zeros((32, 4), np.float32)
    report = run(lib, "probe_mma", 32, [a_regs.view(np.uint32).reshape(-1).copy(),
                                        b_regs.view(np.uint32).reshape(-1).copy(), c_regs.reshape(-1).copy(),
                                        d.reshape(-1)])
    assert report.clean
    want = A.astype(np.float32) @ B.astype(np.float32) + C
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(4):
            assert d.reshape(32, 4)[lane, i] == want[g + (8 if i >= 2 else 0), 2 * t + (i & 1)], (lane, i)


def test_fp16_conversion_is_round_to_nearest_even(lib):
    """__float2half and __half2float against numpy's IEEE binary16 (round to nearest even) over
    normal, subnormal, halfway, overflowing and special values, and a million random floats."""
    special = [0.0, -0.0, 1.0, -2.5, 65504.0, 65519.99, 65520.0, 1e6, 1e-8, 2.0 ** -24, 2.0 ** -25,
               3 * 2.0 ** -26, 2.0 ** -14, 6.1e-5, 1.0009765625, 1.00048828125, 1.00146484375,
               float("inf"), -float("inf")]
    rng = np.random.default_rng(1)
    values = np.concatenate([np.array(special, np.float32),
                             (rng.standard_normal(1 << 20) * np.exp2(rng.integers(-30, 18, 1 << 20))).astype(np.float32)])
    h = np.zeros(len(values), np.uint16)
    back = np.zeros(len(values), np.float32)
    report = run(lib, "probe_half", 256, [values, h, back, len(values)])
    assert report.clean
    with np.errstate(over="ignore"):  # overflowing to inf is among the cases checked
        expected = values.astype(np.float16)
    assert np.array_equal(h, expected.view(np.uint16))
    assert np.array_equal(back, expected.astype(np.float32))
    nan = np.zeros(1, np.uint16)
    run(lib, "probe_half", 32, [np.array([np.nan], np.float32), nan, np.zeros(1, np.float32), 1])
    assert np.isnan(nan.view(np.float16)[0])
