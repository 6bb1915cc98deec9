// Chapter 7: tensor cores through mma.sync, ldmatrix from a swizzled tile, cp.async copies two or
// three tiles deep, and P kept in registers.
//
// What changes since chapter 6: the scores never touch shared memory. Each warp owns 16 query
// rows. S = Q K^T comes out of `mma.sync.m16n8k16` as fp32 accumulators in registers; the online
// softmax runs on those registers (a row's scores of a tile live in the 4 lanes of a quad, so a
// row reduction is two __shfl_xor_sync); P is rounded to fp16 and, because the m16n8 accumulator
// layout of two adjacent key blocks is exactly the m16k16 A-operand layout, it feeds O += P V
// without moving. Q, K and V fragments come from shared memory by `ldmatrix` (.trans for V), the
// tiles are XOR-swizzled (kernels/swizzle.cuh) so neither the 16-byte cp.async stores nor the
// ldmatrix reads conflict on banks, and the next STAGES - 1 K/V tiles are copied while this one is
// used.
//
// Cost model: per key tile a warp issues (D/16)(SUB_N/8) MMAs for S and (SUB_N/16)(D/8) for O,
// one ldmatrix.x4 per two MMAs, and SUB_N/2 exp2 per lane, where SUB_N = BLOCK_N / KV_SPLIT is
// the part of the tile its warp group takes (below). Q is read from DRAM once, K and V once per
// query tile (L2 serves the repeats).
//
// Tiles (per D; the registry, src/attnlab/kernels/chapters/ch07_mma.py, reads the constants below):
//   WARPS = 4 warps per CTA, 16 query rows each. Grid (ceil(L / BLOCK_M), B*H); causal launches
//   the longest query tiles first (blockIdx.x counts down) so the short ones fill the tail.
//   D = 64:  BLOCK_N = 64.  Q 8 KB + 2 stages x (K 8 KB + V 8 KB)  = 40 KB: two CTAs per L4 SM.
//   D = 128: BLOCK_N = 32 on the L4 (sm_89, and sm_86), 64 on sm_80 and sm_90. The key tile
//            follows the shared memory of the GPU: two CTAs per SM is the design point (one
//            CTA's softmax hides behind the other's MMAs), so the tile is the largest that lets
//            two share an SM. 64-key tiles need Q 16 KB + 2 x (K 16 KB + V 16 KB) = 80 KB: two
//            fit an A100's 164 KB or an H100's 228 KB per SM, not an L4's 100 KB, where
//            Q 16 KB + 2 x (K 8 KB + V 8 KB) = 48 KB (+ 1 KB reserved each) lets two in.
//            FlashAttention-2 (run_mha_fwd_hdim128) takes 128 x 32 tiles on sm86/sm89 without
//            the causal mask and 64 x 64 with it, 128 x 64 on sm80 and sm90. The launcher passes the tile of the GPU at hand as
//            -DATTN07_BLOCK_N_D128=64 (chapters.ch07_mma.arch_tiles); the constants below are the
//            L4's, what this file compiles to on its own.
//   (Q is BLOCK_M rows: the sizes above are KV_SPLIT = 1's; a split shrinks Q by the split.)
//   Stages: 2 on the L4. Where a third K/V stage costs no resident CTA, the launcher passes
//   -DATTN07_STAGES_D64=3 and _D128=3: on sm_90 (D = 64: Q 8 KB + 3 x 16 KB = 56 KB, three CTAs
//   as with two stages, registers being the limit; D = 128: Q 16 KB + 3 x 32 KB = 112 KB, two in
//   228 KB). Tile j is then copied two tiles ahead of its use, so one late copy no longer stalls
//   the CTA. Not on sm_80: at D = 64 a third stage would leave two CTAs of the three it holds.
//   The key tile is chosen first, then the stages: a wider tile halves the barriers and the
//   softmax's row reductions per key; a third stage only hides what the second mostly hides.
//   Registers: up to the registry's bounds per entry (chapters/ch07_mma.py: REGISTERS,
//   TWO_ROWS_REGISTERS), within the 255 that two CTAs of 128 threads may hold; MIN_CTAS_PER_SM
//   tells ptxas so.
//   One stage (steps 7.1 to 7.3): 24 KB (D = 64) / 32 KB (D = 128; 48 KB with 64-key tiles).
//
// Filling the GPU: the keys split inside the CTA (KV_SPLIT). At the mission shape (1, 8, 512, 64)
// 64-row query tiles make 8 x 8 = 64 CTAs: enough for an L4's 58 SMs, half of an H100's 132.
// With KV_SPLIT = s the CTA's WARPS warps form s groups of WARPS/s warps: BLOCK_M = 16 WARPS / s
// query rows per CTA (s times the CTAs), and group g takes keys [g SUB_N, (g+1) SUB_N) of every
// key tile, SUB_N = BLOCK_N / s. The whole CTA still copies each K/V tile once; each warp walks
// every tile but multiplies only its group's slice of it. After the loop the groups' (m, l, O)
// of the same rows are merged through shared memory (the K/V stages, free by then) with the
// online softmax's rescaling: no second kernel and no scratch buffer in global memory. The
// launcher picks s from the shape and the SM count of the GPU at hand (chapters/ch07_mma.py: choose_kv_split).
// The price: s times the CTAs re-read K and V (from L2), and the merge (two barriers, one pass
// over O) per CTA.
//
// One barrier per key tile: wait for this thread's copies of tile j,
// barrier, then prefetch tile j+STAGES-1 into the stage of tile j-1, then compute on tile j. The
// barrier is both "tile j has landed for everyone" and "every warp is done with tile j-1", whose
// stage the prefetch refills, so no second barrier is needed at the end of the body. The copies
// of the next STAGES-1 tiles still overlap the math on tile j.
//
// FlashAttention-2's route to the same end (PARTIAL = true, registry id 07_mma_split_ctas): the
// split is across CTAs instead. Grid (ceil(L / BLOCK_M), B*H, splits): CTA z takes the z-th run of
// ceil(ceil(L / BLOCK_N) / splits) key tiles (a causal query tile only the part of it at or below
// its diagonal, possibly none) and writes its rows' unnormalized fp32 O, running max m and sum l
// to global scratch; attn_combine_07, a second kernel, merges the splits of each row with the
// same rescaling as the merge above and writes O. The price: splits x B*H x L x (D + 2) fp32
// words written and read back, and a second launch.
//
// The chapter climbs to this kernel in steps, each adding one technique by one template switch
// (registry ids in order; KV_SPLIT = 1 up to 7.5):
//   7.1 07_mma_plain:          mma.sync, ldmatrix and P in registers; SWIZZLE = false, STAGES = 1
//                              (the copy of tile j starts after tile j-1 is consumed: two barriers
//                              per tile, necessarily), LONGEST_FIRST = false.
//   7.2 07_mma_longest_first:  LONGEST_FIRST = true: causal grids launch the longest query tiles first.
//   7.3 07_mma_single_buffer:  SWIZZLE = true.
//   7.4 07_mma_two_barriers:   STAGES = 2 (3 on sm_90), ONE_BARRIER = false: prefetch, wait for all
//                              but the newest STAGES-1 groups, barrier, compute, barrier.
//   7.5 07_mma_nosplit:        ONE_BARRIER = true.
//   7.6 07_mma:                KV_SPLIT chosen per shape and GPU (07_mma_split_ctas: FA2's route).
// and past the chapter's kernel, for the large shapes:
//   7.7 07_mma_two_row_blocks: ROW_BLOCKS = 2 at D = 64: each warp takes two 16-row blocks (128-row
//                              CTAs), and every K and V fragment it reads feeds both blocks' MMAs.
//   7.8 07_mma_across_heads:   ACROSS_HEADS = true: a causal grid's CTA i takes query tile i / (B H)
//                              of pair i % (B H), so the longest tiles of every head start first.
//   7.9, 7.10:                 launcher rules that pick step 7.6's launch or step 7.8's per shape.
//   7.11 07_mma_lean_loop:     WHOLE_TILES = SKIP_RESCALE = true in both: a K/V tile inside L is
//                              copied without row tests (load_whole_tile), and a warp whose rows
//                              kept their maxima skips the rescale of O.
//   7.12 07_mma_whole_tile_copy: SKIP_RESCALE = false again: the whole-tile copy alone, since the
//                              vote's branch cost the rescale more waits than the multiplies it skipped.
//   7.13 07_mma_pv_a_tile_later: DEFER_PV = true (but at D = 64 with two row blocks, where step 7.12's
//                              loop stays): tile j-1's O += P V runs between tile j's
//                              scores and its softmax, which does not wait on it; V runs a tile
//                              behind K in the copies, since tile j-1's V is used a trip later.
//                              Where registers allow, P waits in fp32 and is rounded at its MMAs.
// 07_mma_noswizzle (SWIZZLE = false in 07_mma) is an ablation: every ldmatrix phase is an
// 8-way bank conflict. 07_mma_two_rows_at_d128 is step 7.13's launches with ROW_BLOCKS = 2 at
// D = 128 too, in step 7.12's loop: Q's fragments are read from the Q tile at every k-step
// (Q_FROM_TILE), and the key tile is 32 on every GPU (BLOCK_N_D128_TWO_ROWS: Q 32 KB + STAGES x
// 16 KB). The model predicts it slower than step 7.13 on an H100 (step 7.13's page).
//
// Launch: block (32 WARPS,), grid (ceil(L / BLOCK_M), B*H), dynamic shared memory as above (the
// launcher opts in above 48 KB). Limits: D in {64, 128}; any L >= 1 (rows past L are zero-filled
// on load, masked as keys and never stored); q, k, v, o 16-byte aligned (16-byte copies and
// stores); any finite scale.
#include "common.cuh"
#include "ptx.cuh"
#include "swizzle.cuh"

