// Kernels with one planted fault each, for the CPU executor's self-tests
// (tests/test_executor_faults.py): every fault must be reported, with its kind, and the clean
// twin of each must not be. Not attention kernels; not in the registry.
#include "common.cuh"
#include "ptx.cuh"

// Global out of bounds: one thread reads one element past the end of `in`.
extern "C" __global__ void fault_global_oob(const float* in, float* out, int n) {
    const int i = threadIdx.x;
    out[i] = in[i + (i == n - 1 ? 1 : 0)];
}

// Shared out of bounds, static: an index one past the array.
extern "C" __global__ void fault_static_shared_oob(float* out, int n) {
    __shared__ float buf[64];
    buf[threadIdx.x] = 1.f;
    __syncthreads();
    out[threadIdx.x] = buf[threadIdx.x + (threadIdx.x == 63 ? 1 : 0)];
}

// Shared out of bounds, dynamic: the kernel assumes more dynamic shared memory than launched.
extern "C" __global__ void fault_dynamic_shared_oob(float* out, int n) {
    extern __shared__ float dyn[];
    dyn[threadIdx.x + n] = 1.f;  // n = the launch's float count: past the end
    __syncthreads();
    out[threadIdx.x] = 0.f;
}

// A race: each thread reads its neighbour's element, with (clean) or without (fault) a barrier.
extern "C" __global__ void shared_neighbour(float* out, int with_barrier) {
    __shared__ float buf[64];
    buf[threadIdx.x] = (float)threadIdx.x;
    if (with_barrier) __syncthreads();
    out[threadIdx.x] = buf[(threadIdx.x + 1) % 64];
}

// Reading a cp.async destination before the wait (fault) or after wait + barrier (clean).
extern "C" __global__ void async_copy(const float* in, float* out, int wait_first) {
    extern __shared__ __align__(16) float tile[];
    const int t = threadIdx.x;  // 16 threads, 4 floats each
    attn::cp_async_16(attn::smem_u32(tile + 4 * t), in + 4 * t, 16);
    attn::cp_async_commit();
    if (wait_first) attn::cp_async_wait<0>();
    __syncthreads();
    out[t] = tile[4 * ((t + 1) % 16)];
    if (!wait_first) attn::cp_async_wait<0>();
}

// Deadlock: warp 1 waits at a named barrier that warp 0 never reaches.
extern "C" __global__ void fault_deadlock(float* out) {
    if (threadIdx.x >= 32) attn::bar_sync(1, 64);
    out[threadIdx.x] = 1.f;
}

// A barrier after some threads returned: legal (exited threads no longer hold up __syncthreads).
extern "C" __global__ void early_return_then_barrier(float* out, int n) {
    if ((int)threadIdx.x >= n) return;
    __syncthreads();
    out[threadIdx.x] = 1.f;
}

// Named-barrier counts that disagree between the two warps.
extern "C" __global__ void fault_barrier_count(float* out) {
    attn::bar_sync(2, threadIdx.x < 32 ? 64 : 96);
    out[threadIdx.x] = 1.f;
}

// A warp-collective reached by divergent lanes: even lanes shuffle, odd lanes sync the warp.
extern "C" __global__ void fault_divergent_collective(float* out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x % 2 == 0)
        v = __shfl_xor_sync(0xffffffffu, v, 1);
    else
        __syncwarp();
    out[threadIdx.x] = v;
}

// A shuffle whose mask does not name every lane that calls it.
extern "C" __global__ void fault_shuffle_mask(float* out) {
    float v = (float)threadIdx.x;
    v += __shfl_xor_sync(0x0000ffffu, v, 1);  // lanes 16-31 call it too
    out[threadIdx.x] = v;
}

// A read of shared memory no thread wrote.
extern "C" __global__ void fault_uninitialized(float* out) {
    __shared__ float buf[64];
    if (threadIdx.x < 32) buf[threadIdx.x] = 1.f;
    __syncthreads();
    out[threadIdx.x] = buf[threadIdx.x];  // threads 32..63 read what nobody wrote
}

// Lane tables: one ldmatrix.x4 (and .trans) and one mma.sync m16n8k16, results as written.
extern "C" __global__ void probe_ldmatrix(const unsigned* tile_in, unsigned* out, int trans) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int lane = threadIdx.x;  // 32 lanes; the tile is 4 matrices x 8 rows x 16 bytes = 512 bytes
    for (int i = lane; i < 128; i += 32) reinterpret_cast<unsigned*>(smem)[i] = tile_in[i];
    __syncwarp();
    unsigned r[4];
    const unsigned addr = attn::smem_u32(smem) + 16 * lane;  // lane l names row l % 8 of matrix l / 8
    if (trans)
        attn::ldsm_x4_trans(r, addr);
    else
        attn::ldsm_x4(r, addr);
    for (int m = 0; m < 4; ++m) out[lane * 4 + m] = r[m];
}

extern "C" __global__ void probe_mma(const unsigned* a_in, const unsigned* b_in, const float* c_in, float* d_out) {
    const int lane = threadIdx.x;
    const unsigned a[4] = {a_in[lane * 4], a_in[lane * 4 + 1], a_in[lane * 4 + 2], a_in[lane * 4 + 3]};
    float d[4] = {c_in[lane * 4], c_in[lane * 4 + 1], c_in[lane * 4 + 2], c_in[lane * 4 + 3]};
    attn::mma_16816(d, a, b_in[lane * 2], b_in[lane * 2 + 1]);
    for (int i = 0; i < 4; ++i) d_out[lane * 4 + i] = d[i];
}

// fp16 conversions as the kernels use them: float -> half (round to nearest even) -> float.
extern "C" __global__ void probe_half(const float* in, __half* h, float* back, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        h[i] = __float2half(in[i]);
        back[i] = __half2float(h[i]);
    }
}
