// Warp-collective kernels for the CPU executor's self-tests (tests/test_executor_warps.py): every
// intrinsic's results, lane by lane, and a faulty twin of each rule the runtime checks
// (runtime/warp.cpp). Not attention kernels; not in the registry. One warp per launch unless a
// kernel says otherwise.
#include "ptx.cuh"

constexpr unsigned FULL = 0xffffffffu;

__device__ __forceinline__ int lane_id() { return threadIdx.x % 32; }

// ---- shuffles -------------------------------------------------------------------------------

// One shfl.sync of every lane with the given mode (0 xor, 1 idx, 2 down, 3 up), lane argument
// and width: out[lane] is what the lane got.
extern "C" __global__ void shuffle_probe(const unsigned* in, unsigned* out, int mode, int arg, int width) {
    const int lane = lane_id();
    const unsigned v = in[lane];
    unsigned r;
    switch (mode) {
        case 0: r = __shfl_xor_sync(FULL, v, arg, width); break;
        case 1: r = __shfl_sync(FULL, v, arg, width); break;
        case 2: r = __shfl_down_sync(FULL, v, (unsigned)arg, width); break;
        default: r = __shfl_up_sync(FULL, v, (unsigned)arg, width); break;
    }
    out[lane] = r;
}

// A sum over each group of `width` lanes by __shfl_down_sync(..., width): the group's first lane
// holds its sum. Correct for widths 1..32 that are powers of two; another width is the fault.
extern "C" __global__ void warp_sum_down(const float* in, float* out, int width) {
    const int lane = lane_id();
    float v = in[lane];
    for (int off = 16; off > 0; off /= 2)
        if (off < width) v += __shfl_down_sync(FULL, v, (unsigned)off, width);
    out[lane] = v;
}

// An inclusive prefix sum over each group of `width` lanes by __shfl_up_sync.
extern "C" __global__ void scan_up(const int* in, int* out, int width) {
    const int lane = lane_id();
    int v = in[lane];
    for (int off = 1; off < width; off *= 2) {
        const int t = __shfl_up_sync(FULL, v, (unsigned)off, width);
        if (lane % width >= off) v += t;
    }
    out[lane] = v;
}

// 64-bit values through one shuffle each: lane l gets lane (l + 1) % 32's, exactly.
extern "C" __global__ void shuffle_64(const double* d_in, const long long* i_in, const unsigned long long* u_in,
                                      double* d_out, long long* i_out, unsigned long long* u_out) {
    const int lane = lane_id();
    const int src = (lane + 1) % 32;
    d_out[lane] = __shfl_sync(FULL, d_in[lane], src);
    i_out[lane] = __shfl_xor_sync(FULL, i_in[lane], 1);
    u_out[lane] = __shfl_down_sync(FULL, u_in[lane], 3);
}

// ---- votes, match, reduce -----------------------------------------------------------------------

// The lanes named by `mask` vote on pred[lane]: out[5 * lane + k] = activemask, ballot, any, all,
// uni. The other lanes write nothing (their slots stay as the test filled them) and wait at a
// __syncwarp meanwhile: __activemask answers the lanes in the branch, the mask's.
extern "C" __global__ void votes(const int* pred, unsigned* out, unsigned mask) {
    const int lane = lane_id();
    if (mask >> lane & 1u) {
        const int p = pred[lane];
        out[5 * lane + 0] = __activemask();
        out[5 * lane + 1] = __ballot_sync(mask, p);
        out[5 * lane + 2] = (unsigned)__any_sync(mask, p);
        out[5 * lane + 3] = (unsigned)__all_sync(mask, p);
        out[5 * lane + 4] = (unsigned)__uni_sync(mask, p);
    }
    __syncwarp();
}

// Lanes n.. return; the others sync the warp under the full mask (legal: the mask's exited lanes
// are not waited for, and once it completes they have all exited), then read __activemask and
// ballot under it: out[2 * lane] the mask, out[2 * lane + 1] the ballot of lane % 3 == 0.
extern "C" __global__ void active_after_exit(unsigned* out, int n) {
    const int lane = lane_id();
    if (lane >= n) return;
    __syncwarp();
    const unsigned active = __activemask();
    out[2 * lane] = active;
    out[2 * lane + 1] = __ballot_sync(active, lane % 3 == 0);
}

