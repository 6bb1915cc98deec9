// Chapter 3: warp reductions.
//
// What changed since chapter 2: a query row is no longer one thread's job. G lanes of a warp
// share a row and split D: lane c of the group owns elements 8c..8c+7, loaded as one 16-byte
// vector (uint4, 8 halves), with G the smallest power of two >= D / 8 (D = 64: G = 8, D = 128:
// G = 16), so a warp works on 32 / G rows at once. A score is the sum of G partial dot products,
// formed with attn::warp_sum: log2(G) __shfl_xor_sync steps inside the group, no shared memory
// and no barrier. Each lane keeps 8 elements of Q (in registers, fp32, pre-multiplied by the
// scale) and 8 of the accumulator instead of chapter 2's whole row, so the K and V tiles are read
// from shared memory 16 bytes at a time. The running max m and sum l are per row; every lane of
// the group holds the same copy (the butterfly leaves the full sum in every lane).
// Fewer barriers: K/V tiles are double-buffered, so one __syncthreads per tile suffices (tile t+1
// is written to the other buffer while tile t is read); chapter 2 needs two per tile. Each tile
// gets one max and one rescale of acc per row (KEYS scores held in registers), instead of one
// per 8 keys.
//
// Cost model, per (row, key) pair: each lane of the group issues 2 LDS.128 (its K and V slices),
// 16 half-to-fp32 conversions, 16 fp32 FMA and log2(G) shuffles. A shuffle issues at a quarter of
// the FMA rate on Ada and Hopper (half on A100), so at G = 8 the three shuffles take about the
// issue time of 12 FMA: the reductions are this chapter's overhead. Rows per block
// are WARPS * 32 / G (16 or 32 at D = 64, 8 or 16 at D = 128), far fewer than chapter 2's 128, so
// every block reads K and V from L2 once for fewer rows: L2 traffic is 2 * L * D * 2 bytes per
// block, L^2 * D * 4 / rows_per_block per head (at (1, 8, 512, 64): 32 MB with 4 warps, 16 MB
// with 8, against chapter 2's 4 MB). That is the 4 vs 8 warps trade: 8 warps halve the L2 traffic
// and the barriers per row, 4 warps give twice the blocks at short L.
//
// Launch: block (WARPS * 32,), grid (ceil(L / (WARPS * 32 / G)), B*H), dynamic shared memory
//   2 buffers * (K + V) * KEYS * D * 2 bytes = 256 * D bytes (16 KB at D = 64, 32 KB at D = 128).
// Limits: any L >= 1; D a multiple of 8, 8 <= D <= MAX_D; q, k, v, o 16-byte aligned (checked by
// the launcher; with D % 8 == 0 every row then is); causal needs Lq == Lk.
#include "common.cuh"

