// Exercise ch06-cp-async-tile (chapter 6, kernels/06_warp_specialized.cu): the producer's copy.
//
// Chapter 6 splits the block by role: four consumer warps compute (as chapter 5 does), one
// producer warp copies each K/V tile from global to shared memory into a ring of STAGES buffers,
// and named barriers hand the stages back and forth. The producer copies with cp.async:
//   attn::cp_async_16(dst, src, src_bytes)   (kernels/ptx.cuh)
// copies 16 bytes from global `src` to the shared address `dst` (a 32-bit shared address:
// attn::smem_u32(pointer)) without passing through registers, asynchronously: the data lands
// when the thread's attn::cp_async_wait<N>() says so, and the producer loop (given) commits each
// tile as one group and waits before it announces the tile. With src_bytes = 0 nothing is read and
// the 16 bytes are zero-filled: that is how a tile's rows past L become zeros (finite: 0 * V
// stays 0, and masked keys weigh 0) without a read past the end of K or V.
//
// A stage holds a K tile and then a V tile, each BN rows of D halves with row stride T::KV_LD
// (D + 8: padded by 16 bytes). A row is D / 8 chunks of 16 bytes. The 32 producer threads share
// the 2 * BN * (D / 8) chunks of a stage: thread ptid takes chunks ptid, ptid + 32, ..., and
// consecutive threads should take consecutive chunks of a row (coalesced global reads).
//
// Your task: write issue_tile (about 8 lines): for each of this thread's chunks, its matrix (K
// or V), row and column, and one cp_async_16, zero-filling the rows past L. Keep the source
// address inside the tensor even when nothing is read (a GPU may check it).
//
// Check (no GPU needed; the CPU executor reports reads past the end of K and V, shared memory
// read before anyone wrote it, and cp.async data read before its wait):
//   python -m attnlab exercises check ch06-cp-async-tile exercises/ch06-cp-async-tile.cu
#include "ptx.cuh"
#include "wmma_tile.cuh"

namespace {

using namespace attn::wm;

constexpr int D = 64;                                  // head dim (the chapter's kernel also takes 128)
constexpr int BN = 64;                                 // keys per tile
constexpr int STAGES = 2;                              // ring buffers
constexpr int CONSUMER_THREADS = COMPUTE_WARPS * 32;   // 128: four warps of 16 query rows
constexpr int PRODUCER_THREADS = 32;                   // one producer warp
constexpr int THREADS = CONSUMER_THREADS + PRODUCER_THREADS;
using T = Tiles<D, BN>;
constexpr int STAGE_BYTES = 2 * T::KV_TILE_BYTES;      // K tile, then V tile

// The ring's hand-offs (exercise ch06-ring-barriers): FULL[s] and EMPTY[s] per stage s.
__device__ __forceinline__ int full_bar(int s) { return 1 + s; }
__device__ __forceinline__ int empty_bar(int s) { return 1 + STAGES + s; }
// Producer, before copying a tile into stage s (not for the first STAGES tiles).
__device__ __forceinline__ void producer_acquire(int s) { attn::bar_sync(empty_bar(s), THREADS); }
// Producer, once its own copies of the tile in stage s have landed (after its cp.async wait).
__device__ __forceinline__ void producer_publish(int s) { attn::bar_arrive(full_bar(s), THREADS); }
// Consumer, before reading stage s.
__device__ __forceinline__ void consumer_acquire(int s) { attn::bar_sync(full_bar(s), THREADS); }
// Consumer, done reading stage s (only when the producer will refill it).
__device__ __forceinline__ void consumer_release(int s) { attn::bar_arrive(empty_bar(s), THREADS); }

__device__ __forceinline__ __half* k_stage(unsigned char* ring, int s) {
    return reinterpret_cast<__half*>(ring + s * STAGE_BYTES);
}
__device__ __forceinline__ __half* v_stage(unsigned char* ring, int s) {
    return reinterpret_cast<__half*>(ring + s * STAGE_BYTES + T::KV_TILE_BYTES);
}

// ---- TODO(exercise): the producer's copy of K and V rows [kv0, kv0 + BN) into one stage -----------
// k_dst, v_dst: the stage's K and V tiles (row r at + r * T::KV_LD); k_head, v_head: this head's
// [L, D] K and V in global memory; ptid: this producer thread, 0..31. Chunk c of the stage's
// 2 * BN * (D / 8): K for c < BN * D / 8, V after; row and column from the rest. One cp_async_16 per
// chunk, src_bytes 16 for rows < L and 0 (zero-fill, source kept in bounds) past it.
__device__ __forceinline__ void issue_tile(__half* k_dst, __half* v_dst, const __half* k_head,
                                           const __half* v_head, int kv0, int L, int ptid) {
    constexpr int CHUNKS_PER_ROW = D / 8;
    constexpr int CHUNKS = BN * CHUNKS_PER_ROW;  // per matrix
    for (int c = ptid; c < 2 * CHUNKS; c += PRODUCER_THREADS) {
        const bool is_v = c >= CHUNKS;
        const int cc = is_v ? c - CHUNKS : c;
        const int r = cc / CHUNKS_PER_ROW, col = (cc % CHUNKS_PER_ROW) * 8;
        const bool valid = kv0 + r < L;
        const __half* src = (is_v ? v_head : k_head) + (valid ? (long long)(kv0 + r) * D + col : 0);
        attn::cp_async_16(attn::smem_u32((is_v ? v_dst : k_dst) + r * T::KV_LD + col), src, valid ? 16 : 0);
    }
}
// ---- end of exercise ---------------------------------------------------------------------------

// Step t issues tile t (while t < n_tiles) as one cp.async group and publishes tile t - LAG, which
// has landed once at most LAG newer groups are pending. Past the last tile it commits empty groups,
// so that "wait_group LAG" keeps meaning "the tile LAG steps ago has landed".
__device__ __forceinline__ void produce(unsigned char* ring, const __half* k_head, const __half* v_head,
                                        int L, int n_tiles) {
    constexpr int LAG = STAGES - 1;
    const int ptid = threadIdx.x - CONSUMER_THREADS;
    for (int t0 = 0; t0 < n_tiles + LAG; t0 += STAGES) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {  // step t = t0 + s: tile t goes to stage s
            const int t = t0 + s;
            if (t >= n_tiles + LAG) break;
            if (t < n_tiles) {
                if (t >= STAGES) producer_acquire(s);  // tile t - STAGES released
                issue_tile(k_stage(ring, s), v_stage(ring, s), k_head, v_head, t * BN, L, ptid);
            }
            attn::cp_async_commit();
            if (t >= LAG) {
                attn::cp_async_wait<LAG>();                         // this thread's part of tile t - LAG
                producer_publish((s + STAGES - LAG) % STAGES);     // tile t - LAG is in its stage
            }
        }
    }
}

}  // namespace

