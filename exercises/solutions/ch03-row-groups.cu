// Exercise ch03-row-groups (chapter 3, kernels/03_warp_reductions.cu): which lanes own which row.
//
// Chapter 3 stops giving a query row to one thread. G lanes of a warp share a row and split D:
// lane c of the row's group owns elements 8c .. 8c + 7, loaded as one 16-byte vector (8 halves).
// G is the smallest power of two with 8 G >= D (D = 64: G = 8; D = 128: G = 16; D = 40: G = 8,
// and lanes 5, 6, 7 of each group own nothing). Groups are aligned inside a warp: lanes
// 0 .. G-1 are row 0 of the warp, lanes G .. 2G-1 row 1, and so on, so a block of THREADS
// threads computes THREADS / G consecutive rows. Scores are G partial dot products summed with
// attn::warp_sum(partial, G) (exercise ch03-warp-reduce), which every lane must call.
//
// Your task: give each thread its group size G, its slice c, its row and whether it owns a slice
// at all (4 lines). Everything after the gap uses them: the Q slice a lane loads, the K and V
// slices it reads, the output slice it writes, and the rows per block (THREADS / G) the launcher
// also uses for the grid: ceil(L / (THREADS / G)) blocks per head.
//
// Check (no GPU needed; the CPU executor runs this file at D = 8 .. 128, causal and not):
//   python -m attnlab exercises check ch03-row-groups exercises/ch03-row-groups.cu
#include "common.cuh"

namespace {
constexpr int WARPS = 4;
constexpr int THREADS = WARPS * 32;
constexpr int KEYS = 32;   // keys per K/V tile
constexpr int MAX_D = 128;
constexpr int VEC = 8;     // halves per 16-byte vector: the slice of D one lane owns
static_assert(MAX_D / VEC <= 32, "a row's lanes fit in one warp");

// 8 halves to fp32 (by value: a pointer into shared memory would let the compiler split the
// 16-byte load into four).
__device__ __forceinline__ void unpack8(const uint4 raw, float f[VEC]) {
    const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) {
        const float2 t = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}
}  // namespace

// Launch: block (THREADS,), grid (ceil(L / (THREADS / G)), B*H), dynamic shared memory 256 * D
// bytes (two buffers of a K and a V tile). D a multiple of 8, at most MAX_D.
extern "C" __global__ void __launch_bounds__(THREADS)
attn_ex03_warp_rows(const __half* __restrict__ q, const __half* __restrict__ k,
                    const __half* __restrict__ v, __half* __restrict__ o,
                    int L, int D, float scale, int causal) {
    extern __shared__ uint4 smem[];  // [2 buffers][K, V][KEYS][D] halves
    const int tile_vecs = KEYS * D / VEC;

    // ---- TODO(exercise): this thread's group, slice and row --------------------------------------
    // G: lanes per row, the smallest power of two with G * VEC >= D.
    // c: this lane's slice within its group (elements c*VEC .. c*VEC + VEC - 1 of the row).
    // row: the query row its group owns; this block's rows are blockIdx.x * (THREADS / G) onward.
    // has_slice: whether the slice lies inside the row (false for the spare lanes when D < G*VEC).
    int G = 1;
    while (G * VEC < D) G *= 2;
    const int c = threadIdx.x & (G - 1);
    const int row = blockIdx.x * (THREADS / G) + threadIdx.x / G;
    const bool has_slice = c * VEC < D;
    // ---- end of exercise ---------------------------------------------------------------------

    const int rows_per_block = THREADS / G;
    const int row0 = blockIdx.x * rows_per_block;
    const long long base = attn::head_offset(blockIdx.y, L, D);
    const bool active = row < L;

    float qf[VEC], acc[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) qf[i] = acc[i] = 0.f;
    if (active && has_slice) {
        unpack8(*reinterpret_cast<const uint4*>(q + base + (long long)row * D + c * VEC), qf);
#pragma unroll
        for (int i = 0; i < VEC; ++i) qf[i] *= scale;
    }
    float m = ATTN_NEG_INF;  // running max of the scaled scores (the same in every lane of the group)
    float l = 0.f;           // running sum of exp(score - m)

    const int n_keys = !active ? 0 : (causal ? row + 1 : L);
    const int block_keys = causal ? min(L, row0 + rows_per_block) : L;
    const int n_tiles = attn::ceil_div(block_keys, KEYS);

    auto load_tile = [&](int t) {  // K and V rows t*KEYS .. into buffer t % 2, as uint4 runs
        uint4* k_s = smem + (t & 1) * 2 * tile_vecs;
        uint4* v_s = k_s + tile_vecs;
        const int n_vecs = min(KEYS, block_keys - t * KEYS) * D / VEC;
        const uint4* k_g = reinterpret_cast<const uint4*>(k + base + (long long)t * KEYS * D);
        const uint4* v_g = reinterpret_cast<const uint4*>(v + base + (long long)t * KEYS * D);
        for (int i = threadIdx.x; i < n_vecs; i += THREADS) {
            k_s[i] = k_g[i];
            v_s[i] = v_g[i];
        }
    };

    load_tile(0);
    for (int t = 0; t < n_tiles; ++t) {
        __syncthreads();  // tile t is complete, and every warp is done with tile t-1 (buffer of t+1)
        if (t + 1 < n_tiles) load_tile(t + 1);
        const __half* k_s = reinterpret_cast<const __half*>(smem + (t & 1) * 2 * tile_vecs);
        const __half* v_s = k_s + KEYS * D;
        const int n = min(KEYS, n_keys - t * KEYS);  // this row's keys in the tile (<= 0: none)

        float s[KEYS];
#pragma unroll
        for (int j = 0; j < KEYS; ++j) {
            float dot = 0.f;
            if (has_slice && j < n) {
                float kf[VEC];
                unpack8(*reinterpret_cast<const uint4*>(k_s + j * D + c * VEC), kf);
#pragma unroll
                for (int i = 0; i < VEC; ++i) dot = fmaf(qf[i], kf[i], dot);
            }
            s[j] = dot;
        }
        float tile_max = ATTN_NEG_INF;
#pragma unroll
        for (int j = 0; j < KEYS; ++j) {
            s[j] = attn::warp_sum(s[j], G);  // every lane calls it: the shuffles span the warp
            s[j] = j < n ? s[j] : ATTN_NEG_INF;
            tile_max = fmaxf(tile_max, s[j]);
        }
        const float m_new = fmaxf(m, tile_max);
        const float correction = attn::safe_exp_diff(m, m_new);
        l *= correction;
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[i] *= correction;
#pragma unroll
        for (int j = 0; j < KEYS; ++j) {
            if (j < n) {
                const float p = __expf(s[j] - m_new);
                l += p;
                if (has_slice) {
                    float vf[VEC];
                    unpack8(*reinterpret_cast<const uint4*>(v_s + j * D + c * VEC), vf);
#pragma unroll
                    for (int i = 0; i < VEC; ++i) acc[i] = fmaf(p, vf[i], acc[i]);
                }
            }
        }
        m = m_new;
    }

    if (!active || !has_slice) return;
    const float inv_l = 1.f / l;  // l >= 1: the row's max contributes exp(0)
    uint4 out;
    __half2* h = reinterpret_cast<__half2*>(&out);
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) h[i] = __floats2half2_rn(acc[2 * i] * inv_l, acc[2 * i + 1] * inv_l);
    *reinterpret_cast<uint4*>(o + base + (long long)row * D + c * VEC) = out;
}