namespace {
// Chapter 8's search (src/attnlab/gpu/search.py) may set WARPS, the key tiles, the stages and
// MIN_CTAS_PER_SM with -DATTN07_WARPS=... -DATTN07_BLOCK_N_D64=... -DATTN07_BLOCK_N_D128=...
// -DATTN07_STAGES_D64=... -DATTN07_STAGES_D128=... -DATTN07_MIN_CTAS=...; without them, the
// chapter's values (the L4's).
#ifdef ATTN07_WARPS
constexpr int WARPS = ATTN07_WARPS;
#else
constexpr int WARPS = 4;
#endif
constexpr int THREADS = WARPS * 32;
#ifdef ATTN07_BLOCK_N_D64
constexpr int BLOCK_N_D64 = ATTN07_BLOCK_N_D64;
#else
constexpr int BLOCK_N_D64 = 64;       // keys per tile at D = 64
#endif
#ifdef ATTN07_BLOCK_N_D128
constexpr int BLOCK_N_D128 = ATTN07_BLOCK_N_D128;  // 64 on sm_80 and sm_90, from the launcher
#else
constexpr int BLOCK_N_D128 = 32;      // keys per tile at D = 128 on the L4 (see the smem budget above)
#endif
// Keys per tile of the two-row entries at D = 128 (Q_FROM_TILE), on every GPU: their loop holds 255
// registers a thread with 32-key tiles, and with 64 it spills on sm_90.
constexpr int BLOCK_N_D128_TWO_ROWS = 32;
// K/V stages per head dim: 2 on the L4 (sm_89, and sm_86) and sm_80, 3 on sm_90 (see the budget
// above), passed by the launcher as -DATTN07_STAGES_D64=3 -DATTN07_STAGES_D128=3. FlashAttention-2's
// route may take fewer where its partial kernel would spill (chapters.ch07_mma.PARTIAL_TOPS).
#ifdef ATTN07_STAGES_D64
constexpr int STAGES_D64 = ATTN07_STAGES_D64;
#else
constexpr int STAGES_D64 = 2;
#endif
#ifdef ATTN07_STAGES_D128
constexpr int STAGES_D128 = ATTN07_STAGES_D128;
#else
constexpr int STAGES_D128 = 2;
#endif
// Two CTAs per SM is the design point (see the shared-memory budget above). Saying so lets
// ptxas use up to 255 registers; with no hint it aims at 168 (three CTAs) and spills at D = 128.
#ifdef ATTN07_MIN_CTAS
constexpr int MIN_CTAS_PER_SM = ATTN07_MIN_CTAS;
#else
constexpr int MIN_CTAS_PER_SM = 2;
#endif
constexpr float LOG2E = 1.4426950408889634f;
constexpr float SMALLEST_NORMAL = 1.17549435e-38f;  // FLT_MIN (no libc headers: NVRTC builds this too)

// Two fp32 values as one f16x2 register; `lo` (the smaller column) in the low half.
__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
}

// A row's value summed over the 4 lanes of its quad, which hold the row between them in the mma
// C layout (xor 1 and xor 2 stay inside the quad).
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}

// ---- tile copies ---------------------------------------------------------------------------

// Rows row0 .. row0+ROWS-1 of one head's [L, D] matrix into a (swizzled) tile, 16 bytes per
// thread per step: consecutive threads take consecutive chunks of a row, so 8 threads read 128
// contiguous bytes of DRAM and store to 8 distinct bank groups.
template <int D, int ROWS, bool SWIZZLE>
__device__ __forceinline__ void load_tile(unsigned tile, const __half* head, int row0, int L, int tid) {
    constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
    static_assert((ROWS * CHUNKS) % THREADS == 0, "every thread copies the same number of chunks");
#pragma unroll
    for (int i = 0; i < ROWS * CHUNKS / THREADS; ++i) {
        const int idx = i * THREADS + tid;
        const int r = idx / CHUNKS, c = idx % CHUNKS;
        const int row = row0 + r;
        const bool valid = row < L;
        const __half* src = head + static_cast<long long>(valid ? row : 0) * D + c * 8;  // in bounds even when unused
        // src_bytes = 0 copies nothing and zero-fills the 16 destination bytes: rows past L become
        // zeros (finite, so 0 * V stays 0).
        attn::cp_async_16(tile + attn::tile_offset<D * 2, SWIZZLE>(r, c), src, valid ? 16 : 0);
    }
}

// load_tile for ROWS rows that all lie inside L (every K/V tile but a ragged last one), from `rows`,
// the first of them: no row test, and the thread's chunk i is its first chunk plus a constant, so
// the compiler works out the thread's part of every address once, outside the key-tile loop.
template <int D, int ROWS, bool SWIZZLE>
__device__ __forceinline__ void load_whole_tile(unsigned tile, const __half* rows, int tid) {
    constexpr int CHUNKS = D / 8, PASS_ROWS = THREADS / CHUNKS;  // rows the CTA copies per step
    static_assert((ROWS * CHUNKS) % THREADS == 0 && THREADS % CHUNKS == 0, "whole rows per step, the same for every thread");
    const int r = tid / CHUNKS, c = tid % CHUNKS;
    const __half* src = rows + (r * D + c * 8);
#pragma unroll
    for (int i = 0; i < ROWS / PASS_ROWS; ++i)
        attn::cp_async_16(tile + attn::tile_offset<D * 2, SWIZZLE>(i * PASS_ROWS + r, c), src + i * PASS_ROWS * D, 16);
}

// ---- the kernel ----------------------------------------------------------------------------

// PARTIAL: write this CTA's split of the keys to o_part and ml for attn_combine_07 (o unused);
// otherwise o_part and ml are unused.
template <int D, int BLOCK_N, int KV_SPLIT, bool SWIZZLE, int STAGES, bool ONE_BARRIER, bool LONGEST_FIRST,
          int ROW_BLOCKS, bool ACROSS_HEADS, bool WHOLE_TILES, bool SKIP_RESCALE, bool DEFER_PV, bool PARTIAL>
