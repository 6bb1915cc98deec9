// What the kernel did, counted as it ran (OPT_COUNT): the executor's instrument.
//
//   sites   one row per instruction site (its return address) and kind: the lanes that executed
//           it, the warp-wide instructions (requests) it made, the bytes it moved, and for memory
//           the units a GPU serves a request in (shared memory: wavefronts; global memory: 32-byte
//           sectors) next to the fewest it could take (ideal);
//   blocks  per block (CTA) of the grid: global bytes read and written, shared-memory requests
//           and wavefronts, tensor-core FLOPs, exponentials, barriers, shuffles, cp.async bytes,
//           and the 32-byte sectors of its global requests;
//   bytes   per global buffer, the distinct bytes read and written: what DRAM must deliver at
//           least, where the sum over sites is what the blocks asked L2 for;
//   trace   every event of one chosen block, in the order the executor ran them (one thread's
//           events are in its program order): each lane's accesses (space, buffer, offset, bytes,
//           site; a lane's run of equal-stride accesses at one site is one event), ldmatrix rows,
//           each warp's mma, WMMA and shuffle, and the pipeline: cp.async issue with its group,
//           commit, wait_group, bar.sync and bar.arrive. Each event carries the thread's step, the
//           block barriers it has executed so far.
//
// Counts are exact and deterministic: they do not depend on the schedule. They are never times.
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "runtime.h"

