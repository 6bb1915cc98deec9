"""Kernels 02-04 and their Python side, without a GPU: the registry's launch constants match the
sources, the launch geometry covers every row, 16-byte kernels refuse misaligned tensors, the
hybrid's runner is what launch() calls and its score-memory check refuses before any work, and
kernels/test_warp_reduce.cu builds for every target."""
import dataclasses
import re

import pytest
import torch

from attnlab.gpu import hybrid, launch
from attnlab.kernels import registry
from attnlab.env import NoGpuError
from attnlab.kernels.contract import AttentionInputError, validate
from attnlab.paths import kernels_dir
from attnlab.shapes import CHECK_SHAPES, ODD_HEAD_DIM_SHAPES, Shape
from attnlab.kernels.sources import source_files


def constant(source: str, name: str) -> int:
    return int(re.search(rf"constexpr int {name} = (\d+);", (kernels_dir() / source).read_text()).group(1))


def test_registry_constants_match_the_sources():
    assert constant("02_block_tiling.cu", "ROWS") == registry.ch02_block_tiling.ROWS
    assert constant("02_block_tiling.cu", "KEYS") == registry.ch02_block_tiling.KEYS
    assert "Q_STRIDE = ROWS + 2;" in (kernels_dir() / "02_block_tiling.cu").read_text()
    assert constant("03_warp_reductions.cu", "KEYS") == registry.ch03_warp_reductions.KEYS
    assert constant("03_warp_reductions.cu", "VEC") == registry.ch03_warp_reductions.VEC
    assert constant("04_row_softmax.cu", "WARPS") == registry.ch04_cublas_hybrid.WARPS
    src = (kernels_dir() / "03_warp_reductions.cu").read_text()
    for warps in (4, 8):
        assert f"__launch_bounds__({warps} * 32)" in src and f"warp_rows<{warps}>" in src


def test_lanes_per_row():
    assert [registry.ch03_warp_reductions.lanes_per_row(D) for D in (8, 16, 24, 32, 40, 64, 72, 128)] == [1, 2, 4, 4, 8, 8, 16, 16]
    for D in range(8, 129, 8):
        G = registry.ch03_warp_reductions.lanes_per_row(D)
        assert G * 8 >= D > G * 4 and 32 % G == 0


NEW = ["02_block_tiling", "03_warp_rows_4w", "03_warp_rows_8w", "04_cublas_hybrid"]
SHAPES = list(CHECK_SHAPES) + list(ODD_HEAD_DIM_SHAPES) + [Shape(1, 1, 1, 8), Shape(3, 5, 4099, 128)]


@pytest.mark.parametrize("kernel_id,shape", [(k, s) for k in NEW for s in SHAPES
                                              if registry.get(k).supports_head_dim(s.D)],
                         ids=lambda x: x.label() if isinstance(x, Shape) else x)
def test_grid_covers_every_row(kernel_id, shape):
    spec = registry.get(kernel_id)
    (gx, gy, _), (bx, _, _) = spec.grid(shape), spec.block(shape)
    if kernel_id.startswith("02"):
        rows_per_block = bx
    elif kernel_id.startswith("03"):
        rows_per_block = bx // registry.ch03_warp_reductions.lanes_per_row(shape.D)
    else:
        rows_per_block = bx // 32
    assert gx * rows_per_block >= shape.L > (gx - 1) * rows_per_block and gy == shape.heads


def test_shared_memory_declared():
    # 02: Q tile [D][ROWS + 2] and one K and one V tile [KEYS][D]; 03: two buffers of K and V tiles.
    assert registry.get("02_block_tiling").dynamic_smem(Shape(1, 1, 7, 64)) == (64 * 130 + 2 * 32 * 64) * 2
    assert registry.get("02_block_tiling").dynamic_smem(Shape(1, 1, 7, 128)) == 49664
    for w in (4, 8):
        assert registry.get(f"03_warp_rows_{w}w").dynamic_smem(Shape(1, 1, 7, 128)) == 32768
    assert registry.get("04_cublas_hybrid").dynamic_smem(Shape(1, 1, 4096, 64)) == 0


def test_chapter_3_takes_multiples_of_8_only():
    spec = registry.get("03_warp_rows_4w")
    assert all(spec.supports_head_dim(D) for D in range(8, 129, 8))
    assert not any(spec.supports_head_dim(D) for D in (1, 4, 12, 60, 136))


def qkv(shape=(1, 2, 16, 64)):
    return tuple(torch.randn(shape).to(torch.float16) for _ in range(3))


def test_16_byte_kernels_refuse_a_misaligned_view():
    flat = torch.randn(1 * 2 * 16 * 64 + 1).to(torch.float16)
    shifted = flat[1:].view(1, 2, 16, 64)  # contiguous, but 2 bytes past an aligned start
    assert shifted.is_contiguous() and shifted.data_ptr() % 16 == 2
    q, k, v = qkv()
    with pytest.raises(AttentionInputError, match="16-byte boundary"):
        validate(registry.get("03_warp_rows_4w"), shifted, k, v)
    with pytest.raises(AttentionInputError, match="out does not start on a 16-byte"):
        validate(registry.get("03_warp_rows_8w"), q, k, v, out=shifted)
    for kernel_id in ("01_scalar", "02_block_tiling", "04_cublas_hybrid"):  # 2-byte loads: fine
        # Past the alignment rule, CPU tensors stop at the device check, which comes last.
        with pytest.raises((NoGpuError, AttentionInputError), match="GPU"):
            validate(registry.get(kernel_id), shifted, k, v)


def test_launch_hands_a_runner_kernel_to_its_runner(monkeypatch):
    calls = []
    monkeypatch.setattr(hybrid, "run_cublas_hybrid", lambda *args: calls.append(args))
    spec = registry.get("04_cublas_hybrid")
    q, k, v = qkv()
    out = torch.empty_like(q)
    launch.launch(spec, Shape(*q.shape), q, k, v, out, True, 0.125)
    assert len(calls) == 1 and calls[0][0] is spec and calls[0][6] is True and calls[0][7] == 0.125


def test_hybrid_hashes_its_runner_with_the_kernel():
    names = [p.name for p in source_files(registry.get("04_cublas_hybrid"))]
    assert names == ["04_row_softmax.cu", "common.cuh", "hybrid.py"]
    assert all(p.exists() for p in source_files(registry.get("04_cublas_hybrid")))


def test_hybrid_refuses_scores_that_do_not_fit():
    spec = registry.get("04_cublas_hybrid")
    shape = Shape(4, 16, 4096, 64)
    need = hybrid.score_bytes(shape)
    assert need == 4 * 16 * 4096 * 4096 * 2
    hybrid.check_score_memory(spec, shape, budget=need)
    with pytest.raises(AttentionInputError, match="2048 MiB at \\(4, 16, 4096, 64\\), over the 2047 MiB"):
        hybrid.check_score_memory(spec, shape, budget=need - 2**20)


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90"])
def test_warp_reduce_test_kernels_build(arch, tmp_path):
    from attnlab.kernels.compile import nvcc_cubin
    from attnlab.kernels.static import parse_ptxas

    spec = dataclasses.replace(registry.get("01_scalar"), id="test_warp_reduce", source="test_warp_reduce.cu",
                               entry="attn_test_warp_reduce")
    _, report = nvcc_cubin(spec, arch, tmp_path / "t.cubin")
    functions = {f.name: f for f in parse_ptxas(report)}
    assert set(functions) == {"attn_test_warp_reduce", "attn_test_group_dot"}
    assert not any(f.spills for f in functions.values())