// __activemask where the warp has diverged: lanes below `split` read it in one arm of a branch
// (out[lane]), the others in the other arm (out[32 + lane]); then lanes n.. return and the rest
// sum their values by shuffles under the mask __activemask gives them (out[64 + lane]), the
// idiom of a reduction after an early-exit guard.
extern "C" __global__ void active_in_branches(unsigned* out, int split, int n) {
    const int lane = lane_id();
    if (lane < split)
        out[lane] = __activemask();
    else
        out[32 + lane] = __activemask();
    if (lane >= n) return;
    const unsigned active = __activemask();
    unsigned v = lane + 1;
    for (int offset = 16; offset; offset >>= 1) {  // only lanes that are still here are read
        const int from = lane + offset < n ? lane + offset : lane;
        const unsigned other = __shfl_sync(active, v, from);
        if (from != lane) v += other;
    }
    out[64 + lane] = v;
}

// __match_any_sync and __match_all_sync of 32-bit values among the lanes of `mask`.
extern "C" __global__ void match_32(const unsigned* vals, unsigned* any_out, unsigned* all_out, int* pred_out,
                                    unsigned mask) {
    const int lane = lane_id();
    if (!(mask >> lane & 1u)) return;
    any_out[lane] = __match_any_sync(mask, vals[lane]);
    int pred = -1;
    all_out[lane] = __match_all_sync(mask, vals[lane], &pred);
    pred_out[lane] = pred;
}

// The same for 64-bit values: equal low words do not make equal values.
extern "C" __global__ void match_64(const unsigned long long* vals, unsigned* any_out, unsigned* all_out,
                                    int* pred_out) {
    const int lane = lane_id();
    any_out[lane] = __match_any_sync(FULL, vals[lane]);
    int pred = -1;
    all_out[lane] = __match_all_sync(FULL, vals[lane], &pred);
    pred_out[lane] = pred;
}

// Every __reduce_*_sync of the lanes of `mask`: out[9 * lane + k] for add, min, max of unsigned,
// then of int, then and, or, xor.
extern "C" __global__ void reduces(const int* vals, unsigned* out, unsigned mask) {
    const int lane = lane_id();
    if (!(mask >> lane & 1u)) return;
    const int v = vals[lane];
    const unsigned u = (unsigned)v;
    unsigned* o = out + 9 * lane;
    o[0] = __reduce_add_sync(mask, u);
    o[1] = __reduce_min_sync(mask, u);
    o[2] = __reduce_max_sync(mask, u);
    o[3] = (unsigned)__reduce_add_sync(mask, v);
    o[4] = (unsigned)__reduce_min_sync(mask, v);
    o[5] = (unsigned)__reduce_max_sync(mask, v);
    o[6] = __reduce_and_sync(mask, u);
    o[7] = __reduce_or_sync(mask, u);
    o[8] = __reduce_xor_sync(mask, u);
}

// Lanes of one mask at one kind of collective with different qualifiers (which = 0 shfl xor /
// down, 1 reduce add / min, 2 ballot / any, 3 match any / all): divergent, the warp would hang.
extern "C" __global__ void mixed_qualifiers(unsigned* out, int which) {
    const int lane = lane_id();
    const bool odd = lane % 2;
    unsigned r = 0;
    int pred = 0;
    switch (which) {
        case 0: r = odd ? __shfl_xor_sync(FULL, (unsigned)lane, 1) : __shfl_down_sync(FULL, (unsigned)lane, 1); break;
        case 1: r = odd ? __reduce_add_sync(FULL, (unsigned)lane) : __reduce_min_sync(FULL, (unsigned)lane); break;
        case 2: r = odd ? __ballot_sync(FULL, 1) : (unsigned)__any_sync(FULL, 1); break;
        default: r = odd ? __match_any_sync(FULL, lane / 4) : __match_all_sync(FULL, lane / 4, &pred); break;
    }
    out[lane] = r;
}

// A vote whose mask does not name the lanes that call it (lanes 16-31 pass the lower half's).
extern "C" __global__ void vote_foreign_mask(unsigned* out) {
    const int lane = lane_id();
    out[lane] = __ballot_sync(0x0000ffffu, lane % 2);
}

