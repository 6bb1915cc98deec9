"""Every registered kernel and variant, run unchanged on the CPU executor: the GPU check's pass
rule against the fp64 reference, and zero findings (races, out-of-bounds, uninitialized or early
reads, deadlocks, barrier and mask misuse), over
  L = 1, 2, 15, 17, 63, 65, 127, 129, 200 and a (2, 3, 130, D) batch; D = 64 and 128 where the kernel
  takes it; causal and not; three seeds (each draws the inputs, the order the executor runs warps
  and lanes in, and its WMMA fragment layouts);
  and lengths past the internal chunk of the kernels whose chunk L = 200 stays inside
  (attnlab.executor.cpu.CPU_LONG_LENGTHS: chapter 4's 256-column warp step, chapter 7's key range per CTA of
  the split across CTAs), with the first seed only: they are there to reach an entry or a turn of
  the ring of K/V stages, which every seed reaches alike, and the longest (L = 984, 8 s a case)
  would take a third of the suite's time with all three.
For chapter 4 that is its row-softmax kernel on the executor between the two GEMMs in torch at
the GPU path's precisions. Chapter 7's kernels run again with the tiles they take on sm_90
(registry.ch07_mma.arch_tiles: 64-key tiles at D = 128, three K/V stages at D = 64 and 128), as
"<id>@sm_90", at each head dim where those differ from the source's. The cases run in a few
processes in parallel; each kernel's verdict is its own test."""
from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import pytest

from attnlab.kernels import registry
from attnlab.executor.cpu import (CPU_LENGTHS, CPU_LONG_LENGTHS, CPU_SCHEDULE_SEEDS, build_libraries, check_case_cpu,
                         cpu_shapes)
from attnlab.shapes import Shape

# The other architecture whose tiles the suite runs, and the head dims where they differ from the source's.
OTHER_ARCH = "sm_90"


def _dims_whose_tiles_differ(kid: str) -> tuple[int, ...]:
    """The head dims where `kid` runs other tiles on OTHER_ARCH, or runs only there: a key tile or a
    number of stages that differs is shared memory that differs (the single-buffer ablation's one
    stage does not)."""
    spec, other = registry.KERNELS[kid], registry.get(kid, OTHER_ARCH)
    shape = lambda D: Shape(1, 1, 4096, D)  # noqa: E731
    return tuple(D for D in sorted(other.head_dims or ()) if not spec.supports_head_dim(D)
                 or other.launch_config(shape(D))["dynamic_smem"] != spec.launch_config(shape(D))["dynamic_smem"])


OTHER_TILES = {kid: dims for kid in registry.KERNELS if (dims := _dims_whose_tiles_differ(kid))}
KERNEL_IDS = [spec.id for spec in registry.select(None)] + [f"{kid}@{OTHER_ARCH}" for kid in OTHER_TILES]


_spec = registry.by_label


def _run_cases(label: str, cases):
    import torch

    torch.set_num_threads(1)
    spec = _spec(label)
    return [check_case_cpu(spec, shape, causal, seed) for shape, causal, seed in cases]


def _work():
    """(kernel label, cases) chunks: one per kernel (and other architecture's tiles), head dim and
    causal flag."""
    chunks = []
    for label in KERNEL_IDS:
        spec = _spec(label)
        dims = OTHER_TILES[spec.id] if "@" in label else sorted({s.D for s in cpu_shapes(spec)})
        long = CPU_LONG_LENGTHS.get(spec.id, ())
        for D in dims:
            for causal in (False, True):
                cases = [(shape, causal, seed) for shape in cpu_shapes(spec) if shape.D == D
                         for seed in (CPU_SCHEDULE_SEEDS[:1] if shape.L in long else CPU_SCHEDULE_SEEDS)]
                chunks.append((label, cases))
    return chunks


@pytest.fixture(scope="module")
def results():
    build_libraries([_spec(label) for label in KERNEL_IDS])  # once, here, before the workers load them
    workers = max(1, min(4, os.cpu_count() or 1))
    by_kernel: dict[str, list] = {k: [] for k in KERNEL_IDS}
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = [(kid, pool.submit(_run_cases, kid, cases)) for kid, cases in _work()]
        for kid, fut in futures:
            by_kernel[kid] += fut.result()
    return by_kernel


