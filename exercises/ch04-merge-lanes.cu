// Exercise ch04-merge-lanes (chapter 4, kernels/04_row_softmax.cu): merge 32 online softmaxes.
//
// Chapter 4's row softmax gives one row of the L x L score matrix S to one warp. Pass 1 reads the
// row once: each lane folds its own columns (8 per step, 256 columns per warp step) into its own
// online pair, as chapter 1 does per thread:
//   m  the largest scaled score among this lane's columns (-inf if it has none)
//   l  the sum over this lane's columns of exp(x - m)
// Pass 2 reads the row again and writes p = exp(x - M) / sum over it, where M is the row's max and
// sum = the sum over the whole row of exp(x - M). Between the two passes the 32 lanes must agree
// on M and sum, and every lane needs both. A lane's l was taken against its own m, not against M.
//
// Your task: compute row_max and row_sum from the 32 lanes' (m, l) (2 lines), with
// attn::warp_max(value) and attn::warp_sum(value) from common.cuh (butterflies over the warp:
// every lane gets the result) and attn::safe_exp_diff(x, m) = exp(x - m), 0 when both are -inf.
//
// Check (no GPU needed; S and P V are computed in PyTorch, this kernel on the CPU executor):
//   python -m attnlab exercises check ch04-merge-lanes exercises/ch04-merge-lanes.cu
#include "common.cuh"

namespace {
constexpr int WARPS = 4;  // rows per block
constexpr int VEC = 8;    // elements per lane per step

// Column of element e (0..7) of lane `lane`'s step `it`; either way a step covers it*256 .. +255.
template <bool VECTOR>
__device__ __forceinline__ int column(int it, int lane, int e) {
    return VECTOR ? (it * 32 + lane) * VEC + e : it * 32 * VEC + e * 32 + lane;
}

// x[e] = scale * S[row, column(it, lane, e)] in fp32 for the n visible columns, -inf elsewhere.
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
    // Pass 1: this lane's online max and sum over its columns.
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
    // ---- TODO(exercise): merge the 32 lanes' (m, l) -----------------------------------------------
    // row_max: the largest of the 32 m. row_sum: the sum over the whole row of exp(x - row_max),
    // from the 32 l (each summed against its own lane's m). Column 0 is visible to every row, so
    // row_max is finite; a lane that saw no column has m = -inf and l = 0.
    const float row_max = m;  // placeholder: this lane's own max and sum
    const float row_sum = l;
    // ---- end of exercise -------------------------------------------------------------------------
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

// Launch: block (WARPS * 32,), grid (ceil(L / WARPS), B*H); s is [B*H, L, L] fp16, P written over it.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
attn_ex04_softmax(__half* __restrict__ s, int L, float scale, int causal) {
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
