// Shared by every attnlab kernel: the argument contract and a few helpers, defined once.
//
// Contract (all kernels): q, k, v, o are [B, H, L, D] contiguous fp16 tensors; the launcher
// passes B*H as gridDim.y (one head per y index), L, D, the softmax scale and a causal flag.
// Statistics and accumulation are fp32; the running max starts at -inf.
#pragma once
#include <cuda_fp16.h>

#ifndef ATTN_NEG_INF
#define ATTN_NEG_INF (-__int_as_float(0x7f800000))
#endif

namespace attn {

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Offset of head `bh` in a [B*H, L, D] tensor; 64-bit because B*H*L*D can pass 2^31.
__device__ __forceinline__ long long head_offset(int bh, int L, int D) {
    return static_cast<long long>(bh) * L * D;
}

// exp(x - m) that stays finite when both are -inf (a row that has seen no key yet).
__device__ __forceinline__ float safe_exp_diff(float x, float m) {
    return (m == ATTN_NEG_INF) ? 0.0f : __expf(x - m);
}

}  // namespace attn

// Warp reductions (chapter 3 on). A butterfly over aligned groups of `width` lanes (a power of
// two, 1..32): at each step lane i adds the value of lane i ^ off, off = width/2, ..., 1. After
// log2(width) steps every lane of a group holds the result for its own group and no other: lanes
// 0..width-1 never see lanes width..2*width-1, so a group that owns one query row never adds in
// another row's values. Each lane must pass its OWN partial value: reducing a value that the
// group already shares (a result of an earlier reduction) returns it width times too large.
// Every lane of the warp must call with the same width (the mask is the full warp). The loop is
// unrolled over off = 16..1 and skips the steps with off >= width, so a width known only at run
// time costs no loop control.
namespace attn {

constexpr unsigned FULL_MASK = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v, int width = 32) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        if (off < width) v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v, int width = 32) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        if (off < width) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off));
    return v;
}

}  // namespace attn
