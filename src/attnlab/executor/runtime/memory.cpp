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
//   global memory  the launch's buffers (exact sizes, with unowned gaps around them): bounds,
//                  races between threads of a block, and conflicts between blocks; anything else
//                  is an out-of-bounds access, and one that is not even in a gap ends the launch
//                  before the access can fault.
//
// Races (OPT_RACES): FastTrack-style happens-before. Each thread has a vector clock; barriers
// join clocks (sync.cpp). Each byte of shared and global memory keeps its last write as an epoch
// (thread, clock) and its reads as an epoch, or as a vector clock once two unordered threads
// have read it. A write races with an earlier read or write of another thread that does not
// happen before it; a read races with an earlier write that does not. The check depends only
// on the barriers the threads executed, not on the order the scheduler ran them in. Bytes, not
// words: two threads writing neighbouring bytes (char, bool, int8 data) touch distinct locations.
//
// Blocks of a grid are never ordered: in global memory, any two accesses to one byte by different
// blocks of a launch, one of them a write, conflict, whichever block ran first here (each byte
// also keeps the block of its last write and of its reads), unless both are atomic.
//
// Atomics (atomicAdd, atomicCAS, ... runtime/atomics.cpp) never race with each other; a plain
// access unordered with an atomic update races with it. A byte keeps its latest write only, so a
// plain access is checked against the latest atomic update of that byte.
#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "runtime.h"

