"""Chapter 1 (kernels/01_scalar.cu): one thread per query row."""
from __future__ import annotations

from ..spec import KernelSpec, cdiv, register
from ..source_constants import constant

THREADS = constant("01_scalar.cu", "THREADS")  # query rows (threads) per block

register(KernelSpec(
    id="01_scalar",
    chapter=1,
    title="Scalar baseline",
    source="01_scalar.cu",
    entry="attn_fwd_01_scalar",
    block=lambda s: (THREADS, 1, 1),
    grid=lambda s: (cdiv(s.L, THREADS), s.B * s.H, 1),
    conflict_free=("ld/st",),  # the column-major query tile
    summary="one thread per query row, fp32 online softmax on CUDA cores",
))
