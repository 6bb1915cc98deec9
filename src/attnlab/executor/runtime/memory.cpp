// Every load and store of a kernel, and what a sanitizer checks on each.
//
// The kernel is compiled with g++ -fsanitize=thread, which puts a call to __tsan_read<N> or
// __tsan_write<N> before each memory access it cannot prove thread-private. This file defines
// those functions (ThreadSanitizer's own library is never linked). An access is classified by
// address:
//   shared memory  the block's arena: bounds (the launch's dynamic bytes and the static slots),
//                  uninitialized reads, reads of a cp.async destination before its wait, and races;
//   the runtime    the thread coordinates the kernel reads through threadIdx: skipped;
//   a fiber stack  the thread's local variables: skipped;
//   global memory  the launch's buffers (exact sizes, with unowned gaps around them): bounds and
//                  writes by two threads; anything else is an out-of-bounds access, and one that
//                  is not even in a gap ends the launch before the access can fault.
//
// Races (OPT_RACES): FastTrack-style happens-before. Each thread has a vector clock; barriers
// join clocks (sync.cpp). Each 2-byte cell of shared memory keeps its last write as an epoch
// (thread, clock) and its reads as an epoch, or as a vector clock once two unordered threads
// have read it. A write races with an earlier read or write of another thread that does not
// happen before it; a read races with an earlier write that does not. The check depends only
// on the barriers the threads executed, not on the order the scheduler ran them in.
#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "runtime.h"

