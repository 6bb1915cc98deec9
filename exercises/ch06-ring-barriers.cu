// Exercise ch06-ring-barriers (chapter 6, kernels/06_warp_specialized.cu): a producer/consumer ring.
//
// Chapter 6 splits the block by role. One producer warp copies K/V tiles from global to shared
// memory with cp.async into a ring of STAGES buffers (tile t goes to stage t % STAGES); four
// consumer warps (64 query rows) only compute, exactly as chapter 5 does (wmma_tile.cuh). The two
// sides never meet at __syncthreads: they hand stages to each other through NAMED barriers,
//   bar_sync(id, count)    wait until `count` threads have arrived at barrier `id` (this one too)
//   bar_arrive(id, count)  count this thread towards barrier `id` and go on without waiting
// (kernels/ptx.cuh; id 1..15, 0 is __syncthreads; count a multiple of 32). A phase of a barrier
// completes when `count` threads, counting the arrivers and the waiters, have reached it; every
// thread of one phase must pass the same count. Memory accesses made before a bar_arrive are
// visible to the bar_sync-ers of the same phase after they wake. Each stage s needs two barriers:
//   FULL[s]   the producer announces "tile t has landed in stage s"; consumers wait for it
//   EMPTY[s]  the consumers announce "we are done reading stage s"; the producer waits for it
//             before copying tile t + STAGES over it
// The block has THREADS = 160 threads: CONSUMER_THREADS = 128, then PRODUCER_THREADS = 32.
//
// Your task: write the four hand-off functions (one line each): which barrier, bar_sync or
// bar_arrive, and which count. full_bar and empty_bar give each barrier its id (change them if you
// like). The producer and consumer loops are given and call the hand-offs at the right places; a
// consumer releases a stage only when the producer will refill it (a phase that no one ever waits
// for would be left open when the block exits).
//
// Check (no GPU needed; the CPU executor reports deadlocks, barrier count mismatches, races and
// reads of cp.async data before its wait):
//   python -m attnlab exercises check ch06-ring-barriers exercises/ch06-ring-barriers.cu
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

// ---- TODO(exercise): the ring's four hand-offs, for stage s (0 .. STAGES-1) ----------------------
// attn::bar_sync(id, count) waits; attn::bar_arrive(id, count) signals. The ids of FULL[s] and
// EMPTY[s]: any 2 * STAGES different ids in 1..15.
__device__ __forceinline__ int full_bar(int s) { return 1 + s; }
__device__ __forceinline__ int empty_bar(int s) { return 1 + STAGES + s; }
// Producer, before copying a tile into stage s (not for the first STAGES tiles).
__device__ __forceinline__ void producer_acquire(int s) {}  // placeholder: the four do nothing yet
// Producer, once its own copies of the tile in stage s have landed (after its cp.async wait).
__device__ __forceinline__ void producer_publish(int s) {}
// Consumer, before reading stage s.
__device__ __forceinline__ void consumer_acquire(int s) {}
// Consumer, done reading stage s (only when the producer will refill it).
__device__ __forceinline__ void consumer_release(int s) {}
// ---- end of exercise ---------------------------------------------------------------------------

__device__ __forceinline__ __half* k_stage(unsigned char* ring, int s) {
    return reinterpret_cast<__half*>(ring + s * STAGE_BYTES);
}
__device__ __forceinline__ __half* v_stage(unsigned char* ring, int s) {
    return reinterpret_cast<__half*>(ring + s * STAGE_BYTES + T::KV_TILE_BYTES);
}

// The producer's copy of K and V rows [kv0, kv0 + BN) into one stage: 16-byte chunks, consecutive
// threads on consecutive chunks of a row, zero-filled past L (src_bytes = 0).
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
