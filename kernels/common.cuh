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
