"""Every registered kernel and variant, run unchanged on the CPU executor: the GPU check's pass
rule against the fp64 reference, and zero findings (races, out-of-bounds, uninitialized or early
reads, deadlocks, barrier and mask misuse), over
  L = 1, 2, 15, 17, 63, 65, 127, 129, 200 and a (2, 3, 130, D) batch; D = 64 and 128 where the kernel
  takes it; causal and not; three seeds (each draws the inputs, the order the executor runs warps
  and lanes in, and its WMMA fragment layouts).
For chapter 4 that is its row-softmax kernel on the executor between the two GEMMs in torch at
the GPU path's precisions. Chapter 7's kernels run again with the tiles they take on sm_90
(registry._mma07_arch_tiles: 64-key tiles at D = 128, three K/V stages at D = 64 and 128), as
"<id>@sm_90", at each head dim where those differ from the source's. The cases run in a few
processes in parallel; each kernel's verdict is its own test."""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import pytest

from attnlab import registry
from attnlab.cpu import CPU_SCHEDULE_SEEDS, check_case_cpu, cpu_shapes, library_for
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
        for D in dims:
            for causal in (False, True):
                cases = [(shape, causal, seed) for shape in cpu_shapes(spec) if shape.D == D
                         for seed in CPU_SCHEDULE_SEEDS]
                chunks.append((label, cases))
    return chunks


@pytest.fixture(scope="module")
def results():
    for label in KERNEL_IDS:
        library_for(_spec(label))  # build once, here, before the workers load them
    workers = max(1, min(4, os.cpu_count() or 1))
    by_kernel: dict[str, list] = {k: [] for k in KERNEL_IDS}
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = [(kid, pool.submit(_run_cases, kid, cases)) for kid, cases in _work()]
        for kid, fut in futures:
            by_kernel[kid] += fut.result()
    return by_kernel


def test_the_grid_covers_every_kernel_and_the_issue_shapes():
    ids = {kid for kid, _ in _work()}
    assert ids == set(KERNEL_IDS) and len(registry.KERNELS) == 20
    # every chapter-7 id runs D = 64 and 128 again with sm_90's tiles: 64 keys at D = 128, 3 stages
    assert sorted(OTHER_TILES) == sorted(k for k in registry.KERNELS if k.startswith("07_"))
    assert all(dims == (64, 128) for kid, dims in OTHER_TILES.items() if kid != "07_mma_single_buffer")
    assert all(_spec(f"{k}@{OTHER_ARCH}").config["ATTN07_BLOCK_N_D128"] == 64 for k in OTHER_TILES)
    assert all(_spec(f"{k}@{OTHER_ARCH}").config["ATTN07_STAGES_D64"] == 3 for k in OTHER_TILES)
    assert OTHER_TILES["07_mma_single_buffer"] == (128,)  # one stage everywhere; 64 keys at D = 128
    lengths = {shape.L for _, cases in _work() for shape, _, _ in cases}
    assert {1, 2, 15, 17, 63, 65, 127, 129, 200} <= lengths
    seven = [cases for kid, cases in _work() if kid == "07_mma"]
    assert {shape.D for cases in seven for shape, _, _ in cases} == {64, 128}
    # every entry of chapter 7 runs: each key split has an id that fixes it
    entries = {_spec(kid).launch_config(shape)["entry"] for kid, cases in _work() if kid.startswith("07_")
               for shape, _, _ in cases}
    assert entries == {e for kid in KERNEL_IDS if kid.startswith("07_") for D in sorted(_spec(kid).head_dims)
                       for e in _spec(kid).entries_at_head_dim(D)}
    assert "attn_fwd_07_mma_split4_d128" in entries  # only with 64-key tiles
    assert {seed for cases in seven for _, _, seed in cases} == set(CPU_SCHEDULE_SEEDS) and len(CPU_SCHEDULE_SEEDS) == 3


@pytest.mark.parametrize("kernel_id", KERNEL_IDS)
def test_kernel_passes_on_the_cpu_executor_with_zero_findings(results, kernel_id):
    cases = results[kernel_id]
    assert cases, f"no CPU case ran for {kernel_id}"
    failed = [c for c in cases if not c.passed]
    lines = [f"{c.shape} causal={c.causal} seed={c.seed}: {c.reason}" for c in failed[:10]]
    lines += list(dict.fromkeys(f for c in failed for f in c.findings))[:10]
    assert not failed, f"{len(failed)}/{len(cases)} CPU cases of {kernel_id} failed:\n" + "\n".join(lines)
    assert all(c.max_err <= c.tolerance and not c.findings for c in cases)
