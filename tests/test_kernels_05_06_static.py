"""Chapters 5 and 6 without a GPU: the builds, the SASS that proves the design, and the registry's
mirror of the kernels' constants.

- 05_wmma: tensor-core math (HMMA), plain loads (no LDGSTS), block barrier 0 only.
- 06_*: HMMA, 16-byte cp.async (LDGSTS.E.BYPASS.128) with its group fences (LDGDEPBAR,
  DEPBAR), and the named barriers of the ring: BAR.SYNC and BAR.ARV on ids 1..2*STAGES with the
  block's thread count, never barrier 0.
"""
import os
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from attnlab.kernels import registry
from attnlab.paths import kernels_dir
from attnlab.kernels.registry import L4_MAX_SMEM_PER_BLOCK
from attnlab.shapes import Shape
from attnlab.kernels.sources import source_files
from attnlab.kernels.static import ARCHES, inspect_kernel, named_barriers
from attnlab.kernels.static import build as static_build

WS = registry.ch06_warp_specialized.VARIANTS                     # id -> (stages, producer warps)
OURS = ["05_wmma", *WS]
# HMMA.16816 per copy of the tile body: a 16x16x16 WMMA is two of them. Chapter 5 holds both D
# instances (D = 64: 16 + 16 WMMAs, D = 128: 32 + 32); chapter 6 holds 64 per D instance and
# STAGES copies (the consumer loop is unrolled by STAGES). The compiler may unroll further.
HMMA_PER_BODY = {"05": 2 * (16 + 16 + 32 + 32), "06": 2 * 2 * (16 + 16)}


def build(kernel_id: str, arch: str):
    """The static report (as `attnlab inspect` makes it) and the SASS text of one nvcc build."""
    spec = registry.get(kernel_id)
    return inspect_kernel(spec, arch), static_build(spec, arch).sass


def base_counts(rep) -> Counter:
    return rep.sass_base()


barriers = named_barriers


# Every arch for the two chapters' kernels; the sweep variants at the L4's sm_89 (tests/test_static.py
# builds every registered kernel for every arch already).
CASES = [("05_wmma", a) for a in ARCHES] + [("06_warp_specialized", a) for a in ARCHES] + \
        [(k, "sm_89") for k in WS if k != "06_warp_specialized"]


