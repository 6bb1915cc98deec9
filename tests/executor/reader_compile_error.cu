// A kernel that does not compile: `y` is not declared (line 5).
__global__ void broken(float* out) {
    int i = threadIdx.x;
    out[i] = 1.0f;
    out[i] += y;
}
