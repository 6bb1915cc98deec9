"""Chapter 4's cuBLAS hybrid: S = Q K^T and O = P V by cuBLAS (through torch.matmul), and between
them the row softmax of kernels/04_row_softmax.cu, all on torch's current stream.

Why S is fp16: torch.matmul on fp16 tensors runs cuBLAS's fp16 tensor-core GEMM (fp32
accumulation, fp16 output). The bytes of the L x L matrix are what bound this design (written
once, read twice, rewritten as P, read by the second GEMM); an fp32 S (recent PyTorch can ask
cuBLAS for one with torch.bmm(..., out_dtype=torch.float32)) would double most of them. SDPA's
math backend, the comparison this chapter is about, does not do this by default: it upcasts fp16
inputs and keeps S in fp32, unless torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
lets it stay in fp16; chapter 4 reads that flag when it compares. The kernel forms
x = s * scale in fp32 and keeps its statistics in fp32; rounding S to fp16 costs about
|q.k| * 2^-11 per score, the same as the plain fp16 implementation that the pass rule
measures against. The fp16 S holds unscaled q.k and overflows past +-65504 (see the kernel's
header).

S is materialised: B*H*L*L fp16 values. `check_score_memory` refuses a problem whose scores do
not fit before anything is queued.
"""
from __future__ import annotations

import numpy as np

from ..kernels.contract import AttentionInputError
from ..kernels.registry import KernelSpec
from ..shapes import Shape
from .launch import pointer, run_on_torch_stream

SCORE_BYTES = 2          # S, and P written over it, are fp16
MEMORY_FRACTION = 0.8    # share of the spare GPU memory S may take; cuBLAS workspace and O need the rest

_last_budget: dict[int, int] = {}


def score_bytes(shape: Shape) -> int:
    """Bytes of the B*H*L*L score matrix."""
    return shape.heads * shape.L * shape.L * SCORE_BYTES


def score_budget(device) -> int:
    """Bytes the scores may take on `device`: MEMORY_FRACTION of what the driver reports free plus
    what torch's caching allocator holds unused. While a CUDA graph is being captured no driver
    query is made; the budget measured at the last call outside a capture stands in."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    if torch.cuda.is_current_stream_capturing():
        if index in _last_budget:
            return _last_budget[index]
        return int(MEMORY_FRACTION * torch.cuda.get_device_properties(index).total_memory)
    free, _total = torch.cuda.mem_get_info(index)
    spare = torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
    _last_budget[index] = int(MEMORY_FRACTION * (free + spare))
    return _last_budget[index]


def check_score_memory(spec: KernelSpec, shape: Shape, budget: int) -> None:
    need = score_bytes(shape)
    if need > budget:
        raise AttentionInputError(
            f"{spec.id} keeps the B*H*L*L fp16 scores in GPU memory: {need / 2**20:.0f} MiB at "
            f"{shape.label()}, over the {budget / 2**20:.0f} MiB this GPU can spare; use a fused "
            "kernel, or a smaller B*H or L")


def run_cublas_hybrid(spec: KernelSpec, shape: Shape, q, k, v, out, causal: bool, scale: float) -> None:
    """softmax(q k^T * scale [+ causal mask]) v into `out`: GEMM, row-softmax kernel, GEMM.
    The inputs are already validated (launch.attention)."""
    import torch

    from ..kernels.compile import load_function

    check_score_memory(spec, shape, score_budget(q.device))
    fn = load_function(spec, device=q.device)  # before any work is queued: a build error leaves nothing half-done
    s = torch.matmul(q, k.transpose(-2, -1))  # [B, H, L, L] fp16, contiguous, unscaled
    args = (pointer(s), np.int32(shape.L), np.float32(scale), np.int32(bool(causal)))
    run_on_torch_stream(fn, spec.launch_config(shape), args, q.device)
    torch.matmul(s, v, out=out)  # P (written over S) times V
