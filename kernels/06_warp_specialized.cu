// Chapter 6: warp specialization, a cp.async ring between producer and consumer warps.
//
// What changed since chapter 5: the math is the same (wmma_tile.cuh: S = Q K^T with WMMA, the
// online softmax through shared memory, O += P V with WMMA, O in shared memory), but the loads
// move to dedicated warps. PRODUCERS producer warps copy K/V tiles from global to shared memory
// with 16-byte cp.async (no registers on the way, zero-fill past L) into a ring of STAGES
// buffers; the 4 consumer warps (64 query rows) only compute. The two sides meet at named
// barriers instead of __syncthreads, so a tile's copy can overlap the math of earlier tiles.
//
// The hand-off, per ring stage s (tile t lives in stage t % STAGES):
//   FULL[s]  (barrier 1 + s):          producers bar.arrive once tile t has landed in stage s;
//                                      consumers bar.sync before reading it.
//   EMPTY[s] (barrier 1 + STAGES + s): consumers bar.arrive when done with tile t; producers
//                                      bar.sync before copying tile t + STAGES over it.
// Each phase of each barrier counts every thread of the block once (BARRIER_THREADS): the side
// that waits uses bar.sync, the side that signals bar.arrive. This is the PTX ISA's own
// producer/consumer pattern: a bar.arrive synchronizes with a bar.sync on the same barrier, and
// when the barrier completes, the memory accesses each thread made before its arrive or sync are
// performed for all participants (the producers' cp.async data, after their wait_group; the
// consumers' last reads of a stage before it is overwritten).
// Why a phase can never mix with the next one of the same barrier: producers arrive on FULL[s]
// for tile t + STAGES only after EMPTY[s] for tile t completed, which needs every consumer past
// FULL[s] for tile t; symmetrically for EMPTY[s]. Phases that nobody would wait for are never started:
// consumers release tile t only if t + STAGES < n_tiles (a tile the producers will refill), so
// when the block exits every barrier phase that began has completed. Producers and consumers
// compute n_tiles from the same arguments, loop the same number of times, and every barrier
// call is executed by whole warps on block-uniform conditions: no barrier sits in divergent code.
// tests/test_model_05_06.py simulates this schedule for STAGES 1-3, PRODUCERS 1-2, 0-9 tiles.
//
// The producer keeps up to STAGES tiles in flight: it issues tile t as soon as its stage is free,
// commits it as one cp.async group, and announces tile t - (STAGES - 1) once that group has
// landed (cp.async.wait_group STAGES - 1: each thread waits for its own copies, then arrives,
// so FULL completes only when every producer thread's part of the tile is in shared memory).
// With STAGES = 1 nothing overlaps (issue, wait, compute, release): the chapter-5 schedule with
// different synchronization. The cost: producer warps hold registers and issue slots while
// waiting, and the block has 4 + PRODUCERS warps but still one register budget per thread.
//
// Cost model: per tile the consumers do exactly chapter 5's math and shared-memory traffic; the
// global loads (16 KB per tile) leave the critical path only if the math of STAGES - 1 tiles
// takes longer than a load. At the mission shape a block sees 8 key tiles and one block fits on
// an L4 SM, so predict a small gain over chapter 5 (the study's cp.async version: ~1%).
//
// Launch: block (32 * (4 + PRODUCERS),), grid (ceil(L / 64), B*H). Key tile BLOCK_N = 64 at
// D = 64 and 32 at D = 128, so that three stages fit the L4's 99 KB per block. Dynamic shared
// memory STAGES * 2 * BLOCK_N * (D + 8) * 2 (the ring) + S + P + O as in chapter 5:
//   D = 64:  62464 / 80896 / 99328 B for 1 / 2 / 3 stages
//   D = 128: 65536 / 82944 / 100352 B
// all above the 48 KB default (the launcher opts in) and within 99 KB (101376 B).
// Entry point: attn_fwd_06_warp_specialized (STAGES = 2, PRODUCERS = 1). The sweep over STAGES
// 1-3 and PRODUCERS 1-2 uses the same template from the files 06_ws_s<STAGES>_p<PRODUCERS>.cu.
// Limits: D = 64 or 128; any L >= 1; q, k, v, o 16-byte aligned.
#include "ptx.cuh"
#include "wmma_tile.cuh"

