// On how many trips of a loop each source line of the kernel ran, per warp (OPT_COUNT): what the
// time model needs to weigh a key-tile loop's SASS by how often each part of it runs (a copy that
// stops STAGES - 1 tiles before the end, a mask only on diagonal tiles, Q's fragments on the
// first trip only).
//
// The kernel's translation unit is built with -fsanitize-coverage=trace-pc: every basic block
// calls __sanitizer_cov_trace_pc first, and its return address names the block. Before a counted
// launch attnlab.executor.trips gives the runtime, per block (a module offset), the loops it ends
// a trip of (it holds the code of a `for` statement's own line: its test and increment) and the
// (line, loop) pairs it records: a line inside the loop's body whose code the block holds. Each
// lane counts its trips of every loop; a warp ran a line on a trip when any of its lanes ran any
// block holding the line's code while on that trip (a set of trips per warp and pair, so lanes
// that run apart between collectives are counted as one warp). The counts are exact and do not
// depend on the schedule.
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
    std::vector<int> records_first, records;  // CSR per block: the (line, loop) pairs it records
    std::vector<int> pair_loop;             // per pair: its loop
    int loops = 0;
};

TripSites config;
std::unordered_map<uintptr_t, int> block_of;   // absolute return address -> block
std::vector<uint32_t> lane_trip;                // [thread][loop]: trips ended (ends seen)
std::vector<std::vector<uint64_t>> seen;        // [warp][pair]: the trips it ran the pair's line on, as bits
std::vector<uint32_t> runs;                     // [block of the grid][pair]: the trips, summed over warps
uintptr_t module_base = 0;
bool active = false;

uintptr_t base_of_this_module() {
    Dl_info info;
    if (!dladdr((void*)&base_of_this_module, &info) || !info.dli_fbase) return 0;
    return (uintptr_t)info.dli_fbase;
}

size_t pairs() { return config.pair_loop.size(); }

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
    lane_trip.assign((size_t)g.nthreads * config.loops, 0u);
    const size_t warps = (size_t)(g.nthreads + WARP - 1) / WARP;
    if (seen.size() < warps * pairs()) seen.resize(warps * pairs());
    for (auto& bits : seen) bits.clear();
}

// A lane's trip counter is 0 before its first block that ends a trip (the loop's entry test), and
// after its last (the exit test, or the latch of the last trip) it stands past the last trip: code
// of a line inside the body that the host compiler also placed before or after the loop runs
// outside [1, last - 1] and is not a trip. A warp's last is its lanes' furthest. (A loop whose
// entry test the host compiler folds away loses its first trip this way; the time model checks
// the trips against the executor's tensor-core count and gives no bound where they disagree.)
void trips_block_end() {
    if (!active) return;
    uint32_t* row = runs.data() + (size_t)g.block_linear * pairs();
    std::vector<uint32_t> last(config.loops);
    for (int w = 0; w * WARP < g.nthreads; ++w) {
        std::fill(last.begin(), last.end(), 0u);
        for (int l = 0; l < WARP && w * WARP + l < g.nthreads; ++l)
            for (int h = 0; h < config.loops; ++h)
                last[h] = std::max(last[h], lane_trip[(size_t)(w * WARP + l) * config.loops + h]);
        for (size_t p = 0; p < pairs(); ++p) {
            const std::vector<uint64_t>& bits = seen[(size_t)w * pairs() + p];
            const uint32_t hi = last[config.pair_loop[p]];  // trips are 1 .. hi - 1
            for (uint32_t i = 1; i + 1 <= hi && i / 64 < bits.size(); ++i) row[p] += (bits[i / 64] >> (i % 64)) & 1;
        }
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
    const Thread& t = *g.cur;
    uint32_t* trip = lane_trip.data() + (size_t)t.tid * config.loops;
    for (int k = config.ends_first[b]; k < config.ends_first[b + 1]; ++k) ++trip[config.ends[k]];
    for (int k = config.records_first[b]; k < config.records_first[b + 1]; ++k) {
        const int p = config.records[k];
        const uint32_t now = trip[config.pair_loop[p]];
        std::vector<uint64_t>& bits = seen[(size_t)t.warp * pairs() + p];
        if (bits.size() <= now / 64) bits.resize(now / 64 + 1, 0);
        bits[now / 64] |= uint64_t(1) << (now % 64);
    }
}

#define ATTN_API extern "C" __attribute__((visibility("default")))

// The blocks to count (n of them, `offsets` their return addresses as module offsets), in CSR
// form: block i ends a trip of the loops ends[ends_first[i] .. ends_first[i + 1]) and records the
// (line, loop) pairs records[records_first[i] .. records_first[i + 1]); pair p's loop is
// pair_loop[p]. n = 0 turns the count off.
ATTN_API void attn_cpu_set_trip_sites(const unsigned long* offsets, long n, const int* ends_first, const int* ends,
                                      const int* records_first, const int* records, const int* pair_loop,
                                      long npairs, int loops) {
    config = TripSites{};
    if (n <= 0) return;
    config.offsets.assign(offsets, offsets + n);
    config.ends_first.assign(ends_first, ends_first + n + 1);
    config.ends.assign(ends, ends + ends_first[n]);
    config.records_first.assign(records_first, records_first + n + 1);
    config.records.assign(records, records + records_first[n]);
    config.pair_loop.assign(pair_loop, pair_loop + npairs);
    config.loops = loops;
}

// Per block of the last counted launch, per (line, loop) pair: the trips of the loop on which its
// warps ran the line, summed over warps (rows in linear block order). Returns the grid's blocks.
ATTN_API long attn_cpu_trip_runs(uint32_t* out, long cap_blocks) {
    const long n = pairs() ? (long)(runs.size() / pairs()) : 0;
    if (out && cap_blocks >= n && n) memcpy(out, runs.data(), sizeof(uint32_t) * runs.size());
    return n;
}

ATTN_API long attn_cpu_trip_pairs() { return (long)pairs(); }
