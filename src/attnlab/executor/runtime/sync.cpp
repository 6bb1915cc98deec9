// Block barriers: __syncthreads (bar.sync 0 with every thread), and named barriers with a thread
// count (bar.sync id, n and bar.arrive id, n), as PTX ISA 9.7.13.1 ("bar, barrier") specifies:
//   - a barrier instruction makes its thread wait for the non-exited threads of its own warp, then
//     marks the warp as arrived; each arrived warp counts 32 towards the barrier's thread count;
//   - bar.sync then waits until the count is reached; bar.arrive goes on at once;
//   - all threads using one barrier pass the same count, a multiple of the warp size;
//   - when the barrier completes, the memory accesses each participant made before it are
//     performed relative to all participants: here, every bar.sync-er's vector clock becomes the
//     join of every participant's clock at its arrival (arrivers release, sync-ers acquire).
//   - exit: threads that exited no longer hold up a barrier that waits for all threads of the
//     block (bar.sync 0 with no count), so `if (i >= n) return;` before __syncthreads is legal;
//     named barriers with a count get no such help (a deadlock, reported where every warp waits).
// Findings: a count that is not a multiple of 32 or differs between threads, more threads than
// the count, a thread arriving twice in one phase (a second bar.arrive before the barrier
// completed), and __syncthreads reached at two different places in one phase (both arms of an
// if/else: undefined in the CUDA C++ Programming Guide, which requires every thread of the block
// to reach the same __syncthreads).
#include <algorithm>

#include "runtime.h"

