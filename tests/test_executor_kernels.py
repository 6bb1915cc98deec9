"""Every registered kernel and variant, run unchanged on the CPU executor: the GPU check's pass
rule against the fp64 reference, and zero findings (races, out-of-bounds, uninitialized or early
reads, deadlocks, barrier and mask misuse), over
  L = 1, 2, 15, 17, 63, 65, 127, 129, 200 and a (2, 3, 130, D) batch; D = 64 and 128 where the kernel
  takes it; causal and not; three seeds (each draws the inputs, the order the executor runs warps
  and lanes in, and its WMMA fragment layouts).
For chapter 4 that is its row-softmax kernel on the executor between the two GEMMs in torch at
the GPU path's precisions. The cases run in a few processes in parallel; each kernel's verdict is
its own test."""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import pytest

from attnlab import registry
from attnlab.cpu import CPU_SCHEDULE_SEEDS, check_case_cpu, cpu_shapes, library_for

KERNEL_IDS = [spec.id for spec in registry.select(None)]


def _run_cases(kernel_id: str, cases):
    import torch

    torch.set_num_threads(1)
    spec = registry.get(kernel_id)
    return [check_case_cpu(spec, shape, causal, seed) for shape, causal, seed in cases]


def _work():
    """(kernel id, cases) chunks: one per kernel, head dim and causal flag."""
    chunks = []
    for spec in registry.select(None):
        for D in sorted({s.D for s in cpu_shapes(spec)}):
            for causal in (False, True):
                cases = [(shape, causal, seed) for shape in cpu_shapes(spec) if shape.D == D
                         for seed in CPU_SCHEDULE_SEEDS]
                chunks.append((spec.id, cases))
    return chunks


@pytest.fixture(scope="module")
def results():
    for spec in registry.select(None):
        library_for(spec)  # build once, here, before the workers load them
    workers = max(1, min(4, os.cpu_count() or 1))
    by_kernel: dict[str, list] = {k: [] for k in KERNEL_IDS}
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = [(kid, pool.submit(_run_cases, kid, cases)) for kid, cases in _work()]
        for kid, fut in futures:
            by_kernel[kid] += fut.result()
    return by_kernel


def test_the_grid_covers_every_kernel_and_the_issue_shapes():
    ids = {kid for kid, _ in _work()}
    assert ids == set(KERNEL_IDS) and len(ids) == 20
    lengths = {shape.L for _, cases in _work() for shape, _, _ in cases}
    assert {1, 2, 15, 17, 63, 65, 127, 129, 200} <= lengths
    seven = [cases for kid, cases in _work() if kid == "07_mma"]
    assert {shape.D for cases in seven for shape, _, _ in cases} == {64, 128}
    # every entry of chapter 7 runs: each key split has an id that fixes it
    entries = {registry.get(kid).launch_config(shape)["entry"] for kid, cases in _work() if kid.startswith("07_")
               for shape, _, _ in cases}
    assert entries == {e for kid in KERNEL_IDS if kid.startswith("07_") for D in sorted(registry.get(kid).head_dims)
                       for e in registry.get(kid).entries_at_head_dim(D)}
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
