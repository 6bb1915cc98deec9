// Shared-memory bank conflicts. Shared memory has 32 banks of 4 bytes; one request is served in
// as many wavefronts as the most distinct 4-byte words it needs from one bank (one word read by
// many lanes is a broadcast). 16-byte accesses are served a quarter-warp (8 lanes) at a time and
// 8-byte accesses a half-warp at a time, so those phases are counted separately.
//
// ldmatrix is counted exactly (warp.cpp: one request per 8x8 matrix). Per-thread accesses and
// cp.async (OPT_BANKS) are logged per lane and grouped into warp-wide requests when the warp next
// meets (a barrier, a collective, or exit): the k-th execution of one instruction (by its return
// address) in each lane forms one request, as lanes running in lock-step would issue it.
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

void log_shared_access(Thread& t, uint32_t offset, unsigned size, int kind, void* pc) {
    t.log.push_back(LoggedAccess{pc, offset, (uint8_t)size, (uint8_t)kind});
}

void flush_bank_log(int warp) {
    const int base = warp * WARP;
    for (int l = 0; l < WARP && base + l < g.nthreads; ++l)
        if (g.threads[base + l].run == Run::Ready) return;  // a lane is still on its way
    struct Entry {
        void* pc;
        int occurrence, lane;
        uint32_t offset;
        uint8_t size, kind;
    };
    std::vector<Entry> all;
    for (int l = 0; l < WARP && base + l < g.nthreads; ++l) {
        Thread& t = g.threads[base + l];
        std::unordered_map<void*, int> seen;
        for (const LoggedAccess& a : t.log) all.push_back(Entry{a.pc, seen[a.pc]++, l, a.offset, a.size, a.kind});
        t.log.clear();
    }
    std::sort(all.begin(), all.end(), [](const Entry& a, const Entry& b) {
        if (a.pc != b.pc) return a.pc < b.pc;
        if (a.occurrence != b.occurrence) return a.occurrence < b.occurrence;
        return a.lane < b.lane;
    });
    for (size_t i = 0; i < all.size();) {
        size_t j = i;
        while (j < all.size() && all[j].pc == all[i].pc && all[j].occurrence == all[i].occurrence) ++j;
        const unsigned size = all[i].size;
        const int lanes_per_phase = size >= 16 ? 8 : size == 8 ? 16 : 32;
        BankCounter& bc = g.banks[all[i].kind == 1 ? 1 : 2];
        bc.requests += 1;
        for (int phase = 0; phase < 32 / lanes_per_phase; ++phase) {
            uint32_t offsets[32];
            int n = 0;
            for (size_t k = i; k < j; ++k)
                if (all[k].lane / lanes_per_phase == phase) offsets[n++] = all[k].offset;
            if (!n) continue;
            bc.wavefronts += wavefronts_for(offsets, n, size);
            bc.ideal += 1;
        }
        i = j;
    }
}

}  // namespace attn_cpu