__device__ __forceinline__ void attn_fwd_07(const __half* __restrict__ q, const __half* __restrict__ k,
                                            const __half* __restrict__ v, __half* __restrict__ o,
                                            float* __restrict__ o_part, float* __restrict__ ml,
                                            int L, float scale, int causal) {
    constexpr int ROW_WARPS = WARPS / KV_SPLIT;  // warps per key group, 16 ROW_BLOCKS query rows each
    constexpr int WARP_ROWS = 16 * ROW_BLOCKS;   // query rows per warp: ROW_BLOCKS m16 blocks share each K/V fragment
    constexpr int BLOCK_M = WARP_ROWS * ROW_WARPS;  // query rows per CTA
    constexpr int SUB_N = BLOCK_N / KV_SPLIT;    // keys of each tile one group multiplies
    static_assert(WARPS % KV_SPLIT == 0, "whole warps per key group");
    static_assert(D % 16 == 0 && SUB_N % 16 == 0, "whole m16n8k16 steps");
    static_assert(STAGES >= 1 && (STAGES >= 2 || !ONE_BARRIER), "one stage needs the second barrier before its refill");
    static_assert(!PARTIAL || KV_SPLIT == 1, "one route to split the keys at a time");
    static_assert(ROW_BLOCKS == 1 || ROW_BLOCKS == 2, "one or two 16-row blocks per warp");
    static_assert(!WHOLE_TILES || (ONE_BARRIER && STAGES > 1), "the whole-tile copy is the one-barrier prefetch's");
    static_assert(!DEFER_PV || (WHOLE_TILES && !SKIP_RESCALE && !PARTIAL), "step 7.13 builds on step 7.12's loop");
    static_assert(!DEFER_PV || STAGES <= 3, "step 7.13's prologue copies V of tile 0 alone: past 3 stages tile 1's is missed");
    constexpr int ROW_BYTES = D * 2;
    constexpr int Q_BYTES = BLOCK_M * ROW_BYTES;
    constexpr int KV_BYTES = BLOCK_N * ROW_BYTES;
    constexpr int K_STEPS = D / 16;        // k-steps of S = Q K^T (over the head dim)
    constexpr int S_BLOCKS = SUB_N / 8;    // n-blocks of S (8 keys each)
    constexpr int P_STEPS = SUB_N / 16;    // k-steps of O += P V (over the keys)
    constexpr int O_BLOCKS = D / 8;        // n-blocks of O (8 head-dim columns each)

    // Shared memory: [Q | K stage 0 | V stage 0 | K stage 1 | V stage 1 | ...], STAGES K/V pairs.
    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned q_tile = attn::smem_u32(smem);
    auto k_tile = [&](int stage) { return q_tile + Q_BYTES + stage * 2 * KV_BYTES; };
    auto v_tile = [&](int stage) { return q_tile + Q_BYTES + stage * 2 * KV_BYTES + KV_BYTES; };

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane >> 2, t = lane & 3;  // PTX's groupID and threadID_in_group
    const int group = warp / ROW_WARPS;     // which slice of every key tile this warp multiplies
    const int row_warp = warp % ROW_WARPS;  // which WARP_ROWS query rows (shared with the other groups)
    const int key0 = group * SUB_N;         // the slice's first key within a tile
    int q_block = blockIdx.x, bh = blockIdx.y;  // the query tile, and the (batch, head) pair
    if constexpr (ACROSS_HEADS) {
        // Causal: CTAs start in linear order (x fastest), and CTA i takes query tile i / (B H) of
        // pair i % (B H): every head's first tile starts before any head's second, so the longest
        // tiles of the whole grid go first, not only each head's.
        if (causal) {
            const int linear = blockIdx.y * gridDim.x + blockIdx.x;
            q_block = linear / gridDim.y;
            bh = linear % gridDim.y;
        }
    }
    // Causal: the longest query tiles (the last rows, which see the most keys) run first, so that
    // the short ones fill the grid's tail instead of a long one starting last.
    if constexpr (LONGEST_FIRST) q_block = causal ? gridDim.x - 1 - q_block : q_block;
    const int q0 = q_block * BLOCK_M;
    const int warp_row0 = q0 + row_warp * WARP_ROWS;  // this warp's first query row
    const long long head = attn::head_offset(bh, L, D);
    q += head; k += head; v += head;
    if constexpr (!PARTIAL) o += head;  // (PARTIAL: o is null)

    // Causal: key tiles wholly above the diagonal of this query tile are never visited.
    const int kv_end = causal ? min(L, q0 + BLOCK_M) : L;
    int tile0 = 0, tile1 = attn::ceil_div(kv_end, BLOCK_N);  // the key tiles [tile0, tile1) this CTA walks
    // This CTA's rows in the combine's scratch: [split][B*H][L] rows of D (o_part) and 2 (ml) floats.
    const long long part_row0 = (static_cast<long long>(blockIdx.z) * gridDim.y + bh) * L;
    if constexpr (PARTIAL) {
        const int per_split = attn::ceil_div(attn::ceil_div(L, BLOCK_N), gridDim.z);
        tile0 = blockIdx.z * per_split;
        tile1 = min(tile1, tile0 + per_split);
        if (tile0 >= tile1) {  // a causal query tile's diagonal ends before this split: no key, no copy
            for (int r = tid; r < BLOCK_M && q0 + r < L; r += THREADS) {
                ml[(part_row0 + q0 + r) * 2] = ATTN_NEG_INF;  // the combine skips it, O unread
                ml[(part_row0 + q0 + r) * 2 + 1] = 0.f;
            }
            return;  // the whole CTA, before any barrier
        }
    }

    // Prologue: Q and, with more than one stage, the first STAGES - 1 key tiles, one commit group
    // per tile (Q rides in the first; with one stage, in the loop's first). A group is committed
    // even when its tile is past the last, so that "all but the newest n groups" always names the
    // same tiles.
    load_tile<D, BLOCK_M, SWIZZLE>(q_tile, q, q0, L, tid);
    if constexpr (STAGES > 1) {
#pragma unroll
        for (int p = 0; p < STAGES - 1; ++p) {
            if (tile0 + p < tile1) {
                load_tile<D, BLOCK_N, SWIZZLE>(k_tile(p), k, (tile0 + p) * BLOCK_N, L, tid);
                if constexpr (!DEFER_PV)
                    load_tile<D, BLOCK_N, SWIZZLE>(v_tile(p), v, (tile0 + p) * BLOCK_N, L, tid);
                else if (p == 0)  // V runs a tile behind K past the first (see the loop): group 1 holds K alone
                    load_tile<D, BLOCK_N, SWIZZLE>(v_tile(p), v, (tile0 + p) * BLOCK_N, L, tid);
            }
            attn::cp_async_commit();
        }
    }

    // Only with Q_FROM_TILE: two row blocks at D = 128 hold 128 fp32 accumulators of O
    // per lane; with Q's 64 registers of fragments beside them the loop would spill, so each k-step
    // reads its Q fragments from the Q tile instead (FlashAttention-2 reads Q from shared memory at
    // D = 128 too).
    constexpr bool Q_FROM_TILE = ROW_BLOCKS * D > 128;

    // Per 16-row block mb of the warp's rows (rows warp_row0 + 16 mb + g and + g + 8):
    unsigned q_frag[(Q_FROM_TILE ? 1 : ROW_BLOCKS)][(Q_FROM_TILE ? 1 : K_STEPS)][4];  // A operands of Q for the whole loop
    float o_acc[ROW_BLOCKS][O_BLOCKS][4];     // C layout: [0],[1] row g, cols 2t, 2t+1; [2],[3] row g+8
    float m_run[ROW_BLOCKS][2];               // running max of the raw scores of rows g, g+8
    float l_run[ROW_BLOCKS][2];               // this lane's share of the running sums
#pragma unroll
    for (int mb = 0; mb < ROW_BLOCKS; ++mb) {
#pragma unroll
        for (int nb = 0; nb < O_BLOCKS; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) o_acc[mb][nb][e] = 0.f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            m_run[mb][h] = ATTN_NEG_INF;
            l_run[mb][h] = 0.f;
        }
    }
    // exp(scale * x) = exp2(scale_log2 * x): log2(e) folded into the scale, so each weight costs
    // one fma and one ex2. The max of scale * x is scale * max(x) only for scale >= 0, so a
    // negative scale flips the sign of Q instead (exact in fp16 and in the MMA's sums). The floor
    // keeps scale_log2 > 0 for scale = 0: -inf * scale_log2 stays -inf (a masked key), never NaN.
    const float scale_log2 = fmaxf(fabsf(scale) * LOG2E, SMALLEST_NORMAL);
    // The last key each of this lane's rows sees; a column past it is masked.
    int key_limit[ROW_BLOCKS][2];
#pragma unroll
    for (int mb = 0; mb < ROW_BLOCKS; ++mb)
