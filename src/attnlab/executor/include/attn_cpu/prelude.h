// Pre-included (g++ -include) into every kernel translation unit the CPU executor builds. It makes
// the CUDA C++ the chapters use compile as ordinary C++: the execution-space keywords become
// nothing, the built-in variables read the running thread's coordinates from the runtime, and
// every operation that synchronizes or exchanges data between threads (barriers, shuffles,
// ldmatrix, mma.sync, WMMA, cp.async) is a call into the runtime (runtime/runtime.cpp), which runs
// the threads of a block as fibers and implements each operation as the PTX ISA specifies.
//
// Every load and store of the kernel is seen by the runtime: the kernel is compiled with
// -fsanitize=thread, which calls __tsan_read<N>/__tsan_write<N> before each memory access, and the
// runtime, not ThreadSanitizer's library, defines those functions (runtime/memory.cpp).
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define ATTN_CPU 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
// `__shared__` declarations are rewritten before compilation (attnlab.executor.build); one left
// over is a form the rewrite does not know, and this name in the error says so.
#define __shared__ ATTN_CPU_UNSUPPORTED_SHARED_DECLARATION

// ---- vector types -------------------------------------------------------------------------
struct uint3 { unsigned x, y, z; };
struct dim3 { unsigned x, y, z; };
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
struct __attribute__((aligned(8))) uint2 { unsigned x, y; };
struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

// ---- the runtime's side -------------------------------------------------------------------
namespace attn_cpu {

// What the kernel reads about the running thread and block. The runtime keeps these in one
// region of its own, which its memory checks know and skip.
struct Coordinates {
    uint3 thread_idx;
};
struct LaunchView {
    Coordinates* current;  // the running thread
    uint3 block_idx;
    dim3 block_dim;
    dim3 grid_dim;
};
extern LaunchView view;

// Shared memory: the launch's dynamic bytes, and one slot per static __shared__ declaration.
void* dynamic_shared(unsigned align);
void* static_shared(int id, size_t bytes, size_t align);
unsigned shared_address(const void* generic);  // __cvta_generic_to_shared

// Synchronization and warp-collective operations (runtime/sync.cpp, runtime/warp.cpp).
void syncthreads();
void syncwarp(unsigned mask);
unsigned shfl(unsigned mask, unsigned value, int lane_or_offset, int width, int mode);
void bar_sync(int id, int count);
void bar_arrive(int id, int count);

// PTX instructions behind kernels/ptx.cuh (runtime/ptx.cpp).
void cp_async_16(unsigned dst, const void* src, int src_bytes);
void cp_async_commit();
void cp_async_wait(int pending);
void ldmatrix_x4(unsigned (&r)[4], unsigned addr, bool trans);
void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1);
float ex2_approx_ftz(float x);
void store_global_16(void* dst, uint4 v);

}  // namespace attn_cpu

#define threadIdx (attn_cpu::view.current->thread_idx)
#define blockIdx (attn_cpu::view.block_idx)
#define blockDim (attn_cpu::view.block_dim)
#define gridDim (attn_cpu::view.grid_dim)

// ---- intrinsics ---------------------------------------------------------------------------
inline void __syncthreads() { attn_cpu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { attn_cpu::syncwarp(mask); }

namespace attn_cpu {
// A 32-bit value of any type through shfl.sync (mode 0 bfly, 1 idx, 2 down, 3 up).
template <class T>
inline T shuffle_value(unsigned mask, T v, int lane_arg, int width, int mode) {
    static_assert(sizeof(T) == 4, "the executor shuffles 32-bit values");
    unsigned bits;
    memcpy(&bits, &v, 4);
    bits = shfl(mask, bits, lane_arg, width, mode);
    memcpy(&v, &bits, 4);
    return v;
}
}  // namespace attn_cpu
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return attn_cpu::shuffle_value(mask, v, lane_mask, width, 0);
}
template <class T>
inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
    return attn_cpu::shuffle_value(mask, v, src_lane, width, 1);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return attn_cpu::shuffle_value(mask, v, (int)delta, width, 2);
}

inline size_t __cvta_generic_to_shared(const void* p) { return attn_cpu::shared_address(p); }

inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
// __expf is ex2.approx.ftz(x * log2(e)) on the GPU.
inline float __expf(float x) { return attn_cpu::ex2_approx_ftz(x * 1.4426950408889634f); }
inline float __fdividef(float a, float b) { return a / b; }

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

#include <cuda_fp16.h>
