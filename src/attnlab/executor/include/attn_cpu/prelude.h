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
#include <stdio.h>
#include <string.h>
// Included here, before the printf macro below: libstdc++'s <cstdio> #undefs printf, and a
// kernel's own later #include <cstdio> is then a no-op that leaves the macro in place.
#include <cstdio>
#include <cstring>

#include <type_traits>

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

// Shared memory: the launch's dynamic bytes, and one slot per static __shared__ declaration
// (`id` numbers the declarations; `name`, the element size and the extents name its bytes in
// findings).
void* dynamic_shared(unsigned align, const char* name, size_t element);
void* static_shared(int id, size_t bytes, size_t align, const char* name, size_t element, int rank,
                    const size_t* dims);
template <class A>
using type_t = A;  // `type_t<float[4][8]>& tile`: any declared type as one name
template <class A>
inline A& static_shared_as(int id, size_t align, const char* name) {
    static constexpr size_t dims[4] = {std::extent<A, 0>::value, std::extent<A, 1>::value,
                                       std::extent<A, 2>::value, std::extent<A, 3>::value};
    static_assert(std::rank<A>::value <= 4, "the executor names shared arrays of up to 4 dimensions");
    return *static_cast<A*>(static_shared(id, sizeof(A), align ? align : alignof(A), name,
                                          sizeof(std::remove_all_extents_t<A>), (int)std::rank<A>::value, dims));
}
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

// Atomic read-modify-write (runtime/atomics.cpp): op on the `size`-byte value at p, of `type`;
// returns the old value's bits. Checked like any access; atomics never race with each other.
enum AtomicOp { A_ADD, A_SUB, A_EXCH, A_MIN, A_MAX, A_INC, A_DEC, A_CAS, A_AND, A_OR, A_XOR };
enum AtomicType { T_I32, T_U32, T_U64, T_F32, T_F64, T_I64 };
uint64_t atomic_rmw(void* p, int op, int type, uint64_t operand, uint64_t compare);
int device_printf(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace attn_cpu

#define threadIdx (attn_cpu::view.current->thread_idx)
#define blockIdx (attn_cpu::view.block_idx)
#define blockDim (attn_cpu::view.block_dim)
#define gridDim (attn_cpu::view.grid_dim)

// ---- intrinsics ---------------------------------------------------------------------------
inline void __syncthreads() { attn_cpu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { attn_cpu::syncwarp(mask); }

// ---- warp intrinsics (runtime/warp.cpp) ---------------------------------------------------
// CUDA C++ Programming Guide, "Warp Shuffle Functions", "Warp Vote Functions", "Warp Match
// Functions", "Warp Reduce Functions". Each but __activemask is a meeting of the mask's lanes.
namespace attn_cpu {
// Qualifiers of vote.sync, match.sync and redux.sync (PTX ISA 9.7.13.9, 9.7.13.10, 9.7.13.12).
enum VoteMode { VOTE_BALLOT, VOTE_ANY, VOTE_ALL, VOTE_UNI };
enum MatchMode { MATCH_ANY_B32, MATCH_ALL_B32, MATCH_ANY_B64, MATCH_ALL_B64 };
enum ReduxOp { REDUX_ADD_U32, REDUX_ADD_S32, REDUX_MIN_U32, REDUX_MIN_S32, REDUX_MAX_U32, REDUX_MAX_S32,
               REDUX_AND, REDUX_OR, REDUX_XOR };
unsigned vote(unsigned mask, int pred, int mode);
unsigned match(unsigned mask, unsigned long long value, int mode);
unsigned redux(unsigned mask, unsigned value, int op);
unsigned activemask();

// A 32- or 64-bit value of any type through shfl.sync (mode 0 bfly, 1 idx, 2 down, 3 up). shfl.sync
// moves 32 bits: a 64-bit value goes as two shuffles, low word first, as CUDA's overloads for
// double and long long do. Forced inline so that a finding's pc is the kernel's line.
// An 8- or 16-bit value (char, short, bool, __half) goes in the low bits of one 32-bit word, as
// CUDA's overloads for them do (promotion, or __half's own overload through a 32-bit register).
template <class T>
__forceinline__ T shuffle_value(unsigned mask, T v, int lane_arg, int width, int mode) {
    static_assert(sizeof(T) <= 4 || sizeof(T) == 8, "the executor shuffles values of 1, 2, 4 or 8 bytes");
    constexpr size_t n = sizeof(T) < 4 ? 1 : sizeof(T) / 4;
    unsigned words[n] = {};
    __builtin_memcpy(words, &v, sizeof(T));
    for (unsigned& w : words) w = shfl(mask, w, lane_arg, width, mode);
    __builtin_memcpy(&v, words, sizeof(T));
    return v;
}
template <class T>
__forceinline__ unsigned long long match_bits(T v) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "match.sync compares 32- and 64-bit values");
    unsigned long long bits = 0;
    __builtin_memcpy(&bits, &v, sizeof(T));
    return bits;
}
}  // namespace attn_cpu
template <class T>
__forceinline__ T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return attn_cpu::shuffle_value(mask, v, lane_mask, width, 0);
}
template <class T>
__forceinline__ T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
    return attn_cpu::shuffle_value(mask, v, src_lane, width, 1);
}
template <class T>
__forceinline__ T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return attn_cpu::shuffle_value(mask, v, (int)delta, width, 2);
}
template <class T>
__forceinline__ T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return attn_cpu::shuffle_value(mask, v, (int)delta, width, 3);
}