#pragma unroll
        for (int h = 0; h < 2; ++h) key_limit[mb][h] = causal ? min(L - 1, warp_row0 + 16 * mb + g + 8 * h) : L - 1;

    // Only with DEFER_PV (step 7.13): a tile's O += P V waits for the next tile's scores. Its P
    // waits here with the stage its V waits in (zero P and tile 0's stage before the first tile:
    // adding it adds 0): in fp32, rounded where the next trip's MMAs read it, off the softmax's path,
    // where registers allow; else as fp16 A fragments (two row blocks would spill, and D = 64 without
    // a key split would lose an SM's third CTA to 16 more registers). The same fp16 values either way.
    constexpr bool P_FP32 = ROW_BLOCKS == 1 && (D == 128 || KV_SPLIT > 1);
    float p_prev[P_STEPS][ROW_BLOCKS][8] = {};
    unsigned p_prev_half[P_STEPS][ROW_BLOCKS][4] = {};
    int prev_stage = 0;
    // O += P V of the tile before, from its V stage: vf as in the loop below, whose own copy of these
    // lines stays inline (written through this lambda, the earlier steps' SASS changes, and with it
    // what their GPU records measured).
    auto add_pv_prev = [&](int v_stage) {
#pragma unroll
        for (int kp = 0; kp < P_STEPS; ++kp) {
            unsigned pa[ROW_BLOCKS][4];
#pragma unroll
            for (int mb = 0; mb < ROW_BLOCKS; ++mb)
#pragma unroll
                for (int r = 0; r < 4; ++r)
                    pa[mb][r] = P_FP32 ? pack_half2(p_prev[kp][mb][2 * r], p_prev[kp][mb][2 * r + 1])
                                       : p_prev_half[kp][mb][r];
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                unsigned vf[4];
                attn::ldsm_x4_trans(vf, v_tile(v_stage) + attn::tile_offset<ROW_BYTES, SWIZZLE>(
                                                        key0 + 16 * kp + attn::ldsm_row(lane), 2 * dp + attn::ldsm_chunk(lane)));
#pragma unroll
                for (int mb = 0; mb < ROW_BLOCKS; ++mb) {
                    attn::mma_16816(o_acc[mb][2 * dp], pa[mb], vf[0], vf[1]);
                    attn::mma_16816(o_acc[mb][2 * dp + 1], pa[mb], vf[2], vf[3]);
                }
            }
        }
    };

    // Tile j lives in stage (j - tile0) % STAGES; the prefetch of tile j + STAGES - 1 refills the
    // stage of tile j - 1.
    for (int j = tile0; j < tile1; ++j) {
        const int stage = static_cast<unsigned>(j - tile0) % STAGES;
        if constexpr (STAGES == 1) {
            // One stage: tile j is copied into it only now, after the barrier that ended tile j - 1
            // (the loop's last line). The copy and the math take turns.
            load_tile<D, BLOCK_N, SWIZZLE>(k_tile(0), k, j * BLOCK_N, L, tid);
            load_tile<D, BLOCK_N, SWIZZLE>(v_tile(0), v, j * BLOCK_N, L, tid);
            attn::cp_async_commit();
            attn::cp_async_wait<0>();  // this thread's copies of tile j (and Q) have landed
            __syncthreads();           // and everyone's: the tile is visible to all
        } else {
            const int next = j + STAGES - 1, next_stage = stage == 0 ? STAGES - 1 : stage - 1;  // tile j-1's
            if constexpr (ONE_BARRIER) {
                attn::cp_async_wait<STAGES - 2>();  // this thread's copies of tile j (and Q) have landed
                __syncthreads();  // one barrier per tile: everyone's have, and every warp is done with tile j-1
                if constexpr (DEFER_PV) {
                    // Every warp is done with tile j-1's K and tile j-2's V: K of tile j + STAGES - 1
                    // refills tile j-1's K stage, and V, a tile behind, refills tile j-2's V stage
                    // (tile 0's V came with its K). Tile j-1's V waits in its stage for this trip's
                    // O += P V, and the group committed here holds both, so the wait above keeps
                    // its depth. A tile inside L is copied whole, as in step 7.12.
                    if (next < tile1) {
                        if ((next + 1) * BLOCK_N <= L)
                            load_whole_tile<D, BLOCK_N, SWIZZLE>(k_tile(next_stage), k + static_cast<long long>(next) * BLOCK_N * D, tid);
                        else
                            load_tile<D, BLOCK_N, SWIZZLE>(k_tile(next_stage), k, next * BLOCK_N, L, tid);
                    }
                    const int v_next = next - 1, v_stage = (stage + STAGES - 2) % STAGES;  // tile j-2's
                    if (v_next > tile0 && v_next < tile1) {
                        if ((v_next + 1) * BLOCK_N <= L)
                            load_whole_tile<D, BLOCK_N, SWIZZLE>(v_tile(v_stage), v + static_cast<long long>(v_next) * BLOCK_N * D, tid);
                        else
                            load_tile<D, BLOCK_N, SWIZZLE>(v_tile(v_stage), v, v_next * BLOCK_N, L, tid);
                    }
                } else {
                    if (next < tile1) {  // so its stage takes tile j + STAGES - 1 while tile j is used
                        if constexpr (WHOLE_TILES) {
                            // A tile inside L (all but a ragged last one) skips the row tests, and the
                            // thread's part of its addresses is the same for every tile.
                            if ((next + 1) * BLOCK_N <= L) {
                                load_whole_tile<D, BLOCK_N, SWIZZLE>(k_tile(next_stage), k + static_cast<long long>(next) * BLOCK_N * D, tid);
                                load_whole_tile<D, BLOCK_N, SWIZZLE>(v_tile(next_stage), v + static_cast<long long>(next) * BLOCK_N * D, tid);
                            } else {
                                load_tile<D, BLOCK_N, SWIZZLE>(k_tile(next_stage), k, next * BLOCK_N, L, tid);
                                load_tile<D, BLOCK_N, SWIZZLE>(v_tile(next_stage), v, next * BLOCK_N, L, tid);
                            }
                        } else {
                            load_tile<D, BLOCK_N, SWIZZLE>(k_tile(next_stage), k, next * BLOCK_N, L, tid);
                            load_tile<D, BLOCK_N, SWIZZLE>(v_tile(next_stage), v, next * BLOCK_N, L, tid);
                        }
                    }
                }
                attn::cp_async_commit();  // possibly empty: the wait at tile j + 1 then leaves only later tiles pending
            } else {
                // Two barriers: the refilled stage was freed by the barrier at the end of the last
                // iteration, so the copy of tile j + STAGES - 1 starts before tile j is waited for.
                if (next < tile1) {
                    load_tile<D, BLOCK_N, SWIZZLE>(k_tile(next_stage), k, next * BLOCK_N, L, tid);
                    load_tile<D, BLOCK_N, SWIZZLE>(v_tile(next_stage), v, next * BLOCK_N, L, tid);
                }
                attn::cp_async_commit();   // possibly empty: keeps "all but the newest STAGES - 1 groups" = up to tile j
                attn::cp_async_wait<STAGES - 1>();
                __syncthreads();  // every thread's copies of tile j (and Q) are now visible to all
            }
        }

        if constexpr (!Q_FROM_TILE) {
            if (j == tile0) {
#pragma unroll
                for (int mb = 0; mb < ROW_BLOCKS; ++mb)
#pragma unroll
                    for (int ks = 0; ks < K_STEPS; ++ks) {
                        attn::ldsm_x4(q_frag[mb][ks], q_tile + attn::tile_offset<ROW_BYTES, SWIZZLE>(
                                                             row_warp * WARP_ROWS + 16 * mb + attn::ldsm_row(lane),
                                                             2 * ks + attn::ldsm_chunk(lane)));
                        if (scale < 0.f) {
#pragma unroll
                            for (int r = 0; r < 4; ++r) q_frag[mb][ks][r] ^= 0x80008000u;  // -q, both halves
                        }
                    }
            }
        }

        const int k0 = j * BLOCK_N + key0;  // this warp's first key of the tile
        // Causal: a slice whose first key is past this warp's last row adds nothing (p = 0,
        // correction 1); the warp skips it but still meets the barriers. (From step 7.13 on every
        // warp takes every tile: the block also adds the tile before's O += P V; a masked P is 0.)
        if (DEFER_PV || !causal || k0 <= warp_row0 + WARP_ROWS - 1) {
            // S = Q K^T (raw dot products). B order: kf[0], kf[1] are b0, b1 of key block 2np
            // (head-dim chunks 2ks, 2ks+1), kf[2], kf[3] those of key block 2np+1. One K fragment
            // feeds the MMAs of every row block of the warp.
            float s[ROW_BLOCKS][S_BLOCKS][4];
#pragma unroll
            for (int mb = 0; mb < ROW_BLOCKS; ++mb)
#pragma unroll
                for (int nb = 0; nb < S_BLOCKS; ++nb)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[mb][nb][e] = 0.f;
            if constexpr (Q_FROM_TILE) {
                // Q_FROM_TILE: k-step outermost, so each Q fragment is read once per tile and feeds
                // every key block; each score still sums its k-steps in the same order. Chunk 2 ks + c
                // (c = 0, 1) is chunk c XOR 2 ks, and the swizzle XORs a chunk with its row, so its
                // offset is chunk c's XOR 32 ks bytes: one address register per lane for all k-steps,
                // where one per k-step spills on sm_90.
                const int q_lane = attn::tile_offset<ROW_BYTES, SWIZZLE>(row_warp * WARP_ROWS + attn::ldsm_row(lane),
                                                                         attn::ldsm_chunk(lane));
                const int k_lane = attn::tile_offset<ROW_BYTES, SWIZZLE>(key0 + attn::ldsm_row_b(lane), attn::ldsm_chunk_b(lane));
#pragma unroll
                for (int ks = 0; ks < K_STEPS; ++ks) {
                    unsigned qf[ROW_BLOCKS][4];
#pragma unroll
                    for (int mb = 0; mb < ROW_BLOCKS; ++mb) {
                        attn::ldsm_x4(qf[mb], q_tile + (q_lane ^ (ks << 5)) + 16 * mb * ROW_BYTES);
                        if (scale < 0.f) {
#pragma unroll
                            for (int r = 0; r < 4; ++r) qf[mb][r] ^= 0x80008000u;  // -q, as above
                        }
                    }
#pragma unroll
                    for (int np = 0; np < S_BLOCKS / 2; ++np) {
                        unsigned kf[4];
                        attn::ldsm_x4(kf, k_tile(stage) + (k_lane ^ (ks << 5)) + 16 * np * ROW_BYTES);
#pragma unroll
                        for (int mb = 0; mb < ROW_BLOCKS; ++mb) {
                            attn::mma_16816(s[mb][2 * np], qf[mb], kf[0], kf[1]);
                            attn::mma_16816(s[mb][2 * np + 1], qf[mb], kf[2], kf[3]);
                        }
                    }
                }
            } else {
#pragma unroll
                for (int np = 0; np < S_BLOCKS / 2; ++np)
#pragma unroll
                    for (int ks = 0; ks < K_STEPS; ++ks) {
                        unsigned kf[4];
                        attn::ldsm_x4(kf, k_tile(stage) + attn::tile_offset<ROW_BYTES, SWIZZLE>(
                                                        key0 + 16 * np + attn::ldsm_row_b(lane), 2 * ks + attn::ldsm_chunk_b(lane)));
#pragma unroll
                        for (int mb = 0; mb < ROW_BLOCKS; ++mb) {
                            attn::mma_16816(s[mb][2 * np], q_frag[mb][ks], kf[0], kf[1]);
                            attn::mma_16816(s[mb][2 * np + 1], q_frag[mb][ks], kf[2], kf[3]);
                        }
                    }
            }

            // Mask keys past L and, causal, keys after the row. Only the last tile and the tiles
            // that cross this warp's diagonal need the per-element test.
            const bool need_mask = (k0 + SUB_N > L) || (causal && k0 + SUB_N - 1 > warp_row0);
            if (need_mask) {
#pragma unroll
                for (int mb = 0; mb < ROW_BLOCKS; ++mb)
#pragma unroll
                    for (int nb = 0; nb < S_BLOCKS; ++nb)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            if (k0 + nb * 8 + 2 * t + (e & 1) > key_limit[mb][e >> 1]) s[mb][nb][e] = ATTN_NEG_INF;
            }

            // Step 7.13: the tile before's O += P V runs here, between this tile's scores and its
            // softmax, on neither of which it depends: ptxas may interleave its MMAs with the
            // softmax's shuffles and exponentials. The softmax's rescale of O then waits for them.
            // On the first tile P is zero (and V tile 0's), and the MMAs add nothing.
            if constexpr (DEFER_PV) add_pv_prev(prev_stage);

            // Online softmax per row (h = 0: row g, h = 1: row g+8). The 4 lanes of a quad hold
            // a row's scores; xor 1 and xor 2 stay inside the quad.
#pragma unroll
            for (int mb = 0; mb < ROW_BLOCKS; ++mb) {
                float neg_mc[2];  // -scale_log2 * (the max each row's weights are taken against)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float mx = ATTN_NEG_INF;
#pragma unroll
                    for (int nb = 0; nb < S_BLOCKS; ++nb) mx = fmaxf(mx, fmaxf(s[mb][nb][2 * h], s[mb][nb][2 * h + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float m_new = fmaxf(m_run[mb][h], mx);
                    // A row with every key so far masked keeps m = -inf; taking weights against 0
                    // instead keeps exp2(-inf) = 0 rather than exp2(-inf + inf) = NaN.
                    const float m_use = (m_new == ATTN_NEG_INF) ? 0.f : m_new;
                    neg_mc[h] = -m_use * scale_log2;
                    if constexpr (SKIP_RESCALE) {
                        // No row of the warp's 8 raised its max: corr would be 2^0 = 1 on every lane,
                        // and the warp skips it and its multiplies (a vote keeps the branch uniform).
                        if (!__any_sync(0xffffffffu, m_new != m_run[mb][h])) continue;
                    }
                    const float corr = attn::exp2_approx((m_run[mb][h] - m_use) * scale_log2);
                    m_run[mb][h] = m_new;
                    l_run[mb][h] *= corr;
#pragma unroll
                    for (int nb = 0; nb < O_BLOCKS; ++nb) {
                        o_acc[mb][nb][2 * h] *= corr;
                        o_acc[mb][nb][2 * h + 1] *= corr;
                    }
                }
#pragma unroll
                for (int nb = 0; nb < S_BLOCKS; ++nb)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        s[mb][nb][e] = attn::exp2_approx(fmaf(s[mb][nb][e], scale_log2, neg_mc[e >> 1]));  // e^(scale (s - m))
                        l_run[mb][e >> 1] += s[mb][nb][e];
                    }
            }

            // O += P V. The accumulators of key blocks 2kp, 2kp+1 are the A fragment of k-step kp:
            // a0 = (row g, keys 2t..), a1 = (row g+8, keys 2t..), a2/a3 the same 8 keys later.
            // vf[0], vf[1] are b0, b1 of head-dim block 2dp (keys 0-7, 8-15 of the step; .trans
            // turns the row-major V tile into column fragments), vf[2], vf[3] those of 2dp+1. One
            // V fragment feeds the MMAs of every row block.
#pragma unroll
            for (int kp = 0; kp < P_STEPS; ++kp) {
                unsigned pa[ROW_BLOCKS][4];
#pragma unroll
                for (int mb = 0; mb < ROW_BLOCKS; ++mb) {
                    pa[mb][0] = pack_half2(s[mb][2 * kp][0], s[mb][2 * kp][1]);
                    pa[mb][1] = pack_half2(s[mb][2 * kp][2], s[mb][2 * kp][3]);
                    pa[mb][2] = pack_half2(s[mb][2 * kp + 1][0], s[mb][2 * kp + 1][1]);
                    pa[mb][3] = pack_half2(s[mb][2 * kp + 1][2], s[mb][2 * kp + 1][3]);
                }
                if constexpr (DEFER_PV) {
                    // Step 7.13: P waits for the next trip (or the drain after the loop).
#pragma unroll
                    for (int mb = 0; mb < ROW_BLOCKS; ++mb)
#pragma unroll
                        for (int e = 0; e < 8; ++e) {  // e: element e & 3 of key block 2kp + e / 4
                            p_prev[kp][mb][e] = s[mb][2 * kp + (e >> 2)][e & 3];
                            if (e < 4) p_prev_half[kp][mb][e] = pa[mb][e];
                        }
                } else {
#pragma unroll
                    for (int dp = 0; dp < D / 16; ++dp) {
                        unsigned vf[4];
                        attn::ldsm_x4_trans(vf, v_tile(stage) + attn::tile_offset<ROW_BYTES, SWIZZLE>(
                                                              key0 + 16 * kp + attn::ldsm_row(lane), 2 * dp + attn::ldsm_chunk(lane)));
#pragma unroll
                        for (int mb = 0; mb < ROW_BLOCKS; ++mb) {
                            attn::mma_16816(o_acc[mb][2 * dp], pa[mb], vf[0], vf[1]);
                            attn::mma_16816(o_acc[mb][2 * dp + 1], pa[mb], vf[2], vf[3]);
                        }
                    }
                }
            }
        }
        if constexpr (DEFER_PV) prev_stage = stage;  // where the V of the P just kept waits
        if constexpr (!ONE_BARRIER) __syncthreads();  // all warps are done with this stage before a later copy refills it
    }
    if constexpr (DEFER_PV) {
        // The last tile's O += P V. Its V is in the newest groups, which no trip waited for.
        attn::cp_async_wait<0>();  // this thread's copies of it have landed
        __syncthreads();           // and everyone's
        add_pv_prev(prev_stage);
    }

    if constexpr (KV_SPLIT > 1) {
        // Merge the groups: group 0 takes each other group's (m, l, O) of the same 16 rows and
        // folds it in with the online softmax's rescaling. A lane of warp (g, row_warp) holds
        // exactly the elements the same lane of warp (0, row_warp) holds, so the partials go
        // through shared memory lane-major (32 lanes x 4 bytes per word index: no bank conflict)
        // and are read back by the same lane number. They reuse the K/V stages: (KV_SPLIT - 1) x
        // ROW_WARPS x 32 lanes x PART_WORDS floats after Q, fewer bytes than the stages with the
        // chapter's tiles; the launcher's shared memory covers the larger of the two
        // (chapters.ch07_mma.smem) for every configuration chapter 8 may build.
        constexpr int PART_WORDS = O_BLOCKS * 4 + 4;  // per row block: O, then m and l of rows g, g+8
        float* part = reinterpret_cast<float*>(smem + Q_BYTES);
        auto slot = [&](int grp, int mb, int word) -> float& {
            return part[((((grp - 1) * ROW_WARPS + row_warp) * ROW_BLOCKS + mb) * PART_WORDS + word) * 32 + lane];
        };
        __syncthreads();  // every warp is done with the last K/V tile: the stages are free
        if (group > 0) {
#pragma unroll
            for (int mb = 0; mb < ROW_BLOCKS; ++mb) {
#pragma unroll
                for (int nb = 0; nb < O_BLOCKS; ++nb)
#pragma unroll
                    for (int e = 0; e < 4; ++e) slot(group, mb, nb * 4 + e) = o_acc[mb][nb][e];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    slot(group, mb, O_BLOCKS * 4 + h) = m_run[mb][h];
                    slot(group, mb, O_BLOCKS * 4 + 2 + h) = l_run[mb][h];
                }
            }
        }
        __syncthreads();  // the partials are written
        if (group > 0) return;  // group 0 finishes the rows
#pragma unroll
        for (int other = 1; other < KV_SPLIT; ++other)
#pragma unroll
            for (int mb = 0; mb < ROW_BLOCKS; ++mb)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const float m_other = slot(other, mb, O_BLOCKS * 4 + h);
                    const float m_new = fmaxf(m_run[mb][h], m_other);
                    const float m_use = (m_new == ATTN_NEG_INF) ? 0.f : m_new;  // as in the loop
                    const float c_self = attn::exp2_approx((m_run[mb][h] - m_use) * scale_log2);
                    const float c_other = attn::exp2_approx((m_other - m_use) * scale_log2);
                    m_run[mb][h] = m_new;
                    l_run[mb][h] = l_run[mb][h] * c_self + slot(other, mb, O_BLOCKS * 4 + 2 + h) * c_other;
#pragma unroll
                    for (int nb = 0; nb < O_BLOCKS; ++nb)
#pragma unroll
                        for (int e = 2 * h; e < 2 * h + 2; ++e)
                            o_acc[mb][nb][e] = o_acc[mb][nb][e] * c_self + slot(other, mb, nb * 4 + e) * c_other;
                }
    }

    if constexpr (PARTIAL) {
        // This split's rows for the combine: l summed over the quad, O unnormalized in fp32 (a
        // quad's 4 lanes write 32 contiguous bytes of a row per n-block), m and l by lane t = 0.
#pragma unroll
        for (int mb = 0; mb < ROW_BLOCKS; ++mb)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float l = quad_sum(l_run[mb][h]);
                const int row = warp_row0 + 16 * mb + g + 8 * h;
                if (row >= L) continue;
                float* o_row = o_part + (part_row0 + row) * D;
#pragma unroll
                for (int nb = 0; nb < O_BLOCKS; ++nb)
                    *reinterpret_cast<float2*>(o_row + nb * 8 + 2 * t) =
                        make_float2(o_acc[mb][nb][2 * h], o_acc[mb][nb][2 * h + 1]);
                if (t == 0) {
                    ml[(part_row0 + row) * 2] = m_run[mb][h];
                    ml[(part_row0 + row) * 2 + 1] = l;
                }
            }
        return;
    }

    // Finish: the row sums from the quad, O / l in fp16, staged through this warp's own 16 rows
    // of the (no longer needed) Q tile so that global stores are 16 bytes of contiguous row. With
    // one barrier per tile nothing else orders the staging after every lane's ldmatrix of those
    // rows: ldmatrix is a warp collective, not a memory fence between lanes.
    __syncwarp();
