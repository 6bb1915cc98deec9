// Exercise ch01-causal-limit (chapter 1, kernels/01_scalar.cu): how many keys a row sees.
//
// One thread owns one query row and walks keys 0, 1, ..., n_keys - 1 in chunks of KEY_CHUNK,
// folding their scores into its running softmax (m, l, acc[D]); keys past n_keys in the last
// chunk get the score -inf and are never read. Everything hangs on n_keys:
//   - non-causal, every row sees all L keys;
//   - causal, row i sees keys 0..i (the diagonal included), never a later one;
//   - the grid has ceil(L / THREADS) blocks of THREADS threads, so the last block has threads
//     whose row is past the end of the head (row >= L). They still run the kernel (they have no
//     barrier to meet here, but they exist); they must read no key at all.
//
// Your task: set n_keys (1 line, with all three cases right).
//
// Check (no GPU needed; the CPU executor runs this file at several shapes, causal and not):
//   python -m attnlab exercises check ch01-causal-limit exercises/ch01-causal-limit.cu
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

    // ---- TODO(exercise): the number of keys this thread's row sees ----------------------------
    // Keys 0 .. n_keys - 1 are read (k[base + j * D + d] for j < n_keys) and folded in. Think of
    // three threads: one whose row < L in a non-causal launch, one whose row < L in a causal
    // launch, and one whose row >= L (active is false).
    const int n_keys = L;  // placeholder: every thread reads every key
    // ---- end of exercise ---------------------------------------------------------------------
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
