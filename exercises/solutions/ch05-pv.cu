// Exercise ch05-pv (chapter 5, kernels/05_wmma.cu, kernels/wmma_tile.cuh): O += P V with WMMA.
//
// Chapter 5 moves the two matrix products onto tensor cores with nvcuda::wmma: 16 x 16 x 16
// fp16 fragments, fp32 accumulators. A warp owns 16 query rows. For each key tile of BN keys it
// computes its scores S_w = Q_w K^T, runs the online softmax over them (P_w = exp(S - m) in fp16,
// and the rows of O_w multiplied by exp(m_old - m_new) when a row's max moved), then adds P_w V to
// O_w. O_w lives in shared memory in fp32, not in accumulator fragments, because that per-row
// rescale needs to know which row each element is in, and a fragment does not say.
//
// The operands, all in shared memory:
//   p_w   this warp's 16 x BN probabilities, fp16, row-major, row stride T::P_LD (BN + 8)
//   v_s   the V tile: BN keys x D, fp16, row-major, row stride T::KV_LD (D + 8)
//   o_w   this warp's 16 x D output rows, fp32, row-major, row stride T::O_LD (D + 4)
// The fragment types (wmma_tile.cuh): FragA (matrix_a, row_major), FragBRow (matrix_b,
// row_major), FragBCol (matrix_b, col_major), FragC (accumulator, float). load_matrix_sync and
// store_matrix_sync take an accumulator too, given its layout (wmma::mem_row_major).
//
// Your task: write accumulate_pv (about 10 lines): for each block of 16 output columns n, load
// O_w's 16 x 16 block into an accumulator, add P_w[:, kk*16..] times V's block (kk, n) for every
// kk = 0 .. BN/16 - 1, and store it back.
// The executor draws a random element-to-lane layout for every fragment at every launch, as the
// CUDA documentation allows: code that assumes one fails.
//
// Check (no GPU needed; the CPU executor runs this file at several shapes, causal and not):
//   python -m attnlab exercises check ch05-pv exercises/ch05-pv.cu
#include "wmma_tile.cuh"

namespace {

using namespace attn::wm;

constexpr int D = 64;        // head dim (the chapter's kernel also takes 128)
constexpr int BLOCK_N = 64;  // keys per tile
constexpr int THREADS = COMPUTE_WARPS * 32;  // 128: four warps of 16 query rows
using T = Tiles<D, BLOCK_N>;

// ---- TODO(exercise): O_w += P_w V for this warp's 16 rows ------------------------------------------
// O_w[:, n*16 .. n*16 + 15] += sum over kk of P_w[:, kk*16 .. kk*16 + 15] times V[kk*16 .., n*16 ..],
// for n = 0 .. D/16 - 1, with O_w read and written in place (fp32, row stride T::O_LD).
template <int D, int BN>
__device__ __forceinline__ void accumulate_pv(const __half* p_w, const __half* v_s, float* o_w) {
    using T = Tiles<D, BN>;
    FragA pf[BN / MMA];
#pragma unroll
    for (int kk = 0; kk < BN / MMA; ++kk) wmma::load_matrix_sync(pf[kk], p_w + kk * MMA, T::P_LD);
#pragma unroll
    for (int n = 0; n < D / MMA; ++n) {
        FragC acc;
        wmma::load_matrix_sync(acc, o_w + n * MMA, T::O_LD, wmma::mem_row_major);
#pragma unroll
        for (int kk = 0; kk < BN / MMA; ++kk) {
            FragBRow vf;  // V block (kk, n): rows are keys, row-major as stored
            wmma::load_matrix_sync(vf, v_s + kk * MMA * T::KV_LD + n * MMA, T::KV_LD);
            wmma::mma_sync(acc, pf[kk], vf, acc);
        }
        wmma::store_matrix_sync(o_w + n * MMA, acc, T::O_LD, wmma::mem_row_major);
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
        warp_scores<D, BLOCK_N>(qf, k_s, s_w);
        __syncwarp();     // S_w stored by the whole warp before lanes read rows of it
        warp_online_softmax<D, BLOCK_N>(s_w, p_w, o_w, m, l, kv0, key_limit, scale, lane);
        __syncwarp();     // P_w and the rescaled O_w written before the fragment loads
        accumulate_pv<D, BLOCK_N>(p_w, v_s, o_w);
    }
    __syncwarp();
    warp_write_output<D>(o_w, l, o + base, row0, L, lane);
}