namespace attn_cpu {

namespace {

struct Site {
    void* pc;
    int kind;
    long long lanes, requests, bytes, units, ideal;
};

// Per block; the order is the C API's (attn_cpu_block_counts).
struct BlockCounts {
    long long global_read, global_write, shared_requests, shared_wavefronts, shared_ideal, tensor_flops, exps,
        barriers, shuffles, cp_async_bytes, global_sectors;
};
constexpr int BLOCK_FIELDS = sizeof(BlockCounts) / sizeof(long long);

// 48 bytes, the layout numpy reads (attnlab.executor.counts.EVENT_DTYPE). An access event is a run
// of `count` accesses of `bytes` each, at offset, offset + stride, ... `epoch` numbers the warp's
// meetings (barriers and collectives where its request log was grouped, banks.cpp): the k-th
// accesses of a warp's lanes at one site within one epoch are one warp-wide request, as counted.
struct Event {
    uint64_t offset;  // shared: byte offset in the block's arena; global: byte offset in its buffer
    uint32_t seq;     // order in which the executor ran the events
    uint32_t site;    // index into the site table (UINT32_MAX: none)
    uint32_t bytes;
    uint32_t count;
    int32_t stride;
    int32_t arg;      // cp.async / commit: group; wait_group: pending groups allowed; bar: barrier id
    uint16_t step;
    int16_t buffer;   // -1 shared memory, -2 none, else the global buffer's index (allocation order)
    uint8_t warp, lane, kind, write;
    uint32_t epoch;
    uint32_t extra;   // cp.async: the bytes it reads from global memory (0..16; the rest is zero-filled)
};
static_assert(sizeof(Event) == 48, "the trace's record layout");

constexpr size_t MAX_EVENTS = 2500000;  // 100 MB: past it the trace stops and says so

std::vector<Site> sites;
std::unordered_map<uint64_t, int> site_of;
std::vector<BlockCounts> blocks;
std::vector<Event> events;
bool truncated = false;
// Per global buffer, per byte: 1 read, 2 written.
std::vector<std::vector<uint8_t>> touched;

inline bool counting() { return g.options & OPT_COUNT; }

// A direct-mapped cache in front of the site table's hash map: every access looks its site up.
struct CachedSite {
    uint64_t key;
    int index;
};
CachedSite site_cache[4096];

int site_index(int kind, void* pc) {
    const uint64_t key = ((uint64_t)(uintptr_t)pc << 5) | (uint64_t)kind;
    CachedSite& c = site_cache[(key ^ (key >> 13)) & 4095];
    if (c.key == key) return c.index;
    auto it = site_of.find(key);
    int i;
    if (it != site_of.end()) {
        i = it->second;
    } else {
        i = (int)sites.size();
        sites.push_back(Site{pc, kind, 0, 0, 0, 0, 0});
        site_of.emplace(key, i);
    }
    c = CachedSite{key, i};
    return i;
}

BlockCounts& block() { return blocks[g.block_linear]; }

void forget_recent(Thread& t) {
    for (long& i : t.recent) i = -1;
}

void add(int kind, void* pc, long long lanes, long long requests, long long bytes, long long units, long long ideal) {
    Site& s = sites[site_index(kind, pc)];
    s.lanes += lanes;
    s.requests += requests;
    s.bytes += bytes;
    s.units += units;
    s.ideal += ideal;
    BlockCounts& b = block();
    switch (kind) {
        case K_GLOBAL_LD: b.global_read += bytes; b.global_sectors += units; break;
        case K_GLOBAL_ST: b.global_write += bytes; b.global_sectors += units; break;
        case K_SHARED_LD:
        case K_SHARED_ST:
        case K_LDMATRIX:
            b.shared_requests += requests;
            b.shared_wavefronts += units;
            b.shared_ideal += ideal;
            break;
        case K_CP_ASYNC:
            b.cp_async_bytes += bytes;
            b.shared_requests += requests;
            b.shared_wavefronts += units;
            b.shared_ideal += ideal;
            break;
        case K_EXP: b.exps += lanes; break;
        case K_SHFL: b.shuffles += requests; break;
        case K_BAR_SYNC:
        case K_BAR_ARRIVE: b.barriers += requests; break;
        default: break;
    }
}

Event* new_event(int kind, int warp, int lane, int step, void* pc, int site_kind) {
    if (events.size() >= MAX_EVENTS) {
        truncated = true;
        return nullptr;
    }
    events.push_back(Event{});
    Event& e = events.back();
    e.seq = (uint32_t)(events.size() - 1);
    e.site = site_kind < 0 ? UINT32_MAX : (uint32_t)site_index(site_kind, pc);  // (an exit has no site)
    e.step = (uint16_t)std::min(step, 65535);
    e.buffer = -2;
    e.count = 1;
    e.epoch = g.warps[warp].epoch;
    e.warp = (uint8_t)warp;
    e.lane = (uint8_t)lane;
    e.kind = (uint8_t)kind;
    return &e;
}

}  // namespace

void instrument_launch_begin(unsigned long nblocks) {
    sites.clear();
    site_of.clear();
    for (CachedSite& c : site_cache) c = CachedSite{~0ull, -1};
    events.clear();
    truncated = false;
    touched.clear();
    blocks.assign(counting() ? nblocks : 0, BlockCounts{});
}

void instrument_block_begin() {
    g.tracing = counting() && (long)g.block_linear == g.trace_block;
    for (int i = 0; i < g.nthreads; ++i) {
        g.threads[i].step = 0;
        forget_recent(g.threads[i]);
    }
}

// One lane's load or store (global or shared memory): the commonest count by far, so it touches
// only the fields it changes (add() updates all five of a site at once, and the next access to
// the same site then waits on those stores). A shared access adds to its block only per request.
void count_lane(int kind, void* pc, unsigned bytes) {
    if (!counting()) return;
    Site& s = sites[site_index(kind, pc)];
    s.lanes += 1;
    s.bytes += bytes;
    if (kind == K_GLOBAL_LD) block().global_read += bytes;
    else if (kind == K_GLOBAL_ST) block().global_write += bytes;
}

void count_request(int kind, void* pc, unsigned units, unsigned ideal) {
    if (counting()) add(kind, pc, 0, 1, 0, units, ideal);
}

void count_site(int kind, void* pc, long long lanes, long long requests, long long bytes, long long units,
                long long ideal) {
    if (counting()) add(kind, pc, lanes, requests, bytes, units, ideal);
}

void count_tensor_flops(long flops) {
    if (counting()) block().tensor_flops += flops;
}

void count_global_bytes(int buffer, size_t offset, unsigned size, bool write) {
    if (!counting() || buffer < 0) return;
    if ((int)touched.size() <= buffer) touched.resize(buffer + 1);
    std::vector<uint8_t>& t = touched[buffer];
    if (t.size() < offset + size) t.resize(std::max(offset + size, t.size() * 2), 0);
    const uint8_t bit = write ? 2 : 1;
    for (unsigned i = 0; i < size; ++i) t[offset + i] |= bit;
}

void trace_access(Thread& t, int buffer, uint64_t offset, unsigned size, bool write, void* pc) {
    if (!g.tracing) return;
    const int kind = buffer == -1 ? (write ? K_SHARED_ST : K_SHARED_LD) : (write ? K_GLOBAL_ST : K_GLOBAL_LD);
    const int site_kind = g.in_wmma ? (write ? K_WMMA_STORE : K_WMMA_LOAD) : kind;
    const uint32_t site = (uint32_t)site_index(site_kind, pc);
    // The next access of a run extends the run: the lane's latest event at this site (among its
    // recent ones, since its last warp-wide event), at the same stride. A loop over a row, or down
    // a column, is one event, not one per element; the order of a lane's accesses at a site is kept.
    for (unsigned k = 1; k <= Thread::RECENT; ++k) {
        const long i = t.recent[(t.recent_next - k) % Thread::RECENT];
        if (i < 0) break;
        Event& e = events[i];
        if (e.site != site) continue;
        if (e.buffer != buffer || e.bytes != size || e.step != t.step || e.epoch != g.warps[t.warp].epoch) break;
        const int64_t delta = (int64_t)offset - (int64_t)e.offset;
        if (e.count == 1 && delta != 0 && delta == (int32_t)delta) {
            e.stride = (int32_t)delta;
            e.count = 2;
            return;
        }
        if (e.count > 1 && delta == (int64_t)e.stride * e.count) {
            ++e.count;
            return;
        }
        break;
    }
    Event* e = new_event(E_ACCESS, t.warp, t.lane, t.step, pc, site_kind);
    if (!e) return;
    e->buffer = (int16_t)buffer;
    e->offset = offset;
    e->bytes = size;
    e->count = 1;
    e->write = write;
    t.recent[t.recent_next++ % Thread::RECENT] = (long)events.size() - 1;
}

void trace_event(Thread& t, int kind, void* pc, uint64_t offset, unsigned bytes, int arg, int buffer, unsigned extra) {
    if (!g.tracing) return;
    static const int site_kind[] = {K_SHARED_LD, K_LDMATRIX, K_MMA, K_WMMA_LOAD, K_WMMA_STORE, K_WMMA_MMA,
                                    K_SHFL, K_SYNCWARP, K_CP_ASYNC, K_COMMIT, K_WAIT, K_BAR_SYNC, K_BAR_ARRIVE,
                                    -1};
    Event* e = new_event(kind, t.warp, t.lane, t.step, pc, site_kind[kind]);
    if (!e) return;
    e->offset = offset;
    e->bytes = bytes;
    e->arg = arg;
    e->buffer = (int16_t)buffer;
    e->extra = extra;
    forget_recent(t);
}

void trace_warp_event(int warp, int kind, void* pc, int arg) {
    if (!g.tracing) return;
    // The warp's lanes share a step at a warp-wide instruction; take the lowest live lane's.
    int step = 0;
    for (int l = 0; l < WARP && warp * WARP + l < g.nthreads; ++l) {
        const Thread& t = g.threads[warp * WARP + l];
        if (t.run != Run::Exited) { step = t.step; break; }
    }
    static const int site_kind[] = {0, 0, K_MMA, K_WMMA_LOAD, K_WMMA_STORE, K_WMMA_MMA, K_SHFL, K_SYNCWARP};
    Event* e = new_event(kind, warp, 255, step, pc, site_kind[kind]);
    if (e) e->arg = arg;
    for (int l = 0; l < WARP && warp * WARP + l < g.nthreads; ++l) forget_recent(g.threads[warp * WARP + l]);
}

}  // namespace attn_cpu

