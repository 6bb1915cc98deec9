// On how many trips of a loop each basic block of the kernel ran, per warp (OPT_COUNT): what the
// time model needs to weigh a key-tile loop's SASS by how often each part of it runs (a copy that
// stops STAGES - 1 tiles before the end, a mask only on diagonal tiles, Q's fragments on the
// first trip only).
//
// The kernel's translation unit is built with -fsanitize-coverage=trace-pc: every basic block
// calls __sanitizer_cov_trace_pc first, and its return address names the block. Before a counted
// launch attnlab.executor.trips gives the runtime, per block (a module offset), the loops it ends
// a trip of (it holds the code of a `for` statement's own line: its test and increment) and the
// loops it lies in (its code comes from lines inside their bodies). Each lane counts its trips of
// every loop; a block in loop h ran on a trip when it ran at least once while the lane was on it.
// A warp ran the block on a trip when any lane did: per warp, the most trips any lane ran it on.
// The counts are exact and do not depend on the schedule.
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include <dlfcn.h>

#include "runtime.h"

namespace attn_cpu {

namespace {

struct TripSites {
    std::vector<unsigned long> offsets;     // per block: its return address, as a module offset
    std::vector<int> ends_first, ends;      // CSR per block: the loops whose trips it ends
    std::vector<int> in_first, in_loop;     // CSR per block: its (block, loop) pairs and their loops
    int loops = 0;
};

TripSites config;
std::unordered_map<uintptr_t, int> block_of;  // absolute return address -> block
std::vector<uint32_t> lane_trip;               // [thread][loop]: trips begun (1 + ends seen)
std::vector<uint32_t> last_trip, lane_runs;    // [thread][pair]: the trip it last ran on, trips it ran on
std::vector<uint32_t> runs;                    // [block of the grid][pair]: sum over warps of the most of any lane
uintptr_t module_base = 0;
bool active = false;

uintptr_t base_of_this_module() {
    Dl_info info;
    if (!dladdr((void*)&base_of_this_module, &info) || !info.dli_fbase) return 0;
    return (uintptr_t)info.dli_fbase;
}

size_t pairs() { return config.in_loop.size(); }

}  // namespace

void trips_launch_begin(unsigned long nblocks) {
    active = (g.options & OPT_COUNT) && !config.offsets.empty();
    runs.assign(active ? nblocks * pairs() : 0, 0u);
    if (!active) return;
    if (!module_base) module_base = base_of_this_module();
    block_of.clear();
    for (size_t i = 0; i < config.offsets.size(); ++i) block_of[module_base + config.offsets[i]] = (int)i;
}

void trips_block_begin() {
    if (!active) return;
    lane_trip.assign((size_t)g.nthreads * config.loops, 1u);
    last_trip.assign((size_t)g.nthreads * pairs(), 0u);
    lane_runs.assign((size_t)g.nthreads * pairs(), 0u);
}

void trips_block_end() {
    if (!active) return;
    uint32_t* row = runs.data() + (size_t)g.block_linear * pairs();
    for (int w = 0; w * WARP < g.nthreads; ++w)
        for (size_t p = 0; p < pairs(); ++p) {
            uint32_t most = 0;
            for (int l = 0; l < WARP && w * WARP + l < g.nthreads; ++l)
                most = std::max(most, lane_runs[(size_t)(w * WARP + l) * pairs() + p]);
            row[p] += most;
        }
}

}  // namespace attn_cpu

using namespace attn_cpu;

// Called first thing by every basic block of the kernel's translation unit.
extern "C" void __sanitizer_cov_trace_pc() {
    if (!active || !g.cur) return;
    const auto it = block_of.find((uintptr_t)__builtin_return_address(0));
    if (it == block_of.end()) return;
    const int b = it->second;
    const int tid = g.cur->tid;
    uint32_t* trip = lane_trip.data() + (size_t)tid * config.loops;
    for (int k = config.ends_first[b]; k < config.ends_first[b + 1]; ++k) ++trip[config.ends[k]];
    uint32_t* last = last_trip.data() + (size_t)tid * pairs();
    uint32_t* n = lane_runs.data() + (size_t)tid * pairs();
    for (int p = config.in_first[b]; p < config.in_first[b + 1]; ++p) {
        const uint32_t now = trip[config.in_loop[p]];
        if (last[p] != now) {
            last[p] = now;
            ++n[p];
        }
    }
}

#define ATTN_API extern "C" __attribute__((visibility("default")))

// The blocks to count (n of them, `offsets` their return addresses as module offsets), in CSR
// form: block i ends a trip of the loops ends[ends_first[i] .. ends_first[i + 1]) and lies in the
// loops in_loop[in_first[i] .. in_first[i + 1]) (each a (block, loop) pair, numbered by its place
// there). n = 0 turns the count off.
ATTN_API void attn_cpu_set_trip_sites(const unsigned long* offsets, long n, const int* ends_first, const int* ends,
                                      const int* in_first, const int* in_loop, int loops) {
    config = TripSites{};
    if (n <= 0) return;
    config.offsets.assign(offsets, offsets + n);
    config.ends_first.assign(ends_first, ends_first + n + 1);
    config.ends.assign(ends, ends + ends_first[n]);
    config.in_first.assign(in_first, in_first + n + 1);
    config.in_loop.assign(in_loop, in_loop + in_first[n]);
    config.loops = loops;
}

// Per block of the last counted launch, per (block, loop) pair: the trips of the loop on which its
// warps ran the block, summed over warps (rows in linear block order). Returns the grid's blocks.
ATTN_API long attn_cpu_trip_runs(uint32_t* out, long cap_blocks) {
    const long n = pairs() ? (long)(runs.size() / pairs()) : 0;
    if (out && cap_blocks >= n && n) memcpy(out, runs.data(), sizeof(uint32_t) * runs.size());
    return n;
}

ATTN_API long attn_cpu_trip_pairs() { return (long)pairs(); }
