// Chapter 4: the softmax of a cuBLAS hybrid.
//
// What changed since chapter 3: the fused kernel is split in three. cuBLAS computes S = Q K^T
// for all heads on tensor cores (a batched fp16 GEMM with fp32 accumulation, fp16 output), this
// kernel turns each row of S into probabilities P in place, and cuBLAS computes O = P V. The
// Python side (src/attnlab/gpu/hybrid.py) launches the three on one stream. This kernel keeps
// chapter 3's tools: one warp per row of S, fp32 statistics, attn::warp_max / attn::warp_sum
// across the 32 lanes, 16-byte loads and stores where the row allows.
//
// Per row: pass 1 reads the row once; each lane folds its elements, 8 at a time, into its own
// online (max m, sum l) pair, as chapter 1 does per thread. The 32 pairs then merge with two
// butterflies: M = warp_max(m), and l rescaled to M summed by warp_sum. Pass 2 reads the row again
// and writes p = exp(x - M) / sum as fp16 over it. x = s * scale is formed in fp32 from the fp16
// score, and causal columns j > i are written as exact zeros (P V reads them) without being read,
// except inside the one 16-byte vector that straddles the diagonal.
//
// Cost model: memory-bound. Per head, S is written by the first GEMM (L^2 * 2 bytes), read twice
// and written once here, and read by the second GEMM: about 5 * L^2 * 2 bytes against the fused
// kernels' 4 * L * D * 2 bytes. At (1, 8, 512, 64) that is 21 MB, which fits the L4's 48 MB L2;
// at L = 4096 it is 1.3 GB per 8 heads of DRAM traffic at 300 GB/s. The GEMMs run on tensor
// cores. Expect SDPA's math backend (the same three steps in PyTorch ops), not its flash backend.
//
// Launch: block (WARPS * 32,), grid (ceil(L / WARPS), B*H), no shared memory. s is [B*H, L, L]
// fp16, contiguous, 16-byte aligned (a fresh allocation).
// Limits: any L >= 1 (16-byte vectors when L % 8 == 0, else 2-byte loads, still coalesced); any
// D (the GEMMs take it); causal needs Lq == Lk. The fp16 S holds unscaled q.k, so |q.k| must stay
// below 65504 (the plain fp16 implementation has the same limit): a score above it turns its row
// to NaN, one below -65504 counts as masked.
#include "common.cuh"

namespace {
constexpr int WARPS = 4;  // rows per block
constexpr int VEC = 8;    // elements per lane per step: one uint4 when L % 8 == 0

// Element e (0..7) of lane `lane`'s step `it`: with vectors, 8 consecutive columns per lane
// (one 16-byte access); without, columns 32 apart, so each 2-byte access of the warp is
// 64 consecutive bytes. Either way a step covers columns it*256 .. it*256+255.
template <bool VECTOR>
__device__ __forceinline__ int column(int it, int lane, int e) {
    return VECTOR ? (it * 32 + lane) * VEC + e : it * 32 * VEC + e * 32 + lane;
}

template <bool VECTOR>
__device__ __forceinline__ void load8(const __half* s_row, int it, int lane, int n, float scale, float x[VEC]) {
    if (VECTOR) {
        const int j = column<true>(it, lane, 0);
        uint4 raw = make_uint4(0u, 0u, 0u, 0u);
        // j < n <= L and L % 8 == 0: the vector lies inside the row; columns >= n are masked below.
        if (j < n) raw = *reinterpret_cast<const uint4*>(s_row + j);
        const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int e = 0; e < VEC; e += 2) {
            const float2 t = __half22float2(*reinterpret_cast<const __half2*>(&w[e / 2]));
            x[e] = j + e < n ? t.x * scale : ATTN_NEG_INF;
            x[e + 1] = j + e + 1 < n ? t.y * scale : ATTN_NEG_INF;
        }
    } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            const int j = column<false>(it, lane, e);
            x[e] = j < n ? __half2float(s_row[j]) * scale : ATTN_NEG_INF;
        }
    }
}

template <bool VECTOR>
__device__ __forceinline__ void softmax_row(__half* __restrict__ s_row, int L, int n, float scale, int lane) {
    // Pass 1: this lane's online max and sum over its columns < n.
    float m = ATTN_NEG_INF, l = 0.f;
    for (int it = 0; it * 32 * VEC < n; ++it) {
        float x[VEC];
        load8<VECTOR>(s_row, it, lane, n, scale, x);
        float step_max = ATTN_NEG_INF;
#pragma unroll
        for (int e = 0; e < VEC; ++e) step_max = fmaxf(step_max, x[e]);
        const float m_new = fmaxf(m, step_max);
        l *= attn::safe_exp_diff(m, m_new);
#pragma unroll
        for (int e = 0; e < VEC; ++e) l += attn::safe_exp_diff(x[e], m_new);  // -inf columns: 0
        m = m_new;
    }
    // Merge the 32 lanes: the row max, then each lane's sum rescaled to it. Column 0 is always
    // visible, so M is finite; a lane that saw no column has l = 0 and adds 0.
    const float row_max = attn::warp_max(m);
    const float row_sum = attn::warp_sum(l * attn::safe_exp_diff(m, row_max));
    const float inv_sum = 1.f / row_sum;  // row_sum >= 1: the max contributes exp(0)

    // Pass 2: write P over S, every column of the row (masked ones as 0).
    for (int it = 0; it * 32 * VEC < L; ++it) {
        float x[VEC];
        load8<VECTOR>(s_row, it, lane, n, scale, x);
        float p[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) p[e] = attn::safe_exp_diff(x[e], row_max) * inv_sum;
        if (VECTOR) {
            const int j = column<true>(it, lane, 0);
            if (j < L) {  // L % 8 == 0: the vector is all in or all out
                uint4 raw;
                __half2* h = reinterpret_cast<__half2*>(&raw);
#pragma unroll
                for (int e = 0; e < VEC; e += 2) h[e / 2] = __floats2half2_rn(p[e], p[e + 1]);
                *reinterpret_cast<uint4*>(s_row + j) = raw;
            }
        } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const int j = column<false>(it, lane, e);
                if (j < L) s_row[j] = __float2half(p[e]);
            }
        }
    }
}
}  // namespace

extern "C" __global__ void __launch_bounds__(WARPS * 32)
attn_softmax_04_rows(__half* __restrict__ s, int L, float scale, int causal) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * WARPS + threadIdx.x / 32;
    if (row >= L) return;  // a whole warp leaves together: no butterfly is left half-done
    __half* s_row = s + (static_cast<long long>(blockIdx.y) * L + row) * L;
    const int n = causal ? row + 1 : L;  // columns this row sees; the rest of P is 0
    if (L % VEC == 0)
        softmax_row<true>(s_row, L, n, scale, lane);
    else
        softmax_row<false>(s_row, L, n, scale, lane);
}