def test_the_grid_covers_every_kernel_and_the_issue_shapes():
    ids = {kid for kid, _ in _work()}
    assert ids == set(KERNEL_IDS) and len(registry.KERNELS) == 38
    # every chapter-7 id runs D = 64 and 128 again with sm_90's tiles: 64 keys at D = 128, 3 stages
    assert sorted(OTHER_TILES) == sorted(k for k in registry.KERNELS if k.startswith("07_"))
    one_stage = ("07_mma_single_buffer", "07_mma_longest_first", "07_mma_plain")  # one stage everywhere
    assert all(dims == (64, 128) for kid, dims in OTHER_TILES.items() if kid not in one_stage)
    assert all(_spec(f"{k}@{OTHER_ARCH}").config["ATTN07_BLOCK_N_D128"] == 64 for k in OTHER_TILES)
    assert all(_spec(f"{k}@{OTHER_ARCH}").config["ATTN07_STAGES_D64"] == 3 for k in OTHER_TILES)
    assert all(OTHER_TILES[k] == (128,) for k in one_stage)  # their tiles differ at D = 128 only: 64 keys
    lengths = {shape.L for _, cases in _work() for shape, _, _ in cases}
    assert {1, 2, 15, 17, 63, 65, 127, 129, 200, 300, 513, 520, 641} <= lengths
    hybrid = {shape.L for kid, cases in _work() if kid == "04_cublas_hybrid" for shape, _, _ in cases}
    assert {300, 513, 520} <= hybrid
    for label in ("07_mma_split_ctas", f"07_mma_split_ctas@{OTHER_ARCH}"):
        assert {(shape.L, shape.D) for kid, cases in _work() if kid == label for shape, _, _ in cases} >= {
            (641, 64), (641, 128)}
    seven = [cases for kid, cases in _work() if kid == "07_mma"]
    assert {shape.D for cases in seven for shape, _, _ in cases} == {64, 128}
    # every entry of chapter 7 runs: each key split has an id that fixes it (the unsplit two-row entry
    # at D = 128 only up to L = 64, one query tile: tests/test_kv_split.py runs it over eight key
    # tiles, on the launch a one-SM GPU gets)
    entries = {_spec(kid).launch_config(shape)["entry"] for kid, cases in _work() if kid.startswith("07_")
               for shape, _, _ in cases}
    assert entries == {e for kid in KERNEL_IDS if kid.startswith("07_") for D in sorted(_spec(kid).head_dims)
                       for e in _spec(kid).entries_at_head_dim(D)}
    assert "attn_fwd_07_mma_split4_d128" in entries  # only with 64-key tiles
    assert {seed for cases in seven for _, _, seed in cases} == set(CPU_SCHEDULE_SEEDS) and len(CPU_SCHEDULE_SEEDS) == 3
    seeds: dict[tuple, set] = {}
    for kid, cases in _work():
        for shape, causal, seed in cases:
            seeds.setdefault((kid, shape, causal), set()).add(seed)
    assert all(s == ({0} if shape.L in CPU_LONG_LENGTHS.get(_spec(kid).id, ()) else set(CPU_SCHEDULE_SEEDS))
               for (kid, shape, causal), s in seeds.items())


def _loop_unit(spec, D: int) -> tuple[int, int]:
    """(key tile, K/V stages) of a tunable kernel at head dim D, from its configuration: the keys
    its key loop takes per step and the steps before its ring of stages comes round again."""
    cfg = spec.config
    bn = next(cfg[k] for k in (f"ATTN07_BLOCK_N_D{D}", f"ATTN06_BLOCK_N_D{D}", "ATTN05_BLOCK_N") if k in cfg)
    stages = next((cfg[k] for k in (f"ATTN07_STAGES_D{D}", "ATTN06_STAGES") if k in cfg), 1)
    return bn, stages


def _tiles_per_cta(spec, shape) -> int:
    """Key tiles the busiest CTA of a launch walks: all of them, or its share of a split across CTAs."""
    bn, _ = _loop_unit(spec, shape.D)
    tiles = math.ceil(shape.L / bn)
    if spec.runner == "attnlab.gpu.launch:run_split_ctas":
        tiles = math.ceil(tiles / spec.launch_config(shape)["kv_split"])
    return tiles


