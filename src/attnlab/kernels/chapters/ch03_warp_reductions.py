"""Chapter 3 (kernels/03_warp_reductions.cu): lanes split the head dim, shuffles reduce."""
from __future__ import annotations

from ..spec import KernelSpec, cdiv, register
from ..source_constants import constants

_C = constants("03_warp_reductions.cu")
KEYS = _C["KEYS"]  # keys per K/V tile
VEC = _C["VEC"]    # halves per lane (one 16-byte load)


def lanes_per_row(D: int) -> int:
    """lanes_per_row() of kernels/03_warp_reductions.cu: the smallest power of two G with G * VEC >= D."""
    g = 1
    while g * VEC < D:
        g *= 2
    return g


def rows_per_block(warps: int, D: int) -> int:
    return warps * 32 // lanes_per_row(D)


for _warps in (4, 8):
    register(KernelSpec(
        id=f"03_warp_rows_{_warps}w",
        chapter=3,
        title=f"Warp reductions, {_warps} warps",
        source="03_warp_reductions.cu",
        entry=f"attn_fwd_03_warp_rows_{_warps}w",
        block=lambda s, w=_warps: (w * 32, 1, 1),
        grid=lambda s, w=_warps: (cdiv(s.L, rows_per_block(w, s.D)), s.B * s.H, 1),
        dynamic_smem=lambda s: 2 * 2 * KEYS * s.D * 2,  # 2 buffers x (K, V) x KEYS x D halves
        head_dims=frozenset(range(8, 129, 8)),
        alignment=16,
        summary=f"lanes split D (16-byte loads), shuffle reductions, one barrier per tile; {_warps} warps",
    ))
