// The CPU executor's runtime: internal state shared by its parts.
//
//   launch.cpp   the C API Python calls, the grid loop, global buffers
//   fiber.cpp    the threads of a block as fibers, the scheduler, deadlock reports
//   memory.cpp   every load and store (the __tsan_* callbacks), shadow memory, race detection
//   sync.cpp     __syncthreads, named barriers (bar.sync / bar.arrive), __syncwarp
//   warp.cpp     warp-collective rendezvous (several masks in flight), shuffles, votes, match,
//                reduce, ldmatrix, mma.sync m16n8k16
//   wmma.cpp     nvcuda::wmma fragments with a seeded random element-to-lane mapping
//   async.cpp    cp.async with commit and wait groups, the other PTX helpers, shared-memory slots
//   atomics.cpp  atomicAdd, atomicCAS, ... on shared and global memory, and the kernel's printf
//   findings.cpp what a sanitizer would report, one line each, and the bank-conflict counters
//   instrument.cpp what the kernel did (OPT_COUNT): counts per instruction site and per block, the
//                distinct global bytes, and the trace of one chosen block, event by event
//
// One OS thread runs one launch: the blocks one after another, the threads of a block as fibers
// that switch only where a CUDA thread may wait (a barrier, a warp-collective operation, exit).
// Between two such points a fiber runs alone, so the values a kernel computes depend on the order
// the scheduler picks (seeded); whether two accesses race does not: the race check orders
// accesses by happens-before (vector clocks), never by the schedule that happened to run.
#pragma once
#include <stddef.h>
#include <signal.h>
#include <stdint.h>

#include <string>
#include <unordered_set>
#include <vector>

#include "attn_cpu/prelude.h"