#pragma unroll
    for (int mb = 0; mb < ROW_BLOCKS; ++mb) {
        float inv_l[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float l = quad_sum(l_run[mb][h]);
            inv_l[h] = l > 0.f ? 1.f / l : 0.f;  // l >= 1 on every real row: its max contributes exp2(0)
        }
#pragma unroll
        for (int nb = 0; nb < O_BLOCKS; ++nb)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int off = attn::tile_offset<ROW_BYTES, SWIZZLE>(row_warp * WARP_ROWS + 16 * mb + g + 8 * h, nb) + 4 * t;
                *reinterpret_cast<unsigned*>(smem + off) =
                    pack_half2(o_acc[mb][nb][2 * h] * inv_l[h], o_acc[mb][nb][2 * h + 1] * inv_l[h]);
            }
    }
    __syncwarp();
    constexpr int CHUNKS = D / 8;
#pragma unroll
    for (int i = 0; i < WARP_ROWS * CHUNKS / 32; ++i) {
        const int idx = i * 32 + lane;
        const int r = idx / CHUNKS, chunk = idx % CHUNKS;
        const int row = warp_row0 + r;
        if (row < L)
            *reinterpret_cast<uint4*>(o + static_cast<long long>(row) * D + chunk * 8) =
                *reinterpret_cast<const uint4*>(smem + attn::tile_offset<ROW_BYTES, SWIZZLE>(row_warp * WARP_ROWS + r, chunk));
    }
}

