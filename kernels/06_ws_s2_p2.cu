// Chapter 6, sweep variant: 2 stages, 2 producer warps. The kernel is the template of
// 06_warp_specialized.cu (the chapter's kernel: 2 stages, 1 producer warp); only its arguments
// differ. Launch: block (192,), grid (ceil(L / 64), B*H); shared memory as listed there.
#define ATTN06_SWEEP_VARIANT
#include "06_warp_specialized.cu"

extern "C" __global__ void __launch_bounds__(Roles<2>::THREADS, 1)
attn_fwd_06_ws_s2_p2(const __half* __restrict__ q, const __half* __restrict__ k,
                     const __half* __restrict__ v, __half* __restrict__ o,
                     int L, int D, float scale, int causal) {
    dispatch<2, 2>(q, k, v, o, L, D, scale, causal);
}