def test_the_grid_goes_past_every_kernel_s_internal_chunk():
    """A mistake that shows only past a kernel's own boundary needs a row longer than that boundary:
    chapter 4's row softmax steps 256 columns at a time (32 lanes x 8), on a 16-byte path where
    L % 8 == 0 and a 2-byte path otherwise; every tiled kernel's key loop must run until its ring of
    K/V stages comes round again, in one CTA (chapter 7's split across CTAs included, both targets)."""
    step = 32 * 8
    lengths = {shape.L for shape in cpu_shapes(registry.get("04_cublas_hybrid"))}
    assert any(L > 2 * step and L % 8 for L in lengths) and any(L > 2 * step and L % 8 == 0 for L in lengths)
    assert max(CPU_LENGTHS) < step, "the base grid reached the 256-column step: CPU_LONG_LENGTHS may go"
    for label in KERNEL_IDS:
        spec = _spec(label)
        if spec.tuning is None:
            continue
        for D in sorted({s.D for s in cpu_shapes(spec)}):
            bn, stages = _loop_unit(spec, D)
            most = max(_tiles_per_cta(spec, s) for s in cpu_shapes(spec) if s.D == D)
            assert most > stages, f"{label} at D={D}: {most} key tiles per CTA at most, {stages} stages of {bn} keys"


def test_the_long_lengths_only_go_where_a_chunk_needs_them():
    """They cost: each kernel that has them needs them (its chunk is past the base grid's L)."""
    assert set(CPU_LONG_LENGTHS) == {"04_cublas_hybrid", "07_mma_split_ctas", "07_mma_two_row_blocks",
                                     "07_mma_across_heads", "07_mma_lean", "07_mma_lean_across_heads",
                                     "07_mma_whole_tiles", "07_mma_whole_tiles_across_heads", "07_mma_deferred_pv",
                                     "07_mma_deferred_pv_across_heads", "07_mma_deferred_pv_two_rows"}
    base = [Shape(1, 2, L, D) for L in CPU_LENGTHS for D in (64, 128)] + [Shape(2, 3, 130, D) for D in (64, 128)]
    for label in ("07_mma_split_ctas", f"07_mma_split_ctas@{OTHER_ARCH}"):
        spec = _spec(label)
        assert all(_tiles_per_cta(spec, s) <= _loop_unit(spec, s.D)[1] for s in base if s.L > 1)
    for kid in ("07_mma_two_row_blocks", "07_mma_across_heads", "07_mma_lean", "07_mma_lean_across_heads",
                "07_mma_whole_tiles", "07_mma_whole_tiles_across_heads", "07_mma_deferred_pv",
                "07_mma_deferred_pv_across_heads", "07_mma_deferred_pv_two_rows"):  # their 2-way split at D = 64: only the long row
        spec = _spec(kid)
        split2 = spec.entries_by_split[2][64]
        assert all(spec.launch_config(s)["entry"] != split2 for s in base)
        assert {spec.launch_config(Shape(1, 2, L, 64))["entry"] for L in CPU_LONG_LENGTHS[kid]} == {split2}


def test_a_mutant_only_the_long_rows_catch_is_caught():
    """04-one-step folds only the first 256 columns of a row into its max and sum: the base grid
    (L <= 200) passes it, the grid with chapter 4's long rows kills it."""
    from attnlab.executor import cpu, mutation

    mutant = mutation.get("04-one-step")
    killed = mutation.run_in_process(mutant)
    assert killed.status == "killed" and killed.by.startswith("04_cublas_hybrid (1, 2, "), killed.by
    assert int(killed.by.split(", ")[2]) > 256, killed.by
    saved = dict(cpu.CPU_LONG_LENGTHS)
    try:
        cpu.CPU_LONG_LENGTHS.clear()
        base_cases = len(mutation.cases(mutant))
        outcome = mutation.run_in_process(mutant)
    finally:
        cpu.CPU_LONG_LENGTHS.update(saved)
    assert outcome.status == "survived" and outcome.cases_run == base_cases > 100


@pytest.mark.parametrize("kernel_id", KERNEL_IDS)
def test_kernel_passes_on_the_cpu_executor_with_zero_findings(results, kernel_id):
    cases = results[kernel_id]
    assert cases, f"no CPU case ran for {kernel_id}"
    failed = [c for c in cases if not c.passed]
    lines = [f"{c.shape} causal={c.causal} seed={c.seed}: {c.reason}" for c in failed[:10]]
    lines += list(dict.fromkeys(f for c in failed for f in c.findings))[:10]
    assert not failed, f"{len(failed)}/{len(cases)} CPU cases of {kernel_id} failed:\n" + "\n".join(lines)
    assert all(c.max_err <= c.tolerance and not c.findings for c in cases)
