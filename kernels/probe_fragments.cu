// A probe, not an attention kernel (it is not in the registry): which element of each
// mma.sync.m16n8k16 fragment every lane holds, when the fragments are loaded the way chapter 7's
// kernel loads them (kernels/07_mma_swizzle.cu: swizzled 128-byte tile rows, ldmatrix.x4 in the
// A order for Q and in the B order for K, swizzle.cuh). The inputs carry their own coordinates:
// element (r, c) of the A tile holds 16 r + c, and so on, so the value a lane ends up with names
// the element it holds. attnlab.book.fragments.executed_maps runs it on the CPU executor and
// tests/test_executor_view.py holds the maps it reads back to the PTX ISA's tables.
//
// One warp. a: 16 x 64 fp16 (query rows x head dim, row-major), k: 16 x 64 (key rows x head dim).
// out_a[32][8]: lane l's A elements a0..a7 (register i holds a(2i) low, a(2i+1) high);
// out_b[32][4]: its b0..b3 of the B operand for keys 0-7 (registers kf[0], kf[1]);
// out_d[32][4]: its c0..c3 of D = A B, with B = keys 0-7 (K^T), accumulated from zero.
#include "ptx.cuh"
#include "swizzle.cuh"

extern "C" __global__ void attn_probe_fragments(const __half* __restrict__ a, const __half* __restrict__ k,
                                                float* __restrict__ out_a, float* __restrict__ out_b,
                                                float* __restrict__ out_d) {
    constexpr int ROW_BYTES = 64 * 2;
    __shared__ __align__(128) unsigned char a_s[16 * ROW_BYTES];
    __shared__ __align__(128) unsigned char k_s[16 * ROW_BYTES];
    const int lane = threadIdx.x;
    // Each lane copies 16-byte chunks into the swizzled tiles, as the kernel's cp.async does.
    for (int c = lane; c < 16 * 8; c += 32) {
        const int row = c / 8, chunk = c % 8;
        *reinterpret_cast<uint4*>(a_s + attn::tile_offset<ROW_BYTES, true>(row, chunk)) =
            *reinterpret_cast<const uint4*>(a + row * 64 + chunk * 8);
        *reinterpret_cast<uint4*>(k_s + attn::tile_offset<ROW_BYTES, true>(row, chunk)) =
            *reinterpret_cast<const uint4*>(k + row * 64 + chunk * 8);
    }
    __syncwarp();
    unsigned af[4], kf[4];
    attn::ldsm_x4(af, attn::smem_u32(a_s) + attn::tile_offset<ROW_BYTES, true>(attn::ldsm_row(lane), attn::ldsm_chunk(lane)));
    attn::ldsm_x4(kf, attn::smem_u32(k_s) + attn::tile_offset<ROW_BYTES, true>(attn::ldsm_row_b(lane), attn::ldsm_chunk_b(lane)));
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    attn::mma_16816(d, af, kf[0], kf[1]);
    for (int i = 0; i < 4; ++i) {
        const __half2 pa = *reinterpret_cast<const __half2*>(&af[i]);
        out_a[lane * 8 + 2 * i] = __low2float(pa);
        out_a[lane * 8 + 2 * i + 1] = __high2float(pa);
        out_d[lane * 4 + i] = d[i];
    }
    for (int j = 0; j < 2; ++j) {
        const __half2 pb = *reinterpret_cast<const __half2*>(&kf[j]);
        out_b[lane * 4 + 2 * j] = __low2float(pb);
        out_b[lane * 4 + 2 * j + 1] = __high2float(pb);
    }
}