namespace attn_cpu {

void collective_lane_exited(int warp, int lane);

void vc_tick(Thread& t) {
    if (g.options & OPT_RACES) ++t.vc[t.tid];
}

static void join_into(std::vector<uint32_t>& acc, const uint32_t* vc) {
    for (int i = 0; i < g.nthreads; ++i) acc[i] = std::max(acc[i], vc[i]);
}

static void reset_phase(Barrier& b) {
    b.expected = -1;
    b.all_threads = false;
    b.first_pc = nullptr;
    b.counted = 0;
    for (int w = 0; w < g.nwarps; ++w) {
        b.lanes_arrived[w] = 0;
        b.warp_counted[w] = false;
    }
    b.syncers.clear();
    if (g.options & OPT_RACES) std::fill(b.join.begin(), b.join.begin() + g.nthreads, 0u);
}

void barriers_reset() {
    for (Barrier& b : g.barriers) {
        if ((int)b.join.size() < MAX_THREADS) b.join.assign(MAX_THREADS, 0u);
        reset_phase(b);
    }
}

static int live_warps() {
    int n = 0;
    for (int w = 0; w < g.nwarps; ++w)
        if ((g.warps[w].lanes & ~g.warps[w].exited) != 0) ++n;
    return n;
}

static void complete_if_reached(int id) {
    Barrier& b = g.barriers[id];
    if (b.expected < 0 && !b.all_threads) return;
    const int expected = b.all_threads ? WARP * live_warps() : b.expected;
    if (b.counted < expected) return;
    if (b.counted > expected) {
        char buf[160];
        snprintf(buf, sizeof buf, "barrier %d expects %d threads but %d arrived in one phase", id, expected, b.counted);
        report("barrier count mismatch", g.cur, b.first_pc, buf);
    }
    for (int tid : b.syncers) {
        Thread& t = g.threads[tid];
        if (g.options & OPT_RACES) {
            for (int i = 0; i < g.nthreads; ++i) t.vc[i] = std::max(t.vc[i], b.join[i]);
            vc_tick(t);
        }
        make_ready(t);
    }
    reset_phase(b);
}

// Marks warp w as arrived once all its non-exited lanes are at barrier `id`; releases its bar.arrive-ers.
static void count_warp_if_complete(int id, int w) {
    Barrier& b = g.barriers[id];
    const Warp& wp = g.warps[w];
    const unsigned live = wp.lanes & ~wp.exited;
    if (b.warp_counted[w] || !b.lanes_arrived[w] || (b.lanes_arrived[w] & live) != live) return;
    b.warp_counted[w] = true;
    b.counted += WARP;
    {  // one warp-wide barrier instruction, at its first lane's site
        const Thread& first = g.threads[w * WARP + __builtin_ctz(b.lanes_arrived[w])];
        count_site(first.wait_is_sync ? K_BAR_SYNC : K_BAR_ARRIVE, first.wait_pc, 0, 1, 0);
    }
    for (int l = 0; l < WARP; ++l) {
        if (!(b.lanes_arrived[w] & (1u << l))) continue;
        Thread& t = g.threads[w * WARP + l];
        if (t.run == Run::Blocked && t.wait == WaitOn::Barrier && t.wait_barrier == id && !t.wait_is_sync) {
            vc_tick(t);
            make_ready(t);
        }
    }
    complete_if_reached(id);
}

static void arrive(int id, int count, bool sync, void* pc) {
    Thread& t = *g.cur;
    if (id < 0 || id >= NUM_BARRIERS) {
        char buf[80];
        snprintf(buf, sizeof buf, "barrier id %d is outside 0..15", id);
        report("barrier count mismatch", &t, pc, buf);
        abort_launch();
    }
    Barrier& b = g.barriers[id];
    const bool all = count < 0;
    if (!all && (count <= 0 || count % WARP != 0)) {
        char buf[120];
        snprintf(buf, sizeof buf, "barrier %d: thread count %d is not a positive multiple of 32", id, count);
        report("barrier count mismatch", &t, pc, buf);
    }
    if (b.expected < 0 && !b.all_threads) {
        b.expected = all ? -1 : count;
        b.all_threads = all;
        b.first_pc = pc;
    } else if (b.all_threads != all || (!all && b.expected != count)) {
        char buf[160];
        snprintf(buf, sizeof buf, "barrier %d: this thread passes %s, another thread of the phase passed %s", id,
                 all ? "no count (all threads)" : std::to_string(count).c_str(),
                 b.all_threads ? "no count (all threads)" : std::to_string(b.expected).c_str());
        report("barrier count mismatch", &t, pc, buf);
    }
    if (all && b.first_pc && pc != b.first_pc) {
        report("divergent barrier", &t, pc,
               "__syncthreads at " + pc_token(pc) + " while other threads of the block wait at the __syncthreads at " +
                   pc_token(b.first_pc) + ": every thread must reach the same one",
               nullptr, b.first_pc);
    }
    if (b.lanes_arrived[t.warp] & (1u << t.lane)) {
        // bar.arrive never waits: a thread that arrives again before the barrier completed would
        // count towards the same phase twice. Reported, and the second arrival is not counted.
        report("barrier arrived twice", &t, pc,
               std::string(sync ? "bar.sync " : "bar.arrive ") + std::to_string(id) +
                   " by a thread that already arrived in this phase (an earlier bar.arrive): barrier " +
                   std::to_string(id) + " has not completed yet");
        if (!sync) return;
        b.syncers.push_back(t.tid);
        set_run(t, Run::Blocked);
        t.wait = WaitOn::Barrier;
        t.wait_barrier = id;
        t.wait_is_sync = true;
        t.wait_pc = pc;
        block_current(WaitOn::Barrier, pc);
        return;
    }
    if (g.options & OPT_RACES) join_into(b.join, t.vc);
    count_site(sync ? K_BAR_SYNC : K_BAR_ARRIVE, pc, 1, 0, 0);
    trace_event(t, sync ? E_BAR_SYNC : E_BAR_ARRIVE, pc, 0, 0, id);
    ++t.step;
    set_run(t, Run::Blocked);
    t.wait = WaitOn::Barrier;
    t.wait_barrier = id;
    t.wait_is_sync = sync;
    t.wait_pc = pc;
    b.lanes_arrived[t.warp] |= 1u << t.lane;
    if (sync) b.syncers.push_back(t.tid);
    if (g.options & (OPT_BANKS | OPT_COUNT)) flush_bank_log(t.warp);
    count_warp_if_complete(id, t.warp);
    if (t.run == Run::Blocked) block_current(WaitOn::Barrier, pc);
}

void on_thread_exit(Thread& t) {
    trace_event(t, E_EXIT, nullptr, 0, 0, 0);
    ++g.exited_threads;
    g.warps[t.warp].exited |= 1u << t.lane;
    for (int id = 0; id < NUM_BARRIERS; ++id) {
        Barrier& b = g.barriers[id];
        if (b.expected < 0 && !b.all_threads) continue;
        count_warp_if_complete(id, t.warp);
        complete_if_reached(id);
    }
    collective_lane_exited(t.warp, t.lane);
    if (g.options & (OPT_BANKS | OPT_COUNT)) flush_bank_log(t.warp);
}

void syncthreads() { arrive(0, -1, true, ATTN_CALLER()); }
void bar_sync(int id, int count) { arrive(id, count, true, ATTN_CALLER()); }
void bar_arrive(int id, int count) { arrive(id, count, false, ATTN_CALLER()); }

}  // namespace attn_cpu
