// nvcuda::wmma m16n16k16 (fp16 inputs, fp32 accumulator) on the executor.
//
// CUDA leaves unspecified which matrix element each fragment element x[i] of each lane holds
// (CUDA C++ Programming Guide, "Warp Matrix Functions"), and it differs between GPUs. The executor
// draws the mapping at random at every launch, from the launch seed: for the accumulator a
// permutation of the 256 elements over 32 lanes x 8; for matrix_a and matrix_b (16 per lane, 512
// slots) every element in two slots, as the CUDA headers' fragment sizes imply. Element-wise code
// (scale every x[i]) works under any mapping; code that assumes one gives wrong answers here.
//
// load_matrix_sync / store_matrix_sync / mma_sync are warp-collective (.aligned): every lane
// arrives with the same pointer, leading dimension and layout; the pointer must be 32-byte
// aligned and ldm a multiple of 16 bytes. Each element's read or write is checked as if the lane
// holding it made it.
#include <mma.h>

#include <cstring>

#include "runtime.h"

namespace attn_cpu {

void rendezvous(int kind, unsigned mask, void* pc);

namespace {

struct Mapping {
    int slots = 0;                 // 256 (accumulator) or 512 (a, b)
    uint16_t element_of[512];      // slot (lane * per_lane + i) -> element (row * 16 + col)
    uint16_t slot_of[256];         // element -> the slot whose copy mma reads
};
Mapping maps[5];
uint64_t maps_seed = ~0ull;

void draw_maps() {
    if (maps_seed == g.seed) return;
    maps_seed = g.seed;
    uint64_t saved = g.rng;
    g.rng = g.seed ^ 0x5eedf00dull;
    for (int use = 0; use < 5; ++use) {
        Mapping& m = maps[use];
        m.slots = use == WMMA_ACC ? 256 : 512;
        for (int s = 0; s < m.slots; ++s) m.element_of[s] = (uint16_t)(s % 256);
        for (int s = m.slots - 1; s > 0; --s) {  // Fisher-Yates
            const int j = (int)(next_random() % (uint64_t)(s + 1));
            std::swap(m.element_of[s], m.element_of[j]);
        }
        for (int s = 0; s < m.slots; ++s) m.slot_of[m.element_of[s]] = (uint16_t)s;
    }
    g.rng = saved;
}

int per_lane(int use) { return use == WMMA_ACC ? 8 : 16; }

void* element_address(const CollArgs& c, int e, unsigned esize) {
    const int r = e / 16, col = e % 16;
    const size_t index = c.col_major ? (size_t)col * c.ldm + r : (size_t)r * c.ldm + col;
    return (uint8_t*)c.ptr + index * esize;
}

bool same_arguments(Warp& w, unsigned lanes) {
    const int base = (int)(&w - g.warps) * WARP;
    const CollArgs& first = g.threads[base + __builtin_ctz(lanes)].coll;
    for (int l = 0; l < WARP; ++l) {
        if (!(lanes & (1u << l))) continue;
        const CollArgs& c = g.threads[base + l].coll;
        if (c.ptr != first.ptr || c.ldm != first.ldm || c.col_major != first.col_major || c.use != first.use) {
            report("divergent warp collective", &g.threads[base + l], c.pc,
                   std::string(coll_name(w.kind)) + ": lane " + std::to_string(l) +
                       " passes a different pointer, leading dimension or layout than lane " +
                       std::to_string(__builtin_ctz(lanes)),
                   &g.threads[base + __builtin_ctz(lanes)], first.pc);
            return false;
        }
    }
    return true;
}

void check_alignment(Thread& t, const CollArgs& c, unsigned esize) {
    if (((uintptr_t)c.ptr & 31u) || (c.ldm * esize) % 16u)
        report("misaligned access", &t, c.pc,
               std::string(coll_name(t.coll.kind)) + " needs a 32-byte aligned pointer and a leading dimension "
               "that is a multiple of 16 bytes; got ldm " + std::to_string(c.ldm));
}

}  // namespace

void wmma_perform(Warp& w, unsigned lanes) {
    draw_maps();
    const int base = (int)(&w - g.warps) * WARP;
    Thread& lead = g.threads[base + __builtin_ctz(lanes)];
    if (w.kind == C_WMMA_LOAD || w.kind == C_WMMA_STORE) {
        if (!same_arguments(w, lanes)) abort_launch();
        const CollArgs& c = lead.coll;
        const int use = c.use;
        const unsigned esize = use == WMMA_ACC ? 4 : 2;
        check_alignment(lead, c, esize);
        const Mapping& m = maps[use];
        const int n = per_lane(use);
        const bool load = w.kind == C_WMMA_LOAD;
        count_site(load ? K_WMMA_LOAD : K_WMMA_STORE, c.pc, __builtin_popcount(lanes), 1, 256 * esize);
        trace_warp_event((int)(&w - g.warps), load ? E_WMMA_LOAD : E_WMMA_STORE, c.pc, use);
        g.in_wmma = true;
        if (w.kind == C_WMMA_LOAD) {
            for (int s = 0; s < m.slots; ++s) {
                Thread& t = g.threads[base + s / n];
                void* p = element_address(c, m.element_of[s], esize);
                checked_access(t, p, esize, false, c.pc);
                memcpy((uint8_t*)t.coll.elements + (s % n) * esize, p, esize);
            }
        } else {
            for (int e = 0; e < 256; ++e) {
                const int s = m.slot_of[e];
                Thread& t = g.threads[base + s / n];
                void* p = element_address(c, e, esize);
                checked_access(t, p, esize, true, c.pc);
                memcpy(p, (const uint8_t*)t.coll.elements + (s % n) * esize, esize);
            }
        }
        g.in_wmma = false;
        return;
    }
    count_site(K_WMMA_MMA, lead.coll.pc, __builtin_popcount(lanes), 1, 0);
    count_tensor_flops(2 * 16 * 16 * 16);
    trace_warp_event((int)(&w - g.warps), E_WMMA_MMA, lead.coll.pc);
    // mma_sync: D = A B + C, fp16 products exact in fp32, summed in k order.
    float A[16][16], B[16][16], C[16][16];
    const int a_use = lead.coll.use, b_use = lead.coll.b_use;
    for (int e = 0; e < 256; ++e) {
        const int sa = maps[a_use].slot_of[e], sb = maps[b_use].slot_of[e], sc = maps[WMMA_ACC].slot_of[e];
        const CollArgs& ca = g.threads[base + sa / 16].coll;
        const CollArgs& cb = g.threads[base + sb / 16].coll;
        const CollArgs& cc = g.threads[base + sc / 8].coll;
        A[e / 16][e % 16] = __half2float(((const __half*)ca.ptr)[sa % 16]);
        B[e / 16][e % 16] = __half2float(((const __half*)cb.b_elements)[sb % 16]);
        C[e / 16][e % 16] = ((const float*)cc.c_elements)[sc % 8];
    }
    float D[16][16];
    for (int r = 0; r < 16; ++r)
        for (int col = 0; col < 16; ++col) {
            float s = C[r][col];
            for (int k = 0; k < 16; ++k) s += A[r][k] * B[k][col];
            D[r][col] = s;
        }
    const Mapping& md = maps[WMMA_ACC];
    for (int s = 0; s < 256; ++s) {
        const int e = md.element_of[s];
        ((float*)g.threads[base + s / 8].coll.elements)[s % 8] = D[e / 16][e % 16];
    }
}

void wmma_load(int use, void* lane_elements, const void* src, unsigned ldm, bool col_major) {
    Thread& t = *g.cur;
    t.coll.use = use;
    t.coll.elements = lane_elements;
    t.coll.ptr = src;
    t.coll.ldm = ldm;
    t.coll.col_major = use == WMMA_A_COL || use == WMMA_B_COL || (use == WMMA_ACC && col_major);
    rendezvous(C_WMMA_LOAD, 0xffffffffu, ATTN_CALLER());
}

void wmma_store(void* dst, const void* lane_elements, unsigned ldm, bool col_major) {
    Thread& t = *g.cur;
    t.coll.use = WMMA_ACC;
    t.coll.elements = const_cast<void*>(lane_elements);
    t.coll.ptr = dst;
    t.coll.ldm = ldm;
    t.coll.col_major = col_major;
    rendezvous(C_WMMA_STORE, 0xffffffffu, ATTN_CALLER());
}

void wmma_mma(float* d, const __half* a, int a_use, const __half* b, int b_use, const float* c) {
    Thread& t = *g.cur;
    t.coll.elements = d;
    t.coll.ptr = a;   // the A fragment's elements (compared across lanes only for loads and stores)
    t.coll.use = a_use;
    t.coll.b_elements = b;
    t.coll.b_use = b_use;
    t.coll.c_elements = c;
    t.coll.ldm = 0;
    t.coll.col_major = false;
    rendezvous(C_WMMA_MMA, 0xffffffffu, ATTN_CALLER());
}

}  // namespace attn_cpu