namespace {
constexpr int KEYS = 32;   // keys per K/V tile
constexpr int MAX_D = 128;
constexpr int VEC = 8;     // halves per 16-byte vector: the slice of D one lane owns
static_assert(MAX_D / VEC <= 32, "a row's lanes fit in one warp");

// Lanes per row: the smallest power of two G with G * VEC >= D (1..16), as the registry's
// chapters/ch03_warp_reductions.py computes it for the launch grid.
__device__ __forceinline__ int lanes_per_row(int D) {
    int g = 1;
    while (g * VEC < D) g *= 2;
    return g;
}

// 8 halves to fp32. `raw` is taken by value: a pointer into shared memory here would let the
// compiler split the 16-byte load into four 4-byte ones.
__device__ __forceinline__ void unpack8(const uint4 raw, float f[VEC]) {
    const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) {
        const float2 t = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

template <int WARPS>
__device__ __forceinline__ void warp_rows(const __half* __restrict__ q, const __half* __restrict__ k,
                                          const __half* __restrict__ v, __half* __restrict__ o,
                                          int L, int D, float scale, int causal) {
    constexpr int THREADS = WARPS * 32;
    extern __shared__ uint4 smem[];  // [2 buffers][K, V][KEYS][D] halves, 16-byte aligned
    const int tile_vecs = KEYS * D / VEC;  // uint4 per K (or V) tile

    const int G = lanes_per_row(D);
    const int c = threadIdx.x & (G - 1);      // this lane's slice: elements c*8 .. c*8+7
    const int rows_per_block = THREADS / G;   // groups never straddle warps: 32 % G == 0
    const int row0 = blockIdx.x * rows_per_block;
    const int row = row0 + threadIdx.x / G;
    const long long base = attn::head_offset(blockIdx.y, L, D);
    const bool active = row < L;
    const bool has_slice = c * VEC < D;       // false for the spare lanes when D / 8 < G

    float qf[VEC], acc[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) qf[i] = acc[i] = 0.f;
    if (active && has_slice) {
        unpack8(*reinterpret_cast<const uint4*>(q + base + (long long)row * D + c * VEC), qf);
#pragma unroll
        for (int i = 0; i < VEC; ++i) qf[i] *= scale;  // scale once here, not once per score
    }
    float m = ATTN_NEG_INF;  // running max of the scaled scores (same in every lane of the group)
    float l = 0.f;           // running sum of exp(score - m)

    const int n_keys = !active ? 0 : (causal ? row + 1 : L);
    const int block_keys = causal ? min(L, row0 + rows_per_block) : L;  // skip tiles above the diagonal
    const int n_tiles = attn::ceil_div(block_keys, KEYS);

    // K and V rows j0.. are contiguous in global memory: copy a tile as plain uint4 runs.
    auto load_tile = [&](int t) {
        uint4* k_s = smem + (t & 1) * 2 * tile_vecs;
        uint4* v_s = k_s + tile_vecs;
        const int n_vecs = min(KEYS, block_keys - t * KEYS) * D / VEC;
        const uint4* k_g = reinterpret_cast<const uint4*>(k + base + (long long)t * KEYS * D);
        const uint4* v_g = reinterpret_cast<const uint4*>(v + base + (long long)t * KEYS * D);
        // A fixed trip count (the D = MAX_D worst case): fully unrolled, all loads issued first.
#pragma unroll
        for (int it = 0; it < attn::ceil_div(KEYS * MAX_D / VEC, THREADS); ++it) {
            const int i = threadIdx.x + it * THREADS;
            if (i < n_vecs) {
                k_s[i] = k_g[i];
                v_s[i] = v_g[i];
            }
        }
    };

    load_tile(0);
    for (int t = 0; t < n_tiles; ++t) {
        // One barrier: tile t (written last iteration) is now visible, and every warp has finished
        // tile t-1, whose buffer is the one tile t+1 goes to.
        __syncthreads();
        if (t + 1 < n_tiles) load_tile(t + 1);
        const __half* k_s = reinterpret_cast<const __half*>(smem + (t & 1) * 2 * tile_vecs);
        const __half* v_s = k_s + KEYS * D;
        const int n = min(KEYS, n_keys - t * KEYS);  // this row's keys in the tile (<= 0: none)

        // Partial dot products of all KEYS keys first, then KEYS independent butterflies.
        // Keys past n (causal, tail, inactive row) are never read; their score becomes -inf.
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
}  // namespace

// Two entry points, one body: the warps per block are a compile-time constant of each.
extern "C" __global__ void __launch_bounds__(4 * 32)
attn_fwd_03_warp_rows_4w(const __half* __restrict__ q, const __half* __restrict__ k,
                         const __half* __restrict__ v, __half* __restrict__ o,
                         int L, int D, float scale, int causal) {
    warp_rows<4>(q, k, v, o, L, D, scale, causal);
}

extern "C" __global__ void __launch_bounds__(8 * 32)
attn_fwd_03_warp_rows_8w(const __half* __restrict__ q, const __half* __restrict__ k,
                         const __half* __restrict__ v, __half* __restrict__ o,
                         int L, int D, float scale, int causal) {
    warp_rows<8>(q, k, v, o, L, D, scale, causal);
}
