// The C API Python calls (attnlab.executor.runtime loads it with ctypes), and the grid loop.
#include <cstring>
#include <exception>

#include "runtime.h"

namespace attn_cpu {
void allocate_threads();
void memory_init();
void set_kernel(void (*thunk)(void**), void** args);
void* allocate_global(size_t bytes);
void free_globals();
static long trace_block = -1;
static long range_lo = 0, range_hi = -1, range_step = 1;  // the blocks a launch runs: lo, lo + step, ... < hi (hi < 0: all)
std::string findings_text();

static std::vector<uint32_t> clocks;  // MAX_THREADS x MAX_THREADS vector clocks, allocated once
static std::string last_report;
}  // namespace attn_cpu

using namespace attn_cpu;

#define ATTN_API extern "C" __attribute__((visibility("default")))

ATTN_API int attn_cpu_abi_version() { return 1; }

// The block (linear index) whose events the next counted launch (OPT_COUNT) records; -1: none.
ATTN_API void attn_cpu_set_trace_block(long block) { trace_block = block; }

// The blocks lo, lo + step, ... below hi (linear indices) the next launches run, the others skipped
// (hi < 0: every block from lo): a counted launch split across processes, each counting its share of
// the grid, or the blocks of one head of a grid whose heads interleave (attnlab.executor.trace).
ATTN_API void attn_cpu_set_block_range(long lo, long hi, long step) {
    range_lo = lo;
    range_hi = hi;
    range_step = step > 0 ? step : 1;
}

ATTN_API void* attn_cpu_alloc(size_t bytes) { return allocate_global(bytes ? bytes : 1); }

ATTN_API void attn_cpu_free_all() { free_globals(); }

// The buffer holding `p` is reached only through pointer-to-const parameters in the next launches
// (read_only 1), or not (0): its reads then need no race shadow.
ATTN_API void attn_cpu_mark_read_only(void* p, int read_only) { mark_read_only(p, read_only != 0); }
ATTN_API void* attn_cpu_buffer_base(void* p) { return buffer_base(p); }

// Runs a whole grid. Returns 0 when every block ran to its end, 1 when the launch was stopped
// (deadlock, timeout, an access that would fault, a divergent .aligned operation), negative for a
// launch the executor refuses (the message is in the report).
ATTN_API int attn_cpu_launch(void (*thunk)(void**), void** args, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, size_t dynamic_bytes, uint64_t seed, unsigned options,
                             double time_limit) {
    g.findings.clear();
    g.printed.clear();
    for (BankCounter& b : g.banks) b = BankCounter{};
    const unsigned long long threads = (unsigned long long)bx * by * bz;
    if (!gx || !gy || !gz || !threads || threads > MAX_THREADS || dynamic_bytes > SHARED_LIMIT) {
        report("launch", nullptr, nullptr,
               "refused: a block of " + std::to_string(threads) + " threads (1..1024) with " +
                   std::to_string(dynamic_bytes) + " bytes of dynamic shared memory (at most " +
                   std::to_string(SHARED_LIMIT) + ")");
        return -1;
    }
    allocate_threads();
    memory_init();
    if (clocks.empty()) clocks.assign((size_t)MAX_THREADS * MAX_THREADS, 0u);
    g.options = options;
    g.seed = seed;
    g.rng = seed * 0x2545f4914f6cdd1dull + 1;
    g.grid = dim3{gx, gy, gz};
    g.block = dim3{bx, by, bz};
    g.dynamic_bytes = dynamic_bytes;
    g.nthreads = (int)threads;
    g.aborted = false;
    g.accesses = 0;
    g.deadline = time_limit > 0 ? now_seconds() + time_limit : 0;
    view.block_dim = g.block;
    view.grid_dim = g.grid;
    shadow_reset_launch();
    g.trace_block = trace_block;
    instrument_launch_begin((unsigned long)gx * gy * gz);
    trips_launch_begin((unsigned long)gx * gy * gz);
    set_kernel(thunk, args);
    for (int i = 0; i < g.nthreads; ++i) g.threads[i].vc = clocks.data() + (size_t)i * MAX_THREADS;
    watchdog_arm();
    for (unsigned z = 0; z < gz && !g.aborted; ++z)
        for (unsigned y = 0; y < gy && !g.aborted; ++y)
            for (unsigned x = 0; x < gx && !g.aborted; ++x) {
                view.block_idx = uint3{x, y, z};
                g.block_linear = x + gx * (y + gy * z);
                if ((long)g.block_linear < range_lo || (range_hi >= 0 && (long)g.block_linear >= range_hi) ||
                    ((long)g.block_linear - range_lo) % range_step != 0)
                    continue;
                for (int i = 0; i < g.nthreads; ++i) {
                    std::fill(g.threads[i].vc, g.threads[i].vc + g.nthreads, 0u);
                    g.threads[i].vc[i] = 1;
                }
                shadow_reset_block();
                // The traced block's schedule from its own seed, not from the blocks run before
                // it: its events then come out the same when the grid is split across processes.
                if ((options & OPT_COUNT) && (long)g.block_linear == trace_block)
                    g.rng = (seed ^ ((uint64_t)g.block_linear + 1) * 0x9e3779b97f4a7c15ull) * 0x2545f4914f6cdd1dull + 1;
                instrument_block_begin();
                trips_block_begin();
                run_block();
                trips_block_end();
            }
    g.cur = nullptr;
    watchdog_disarm();
    return g.aborted ? 1 : 0;
}

// The findings of the last launch, one per line (fields separated by tabs; see findings.cpp).
// Returns the length of the whole text; copies at most cap - 1 bytes and a terminating zero.
ATTN_API size_t attn_cpu_report(char* buf, size_t cap) {
    last_report = findings_text();
    if (buf && cap) {
        const size_t n = last_report.size() < cap - 1 ? last_report.size() : cap - 1;
        memcpy(buf, last_report.data(), n);
        buf[n] = 0;
    }
    return last_report.size();
}

// Bank-conflict counters of the last launch: requests, wavefronts, ideal wavefronts for ldmatrix,
// cp.async and ordinary shared loads and stores (9 numbers).
ATTN_API void attn_cpu_banks(long long* out) {
    for (int i = 0; i < 3; ++i) {
        out[3 * i] = g.banks[i].requests;
        out[3 * i + 1] = g.banks[i].wavefronts;
        out[3 * i + 2] = g.banks[i].ideal;
    }
}

// What the last launch's printf calls wrote (the same contract as attn_cpu_report).
ATTN_API size_t attn_cpu_stdout(char* buf, size_t cap) {
    if (buf && cap) {
        const size_t n = g.printed.size() < cap - 1 ? g.printed.size() : cap - 1;
        memcpy(buf, g.printed.data(), n);
        buf[n] = 0;
    }
    return g.printed.size();
}