namespace {

using namespace attn::wm;

constexpr int CONSUMER_THREADS = COMPUTE_WARPS * 32;  // 128: four warps of 16 query rows

template <int PRODUCERS>
struct Roles {
    static_assert(PRODUCERS >= 1 && PRODUCERS <= 2, "one or two producer warps");
    static constexpr int PRODUCER_THREADS = PRODUCERS * 32;
    static constexpr int THREADS = CONSUMER_THREADS + PRODUCER_THREADS;
    // Arrivals that complete one phase of a FULL or EMPTY barrier: every thread of the block.
    static constexpr int BARRIER_THREADS = THREADS;
};

// Keys per tile: 64 at D = 64 (as chapter 5), 32 at D = 128 (three stages of 64 would not fit).
// Chapter 8's search (src/attnlab/gpu/search.py) sets both with -DATTN06_BLOCK_N_D64=... -DATTN06_BLOCK_N_D128=...
#ifdef ATTN06_BLOCK_N_D64
constexpr int BLOCK_N_D64 = ATTN06_BLOCK_N_D64;
constexpr int BLOCK_N_D128 = ATTN06_BLOCK_N_D128;
#else
constexpr int BLOCK_N_D64 = 64;
constexpr int BLOCK_N_D128 = 32;
#endif
template <int D>
constexpr int BLOCK_N = D == 64 ? BLOCK_N_D64 : BLOCK_N_D128;

template <int D, int STAGES>
constexpr int smem_bytes() {
    return STAGES * 2 * Tiles<D, BLOCK_N<D>>::KV_TILE_BYTES + Tiles<D, BLOCK_N<D>>::WORK_BYTES;
}
// src/attnlab/kernels/chapters/ch06_warp_specialized.py computes the same numbers from this file's
// constants; a searched
// configuration's sizes come from the registry's KernelSpec.with_config.
#if !defined(ATTN_WMMA_BLOCK_M) && !defined(ATTN06_BLOCK_N_D64)
static_assert(smem_bytes<64, 1>() == 62464 && smem_bytes<64, 2>() == 80896 &&
              smem_bytes<64, 3>() == 99328, "dynamic smem at D = 64");
static_assert(smem_bytes<128, 1>() == 65536 && smem_bytes<128, 2>() == 82944 &&
              smem_bytes<128, 3>() == 100352, "dynamic smem at D = 128");
static_assert(smem_bytes<64, 3>() <= 101376 && smem_bytes<128, 3>() <= 101376,
              "the L4's 99 KB per block");
#endif

// ---- named barriers of the ring ------------------------------------------------------------

__device__ __forceinline__ int full_bar(int stage) { return 1 + stage; }
template <int STAGES>
__device__ __forceinline__ int empty_bar(int stage) { return 1 + STAGES + stage; }

// ---- the two roles -------------------------------------------------------------------------

template <int D>
struct Ring {
    static constexpr int BN = BLOCK_N<D>;
    using T = Tiles<D, BN>;
    static constexpr int STAGE_BYTES = 2 * T::KV_TILE_BYTES;  // K tile, then V tile
    static __device__ __forceinline__ __half* k(unsigned char* ring, int s) {
        return reinterpret_cast<__half*>(ring + s * STAGE_BYTES);
    }
    static __device__ __forceinline__ __half* v(unsigned char* ring, int s) {
        return reinterpret_cast<__half*>(ring + s * STAGE_BYTES + T::KV_TILE_BYTES);
    }
};

// Producer threads copy K and V rows [kv0, kv0 + BN) of one head into one stage: 16-byte chunks,
// consecutive threads on consecutive chunks of a row (coalesced), zero-filled past L.
template <int D, int PRODUCERS>
__device__ __forceinline__ void issue_tile(__half* k_dst, __half* v_dst, const __half* k_head,
                                           const __half* v_head, int kv0, int L, int ptid) {
    constexpr int BN = BLOCK_N<D>;
    constexpr int LD = Tiles<D, BN>::KV_LD;
    constexpr int CHUNKS_PER_ROW = D / 8;
    constexpr int CHUNKS = BN * CHUNKS_PER_ROW;  // per matrix
    for (int c = ptid; c < 2 * CHUNKS; c += Roles<PRODUCERS>::PRODUCER_THREADS) {
        const bool is_v = c >= CHUNKS;
        const int cc = is_v ? c - CHUNKS : c;
        const int r = cc / CHUNKS_PER_ROW, col = (cc % CHUNKS_PER_ROW) * 8;
        const bool valid = kv0 + r < L;
        const __half* head = is_v ? v_head : k_head;
        // A row past L reads nothing; its address is kept inside the tensor all the same.
        const __half* src = head + (valid ? (long long)(kv0 + r) * D + col : 0);
        // src_bytes = 0: nothing is read and the 16 bytes are zero-filled (rows past L).
        attn::cp_async_16(attn::smem_u32((is_v ? v_dst : k_dst) + r * LD + col), src, valid ? 16 : 0);
    }
}

// The producer loop runs LAG = STAGES - 1 steps past the last tile. Step t issues tile t (while
// t < n_tiles) as one cp.async group and announces tile t - LAG, which has landed once at most
// LAG newer groups are in flight. Past the last tile it commits empty groups, so that
// "wait_group LAG" keeps meaning "the tile LAG steps ago has landed". The loop is unrolled by
// STAGES, so every stage index, barrier id and ring address is a compile-time constant.
template <int D, int STAGES, int PRODUCERS>
__device__ __forceinline__ void produce(unsigned char* ring, const __half* k_head, const __half* v_head,
                                        int L, int n_tiles) {
    constexpr int BN = BLOCK_N<D>;
    constexpr int LAG = STAGES - 1;
    constexpr int COUNT = Roles<PRODUCERS>::BARRIER_THREADS;
    const int ptid = threadIdx.x - CONSUMER_THREADS;
    for (int t0 = 0; t0 < n_tiles + LAG; t0 += STAGES) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {  // step t = t0 + s: tile t goes to stage s
            const int t = t0 + s;
            if (t >= n_tiles + LAG) break;
            if (t < n_tiles) {
                if (t >= STAGES) attn::bar_sync(empty_bar<STAGES>(s), COUNT);  // tile t - STAGES released
                issue_tile<D, PRODUCERS>(Ring<D>::k(ring, s), Ring<D>::v(ring, s), k_head, v_head,
                                         t * BN, L, ptid);
            }
            attn::cp_async_commit();
            if (t >= LAG) {
                attn::cp_async_wait<LAG>();  // this thread's part of tile t - LAG has landed
                attn::bar_arrive(full_bar((s + STAGES - LAG) % STAGES), COUNT);  // tile t - LAG is full
            }
        }
    }
}

