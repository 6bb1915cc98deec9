// Ordinary CUDA a reader writes, for the CPU executor's self-tests (tests/test_executor_general.py):
// each kernel has a correct twin (clean, right results) and a faulty one (`bug` != 0) that must be
// reported, whatever order the executor happens to run the threads in.

// Shared declarations of every form: two dimensions, a scalar, several names in one statement.
// A 32 x 32 transpose through a padded tile; `bug`: thread (3, 17) reads tile[3][17]... before the
// barrier, unordered with its writer.
extern "C" __global__ void transpose_tile(const float* in, float* out, int bug) {
    __shared__ float tile[32][33], scale;
    __shared__ int rows_done, *unused;
    const int x = threadIdx.x, y = threadIdx.y;
    if (x == 0 && y == 0) {
        scale = 2.f;
        rows_done = 0;
        unused = nullptr;
    }
    tile[y][x] = in[y * 32 + x];
    if (bug && x == 17 && y == 4) out[0] = tile[3][17];  // written by thread (17, 3): no barrier between
    __syncthreads();
    if (!(bug && x == 0 && y == 0)) out[y * 32 + x] = scale * tile[x][y];
    (void)rows_done;
    (void)unused;
}

// Atomics: a histogram in shared memory, merged into global memory by every block.
// `bug` 1: the shared update is a plain increment (a race); `bug` 2: the merge is a plain store
// from every block into the same global bins (blocks are not ordered).
extern "C" __global__ void histogram(const int* values, int n, unsigned* bins, int bug) {
    __shared__ unsigned local[16];
    if (threadIdx.x < 16) local[threadIdx.x] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const int b = values[i] & 15;
        if (bug == 1)
            local[b] += 1;
        else
            atomicAdd(&local[b], 1u);
    }
    __syncthreads();
    __threadfence_block();
    if (threadIdx.x < 16) {
        if (bug == 2)
            bins[threadIdx.x] = local[threadIdx.x];
        else
            atomicAdd(&bins[threadIdx.x], local[threadIdx.x]);
    }
}

// The other atomics, one thread of each block each: results a test reads back exactly.
extern "C" __global__ void atomics_mix(int* imax, unsigned* umin, unsigned long long* cas, float* fsum, int* ixor,
                                       unsigned* wrap) {
    const int v = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    atomicMax(imax, v * 7 % 101);
    atomicMin(umin, (unsigned)(1000 - v));
    // (its first read is atomic too: a plain load unordered with other threads' atomics is a race)
    unsigned long long old = atomicAdd(cas, 0ull), seen;
    do {  // a compare-and-swap loop: cas holds the sum of every thread's index
        seen = old;
        old = atomicCAS(cas, seen, seen + (unsigned long long)v);
    } while (old != seen);
    atomicAdd(fsum, 0.5f);
    atomicXor(ixor, v);
    atomicInc(wrap, 9u);  // counts 0..9 then wraps to 0
}

// printf: what each thread prints comes back with the launch.
extern "C" __global__ void say_hello(int tag) {
    if (threadIdx.x % 16 == 0) printf("block %d thread %d tag %d\n", (int)blockIdx.x, (int)threadIdx.x, tag);
}

// Bytes are locations: each thread writes its own byte of a shared char array. `bug`: each then
// reads its neighbour's byte with no barrier between.
extern "C" __global__ void byte_flags(unsigned char* out, int bug) {
    __shared__ unsigned char flags[64];
    const int t = threadIdx.x;
    flags[t] = (unsigned char)(t * 3);
    if (!bug) __syncthreads();
    out[t] = flags[bug ? (t + 1) % 64 : t] + 1;
}

// An uninitialised byte next to initialised ones: `bug` leaves the odd bytes of `buf` unwritten.
extern "C" __global__ void half_written(unsigned char* out, int bug) {
    __shared__ unsigned char buf[64];
    const int t = threadIdx.x;
    if (!bug || t % 2 == 0) buf[t] = (unsigned char)t;
    __syncthreads();
    out[t] = buf[t ^ 1];
}