// Launch: block (160,) (4 consumer warps, then 1 producer warp), grid (ceil(L / 64), B*H),
// dynamic shared memory 80896 bytes (two K/V stages, S, P, O: wmma_tile.cuh). D = 64.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
attn_ex06_ring(const __half* __restrict__ q, const __half* __restrict__ k, const __half* __restrict__ v,
               __half* __restrict__ o, int L, int D_, float scale, int causal) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* ring = smem;
    unsigned char* work = smem + STAGES * STAGE_BYTES;
    float* s_s = reinterpret_cast<float*>(work);
    __half* p_s = reinterpret_cast<__half*>(work + T::S_BYTES);
    float* o_s = reinterpret_cast<float*>(work + T::S_BYTES + T::P_BYTES);

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int q0 = blockIdx.x * BLOCK_M;
    const long long base = attn::head_offset(blockIdx.y, L, D);
    const int n_tiles = num_key_tiles(L, q0, causal != 0, BN);  // both roles: the same number

    if (warp >= COMPUTE_WARPS) {  // warp-uniform: whole warps take one role
        produce(ring, k + base, v + base, L, n_tiles);
        return;
    }

    const int row0 = q0 + warp * WARP_M;
    float* s_w = s_s + warp * WARP_M * T::S_LD;
    __half* p_w = p_s + warp * WARP_M * T::P_LD;
    float* o_w = o_s + warp * WARP_M * T::O_LD;
    FragA qf[D / MMA];
    load_q_fragments<D>(qf, q + base, row0, L, o_w, lane);

    const int my_row = row0 + (lane >> 1);
    const int key_limit = causal ? min(L, my_row + 1) : L;
    float m = ATTN_NEG_INF, l = 0.f;

    for (int t0 = 0; t0 < n_tiles; t0 += STAGES) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {  // tile t = t0 + s, in stage s
            const int t = t0 + s;
            if (t >= n_tiles) break;
            consumer_acquire(s);  // tile t has landed in stage s
            warp_scores<D, BN>(qf, k_stage(ring, s), s_w);
            __syncwarp();
            warp_online_softmax<D, BN>(s_w, p_w, o_w, m, l, t * BN, key_limit, scale, lane);
            __syncwarp();
            warp_pv<D, BN>(p_w, v_stage(ring, s), o_w);
            if (t + STAGES < n_tiles) consumer_release(s);  // stage s may be refilled
        }
    }
    __syncwarp();
    warp_write_output<D>(o_w, l, o + base, row0, L, lane);
}
