// Chapter 6, sweep variant: 3 stages, 1 producer warp. The kernel is the template of
// 06_warp_specialized.cu (the chapter's kernel: 2 stages, 1 producer warp); only its arguments
// differ. Launch: block (160,), grid (ceil(L / 64), B*H); shared memory as listed there.
#define ATTN06_SWEEP_VARIANT
#include "06_warp_specialized.cu"

extern "C" __global__ void __launch_bounds__(Roles<1>::THREADS, 1)
attn_fwd_06_ws_s3_p1(const __half* __restrict__ q, const __half* __restrict__ k,
                     const __half* __restrict__ v, __half* __restrict__ o,
                     int L, int D, float scale, int causal) {
    dispatch<3, 1>(q, k, v, o, L, D, scale, causal);
}
