// Exercise ch05-score-tile (chapter 5, kernels/05_wmma.cu, kernels/wmma_tile.cuh): S = Q K^T with WMMA.
//
// Chapter 5 moves the two matrix products onto tensor cores with nvcuda::wmma: 16 x 16 x 16
// fp16 fragments, fp32 accumulators. A warp owns 16 query rows. For each key tile of BN keys it
// computes its 16 x BN block of scores S_w = Q_w K^T, stores S_w to shared memory (a fragment
// does not say which row each of its elements belongs to, so the softmax reads S_w from there),
// runs the online softmax over it, and adds P V to its output rows (wmma_tile.cuh does those).
//
// The operands, all in shared memory except Q_w, which the warp keeps in registers:
//   qf[kk]   Q_w's columns kk*16 .. kk*16 + 15 as matrix_a fragments (FragA), kk = 0 .. D/16 - 1
//   k_s      the K tile: BN keys, row-major, key j's D halves at k_s + j * T::KV_LD (KV_LD = D + 8:
//            each row padded by 16 bytes)
//   s_w      this warp's 16 x BN fp32 scores, row-major, row stride T::S_LD (BN + 4)
// The fragment types (wmma_tile.cuh): FragA, FragBRow (matrix_b, row_major), FragBCol
// (matrix_b, col_major), FragC (accumulator, float). wmma::load_matrix_sync(frag, ptr, ldm) reads
// a 16 x 16 block at ptr whose rows (row_major) or columns (col_major) are ldm elements apart.
// K^T's element (d, j) is K[j][d] = k_s[j * KV_LD + d]: which layout and ldm is that?
//
// Your task: write scores_tile (about 8 lines): for each block of 16 keys, an accumulator set to
// zero, D / 16 wmma::mma_sync steps, and one wmma::store_matrix_sync into s_w.
// The executor draws a random element-to-lane layout for every fragment at every launch, as the
// CUDA documentation allows: code that assumes one fails.
//
// Check (no GPU needed; the CPU executor runs this file at several shapes, causal and not):
//   python -m attnlab exercises check ch05-score-tile exercises/ch05-score-tile.cu
#include "wmma_tile.cuh"

namespace {

using namespace attn::wm;

constexpr int D = 64;        // head dim (the chapter's kernel also takes 128)
constexpr int BLOCK_N = 64;  // keys per tile
constexpr int THREADS = COMPUTE_WARPS * 32;  // 128: four warps of 16 query rows
using T = Tiles<D, BLOCK_N>;

// ---- TODO(exercise): S_w = Q_w K^T for this warp's 16 rows and the tile's BN keys ----------------
// For each j = 0 .. BN/16 - 1 (keys j*16 .. j*16 + 15): S_w[:, j*16 .. j*16 + 15] = sum over kk of
// qf[kk] times the 16 x 16 block of K^T at (rows kk*16.., columns j*16..); store it at s_w + j*16.
template <int D, int BN>
__device__ __forceinline__ void scores_tile(const FragA (&qf)[D / MMA], const __half* k_s, float* s_w) {
    using T = Tiles<D, BN>;
#pragma unroll
    for (int j = 0; j < BN / MMA; ++j) {
        FragC acc;
        wmma::fill_fragment(acc, 0.f);
#pragma unroll
        for (int kk = 0; kk < D / MMA; ++kk) {
            FragBCol kf;  // K^T block (kk, j): column j' of it is key j*16 + j', D halves in a row
            wmma::load_matrix_sync(kf, k_s + j * MMA * T::KV_LD + kk * MMA, T::KV_LD);
            wmma::mma_sync(acc, qf[kk], kf, acc);
        }
        wmma::store_matrix_sync(s_w + j * MMA, acc, T::S_LD, wmma::mem_row_major);
    }
}
// ---- end of exercise ---------------------------------------------------------------------------

// Rows [row0, row0 + BLOCK_N) of one head's K or V into a padded tile, zeros past L.
__device__ __forceinline__ void load_tile(__half* dst, const __half* head, int row0, int L) {
    constexpr int CHUNKS_PER_ROW = D / 8;
    for (int c = threadIdx.x; c < BLOCK_N * CHUNKS_PER_ROW; c += THREADS) {
        const int r = c / CHUNKS_PER_ROW, col = (c % CHUNKS_PER_ROW) * 8;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (row0 + r < L) val = *reinterpret_cast<const uint4*>(head + (long long)(row0 + r) * D + col);
        *reinterpret_cast<uint4*>(dst + r * T::KV_LD + col) = val;
    }
}

}  // namespace

// Launch: block (128,), grid (ceil(L / 64), B*H), dynamic shared memory 62464 bytes (K, V, S, P, O
// tiles: wmma_tile.cuh). D = 64.
extern "C" __global__ void __launch_bounds__(THREADS)
attn_ex05_wmma(const __half* __restrict__ q, const __half* __restrict__ k, const __half* __restrict__ v,
               __half* __restrict__ o, int L, int D_, float scale, int causal) {
    extern __shared__ __align__(128) unsigned char smem[];
    __half* k_s = reinterpret_cast<__half*>(smem);
    __half* v_s = reinterpret_cast<__half*>(smem + T::KV_TILE_BYTES);
    float* s_s = reinterpret_cast<float*>(smem + 2 * T::KV_TILE_BYTES);
    __half* p_s = reinterpret_cast<__half*>(smem + 2 * T::KV_TILE_BYTES + T::S_BYTES);
    float* o_s = reinterpret_cast<float*>(smem + 2 * T::KV_TILE_BYTES + T::S_BYTES + T::P_BYTES);

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int q0 = blockIdx.x * BLOCK_M;
    const int row0 = q0 + warp * WARP_M;  // this warp's first query row
    const long long base = attn::head_offset(blockIdx.y, L, D);
    float* s_w = s_s + warp * WARP_M * T::S_LD;
    __half* p_w = p_s + warp * WARP_M * T::P_LD;
    float* o_w = o_s + warp * WARP_M * T::O_LD;

    FragA qf[D / MMA];
    load_q_fragments<D>(qf, q + base, row0, L, o_w, lane);

    const int my_row = row0 + (lane >> 1);  // lanes 2r, 2r+1 own row row0 + r in the softmax
    const int key_limit = causal ? min(L, my_row + 1) : L;
    float m = ATTN_NEG_INF, l = 0.f;

    const int n_tiles = num_key_tiles(L, q0, causal != 0, BLOCK_N);
    for (int t = 0; t < n_tiles; ++t) {
        const int kv0 = t * BLOCK_N;
        __syncthreads();  // every warp is done reading the previous K and V tiles
        load_tile(k_s, k + base, kv0, L);
        load_tile(v_s, v + base, kv0, L);
        __syncthreads();  // the new tiles are complete
        scores_tile<D, BLOCK_N>(qf, k_s, s_w);
        __syncwarp();     // S_w stored by the whole warp before lanes read rows of it
        warp_online_softmax<D, BLOCK_N>(s_w, p_w, o_w, m, l, kv0, key_limit, scale, lane);
        __syncwarp();     // P_w and the rescaled O_w written before the fragment loads
        warp_pv<D, BLOCK_N>(p_w, v_s, o_w);
    }
    __syncwarp();
    warp_write_output<D>(o_w, l, o + base, row0, L, lane);
}
