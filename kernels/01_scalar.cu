// Chapter 1: the scalar baseline.
//
// One thread owns one query row. It walks every key of its head in chunks of KEY_CHUNK, computes
// the scores on CUDA cores in fp32, and folds them into its output row with the online softmax
// (running max m, running sum l, accumulator acc[D]): one pass over K and V, no L x L matrix.
//
// Cost model: each thread reads all of K and V (L*D*2*2 bytes) for its row; the 128 threads of a
// block read the same key at the same time, so loads are broadcasts served by L1. The work is
// 4*L*L*D FLOP on CUDA cores, one FMA at a time.
//
// Launch: block (THREADS,), grid (ceil(L / THREADS), B*H); no dynamic shared memory.
// Limits: any L >= 1, 1 <= D <= MAX_D; causal needs Lq == Lk (they are the same L here).
#include "common.cuh"

namespace {
constexpr int THREADS = 128;
constexpr int MAX_D = 128;
constexpr int KEY_CHUNK = 8;  // scores held in registers per rescale of acc (16 reaches 255 registers)
}

extern "C" __global__ void __launch_bounds__(THREADS)
attn_fwd_01_scalar(const __half* __restrict__ q, const __half* __restrict__ k,
                   const __half* __restrict__ v, __half* __restrict__ o,
                   int L, int D, float scale, int causal) {
    // The query row lives in shared memory, column-major so that a warp reading element d of its
    // 32 rows touches 32 consecutive halves: no bank conflicts. 128 x 128 x 2 B = 32 KB.
    __shared__ __half q_s[MAX_D * THREADS];

    const int bh = blockIdx.y;
    const int row = blockIdx.x * THREADS + threadIdx.x;
    const long long base = attn::head_offset(bh, L, D);
    const bool active = row < L;

    for (int d = 0; d < D; ++d)
        q_s[d * THREADS + threadIdx.x] = active ? q[base + (long long)row * D + d] : __float2half(0.f);

    float acc[MAX_D];
#pragma unroll
    for (int d = 0; d < MAX_D; ++d) acc[d] = 0.f;
    float m = ATTN_NEG_INF;  // running max of the scaled scores
    float l = 0.f;           // running sum of exp(score - m)

    // Causal: row i sees keys 0..i. Inactive threads stop at once; no barrier follows.
    const int n_keys = !active ? 0 : (causal ? row + 1 : L);
    for (int j0 = 0; j0 < n_keys; j0 += KEY_CHUNK) {
        float s[KEY_CHUNK];
        float chunk_max = ATTN_NEG_INF;
#pragma unroll
        for (int jj = 0; jj < KEY_CHUNK; ++jj) {
            const int j = j0 + jj;
            float dot = 0.f;
            if (j < n_keys) {
                const __half* k_row = k + base + (long long)j * D;
                for (int d = 0; d < D; ++d)
                    dot = fmaf(__half2float(q_s[d * THREADS + threadIdx.x]), __half2float(k_row[d]), dot);
                dot *= scale;
            } else {
                dot = ATTN_NEG_INF;  // past the end of this row's keys
            }
            s[jj] = dot;
            chunk_max = fmaxf(chunk_max, dot);
        }
        const float m_new = fmaxf(m, chunk_max);
        const float correction = attn::safe_exp_diff(m, m_new);
        l *= correction;
#pragma unroll
        for (int d = 0; d < MAX_D; ++d) acc[d] *= correction;
#pragma unroll
        for (int jj = 0; jj < KEY_CHUNK; ++jj) {
            const int j = j0 + jj;
            if (j >= n_keys) break;
            const float p = __expf(s[jj] - m_new);
            l += p;
            const __half* v_row = v + base + (long long)j * D;
#pragma unroll
            for (int d = 0; d < MAX_D; ++d)
                if (d < D) acc[d] = fmaf(p, __half2float(v_row[d]), acc[d]);
        }
        m = m_new;
    }

    if (!active) return;
    const float inv_l = 1.f / l;  // l >= 1: the row's max contributes exp(0)
    __half* o_row = o + base + (long long)row * D;
#pragma unroll
    for (int d = 0; d < MAX_D; ++d)
        if (d < D) o_row[d] = __float2half(acc[d] * inv_l);
}