// ---- the C API -----------------------------------------------------------------------------------
using namespace attn_cpu;
#define ATTN_API extern "C" __attribute__((visibility("default")))

// Sites of the last counted launch: n rows of (module offset, kind, lanes, requests, bytes, units,
// ideal) into `out` (7 numbers each) when it has room for them all; returns n.
ATTN_API long attn_cpu_sites(long long* out, long cap) {
    const long n = (long)sites.size();
    if (out && cap >= n)
        for (long i = 0; i < n; ++i) {
            const Site& s = sites[i];
            long long* r = out + 7 * i;
            r[0] = (long long)module_offset(s.pc);
            r[1] = s.kind;
            r[2] = s.lanes;
            r[3] = s.requests;
            r[4] = s.bytes;
            r[5] = s.units;
            r[6] = s.ideal;
        }
    return n;
}

// Per-block counts (BLOCK_FIELDS numbers per block, blocks in linear order); returns the blocks.
ATTN_API long attn_cpu_block_counts(long long* out, long cap_blocks) {
    const long n = (long)blocks.size();
    if (out && cap_blocks >= n) memcpy(out, blocks.data(), sizeof(BlockCounts) * n);
    return n;
}

ATTN_API int attn_cpu_block_fields() { return BLOCK_FIELDS; }

// Distinct bytes read and written per global buffer (2 numbers each, buffers in allocation order).
ATTN_API long attn_cpu_distinct_bytes(long long* out, long cap_buffers) {
    const long n = (long)touched.size();
    if (out && cap_buffers >= n)
        for (long i = 0; i < n; ++i) {
            long long r = 0, w = 0;
            for (uint8_t b : touched[i]) {
                r += b & 1;
                w += (b >> 1) & 1;
            }
            out[2 * i] = r;
            out[2 * i + 1] = w;
        }
    return n;
}

// Per byte of global buffer `buffer`, what the last counted launch did to it (1 read, 2 written;
// the bytes past the returned length were not touched) into `out` when it has room; returns the
// length. Launches that each ran a share of one grid merge their distinct bytes from these.
ATTN_API long attn_cpu_touched(long buffer, uint8_t* out, long cap) {
    if (buffer < 0 || buffer >= (long)touched.size()) return 0;
    const long n = (long)touched[buffer].size();
    if (out && cap >= n) memcpy(out, touched[buffer].data(), n);
    return n;
}

// The traced block's events (48 bytes each) into `out` when it has room; returns their number.
ATTN_API long attn_cpu_trace(void* out, long cap) {
    const long n = (long)events.size();
    if (out && cap >= n) memcpy(out, events.data(), sizeof(Event) * n);
    return n;
}

ATTN_API int attn_cpu_trace_truncated() { return truncated ? 1 : 0; }
