// The CPU executor's <mma.h>: nvcuda::wmma for the m16n16k16 fp16 shapes the chapters use.
//
// A fragment is what the CUDA headers make it: `num_elements` values per lane in `x[]` (16 fp16
// for matrix_a and matrix_b, 8 fp32 for the accumulator). Which matrix element each x[i] of each
// lane holds is unspecified by CUDA and differs between GPUs; the executor draws that mapping at
// random for every launch (from its seed), so code that relies on one mapping gives wrong results
// here. load/store/mma are warp-collective: every lane of the warp must call them, with the same
// pointer and leading dimension; the runtime (runtime/wmma.cpp) checks that, and sees every
// element's read and write.
#pragma once
#include <cuda_fp16.h>

namespace attn_cpu {
enum WmmaUse { WMMA_A_ROW, WMMA_A_COL, WMMA_B_ROW, WMMA_B_COL, WMMA_ACC };
void wmma_load(int use, void* lane_elements, const void* src, unsigned ldm, bool col_major);
void wmma_store(void* dst, const void* lane_elements, unsigned ldm, bool col_major);
void wmma_mma(float* d, const __half* a, int a_use, const __half* b, int b_use, const float* c);
}  // namespace attn_cpu

namespace nvcuda {
namespace wmma {

template <class A, class B>
struct same_type { static constexpr bool value = false; };
template <class A>
struct same_type<A, A> { static constexpr bool value = true; };

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment;

template <class Layout>
struct fragment<matrix_a, 16, 16, 16, __half, Layout> {
    static constexpr int num_elements = 16;
    static constexpr int use = same_type<Layout, row_major>::value ? attn_cpu::WMMA_A_ROW : attn_cpu::WMMA_A_COL;
    __half x[num_elements];
};
template <class Layout>
struct fragment<matrix_b, 16, 16, 16, __half, Layout> {
    static constexpr int num_elements = 16;
    static constexpr int use = same_type<Layout, row_major>::value ? attn_cpu::WMMA_B_ROW : attn_cpu::WMMA_B_COL;
    __half x[num_elements];
};
template <>
struct fragment<accumulator, 16, 16, 16, float, void> {
    static constexpr int num_elements = 8;
    float x[num_elements];
};

template <class Use, class T, class Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, T v) {
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = v;
}
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float, void>& f, float v) {
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = v;
}

template <class Use, class Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, __half, Layout>& f, const __half* p, unsigned ldm) {
    attn_cpu::wmma_load(f.use, f.x, p, ldm, false);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float, void>& f, const float* p, unsigned ldm,
                             layout_t layout) {
    attn_cpu::wmma_load(attn_cpu::WMMA_ACC, f.x, p, ldm, layout == mem_col_major);
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float, void>& f, unsigned ldm,
                              layout_t layout) {
    attn_cpu::wmma_store(p, f.x, ldm, layout == mem_col_major);
}
template <class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float, void>& d,
                     const fragment<matrix_a, 16, 16, 16, __half, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, __half, LB>& b,
                     const fragment<accumulator, 16, 16, 16, float, void>& c) {
    attn_cpu::wmma_mma(d.x, a.x, a.use, b.x, b.use, c.x);
}

}  // namespace wmma
}  // namespace nvcuda
