// Chapter 2: block tiling.
//
// What changed since chapter 1: the 128 rows of a block no longer read K and V from global
// memory one thread at a time. The block loads a tile of KEYS keys of K and V into shared memory
// with coalesced loads, waits at a barrier, and every row of the block then reads the tile from
// there: one load from global memory serves ROWS rows. Q is also loaded coalesced (chapter 1's
// threads each read their own row, D * 2 bytes apart). Each thread still owns one query row and
// runs chapter 1's chunked online softmax; its running max m, sum l and accumulator acc[D] carry
// from one tile to the next. Causal blocks stop at the tile holding their last row's diagonal:
// tiles entirely above the diagonal are never loaded.
//
// Global-memory traffic for K and V, per block of ROWS = 128 rows (non-causal):
//   chapter 1: each of the 4 warps loads every element of K and V itself, one half per
//              instruction (a broadcast to its 32 threads): 4 * 2 * L * D = 8 * L * D warp-wide
//              load instructions, each one 32-byte L1 sector request. Only L1 hits between the
//              4 warps keep the L2 traffic near one copy of K and V (2 * L * D * 2 bytes).
//   chapter 2: the block loads K and V once, 32 consecutive halves per warp instruction:
//              2 * L * D / 32 warp-wide instructions (128x fewer), 2 * L * D * 2 bytes from
//              L2 exactly, with no reliance on L1. At (1, 8, 512, 64): 262,144 -> 2,048 load
//              instructions per block, 32 blocks.
// Cost model: the 4 * L^2 * D FLOP are unchanged and still one fp32 FMA at a time; each FMA of
// q.k now reads both operands from shared memory (q_s, and k_s as a broadcast), each FMA of p.v
// one broadcast, each a 2-byte load followed by a half-to-fp32 conversion. About 1.5 shared loads
// per FMA keep the load/store unit as busy as chapter 1's loads did, so the saved global loads
// need not make it faster: the bottleneck is the number of scalar loads per FMA, which chapter 3
// attacks with 16-byte loads and lanes that split D.
//
// Launch: block (ROWS,), grid (ceil(L / ROWS), B*H), dynamic shared memory
//   (D * Q_STRIDE + 2 * KEYS * D) * 2 bytes (24,832 B at D = 64, 49,664 B at D = 128: above 48 KB
//   the launcher opts in).
// Limits: any L >= 1, 1 <= D <= MAX_D; causal needs Lq == Lk (they are the same L here).
#include "common.cuh"

namespace {
constexpr int ROWS = 128;           // query rows per block, one thread each (as chapter 1)
constexpr int KEYS = 32;            // keys per K/V tile in shared memory
constexpr int MAX_D = 128;
constexpr int KEY_CHUNK = 8;        // scores in registers per rescale of acc (as chapter 1)
constexpr int Q_STRIDE = ROWS + 2;  // padded column of the transposed Q tile, see below
static_assert(KEYS % KEY_CHUNK == 0, "a chunk never straddles two tiles");
}

extern "C" __global__ void __launch_bounds__(ROWS)
attn_fwd_02_block_tiling(const __half* __restrict__ q, const __half* __restrict__ k,
                         const __half* __restrict__ v, __half* __restrict__ o,
                         int L, int D, float scale, int causal) {
    // q_s [D][Q_STRIDE]: column-major as in chapter 1, so thread t reading element d of its row
    // touches consecutive halves. The 2-half pad makes column d start on bank d, so the
    // transposing stores below (consecutive threads, consecutive d) do not conflict either.
    // k_s, v_s [KEYS][D]: row-major; all threads read the same key at once (a broadcast).
    extern __shared__ __half smem[];
    __half* q_s = smem;
    __half* k_s = q_s + D * Q_STRIDE;
    __half* v_s = k_s + KEYS * D;

    const int bh = blockIdx.y;
    const int row0 = blockIdx.x * ROWS;
    const int row = row0 + threadIdx.x;
    const long long base = attn::head_offset(bh, L, D);
    const bool active = row < L;
    const int rows_here = min(ROWS, L - row0);

    // The block's rows of Q are one contiguous [rows_here, D] slab: read it coalesced.
    const __half* q_tile = q + base + (long long)row0 * D;
    for (int i = threadIdx.x; i < ROWS * D; i += ROWS) {
        const int r = i / D, d = i - r * D;
        q_s[d * Q_STRIDE + r] = r < rows_here ? q_tile[i] : __float2half(0.f);
    }
    // (The first barrier of the tile loop makes q_s visible to every thread.)

    float acc[MAX_D];
#pragma unroll
    for (int d = 0; d < MAX_D; ++d) acc[d] = 0.f;
    float m = ATTN_NEG_INF;  // running max of the scaled scores
    float l = 0.f;           // running sum of exp(score - m)

    // Causal: row i sees keys 0..i, so the block needs keys up to its last row only.
    // Inactive threads (row >= L) see no key but still load tiles and meet every barrier.
    const int n_keys = !active ? 0 : (causal ? row + 1 : L);
    const int block_keys = causal ? min(L, row0 + ROWS) : L;
    for (int j0 = 0; j0 < block_keys; j0 += KEYS) {
        const int tile_keys = min(KEYS, block_keys - j0);
        __syncthreads();  // every row is done with the previous tile before it is overwritten
        // K and V rows j0..j0+tile_keys-1 are contiguous too. Keys past tile_keys are never read.
        const long long tile = base + (long long)j0 * D;
        for (int i = threadIdx.x; i < tile_keys * D; i += ROWS) {
            k_s[i] = k[tile + i];
            v_s[i] = v[tile + i];
        }
        __syncthreads();  // the tile is complete

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