@pytest.fixture(scope="module", autouse=True)
def _build_in_parallel():
    """nvcc runs in subprocesses: build every case at once, one per core (the tests then hit the cache)."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(lambda case: build(*case), CASES))


@pytest.mark.parametrize("kernel_id,arch", CASES, ids=lambda x: x)
def test_builds_clean(kernel_id, arch):
    rep, _ = build(kernel_id, arch)
    assert rep.ok, rep.problems
    (fn,) = rep.functions                       # exactly one kernel per registry entry
    assert fn.name == registry.get(kernel_id).entry
    assert fn.static_smem + fn.dynamic_smem <= L4_MAX_SMEM_PER_BLOCK


@pytest.mark.parametrize("arch", ARCHES)
def test_wmma_kernel_uses_tensor_cores_and_plain_loads(arch):
    rep, sass = build("05_wmma", arch)
    ops = base_counts(rep)
    assert ops["HMMA"] >= HMMA_PER_BODY["05"] and ops["HMMA"] % 64 == 0, ops["HMMA"]
    assert all(op.startswith("HMMA.16816.F32") for op in rep.sass if op.startswith("HMMA"))  # fp32 accumulate
    assert ops["LDGSTS"] == 0 and ops["LDGDEPBAR"] == 0       # chapter 5 has no cp.async
    assert ops["LDG"] > 0 and ops["LDS"] + ops["LDSM"] > 0 and ops["STS"] > 0
    assert ops["LDL"] == 0 and ops["STL"] == 0
    bars = barriers(sass)
    assert bars and {(k, i) for k, i, _ in bars} == {("SYNC", 0)}  # __syncthreads only


@pytest.mark.parametrize("kernel_id,arch", [c for c in CASES if c[0] in WS], ids=lambda x: x)
def test_warp_specialized_uses_cp_async_and_named_barriers(kernel_id, arch):
    stages, producers = WS[kernel_id]
    rep, sass = build(kernel_id, arch)
    ops = base_counts(rep)
    assert ops["HMMA"] >= stages * HMMA_PER_BODY["06"] and ops["HMMA"] % 64 == 0, ops["HMMA"]
    assert any(op.startswith("LDGSTS.E.BYPASS.128") for op in rep.sass)  # cp.async.cg, 16 bytes
    assert ops["LDGDEPBAR"] > 0 and ops["DEPBAR"] > 0                     # commit_group / wait_group
    assert ops["LDL"] == 0 and ops["STL"] == 0
    bars = barriers(sass)
    threads = 32 * (4 + producers)
    assert {k for k, _, _ in bars} == {"SYNC", "ARV"}
    assert {i for _, i, _ in bars} == set(range(1, 2 * stages + 1))       # FULL 1..S, EMPTY S+1..2S
    assert {c for _, _, c in bars} == {threads}                           # every phase: the whole block
    if stages == 1:  # a one-stage ring is refilled only after release: EMPTY is used
        assert ("SYNC", 2, threads) in bars and ("ARV", 2, threads) in bars


# ---- the registry mirrors the sources -------------------------------------------------------

def _text(name: str) -> str:
    return (kernels_dir() / name).read_text()


def _const(src: str, name: str) -> int:
    return int(re.search(rf"constexpr int {name} = (\d+);", src).group(1))


def test_registry_constants_match_the_sources():
    tile, k05, k06 = _text("wmma_tile.cuh"), _text("05_wmma.cu"), _text("06_warp_specialized.cu")
    assert _const(tile, "BLOCK_M") == registry.ch05_wmma.BLOCK_M
    assert _const(tile, "WARP_M") == registry.ch05_wmma.WARP_M
    assert _const(tile, "PAD_HALF") == registry.ch05_wmma.PAD_HALF
    assert _const(tile, "PAD_FLOAT") == registry.ch05_wmma.PAD_FLOAT
    assert "constexpr int COMPUTE_WARPS = BLOCK_M / WARP_M;" in tile
    assert "constexpr int THREADS = COMPUTE_WARPS * 32;" in k05
    assert registry.ch05_wmma.THREADS == 32 * registry.ch05_wmma.BLOCK_M // registry.ch05_wmma.WARP_M
    assert _const(k05, "BLOCK_N") == registry.ch05_wmma.BLOCK_N
    assert "constexpr int BLOCK_N = D == 64 ? BLOCK_N_D64 : BLOCK_N_D128;" in k06
    assert {64: _const(k06, "BLOCK_N_D64"), 128: _const(k06, "BLOCK_N_D128")} == registry.ch06_warp_specialized.BLOCK_N


def test_dynamic_smem_matches_the_kernels_static_asserts():
    """The kernels assert their shared-memory sizes at compile time; the registry must agree."""
    k05, k06 = _text("05_wmma.cu"), _text("06_warp_specialized.cu")
    pairs05 = re.findall(r"smem_bytes<(\d+)>\(\) == (\d+)", k05)
    pairs06 = re.findall(r"smem_bytes<(\d+), (\d+)>\(\) == (\d+)", k06)
    assert len(pairs05) == 2 and len(pairs06) == 6
    for D, n in pairs05:
        assert registry.get("05_wmma").dynamic_smem(Shape(1, 1, 100, int(D))) == int(n)
    for kernel_id, (stages, _) in WS.items():
        for D, st, n in pairs06:
            if int(st) == stages:
                assert registry.get(kernel_id).dynamic_smem(Shape(1, 1, 100, int(D))) == int(n)
    for kernel_id in OURS:
        spec = registry.get(kernel_id)
        sizes = [spec.dynamic_smem(Shape(1, 1, 100, D)) for D in (64, 128)]
        assert all(48 * 1024 < n <= L4_MAX_SMEM_PER_BLOCK for n in sizes), (kernel_id, sizes)


@pytest.mark.parametrize("kernel_id", list(WS))
def test_sweep_files_instantiate_what_the_registry_says(kernel_id):
    stages, producers = WS[kernel_id]
    spec = registry.get(kernel_id)
    src = re.sub(r"\s+", " ", spec.path.read_text())
    # The chapter's entry reads its stages and producers from macros with defaults (chapter 8's
    # search may set them): substitute the defaults before reading the entry.
    for name, value in re.findall(r"#ifndef (ATTN06_\w+) #define \1 (\d+) #endif", src):
        src = src.replace(f"<{name}>", f"<{value}>").replace(f"{name}, ", f"{value}, ").replace(f", {name}>", f", {value}>")
    entry = re.search(r'extern "C" __global__ void __launch_bounds__\(Roles<(\d)>::THREADS, 1\) (\w+)\(', src)
    assert entry and entry.group(2) == spec.entry and int(entry.group(1)) == producers
    assert f"dispatch<{stages}, {producers}>(" in src
    assert spec.block(Shape(1, 1, 100, 64)) == (32 * (4 + producers), 1, 1)
    if kernel_id != "06_warp_specialized":
        assert src.index("#define ATTN06_SWEEP_VARIANT") < src.index('#include "06_warp_specialized.cu"')


@pytest.mark.parametrize("kernel_id", OURS)
def test_hash_covers_every_included_file(kernel_id):
    """A record's kernel hash must change with any file the build reads."""
    spec = registry.get(kernel_id)
    hashed = {p.name for p in source_files(spec)}
    todo, seen = [spec.path.name], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += re.findall(r'#include "([^"]+)"', _text(name))
    assert seen <= hashed, seen - hashed


@pytest.mark.parametrize("kernel_id", OURS)
@pytest.mark.parametrize("L", [1, 17, 63, 64, 65, 333, 4096])
def test_grid_covers_every_row(kernel_id, L):
    spec = registry.get(kernel_id)
    gx, gy, gz = spec.grid(Shape(2, 3, L, 64))
    assert gx * 64 >= L > (gx - 1) * 64 and (gy, gz) == (6, 1)
    assert spec.alignment == 16 and spec.head_dims == frozenset({64, 128}) and spec.causal
