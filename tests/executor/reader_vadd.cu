// A reader's first kernel (tests/test_reader_run.py): c = a + b, one element a thread.
#include <cuda_runtime.h>

__global__ void vadd(const float* __restrict__ a, const float* __restrict__ b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
