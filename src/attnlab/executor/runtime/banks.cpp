// Shared-memory bank conflicts. Shared memory has 32 banks of 4 bytes; one request is served in
// as many wavefronts as the most distinct 4-byte words it needs from one bank (one word read by
// many lanes is a broadcast). 16-byte accesses are served a quarter-warp (8 lanes) at a time and
// 8-byte accesses a half-warp at a time, so those phases are counted separately.
//
// ldmatrix is counted exactly (warp.cpp: one request per 8x8 matrix). Per-thread accesses and
// cp.async (OPT_BANKS, OPT_COUNT) are logged per lane and grouped into warp-wide requests when the warp next
// meets (a barrier, a collective, or exit): the k-th execution of one instruction (by its return
// address) in each lane forms one request, as lanes running in lock-step would issue it. Under
// OPT_COUNT global accesses are logged and grouped the same way, and counted in 32-byte sectors.
#include <algorithm>

#include "runtime.h"

namespace attn_cpu {

// The wavefronts of one phase: the most distinct 4-byte words any bank must serve. A phase holds
// at most 32 words (32 lanes of 4 bytes, 16 of 8 or 8 of 16), so a bank's words fit in 32 slots;
// each word is looked up among its bank's, which is quicker than sorting them all.
unsigned wavefronts_for(const uint32_t* offsets, int n, unsigned size) {
    uint32_t words[32][32];
    uint8_t count[32] = {};
    unsigned most = 1;
    for (int i = 0; i < n; ++i)
        for (unsigned b = 0; b < (size + 3) / 4; ++b) {
            const uint32_t w = offsets[i] / 4 + b;
            const unsigned bank = w % 32;
            bool seen = false;
            for (unsigned k = 0; k < count[bank] && !seen; ++k) seen = words[bank][k] == w;
            if (seen) continue;
            if (count[bank] < 32) words[bank][count[bank]++] = w;
            most = std::max(most, (unsigned)count[bank]);
        }
    return most;
}

// Appends an access to the lane's log, extending one of its latest runs at the same instruction
// when it continues that run's stride. Only the order of a lane's accesses at one instruction
// matters to the grouping (flush_bank_log), and a run keeps it.
static void log_access(Thread& t, void* pc, uint64_t offset, unsigned size, uint8_t kind, bool write) {
    for (unsigned k = 1; k <= Thread::LOG_RECENT; ++k) {  // newest first: the instruction's latest run
        const uint32_t i = t.log_recent[(t.log_recent_next - k) % Thread::LOG_RECENT];
        if (!i) break;
        LoggedAccess& r = t.log[i - 1];
        if (r.pc != pc || r.kind != kind) continue;
        if (r.size != size || r.write != write) break;
        const int64_t delta = (int64_t)(offset - r.offset);
        if (r.count == 1) {
            r.stride = delta;
            r.count = 2;
            return;
        }
        if (delta == r.stride * (int64_t)r.count) {
            ++r.count;
            return;
        }
        break;  // the instruction's latest run ends here: a new one follows it
    }
    t.log.push_back(LoggedAccess{pc, offset, 0, 1, (uint8_t)size, kind, write});
    t.log_recent[t.log_recent_next++ % Thread::LOG_RECENT] = (uint32_t)t.log.size();
}

void clear_log(Thread& t) {
    t.log.clear();
    for (uint32_t& i : t.log_recent) i = 0;  // its indices point into the log
}

void log_shared_access(Thread& t, uint32_t offset, unsigned size, int kind, void* pc, bool write) {
    log_access(t, pc, offset, size, (uint8_t)kind, write);
}

void log_global_access(Thread& t, uint64_t address, unsigned size, bool write, void* pc) {
    log_access(t, pc, address, size, 2, write);
}

// One warp-wide request: its instruction, and the offset each lane in `mask` accessed.
struct Request {
    void* pc;
    uint8_t kind, size;
    bool write;
    uint32_t mask;
    uint64_t offset[32];
};

// Global memory serves a warp's request in 32-byte sectors: the distinct sectors its lanes touch,
// next to the fewest that could hold the distinct bytes they asked for. The lanes' intervals are
// put in order of address (an insertion sort: lanes mostly come in order, or all at one address)
// and swept once.
static void count_sectors(const Request& r) {
    uint64_t lo[32];
    int n = 0;
    for (int l = 0; l < WARP; ++l) {
        if (!(r.mask >> l & 1)) continue;
        const uint64_t o = r.offset[l];
        int j = n++;
        for (; j > 0 && lo[j - 1] > o; --j) lo[j] = lo[j - 1];
        lo[j] = o;
    }
    uint64_t sectors = 0, bytes = 0;
    uint64_t byte_end = 0, next_sector = 0;  // past the bytes and the sectors counted so far
    for (int i = 0; i < n; ++i) {
        const uint64_t end = lo[i] + r.size;
        const uint64_t from = std::max(lo[i], byte_end);
        if (end > from) bytes += end - from;
        byte_end = std::max(byte_end, end);
        const uint64_t first = std::max(lo[i] / 32, next_sector), last = (end - 1) / 32;
        if (last >= first) sectors += last - first + 1;
        next_sector = std::max(next_sector, last + 1);
    }
    count_request(r.write ? K_GLOBAL_ST : K_GLOBAL_LD, r.pc, (unsigned)sectors, (unsigned)((bytes + 31) / 32));
}

static void count_group(const Request& r) {
    if (!r.mask) return;
    if (r.kind == 2) {  // global memory (OPT_COUNT)
        count_sectors(r);
        return;
    }
    const unsigned size = r.size;
    const int lanes_per_phase = size >= 16 ? 8 : size == 8 ? 16 : 32;
    BankCounter& bc = g.banks[r.kind == 1 ? 1 : 2];
    bc.requests += 1;
    unsigned wavefronts = 0, ideal = 0;
    for (int phase = 0; phase < 32 / lanes_per_phase; ++phase) {
        uint32_t offsets[32];
        int k = 0;
        for (int l = phase * lanes_per_phase; l < (phase + 1) * lanes_per_phase; ++l)
            if (r.mask >> l & 1) offsets[k++] = (uint32_t)r.offset[l];
        if (!k) continue;
        wavefronts += wavefronts_for(offsets, k, size);
        ideal += 1;
    }
    bc.wavefronts += wavefronts;
    bc.ideal += ideal;
    // WMMA fragment elements move in an order of the runtime's choosing, not the GPU's: counted by
    // wmma.cpp as instructions, never as wavefronts.
    if (r.kind != 3)
        count_request(r.kind == 1 ? K_CP_ASYNC : r.write ? K_SHARED_ST : K_SHARED_LD, r.pc, wavefronts, ideal);
}

void flush_bank_log(int warp) {
    const int base = warp * WARP;
    const int lanes = std::min(WARP, g.nthreads - base);
    if (g.warps[warp].ready) return;  // a lane is still on its way
    // Bucket every run by its instruction and kind (a cp.async reads global and writes shared at
    // one site), keeping each lane's runs in order; then the k-th access of every lane in a bucket
    // is one request, as lanes running in lock-step would issue it. A warp-epoch touches few
    // sites, so a linear search finds a bucket quicker than hashing.
    struct Bucket {
        std::vector<const LoggedAccess*> runs[WARP];  // each lane's runs at the bucket's key, in order
    };
    static std::vector<Bucket> buckets;  // kept between flushes, so that their vectors keep their room
    static std::vector<uintptr_t> keys;
    keys.clear();
    for (int l = 0; l < lanes; ++l) {
        uintptr_t last_key = ~(uintptr_t)0;
        int b = -1;
        for (const LoggedAccess& a : g.threads[base + l].log) {
            const uintptr_t key = (uintptr_t)a.pc * 4 + a.kind;
            if (key != last_key) {
                b = (int)(std::find(keys.begin(), keys.end(), key) - keys.begin());
                if (b == (int)keys.size()) {
                    keys.push_back(key);
                    if ((int)buckets.size() < b + 1) buckets.emplace_back();
                    for (auto& v : buckets[b].runs) v.clear();
                }
                last_key = key;
            }
            buckets[b].runs[l].push_back(&a);
        }
    }
    for (size_t b = 0; b < keys.size(); ++b) {
        const Bucket& bucket = buckets[b];
        size_t run[WARP] = {};     // each lane's current run, and its position in it
        uint32_t pos[WARP] = {};
        Request r{};
        for (;;) {
            r.mask = 0;
            for (int l = 0; l < lanes; ++l) {
                if (run[l] >= bucket.runs[l].size()) continue;
                const LoggedAccess& a = *bucket.runs[l][run[l]];
                if (!r.mask) {
                    r.pc = a.pc;
                    r.kind = a.kind;
                    r.size = a.size;
                    r.write = a.write;
                }
                r.mask |= 1u << l;
                r.offset[l] = a.offset + (uint64_t)(a.stride * (int64_t)pos[l]);
                if (++pos[l] == a.count) {
                    ++run[l];
                    pos[l] = 0;
                }
            }
            if (!r.mask) break;
            count_group(r);
        }
    }
    for (int l = 0; l < lanes; ++l) clear_log(g.threads[base + l]);
    ++g.warps[warp].epoch;
}

}  // namespace attn_cpu
