"""Chapter 2 (kernels/02_block_tiling.cu): a block's rows share Q and K/V tiles in shared memory."""
from __future__ import annotations

from ..spec import KernelSpec, cdiv, register
from ..source_constants import constants

_C = constants("02_block_tiling.cu")
ROWS = _C["ROWS"]          # query rows (threads) per block
KEYS = _C["KEYS"]          # keys per K/V tile
Q_STRIDE = _C["Q_STRIDE"]  # the padded column of the transposed Q tile


def smem(D: int) -> int:
    """Q tile [D][Q_STRIDE] plus one K and one V tile [KEYS][D], fp16."""
    return (D * Q_STRIDE + 2 * KEYS * D) * 2


register(KernelSpec(
    id="02_block_tiling",
    chapter=2,
    title="Block tiling",
    source="02_block_tiling.cu",
    entry="attn_fwd_02_block_tiling",
    block=lambda s: (ROWS, 1, 1),
    grid=lambda s: (cdiv(s.L, ROWS), s.B * s.H, 1),
    dynamic_smem=lambda s: smem(s.D),
    conflict_free=("ld/st",),  # the padded, transposed Q tile and broadcast K/V reads
    summary="Q and K/V tiles in shared memory shared by a block's 128 rows; online softmax across tiles",
))
