// Exercise ch07-swizzle (chapter 7, kernels/swizzle.cuh): an XOR swizzle for conflict-free ldmatrix.
//
// Chapter 7 reads its operands from shared memory with ldmatrix: a warp-wide instruction that
// loads 8x8 fp16 matrices, each from 8 row addresses of 16 bytes (one "chunk" of a tile row per
// address). Shared memory is 32 banks of 4 bytes, i.e. 8 groups of 16 bytes: byte address a is in
// bank group (a / 16) % 8. One matrix is served in one wavefront only if its 8 chunks lie in 8
// different bank groups. A row of D = 64 halves is 128 bytes (256 at D = 128), so chunk c of
// every row starts in the same bank group: the 8 rows of one matrix, same chunk, one group: 8
// wavefronts, an 8-way conflict, on every ldmatrix of the kernel.
//
// The cure moves no data between rows: chunk c of row r is stored at chunk position
// c ^ (something of r) in its own row. Eight consecutive rows of one chunk then spread over eight
// bank groups, and the eight chunks of one row stay a permutation of its own positions (so the
// 16-byte cp.async stores of eight consecutive chunks of a row stay conflict-free too).
//
// Your task: write swizzled(row, chunk), the byte offset of 16-byte chunk `chunk` of tile row
// `row` in a tile of rows ROW_BYTES long (1 line). The kernel below copies a 64-row tile into
// shared memory through it (cp.async), reads it back with ldmatrix in the chapter's three
// patterns (Q, K, and V transposed) and row by row (16-byte loads), and writes what it read.
//
// Check (no GPU needed; the CPU executor counts the wavefronts of every ldmatrix, cp.async and
// load, and the checker compares every register with the PTX ISA's ldmatrix table):
//   python -m attnlab exercises check ch07-swizzle exercises/ch07-swizzle.cu
#include "common.cuh"
#include "ptx.cuh"

// ---- TODO(exercise): the byte offset of chunk `chunk` (0 .. ROW_BYTES/16 - 1) of row `row` --------
// Rows are ROW_BYTES long (128 or 256) and packed: row r starts at r * ROW_BYTES. Keep every chunk
// inside its own row, and give the 8 rows r0 .. r0+7 (r0 a multiple of 8) of one chunk 8
// different bank groups.
template <int ROW_BYTES>
__device__ __forceinline__ int swizzled(int row, int chunk) {
    return row * ROW_BYTES + ((chunk ^ (row & 7)) << 4);
}
// ---- end of exercise ---------------------------------------------------------------------------

namespace {
constexpr int ROWS = 64;      // tile rows: 4 warps x 16
constexpr int THREADS = 128;

// tile: [ROWS][D] 16-bit values (only copied, never computed with). Per warp w (rows 16w .. 16w+15)
// and k-step ks (chunks 2ks, 2ks+1), lane l's four registers of each ldmatrix.x4:
//   a[w][ks][l][4]  Q order: lane l names row 16w + l % 16, chunk 2ks + l / 16
//   b[w][ks][l][4]  K order: lane l names row 16w + l % 8 + 8 (l / 16), chunk 2ks + (l / 8) % 2
//   t[w][ks][l][4]  V order: Q's addresses, .trans
// back: [ROWS][D], the tile read back 16 bytes at a time (as chapter 7 stages its output).
template <int D>
__device__ __forceinline__ void run(const __half* tile, unsigned* a, unsigned* b, unsigned* t, __half* back) {
    constexpr int ROW_BYTES = D * 2, CHUNKS = D / 8, KS = D / 16;
    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned base = attn::smem_u32(smem);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

    for (int idx = tid; idx < ROWS * CHUNKS; idx += THREADS) {  // 8 consecutive threads: one row's 8 chunks
        const int r = idx / CHUNKS, c = idx % CHUNKS;
        attn::cp_async_16(base + swizzled<ROW_BYTES>(r, c), tile + r * D + c * 8, 16);
    }
    attn::cp_async_commit();
    attn::cp_async_wait<0>();
    __syncthreads();

    const int row0 = warp * 16;
    for (int ks = 0; ks < KS; ++ks) {
        unsigned r[4];
        const int at = (warp * KS + ks) * 32 + lane;
        attn::ldsm_x4(r, base + swizzled<ROW_BYTES>(row0 + (lane & 15), 2 * ks + (lane >> 4)));
        for (int i = 0; i < 4; ++i) a[at * 4 + i] = r[i];
        attn::ldsm_x4(r, base + swizzled<ROW_BYTES>(row0 + (lane & 7) + ((lane >> 4) << 3), 2 * ks + ((lane >> 3) & 1)));
        for (int i = 0; i < 4; ++i) b[at * 4 + i] = r[i];
        attn::ldsm_x4_trans(r, base + swizzled<ROW_BYTES>(row0 + (lane & 15), 2 * ks + (lane >> 4)));
        for (int i = 0; i < 4; ++i) t[at * 4 + i] = r[i];
    }
    for (int idx = lane; idx < 16 * CHUNKS; idx += 32) {  // this warp's 16 rows, 16 bytes per lane
        const int r = row0 + idx / CHUNKS, c = idx % CHUNKS;
        *reinterpret_cast<uint4*>(back + r * D + c * 8) = *reinterpret_cast<const uint4*>(smem + swizzled<ROW_BYTES>(r, c));
    }
}
}  // namespace

// Launch: block (128,), grid (1,), dynamic shared memory ROWS * D * 2 bytes (the tile, exactly).
extern "C" __global__ void __launch_bounds__(THREADS)
ex07_swizzle_d64(const __half* tile, unsigned* a, unsigned* b, unsigned* t, __half* back) {
    run<64>(tile, a, b, t, back);
}
extern "C" __global__ void __launch_bounds__(THREADS)
ex07_swizzle_d128(const __half* tile, unsigned* a, unsigned* b, unsigned* t, __half* back) {
    run<128>(tile, a, b, t, back);
}