__forceinline__ unsigned __ballot_sync(unsigned mask, int pred) {
    return attn_cpu::vote(mask, pred, attn_cpu::VOTE_BALLOT);
}
__forceinline__ int __any_sync(unsigned mask, int pred) { return (int)attn_cpu::vote(mask, pred, attn_cpu::VOTE_ANY); }
__forceinline__ int __all_sync(unsigned mask, int pred) { return (int)attn_cpu::vote(mask, pred, attn_cpu::VOTE_ALL); }
__forceinline__ int __uni_sync(unsigned mask, int pred) { return (int)attn_cpu::vote(mask, pred, attn_cpu::VOTE_UNI); }
// The lanes of the warp that have not exited (runtime/warp.cpp says why not "converged").
__forceinline__ unsigned __activemask() { return attn_cpu::activemask(); }

template <class T>
__forceinline__ unsigned __match_any_sync(unsigned mask, T value) {
    return attn_cpu::match(mask, attn_cpu::match_bits(value),
                           sizeof(T) == 8 ? attn_cpu::MATCH_ANY_B64 : attn_cpu::MATCH_ANY_B32);
}
template <class T>
__forceinline__ unsigned __match_all_sync(unsigned mask, T value, int* pred) {
    const unsigned d = attn_cpu::match(mask, attn_cpu::match_bits(value),
                                       sizeof(T) == 8 ? attn_cpu::MATCH_ALL_B64 : attn_cpu::MATCH_ALL_B32);
    *pred = d != 0;  // d names the caller whenever the values agree
    return d;
}

// redux.sync (sm_80): unsigned and int as CUDA overloads them; .and/.or/.xor on unsigned only.
#define ATTN_CPU_REDUCE(NAME, OP_U32, OP_S32)                                         \
    __forceinline__ unsigned NAME(unsigned mask, unsigned v) {                        \
        return attn_cpu::redux(mask, v, attn_cpu::OP_U32);                            \
    }                                                                                 \
    __forceinline__ int NAME(unsigned mask, int v) {                                  \
        return (int)attn_cpu::redux(mask, (unsigned)v, attn_cpu::OP_S32);             \
    }
ATTN_CPU_REDUCE(__reduce_add_sync, REDUX_ADD_U32, REDUX_ADD_S32)
ATTN_CPU_REDUCE(__reduce_min_sync, REDUX_MIN_U32, REDUX_MIN_S32)
ATTN_CPU_REDUCE(__reduce_max_sync, REDUX_MAX_U32, REDUX_MAX_S32)
#undef ATTN_CPU_REDUCE
__forceinline__ unsigned __reduce_and_sync(unsigned mask, unsigned v) {
    return attn_cpu::redux(mask, v, attn_cpu::REDUX_AND);
}
__forceinline__ unsigned __reduce_or_sync(unsigned mask, unsigned v) {
    return attn_cpu::redux(mask, v, attn_cpu::REDUX_OR);
}
__forceinline__ unsigned __reduce_xor_sync(unsigned mask, unsigned v) {
    return attn_cpu::redux(mask, v, attn_cpu::REDUX_XOR);
}
// ---- end of warp intrinsics ------------------------------------------------------------------

inline size_t __cvta_generic_to_shared(const void* p) { return attn_cpu::shared_address(p); }