// Whether KV_SPLIT groups can share a CTA of WARPS warps and a BLOCK_N-key tile: whole warps per
// group and a slice of whole 16-key MMA steps. Chapter 8's knobs can break it for a split entry;
// that entry then compiles to nothing, and the registry (ch07_mma.splits_at) never launches it.
template <int BLOCK_N, int KV_SPLIT>
__host__ __device__ constexpr bool split_fits() {
    return WARPS % KV_SPLIT == 0 && BLOCK_N % KV_SPLIT == 0 && (BLOCK_N / KV_SPLIT) % 16 == 0;
}

template <int D, int BLOCK_N, int KV_SPLIT, bool SWIZZLE, int STAGES, bool ONE_BARRIER, bool LONGEST_FIRST,
          int ROW_BLOCKS, bool ACROSS_HEADS, bool WHOLE_TILES, bool SKIP_RESCALE, bool DEFER_PV>
__device__ __forceinline__ void run_07(const __half* q, const __half* k, const __half* v, __half* o, int L,
                                       float scale, int causal) {
    if constexpr (split_fits<BLOCK_N, KV_SPLIT>())
        attn_fwd_07<D, BLOCK_N, KV_SPLIT, SWIZZLE, STAGES, ONE_BARRIER, LONGEST_FIRST, ROW_BLOCKS, ACROSS_HEADS,
                    WHOLE_TILES, SKIP_RESCALE, DEFER_PV, false>(q, k, v, o, nullptr, nullptr, L, scale, causal);
}

