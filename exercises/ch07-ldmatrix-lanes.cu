// Exercise ch07-ldmatrix-lanes (chapter 7, kernels/swizzle.cuh, 07_mma_swizzle.cu): who names which row.
//
// Chapter 7 computes S = Q K^T with mma.sync.m16n8k16: a warp multiplies a 16 x 16 fp16 A block
// by a 16 x 8 B block into a 16 x 8 fp32 block, each lane holding fixed pieces of each operand in
// registers (PTX ISA 9.7.14.5.8; g = lane / 4, t = lane % 4):
//   A (Q, rows x head dim):   a0 = Q[g][2t, 2t+1]      a1 = Q[g+8][2t, 2t+1]
//                             a2 = Q[g][8+2t, 8+2t+1]  a3 = Q[g+8][8+2t, 8+2t+1]
//   B (K^T, head dim x keys): b0 = K[key g][2t, 2t+1]  b1 = K[key g][8+2t, 8+2t+1]
// (columns relative to the k-step's 16 head-dim columns). ldmatrix.x4 fills exactly such registers
// from shared memory: it loads four 8 x 8 matrices, register i of every lane gets matrix i, and
// lane l's register i holds row l / 4, halves 2 (l % 4) and 2 (l % 4) + 1 of it. Where each
// matrix comes from is up to the lanes: lanes 8i .. 8i+7 give the addresses of the 8 rows of
// matrix i (one 16-byte chunk of a tile row each). A 16 x 16 block is 16 rows x 2 chunks.
//   - Q (A order): the four matrices must be a0, a1, a2, a3 of one k-step.
//   - K (B order): one ldmatrix.x4 serves two 8-key blocks: registers 0, 1 are b0, b1 of keys
//     0-7, registers 2, 3 are b0, b1 of keys 8-15.
//
// Your task: write the four lane maps (1 line each): the row (0..15 within the block) and the
// chunk (0 or 1 within the k-step) that lane `lane` names, for each order. The kernel below loads
// a 16 x 64 Q block and a 16-key K block into swizzled shared tiles, takes every fragment with
// ldmatrix through your maps, and runs the mma.sync products.
//
// Check (no GPU needed; the checker reads every register against the mma.sync tables, then S):
//   python -m attnlab exercises check ch07-ldmatrix-lanes exercises/ch07-ldmatrix-lanes.cu
#include "common.cuh"
#include "ptx.cuh"
#include "swizzle.cuh"

// ---- TODO(exercise): the row and chunk each lane names for ldmatrix.x4 -----------------------------
// A order: matrices (rows 0-7, chunk 0), (rows 8-15, chunk 0), (rows 0-7, chunk 1), (rows 8-15, chunk 1).
__device__ __forceinline__ int a_row(int lane) { return lane % 8; }  // placeholder: every matrix
__device__ __forceinline__ int a_chunk(int lane) { return 0; }       // is rows 0-7 of chunk 0
// B order: matrices (rows 0-7, chunk 0), (rows 0-7, chunk 1), (rows 8-15, chunk 0), (rows 8-15, chunk 1).
__device__ __forceinline__ int b_row(int lane) { return lane % 8; }
__device__ __forceinline__ int b_chunk(int lane) { return 0; }
// ---- end of exercise ---------------------------------------------------------------------------

namespace {
constexpr int D = 64, ROW_BYTES = D * 2, KS = D / 16;
}

// One warp. q, k: [16][D] fp16. qa, kb: each lane's fragments, [KS][32 lanes][4] 32-bit registers.
// s: [16][16] fp32, S = Q K^T (keys 0-7 from b0, b1 of registers 0, 1; keys 8-15 from 2, 3).
// Launch: block (32,), grid (1,), dynamic shared memory 2 * 16 * D * 2 bytes.
extern "C" __global__ void __launch_bounds__(32)
ex07_ldmatrix_lanes(const __half* q, const __half* k, unsigned* qa, unsigned* kb, float* s) {
    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned q_tile = attn::smem_u32(smem), k_tile = q_tile + 16 * ROW_BYTES;
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    for (int idx = lane; idx < 16 * D / 8; idx += 32) {  // both blocks into swizzled tiles
        const int r = idx / (D / 8), c = idx % (D / 8);
        *reinterpret_cast<uint4*>(smem + attn::tile_offset<ROW_BYTES, true>(r, c)) =
            *reinterpret_cast<const uint4*>(q + r * D + c * 8);
        *reinterpret_cast<uint4*>(smem + 16 * ROW_BYTES + attn::tile_offset<ROW_BYTES, true>(r, c)) =
            *reinterpret_cast<const uint4*>(k + r * D + c * 8);
    }
    __syncwarp();
    float acc[2][4] = {};
    for (int ks = 0; ks < KS; ++ks) {
        unsigned a[4], b[4];
        attn::ldsm_x4(a, q_tile + attn::tile_offset<ROW_BYTES, true>(a_row(lane), 2 * ks + a_chunk(lane)));
        attn::ldsm_x4(b, k_tile + attn::tile_offset<ROW_BYTES, true>(b_row(lane), 2 * ks + b_chunk(lane)));
        for (int i = 0; i < 4; ++i) {
            qa[(ks * 32 + lane) * 4 + i] = a[i];
            kb[(ks * 32 + lane) * 4 + i] = b[i];
        }
        attn::mma_16816(acc[0], a, b[0], b[1]);
        attn::mma_16816(acc[1], a, b[2], b[3]);
    }
    for (int nb = 0; nb < 2; ++nb)  // C layout: c0, c1 row g, c2, c3 row g+8; columns 2t, 2t+1
        for (int e = 0; e < 4; ++e) s[(g + 8 * (e >> 1)) * 16 + nb * 8 + 2 * t + (e & 1)] = acc[nb][e];
}
