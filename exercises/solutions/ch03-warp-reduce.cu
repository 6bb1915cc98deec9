// Exercise ch03-warp-reduce (chapter 3, kernels/common.cuh): butterfly reductions over lane groups.
//
// Chapter 3 splits a query row across G lanes of a warp (G = 1, 2, 4, 8 or 16: the lanes of a
// row are an aligned group, lanes g*G .. g*G + G - 1). Each lane computes a partial dot product
// over its slice of D, and the row's score is the sum of the G partials: a reduction inside the
// group, through registers, with no shared memory and no barrier. __shfl_xor_sync(mask, v, off)
// returns the v of lane (this lane ^ off). A butterfly repeats "combine with the lane across" with
// a different off at each step, until every lane of the group holds its group's result. Which
// offsets, how many steps, and which keep every group to itself?
//
// Your task: write group_sum and group_max (a few lines each): every lane returns the sum (max)
// of v over its own aligned group of `width` lanes (width a power of two, 1..32). Every lane of
// the warp calls them together (mask: the full warp), with the same width.
//
// Check (no GPU needed; the CPU executor runs the kernel below at every width and several seeds,
// and compares each lane's result with the exact one):
//   python -m attnlab exercises check ch03-warp-reduce exercises/ch03-warp-reduce.cu
#include <cuda_fp16.h>

#define NEG_INF (-__int_as_float(0x7f800000))
constexpr unsigned FULL_MASK = 0xffffffffu;

// ---- TODO(exercise): group_sum and group_max ----------------------------------------------------
// v: this lane's value. Return the sum (max) of v over the lanes l' with l' / width == lane / width,
// in EVERY lane of the group. Shuffle with __shfl_xor_sync(FULL_MASK, value, offset).
__device__ __forceinline__ float group_sum(float v, int width) {
    for (int off = width / 2; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

__device__ __forceinline__ float group_max(float v, int width) {
    for (int off = width / 2; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off));
    return v;
}
// ---- end of exercise ---------------------------------------------------------------------------

// sum[i], max[i]: the sum and max of x over thread i's group of `width` lanes. Lanes past n take
// part with the neutral element (0, -inf) and write nothing. Launch: blockDim.x a multiple of 32.
extern "C" __global__ void ex03_group_reduce(const float* __restrict__ x, float* __restrict__ sum,
                                             float* __restrict__ max, int n, int width) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float s = group_sum(i < n ? x[i] : 0.f, width);
    const float m = group_max(i < n ? x[i] : NEG_INF, width);
    if (i < n) {
        sum[i] = s;
        max[i] = m;
    }
}
