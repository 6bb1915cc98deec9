// Exercise ch01-online-softmax (chapter 1, kernels/01_scalar.cu): the online softmax's rescale.
//
// One thread owns one query row. It walks the keys in chunks of KEY_CHUNK, computes the chunk's
// scores s[jj] = scale * q.k_j in fp32, and folds them into its running state:
//   m       the largest score seen so far (-inf before the first chunk)
//   l       sum over the keys seen of exp(score - m)
//   acc[d]  sum over the keys seen of exp(score - m) * v[key][d]
// so that after the last key o[d] = acc[d] / l: one pass over K and V, no L x L matrix. The catch:
// m moves. When a chunk holds a larger score, every term summed so far was taken against the old
// m and must be multiplied by exp(m_old - m_new) before the new terms join it.
//
// Your task: write that step, between the chunk's scores and the loop that adds them (4 lines).
//
// Check (no GPU needed; the CPU executor runs this file at several shapes, causal and not):
//   python -m attnlab exercises check ch01-online-softmax exercises/ch01-online-softmax.cu
#include "common.cuh"

namespace {
constexpr int THREADS = 128;  // query rows per block, one thread each
constexpr int MAX_D = 64;     // (the chapter's kernel takes up to 128)
constexpr int KEY_CHUNK = 8;  // scores held in registers per rescale
}

// Launch: block (THREADS,), grid (ceil(L / THREADS), B*H); q, k, v, o are [B*H, L, D] fp16.
extern "C" __global__ void __launch_bounds__(THREADS)
attn_ex01_scalar(const __half* __restrict__ q, const __half* __restrict__ k,
                 const __half* __restrict__ v, __half* __restrict__ o,
                 int L, int D, float scale, int causal) {
    __shared__ __half q_s[MAX_D * THREADS];  // column-major: element d of this thread's row at d * THREADS

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

    // Causal: row i sees keys 0..i. Inactive threads see none.
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

        // ---- TODO(exercise): fold this chunk into the running softmax ---------------------------
        // Set m_new to the running max including this chunk (chunk_max is the chunk's own), and
        // move l and acc[0 .. D) from the old max m to m_new: multiply each by exp(m - m_new).
        // Before the first chunk m is -inf; attn::safe_exp_diff(x, m) (common.cuh) is exp(x - m)
        // that stays 0 when both are -inf. The loop below then adds p = exp(s - m_new) to l and
        // p * v to acc, and sets m = m_new.
        const float m_new = chunk_max;  // placeholder: forgets the earlier chunks' max, rescales nothing
        // ---- end of exercise ---------------------------------------------------------------------

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
