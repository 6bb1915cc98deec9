// The PTX instructions the chapters use, each behind a named function, defined once.
//
// On the GPU each function is its inline `asm`. Built for attnlab's CPU executor (ATTN_CPU, see
// src/attnlab/executor), each calls the executor's C++ implementation of what the PTX ISA
// specifies (sections named below), so the kernels that call them run unchanged on both.
#pragma once
#include <cuda_fp16.h>

namespace attn {

// The 32-bit shared-memory address of a generic pointer into shared memory (what ldmatrix and
// cp.async take).
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

#ifndef ATTN_CPU

// cp.async.cg.shared.global (ISA 9.7.9.25.3.1): 16 bytes global -> shared without passing
// through registers (.cg: cached in L2 only). With src_bytes = 0 nothing is read and the 16
// bytes are zero-filled (rows past L).
__device__ __forceinline__ void cp_async_16(unsigned smem_dst, const void* gmem_src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_dst), "l"(gmem_src), "r"(src_bytes)
                 : "memory");
}
// cp.async.commit_group: close the group of copies issued since the last commit (an empty group
// is fine and still counts).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// cp.async.wait_group N: wait until at most N of this thread's committed groups are in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16 (ISA 9.7.14.5.15): four 8x8 fp16 matrices; lanes
// 8i..8i+7 give the row addresses of matrix i, which lands in register i.
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
// The same, each matrix transposed (.trans).
__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 (ISA 9.7.14.5.8): d += a (16x16, row
// fragments) * b (16x8, column fragments), fp16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// bar.sync id, count (ISA 9.7.13.1): wait until `count` threads (a multiple of 32) have arrived
// at named barrier `id` (1..15; 0 is __syncthreads).
__device__ __forceinline__ void bar_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// bar.arrive id, count: count this thread towards the barrier's current phase and go on.
__device__ __forceinline__ void bar_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// ex2.approx.ftz.f32 (ISA 9.7.3.22): 2^x on the special-function unit, what exp2f becomes under
// --use_fast_math, without its range fix-up for results below 2^-126 (flushed to 0).
// exp2(-inf) = +0.
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// st.global.v4.b32: one 16-byte global store. Written out because the compiler splits a plain
// uint4 assignment into four 4-byte stores when it cannot prove the 16-byte alignment these
// kernels require of their outputs.
__device__ __forceinline__ void store_global_16(void* dst, uint4 v) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

#else  // ATTN_CPU: the executor's implementations (src/attnlab/executor/runtime)

__device__ __forceinline__ void cp_async_16(unsigned smem_dst, const void* gmem_src, int src_bytes) {
    attn_cpu::cp_async_16(smem_dst, gmem_src, src_bytes);
}
__device__ __forceinline__ void cp_async_commit() { attn_cpu::cp_async_commit(); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { attn_cpu::cp_async_wait(N); }
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) { attn_cpu::ldmatrix_x4(r, addr, false); }
__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], unsigned addr) { attn_cpu::ldmatrix_x4(r, addr, true); }
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    attn_cpu::mma_m16n8k16(d, a, b0, b1);
}
__device__ __forceinline__ void bar_sync(int id, int count) { attn_cpu::bar_sync(id, count); }
__device__ __forceinline__ void bar_arrive(int id, int count) { attn_cpu::bar_arrive(id, count); }
__device__ __forceinline__ float exp2_approx(float x) { return attn_cpu::ex2_approx_ftz(x); }
__device__ __forceinline__ void store_global_16(void* dst, uint4 v) { attn_cpu::store_global_16(dst, v); }

#endif

}  // namespace attn
