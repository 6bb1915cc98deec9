// Test kernels for the warp reductions of common.cuh (attn::warp_sum, attn::warp_max). They are
// not attention kernels and are not in the registry; tests/test_cpu_models.py builds this file
// and, on a GPU, launches it. Launch both with blockDim.x a multiple of 32.
//
// They catch the two reduction bugs of the earlier study:
// 1. A reduction that adds values of DIFFERENT rows (a butterfly wider than the group that owns
//    a row). attn_test_warp_reduce gives every lane a distinct value; each lane must come back
//    with the sum and max of its own group of `width` lanes, never of the whole warp.
// 2. A reduction of a value every lane already holds (32 copies of one number): 32 times too
//    large (or, divided back, too small). attn_test_group_dot reduces per-lane partial dot
//    products as kernels/03_warp_reductions.cu does; every lane of a group writes its copy of
//    the result, and each must equal the dot product computed on the host.
#include "common.cuh"

// sum[i], max[i]: the sum and max of x over lane i's group of `width` lanes (a power of two).
extern "C" __global__ void attn_test_warp_reduce(const float* __restrict__ x, float* __restrict__ sum,
                                                 float* __restrict__ max, int n, int width) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    // Every lane calls the shuffles; lanes past n contribute the neutral element.
    const float s = attn::warp_sum(i < n ? x[i] : 0.f, width);
    const float m = attn::warp_max(i < n ? x[i] : ATTN_NEG_INF, width);
    if (i < n) {
        sum[i] = s;
        max[i] = m;
    }
}

// a, b: [rows, D] fp16, D % 8 == 0, D <= 8 * width. Row r belongs to a group of `width` lanes;
// lane c of the group holds elements 8c..8c+7 (none when 8c >= D). out[r * width + c] is lane
// c's copy of sum_d a[r, d] * b[r, d], in fp32.
extern "C" __global__ void attn_test_group_dot(const __half* __restrict__ a, const __half* __restrict__ b,
                                               float* __restrict__ out, int rows, int D, int width) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int r = t / width, c = t % width;
    float partial = 0.f;
    if (r < rows) {
        for (int e = c * 8; e < min(D, c * 8 + 8); ++e) {
            const long long i = static_cast<long long>(r) * D + e;
            partial = fmaf(__half2float(a[i]), __half2float(b[i]), partial);
        }
    }
    const float dot = attn::warp_sum(partial, width);  // reduce each lane's OWN partial, once
    if (r < rows) out[static_cast<long long>(r) * width + c] = dot;
}