namespace attn_cpu {

constexpr int MAX_THREADS = 1024;
constexpr int WARP = 32;
constexpr int MAX_WARPS = MAX_THREADS / WARP;
constexpr int NUM_BARRIERS = 16;
constexpr size_t STACK_BYTES = 256 << 10;       // per fiber; kernels keep arrays of up to a few KB
constexpr size_t SHARED_LIMIT = 232448;          // 227 KB: the most any sm_80..sm_90 block may ask for
constexpr size_t STATIC_SHARED_LIMIT = 48 << 10; // static __shared__ is capped at 48 KB
constexpr size_t SHARED_SLACK = 64 << 10;        // past the end: out of bounds, yet safe to touch
constexpr unsigned SHARED_WINDOW = 0x10000000u;  // shared addresses (32-bit) start here
constexpr size_t GLOBAL_GAP = 64 << 10;          // unowned bytes around every global buffer

// Launch options (bit flags, from Python).
enum : unsigned {
    OPT_RACES = 1u << 0,    // happens-before race detection (vector clocks)
    OPT_BANKS = 1u << 1,    // count bank conflicts of per-thread shared accesses and cp.async
    OPT_PREEMPT = 1u << 2,  // after a warp-collective, sometimes switch to another warp
    OPT_COUNT = 1u << 3,    // count per instruction site and per block; trace one block (instrument.cpp)
};

enum class Run : uint8_t { Ready, Blocked, Exited };
enum class WaitOn : uint8_t { Nothing, Barrier, Collective, Active };  // Active: at __activemask

// Kinds of warp-collective operation; lanes meet at one of these.
enum Coll : uint8_t { C_NONE, C_SYNCWARP, C_SHFL, C_LDSM, C_MMA, C_WMMA_LOAD, C_WMMA_STORE, C_WMMA_MMA };
const char* coll_name(int kind);

// One cp.async copy in flight: 16 bytes read at issue, written to shared memory at its wait.
struct AsyncCopy {
    unsigned dst;       // shared offset (from the arena base)
    int group;          // commit-group number of the issuing thread
    void* pc;
    uint8_t data[16];
};

// A lane's accesses kept for bank-conflict and sector counting (OPT_BANKS, OPT_COUNT), as a run:
// `count` accesses at one instruction, at offset, offset + stride, ... A loop down a row or a
// column is one entry, so that a warp that meets rarely (chapter 1 never, until it exits) keeps a
// log of kilobytes, not of hundreds of megabytes.
struct LoggedAccess {
    void* pc;
    uint64_t offset;  // shared: from the arena base; global: the address
    int64_t stride;
    uint32_t count;
    uint8_t size;
    uint8_t kind;  // 0 shared load/store, 1 cp.async, 2 global load/store (OPT_COUNT), 3 WMMA fragment element
    bool write;
};

// Kinds of warp-collective operation past enum Coll's (warp.cpp): vote.sync, match.sync and
// redux.sync. Like shfl.sync and bar.warp.sync they are not .aligned: the lanes of their mask meet.
enum : uint8_t { C_VOTE = C_WMMA_MMA + 1, C_MATCH, C_REDUX };

// Operands a lane brings to a warp-collective operation.
struct CollArgs {
    int kind = C_NONE;   // the collective this lane waits at (or last met)
    unsigned mask = 0;
    void* pc = nullptr;
    // shuffle; vote, match and redux take their operand in value (match.b64: value_hi too)
    unsigned value = 0, value_hi = 0, result = 0;
    int lane_arg = 0, width = 32, mode = 0;
    // ldmatrix
    unsigned addr = 0;
    bool trans = false;
    unsigned* out4 = nullptr;
    // mma.sync
    float* d = nullptr;
    const unsigned* a = nullptr;
    unsigned b0 = 0, b1 = 0;
    // wmma
    int use = 0;
    void* elements = nullptr;
    const void* c_elements = nullptr;
    const void* b_elements = nullptr;
    int b_use = 0;
    const void* ptr = nullptr;
    unsigned ldm = 0;
    bool col_major = false;
};

struct Thread {
    Coordinates coords;  // what threadIdx reads
    void* sp = nullptr;  // saved stack pointer while switched out
    int tid = 0, warp = 0, lane = 0;
    Run run = Run::Ready;
    WaitOn wait = WaitOn::Nothing;
    int wait_barrier = -1;
    bool wait_is_sync = false;
    void* wait_pc = nullptr;
    uint32_t* vc = nullptr;  // vector clock, one entry per thread of the block
    CollArgs coll;
    std::vector<AsyncCopy> copies;
    int next_group = 0;      // number of the group the next cp.async joins
    std::vector<LoggedAccess> log;
    static constexpr int LOG_RECENT = 4;
    uint32_t log_recent[LOG_RECENT] = {};  // 1 + the index of its latest runs in `log` (0: none)
    unsigned log_recent_next = 0;
    int step = 0;            // block barriers (bar.sync, bar.arrive) this thread has executed
    static constexpr int RECENT = 8;
    long recent[RECENT] = {-1, -1, -1, -1, -1, -1, -1, -1};  // its latest access events in the trace
    unsigned recent_next = 0;
};

// Lanes of one warp waiting at one warp-collective operation (warp.cpp).
struct CollGroup {
    int kind = C_NONE;
    int op = 0;              // the qualifiers the lanes must share too (shfl's mode, vote's, ...)
    unsigned mask = 0;       // the membermask each lane passed (the .aligned kinds: 0xffffffff)
    void* pc = nullptr;      // the first lane's call
    unsigned arrived = 0;
};

struct Warp {
    unsigned lanes = 0;      // lanes that exist (blockDim may end mid-warp)
    unsigned exited = 0;
    // Collectives in flight: lanes under disjoint masks (two half-warps), or some lanes' collective
    // before one of a wider mask, wait at the same time. A waiting lane is in one group: 32 suffice.
    CollGroup groups[WARP];
    int ngroups = 0;
    int kind = C_NONE;       // the collective being performed, while it is (wmma.cpp reads it)
    unsigned mask = 0;
    void* pc = nullptr;
    unsigned epoch = 0;      // times its request log was grouped (banks.cpp): the trace's epochs
    unsigned ready = 0;      // lanes whose thread is Ready (set_run keeps it): the scheduler's pick
    unsigned at_activemask = 0;  // lanes waiting at an __activemask for the rest of the warp (warp.cpp)
};

struct Barrier {
    int expected = -1;       // thread count of the phase in progress (-1: none yet)
    bool all_threads = false;
    void* first_pc = nullptr;
    unsigned lanes_arrived[MAX_WARPS];  // per warp, lanes at this barrier in this phase
    bool warp_counted[MAX_WARPS];
    int counted = 0;         // threads counted (32 per warp that has fully arrived)
    std::vector<uint32_t> join;  // vector clock joined from every participant
    std::vector<int> syncers;    // threads waiting in bar.sync
};

// One hazard: a kind at a pair of source sites (pc, pc2), its first occurrence's message and
// threads, how many times it happened, and the distinct bytes and threads it touched.
struct Finding {
    std::string kind, message;
    uint3 block{};
    int warp = -1, lane = -1;
    void* pc = nullptr;
    void* pc2 = nullptr;
    int other_warp = -1, other_lane = -1;
    long count = 1;
    std::unordered_set<uint64_t> bytes, threads;
};

// A static __shared__ declaration: where its slot lies, and what to call a byte of it.
struct StaticSlot {
    int id;
    size_t offset, bytes, element;
    const char* name;
    int rank;
    const size_t* dims;
};

struct BankCounter {
    long requests = 0, wavefronts = 0, ideal = 0;
};

struct State {
    // launch
    unsigned options = 0;
    uint64_t seed = 0;
    uint64_t rng = 0;
    dim3 grid{}, block{};
    size_t dynamic_bytes = 0;
    int nthreads = 0, nwarps = 0;
    unsigned block_linear = 0;
    bool aborted = false;
    bool in_wmma = false;    // the runtime is moving WMMA fragment elements (their layout is not the GPU's)
    long trace_block = -1;   // the block whose events are recorded (OPT_COUNT), linear index
    bool tracing = false;    // the running block is that block
    double deadline = 0;     // seconds (monotonic); 0: none
    long long accesses = 0;
    volatile sig_atomic_t interrupted = 0;  // SIGINT arrived during the launch (fiber.cpp's watchdog)
    // threads
    Thread* threads = nullptr;  // MAX_THREADS, allocated once
    Thread* cur = nullptr;
    void* scheduler_sp = nullptr;
    uint8_t* stacks = nullptr;
    Warp warps[MAX_WARPS];
    int exited_threads = 0;
    Barrier barriers[NUM_BARRIERS];
    // shared memory
    uint8_t* shared = nullptr;      // dynamic bytes, then static slots, then slack
    size_t static_used = 0;
    std::vector<StaticSlot> static_slots;
    std::string dynamic_name;   // the first `extern __shared__` array's name, and its element size
    size_t dynamic_element = 1;
    std::string printed;        // what the kernel's printf wrote in this launch
    // findings and counters
    std::vector<Finding> findings;
    BankCounter banks[3];  // 0 ldmatrix, 1 cp.async, 2 ordinary loads and stores
};
extern State g;

// A thread's run state, and its warp's mask of Ready lanes with it (the scheduler reads the mask
// rather than the 32 threads at every switch).
inline void set_run(Thread& t, Run r) {
    t.run = r;
    if (r == Run::Ready) g.warps[t.warp].ready |= 1u << t.lane;
    else g.warps[t.warp].ready &= ~(1u << t.lane);
}

// fiber.cpp
void run_block();
void block_current(WaitOn why, void* pc);  // switch out until someone makes this thread Ready
void make_ready(Thread& t);
void abort_launch();
// Whether an instruction address lies in the kernel's own code: between the two marker functions
// build.py links around the kernel's object (watchdog.cpp, memory.cpp's memcpy).
bool in_kernel_code(uintptr_t ip);
std::string timeout_text();  // fiber.cpp: what a launch stopped at its limit says
void activemask_poll(int warp);  // warp.cpp: a lane of `warp` blocked or exited
void watchdog_arm();     // watchdog.cpp: around each launch
void watchdog_disarm();
uint64_t next_random();
double now_seconds();

// memory.cpp
void shadow_reset_block();
void shadow_reset_launch();
void mark_read_only(const void* p, bool read_only);
void* buffer_base(const void* p);
// The runtime's own accesses on behalf of a thread (ldmatrix, WMMA, cp.async).
void shared_read(Thread& t, unsigned offset, unsigned size, void* pc);
void shared_write(Thread& t, unsigned offset, unsigned size, void* pc);
bool shared_in_bounds(unsigned offset, unsigned size);
// Any access the runtime makes for a thread (WMMA loads and stores): classified and checked as
// the kernel's own accesses are.
void checked_access(Thread& t, const void* p, unsigned size, bool write, void* pc);
bool atomic_access(Thread& t, const void* p, unsigned size, void* pc);  // checked; false: out of bounds, not done
void async_issue_shadow(Thread& t, unsigned offset, void* pc);
void async_land_shadow(Thread& t, unsigned offset, void* pc);
void log_shared_access(Thread& t, uint32_t offset, unsigned size, int kind, void* pc, bool write = false);
void log_global_access(Thread& t, uint64_t address, unsigned size, bool write, void* pc);
void flush_bank_log(int warp);
void clear_log(Thread& t);  // empty a lane's log, and its index of latest runs with it
unsigned wavefronts_for(const uint32_t* offsets, int n, unsigned size);

// sync.cpp
void vc_tick(Thread& t);
void on_thread_exit(Thread& t);
void barriers_reset();

// instrument.cpp (all no-ops without OPT_COUNT)
enum SiteKind : uint8_t {
    K_SHARED_LD, K_SHARED_ST, K_GLOBAL_LD, K_GLOBAL_ST, K_LDMATRIX, K_CP_ASYNC, K_MMA, K_WMMA_LOAD, K_WMMA_STORE,
    K_WMMA_MMA, K_SHFL, K_SYNCWARP, K_BAR_SYNC, K_BAR_ARRIVE, K_EXP, K_COMMIT, K_WAIT, K_KINDS
};
enum EventKind : uint8_t {
    E_ACCESS, E_LDMATRIX, E_MMA, E_WMMA_LOAD, E_WMMA_STORE, E_WMMA_MMA, E_SHFL, E_SYNCWARP, E_CP_ASYNC, E_COMMIT,
    E_WAIT, E_BAR_SYNC, E_BAR_ARRIVE, E_EXIT
};
void instrument_launch_begin(unsigned long blocks);
void instrument_block_begin();
void count_lane(int kind, void* pc, unsigned bytes);                 // one lane's operation
void count_request(int kind, void* pc, unsigned units, unsigned ideal);  // one warp-wide instruction
void count_site(int kind, void* pc, long long lanes, long long requests, long long bytes, long long units = 0,
                long long ideal = 0);
void count_global_bytes(int buffer, size_t offset, unsigned size, bool write);
void count_tensor_flops(long flops);
void trace_access(Thread& t, int buffer, uint64_t offset, unsigned size, bool write, void* pc);
// trips.cpp (no-ops without OPT_COUNT or without the blocks to count)
void trips_launch_begin(unsigned long blocks);
void trips_block_begin();
void trips_block_end();
void trace_event(Thread& t, int kind, void* pc, uint64_t offset, unsigned bytes, int arg, int buffer = -2,
                 unsigned extra = 0);
void trace_warp_event(int warp, int kind, void* pc, int arg = 0);

// findings.cpp. `where`/`nbytes`: the bytes the hazard touched (counted as distinct bytes; where
// is any key naming a byte: an offset, a buffer and offset). Messages may hold tokens the Python
// side renders: {pc:HEX} a source line (HEX a module offset), {global:B:OFF} byte OFF of buffer B.
void report(const char* kind, Thread* t, void* pc, const std::string& message, Thread* other = nullptr,
            void* pc2 = nullptr, uint64_t where = ~0ull, unsigned nbytes = 0);
std::string pc_token(void* pc);

// async.cpp: a shared-memory byte by its declaration ("tile[3][17]", "smem[1032]").
std::string shared_name(unsigned offset);
std::string thread_name(const Thread& t);
std::string lanes_text(unsigned mask);
unsigned long module_offset(void* pc);  // an address as addr2line reads it (0: unknown)

}  // namespace attn_cpu

#define ATTN_CALLER() __builtin_return_address(0)
