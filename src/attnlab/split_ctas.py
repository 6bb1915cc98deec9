"""Chapter 7's ablation 07_mma_split_ctas: FlashAttention-2's way to fill a GPU that the query
tiles leave half idle. The keys are split across CTAs (grid z); each CTA writes its rows'
unnormalized fp32 O, running max m and sum l to scratch in global memory, and a second kernel,
attn_combine_07, merges the splits of every row and writes O. Both kernels are in
kernels/07_mma_swizzle.cu; the split is the registry's (FA2's rule). At split 1 the unsplit kernel
runs alone, as in FA2.

The scratch is splits x B*H x L x (D + 2) fp32 words, allocated per call from torch's caching
allocator (FA2 does the same), so a CUDA graph captures it with the launches.
"""
from __future__ import annotations

import numpy as np

from .launch import launch_fused, pointer, run_on_torch_stream
from .registry import COMBINE_THREADS, KernelSpec
from .shapes import Shape

COMBINE_ENTRY = "attn_combine_07"


def scratch_shapes(shape: Shape, splits: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The fp32 partials: O [splits, B*H, L, D] and (m, l) [splits, B*H, L, 2]."""
    return (splits, shape.heads, shape.L, shape.D), (splits, shape.heads, shape.L, 2)


def scratch_bytes(shape: Shape, splits: int) -> int:
    """Bytes of scratch the split takes (0 at split 1: no partials)."""
    if splits == 1:
        return 0
    return 4 * sum(int(np.prod(s)) for s in scratch_shapes(shape, splits))


def combine_config(shape: Shape) -> dict:
    """attn_combine_07's launch: one thread per 4 columns of each of the B*H*L rows."""
    return {"grid": (-(-shape.heads * shape.L * shape.D // 4 // COMBINE_THREADS), 1, 1),
            "block": (COMBINE_THREADS, 1, 1), "dynamic_smem": 0, "entry": COMBINE_ENTRY}


def partial_args(shape: Shape, q, k, v, o_part, ml, causal: bool, scale: float) -> tuple:
    """The partial kernel's arguments: its five pointers, then L, D, scale, causal."""
    return (q, k, v, o_part, ml, np.int32(shape.L), np.int32(shape.D), np.float32(scale), np.int32(bool(causal)))


def combine_args(shape: Shape, o_part, ml, out, splits: int, scale: float) -> tuple:
    """attn_combine_07's arguments: partials, output, rows (B*H*L), D, splits, scale."""
    return (o_part, ml, out, np.int32(shape.heads * shape.L), np.int32(shape.D), np.int32(splits), np.float32(scale))


def run_split_ctas(spec: KernelSpec, shape: Shape, q, k, v, out, causal: bool, scale: float) -> None:
    """softmax(q k^T * scale [+ causal mask]) v into `out` by FA2's split across CTAs: the partial
    kernel, then the combine, on torch's current stream. The inputs are already validated."""
    import torch

    from .compile import load_function

    cfg = spec.launch_config(shape)
    splits = cfg["kv_split"]
    if splits == 1:  # the unsplit kernel, straight into out
        return launch_fused(spec, shape, q, k, v, out, causal, scale, cfg)
    fn = load_function(spec, cfg["entry"], q.device)
    combine = load_function(spec, COMBINE_ENTRY, q.device)  # both loaded before any work is queued
    o_shape, ml_shape = scratch_shapes(shape, splits)
    o_part = torch.empty(o_shape, dtype=torch.float32, device=q.device)
    ml = torch.empty(ml_shape, dtype=torch.float32, device=q.device)
    run_on_torch_stream(fn, cfg, partial_args(shape, *map(pointer, (q, k, v, o_part, ml)), causal, scale), q.device)
    run_on_torch_stream(combine, combine_config(shape),
                        combine_args(shape, pointer(o_part), pointer(ml), pointer(out), splits, scale), q.device)