namespace attn_cpu {

LaunchView view;

namespace {

enum : uint8_t { UNINIT = 0, INIT = 1, PENDING = 2 };
constexpr uint16_t NO_READ = 0xffff, READ_VC = 0xfffe, NO_WRITE = 0xffff;

struct Cell {
    void* w_pc;
    void* r_pc;
    uint32_t w_clk;
    uint32_t r_clk;  // or, with r_tid == READ_VC, the index of a read vector clock
    uint16_t w_tid;
    uint16_t r_tid;
    uint8_t state;
};

constexpr size_t ARENA_BYTES = SHARED_LIMIT + STATIC_SHARED_LIMIT + SHARED_SLACK;
constexpr size_t CELLS = ARENA_BYTES / 2;

Cell* cells = nullptr;
size_t cells_used = 0;  // cells to reset before the next block
std::vector<std::vector<uint32_t>> read_vcs;
std::vector<int> free_read_vcs;

// Global memory: buffers the launch allocated, each with a shadow of its writers.
struct GlobalCell {
    uint32_t block_plus1;  // 0: not written in this launch
    uint32_t clk;
    uint16_t tid;
};
struct Buffer {
    uint8_t* base;
    size_t bytes;
    uint8_t* mapping;
    size_t mapping_bytes;
    std::vector<GlobalCell> shadow;
};
std::vector<Buffer> buffers;

uintptr_t shared_lo, shared_span, stack_lo, stack_span, view_lo, threads_lo, threads_span;

int new_read_vc() {
    int i;
    if (!free_read_vcs.empty()) {
        i = free_read_vcs.back();
        free_read_vcs.pop_back();
    } else {
        i = (int)read_vcs.size();
        read_vcs.emplace_back(MAX_THREADS, 0u);
    }
    std::fill(read_vcs[i].begin(), read_vcs[i].begin() + g.nthreads, 0u);
    return i;
}

inline uint32_t clock_of(const Thread& t) { return t.vc[t.tid]; }

Thread* thread_at(uint16_t tid) { return tid < g.nthreads ? &g.threads[tid] : nullptr; }

void race(const char* what, Thread& t, void* pc, uint16_t other, void* other_pc, unsigned offset) {
    char buf[200];
    snprintf(buf, sizeof buf, "%s at shared byte %u with no barrier ordering them", what, offset);
    report("race", &t, pc, buf, thread_at(other), other_pc);
}

void cell_read(Thread& t, unsigned offset, Cell& c, void* pc) {
    if (c.state == PENDING) {
        char buf[160];
        snprintf(buf, sizeof buf, "reads shared byte %u, the destination of a cp.async of %s not yet waited for",
                 offset, thread_name(g.threads[c.w_tid]).c_str());
        report("cp.async read before wait", &t, pc, buf, thread_at(c.w_tid), c.w_pc);
        return;
    }
    if (c.state == UNINIT) {
        char buf[120];
        snprintf(buf, sizeof buf, "reads shared byte %u, which no thread has written", offset);
        report("uninitialized shared read", &t, pc, buf);
        return;
    }
    if (!(g.options & OPT_RACES)) return;
    const uint32_t now = clock_of(t);
    if (c.w_tid != NO_WRITE && c.w_tid != t.tid && c.w_clk > t.vc[c.w_tid])
        race("read after write", t, pc, c.w_tid, c.w_pc, offset);
    if (c.r_tid == READ_VC) {
        read_vcs[c.r_clk][t.tid] = now;
    } else if (c.r_tid == NO_READ || c.r_tid == t.tid || c.r_clk <= t.vc[c.r_tid]) {
        c.r_tid = (uint16_t)t.tid;  // the earlier read (if any) happens before this one
        c.r_clk = now;
    } else {  // two unordered reads: keep both, as a vector clock
        const int i = new_read_vc();
        read_vcs[i][c.r_tid] = c.r_clk;
        read_vcs[i][t.tid] = now;
        c.r_tid = READ_VC;
        c.r_clk = (uint32_t)i;
    }
    c.r_pc = pc;
}

void cell_write(Thread& t, unsigned offset, Cell& c, void* pc, bool async_issue) {
    if (c.state == PENDING && !(async_issue && c.w_tid == t.tid)) {
        char buf[160];
        snprintf(buf, sizeof buf, "writes shared byte %u while a cp.async of %s to it is in flight", offset,
                 thread_name(g.threads[c.w_tid]).c_str());
        report("race", &t, pc, buf, thread_at(c.w_tid), c.w_pc);
    }
    if (g.options & OPT_RACES) {
        if (c.w_tid != NO_WRITE && c.w_tid != t.tid && c.w_clk > t.vc[c.w_tid])
            race("write after write", t, pc, c.w_tid, c.w_pc, offset);
        if (c.r_tid == READ_VC) {
            const std::vector<uint32_t>& r = read_vcs[c.r_clk];
            for (int u = 0; u < g.nthreads; ++u)
                if (u != t.tid && r[u] > t.vc[u]) {
                    race("write after read", t, pc, (uint16_t)u, c.r_pc, offset);
                    break;
                }
            free_read_vcs.push_back((int)c.r_clk);
        } else if (c.r_tid != NO_READ && c.r_tid != t.tid && c.r_clk > t.vc[c.r_tid]) {
            race("write after read", t, pc, c.r_tid, c.r_pc, offset);
        }
        c.r_tid = NO_READ;
    }
    c.w_tid = (uint16_t)t.tid;
    c.w_clk = clock_of(t);
    c.w_pc = pc;
    c.state = async_issue ? PENDING : INIT;
}

bool shared_offset_valid(unsigned offset, unsigned size) {
    const size_t end = (size_t)offset + size;
    if (end <= g.dynamic_bytes) return true;
    return offset >= SHARED_LIMIT && end <= SHARED_LIMIT + g.static_used;
}

void out_of_bounds_shared(Thread& t, unsigned offset, unsigned size, bool write, void* pc) {
    char buf[200];
    if (offset < SHARED_LIMIT)
        snprintf(buf, sizeof buf, "%s %u bytes at dynamic shared offset %u; the launch has %zu bytes",
                 write ? "writes" : "reads", size, offset, g.dynamic_bytes);
    else
        snprintf(buf, sizeof buf, "%s %u bytes at static shared offset %zu; the kernel declares %zu bytes",
                 write ? "writes" : "reads", size, (size_t)offset - SHARED_LIMIT, g.static_used);
    report("shared out of bounds", &t, pc, buf);
}

void misaligned(Thread& t, const void* p, unsigned size, bool write, void* pc) {
    char buf[120];
    snprintf(buf, sizeof buf, "%s %u bytes at an address that is not %u-byte aligned", write ? "writes" : "reads",
             size, size);
    report("misaligned access", &t, pc, buf);
    (void)p;
}

void shared_access(Thread& t, unsigned offset, unsigned size, bool write, void* pc, bool async_issue = false) {
    if (!shared_offset_valid(offset, size)) {
        out_of_bounds_shared(t, offset, size, write, pc);
        return;
    }
    const size_t first = offset / 2, last = (offset + size - 1) / 2;
    if (last + 1 > cells_used) cells_used = last + 1;
    for (size_t i = first; i <= last; ++i) {
        if (write)
            cell_write(t, (unsigned)(i * 2), cells[i], pc, async_issue);
        else
            cell_read(t, (unsigned)(i * 2), cells[i], pc);
    }
}

Buffer* buffer_of(uintptr_t a) {
    for (Buffer& b : buffers)
        if (a - (uintptr_t)b.base < b.bytes) return &b;
    return nullptr;
}

bool in_gap(uintptr_t a, size_t size) {
    for (Buffer& b : buffers)
        if (a >= (uintptr_t)b.mapping && a + size <= (uintptr_t)b.mapping + b.mapping_bytes) return true;
    return false;
}

// OPT_COUNT: what an in-bounds access to buffer `index` adds to the counts, the warp's request log
// and the trace (an access out of bounds is a finding, not traffic).
void instrument_global(Thread& t, int index, size_t offset, uintptr_t a, unsigned size, bool write, void* pc) {
    count_lane(write ? K_GLOBAL_ST : K_GLOBAL_LD, pc, size);
    count_global_bytes(index, offset, size, write);
    log_global_access(t, a, size, write, pc);
    trace_access(t, index, offset, size, write, pc);
}

void global_access(Thread& t, uintptr_t a, unsigned size, bool write, void* pc) {
    Buffer* b = buffer_of(a);
    if (!b || a + size > (uintptr_t)b->base + b->bytes) {
        char buf[200];
        Buffer* near = nullptr;
        long long dist = 0;
        for (Buffer& x : buffers) {
            const long long d = a < (uintptr_t)x.base ? (long long)((uintptr_t)x.base - a)
                                                       : (long long)(a - ((uintptr_t)x.base + x.bytes));
            if (!near || d < dist) { near = &x; dist = d; }
        }
        if (near)
            snprintf(buf, sizeof buf, "%s %u bytes %lld bytes %s a %zu-byte global buffer", write ? "writes" : "reads",
                     size, a < (uintptr_t)near->base ? dist : dist + size, a < (uintptr_t)near->base ? "before" : "past the end of",
                     near->bytes);
        else
            snprintf(buf, sizeof buf, "%s %u bytes of global memory the launch does not own", write ? "writes" : "reads", size);
        report("global out of bounds", &t, pc, buf);
        if (!in_gap(a, size)) abort_launch();  // the access itself could fault: stop here, as a GPU would
        return;
    }
    if (size > 1 && (a & (size - 1)) && size <= 16) misaligned(t, (void*)a, size, write, pc);
    if (g.options & OPT_COUNT) instrument_global(t, (int)(b - buffers.data()), a - (uintptr_t)b->base, a, size, write, pc);
    const size_t first = (a - (uintptr_t)b->base) / 2, last = (a + size - 1 - (uintptr_t)b->base) / 2;
    for (size_t i = first; i <= last && i < b->shadow.size(); ++i) {
        GlobalCell& c = b->shadow[i];
        if (c.block_plus1 == 0) {
            if (write) c = GlobalCell{g.block_linear + 1, clock_of(t), (uint16_t)t.tid};
            continue;
        }
        const bool other_block = c.block_plus1 != g.block_linear + 1;
        const bool unordered = !other_block && c.tid != t.tid && (g.options & OPT_RACES) && c.clk > t.vc[c.tid];
        if (other_block || unordered) {
            char buf[200];
            snprintf(buf, sizeof buf, "%s global byte %zu of a buffer that %s wrote in this launch",
                     write ? "writes" : "reads", i * 2,
                     other_block ? "another block" : "another thread of the block, unordered,");
            report(other_block ? "global conflict between blocks" : "race", &t, pc, buf,
                   other_block ? nullptr : thread_at(c.tid));
        }
        if (write) c = GlobalCell{g.block_linear + 1, clock_of(t), (uint16_t)t.tid};
    }
}

// OPT_COUNT: what the access adds to the counts, the warp's request log and the trace.
void instrument_shared(Thread& t, unsigned offset, unsigned size, bool write, void* pc) {
    if (!g.in_wmma) count_lane(write ? K_SHARED_ST : K_SHARED_LD, pc, size);  // WMMA counts its own
    trace_access(t, -1, offset, size, write, pc);
}

inline void access_as(Thread& t, const void* p, unsigned size, bool write, void* pc) {
    const uintptr_t a = (uintptr_t)p;
    if (a - shared_lo < shared_span) {
        const unsigned offset = (unsigned)(a - shared_lo);
        if (size > 1 && (a & (size - 1)) && size <= 16) misaligned(t, p, size, write, pc);
        if (g.options & (OPT_BANKS | OPT_COUNT)) log_shared_access(t, offset, size, g.in_wmma ? 3 : 0, pc, write);
        if (g.options & OPT_COUNT) instrument_shared(t, offset, size, write, pc);
        shared_access(t, offset, size, write, pc);
        return;
    }
    if (a - stack_lo < stack_span) return;
    if (a - view_lo < sizeof(LaunchView) || a - threads_lo < threads_span) return;
    if ((++g.accesses & 0xfffff) == 0 && g.deadline > 0 && now_seconds() > g.deadline) {
        report("timeout", &t, pc, "the launch ran past its time limit (an endless loop?)");
        abort_launch();
    }
    global_access(t, a, size, write, pc);
}

inline void access(const void* p, unsigned size, bool write, void* pc) { access_as(*g.cur, p, size, write, pc); }

}  // namespace

// ---- what the rest of the runtime uses ----------------------------------------------------------
void memory_init() {
    if (g.shared) return;
    void* s = mmap(nullptr, ARENA_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cells = static_cast<Cell*>(mmap(nullptr, CELLS * sizeof(Cell), PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    g.shared = static_cast<uint8_t*>(s);
    shared_lo = (uintptr_t)g.shared;
    shared_span = ARENA_BYTES;
    stack_lo = (uintptr_t)g.stacks;
    stack_span = STACK_BYTES * MAX_THREADS;
    view_lo = (uintptr_t)&view;
    threads_lo = (uintptr_t)g.threads;
    threads_span = sizeof(Thread) * MAX_THREADS;
    cells_used = CELLS;
}

void shadow_reset_block() {
    // Poison: 0xff bytes are NaN as fp16 and fp32, so a value read before it is written shows.
    memset(g.shared, 0xff, std::min<size_t>(ARENA_BYTES, std::max<size_t>(cells_used * 2, g.dynamic_bytes)));
    for (size_t i = 0; i < cells_used; ++i) {
        Cell& c = cells[i];
        if (c.r_tid == READ_VC) free_read_vcs.push_back((int)c.r_clk);
        c = Cell{nullptr, nullptr, 0, 0, NO_WRITE, NO_READ, UNINIT};
    }
    cells_used = 0;
}

void shadow_reset_launch() {
    for (Buffer& b : buffers) std::fill(b.shadow.begin(), b.shadow.end(), GlobalCell{0, 0, 0});
    g.static_used = 0;
    g.static_slots.clear();
}

bool shared_in_bounds(unsigned offset, unsigned size) { return shared_offset_valid(offset, size); }

void shared_read(Thread& t, unsigned offset, unsigned size, void* pc) { shared_access(t, offset, size, false, pc); }
void shared_write(Thread& t, unsigned offset, unsigned size, void* pc) { shared_access(t, offset, size, true, pc); }
void async_issue_shadow(Thread& t, unsigned offset, void* pc) { shared_access(t, offset, 16, true, pc, true); }
void async_land_shadow(Thread& t, unsigned offset, void* pc) {
    // The data lands: an ordinary write by the issuing thread, at its wait.
    for (unsigned i = offset / 2; i < (offset + 16) / 2; ++i) {
        Cell& c = cells[i];
        if (c.state != PENDING || c.w_tid != t.tid) continue;  // overwritten meanwhile: reported then
        c.state = INIT;
        c.w_clk = clock_of(t);
        c.w_pc = pc;
    }
}
void checked_access(Thread& t, const void* p, unsigned size, bool write, void* pc) {
    access_as(t, p, size, write, pc);
}

void* allocate_global(size_t bytes) {
    const size_t page = 4096;
    const size_t body = (bytes + page - 1) / page * page;
    const size_t total = body + 2 * GLOBAL_GAP;
    void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    uint8_t* mapping = static_cast<uint8_t*>(m);
    // The buffer ends exactly at the end of its body (when its size allows): one byte past it
    // lands in the gap, not in the next page-rounded slack.
    uint8_t* base = mapping + GLOBAL_GAP + (body - bytes) / 16 * 16;
    buffers.push_back(Buffer{base, bytes, mapping, total, std::vector<GlobalCell>((bytes + 1) / 2)});
    return base;
}

void free_globals() {
    for (Buffer& b : buffers) munmap(b.mapping, b.mapping_bytes);
    buffers.clear();
}

uint8_t* shared_pointer(unsigned offset) { return g.shared + offset; }

}  // namespace attn_cpu

// ---- the instrumentation's entry points ----------------------------------------------------------
using attn_cpu::access;
#define ATTN_TSAN_VISIBILITY extern "C" __attribute__((visibility("hidden")))
ATTN_TSAN_VISIBILITY void __tsan_init() {}
ATTN_TSAN_VISIBILITY void __tsan_func_entry(void*) {}
ATTN_TSAN_VISIBILITY void __tsan_func_exit() {}
#define ATTN_TSAN_RW(N)                                                                                         \
    ATTN_TSAN_VISIBILITY void __tsan_read##N(void* p) { attn_cpu::access(p, N, false, ATTN_CALLER()); }         \
    ATTN_TSAN_VISIBILITY void __tsan_write##N(void* p) { attn_cpu::access(p, N, true, ATTN_CALLER()); }         \
    ATTN_TSAN_VISIBILITY void __tsan_unaligned_read##N(void* p) { attn_cpu::access(p, N, false, ATTN_CALLER()); } \
    ATTN_TSAN_VISIBILITY void __tsan_unaligned_write##N(void* p) { attn_cpu::access(p, N, true, ATTN_CALLER()); }
ATTN_TSAN_RW(1)
ATTN_TSAN_RW(2)
ATTN_TSAN_RW(4)
ATTN_TSAN_RW(8)
ATTN_TSAN_RW(16)
ATTN_TSAN_VISIBILITY void __tsan_read_range(void* p, unsigned long n) {
    for (unsigned long i = 0; i < n; i += 2) attn_cpu::access((char*)p + i, n - i >= 2 ? 2 : 1, false, ATTN_CALLER());
}
ATTN_TSAN_VISIBILITY void __tsan_write_range(void* p, unsigned long n) {
    for (unsigned long i = 0; i < n; i += 2) attn_cpu::access((char*)p + i, n - i >= 2 ? 2 : 1, true, ATTN_CALLER());
}
