// Chapter 5: WMMA, the first fused tensor-core kernel.
//
// What changed: chapter 4 ran Q K^T and P V as two cuBLAS GEMMs with the L x L scores in global
// memory between them. Here one block computes 64 query rows end to end, FlashAttention-2 style:
// it walks the key tiles, computes S = Q K^T and O += P V with nvcuda::wmma 16x16x16 fp16
// fragments accumulating in fp32 (tensor cores), and keeps the online softmax between them, so
// the scores never leave the chip. The tile math is in wmma_tile.cuh (shared with chapter 6):
// scores go through shared memory because a WMMA fragment does not say which row each element
// belongs to; O lives in shared memory as fp32 for the same reason (the per-row rescale).
//
// Per key tile (BLOCK_N = 64 keys):
//   __syncthreads; all 128 threads copy K and V rows [kv0, kv0 + 64) to shared memory with
//   16-byte loads (zeros past L); __syncthreads;
//   each warp: S_w = Q_w K^T (WMMA, Q_w in registers) -> smem; online softmax of its 16 rows
//   (fp32 max/sum, P -> fp16 in smem, O rows rescaled); O_w += P_w V (WMMA through smem).
// Causal: key tiles wholly above the diagonal are never visited (the loop ends at the block's
// diagonal tile); inside it, keys past a row's own index get -inf.
//
// Cost model (D = 64, one block, one key tile): 4 warps x 16 x 64 x 64 x 2 x 2 = 1.05 MFLOP on
// tensor cores; 16 KB from global memory (K and V); per warp about 40 KB of shared-memory traffic
// (the whole K and V tiles as fragments, S stored and read, P stored and read, O loaded and
// stored, and rescaled when a row's max moves) for 0.26 MFLOP. That is ~6.5 FLOP per shared
// byte, below the ~8 an Ada SM needs to keep its tensor cores busy (~1024 FLOP/clk against
// 128 B/clk of shared memory). Worse, nothing overlaps: the global loads of a tile wait for the
// math of the previous one (two block barriers per tile), and at 61 KB (D = 64) or 93 KB
// (D = 128) of shared memory only one block of 4 warps fits on an L4 SM, too few warps to hide
// the latency. At the mission shape (1, 8, 512, 64) the grid is 8 x 8 = 64 blocks for 58 SMs: a
// second wave of 6 blocks. Predict a large jump over chapters 1-4, still well short of SDPA:
// bounded by shared-memory round trips, stalls and a small grid.
//
// Launch: block (128,), grid (ceil(L / 64), B*H); dynamic shared memory
//   2 * 64 * (D + 8) * 2 (K, V) + 64 * 68 * 4 (S) + 64 * 72 * 2 (P) + 64 * (D + 4) * 4 (O)
//   = 62464 B at D = 64, 95232 B at D = 128: both above the 48 KB default, so the launcher opts in
//   (cudaFuncAttributeMaxDynamicSharedMemorySize); within the L4's 99 KB per block.
// Limits: D = 64 or 128 (one entry dispatches to a template instance per D); any L >= 1; q, k, v,
// o 16-byte aligned (16-byte vector loads and stores).
#include "wmma_tile.cuh"

namespace {

using namespace attn::wm;

constexpr int THREADS = COMPUTE_WARPS * 32;  // 128: four warps of 16 query rows
#ifdef ATTN05_BLOCK_N  // chapter 8's search (src/attnlab/gpu/search.py); without it, the chapter's value
constexpr int BLOCK_N = ATTN05_BLOCK_N;
#else
constexpr int BLOCK_N = 64;                  // keys per tile
#endif

template <int D>
constexpr int smem_bytes() {
    return 2 * Tiles<D, BLOCK_N>::KV_TILE_BYTES + Tiles<D, BLOCK_N>::WORK_BYTES;
}
// src/attnlab/kernels/chapters/ch05_wmma.py computes the same numbers from this file's constants; a searched
// configuration's sizes come from the registry's KernelSpec.with_config.
#if !defined(ATTN_WMMA_BLOCK_M) && !defined(ATTN05_BLOCK_N)
static_assert(smem_bytes<64>() == 62464, "dynamic smem at D = 64");
static_assert(smem_bytes<128>() == 95232, "dynamic smem at D = 128");
#endif

// Rows [row0, row0 + BLOCK_N) of one head's K or V into a padded tile, zeros past L; 16 bytes
// per thread per step, consecutive threads on consecutive chunks of a row (coalesced).
template <int D>
__device__ __forceinline__ void load_tile(__half* dst, const __half* head, int row0, int L) {
    constexpr int CHUNKS_PER_ROW = D / 8;
    constexpr int LD = Tiles<D, BLOCK_N>::KV_LD;
    for (int c = threadIdx.x; c < BLOCK_N * CHUNKS_PER_ROW; c += THREADS) {
        const int r = c / CHUNKS_PER_ROW, col = (c % CHUNKS_PER_ROW) * 8;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (row0 + r < L) val = *reinterpret_cast<const uint4*>(head + (long long)(row0 + r) * D + col);
        *reinterpret_cast<uint4*>(dst + r * LD + col) = val;
    }
}

template <int D>
__device__ __forceinline__ void forward(const __half* __restrict__ q, const __half* __restrict__ k,
                                        const __half* __restrict__ v, __half* __restrict__ o,
                                        int L, float scale, bool causal, unsigned char* smem) {
    using T = Tiles<D, BLOCK_N>;
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

    // Lanes 2r, 2r+1 own row row0 + r: keys below key_limit are visible to it.
    const int my_row = row0 + (lane >> 1);
    const int key_limit = causal ? min(L, my_row + 1) : L;
    float m = ATTN_NEG_INF, l = 0.f;

    const int n_tiles = num_key_tiles(L, q0, causal, BLOCK_N);  // the same in every thread
    for (int t = 0; t < n_tiles; ++t) {
        const int kv0 = t * BLOCK_N;
        __syncthreads();  // every warp is done reading the previous K and V tiles
        load_tile<D>(k_s, k + base, kv0, L);
        load_tile<D>(v_s, v + base, kv0, L);
        __syncthreads();  // the new tiles are complete
        warp_scores<D, BLOCK_N>(qf, k_s, s_w);
        __syncwarp();     // S_w stored by the whole warp before lanes read rows of it
        warp_online_softmax<D, BLOCK_N>(s_w, p_w, o_w, m, l, kv0, key_limit, scale, lane);
        __syncwarp();     // P_w and the rescaled O_w written before the fragment loads
        warp_pv<D, BLOCK_N>(p_w, v_s, o_w);
    }
    __syncwarp();  // the last O_w stores before lanes read rows of it
    warp_write_output<D>(o_w, l, o + base, row0, L, lane);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS)
attn_fwd_05_wmma(const __half* __restrict__ q, const __half* __restrict__ k,
                 const __half* __restrict__ v, __half* __restrict__ o,
                 int L, int D, float scale, int causal) {
    extern __shared__ __align__(128) unsigned char smem[];
    // D is the same for the whole grid, so this branch never diverges. Any other D was refused
    // by the launcher; should one arrive anyway, nothing is written (the poisoned output fails).
    if (D == 64)
        forward<64>(q, k, v, o, L, scale, causal != 0, smem);
    else if (D == 128)
        forward<128>(q, k, v, o, L, scale, causal != 0, smem);
}
