// Exercise ch07-wait-depth (chapter 7, kernels/07_mma_swizzle.cu): how deep to wait in a cp.async ring.
//
// Chapter 7 streams its K/V tiles through a ring of STAGES shared-memory buffers, copied with
// cp.async several tiles ahead of their use, with ONE __syncthreads per tile. The schedule (the
// kernel below has it, around a simpler computation: column sums of a [rows, 64] matrix):
//   prologue:   issue tiles 0 .. STAGES-2, one commit group per tile
//   iteration j:
//     cp.async.wait_group N     this thread's copies of tile j have landed
//     __syncthreads()           ... everyone's have; and every thread is done with tile j-1
//     issue tile j + STAGES - 1 into the stage of tile j-1, commit (a group even when empty)
//     use tile j
// cp.async.wait_group N (attn::cp_async_wait<N>()) waits until at most the N most recently
// committed groups of THIS thread are still in flight: all older groups have landed. Wait too
// little and tile j is read before it lands. Wait too much and the copies issued to overlap
// this tile's work are waited for as well: the ring still runs, but no deeper than necessary.
//
// Your task: write wait_depth<STAGES>(), the N of the wait at iteration j (1 line): count the
// groups committed before it, and those that may still be in flight once tile j has landed.
//
// Check (no GPU needed; the CPU executor lands a cp.async only at its wait, and reports any read
// of its bytes before then; the checker runs the ring with 2, 3 and 4 stages):
//   python -m attnlab exercises check ch07-wait-depth exercises/ch07-wait-depth.cu
#include "common.cuh"
#include "ptx.cuh"

// ---- TODO(exercise): N in cp.async.wait_group N at the top of iteration j, for a ring of STAGES ----
template <int STAGES>
__host__ __device__ constexpr int wait_depth() {
    return STAGES - 1;  // placeholder
}
// ---- end of exercise ---------------------------------------------------------------------------

namespace {
constexpr int THREADS = 128;
constexpr int COLS = 64;                            // halves per row: 8 chunks of 16 bytes
constexpr int TILE_ROWS = 32;
constexpr int TILE_BYTES = TILE_ROWS * COLS * 2;    // 4 KB: 256 chunks, 2 per thread

// out[h * 64 + c]: the sum of x[r][c] over the rows r with (r % 32) / 16 == h (h = 0, 1), this
// block's [rows, 64] matrix x; thread tid sums column tid % 64 of half tid / 64 of every tile.
template <int STAGES>
__device__ __forceinline__ void column_sums(const __half* x, float* out, int rows) {
    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned ring = attn::smem_u32(smem);
    const int tid = threadIdx.x;
    x += (long long)blockIdx.x * rows * COLS;
    out += blockIdx.x * 2 * COLS;
    const int n_tiles = attn::ceil_div(rows, TILE_ROWS);

    auto issue = [&](int tile, int stage) {  // rows past the end are zero-filled
        for (int idx = tid; idx < TILE_ROWS * COLS / 8; idx += THREADS) {
            const int r = idx / 8, c = idx % 8, row = tile * TILE_ROWS + r;
            const bool valid = row < rows;
            attn::cp_async_16(ring + stage * TILE_BYTES + r * COLS * 2 + c * 16, x + (valid ? row : 0) * COLS + c * 8,
                              valid ? 16 : 0);
        }
    };

#pragma unroll
    for (int p = 0; p < STAGES - 1; ++p) {  // prologue: tiles 0 .. STAGES-2, one group each
        if (p < n_tiles) issue(p, p);
        attn::cp_async_commit();
    }
    float acc = 0.f;
    const int col = tid % COLS, half = tid / COLS;
    for (int j = 0; j < n_tiles; ++j) {
        attn::cp_async_wait<wait_depth<STAGES>()>();  // this thread's copies of tile j have landed
        __syncthreads();                              // everyone's, and tile j-1 is free
        const int next = j + STAGES - 1;
        if (next < n_tiles) issue(next, next % STAGES);  // into the stage of tile j-1
        attn::cp_async_commit();
        const __half* tile = reinterpret_cast<const __half*>(smem + (j % STAGES) * TILE_BYTES);
        for (int r = half * 16; r < half * 16 + 16; ++r) acc += __half2float(tile[r * COLS + col]);
    }
    out[half * COLS + col] = acc;
}
}  // namespace

// Launch: block (128,), grid (blocks,), dynamic shared memory STAGES * 4096 bytes; x is
// [blocks][rows][64] fp16, out [blocks][2][64] fp32.
extern "C" __global__ void __launch_bounds__(THREADS) ex07_ring_s2(const __half* x, float* out, int rows) {
    column_sums<2>(x, out, rows);
}
extern "C" __global__ void __launch_bounds__(THREADS) ex07_ring_s3(const __half* x, float* out, int rows) {
    column_sums<3>(x, out, rows);
}
extern "C" __global__ void __launch_bounds__(THREADS) ex07_ring_s4(const __half* x, float* out, int rows) {
    column_sums<4>(x, out, rows);
}
// depths[i] = wait_depth<i + 2>(): what the checker compares with the deepest wait that is safe.
extern "C" __global__ void ex07_wait_depths(int* depths) {
    if (threadIdx.x == 0) {
        depths[0] = wait_depth<2>();
        depths[1] = wait_depth<3>();
        depths[2] = wait_depth<4>();
    }
}