constexpr int COMBINE_THREADS = 128;  // attn_combine_07's block (the registry reads it)
}  // namespace

// One extern "C" entry per head dim and variant (template arguments: D, BLOCK_N, KV_SPLIT,
// SWIZZLE, STAGES, ONE_BARRIER). The registry maps the runtime D, and for 07_mma the split it
// picks, to the entry; the D argument is part of the common signature and fixed here.
#define ATTN07_ENTRY(NAME, D, BLOCK_N, KV_SPLIT, SWIZZLE, STAGES, ONE_BARRIER, LONGEST_FIRST, ROW_BLOCKS,       \
                     ACROSS_HEADS, WHOLE_TILES, SKIP_RESCALE, DEFER_PV)                                        \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_CTAS_PER_SM)                                     \
    NAME(const __half* __restrict__ q, const __half* __restrict__ k, const __half* __restrict__ v,             \
         __half* __restrict__ o, int L, int D_, float scale, int causal) {                                     \
        run_07<D, BLOCK_N, KV_SPLIT, SWIZZLE, STAGES, ONE_BARRIER, LONGEST_FIRST, ROW_BLOCKS, ACROSS_HEADS,      \
               WHOLE_TILES, SKIP_RESCALE, DEFER_PV>(q, k, v, o, L, scale, causal);                             \
    }

ATTN07_ENTRY(attn_fwd_07_mma_d64, 64, BLOCK_N_D64, 1, true, STAGES_D64, true, true, 1, false, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_d128, 128, BLOCK_N_D128, 1, true, STAGES_D128, true, true, 1, false, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_split2_d64, 64, BLOCK_N_D64, 2, true, STAGES_D64, true, true, 1, false, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_split2_d128, 128, BLOCK_N_D128, 2, true, STAGES_D128, true, true, 1, false, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_split4_d64, 64, BLOCK_N_D64, 4, true, STAGES_D64, true, true, 1, false, false, false, false)
// A 4-way split at D = 128 needs the 64-key tile (16 keys per group); with 32 it compiles to nothing.
ATTN07_ENTRY(attn_fwd_07_mma_split4_d128, 128, BLOCK_N_D128, 4, true, STAGES_D128, true, true, 1, false, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_two_barriers_d64, 64, BLOCK_N_D64, 1, true, STAGES_D64, false, true, 1, false, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_two_barriers_d128, 128, BLOCK_N_D128, 1, true, STAGES_D128, false, true, 1, false, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_noswizzle_d64, 64, BLOCK_N_D64, 1, false, STAGES_D64, true, true, 1, false, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_noswizzle_d128, 128, BLOCK_N_D128, 1, false, STAGES_D128, true, true, 1, false, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_single_buffer_d64, 64, BLOCK_N_D64, 1, true, 1, false, true, 1, false, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_single_buffer_d128, 128, BLOCK_N_D128, 1, true, 1, false, true, 1, false, false, false, false)
// The chapter's first two steps: no swizzle, one stage, two barriers; then the longest tiles first.
ATTN07_ENTRY(attn_fwd_07_mma_plain_d64, 64, BLOCK_N_D64, 1, false, 1, false, false, 1, false, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_plain_d128, 128, BLOCK_N_D128, 1, false, 1, false, false, 1, false, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_longest_first_d64, 64, BLOCK_N_D64, 1, false, 1, false, true, 1, false, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_longest_first_d128, 128, BLOCK_N_D128, 1, false, 1, false, true, 1, false, false, false, false)
// Step 7.7: two 16-row blocks per warp at D = 64 (at D = 128 their accumulators would spill, and the
// step runs the entries above), unsplit and split as 07_mma.
ATTN07_ENTRY(attn_fwd_07_mma_two_row_blocks_d64, 64, BLOCK_N_D64, 1, true, STAGES_D64, true, true, 2, false, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_two_row_blocks_split2_d64, 64, BLOCK_N_D64, 2, true, STAGES_D64, true, true, 2, false, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_two_row_blocks_split4_d64, 64, BLOCK_N_D64, 4, true, STAGES_D64, true, true, 2, false, false, false, false)
// Step 7.8: step 7.7 with a causal grid's longest query tiles first across the heads.
ATTN07_ENTRY(attn_fwd_07_mma_across_heads_d64, 64, BLOCK_N_D64, 1, true, STAGES_D64, true, true, 2, true, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_across_heads_d128, 128, BLOCK_N_D128, 1, true, STAGES_D128, true, true, 1, true, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_across_heads_split2_d64, 64, BLOCK_N_D64, 2, true, STAGES_D64, true, true, 2, true, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_across_heads_split2_d128, 128, BLOCK_N_D128, 2, true, STAGES_D128, true, true, 1, true, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_across_heads_split4_d64, 64, BLOCK_N_D64, 4, true, STAGES_D64, true, true, 2, true, false, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_across_heads_split4_d128, 128, BLOCK_N_D128, 4, true, STAGES_D128, true, true, 1, true, false, false, false)
// Step 7.11: steps 7.6 and 7.8 with less scalar work per key tile (WHOLE_TILES, SKIP_RESCALE), for step
// 7.10's launcher.
ATTN07_ENTRY(attn_fwd_07_mma_lean_d64, 64, BLOCK_N_D64, 1, true, STAGES_D64, true, true, 1, false, true, true, false)
ATTN07_ENTRY(attn_fwd_07_mma_lean_d128, 128, BLOCK_N_D128, 1, true, STAGES_D128, true, true, 1, false, true, true, false)
ATTN07_ENTRY(attn_fwd_07_mma_lean_split2_d64, 64, BLOCK_N_D64, 2, true, STAGES_D64, true, true, 1, false, true, true, false)
ATTN07_ENTRY(attn_fwd_07_mma_lean_split2_d128, 128, BLOCK_N_D128, 2, true, STAGES_D128, true, true, 1, false, true, true, false)
ATTN07_ENTRY(attn_fwd_07_mma_lean_split4_d64, 64, BLOCK_N_D64, 4, true, STAGES_D64, true, true, 1, false, true, true, false)
ATTN07_ENTRY(attn_fwd_07_mma_lean_split4_d128, 128, BLOCK_N_D128, 4, true, STAGES_D128, true, true, 1, false, true, true, false)
ATTN07_ENTRY(attn_fwd_07_mma_lean_across_heads_d64, 64, BLOCK_N_D64, 1, true, STAGES_D64, true, true, 2, true, true, true, false)
ATTN07_ENTRY(attn_fwd_07_mma_lean_across_heads_d128, 128, BLOCK_N_D128, 1, true, STAGES_D128, true, true, 1, true, true, true, false)
ATTN07_ENTRY(attn_fwd_07_mma_lean_across_heads_split2_d64, 64, BLOCK_N_D64, 2, true, STAGES_D64, true, true, 2, true, true, true, false)
ATTN07_ENTRY(attn_fwd_07_mma_lean_across_heads_split2_d128, 128, BLOCK_N_D128, 2, true, STAGES_D128, true, true, 1, true, true, true, false)
ATTN07_ENTRY(attn_fwd_07_mma_lean_across_heads_split4_d64, 64, BLOCK_N_D64, 4, true, STAGES_D64, true, true, 2, true, true, true, false)
ATTN07_ENTRY(attn_fwd_07_mma_lean_across_heads_split4_d128, 128, BLOCK_N_D128, 4, true, STAGES_D128, true, true, 1, true, true, true, false)
// Step 7.12: step 7.11's entries with the whole-tile copy alone (SKIP_RESCALE = false).
ATTN07_ENTRY(attn_fwd_07_mma_whole_tiles_d64, 64, BLOCK_N_D64, 1, true, STAGES_D64, true, true, 1, false, true, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_whole_tiles_d128, 128, BLOCK_N_D128, 1, true, STAGES_D128, true, true, 1, false, true, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_whole_tiles_split2_d64, 64, BLOCK_N_D64, 2, true, STAGES_D64, true, true, 1, false, true, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_whole_tiles_split2_d128, 128, BLOCK_N_D128, 2, true, STAGES_D128, true, true, 1, false, true, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_whole_tiles_split4_d64, 64, BLOCK_N_D64, 4, true, STAGES_D64, true, true, 1, false, true, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_whole_tiles_split4_d128, 128, BLOCK_N_D128, 4, true, STAGES_D128, true, true, 1, false, true, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_whole_tiles_across_heads_d64, 64, BLOCK_N_D64, 1, true, STAGES_D64, true, true, 2, true, true, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_whole_tiles_across_heads_d128, 128, BLOCK_N_D128, 1, true, STAGES_D128, true, true, 1, true, true, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_whole_tiles_across_heads_split2_d64, 64, BLOCK_N_D64, 2, true, STAGES_D64, true, true, 2, true, true, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_whole_tiles_across_heads_split2_d128, 128, BLOCK_N_D128, 2, true, STAGES_D128, true, true, 1, true, true, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_whole_tiles_across_heads_split4_d64, 64, BLOCK_N_D64, 4, true, STAGES_D64, true, true, 2, true, true, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_whole_tiles_across_heads_split4_d128, 128, BLOCK_N_D128, 4, true, STAGES_D128, true, true, 1, true, true, false, false)

