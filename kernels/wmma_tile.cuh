// The tensor-core tile math shared by chapters 5 and 6: one warp owns 16 query rows and, per key
// tile, computes S = Q K^T with WMMA, folds S into its rows' online softmax through shared memory,
// and accumulates O += P V with WMMA. Chapter 5 feeds it K/V tiles loaded by all threads between
// two __syncthreads; chapter 6 feeds it from a cp.async ring filled by producer warps.
//
// Why the scores go through shared memory: a WMMA accumulator fragment does not say which (row,
// column) each of its elements holds (the layout is unspecified and differs between GPUs), so a
// row-wise max or sum cannot be taken in registers. store_matrix_sync puts S in a row-major fp32
// tile where two lanes own each row; they write P (fp16) next to it and load_matrix_sync reloads
// P as a matrix_a fragment for P V.
//
// Why O lives in shared memory (fp32): the online softmax multiplies every row of O by
// exp(m_old - m_new) when a row's max moves, which again needs the row of each element. O is a
// [64, D] fp32 tile in shared memory; the two lanes of a row rescale it in place, and P V loads
// it into accumulator fragments (load_matrix_sync accepts accumulators), adds P V and stores it
// back. The price is two shared-memory round trips of O per key tile: chapter 7 removes them by
// using mma.sync, whose fragment layout is documented, with O and P in registers.
//
// Shared-memory layout of one block (64 query rows; BN keys per tile), all row-major and padded:
//   K, V tiles  BN x (D + 8) fp16   (+8 halves: consecutive rows start 16 bytes apart in the bank
//                                     space, so the 8 rows an ldmatrix-style load reads hit
//                                     different banks)
//   S           64 x (BN + 4) fp32  (scores; 16 rows per warp)
//   P           64 x (BN + 8) fp16  (probabilities; 16 rows per warp)
//   O           64 x (D + 4)  fp32  (output accumulator; 16 rows per warp; Q is staged here first)
// WMMA needs 32-byte aligned tile pointers and a leading dimension that is a multiple of 16
// bytes: every stride above and every region size is.
#pragma once
#include <mma.h>

#include "common.cuh"
#include "ptx.cuh"

