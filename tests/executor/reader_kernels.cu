// Several small kernels of a reader's file (tests/test_reader_run.py): each test names its entry.

// A planted race: each thread reads its neighbour's element with no barrier between the write and the read.
__global__ void neighbour(float* out) {
    __shared__ float buf[64];
    buf[threadIdx.x] = (float)threadIdx.x;
    out[threadIdx.x] = buf[(threadIdx.x + 1) % 64];
}

// The same with the barrier: clean.
__global__ void neighbour_synced(float* out) {
    __shared__ float buf[64];
    buf[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = buf[(threadIdx.x + 1) % 64];
}

// A warp reading every `stride`-th float of shared memory: stride 2 is a 2-way bank conflict.
__global__ void strided(float* out, int stride) {
    extern __shared__ float tile[];
    for (int i = threadIdx.x; i < 32 * stride; i += blockDim.x) tile[i] = (float)i;
    __syncthreads();
    out[threadIdx.x] = tile[threadIdx.x * stride];
}

// printf from a kernel.
__global__ void hello(int* out) {
    if (threadIdx.x == 0) printf("hello from block %d\n", (int)blockIdx.x);
    out[blockIdx.x * blockDim.x + threadIdx.x] = threadIdx.x;
}

// Scale in place; a double scalar.
__global__ void scale(float* x, double factor, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = (float)(x[i] * factor);
}

// Out of bounds: the last thread writes one past the end.
__global__ void past_the_end(int* out, int n) {
    out[threadIdx.x + (threadIdx.x == n - 1 ? 1 : 0)] = 1;
}

// A kernel with a bool parameter (the executor passes bool once thunk.h knows it).
__global__ void flagged(int* out, bool twice) {
    out[threadIdx.x] = twice ? 2 : 1;
}

// A template kernel: out of the CPU runner's scope.
template <int N>
__global__ void templated(float* out) {
    out[threadIdx.x] = N;
}