// Step 7.13: step 7.12's entries with each tile's O += P V a tile later (DEFER_PV), but for its two
// row blocks at D = 64: there the P held for the next trip takes ptxas to 255 registers, and the loop
// it schedules waits more than step 7.12's (the step runs step 7.12's entries there; the two-row
// entries with DEFER_PV at the end are the ablation 07_mma_deferred_pv_two_rows that says so).
ATTN07_ENTRY(attn_fwd_07_mma_deferred_pv_d64, 64, BLOCK_N_D64, 1, true, STAGES_D64, true, true, 1, false, true, false, true)
ATTN07_ENTRY(attn_fwd_07_mma_deferred_pv_d128, 128, BLOCK_N_D128, 1, true, STAGES_D128, true, true, 1, false, true, false, true)
ATTN07_ENTRY(attn_fwd_07_mma_deferred_pv_split2_d64, 64, BLOCK_N_D64, 2, true, STAGES_D64, true, true, 1, false, true, false, true)
ATTN07_ENTRY(attn_fwd_07_mma_deferred_pv_split2_d128, 128, BLOCK_N_D128, 2, true, STAGES_D128, true, true, 1, false, true, false, true)
ATTN07_ENTRY(attn_fwd_07_mma_deferred_pv_split4_d64, 64, BLOCK_N_D64, 4, true, STAGES_D64, true, true, 1, false, true, false, true)
ATTN07_ENTRY(attn_fwd_07_mma_deferred_pv_split4_d128, 128, BLOCK_N_D128, 4, true, STAGES_D128, true, true, 1, false, true, false, true)
ATTN07_ENTRY(attn_fwd_07_mma_deferred_pv_across_heads_d128, 128, BLOCK_N_D128, 1, true, STAGES_D128, true, true, 1, true, true, false, true)
ATTN07_ENTRY(attn_fwd_07_mma_deferred_pv_across_heads_split2_d128, 128, BLOCK_N_D128, 2, true, STAGES_D128, true, true, 1, true, true, false, true)
ATTN07_ENTRY(attn_fwd_07_mma_deferred_pv_across_heads_split4_d128, 128, BLOCK_N_D128, 4, true, STAGES_D128, true, true, 1, true, true, false, true)
ATTN07_ENTRY(attn_fwd_07_mma_deferred_pv_two_rows_d64, 64, BLOCK_N_D64, 1, true, STAGES_D64, true, true, 2, true, true, false, true)
ATTN07_ENTRY(attn_fwd_07_mma_deferred_pv_two_rows_split2_d64, 64, BLOCK_N_D64, 2, true, STAGES_D64, true, true, 2, true, true, false, true)
ATTN07_ENTRY(attn_fwd_07_mma_deferred_pv_two_rows_split4_d64, 64, BLOCK_N_D64, 4, true, STAGES_D64, true, true, 2, true, true, false, true)
// Step 7.12's two-row entries at D = 128 too (two row blocks make Q_FROM_TILE), with 32-key tiles on
// every GPU, for the ablation 07_mma_two_rows_at_d128. A 4-way split of a 32-key tile would leave 8
// keys a group: no such entry.
ATTN07_ENTRY(attn_fwd_07_mma_q_from_tile_d128, 128, BLOCK_N_D128_TWO_ROWS, 1, true, STAGES_D128, true, true, 2, true, true, false, false)
ATTN07_ENTRY(attn_fwd_07_mma_q_from_tile_split2_d128, 128, BLOCK_N_D128_TWO_ROWS, 2, true, STAGES_D128, true, true, 2, true, true, false, false)

// FlashAttention-2's split across CTAs (07_mma_split_ctas): the partial kernel (grid z = splits),
// then the combine.
#define ATTN07_PARTIAL_ENTRY(NAME, D, BLOCK_N, STAGES)                                                         \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_CTAS_PER_SM)                                     \
    NAME(const __half* __restrict__ q, const __half* __restrict__ k, const __half* __restrict__ v,             \
         float* __restrict__ o_part, float* __restrict__ ml, int L, int D_, float scale, int causal) {         \
        attn_fwd_07<D, BLOCK_N, 1, true, STAGES, true, true, 1, false, false, false, false, true>(q, k, v, nullptr, \
                                                                                                  o_part, ml, L, scale, causal); \
    }

ATTN07_PARTIAL_ENTRY(attn_fwd_07_mma_partial_d64, 64, BLOCK_N_D64, STAGES_D64)
ATTN07_PARTIAL_ENTRY(attn_fwd_07_mma_partial_d128, 128, BLOCK_N_D128, STAGES_D128)

// O of each of `rows` = B*H*L rows from its `splits` partials: the merge of the CTA split above,
// through global memory. One thread per 4 columns of a row (float4 reads; consecutive threads,
// consecutive columns). A split whose m is -inf saw no key of the row and is skipped (its O was
// never written); l = 0 for every split cannot happen for a row < L, and would give O = 0.
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS)
attn_combine_07(const float* __restrict__ o_part, const float* __restrict__ ml, __half* __restrict__ o,
                int rows, int D, int splits, float scale) {
    const int chunks = D / 4;
    const long long idx = static_cast<long long>(blockIdx.x) * COMBINE_THREADS + threadIdx.x;
    if (idx >= static_cast<long long>(rows) * chunks) return;
    const long long row = idx / chunks;
    const int col = static_cast<int>(idx % chunks) * 4;
    const float scale_log2 = fmaxf(fabsf(scale) * LOG2E, SMALLEST_NORMAL);  // as in the partial kernel
    float m = ATTN_NEG_INF;
    for (int s = 0; s < splits; ++s) m = fmaxf(m, ml[(s * static_cast<long long>(rows) + row) * 2]);
    const float m_use = (m == ATTN_NEG_INF) ? 0.f : m;
    float l = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int s = 0; s < splits; ++s) {
        const long long r = s * static_cast<long long>(rows) + row;
        const float m_s = ml[r * 2];
        if (m_s == ATTN_NEG_INF) continue;
        const float w = attn::exp2_approx((m_s - m_use) * scale_log2);
        l += ml[r * 2 + 1] * w;
        const float4 p = *reinterpret_cast<const float4*>(o_part + r * D + col);
        acc[0] += p.x * w; acc[1] += p.y * w; acc[2] += p.z * w; acc[3] += p.w * w;
    }
    const float inv_l = l > 0.f ? 1.f / l : 0.f;
    *reinterpret_cast<uint2*>(o + row * D + col) =
        make_uint2(pack_half2(acc[0] * inv_l, acc[1] * inv_l), pack_half2(acc[2] * inv_l, acc[3] * inv_l));
}
