"""The CPU executor's warp-collective operations (runtime/warp.cpp), on the kernels of
tests/executor/warps.cu: every shuffle mode and width, votes, match, reduce and __activemask
against models written here from the CUDA C++ Programming Guide's and the PTX ISA's text;
several collectives in flight in one warp (half-warps under their own masks, nested masks)
under every scheduler seed; exited lanes, which a collective does not wait for but a shuffle
must not read; and a faulty twin of each rule, reported with its exact kind."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from executor_launch import kinds, launch_arrays

from attnlab.executor.library import load

KERNELS = Path(__file__).parent / "executor"
ENTRIES = ["shuffle_probe", "warp_sum_down", "scan_up", "shuffle_64", "votes", "active_after_exit", "active_in_branches", "match_32",
           "match_64", "reduces", "mixed_qualifiers", "vote_foreign_mask", "half_warps", "nested_masks",
           "crossed_masks", "broadcast_after_exit", "butterfly_after_exit", "mma_after_exit"]
FULL = 0xFFFFFFFF
SEEDS = [0, 1, 2, 3]
LANES = np.arange(32)


@pytest.fixture(scope="module")
def lib():
    return load("warps.cu", ENTRIES, src_dir=KERNELS)


def run(lib, entry, args, block=32, seed=0):
    """One block (see executor_launch.launch_arrays)."""
    return launch_arrays(lib, entry, (1,), (block,), args, seed=seed)



def bits(lanes) -> int:
    return sum(1 << int(lane) for lane in lanes)


def lanes_of(mask: int) -> list[int]:
    return [lane for lane in range(32) if mask >> lane & 1]


# ---- shuffles (CUDA C++ Programming Guide, "Warp Shuffle Functions") ------------------------------

def shuffle_source(lane: int, mode: int, arg: int, width: int) -> int:
    """The lane whose value `lane` gets, in the guide's terms: the warp is cut into groups of
    `width` lanes; idx reads lane arg % width of the own group; up and down read within the own
    group, else the own value; xor may read an earlier group, not a later one."""
    group = lane // width * width
    if mode == 1:
        return group + arg % width
    if mode == 2:
        return lane + arg if lane % width + arg < width else lane
    if mode == 3:
        return lane - arg if lane % width >= arg else lane
    src = lane ^ arg
    return src if src // width <= lane // width else lane


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
@pytest.mark.parametrize("width", [1, 2, 4, 8, 16, 32])
def test_shuffle_modes_honour_width(lib, mode, width):
    values = (LANES * 1000 + 7).astype(np.uint32)
    for arg in [0, 1, 3, 5, 8, 16, 31]:
        out = np.zeros(32, np.uint32)
        report = run(lib, "shuffle_probe", [values, out, mode, arg, width])
        assert report.clean, (arg, report.findings)
        want = [values[shuffle_source(lane, mode, arg, width)] for lane in range(32)]
        assert list(out) == want, (mode, arg, width)


@pytest.mark.parametrize("width", [2, 4, 8, 16, 32])
def test_warp_sum_by_shfl_down_within_width(lib, width):
    values = np.arange(1, 33, dtype=np.float32) * 3  # integers: every sum exact
    out = np.zeros(32, np.float32)
    assert run(lib, "warp_sum_down", [values, out, width]).clean
    sums = values.reshape(-1, width).sum(axis=1)
    assert np.array_equal(out[::width], sums)  # each group's first lane holds its group's sum


def test_shuffle_width_not_a_power_of_two(lib):
    report = run(lib, "warp_sum_down", [np.ones(32, np.float32), np.zeros(32, np.float32), 12])
    assert kinds(report) == {"shuffle width"}
    assert "shuffle width 12 is not a power of two" in report.findings[0].message


@pytest.mark.parametrize("width", [4, 16, 32])
def test_inclusive_scan_by_shfl_up(lib, width):
    values = np.random.default_rng(width).integers(-50, 50, 32).astype(np.int32)
    out = np.zeros(32, np.int32)
    assert run(lib, "scan_up", [values, out, width]).clean
    assert np.array_equal(out, np.cumsum(values.reshape(-1, width), axis=1).reshape(-1))


def test_64_bit_shuffles_are_exact(lib):
    rng = np.random.default_rng(3)
    d = rng.standard_normal(32) * 1e200  # needs every bit of both words
    i = rng.integers(-2 ** 62, 2 ** 62, 32, dtype=np.int64)
    u = rng.integers(0, 2 ** 64 - 1, 32, dtype=np.uint64, endpoint=True)
    d_out, i_out, u_out = np.zeros(32), np.zeros(32, np.int64), np.zeros(32, np.uint64)
    assert run(lib, "shuffle_64", [d, i, u, d_out, i_out, u_out]).clean
    assert np.array_equal(d_out.view(np.uint64), d[(LANES + 1) % 32].view(np.uint64))
    assert np.array_equal(i_out, i[LANES ^ 1])
    assert np.array_equal(u_out, u[np.where(LANES + 3 < 32, LANES + 3, LANES)])


# ---- votes, __activemask, match, reduce -------------------------------------------------------------

@pytest.mark.parametrize("mask", [FULL, 0x0F0F0F0F, 0x80000001])
@pytest.mark.parametrize("case", ["random", "all", "none"])
def test_votes(lib, mask, case):
    pred = {"random": np.random.default_rng(mask & 0xFF).integers(0, 3, 32),
            "all": np.full(32, 5), "none": np.zeros(32, int)}[case].astype(np.int32)
    out = np.full((32, 5), 0xDEAD, np.uint32)
    assert run(lib, "votes", [pred, out, mask]).clean
    members = lanes_of(mask)
    ballot = bits(lane for lane in members if pred[lane])  # PTX ISA 9.7.13.9: lanes outside the mask give 0
    for lane in range(32):
        if lane not in members:
            assert list(out[lane]) == [0xDEAD] * 5
            continue
        # __activemask inside the branch: its lanes, the mask's (the others wait at __syncwarp).
        assert list(out[lane]) == [mask, ballot, int(ballot != 0), int(ballot == mask), int(ballot in (0, mask))]


def test_votes_in_a_partial_warp(lib):
    """blockDim 20: lanes 20-31 do not exist, so a full mask names only lanes 0-19."""
    pred = (LANES % 2).astype(np.int32)
    out = np.zeros((32, 5), np.uint32)
    assert run(lib, "votes", [pred, out, FULL], block=20).clean
    for lane in range(20):
        assert list(out[lane]) == [0xFFFFF, bits(range(1, 20, 2)), 1, 0, 0]


@pytest.mark.parametrize("n", [1, 7, 20, 32])
def test_activemask_after_lanes_exit(lib, n):
    out = np.zeros((32, 2), np.uint32)
    assert run(lib, "active_after_exit", [out, n]).clean
    active = (1 << n) - 1
    for lane in range(n):
        assert list(out[lane]) == [active, bits(x for x in range(n) if x % 3 == 0)]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("split, n", [(16, 20), (1, 32), (32, 7)])
def test_activemask_answers_the_lanes_of_one_arm(lib, seed, split, n):
    """A GPU converges at most the lanes of one arm of a branch: never a lane of the other arm, nor
    one that has returned. The early-exit reduction built on it sums exactly the lanes below n."""
    out = np.zeros(96, np.uint32)
    report = run(lib, "active_in_branches", [out, split, n], seed=seed)
    assert report.clean, [f.line() for f in report.findings]
    below, above = (1 << split) - 1, FULL & ~((1 << split) - 1)
    assert list(out[:split]) == [below] * split
    assert list(out[32 + split:64]) == [above] * (32 - split)
    assert out[64] == n * (n + 1) // 2


@pytest.mark.parametrize("mask", [FULL, 0x00FF00FF])
@pytest.mark.parametrize("values", ["groups", "equal", "random"])
def test_match_32(lib, mask, values):
    vals = {"groups": LANES // 4, "equal": np.full(32, 9), "random": np.random.default_rng(1).integers(0, 5, 32)}[
        values].astype(np.uint32)
    any_out, all_out, pred = np.zeros(32, np.uint32), np.zeros(32, np.uint32), np.zeros(32, np.int32)
    assert run(lib, "match_32", [vals, any_out, all_out, pred, mask]).clean
    members = lanes_of(mask)
    uniform = len({int(vals[m]) for m in members}) == 1
    for lane in members:
        assert any_out[lane] == bits(m for m in members if vals[m] == vals[lane])
        assert all_out[lane] == (mask if uniform else 0)
        assert pred[lane] == int(uniform)


def test_match_64_compares_both_words(lib):
    vals = ((LANES % 2).astype(np.uint64) << np.uint64(32)) | np.uint64(7)  # equal low words
    any_out, all_out, pred = np.zeros(32, np.uint32), np.zeros(32, np.uint32), np.zeros(32, np.int32)
    assert run(lib, "match_64", [vals, any_out, all_out, pred]).clean
    assert list(any_out) == [0xAAAAAAAA if lane % 2 else 0x55555555 for lane in range(32)]
    assert not all_out.any() and not pred.any()
    same = np.full(32, 2 ** 40 + 5, np.uint64)
    assert run(lib, "match_64", [same, any_out, all_out, pred]).clean
    assert (any_out == FULL).all() and (all_out == FULL).all() and (pred == 1).all()


@pytest.mark.parametrize("mask", [FULL, 0x00FF00FF, 0x00000001])
def test_reduce(lib, mask):
    vals = np.random.default_rng(mask & 0xFFFF).integers(-1000, 1000, 32).astype(np.int32)
    out = np.zeros((32, 9), np.uint32)
    assert run(lib, "reduces", [vals, out, mask]).clean
    m = vals[lanes_of(mask)]
    u = m.view(np.uint32).astype(np.uint64)
    want = [int(u.sum()) % 2 ** 32, int(u.min()), int(u.max()),  # .u32: add truncated to 32 bits
            int(m.astype(np.int64).sum()) % 2 ** 32, int(m.min()) % 2 ** 32, int(m.max()) % 2 ** 32,
            int(np.bitwise_and.reduce(m.view(np.uint32))), int(np.bitwise_or.reduce(m.view(np.uint32))),
            int(np.bitwise_xor.reduce(m.view(np.uint32)))]
    for lane in lanes_of(mask):
        assert list(out[lane]) == want, lane


@pytest.mark.parametrize("which,names", [(0, ("shfl.sync.bfly", "shfl.sync.down")),
                                         (1, ("redux.sync.add.u32", "redux.sync.min.u32")),
                                         (2, ("vote.sync.ballot", "vote.sync.any")),
                                         (3, ("match.any.sync.b32", "match.all.sync.b32"))])
def test_one_mask_different_qualifiers_is_divergence(lib, which, names):
    """PTX ISA: lanes meet at "the same qualifiers and same membermask"; the warp would hang."""
    report = run(lib, "mixed_qualifiers", [np.zeros(32, np.uint32), which])
    assert not report.completed
    assert kinds(report) == {"divergent warp collective"}
    assert all(name in report.findings[0].message for name in names)


def test_vote_with_a_mask_not_naming_the_caller(lib):
    report = run(lib, "vote_foreign_mask", [np.zeros(32, np.uint32)])
    assert kinds(report) == {"warp collective mask"}
    assert "does not name the calling lane" in report.findings[0].message


# ---- several collectives in flight in one warp ------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_half_warps_under_their_own_masks(lib, seed):
    values = np.random.default_rng(seed).integers(-20, 20, 64).astype(np.float32)
    out, got_bits = np.zeros(64, np.float32), np.zeros(64, np.uint32)
    report = run(lib, "half_warps", [values, out, got_bits], block=64, seed=seed)
    assert report.clean, report.findings
    for warp in range(2):
        lo, hi = values[32 * warp:32 * warp + 16], values[32 * warp + 16:32 * warp + 32]
        assert (out[32 * warp:32 * warp + 16] == lo.sum()).all()
        assert (got_bits[32 * warp:32 * warp + 16] == bits(np.nonzero(lo > 0)[0])).all()
        assert (out[32 * warp + 16:32 * warp + 32] == hi.max()).all()
        assert (got_bits[32 * warp + 16:32 * warp + 32] == (hi > 0).sum()).all()


@pytest.mark.parametrize("seed", SEEDS)
def test_nested_masks_in_any_order(lib, seed):
    values = (LANES * LANES + 1).astype(np.int32)
    out = np.zeros(32, np.int32)
    assert run(lib, "nested_masks", [values, out], seed=seed).clean
    step1 = np.where(LANES < 8, values + values[LANES ^ 4], values)
    want = np.where(LANES < 16, step1 + step1[LANES ^ 8], values + values[LANES ^ 1])
    assert np.array_equal(out, want)


@pytest.mark.parametrize("seed", SEEDS)
def test_overlapping_masks_that_can_never_complete(lib, seed):
    values = LANES.astype(np.int32)
    out = np.zeros(32, np.int32)
    report = run(lib, "crossed_masks", [values, out, 1], seed=seed)
    assert not report.completed  # reported and stopped, not a hang (nor left to the deadlock report)
    assert kinds(report) == {"warp collective mask"}
    message = report.findings[0].message
    assert "(mask 0-23)" in message and "(mask 8-31)" in message and "neither collective can complete" in message
    clean = run(lib, "crossed_masks", [values, out, 0], seed=seed)
    assert clean.clean
    assert np.array_equal(out, values[LANES ^ 1])


@pytest.mark.parametrize("seed", SEEDS)
def test_a_cycle_through_three_masks(lib, seed):
    report = run(lib, "crossed_masks", [LANES.astype(np.int32), np.zeros(32, np.int32), 2], seed=seed)
    assert not report.completed
    assert kinds(report) == {"warp collective mask"}
    message = report.findings[0].message
    assert all(f"(mask {m})" in message for m in ("0-15", "8-23", "0-7,16-23"))
    assert "none of these collectives can complete" in message


# ---- exited lanes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_full_mask_collectives_after_lanes_returned(lib, seed):
    values = np.arange(32, dtype=np.float32) + 0.5
    out, got_bits = np.zeros(32, np.float32), np.zeros(32, np.uint32)
    assert run(lib, "broadcast_after_exit", [values, out, got_bits, 20], seed=seed).clean
    assert (out[:20] == values[0]).all() and not out[20:].any()
    assert (got_bits[:20] == 0xFFFFF).all()


@pytest.mark.parametrize("seed", SEEDS)
def test_butterfly_reading_an_exited_lane(lib, seed):
    values = np.arange(32, dtype=np.float32)
    out = np.zeros(32, np.float32)
    report = run(lib, "butterfly_after_exit", [values, out, 20], seed=seed)
    assert report.completed
    assert kinds(report) == {"warp collective mask"}
    finding = report.findings[0]
    assert finding.lane == 4 and "shuffle reads lane 20, which has exited" in finding.message
    assert finding.where.startswith("warps.cu:")
    assert np.isnan(out[4:16]).all()  # they read 0xffffffff bits: a NaN
    clean = run(lib, "butterfly_after_exit", [values, out, 32], seed=seed)
    assert clean.clean
    assert (out == values.sum()).all()


def test_aligned_collective_after_lanes_returned(lib):
    report = run(lib, "mma_after_exit", [np.zeros(128, np.float32), 24])
    assert not report.completed
    assert kinds(report) == {"warp collective mask"}
    assert "lanes 24-31 have exited" in report.findings[0].message
    out = np.zeros(128, np.float32)
    assert run(lib, "mma_after_exit", [out, 32]).clean
    assert (out == 16).all()  # A and B all ones: every element of D is k = 16