template <int D, int STAGES, int PRODUCERS>
__device__ __forceinline__ void forward(const __half* __restrict__ q, const __half* __restrict__ k,
                                        const __half* __restrict__ v, __half* __restrict__ o,
                                        int L, float scale, bool causal, unsigned char* smem) {
    constexpr int BN = BLOCK_N<D>;
    using T = Tiles<D, BN>;
    constexpr int COUNT = Roles<PRODUCERS>::BARRIER_THREADS;
    unsigned char* ring = smem;
    unsigned char* work = smem + STAGES * Ring<D>::STAGE_BYTES;
    float* s_s = reinterpret_cast<float*>(work);
    __half* p_s = reinterpret_cast<__half*>(work + T::S_BYTES);
    float* o_s = reinterpret_cast<float*>(work + T::S_BYTES + T::P_BYTES);

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int q0 = blockIdx.x * BLOCK_M;
    const long long base = attn::head_offset(blockIdx.y, L, D);
    const int n_tiles = num_key_tiles(L, q0, causal, BN);  // both roles: the same number of tiles

    if (warp >= COMPUTE_WARPS) {  // warp-uniform: whole warps take one role
        produce<D, STAGES, PRODUCERS>(ring, k + base, v + base, L, n_tiles);
        return;
    }

    const int row0 = q0 + warp * WARP_M;
    float* s_w = s_s + warp * WARP_M * T::S_LD;
    __half* p_w = p_s + warp * WARP_M * T::P_LD;
    float* o_w = o_s + warp * WARP_M * T::O_LD;
    FragA qf[D / MMA];
    load_q_fragments<D>(qf, q + base, row0, L, o_w, lane);  // overlaps the first copies

    const int my_row = row0 + (lane >> 1);
    const int key_limit = causal ? min(L, my_row + 1) : L;
    float m = ATTN_NEG_INF, l = 0.f;

    for (int t0 = 0; t0 < n_tiles; t0 += STAGES) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {  // tile t = t0 + s, in stage s
            const int t = t0 + s;
            if (t >= n_tiles) break;
            attn::bar_sync(full_bar(s), COUNT);  // tile t has landed in stage s
            warp_scores<D, BN>(qf, Ring<D>::k(ring, s), s_w);
            __syncwarp();
            warp_online_softmax<D, BN>(s_w, p_w, o_w, m, l, t * BN, key_limit, scale, lane);
            __syncwarp();
            warp_pv<D, BN>(p_w, Ring<D>::v(ring, s), o_w);
            if (t + STAGES < n_tiles) attn::bar_arrive(empty_bar<STAGES>(s), COUNT);  // stage s may be refilled
        }
    }
    __syncwarp();
    warp_write_output<D>(o_w, l, o + base, row0, L, lane);
}