namespace attn_cpu {

LaunchView view;

namespace {

enum : uint8_t { UNINIT = 0, INIT = 1, PENDING = 2 };
enum : uint8_t { W_ATOMIC = 1, READ_BY_BLOCKS = 2 };  // Cell::flags
constexpr uint16_t NONE = 0, READ_VC = 0xffff;        // Cell::w_tid1, r_tid1 (else: thread + 1)

// The shadow of one byte. All zero is "never touched", so that a fresh mapping is a clean shadow.
struct Cell {
    void* w_pc;
    void* r_pc;
    uint32_t w_clk;
    uint32_t r_clk;    // or, with r_tid1 == READ_VC, the index of a read vector clock
    uint16_t w_tid1;   // the last writer + 1
    uint16_t r_tid1;   // the last reader + 1, or READ_VC
    uint8_t state;     // shared memory: UNINIT, INIT, PENDING (a cp.async destination)
    uint8_t flags;
    uint32_t w_block;  // global memory: the block (linear index + 1) of the last write, and of the
    uint32_t r_block;  // reads kept in r_*; READ_BY_BLOCKS: another block read it since that write
};

constexpr size_t ARENA_BYTES = SHARED_LIMIT + STATIC_SHARED_LIMIT + SHARED_SLACK;

Cell* cells = nullptr;  // one per byte of the shared arena
size_t cells_used = 0;  // cells to reset before the next block
// Read vector clocks, g.nthreads entries each, in one pool (a byte read by every thread of a block,
// as K and V are, has one: the pool grows with the launch and is reused by the next).
std::vector<uint32_t> vc_pool;
size_t vc_stride = 0, vc_count = 0;
std::vector<int> free_read_vcs;
inline uint32_t* read_vc(uint32_t i) { return vc_pool.data() + (size_t)i * vc_stride; }

// Global memory: buffers the launch allocated, each with a shadow of its bytes (mapped on demand).
struct Buffer {
    uint8_t* base;
    size_t bytes;
    uint8_t* mapping;
    size_t mapping_bytes;
    Cell* shadow;
    bool shadow_dirty;
    bool read_only;  // reached only through pointer-to-const parameters in this launch
};
std::vector<Buffer> buffers;

uintptr_t shared_lo, shared_span, stack_lo, stack_span, view_lo, threads_lo, threads_span;

// What one access found, byte by byte, reported once per kind after its last byte.
enum Hazard : uint8_t { H_RAW, H_WAR, H_WAW, H_UNINIT, H_PENDING_READ, H_PENDING_WRITE, H_BLOCKS, H_KINDS };
struct Found {  // valid where AccessFindings::mask has its bit: nothing is initialised per access
    unsigned bytes;
    size_t first;           // offset of its first byte (shared: arena; global: in the buffer)
    uint16_t other1;        // the other thread + 1 (0: none)
    void* other_pc;
    uint32_t other_block;
    bool other_atomic, other_wrote;
};
struct AccessFindings {
    unsigned mask = 0;  // the hazards met
    Found f[H_KINDS];
    void note(Hazard h, size_t offset, uint16_t other1, void* other_pc, uint32_t other_block = 0,
              bool other_atomic = false, bool other_wrote = false) {
        Found& x = f[h];
        if (!(mask & (1u << h))) {
            mask |= 1u << h;
            x.bytes = 1;
            x.first = offset;
            x.other1 = other1;
            x.other_pc = other_pc;
            x.other_block = other_block;
            x.other_atomic = other_atomic;
            x.other_wrote = other_wrote;
        } else {
            ++x.bytes;
        }
    }
};

enum class Mode : uint8_t { Read, Write, Atomic, AsyncIssue };

int new_read_vc() {
    int i;
    if (!free_read_vcs.empty()) {
        i = free_read_vcs.back();
        free_read_vcs.pop_back();
    } else {
        i = (int)vc_count++;
        if (vc_pool.size() < vc_count * vc_stride) vc_pool.resize(std::max(vc_count * vc_stride, vc_pool.size() * 2));
    }
    std::fill(read_vc(i), read_vc(i) + vc_stride, 0u);
    return i;
}

inline uint32_t clock_of(const Thread& t) { return t.vc[t.tid]; }
inline uint32_t block_id() { return g.block_linear + 1; }

Thread* thread_at1(uint16_t tid1) { return tid1 && tid1 != READ_VC && tid1 <= g.nthreads ? &g.threads[tid1 - 1] : nullptr; }

void forget_reads(Cell& c) {
    if (c.r_tid1 == READ_VC) free_read_vcs.push_back((int)c.r_clk);
    c.r_tid1 = NONE;
    c.r_pc = nullptr;
}

// A read of one byte. `global`: the byte's blocks are checked and kept; shared memory also has
// its cp.async and initialization states.
void cell_read(Thread& t, Cell& c, size_t offset, void* pc, bool global, AccessFindings& out) {
    const uint32_t me = block_id();
    if (global) {
        if (c.w_block && c.w_block != me) {
            out.note(H_BLOCKS, offset, NONE, c.w_pc, c.w_block, c.flags & W_ATOMIC, true);
        }
        if (c.r_block != me) {  // the reads kept so far are another block's (or none)
            if (c.r_block) c.flags |= READ_BY_BLOCKS;
            forget_reads(c);
            c.r_block = me;
        }
    } else if (c.state == PENDING) {
        out.note(H_PENDING_READ, offset, c.w_tid1, c.w_pc);
        return;
    } else if (c.state == UNINIT) {
        out.note(H_UNINIT, offset, NONE, nullptr);  // and kept as a read: a later unordered write races with it
    }
    if (!(g.options & OPT_RACES)) return;
    const uint32_t now = clock_of(t);
    const bool same_block_write = !global || c.w_block == me;
    if (same_block_write && c.w_tid1 && c.w_tid1 - 1 != t.tid && c.w_clk > t.vc[c.w_tid1 - 1])
        out.note(H_RAW, offset, c.w_tid1, c.w_pc, 0, c.flags & W_ATOMIC, true);
    if (c.r_tid1 == READ_VC) {
        read_vc(c.r_clk)[t.tid] = now;
    } else if (c.r_tid1 == NONE || c.r_tid1 - 1 == t.tid || c.r_clk <= t.vc[c.r_tid1 - 1]) {
        c.r_tid1 = (uint16_t)(t.tid + 1);  // the earlier read (if any) happens before this one
        c.r_clk = now;
    } else {  // two unordered reads: keep both, as a vector clock
        const int i = new_read_vc();
        read_vc(i)[c.r_tid1 - 1] = c.r_clk;
        read_vc(i)[t.tid] = now;
        c.r_tid1 = READ_VC;
        c.r_clk = (uint32_t)i;
    }
    c.r_pc = pc;
}

// A write of one byte: a plain store, an atomic update (Mode::Atomic), or a cp.async issue
// (Mode::AsyncIssue: the destination becomes pending until the issuing thread's wait).
void cell_write(Thread& t, Cell& c, size_t offset, void* pc, Mode mode, bool global, AccessFindings& out) {
    const uint32_t me = block_id();
    const bool atomic = mode == Mode::Atomic;
    const bool both_atomic = atomic && (c.flags & W_ATOMIC);
    if (global) {
        if (c.w_block && c.w_block != me && !both_atomic)
            out.note(H_BLOCKS, offset, NONE, c.w_pc, c.w_block, c.flags & W_ATOMIC, true);
        else if (c.r_block && (c.r_block != me || (c.flags & READ_BY_BLOCKS)))
            out.note(H_BLOCKS, offset, NONE, c.r_pc, c.r_block != me ? c.r_block : 0, false, false);
    } else if (c.state == PENDING && !(mode == Mode::AsyncIssue && c.w_tid1 - 1 == t.tid)) {
        out.note(H_PENDING_WRITE, offset, c.w_tid1, c.w_pc);
    }
    if (g.options & OPT_RACES) {
        const bool same_block_write = !global || c.w_block == me;
        if (same_block_write && c.w_tid1 && c.w_tid1 - 1 != t.tid && c.w_clk > t.vc[c.w_tid1 - 1] && !both_atomic)
            out.note(H_WAW, offset, c.w_tid1, c.w_pc, 0, c.flags & W_ATOMIC, true);
        const bool same_block_reads = !global || c.r_block == me;
        if (same_block_reads && c.r_tid1 == READ_VC) {
            const uint32_t* r = read_vc(c.r_clk);
            for (int u = 0; u < g.nthreads; ++u)
                if (u != t.tid && r[u] > t.vc[u]) {
                    out.note(H_WAR, offset, (uint16_t)(u + 1), c.r_pc);
                    break;
                }
        } else if (same_block_reads && c.r_tid1 && c.r_tid1 - 1 != t.tid && c.r_clk > t.vc[c.r_tid1 - 1]) {
            out.note(H_WAR, offset, c.r_tid1, c.r_pc);
        }
    }
    forget_reads(c);
    c.r_block = 0;
    c.w_tid1 = (uint16_t)(t.tid + 1);
    c.w_clk = clock_of(t);
    c.w_pc = pc;
    c.w_block = global ? me : 0;
    c.flags = atomic ? W_ATOMIC : 0;
    c.state = mode == Mode::AsyncIssue ? PENDING : INIT;
}

// The place of a byte in a finding's message: shared memory by its declaration (shared_name,
// async.cpp); global memory as a token the Python side renders with the buffer's name and type.
std::string place(bool global, int buffer, size_t offset) {
    if (!global) return shared_name((unsigned)offset);
    return "{global:" + std::to_string(buffer) + ":" + std::to_string(offset) + "}";
}

std::string block_text(uint32_t block1) {
    const unsigned b = block1 - 1, x = b % g.grid.x, y = (b / g.grid.x) % g.grid.y, z = b / (g.grid.x * g.grid.y);
    return "(" + std::to_string(x) + ", " + std::to_string(y) + ", " + std::to_string(z) + ")";
}

// One line per kind of hazard the access met, naming its first byte and how many it touched.
void report_found(Thread& t, void* pc, Mode mode, bool global, int buffer, size_t offset, unsigned size,
                  const AccessFindings& a) {
    const char* verb = mode == Mode::Read ? "reads" : mode == Mode::Atomic ? "atomically updates" : "writes";
    const char* me = mode == Mode::Read ? "read" : mode == Mode::Atomic ? "atomic update" : "write";
    for (int h = 0; h < H_KINDS; ++h) {
        if (!(a.mask & (1u << h))) continue;
        const Found& f = a.f[h];
        std::string what = place(global, buffer, f.first);
        if (f.bytes > 1 || size > 1) what += f.bytes == size ? "" : " (" + std::to_string(f.bytes) + " of its " + std::to_string(size) + " bytes)";
        const char* other_kind = f.other_atomic ? "atomic update" : f.other_wrote ? "write" : "read";
        Thread* other = thread_at1(f.other1);
        const uint64_t key = (global ? (uint64_t)(buffer + 1) << 48 : 0) + f.first;
        switch (h) {
            case H_RAW:
            case H_WAR:
            case H_WAW:
                report("race", &t, pc, std::string(me) + " after " + other_kind + " of " + what + " with no barrier ordering them",
                       other, f.other_pc, key, f.bytes);
                break;
            case H_UNINIT:
                report("uninitialized shared read", &t, pc, "reads " + what + ", which no thread has written", nullptr,
                       nullptr, key, f.bytes);
                break;
            case H_PENDING_READ:
                report("cp.async read before wait", &t, pc,
                       "reads " + what + ", the destination of a cp.async of " + thread_name(*other) + " not yet waited for",
                       other, f.other_pc, key, f.bytes);
                break;
            case H_PENDING_WRITE:
                report("race", &t, pc, "writes " + what + " while a cp.async of " + thread_name(*other) + " to it is in flight",
                       other, f.other_pc, key, f.bytes);
                break;
            case H_BLOCKS:
                report("global conflict between blocks", &t, pc,
                       std::string(verb) + " " + what + ", which " +
                           (f.other_block ? "block " + block_text(f.other_block) : std::string("other blocks")) + " " +
                           (f.other_wrote ? (f.other_atomic ? "updated atomically" : "wrote") : "read") +
                           " in this launch: the blocks of a grid are not ordered",
                       nullptr, f.other_pc, key, f.bytes);
                break;
        }
    }
}

bool shared_offset_valid(unsigned offset, unsigned size) {
    const size_t end = (size_t)offset + size;
    if (end <= g.dynamic_bytes) return true;
    return offset >= SHARED_LIMIT && end <= SHARED_LIMIT + g.static_used;
}

void out_of_bounds_shared(Thread& t, unsigned offset, unsigned size, bool write, void* pc) {
    char buf[200];
    if (offset < SHARED_LIMIT)
        snprintf(buf, sizeof buf, "%s %u bytes at %s; the launch has %zu bytes of dynamic shared memory",
                 write ? "writes" : "reads", size, shared_name(offset).c_str(), g.dynamic_bytes);
    else
        snprintf(buf, sizeof buf, "%s %u bytes at %s; the kernel declares %zu bytes of static shared memory",
                 write ? "writes" : "reads", size, shared_name(offset).c_str(), g.static_used);
    report("shared out of bounds", &t, pc, buf);
}

// A GPU stops the kernel at a misaligned access ("misaligned address"): so does the executor, before
// the host performs it (an aligned SSE move of a uint4 would take the process down).
[[noreturn]] void misaligned(Thread& t, const std::string& what, unsigned size, bool write, void* pc) {
    report("misaligned access", &t, pc,
           std::string(write ? "writes " : "reads ") + std::to_string(size) + " bytes at " + what +
               ", an address that is not " + std::to_string(size) + "-byte aligned (a GPU stops the kernel here)");
    abort_launch();
}

// Each access below returns whether it was in bounds (an access out of bounds is reported and
// not shadowed; an atomic one is not performed either).
bool shared_access(Thread& t, unsigned offset, unsigned size, Mode mode, void* pc) {
    const bool write = mode != Mode::Read;
    if (!shared_offset_valid(offset, size)) {
        out_of_bounds_shared(t, offset, size, write, pc);
        return false;
    }
    if (offset + size > cells_used) cells_used = offset + size;
    AccessFindings found;
    for (unsigned i = 0; i < size; ++i) {
        Cell& c = cells[offset + i];
        if (write)
            cell_write(t, c, offset + i, pc, mode, false, found);
        else
            cell_read(t, c, offset + i, pc, false, found);
    }
    if (found.mask) report_found(t, pc, mode, false, -1, offset, size, found);
    return true;
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

bool global_access(Thread& t, uintptr_t a, unsigned size, Mode mode, void* pc) {
    const bool write = mode != Mode::Read;
    Buffer* b = buffer_of(a);
    if (!b || a + size > (uintptr_t)b->base + b->bytes) {
        char buf[240];
        Buffer* near = nullptr;
        long long dist = 0;
        for (Buffer& x : buffers) {
            const long long d = a < (uintptr_t)x.base ? (long long)((uintptr_t)x.base - a)
                                                       : (long long)(a - ((uintptr_t)x.base + x.bytes));
            if (!near || d < dist) { near = &x; dist = d; }
        }
        if (near)
            snprintf(buf, sizeof buf, "%s %u bytes at {global:%d:%lld}, %lld bytes %s a %zu-byte global buffer",
                     write ? "writes" : "reads", size, (int)(near - buffers.data()),
                     (long long)(a - (uintptr_t)near->base), a < (uintptr_t)near->base ? dist : dist + size,
                     a < (uintptr_t)near->base ? "before" : "past the end of", near->bytes);
        else
            snprintf(buf, sizeof buf, "%s %u bytes of global memory the launch does not own", write ? "writes" : "reads", size);
        report("global out of bounds", &t, pc, buf);
        if (!in_gap(a, size)) abort_launch();  // the access itself could fault: stop here, as a GPU would
        return false;
    }
    const int index = (int)(b - buffers.data());
    const size_t offset = a - (uintptr_t)b->base;
    if (size > 1 && (a & (size - 1)) && size <= 16) misaligned(t, place(true, index, offset), size, write, pc);
    if ((g.options & OPT_COUNT) && mode != Mode::Atomic) instrument_global(t, index, offset, a, size, write, pc);
    if (b->read_only) {
        // Nothing writes it in this launch (unless through a cast-away const, reported here), so its
        // reads can race with nothing: no shadow to keep, which is most of a kernel's reads.
        if (!write) return true;
        report("write through a pointer to const", &t, pc,
               std::string(mode == Mode::Atomic ? "atomically updates " : "writes ") + place(true, index, offset) +
                   ", which the kernel received only as a pointer to const",
               nullptr, nullptr, ((uint64_t)(index + 1) << 48) + offset, size);
        return true;
    }
    AccessFindings found;
    b->shadow_dirty = true;
    for (unsigned i = 0; i < size; ++i) {
        Cell& c = b->shadow[offset + i];
        if (write)
            cell_write(t, c, offset + i, pc, mode, true, found);
        else
            cell_read(t, c, offset + i, pc, true, found);
    }
    if (found.mask) report_found(t, pc, mode, true, index, offset, size, found);
    return true;
}

// OPT_COUNT: what the access adds to the counts, the warp's request log and the trace.
void instrument_shared(Thread& t, unsigned offset, unsigned size, bool write, void* pc) {
    if (!g.in_wmma) count_lane(write ? K_SHARED_ST : K_SHARED_LD, pc, size);  // WMMA counts its own
    trace_access(t, -1, offset, size, write, pc);
}

inline bool access_as(Thread& t, const void* p, unsigned size, Mode mode, void* pc) {
    const uintptr_t a = (uintptr_t)p;
    const bool write = mode != Mode::Read;
    if ((++g.accesses & 0xfffff) == 0 && g.deadline > 0 && now_seconds() > g.deadline) {
        report("timeout", &t, pc, timeout_text());
        abort_launch();
    }
    if (a - shared_lo < shared_span) {
        const unsigned offset = (unsigned)(a - shared_lo);
        if (size > 1 && (a & (size - 1)) && size <= 16 && shared_offset_valid(offset, size))
            misaligned(t, shared_name(offset), size, write, pc);
        if (mode != Mode::Atomic) {
            if (g.options & (OPT_BANKS | OPT_COUNT)) log_shared_access(t, offset, size, g.in_wmma ? 3 : 0, pc, write);
            if (g.options & OPT_COUNT) instrument_shared(t, offset, size, write, pc);
        }
        return shared_access(t, offset, size, mode, pc);
    }
    if (a - stack_lo < stack_span) return true;
    if (a - view_lo < sizeof(LaunchView) || a - threads_lo < threads_span) return true;
    return global_access(t, a, size, mode, pc);
}

inline void access(const void* p, unsigned size, bool write, void* pc) {
    access_as(*g.cur, p, size, write ? Mode::Write : Mode::Read, pc);
}

Cell* map_cells(size_t n) {
    void* m = mmap(nullptr, std::max<size_t>(n, 1) * sizeof(Cell), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return m == MAP_FAILED ? nullptr : static_cast<Cell*>(m);
}

}  // namespace

// ---- what the rest of the runtime uses ----------------------------------------------------------
void memory_init() {
    if (g.shared) return;
    void* s = mmap(nullptr, ARENA_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cells = map_cells(ARENA_BYTES);
    g.shared = static_cast<uint8_t*>(s);
    shared_lo = (uintptr_t)g.shared;
    shared_span = ARENA_BYTES;
    stack_lo = (uintptr_t)g.stacks;
    stack_span = STACK_BYTES * MAX_THREADS;
    view_lo = (uintptr_t)&view;
    threads_lo = (uintptr_t)g.threads;
    threads_span = sizeof(Thread) * MAX_THREADS;
    cells_used = ARENA_BYTES;
}

void shadow_reset_block() {
    // Poison: 0xff bytes are NaN as fp16 and fp32, so a value read before it is written shows.
    memset(g.shared, 0xff, std::min<size_t>(ARENA_BYTES, std::max<size_t>(cells_used, g.dynamic_bytes)));
    for (size_t i = 0; i < cells_used; ++i)
        if (cells[i].r_tid1 == READ_VC) free_read_vcs.push_back((int)cells[i].r_clk);
    memset(static_cast<void*>(cells), 0, cells_used * sizeof(Cell));
    cells_used = 0;
}

void shadow_reset_launch() {
    // Every shadow clean, and with it every read vector clock free again.
    memset(static_cast<void*>(cells), 0, cells_used * sizeof(Cell));
    cells_used = 0;
    for (Buffer& b : buffers)
        if (b.shadow_dirty) {
            madvise(b.shadow, b.bytes * sizeof(Cell), MADV_DONTNEED);  // private anonymous pages read back as zeros
            b.shadow_dirty = false;
        }
    free_read_vcs.clear();
    vc_count = 0;
    vc_stride = (size_t)std::max(g.nthreads, 1);
    g.static_used = 0;
    g.static_slots.clear();
    g.dynamic_name.clear();
    g.dynamic_element = 1;
}

bool shared_in_bounds(unsigned offset, unsigned size) { return shared_offset_valid(offset, size); }

void shared_read(Thread& t, unsigned offset, unsigned size, void* pc) { shared_access(t, offset, size, Mode::Read, pc); }
void shared_write(Thread& t, unsigned offset, unsigned size, void* pc) { shared_access(t, offset, size, Mode::Write, pc); }
void async_issue_shadow(Thread& t, unsigned offset, void* pc) { shared_access(t, offset, 16, Mode::AsyncIssue, pc); }
void async_land_shadow(Thread& t, unsigned offset, void* pc) {
    // The data lands: an ordinary write by the issuing thread, at its wait.
    for (unsigned i = offset; i < offset + 16; ++i) {
        Cell& c = cells[i];
        if (c.state != PENDING || c.w_tid1 != t.tid + 1) continue;  // overwritten meanwhile: reported then
        c.state = INIT;
        c.w_clk = clock_of(t);
        c.w_pc = pc;
    }
}
void checked_access(Thread& t, const void* p, unsigned size, bool write, void* pc) {
    access_as(t, p, size, write ? Mode::Write : Mode::Read, pc);
}
bool atomic_access(Thread& t, const void* p, unsigned size, void* pc) {
    return access_as(t, p, size, Mode::Atomic, pc) && !g.aborted;
}

void* allocate_global(size_t bytes) {
    const size_t page = 4096;
    const size_t body = (bytes + page - 1) / page * page;
    const size_t total = body + 2 * GLOBAL_GAP;
    void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    Cell* shadow = map_cells(bytes);
    if (!shadow) {
        munmap(m, total);
        return nullptr;
    }
    uint8_t* mapping = static_cast<uint8_t*>(m);
    // The buffer ends exactly at the end of its body (when its size allows): one byte past it
    // lands in the gap, not in the next page-rounded slack.
    uint8_t* base = mapping + GLOBAL_GAP + (body - bytes) / 16 * 16;
    buffers.push_back(Buffer{base, bytes, mapping, total, shadow, false, false});
    return base;
}

void free_globals() {
    for (Buffer& b : buffers) {
        munmap(b.mapping, b.mapping_bytes);
        munmap(b.shadow, std::max<size_t>(b.bytes, 1) * sizeof(Cell));
    }
    buffers.clear();
}

uint8_t* shared_pointer(unsigned offset) { return g.shared + offset; }

// The start of the buffer holding `p` (nullptr: none).
void* buffer_base(const void* p) {
    const Buffer* b = buffer_of((uintptr_t)p);
    return b ? b->base : nullptr;
}

// The launch passes buffer `p` only as pointers to const (attnlab.executor.library marks it).
void mark_read_only(const void* p, bool read_only) {
    if (Buffer* b = buffer_of((uintptr_t)p)) b->read_only = read_only;
}

}  // namespace attn_cpu

// ---- the instrumentation's entry points ----------------------------------------------------------
using attn_cpu::access;

// n bytes from p, as the widest aligned pieces of up to 4 bytes: never a misaligned access the
// kernel did not make.
static void range_access(const void* p, size_t n, bool write, void* pc) {
    uintptr_t a = (uintptr_t)p;
    const uintptr_t end = a + n;
    while (a < end) {
        unsigned size = 4;
        while (size > 1 && ((a & (size - 1)) || a + size > end)) size >>= 1;
        access((const void*)a, size, write, pc);
        a += size;
    }
}
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
ATTN_TSAN_VISIBILITY void __tsan_read_range(void* p, unsigned long n) { range_access(p, n, false, ATTN_CALLER()); }
ATTN_TSAN_VISIBILITY void __tsan_write_range(void* p, unsigned long n) { range_access(p, n, true, ATTN_CALLER()); }

// memcpy, memset and memmove called by a kernel: GCC inlines those of a small constant size as
// loads and stores (instrumented like any), and calls the library for the rest, which the
// instrumentation does not see. build.py links with --wrap for the three, so every call comes
// here first; one made from the kernel's own code (between the markers build.py links around it)
// is checked byte range by byte range, as the GPU's loop of loads and stores would be.
extern "C" void* __real_memcpy(void*, const void*, size_t);
extern "C" void* __real_memmove(void*, const void*, size_t);
extern "C" void* __real_memset(void*, int, size_t);
static bool from_kernel(void* pc) {  // pc: a return address, one past the call
    return attn_cpu::g.cur && attn_cpu::in_kernel_code((uintptr_t)pc - 1);
}
static void check_copy(void* d, const void* s, size_t n, void* pc) {
    if (!from_kernel(pc)) return;
    range_access(s, n, false, pc);
    range_access(d, n, true, pc);
}
ATTN_TSAN_VISIBILITY void* __wrap_memcpy(void* d, const void* s, size_t n) {
    check_copy(d, s, n, ATTN_CALLER());
    return __real_memcpy(d, s, n);
}
ATTN_TSAN_VISIBILITY void* __wrap_memmove(void* d, const void* s, size_t n) {
    check_copy(d, s, n, ATTN_CALLER());
    return __real_memmove(d, s, n);
}
ATTN_TSAN_VISIBILITY void* __wrap_memset(void* d, int v, size_t n) {
    void* pc = ATTN_CALLER();
    if (from_kernel(pc)) range_access(d, n, true, pc);
    return __real_memset(d, v, n);
}