// A race in global memory within one block: thread 0 writes data[0], thread 33 (another warp)
// reads it; `bug`: without the barrier between them.
extern "C" __global__ void global_handoff(float* data, float* out, int bug) {
    if (threadIdx.x == 0) data[0] = 42.f;
    if (!bug) __syncthreads();
    if (threadIdx.x == 33) out[0] = data[0];
}

// Blocks are not ordered: each block reads x[0] and then writes its own slot; `bug`: block 1 also
// writes x[0], which block 0 read, in the same launch.
extern "C" __global__ void read_then_other_block_writes(float* x, int bug) {
    const float seen = x[0];
    if (threadIdx.x == 0) x[1 + blockIdx.x] = seen + 1.f;
    if (bug && blockIdx.x == 1 && threadIdx.x == 0) x[0] = 7.f;
}

// __syncthreads in both arms of an if/else (undefined); the correct twin has one, after the if.
extern "C" __global__ void barrier_in_both_arms(float* out, int bug) {
    __shared__ float v[64];
    const int t = threadIdx.x;
    if (bug) {
        if (t < 32) {
            v[t] = 1.f;
            __syncthreads();
        } else {
            v[t] = 2.f;
            __syncthreads();
        }
    } else {
        v[t] = t < 32 ? 1.f : 2.f;
        __syncthreads();
    }
    out[t] = v[63 - t];
}

// A second bar.arrive by one warp before the barrier completed. Correct twin: warp 0 arrives
// once and warp 1 waits for it; `bug`: warp 0 arrives twice and nobody waits (the second arrival
// would be counted towards the same phase: a miscount, not a wait).
extern "C" __global__ void arrive_twice(float* out, int bug) {
    __shared__ float v[32];
    if (threadIdx.x < 32) {
        v[threadIdx.x] = 1.f;
        attn_cpu::bar_arrive(1, 64);
        if (bug) attn_cpu::bar_arrive(1, 64);
    } else if (!bug) {
        attn_cpu::bar_sync(1, 64);
        out[threadIdx.x - 32] = v[threadIdx.x - 32];
    }
}

// A write through a pointer the kernel received as const (a cast-away const).
extern "C" __global__ void write_const(const float* in, float* out, int bug) {
    out[threadIdx.x] = in[threadIdx.x];
    if (bug && threadIdx.x == 5) const_cast<float*>(in)[5] = 0.f;
}

// A missing barrier that every thread of the block trips over: one hazard, reported once, with
// the bytes and threads it touched.
extern "C" __global__ void missing_barrier_everyone(float* out) {
    __shared__ float v[64];
    v[threadIdx.x] = (float)threadIdx.x;
    out[threadIdx.x] = v[63 - threadIdx.x];
}

// 16- and 8-byte vector loads whose fields are used apart (in branches, in a loop): one request
// per warp each, as the GPU issues them, not one per 4-byte field.
extern "C" __global__ void vector_fields(const float* in, float* out) {
    __shared__ float4 quads[32];
    __shared__ float2 pairs[64];
    const int t = threadIdx.x;
    quads[t] = make_float4(in[t], 1.f, 2.f, 3.f);
    pairs[t] = make_float2(in[t], 2.f);
    pairs[t + 32] = make_float2(in[t], 3.f);
    __syncwarp();
    const float4 q = quads[(t + 1) % 32];
    float acc = t % 2 ? q.x * q.y : q.z - q.w;
    for (int j = 0; j < 2; ++j) {
        const float2 p = pairs[(t + 32 * j + 1) % 64];
        acc = fmaxf(acc, p.x) + p.y;
    }
    out[t] = acc;
}

// A deadlock between a vote and a barrier: lanes 0-15 wait in a full-mask ballot for lanes 16-31,
// which wait at __syncthreads for them. The report names each group's operation, mask and line.
extern "C" __global__ void ballot_meets_barrier(unsigned* out) {
    if (threadIdx.x < 16)
        out[threadIdx.x] = __ballot_sync(0xffffffffu, 1);
    else
        __syncthreads();
}