template <int STAGES, int PRODUCERS>
__device__ __forceinline__ void dispatch(const __half* q, const __half* k, const __half* v, __half* o,
                                         int L, int D, float scale, int causal) {
    extern __shared__ __align__(128) unsigned char smem[];
    // D is the same for the whole grid: no divergence. Other D were refused by the launcher.
    if (D == 64)
        forward<64, STAGES, PRODUCERS>(q, k, v, o, L, scale, causal != 0, smem);
    else if (D == 128)
        forward<128, STAGES, PRODUCERS>(q, k, v, o, L, scale, causal != 0, smem);
}

}  // namespace

// The chapter's kernel: two stages, one producer warp. The sweep variants (06_ws_s<S>_p<P>.cu)
// include this file with ATTN06_SWEEP_VARIANT defined and add their own entry point instead, so
// that each registry entry builds, and `attnlab inspect` reports, exactly one kernel.
// __launch_bounds__(threads, 1): shared memory already limits an SM to one or a few blocks, so
// registers need not be rationed for occupancy (without the 1, ptxas caps some variants at 128
// registers on sm_90 and spills).
// Chapter 8's search (src/attnlab/gpu/search.py) may set the stages and producer warps of this entry.
#ifndef ATTN06_SWEEP_VARIANT
#ifndef ATTN06_STAGES
#define ATTN06_STAGES 2
#endif
#ifndef ATTN06_PRODUCERS
#define ATTN06_PRODUCERS 1
#endif
extern "C" __global__ void __launch_bounds__(Roles<ATTN06_PRODUCERS>::THREADS, 1)
attn_fwd_06_warp_specialized(const __half* __restrict__ q, const __half* __restrict__ k,
                             const __half* __restrict__ v, __half* __restrict__ o,
                             int L, int D, float scale, int causal) {
    dispatch<ATTN06_STAGES, ATTN06_PRODUCERS>(q, k, v, o, L, D, scale, causal);
}
#endif
