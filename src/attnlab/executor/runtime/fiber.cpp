// The threads of a block as fibers: each CUDA thread has its own stack and runs until it must
// wait (a barrier, a warp-collective operation) or exits; then the scheduler picks the next.
//
// Order: the scheduler keeps running the warp it is in while that warp has a ready lane (lanes
// in a seeded random order), and when the warp waits it picks a ready warp at random (seeded).
// With OPT_PREEMPT it also leaves a warp, at random, right after a warp-collective completes, so
// warps interleave at a finer grain than barrier to barrier. No ready thread while some have not
// exited is a deadlock: the report says where every warp waits.
#include <sys/mman.h>
#include <time.h>

#include <stdexcept>

#include "runtime.h"

namespace attn_cpu {

State g;

// ---- context switch ---------------------------------------------------------------------------
#if defined(__x86_64__)
// void attn_cpu_switch(void** save_sp, void* load_sp): push the callee-saved registers, save the
// stack pointer, load the other one, pop its registers and return into it.
extern "C" void attn_cpu_switch(void** save_sp, void* load_sp);
asm(R"(
    .text
    .p2align 4
    .type attn_cpu_switch,@function
attn_cpu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size attn_cpu_switch,.-attn_cpu_switch
)");

static void fiber_entry();

static void* initial_stack(uint8_t* stack_top) {
    auto* sp = reinterpret_cast<uintptr_t*>(reinterpret_cast<uintptr_t>(stack_top) & ~uintptr_t(15));
    *--sp = 0;                                          // fiber_entry never returns
    *--sp = reinterpret_cast<uintptr_t>(&fiber_entry);  // where the first switch "returns" to
    for (int i = 0; i < 6; ++i) *--sp = 0;              // rbp rbx r12 r13 r14 r15
    return sp;
}
static inline void switch_to(void** save, void* load) { attn_cpu_switch(save, load); }
#else
#include <ucontext.h>
// Other architectures: ucontext (slower: a system call per switch, same behaviour).
static ucontext_t scheduler_ctx;
static std::vector<ucontext_t> contexts;
static void fiber_entry();
static void* initial_stack(uint8_t* stack_top) {
    (void)stack_top;
    return nullptr;
}
#endif

static void (*g_thunk)(void**) = nullptr;
static void** g_args = nullptr;

double now_seconds() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint64_t next_random() {  // splitmix64
    uint64_t z = (g.rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void to_scheduler() {
    Thread* t = g.cur;
#if defined(__x86_64__)
    switch_to(&t->sp, g.scheduler_sp);
#else
    swapcontext(&contexts[t->tid], &scheduler_ctx);
#endif
}

static void fiber_entry() {
    g_thunk(g_args);
    Thread& t = *g.cur;
    set_run(t, Run::Exited);
    on_thread_exit(t);
    activemask_poll(t.warp);
    to_scheduler();
    __builtin_trap();  // an exited fiber is never resumed
}

void make_ready(Thread& t) {
    set_run(t, Run::Ready);
    t.wait = WaitOn::Nothing;
}

void block_current(WaitOn why, void* pc) {
    Thread& t = *g.cur;
    set_run(t, Run::Blocked);
    t.wait = why;
    t.wait_pc = pc;
    activemask_poll(t.warp);
    if (t.run == Run::Blocked) to_scheduler();
}

// What a launch stopped at its time limit says: where in the grid it was, so that a grid too large
// for a CPU (blocks run one after another) reads differently from one block's endless loop.
std::string timeout_text() {
    if (g.interrupted) return "stopped by an interrupt (SIGINT)";
    const unsigned long blocks = (unsigned long)g.grid.x * g.grid.y * g.grid.z;
    std::string text = "the launch ran past its time limit in block " + std::to_string(g.block_linear + 1) + " of " +
                       std::to_string(blocks);
    return text + (g.block_linear > 0 ? " (a grid too large to run on a CPU in time, or an endless loop?)"
                                      : " (an endless loop?)");
}

void abort_launch() {
    g.aborted = true;
    to_scheduler();
    __builtin_trap();
}


// ---- scheduling -------------------------------------------------------------------------------
static unsigned ready_lanes(int w) { return g.warps[w].ready; }

static int pick_bit(unsigned m) {  // a random set bit of m (m != 0)
    const int n = __builtin_popcount(m);
    int k = (int)(next_random() % (uint64_t)n);
    while (k--) m &= m - 1;
    return __builtin_ctz(m);
}

// What a waiting thread waits at, and where (a token the Python side turns into a source line).
static std::string where(const Thread& t) {
    std::string what;
    if (t.wait == WaitOn::Barrier && t.wait_is_sync)
        what = "bar.sync " + std::to_string(t.wait_barrier);
    else if (t.wait == WaitOn::Barrier)  // bar.arrive waits only for the rest of its own warp
        what = "bar.arrive " + std::to_string(t.wait_barrier) + " (for the rest of its warp)";
    else if (t.wait == WaitOn::Active)
        what = "__activemask";
    else if (t.wait == WaitOn::Collective)  // the .aligned kinds take the whole warp: no mask to show
        what = std::string(coll_name(t.coll.kind)) +
               (t.coll.kind < C_LDSM || t.coll.kind > C_WMMA_MMA ? " (mask " + lanes_text(t.coll.mask) + ")" : "");
    else
        what = "?";
    return what + " at " + pc_token(t.wait_pc);
}

static void report_deadlock() {
    // One line: every warp that has not exited, its lanes grouped by where they wait.
    std::string msg = "no thread can proceed:";
    void* first_pc = nullptr;
    Thread* first = nullptr;
    for (int w = 0; w < g.nwarps; ++w) {
        std::vector<std::pair<std::string, unsigned>> groups;
        for (int l = 0; l < WARP && w * WARP + l < g.nthreads; ++l) {
            Thread& t = g.threads[w * WARP + l];
            if (t.run == Run::Exited) continue;
            if (!first) { first = &t; first_pc = t.wait_pc; }
            const std::string key = where(t);
            bool found = false;
            for (auto& gr : groups)
                if (gr.first == key) { gr.second |= 1u << l; found = true; }
            if (!found) groups.push_back({key, 1u << l});
        }
        for (auto& gr : groups) msg += " warp " + std::to_string(w) + " lanes " + lanes_text(gr.second) + " wait at " + gr.first + ";";
    }
    report("deadlock", first, first_pc, msg);
}

void run_block() {
    const int n = g.nthreads;
    for (int i = 0; i < n; ++i) {
        Thread& t = g.threads[i];
        t.tid = i;
        t.warp = i / WARP;
        t.lane = i % WARP;
        t.coords.thread_idx = uint3{(unsigned)(i % g.block.x), (unsigned)((i / g.block.x) % g.block.y),
                                    (unsigned)(i / (g.block.x * g.block.y))};
        t.run = Run::Ready;
        t.wait = WaitOn::Nothing;
        t.wait_barrier = -1;
        t.coll = CollArgs{};
        t.copies.clear();
        t.next_group = 0;
        clear_log(t);
        uint8_t* top = g.stacks + (size_t)(i + 1) * STACK_BYTES;
#if defined(__x86_64__)
        t.sp = initial_stack(top);
#else
        if ((int)contexts.size() < MAX_THREADS) contexts.resize(MAX_THREADS);
        getcontext(&contexts[i]);
        contexts[i].uc_stack.ss_sp = top - STACK_BYTES;
        contexts[i].uc_stack.ss_size = STACK_BYTES;
        contexts[i].uc_link = nullptr;
        makecontext(&contexts[i], (void (*)())fiber_entry, 0);
#endif
    }
    g.nwarps = (n + WARP - 1) / WARP;
    for (int w = 0; w < g.nwarps; ++w) {
        const int lanes = n - w * WARP >= WARP ? WARP : n - w * WARP;
        g.warps[w] = Warp{};
        g.warps[w].lanes = lanes == WARP ? 0xffffffffu : (1u << lanes) - 1;
        g.warps[w].ready = g.warps[w].lanes;  // every thread starts Ready
    }
    g.exited_threads = 0;
    barriers_reset();

    int w = -1;
    long steps = 0;
    for (;;) {
        if (g.aborted) return;
        if (++steps % 4096 == 0 && g.deadline > 0 && now_seconds() > g.deadline) {
            report("timeout", g.cur, nullptr, timeout_text());
            g.aborted = true;
            return;
        }
        unsigned m = w >= 0 ? ready_lanes(w) : 0;
        const bool preempt = (g.options & OPT_PREEMPT) && w >= 0 && m == g.warps[w].lanes && next_random() % 4 == 0;
        if (!m || preempt) {
            unsigned warps_ready[MAX_WARPS / 32] = {};
            int count = 0;
            for (int i = 0; i < g.nwarps; ++i)
                if (ready_lanes(i)) { warps_ready[i / 32] |= 1u << (i % 32); ++count; }
            if (count == 0) {
                if (g.exited_threads < n) {
                    report_deadlock();
                    g.aborted = true;
                }
                return;
            }
            int k = (int)(next_random() % (uint64_t)count);
            for (int i = 0; i < g.nwarps; ++i)
                if (warps_ready[i / 32] & (1u << (i % 32)))
                    if (k-- == 0) { w = i; break; }
            m = ready_lanes(w);
        }
        Thread& t = g.threads[w * WARP + pick_bit(m)];
        g.cur = &t;
        view.current = &t.coords;
#if defined(__x86_64__)
        switch_to(&g.scheduler_sp, t.sp);
#else
        swapcontext(&scheduler_ctx, &contexts[t.tid]);
#endif
    }
}

void set_kernel(void (*thunk)(void**), void** args) {
    g_thunk = thunk;
    g_args = args;
}

void allocate_threads() {
    if (g.threads) return;
    g.threads = new Thread[MAX_THREADS];
    void* s = mmap(nullptr, STACK_BYTES * MAX_THREADS, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (s == MAP_FAILED) throw std::runtime_error("cannot map the fiber stacks");
    g.stacks = static_cast<uint8_t*>(s);
}

}  // namespace attn_cpu
