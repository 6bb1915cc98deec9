// Exercise ch02-pad-q-tile (chapter 2, kernels/02_block_tiling.cu): pad a shared tile off one bank.
//
// Shared memory is 32 banks of 4 bytes: byte address a lives in bank (a / 4) % 32. A warp's
// request is served in as many wavefronts as the largest number of DISTINCT 4-byte words it needs
// from any one bank (lanes reading the same word share it). Ideal: one wavefront per request.
//
// This kernel keeps the block's 128 rows of Q transposed in shared memory, q_s[d * Q_STRIDE + r]
// (element d of row r), so that in the score loop the 32 threads of a warp, reading element d of
// their 32 consecutive rows, read 32 consecutive halves: conflict-free. The price is paid when
// the tile is filled: Q is read from global memory row by row (coalesced), so the 32 lanes of a
// warp hold 32 consecutive elements d, d + 1, ..., d + 31 of ONE row r and store them Q_STRIDE
// halves apart. With Q_STRIDE = ROWS = 128 halves = 256 bytes, all 32 stores hit the same bank:
// 32 wavefronts for one request.
//
// Your task: choose Q_STRIDE (>= ROWS, 1 line) so that both the transposing stores and the reads
// are conflict-free, for every D this kernel takes. Mind that an element is 2 bytes, a bank 4.
//
// Check (no GPU needed; the CPU executor counts the wavefronts of every shared access):
//   python -m attnlab exercises check ch02-pad-q-tile exercises/ch02-pad-q-tile.cu
#include "common.cuh"

namespace {
constexpr int ROWS = 128;           // query rows per block, one thread each
constexpr int KEYS = 32;            // keys per K/V tile in shared memory
constexpr int MAX_D = 64;           // (the chapter's kernel takes up to 128)
constexpr int KEY_CHUNK = 8;        // scores in registers per rescale of acc
// ---- TODO(exercise): the stride of q_s, in halves, between column d and column d + 1 ---------
// Find the bank of the store of lane d (d = 0..31, one row r): word (d * Q_STRIDE + r) / 2, bank
// that % 32. Make the 32 words fall into 32 different banks.
constexpr int Q_STRIDE = ROWS + 2;  // 65 words per column: column d starts in bank d
// ---- end of exercise ------------------------------------------------------------------------
}

// Launch: block (ROWS,), grid (ceil(L / ROWS), B*H); q, k, v, o are [B*H, L, D] fp16.
extern "C" __global__ void __launch_bounds__(ROWS)
attn_ex02_block_tiling(const __half* __restrict__ q, const __half* __restrict__ k,
                       const __half* __restrict__ v, __half* __restrict__ o,
                       int L, int D, float scale, int causal) {
    __shared__ __half q_s[MAX_D * Q_STRIDE];  // [D][Q_STRIDE]: column d of the block's rows
    __shared__ __half k_s[KEYS * MAX_D];      // [KEYS][D] row-major
    __shared__ __half v_s[KEYS * MAX_D];

    const int bh = blockIdx.y;
    const int row0 = blockIdx.x * ROWS;
    const int row = row0 + threadIdx.x;
    const long long base = attn::head_offset(bh, L, D);
    const bool active = row < L;
    const int rows_here = min(ROWS, L - row0);

    // The block's rows of Q are one contiguous [rows_here, D] slab: read it coalesced, store it
    // transposed (element d of row r at q_s[d * Q_STRIDE + r]).
    const __half* q_tile = q + base + (long long)row0 * D;
    for (int i = threadIdx.x; i < ROWS * D; i += ROWS) {
        const int r = i / D, d = i - r * D;
        q_s[d * Q_STRIDE + r] = r < rows_here ? q_tile[i] : __float2half(0.f);
    }

    float acc[MAX_D];
#pragma unroll
    for (int d = 0; d < MAX_D; ++d) acc[d] = 0.f;
    float m = ATTN_NEG_INF;  // running max of the scaled scores
    float l = 0.f;           // running sum of exp(score - m)

    // Causal: row i sees keys 0..i, so the block needs keys up to its last row only.
    // Inactive threads (row >= L) see no key but still load tiles (and meet every barrier).
    const int n_keys = !active ? 0 : (causal ? row + 1 : L);
    const int block_keys = causal ? min(L, row0 + ROWS) : L;
    for (int j0 = 0; j0 < block_keys; j0 += KEYS) {
        const int tile_keys = min(KEYS, block_keys - j0);

        __syncthreads();  // every row is done with the previous tile before it is overwritten
        const long long tile = base + (long long)j0 * D;
        for (int i = threadIdx.x; i < tile_keys * D; i += ROWS) {
            k_s[i] = k[tile + i];
            v_s[i] = v[tile + i];
        }
        __syncthreads();  // the tile (and, the first time, q_s) is complete

        const int n = min(KEYS, n_keys - j0);  // this row's keys in the tile (<= 0: none)
        for (int c0 = 0; c0 < n; c0 += KEY_CHUNK) {
            float s[KEY_CHUNK];
            float chunk_max = ATTN_NEG_INF;
#pragma unroll
            for (int jj = 0; jj < KEY_CHUNK; ++jj) {
                const int j = c0 + jj;
                float dot = 0.f;
                if (j < n) {
                    const __half* k_row = k_s + j * D;
                    for (int d = 0; d < D; ++d)
                        dot = fmaf(__half2float(q_s[d * Q_STRIDE + threadIdx.x]), __half2float(k_row[d]), dot);
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
                const int j = c0 + jj;
                if (j >= n) break;
                const float p = __expf(s[jj] - m_new);
                l += p;
                const __half* v_row = v_s + j * D;
#pragma unroll
                for (int d = 0; d < MAX_D; ++d)
                    if (d < D) acc[d] = fmaf(p, __half2float(v_row[d]), acc[d]);
            }
            m = m_new;
        }
    }

    if (!active) return;
    const float inv_l = 1.f / l;  // l >= 1: the row's max contributes exp(0)
    __half* o_row = o + base + (long long)row * D;
#pragma unroll
    for (int d = 0; d < MAX_D; ++d)
        if (d < D) o_row[d] = __float2half(acc[d] * inv_l);
}