namespace attn {
namespace wm {

using namespace nvcuda;

// Chapter 8's search (src/attnlab/gpu/search.py) may set BLOCK_M with -DATTN_WMMA_BLOCK_M=...; without
// it, the chapters' value below.
#ifdef ATTN_WMMA_BLOCK_M
constexpr int BLOCK_M = ATTN_WMMA_BLOCK_M;
#else
constexpr int BLOCK_M = 64;                      // query rows per block
#endif
constexpr int WARP_M = 16;                       // query rows per compute warp: one WMMA tile high
constexpr int COMPUTE_WARPS = BLOCK_M / WARP_M;  // 4 warps do the math
constexpr int MMA = 16;                          // m16n16k16
constexpr int PAD_HALF = 8;                      // padding of fp16 rows, in halves (16 bytes)
constexpr int PAD_FLOAT = 4;                     // padding of fp32 rows, in floats (16 bytes)

using FragA = wmma::fragment<wmma::matrix_a, MMA, MMA, MMA, __half, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, MMA, MMA, MMA, __half, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, MMA, MMA, MMA, __half, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, MMA, MMA, MMA, float>;

// Strides (elements) and sizes (bytes) of the tiles above for head dim D and key tile BN.
template <int D, int BN>
struct Tiles {
    static_assert(D % MMA == 0 && BN % MMA == 0, "WMMA tiles are 16 x 16");
    static constexpr int KV_LD = D + PAD_HALF;
    static constexpr int S_LD = BN + PAD_FLOAT;
    static constexpr int P_LD = BN + PAD_HALF;
    static constexpr int O_LD = D + PAD_FLOAT;
    static constexpr int KV_TILE_BYTES = BN * KV_LD * 2;  // one K or one V tile
    static constexpr int S_BYTES = BLOCK_M * S_LD * 4;
    static constexpr int P_BYTES = BLOCK_M * P_LD * 2;
    static constexpr int O_BYTES = BLOCK_M * O_LD * 4;
    // Shared memory besides the K/V tiles: S, P and O.
    static constexpr int WORK_BYTES = S_BYTES + P_BYTES + O_BYTES;
    static_assert(KV_TILE_BYTES % 128 == 0 && S_BYTES % 128 == 0 && P_BYTES % 128 == 0,
                  "regions stay 128-byte aligned");
    // Q (16 x (D + 8) fp16) is staged in the warp's own O rows (16 x (D + 4) fp32).
    static_assert(WARP_M * (D + PAD_HALF) * 2 <= WARP_M * O_LD * 4, "Q staging fits in O");
};

// Key tiles a block of query rows [q0, q0 + 64) visits. Causal: keys up to its last valid row
// only, so tiles entirely above the diagonal are never loaded. Every role of a block computes
// the same number from the same arguments.
__device__ __forceinline__ int num_key_tiles(int L, int q0, bool causal, int bn) {
    const int key_end = causal ? min(q0 + BLOCK_M, L) : L;
    return ceil_div(key_end, bn);
}

// The warp loads its 16 Q rows (zeros past L) into its O rows, takes them as matrix_a fragments
// (kept in registers for the whole kernel), then zeroes its O rows. Warp-private: no block barrier.
template <int D>
__device__ __forceinline__ void load_q_fragments(FragA (&qf)[D / MMA], const __half* q_head, int row0,
                                                 int L, float* o_w, int lane) {
    constexpr int LD = D + PAD_HALF;
    constexpr int CHUNKS_PER_ROW = D / 8;  // 16-byte chunks
    __half* stage = reinterpret_cast<__half*>(o_w);
    for (int c = lane; c < WARP_M * CHUNKS_PER_ROW; c += 32) {
        const int r = c / CHUNKS_PER_ROW, col = (c % CHUNKS_PER_ROW) * 8;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (row0 + r < L) val = *reinterpret_cast<const uint4*>(q_head + (long long)(row0 + r) * D + col);
        *reinterpret_cast<uint4*>(stage + r * LD + col) = val;
    }
    __syncwarp();
#pragma unroll
    for (int kk = 0; kk < D / MMA; ++kk) wmma::load_matrix_sync(qf[kk], stage + kk * MMA, LD);
    __syncwarp();
    constexpr int O_LD = D + PAD_FLOAT;
    for (int i = lane; i < WARP_M * O_LD / 4; i += 32)
        reinterpret_cast<float4*>(o_w)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    __syncwarp();
}

// S_w (16 x BN fp32, this warp's rows) = Q_w K^T. K^T is K read column-major: element (d, j) of
// K^T is K[j][d], at k_s[j * KV_LD + d].
template <int D, int BN>
__device__ __forceinline__ void warp_scores(const FragA (&qf)[D / MMA], const __half* k_s, float* s_w) {
    using T = Tiles<D, BN>;
#pragma unroll
    for (int j = 0; j < BN / MMA; ++j) {
        FragC acc;
        wmma::fill_fragment(acc, 0.f);
#pragma unroll
        for (int kk = 0; kk < D / MMA; ++kk) {
            FragBCol kf;
            wmma::load_matrix_sync(kf, k_s + j * MMA * T::KV_LD + kk * MMA, T::KV_LD);
            wmma::mma_sync(acc, qf[kk], kf, acc);
        }
        wmma::store_matrix_sync(s_w + j * MMA, acc, T::S_LD, wmma::mem_row_major);
    }
}

// The online softmax of one key tile for this warp's 16 rows. Lanes 2r and 2r+1 own row r; lane
// `half` reads the float2 columns 4j + 2*half, so each half-warp's 8-byte reads touch 32
// distinct banks. In registers per lane: m, the row's running max (equal in both lanes), and l,
// the lane's share of the row's running sum (the two shares are added once, at the end).
//   scores: s = S * scale, or -inf for keys >= key_limit (past L, or above the diagonal)
//   m_new = max(m, max_j s);  corr = exp(m - m_new)  (0 while m = -inf)
//   p = exp(s - m_new) in fp32 -> l = l * corr + sum p;  P = fp16(p)
//   O row *= corr  (skipped when the max did not move: corr is then exactly 1)
template <int D, int BN>
__device__ __forceinline__ void warp_online_softmax(const float* s_w, __half* p_w, float* o_w,
                                                    float& m, float& l, int kv0, int key_limit,
                                                    float scale, int lane) {
    using T = Tiles<D, BN>;
    const int r = lane >> 1, half = lane & 1;
    const float* s_row = s_w + r * T::S_LD;
    float s[BN / 2];
    float tile_max = ATTN_NEG_INF;
#pragma unroll
    for (int j = 0; j < BN / 4; ++j) {
        const int c = 4 * j + 2 * half;
        const float2 v = *reinterpret_cast<const float2*>(s_row + c);
        s[2 * j] = (kv0 + c < key_limit) ? v.x * scale : ATTN_NEG_INF;
        s[2 * j + 1] = (kv0 + c + 1 < key_limit) ? v.y * scale : ATTN_NEG_INF;
        tile_max = fmaxf(tile_max, fmaxf(s[2 * j], s[2 * j + 1]));
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const float corr = safe_exp_diff(m, m_new);
    float sum = 0.f;
    __half* p_row = p_w + r * T::P_LD;
#pragma unroll
    for (int j = 0; j < BN / 4; ++j) {
        const float p0 = safe_exp_diff(s[2 * j], m_new);
        const float p1 = safe_exp_diff(s[2 * j + 1], m_new);
        sum += p0 + p1;
        *reinterpret_cast<__half2*>(p_row + 4 * j + 2 * half) = __floats2half2_rn(p0, p1);
    }
    l = l * corr + sum;
    m = m_new;
    if (corr != 1.f) {
        float* o_row = o_w + r * T::O_LD;
#pragma unroll
        for (int j = 0; j < D / 4; ++j) {
            float2* ptr = reinterpret_cast<float2*>(o_row + 4 * j + 2 * half);
            float2 o = *ptr;
            o.x *= corr;
            o.y *= corr;
            *ptr = o;
        }
    }
}

// O_w (16 x D fp32 in shared memory) += P_w V: P as four (BN / 16) matrix_a fragments, O loaded
// into an accumulator fragment 16 columns at a time, updated with BN / 16 WMMAs, stored back.
template <int D, int BN>
__device__ __forceinline__ void warp_pv(const __half* p_w, const __half* v_s, float* o_w) {
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
            FragBRow vf;
            wmma::load_matrix_sync(vf, v_s + kk * MMA * T::KV_LD + n * MMA, T::KV_LD);
            wmma::mma_sync(acc, pf[kk], vf, acc);
        }
        wmma::store_matrix_sync(o_w + n * MMA, acc, T::O_LD, wmma::mem_row_major);
    }
}

// Two floats rounded to fp16, as the 32 bits of a __half2.
__device__ __forceinline__ unsigned pack_half2(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const unsigned*>(&h);
}

// Divide each row of O_w by its sum and write rows < L to global memory as fp16, 16 bytes per
// lane per store (a row's D halves are written by D / 8 consecutive lanes).
template <int D>
__device__ __forceinline__ void warp_write_output(float* o_w, float l, __half* o_head, int row0, int L,
                                                  int lane) {
    constexpr int O_LD = D + PAD_FLOAT;
    l += __shfl_xor_sync(0xffffffffu, l, 1);  // the two lanes' shares of the row sum
    const float inv_l = 1.f / l;               // l >= 1: the row's max contributes exp(0)
    const int r = lane >> 1, half = lane & 1;
#pragma unroll
    for (int j = 0; j < D / 4; ++j) {
        float2* ptr = reinterpret_cast<float2*>(o_w + r * O_LD + 4 * j + 2 * half);
        float2 o = *ptr;
        o.x *= inv_l;
        o.y *= inv_l;
        *ptr = o;
    }
    __syncwarp();
    constexpr int CHUNKS_PER_ROW = D / 8;
    for (int c = lane; c < WARP_M * CHUNKS_PER_ROW; c += 32) {
        const int rr = c / CHUNKS_PER_ROW, col = (c % CHUNKS_PER_ROW) * 8;
        if (row0 + rr >= L) continue;  // rows past L are computed (on zeros) but never written
        const float4 a = *reinterpret_cast<const float4*>(o_w + rr * O_LD + col);
        const float4 b = *reinterpret_cast<const float4*>(o_w + rr * O_LD + col + 4);
        const uint4 packed = make_uint4(pack_half2(a.x, a.y), pack_half2(a.z, a.w),
                                        pack_half2(b.x, b.y), pack_half2(b.z, b.w));
        attn::store_global_16(o_head + (long long)(row0 + rr) * D + col, packed);
    }
}

}  // namespace wm
}  // namespace attn
