"""Chapter 7's ablation 07_mma_split_ctas: FlashAttention-2's way to fill a GPU that the query
tiles leave half idle. The keys are split across CTAs (grid z); each CTA writes its rows'
unnormalized fp32 O, running max m and sum l to scratch in global memory, and a second kernel,
attn_combine_07, merges the splits of every row and writes O. Both kernels are in
kernels/07_mma_swizzle.cu. What it takes from FA2 is the structure (runs of whole key tiles per
CTA, fp32 partials, a combine kernel, the unsplit kernel alone at split 1) and the form of the
split rule; what it does not: FA2's split kernel has its own tiles (64 query rows, 256 keys at head
dim 64, 128 at 128), writes O already divided by its l with one log-sum-exp per row (here: O, m
and l), and puts the split in grid y. The split is the registry's rule (registry.choose_kv_split,
which counts SMs where FA2 counts 2 x SMs); fa2_num_splits below is FA2's own choice, for
comparison.

The scratch is splits x B*H x L x (D + 2) fp32 words, allocated per call from torch's caching
allocator (FA2 does the same), so a CUDA graph captures it with the launches.

This module is the route's arithmetic (scratch, launches, arguments), which the GPU's runner
(attnlab.gpu.launch.run_split_ctas) and the CPU executor's (attnlab.executor.cpu) both follow.
"""
from __future__ import annotations

import math

import numpy as np

from ..shapes import Shape
from .registry import COMBINE_THREADS

COMBINE_ENTRY = "attn_combine_07"

# FlashAttention-2's split-KV kernel (csrc/flash_attn/src/flash_fwd_launch_template.h,
# run_mha_fwd_splitkv_dispatch; flash_api.cpp, set_params_splitkv): 64 query rows per CTA, and
# keys per tile by head dim. Its heuristic counts CTAs and key blocks with these.
FA2_SPLIT_BLOCK_M = 64
FA2_SPLITS_MAX = 128


def fa2_split_block_n(D: int) -> int:
    """Keys per tile of FA2's split-KV kernel at head dim D: 256 up to 64, 128 up to 128, else 64."""
    return 256 if D <= 64 else 128 if D <= 128 else 64


def fa2_num_splits_heuristic(ctas: int, units: int, n_blocks: int, max_splits: int = FA2_SPLITS_MAX) -> int:
    """FlashAttention-2's num_splits_heuristic (flash_api.cpp), restated: 1 when `ctas` already
    cover 80% of `units`; otherwise, among the splits 1 .. min(max_splits, units, n_blocks) that
    change the key blocks per split (is_split_eligible), the smallest whose wave efficiency is at
    least 85% of the best one's."""
    if ctas >= 0.8 * units:
        return 1
    top = min(max_splits, units, n_blocks)
    eligible = [s for s in range(1, top + 1) if s == 1 or -(-n_blocks // s) != -(-n_blocks // (s - 1))]
    efficiency = {}
    for s in eligible:
        waves = ctas * s / units
        efficiency[s] = waves / math.ceil(waves)
    best = max(efficiency.values(), default=0.0)
    return next((s for s in eligible if efficiency[s] >= 0.85 * best), 1)


def fa2_num_splits(shape: Shape, sms: int) -> int:
    """The split FlashAttention-2's forward (mha_fwd, no dropout) takes for `shape` on a GPU of
    `sms` SMs: its heuristic over B*H*ceil(L / 64) CTAs, 2 x sms units ("we're using 128 threads
    per block") and ceil(L / its key tile) key blocks."""
    ctas = shape.heads * -(-shape.L // FA2_SPLIT_BLOCK_M)
    return fa2_num_splits_heuristic(ctas, 2 * sms, -(-shape.L // fa2_split_block_n(shape.D)))


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
