"""The CPU executor on ordinary CUDA a reader writes (tests/executor/general.cu): every form of
`__shared__` declaration, atomics, fences, printf, byte-sized data, global-memory races inside a
block and conflicts between blocks, a barrier in both arms of a branch, a double bar.arrive, a
write through a pointer to const. Each kernel runs as its correct twin (clean, right results) and
its faulty twin (the finding it must produce, whatever the schedule: seeds 0-3), and findings name
the variable and element and come once per hazard."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from executor_launch import kinds, launch_arrays

from attnlab.executor.library import load

HERE = Path(__file__).parent / "executor"
ENTRIES = ["transpose_tile", "histogram", "atomics_mix", "say_hello", "byte_flags", "half_written", "global_handoff",
           "read_then_other_block_writes", "barrier_in_both_arms", "arrive_twice", "write_const",
           "missing_barrier_everyone", "vector_fields", "ballot_meets_barrier"]
SEEDS = [0, 1, 2, 3]


@pytest.fixture(scope="module")
def lib():
    return load("general.cu", ENTRIES, src_dir=HERE)


def run(lib, entry, grid, block, args, seed=0, names=None):
    """See executor_launch.launch_arrays."""
    return launch_arrays(lib, entry, grid, block, args, seed=seed, names=names)



@pytest.mark.parametrize("seed", SEEDS)
def test_shared_declarations_of_every_form(lib, seed):
    src = np.arange(32 * 32, dtype=np.float32)
    out = np.zeros(32 * 32, np.float32)
    report = run(lib, "transpose_tile", (1,), (32, 32), [src, out, 0], seed)
    assert report.clean, [f.line() for f in report.findings]
    assert np.array_equal(out, 2 * src.reshape(32, 32).T.ravel())
    racy = run(lib, "transpose_tile", (1,), (32, 32), [src, np.zeros_like(out), 1], seed)
    # The reader may run before or after the writer: a race either way, named by its element.
    assert "race" in kinds(racy), [f.line() for f in racy.findings]
    assert all("tile[3][17]" in f.message for f in racy.findings)


@pytest.mark.parametrize("seed", SEEDS)
def test_atomics_on_shared_and_global_memory(lib, seed):
    values = np.random.default_rng(seed).integers(0, 1000, 1000).astype(np.int32)
    bins = np.zeros(16, np.uint32)
    report = run(lib, "histogram", (4,), (64,), [values, len(values), bins, 0], seed)
    assert report.clean, [f.line() for f in report.findings]
    assert np.array_equal(bins, np.bincount(values & 15, minlength=16))
    plain_shared = run(lib, "histogram", (4,), (64,), [values, len(values), np.zeros(16, np.uint32), 1], seed)
    assert kinds(plain_shared) == {"race"}
    assert "local[" in plain_shared.findings[0].message
    plain_global = run(lib, "histogram", (4,), (64,), [values, len(values), np.zeros(16, np.uint32), 2], seed,
                       names={2: "bins"})
    assert kinds(plain_global) == {"global conflict between blocks"}
    assert "bins[" in plain_global.findings[0].message


def test_every_atomic_returns_and_stores_as_cuda_specifies(lib):
    imax, umin = np.array([-5], np.int32), np.array([10**6], np.uint32)
    cas, fsum = np.array([0], np.uint64), np.array([0], np.float32)
    ixor, wrap = np.array([0], np.int32), np.array([0], np.uint32)
    report = run(lib, "atomics_mix", (3,), (32,), [imax, umin, cas, fsum, ixor, wrap])
    assert report.clean, [f.line() for f in report.findings]
    v = np.arange(96)
    assert imax[0] == (v * 7 % 101).max() and umin[0] == 1000 - 95
    assert cas[0] == v.sum() and fsum[0] == 48.0
    assert ixor[0] == np.bitwise_xor.reduce(v) and wrap[0] == 96 % 10


def test_printf_output_comes_back_with_the_launch(lib):
    report = run(lib, "say_hello", (2,), (32,), [7])
    lines = sorted(report.stdout.splitlines())
    assert lines == sorted(f"block {b} thread {t} tag 7" for b in (0, 1) for t in (0, 16))


@pytest.mark.parametrize("seed", SEEDS)
def test_neighbouring_bytes_are_distinct_locations(lib, seed):
    out = np.zeros(64, np.uint8)
    assert run(lib, "byte_flags", (1,), (64,), [out, 0], seed).clean
    assert np.array_equal(out, (np.arange(64) * 3 + 1).astype(np.uint8))
    racy = run(lib, "byte_flags", (1,), (64,), [np.zeros(64, np.uint8), 1], seed)
    assert "race" in kinds(racy)
    assert len([f for f in racy.findings if f.kind == "race"]) <= 2  # one hazard per pair of sites


def test_an_uninitialised_byte_next_to_written_ones(lib):
    out = np.zeros(64, np.uint8)
    assert run(lib, "half_written", (1,), (64,), [out, 0]).clean
    report = run(lib, "half_written", (1,), (64,), [np.zeros(64, np.uint8), 1])
    assert kinds(report) == {"uninitialized shared read"}
    finding = report.findings[0]
    assert finding.bytes == 32 and finding.threads == 32  # the odd bytes, read by the even threads


@pytest.mark.parametrize("seed", SEEDS)
def test_global_race_in_one_block_is_found_whatever_the_order(lib, seed):
    data, out = np.zeros(4, np.float32), np.zeros(1, np.float32)
    assert run(lib, "global_handoff", (1,), (64,), [data, out, 0], seed).clean
    assert out[0] == 42.0
    racy = run(lib, "global_handoff", (1,), (64,), [np.zeros(4, np.float32), np.zeros(1, np.float32), 1], seed,
               names={0: "data"})
    assert kinds(racy) == {"race"}
    assert "data[0]" in racy.findings[0].message


def test_a_write_by_another_block_after_this_blocks_read(lib):
    x = np.zeros(8, np.float32)
    assert run(lib, "read_then_other_block_writes", (3,), (32,), [x, 0]).clean
    report = run(lib, "read_then_other_block_writes", (3,), (32,), [np.zeros(8, np.float32), 1], names={0: "x"})
    assert "global conflict between blocks" in kinds(report)
    finding = next(f for f in report.findings if f.kind == "global conflict between blocks")
    assert "x[0]" in finding.message and "read" in finding.message


def test_syncthreads_in_both_arms_of_a_branch(lib):
    assert run(lib, "barrier_in_both_arms", (1,), (64,), [np.zeros(64, np.float32), 0]).clean
    report = run(lib, "barrier_in_both_arms", (1,), (64,), [np.zeros(64, np.float32), 1])
    assert "divergent barrier" in kinds(report)
    finding = next(f for f in report.findings if f.kind == "divergent barrier")
    assert finding.where != finding.other_where and "general.cu:" in finding.message


def test_a_second_bar_arrive_in_one_phase(lib):
    out = np.zeros(32, np.float32)
    assert run(lib, "arrive_twice", (1,), (64,), [out, 0]).clean
    assert (out == 1).all()
    report = run(lib, "arrive_twice", (1,), (64,), [np.zeros(32, np.float32), 1])
    assert report.completed and kinds(report) == {"barrier arrived twice"}
    assert "wait at" not in report.findings[0].message


def test_a_write_through_a_pointer_to_const(lib):
    src = np.arange(32, dtype=np.float32)
    assert run(lib, "write_const", (1,), (32,), [src.copy(), np.zeros(32, np.float32), 0]).clean
    report = run(lib, "write_const", (1,), (32,), [src.copy(), np.zeros(32, np.float32), 1], names={0: "in"})
    assert kinds(report) == {"write through a pointer to const"}
    assert "in[5]" in report.findings[0].message


@pytest.mark.parametrize("seed", SEEDS)
def test_one_missing_barrier_is_one_line_with_its_bytes_and_threads(lib, seed):
    report = run(lib, "missing_barrier_everyone", (1,), (64,), [np.zeros(64, np.float32)], seed)
    races = [f for f in report.findings if f.kind == "race"]
    # One read site, one write site: at most a read-after-write and a write-after-read hazard,
    # never one line per byte or per thread.
    assert 1 <= len(races) <= 2
    assert sum(f.threads for f in races) >= 32 and all(f.bytes % 4 == 0 for f in races)
    assert all("v[" in f.message for f in races)


def test_vector_loads_are_one_request_each(lib):
    src, out = np.arange(32, dtype=np.float32), np.zeros(32, np.float32)
    report = launch_arrays(lib, "vector_fields", (1,), (32,), [src, out], banks=True)
    assert report.clean
    # Stores: one float4 and two float2 requests; loads: one float4, two float2 (the loop).
    # Each is one warp-wide request, conflict-free: 16-byte accesses in 4 quarter-warp phases and
    # 8-byte ones in 2 half-warp phases.
    assert report.banks["ld/st"].requests == 6
    assert report.banks["ld/st"].wavefronts == report.banks["ld/st"].ideal == 2 * 4 + 4 * 2


def test_a_deadlock_names_each_groups_operation_mask_and_line(lib):
    report = run(lib, "ballot_meets_barrier", (1,), (32,), [np.zeros(32, np.uint32)])
    assert not report.completed and kinds(report) == {"deadlock"}
    message = report.findings[0].message
    assert "lanes 0-15 wait at" in message and "(mask 0-31) at general.cu:" in message
    assert "lanes 16-31 wait at bar.sync 0 at general.cu:" in message


def test_source_lines_hide_the_executors_own_files_from_any_checkout():
    """A library is cached by content, so one built in another checkout (another CI clone sharing
    the cache) names the executor's headers under that checkout's path: they are still plumbing."""
    from attnlab.executor.build import _frames_text

    other = "/elsewhere/clone/src/attnlab/executor"
    frames = [f"{other}/include/attn_cpu/prelude.h:137", f"{other}/runtime/warp.cpp:40",
              "/elsewhere/clone/tests/executor/warps.cu:222", "/elsewhere/clone/kernels/ptx.cuh:96"]
    assert _frames_text(frames) == "warps.cu:222 < ptx.cuh:96"
    assert _frames_text(["/home/reader/my_kernels/prelude.h:3"]) == "prelude.h:3"
