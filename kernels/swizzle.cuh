// The XOR swizzle of a shared-memory tile, and the one lane -> address rule of every ldmatrix.
//
// A tile row of D halves is cut into 16-byte chunks (8 halves each). Shared memory serves 32
// banks of 4 bytes, i.e. 8 bank groups of 16 bytes, and a row of 128 or 256 bytes starts on the
// same bank group as every other row. ldmatrix reads one 8x8 matrix per phase: 8 rows, the same
// chunk of each. Unswizzled, those 8 chunks all sit in one bank group: an 8-way conflict.
// Swizzled, chunk c of row r is stored at chunk position c ^ (r % 8): the 8 rows of a phase land
// in 8 different bank groups. Eight consecutive chunks of one row (a quarter-warp of 16-byte
// cp.async stores, or of the output's 16-byte reads) stay a permutation of the 8 bank groups.
//
// tests/test_model_07.py mirrors these formulas line for line; change both together.
#pragma once

namespace attn {

// Byte offset of 16-byte chunk `chunk` of tile row `row`; rows are ROW_BYTES long.
template <int ROW_BYTES, bool SWIZZLE>
__host__ __device__ constexpr int tile_offset(int row, int chunk) {
    static_assert(ROW_BYTES % 128 == 0, "the swizzle permutes 8 chunks: rows must hold a multiple of 128 bytes");
    return row * ROW_BYTES + ((SWIZZLE ? (chunk ^ (row & 7)) : chunk) << 4);
}

// ldmatrix .x4: lanes 8i..8i+7 name the 8 rows of matrix i, and matrix i lands in register i.
// Chapter 7 reads every fragment as a 16-row x 2-chunk block at (row0, chunk0), in one of two
// matrix orders, chosen so that the registers an mma.sync takes together come out adjacent:
//
// A order (Q as the A operand; V, transposed, as B operands): lane l names row row0 + l % 16 of
// chunk chunk0 + l / 16. Matrices: (rows 0-7, chunk 0), (rows 8-15, chunk 0), (rows 0-7, chunk 1),
// (rows 8-15, chunk 1): a0..a3 of one A fragment, or b0, b1 of two 8-column B blocks.
__host__ __device__ constexpr int ldsm_row(int lane) { return lane & 15; }
__host__ __device__ constexpr int ldsm_chunk(int lane) { return lane >> 4; }
// B order (K as B operands): lane l names row row0 + l % 8 + 8 * (l / 16) of chunk
// chunk0 + (l / 8) % 2. Matrices: (rows 0-7, chunk 0), (rows 0-7, chunk 1), (rows 8-15, chunk 0),
// (rows 8-15, chunk 1): b0, b1 of the key block rows 0-7, then b0, b1 of rows 8-15.
__host__ __device__ constexpr int ldsm_row_b(int lane) { return (lane & 7) + ((lane >> 4) << 3); }
__host__ __device__ constexpr int ldsm_chunk_b(int lane) { return (lane >> 3) & 1; }

}  // namespace attn
