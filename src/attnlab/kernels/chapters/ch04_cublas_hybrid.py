"""Chapter 4 (kernels/04_row_softmax.cu between two cuBLAS GEMMs, attnlab.gpu.hybrid)."""
from __future__ import annotations

from ..spec import KernelSpec, cdiv, register
from ..source_constants import constant

WARPS = constant("04_row_softmax.cu", "WARPS")  # rows (one per warp) per block

register(KernelSpec(
    id="04_cublas_hybrid",
    chapter=4,
    title="cuBLAS hybrid",
    source="04_row_softmax.cu",
    entry="attn_softmax_04_rows",
    block=lambda s: (WARPS * 32, 1, 1),
    grid=lambda s: (cdiv(s.L, WARPS), s.B * s.H, 1),
    runner="attnlab.gpu.hybrid:run_cublas_hybrid",
    # The runner is part of what a record measures: its source is hashed with the kernel's.
    extra_sources=("common.cuh", "../src/attnlab/gpu/hybrid.py"),
    summary="cuBLAS S = QK^T (fp16), a warp-per-row fp32 softmax kernel in place, cuBLAS P V",
))