// ---- several collectives in flight in one warp ---------------------------------------------------

// Two warps; in each, the half-warps reduce under their own masks at the same time, with
// different collectives: the lower half sums by butterfly and ballots, the upper half takes the
// max by __shfl_down_sync and broadcasts it, then reduces with redux. out[3 * tid + k].
extern "C" __global__ void half_warps(const float* in, float* out, unsigned* bits) {
    const int tid = threadIdx.x, lane = lane_id();
    float v = in[tid];
    if (lane < 16) {
        const unsigned m = 0x0000ffffu;
        for (int off = 8; off > 0; off /= 2) v += __shfl_xor_sync(m, v, off);
        bits[tid] = __ballot_sync(m, in[tid] > 0.f);
        out[tid] = v;
    } else {
        const unsigned m = 0xffff0000u;
        for (int off = 8; off > 0; off /= 2) v = fmaxf(v, __shfl_down_sync(m, v, (unsigned)off, 16));
        v = __shfl_sync(m, v, 16);
        bits[tid] = __reduce_add_sync(m, (unsigned)(in[tid] > 0.f));
        out[tid] = v;
    }
}

// Lanes 0-7 meet under 0xff, then lanes 0-15 under 0xffff, while lanes 16-31 meet under their
// own mask: nested masks are legal, whatever order the lanes arrive in. out[lane].
extern "C" __global__ void nested_masks(const int* in, int* out) {
    const int lane = lane_id();
    int v = in[lane];
    if (lane < 16) {
        if (lane < 8) v += __shfl_xor_sync(0x000000ffu, v, 4);
        v += __shfl_xor_sync(0x0000ffffu, v, 8);
    } else {
        v += __shfl_xor_sync(0xffff0000u, v, 1);
    }
    out[lane] = v;
}

// Half-warps whose masks overlap (crossed = 1): the lower half passes lanes 0-23, the upper half
// lanes 8-31; each waits for lanes waiting at the other, so neither completes. crossed = 2: a
// cycle through three groups (lanes 0-7 wait for 8-15, which wait for 16-23, which wait for 0-7).
// With crossed = 0 the masks are the halves' own: clean.
extern "C" __global__ void crossed_masks(const int* in, int* out, int crossed) {
    const int lane = lane_id();
    unsigned m = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    if (crossed == 1) m = lane < 16 ? 0x00ffffffu : 0xffffff00u;
    if (crossed == 2) {
        const unsigned masks[4] = {0x0000ffffu, 0x00ffff00u, 0x00ff00ffu, 0xff000000u};
        m = masks[lane / 8];
    }
    out[lane] = __shfl_xor_sync(m, in[lane], 1);
}

// ---- exited lanes --------------------------------------------------------------------------------

// Lanes n.. return; the rest broadcast lane 0's value under the full mask, sync the warp and
// ballot under the full mask: legal (the mask's exited lanes are not waited for, and no lane
// reads one).
extern "C" __global__ void broadcast_after_exit(const float* in, float* out, unsigned* bits, int n) {
    const int lane = lane_id();
    if (lane >= n) return;
    const float v = __shfl_sync(FULL, in[lane], 0);
    __syncwarp();
    bits[lane] = __ballot_sync(FULL, 1);
    out[lane] = v;
}

// Lanes n.. return; the rest sum by butterfly under the full mask: lane l reads lane l ^ 16, one
// that has exited when n <= 16 + l. With n = 32, clean.
extern "C" __global__ void butterfly_after_exit(const float* in, float* out, int n) {
    const int lane = lane_id();
    if (lane >= n) return;
    float v = in[lane];
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(FULL, v, off);
    out[lane] = v;
}

// An .aligned collective (the m16n8k16 mma) after lanes n.. returned: undefined, a finding.
extern "C" __global__ void mma_after_exit(float* out, int n) {
    const int lane = lane_id();
    if (lane >= n) return;
    const unsigned a[4] = {0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};  // halves of 1.0
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    attn::mma_16816(d, a, 0x3c003c00u, 0x3c003c00u);
    for (int i = 0; i < 4; ++i) out[4 * lane + i] = d[i];
}