// ---- atomics (CUDA C++ Programming Guide, "Atomic Functions"), on shared and global memory ----
namespace attn_cpu {
template <class T> struct atomic_type;
template <> struct atomic_type<int> { static constexpr int code = T_I32; };
template <> struct atomic_type<unsigned> { static constexpr int code = T_U32; };
template <> struct atomic_type<unsigned long long> { static constexpr int code = T_U64; };
template <> struct atomic_type<long long> { static constexpr int code = T_I64; };
template <> struct atomic_type<float> { static constexpr int code = T_F32; };
template <> struct atomic_type<double> { static constexpr int code = T_F64; };
template <class T>
inline uint64_t atomic_bits(T v) {
    uint64_t b = 0;
    __builtin_memcpy(&b, &v, sizeof(T));
    return b;
}
template <class T>
inline T atomic_call(T* p, int op, T operand, T compare = T()) {
    const uint64_t old = atomic_rmw(p, op, atomic_type<T>::code, atomic_bits(operand), atomic_bits(compare));
    T out;
    __builtin_memcpy(&out, &old, sizeof(T));
    return out;
}
}  // namespace attn_cpu
#define ATTN_CPU_ATOMIC(NAME, OP, T) \
    inline T NAME(T* p, T v) { return attn_cpu::atomic_call<T>(p, attn_cpu::OP, v); }
ATTN_CPU_ATOMIC(atomicAdd, A_ADD, int)
ATTN_CPU_ATOMIC(atomicAdd, A_ADD, unsigned)
ATTN_CPU_ATOMIC(atomicAdd, A_ADD, unsigned long long)
ATTN_CPU_ATOMIC(atomicAdd, A_ADD, float)
ATTN_CPU_ATOMIC(atomicAdd, A_ADD, double)
ATTN_CPU_ATOMIC(atomicSub, A_SUB, int)
ATTN_CPU_ATOMIC(atomicSub, A_SUB, unsigned)
ATTN_CPU_ATOMIC(atomicExch, A_EXCH, int)
ATTN_CPU_ATOMIC(atomicExch, A_EXCH, unsigned)
ATTN_CPU_ATOMIC(atomicExch, A_EXCH, unsigned long long)
ATTN_CPU_ATOMIC(atomicExch, A_EXCH, float)
ATTN_CPU_ATOMIC(atomicMin, A_MIN, int)
ATTN_CPU_ATOMIC(atomicMin, A_MIN, unsigned)
ATTN_CPU_ATOMIC(atomicMin, A_MIN, unsigned long long)
ATTN_CPU_ATOMIC(atomicMin, A_MIN, long long)
ATTN_CPU_ATOMIC(atomicMax, A_MAX, int)
ATTN_CPU_ATOMIC(atomicMax, A_MAX, unsigned)
ATTN_CPU_ATOMIC(atomicMax, A_MAX, unsigned long long)
ATTN_CPU_ATOMIC(atomicMax, A_MAX, long long)
ATTN_CPU_ATOMIC(atomicInc, A_INC, unsigned)
ATTN_CPU_ATOMIC(atomicDec, A_DEC, unsigned)
ATTN_CPU_ATOMIC(atomicAnd, A_AND, int)
ATTN_CPU_ATOMIC(atomicAnd, A_AND, unsigned)
ATTN_CPU_ATOMIC(atomicAnd, A_AND, unsigned long long)
ATTN_CPU_ATOMIC(atomicOr, A_OR, int)
ATTN_CPU_ATOMIC(atomicOr, A_OR, unsigned)
ATTN_CPU_ATOMIC(atomicOr, A_OR, unsigned long long)
ATTN_CPU_ATOMIC(atomicXor, A_XOR, int)
ATTN_CPU_ATOMIC(atomicXor, A_XOR, unsigned)
ATTN_CPU_ATOMIC(atomicXor, A_XOR, unsigned long long)
#undef ATTN_CPU_ATOMIC
inline int atomicCAS(int* p, int compare, int v) { return attn_cpu::atomic_call<int>(p, attn_cpu::A_CAS, v, compare); }
inline unsigned atomicCAS(unsigned* p, unsigned compare, unsigned v) {
    return attn_cpu::atomic_call<unsigned>(p, attn_cpu::A_CAS, v, compare);
}
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long compare, unsigned long long v) {
    return attn_cpu::atomic_call<unsigned long long>(p, attn_cpu::A_CAS, v, compare);
}

// Fences order the calling thread's own accesses as others observe them. They create no
// happens-before edge between threads by themselves (a barrier or an atomic does), so the race
// check is right to ignore them: they cost nothing here.
inline void __threadfence_block() {}
inline void __threadfence() {}
inline void __threadfence_system() {}

// printf from a kernel: collected per launch and handed to Python (attnlab.executor.library),
// as the GPU's printf buffer is flushed to the host after the kernel.
#define printf(...) attn_cpu::device_printf(__VA_ARGS__)

// Bit and load intrinsics (CUDA Math API, "Integer Intrinsics").
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
    return (x >> 16) | (x << 16);
}
template <class T>
inline T __ldg(const T* p) { return *p; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : x > 1.f ? 1.f : x; }

inline float __int_as_float(int i) { float f; __builtin_memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; __builtin_memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; __builtin_memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; __builtin_memcpy(&i, &f, 4); return i; }
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
