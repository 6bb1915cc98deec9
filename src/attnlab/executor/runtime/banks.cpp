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
#include <unordered_map>

#include "runtime.h"

namespace attn_cpu {

unsigned wavefronts_for(const uint32_t* offsets, int n, unsigned size) {
    uint32_t words[32 * 4];
    int count = 0;
    for (int i = 0; i < n; ++i)
        for (unsigned b = 0; b < (size + 3) / 4; ++b) words[count++] = offsets[i] / 4 + b;
    std::sort(words, words + count);
    count = (int)(std::unique(words, words + count) - words);
    int per_bank[32] = {};
    int most = 0;
    for (int i = 0; i < count; ++i) most = std::max(most, ++per_bank[words[i] % 32]);
    return (unsigned)std::max(most, 1);
}

void log_shared_access(Thread& t, uint32_t offset, unsigned size, int kind, void* pc, bool write) {
    t.log.push_back(LoggedAccess{pc, offset, (uint8_t)size, (uint8_t)kind, write});
}

void log_global_access(Thread& t, uint64_t address, unsigned size, bool write, void* pc) {
    t.log.push_back(LoggedAccess{pc, address, (uint8_t)size, 2, write});
}

// Global memory serves a warp's request in 32-byte sectors: the distinct sectors its lanes touch,
// next to the fewest that could hold the distinct bytes they asked for.
static void count_sectors(const LoggedAccess* const* lanes, int n) {
    uint64_t sectors[32 * 2], bytes[32 * 16];
    int ns = 0, nb = 0;
    for (int i = 0; i < n; ++i) {
        const LoggedAccess& a = *lanes[i];
        for (uint64_t s = a.offset / 32; s <= (a.offset + a.size - 1) / 32; ++s) sectors[ns++] = s;
        for (unsigned b = 0; b < a.size; ++b) bytes[nb++] = a.offset + b;
    }
    std::sort(sectors, sectors + ns);
    std::sort(bytes, bytes + nb);
    ns = (int)(std::unique(sectors, sectors + ns) - sectors);
    nb = (int)(std::unique(bytes, bytes + nb) - bytes);
    const LoggedAccess& first = *lanes[0];
    count_request(first.write ? K_GLOBAL_ST : K_GLOBAL_LD, first.pc, (unsigned)ns, (unsigned)((nb + 31) / 32));
}

// One warp-wide request: the accesses of its lanes (nullptr: the lane made none).
static void count_group(const LoggedAccess* const* by_lane) {
    const LoggedAccess* present[32];
    int n = 0, first_lane = -1;
    for (int l = 0; l < WARP; ++l)
        if (by_lane[l]) {
            present[n++] = by_lane[l];
            if (first_lane < 0) first_lane = l;
        }
    if (!n) return;
    const LoggedAccess& first = *by_lane[first_lane];
    if (first.kind == 2) {  // global memory (OPT_COUNT)
        count_sectors(present, n);
        return;
    }
    const unsigned size = first.size;
    const int lanes_per_phase = size >= 16 ? 8 : size == 8 ? 16 : 32;
    BankCounter& bc = g.banks[first.kind == 1 ? 1 : 2];
    bc.requests += 1;
    unsigned wavefronts = 0, ideal = 0;
    for (int phase = 0; phase < 32 / lanes_per_phase; ++phase) {
        uint32_t offsets[32];
        int k = 0;
        for (int l = phase * lanes_per_phase; l < (phase + 1) * lanes_per_phase; ++l)
            if (by_lane[l]) offsets[k++] = (uint32_t)by_lane[l]->offset;
        if (!k) continue;
        wavefronts += wavefronts_for(offsets, k, size);
        ideal += 1;
    }
    bc.wavefronts += wavefronts;
    bc.ideal += ideal;
    // WMMA fragment elements move in an order of the runtime's choosing, not the GPU's: counted by
    // wmma.cpp as instructions, never as wavefronts.
    if (first.kind != 3)
        count_request(first.kind == 1 ? K_CP_ASYNC : first.write ? K_SHARED_ST : K_SHARED_LD, first.pc, wavefronts, ideal);
}

void flush_bank_log(int warp) {
    const int base = warp * WARP;
    for (int l = 0; l < WARP && base + l < g.nthreads; ++l)
        if (g.threads[base + l].run == Run::Ready) return;  // a lane is still on its way
    // Bucket every access by its site and kind (a cp.async reads global and writes shared at one
    // site), then by its occurrence in its lane: slot occurrence * 32 + lane. Linear in the log.
    struct Bucket {
        uintptr_t key;
        std::vector<const LoggedAccess*> slots;
    };
    static std::vector<Bucket> buckets;
    static std::unordered_map<uintptr_t, int> bucket_of;
    static std::vector<int> occurrences;
    buckets.clear();
    bucket_of.clear();
    for (int l = 0; l < WARP && base + l < g.nthreads; ++l) {
        occurrences.assign(buckets.size(), 0);
        uintptr_t last_key = ~(uintptr_t)0;
        int b = -1;
        for (const LoggedAccess& a : g.threads[base + l].log) {
            const uintptr_t key = (uintptr_t)a.pc * 4 + a.kind;
            if (key != last_key) {
                auto it = bucket_of.find(key);
                if (it == bucket_of.end()) {
                    it = bucket_of.emplace(key, (int)buckets.size()).first;
                    buckets.push_back(Bucket{key, {}});
                }
                b = it->second;
                last_key = key;
                if ((int)occurrences.size() <= b) occurrences.resize(b + 1, 0);
            }
            std::vector<const LoggedAccess*>& slots = buckets[b].slots;
            const size_t slot = (size_t)occurrences[b]++ * WARP + l;
            if (slots.size() <= slot) slots.resize((slot / WARP + 1) * WARP, nullptr);
            slots[slot] = &a;
        }
    }
    for (const Bucket& bucket : buckets)
        for (size_t i = 0; i < bucket.slots.size(); i += WARP) count_group(&bucket.slots[i]);
    for (int l = 0; l < WARP && base + l < g.nthreads; ++l) g.threads[base + l].log.clear();
    ++g.warps[warp].epoch;
}

}  // namespace attn_cpu
