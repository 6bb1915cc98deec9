"""Chapter 5 (kernels/05_wmma.cu): one fused WMMA kernel, and the tile chapters 5 and 6 share
(kernels/wmma_tile.cuh). tests/test_kernels_05_06_static.py checks the shared-memory sizes against
the kernels' static_asserts."""
from __future__ import annotations

from ..spec import KernelSpec, Knob, Tuning, cdiv, register
from ..source_constants import constants

_TILE = constants("wmma_tile.cuh")
BLOCK_M = _TILE["BLOCK_M"]      # query rows per block
WARP_M = _TILE["WARP_M"]        # query rows per compute warp
PAD_HALF = _TILE["PAD_HALF"]    # padding of fp16 rows (halves)
PAD_FLOAT = _TILE["PAD_FLOAT"]  # padding of fp32 rows (floats)
_C = constants("05_wmma.cu", "wmma_tile.cuh")
THREADS = _C["THREADS"]
BLOCK_N = _C["BLOCK_N"]         # keys per tile


def wmma_smem(D: int, block_n: int, kv_tiles: int, block_m: int = BLOCK_M) -> int:
    """Dynamic shared memory of chapters 5 and 6 (Tiles in kernels/wmma_tile.cuh): kv_tiles padded
    K/V tiles [block_n][D + 8] fp16, then S [block_m][block_n + 4] fp32, P [block_m][block_n + 8]
    fp16 and O [block_m][D + 4] fp32 (block_m = 64 query rows in the chapters)."""
    kv = block_n * (D + PAD_HALF) * 2
    s = block_m * (block_n + PAD_FLOAT) * 4
    p = block_m * (block_n + PAD_HALF) * 2
    o = block_m * (D + PAD_FLOAT) * 4
    return kv_tiles * kv + s + p + o


# Chapter 8's knobs of chapters 5 and 6 (the defines the sources read; the defaults are the
# chapters' constants above). BLOCK_M sets the compute warps: one per 16 query rows.
BLOCK_M_KNOB = Knob("ATTN_WMMA_BLOCK_M", (32, 64, 128), BLOCK_M, "query rows per block (16 per warp)")


def geometry(config: dict) -> dict:
    bm, bn = config["ATTN_WMMA_BLOCK_M"], config["ATTN05_BLOCK_N"]
    return {"block": lambda s: (32 * bm // WARP_M, 1, 1),
            "grid": lambda s: (cdiv(s.L, bm), s.B * s.H, 1),
            "dynamic_smem": lambda s: wmma_smem(s.D, bn, 2, bm)}


TUNING = Tuning(
    knobs=(BLOCK_M_KNOB,
           Knob("ATTN05_BLOCK_N", (16, 32, 64, 128), BLOCK_N, "keys per tile")),
    geometry=geometry)

register(KernelSpec(
    id="05_wmma",
    chapter=5,
    title="WMMA",
    source="05_wmma.cu",
    entry="attn_fwd_05_wmma",
    **geometry(TUNING.defaults),
    tuning=TUNING,
    head_dims=frozenset({64, 128}),
    alignment=16,
    extra_sources=("common.cuh", "ptx.cuh", "wmma_tile.cuh"),
    summary="fused: WMMA 16x16x16 QK^T and PV (fp32 accumulate), scores and O staged in shared memory",
))
