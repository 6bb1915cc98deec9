// Warp-collective operations: the lanes of a warp meet, the last to arrive performs the
// operation for all of them, and each goes on with its own result.
//
// Who must arrive (PTX ISA 9.7.9.6 shfl.sync, 9.7.13.3 bar.warp.sync, and the .aligned
// instructions ldmatrix 9.7.14.5.15 and mma 9.7.14.5.14 / wmma 9.7.14.4):
//   __shfl_*_sync, __syncwarp: the lanes named by the mask; each must pass the same mask.
//   ldmatrix, mma.sync, wmma.*: .aligned, so every lane of the warp, at the same instruction.
// Findings: a lane that calls with a mask not naming itself or different from the others', lanes
// of one warp waiting at different collectives (divergence), and a mask or an .aligned
// operation that names a lane which has exited.
#include <algorithm>
#include <cstring>

#include "runtime.h"

namespace attn_cpu {

uint8_t* shared_pointer(unsigned offset);
void wmma_perform(Warp& w, unsigned lanes);

const char* coll_name(int kind) {
    switch (kind) {
        case C_SYNCWARP: return "__syncwarp";
        case C_SHFL: return "shfl.sync";
        case C_LDSM: return "ldmatrix";
        case C_MMA: return "mma.sync.m16n8k16";
        case C_WMMA_LOAD: return "wmma::load_matrix_sync";
        case C_WMMA_STORE: return "wmma::store_matrix_sync";
        case C_WMMA_MMA: return "wmma::mma_sync";
        default: return "nothing";
    }
}

static bool aligned_kind(int kind) { return kind >= C_LDSM; }

static unsigned required_lanes(const Warp& w) { return aligned_kind(w.kind) ? w.lanes : (w.mask & w.lanes); }

// ---- the operations ---------------------------------------------------------------------------

static void perform_syncwarp(Warp& w, unsigned lanes, int base) {
    count_site(K_SYNCWARP, w.pc, __builtin_popcount(lanes), 1, 0);
    trace_warp_event(base / WARP, E_SYNCWARP, w.pc, (int)lanes);
    if (!(g.options & OPT_RACES)) return;
    std::vector<uint32_t> join(g.nthreads, 0u);
    for (int l = 0; l < WARP; ++l)
        if (lanes & (1u << l))
            for (int i = 0; i < g.nthreads; ++i) join[i] = std::max(join[i], g.threads[base + l].vc[i]);
    for (int l = 0; l < WARP; ++l)
        if (lanes & (1u << l)) {
            Thread& t = g.threads[base + l];
            std::copy(join.begin(), join.end(), t.vc);
            vc_tick(t);
        }
    (void)w;
}

// shfl.sync (PTX ISA 9.7.9.6): c = ((32 - width) << 8) | (up ? 0 : 31) as CUDA's intrinsics pass it.
static void perform_shfl(Warp& w, unsigned lanes, int base) {
    count_site(K_SHFL, w.pc, __builtin_popcount(lanes), 1, 0);
    trace_warp_event(base / WARP, E_SHFL, w.pc, (int)lanes);
    for (int l = 0; l < WARP; ++l) {
        if (!(lanes & (1u << l))) continue;
        Thread& t = g.threads[base + l];
        const int width = t.coll.width;
        if (width < 1 || width > 32 || (width & (width - 1))) {
            report("shuffle width", &t, t.coll.pc, "shuffle width " + std::to_string(width) + " is not a power of two in 1..32");
        }
        const unsigned segmask = (unsigned)(32 - width) & 31u, cval = t.coll.mode == 3 ? 0u : 31u;
        const unsigned b = (unsigned)t.coll.lane_arg & 31u;
        const unsigned lane = (unsigned)l;
        const unsigned max_lane = (lane & segmask) | (cval & ~segmask), min_lane = lane & segmask;
        unsigned j;
        bool pval;
        switch (t.coll.mode) {
            case 0: j = lane ^ b; pval = j <= max_lane; break;                          // bfly
            case 1: j = min_lane | (b & ~segmask); pval = j <= max_lane; break;          // idx
            case 2: j = lane + b; pval = j <= max_lane; break;                           // down
            default: j = lane - b; pval = (int)j >= (int)max_lane; break;                // up
        }
        if (!pval) j = lane;
        if (!(lanes & (1u << j))) {
            report("warp collective mask", &t, t.coll.pc,
                   "shuffle reads lane " + std::to_string(j) + ", which is not among the lanes taking part (mask " +
                       lanes_text(w.mask) + ")");
            t.coll.result = 0xffffffffu;
            continue;
        }
        t.coll.result = g.threads[base + j].coll.value;
    }
}

// ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16 (PTX ISA 9.7.14.5.15): lanes 8m..8m+7 give the
// addresses of rows 0..7 of matrix m (16 bytes each, 16-byte aligned). Register m of lane l gets,
// from matrix m, row l/4, elements 2(l%4) and 2(l%4)+1; with .trans, the elements at
// (row 2(l%4), column l/4) and (row 2(l%4)+1, column l/4). The lower index goes to the low half.
static void perform_ldmatrix(Warp& w, unsigned lanes, int base) {
    uint16_t m[4][8][8];
    unsigned wavefronts = 0;
    for (int mat = 0; mat < 4; ++mat) {
        uint32_t offsets[8];
        for (int r = 0; r < 8; ++r) {
            Thread& src = g.threads[base + 8 * mat + r];
            const unsigned off = src.coll.addr - SHARED_WINDOW;
            offsets[r] = off;
            if ((src.coll.addr & 15u) || src.coll.addr < SHARED_WINDOW || !shared_in_bounds(off, 16)) {
                report(src.coll.addr & 15u ? "misaligned access" : "shared out of bounds", &src, src.coll.pc,
                       "ldmatrix row address " + std::to_string((long long)src.coll.addr - SHARED_WINDOW) +
                           (src.coll.addr & 15u ? " is not 16-byte aligned" : " is outside the block's shared memory"));
                memset(m[mat][r], 0xff, 16);
                continue;
            }
            shared_read(src, off, 16, src.coll.pc);
            memcpy(m[mat][r], shared_pointer(off), 16);
            trace_event(src, E_LDMATRIX, src.coll.pc, off, 16, 8 * mat + r, -1);
        }
        BankCounter& bc = g.banks[0];
        bc.requests += 1;
        const unsigned wf = wavefronts_for(offsets, 8, 16);
        bc.wavefronts += wf;
        bc.ideal += 1;
        wavefronts += wf;
    }
    count_site(K_LDMATRIX, w.pc, __builtin_popcount(lanes), 1, 4 * 8 * 16, wavefronts, 4);
    for (int l = 0; l < WARP; ++l) {
        if (!(lanes & (1u << l))) continue;
        Thread& t = g.threads[base + l];
        for (int mat = 0; mat < 4; ++mat) {
            uint16_t lo, hi;
            if (!t.coll.trans) {
                lo = m[mat][l / 4][2 * (l % 4)];
                hi = m[mat][l / 4][2 * (l % 4) + 1];
            } else {
                lo = m[mat][2 * (l % 4)][l / 4];
                hi = m[mat][2 * (l % 4) + 1][l / 4];
            }
            t.coll.out4[mat] = (unsigned)lo | ((unsigned)hi << 16);
        }
    }
}

static float half_lo(unsigned r) { return half_bits_to_float((unsigned short)(r & 0xffffu)); }
static float half_hi(unsigned r) { return half_bits_to_float((unsigned short)(r >> 16)); }

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 (PTX ISA 9.7.14.5.8, "Matrix Fragments for
// mma.m16n8k16 with floating point type"); g = lane / 4 (groupID), t = lane % 4 (threadID_in_group):
//   A 16x16: a0,a1 (g, 2t..2t+1), a2,a3 (g+8, 2t..), a4,a5 (g, 2t+8..), a6,a7 (g+8, 2t+8..);
//            register i holds a(2i) in its low half and a(2i+1) in its high half.
//   B 16x8:  b0,b1 (k = 2t..2t+1, n = g), b2,b3 (k = 2t+8.., n = g).
//   C, D 16x8 fp32: c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1).
// Products of fp16 values are exact in fp32; they are added to C in k order in fp32.
static void perform_mma(Warp& w, unsigned lanes, int base) {
    count_site(K_MMA, w.pc, __builtin_popcount(lanes), 1, 0);
    count_tensor_flops(2 * 16 * 8 * 16);
    trace_warp_event(base / WARP, E_MMA, w.pc);
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < WARP; ++l) {
        const Thread& t = g.threads[base + l];
        const int gid = l / 4, tig = l % 4;
        const unsigned* a = t.coll.a;
        A[gid][2 * tig] = half_lo(a[0]);
        A[gid][2 * tig + 1] = half_hi(a[0]);
        A[gid + 8][2 * tig] = half_lo(a[1]);
        A[gid + 8][2 * tig + 1] = half_hi(a[1]);
        A[gid][2 * tig + 8] = half_lo(a[2]);
        A[gid][2 * tig + 9] = half_hi(a[2]);
        A[gid + 8][2 * tig + 8] = half_lo(a[3]);
        A[gid + 8][2 * tig + 9] = half_hi(a[3]);
        B[2 * tig][gid] = half_lo(t.coll.b0);
        B[2 * tig + 1][gid] = half_hi(t.coll.b0);
        B[2 * tig + 8][gid] = half_lo(t.coll.b1);
        B[2 * tig + 9][gid] = half_hi(t.coll.b1);
        const float* c = t.coll.d;
        C[gid][2 * tig] = c[0];
        C[gid][2 * tig + 1] = c[1];
        C[gid + 8][2 * tig] = c[2];
        C[gid + 8][2 * tig + 1] = c[3];
    }
    for (int r = 0; r < 16; ++r)
        for (int n = 0; n < 8; ++n) {
            float s = C[r][n];
            for (int k = 0; k < 16; ++k) s += A[r][k] * B[k][n];
            C[r][n] = s;
        }
    for (int l = 0; l < WARP; ++l) {
        if (!(lanes & (1u << l))) continue;
        float* d = g.threads[base + l].coll.d;
        const int gid = l / 4, tig = l % 4;
        d[0] = C[gid][2 * tig];
        d[1] = C[gid][2 * tig + 1];
        d[2] = C[gid + 8][2 * tig];
        d[3] = C[gid + 8][2 * tig + 1];
    }
    (void)w;
}

// ---- the meeting --------------------------------------------------------------------------------

static void try_complete(int warp) {
    Warp& w = g.warps[warp];
    if (w.kind == C_NONE || !w.arrived) return;
    const unsigned required = required_lanes(w);
    const unsigned live = required & ~w.exited;
    if ((w.arrived & live) != live) return;
    const int base = warp * WARP;
    if (required & w.exited) {
        Thread& first = g.threads[base + __builtin_ctz(w.arrived)];
        report("warp collective mask", &first, w.pc,
               std::string(coll_name(w.kind)) + " names lanes " + lanes_text(required & w.exited) +
                   ", which have exited");
        if (aligned_kind(w.kind)) abort_launch();  // an .aligned operation without every lane is undefined
    }
    const unsigned lanes = w.arrived;
    switch (w.kind) {
        case C_SYNCWARP: perform_syncwarp(w, lanes, base); break;
        case C_SHFL: perform_shfl(w, lanes, base); break;
        case C_LDSM: perform_ldmatrix(w, lanes, base); break;
        case C_MMA: perform_mma(w, lanes, base); break;
        default: wmma_perform(w, lanes); break;
    }
    w.kind = C_NONE;
    w.arrived = 0;
    for (int l = 0; l < WARP; ++l)
        if (lanes & (1u << l)) make_ready(g.threads[base + l]);
}

// A lane exited: the pending collective may now have every live lane it needs (and reports the
// exited ones it names).
void collective_lane_exited(int warp, int lane) {
    (void)lane;
    try_complete(warp);
}

// The calling lane joins the warp's pending collective (t.coll filled in by the caller) and waits
// until it is done.
void rendezvous(int kind, unsigned mask, void* pc) {
    Thread& t = *g.cur;
    Warp& w = g.warps[t.warp];
    t.coll.kind = kind;
    t.coll.mask = mask;
    t.coll.pc = pc;
    if (!aligned_kind(kind) && !(mask & (1u << t.lane))) {
        report("warp collective mask", &t, pc,
               std::string(coll_name(kind)) + " with mask " + lanes_text(mask) + ", which does not name the calling lane");
    }
    if (w.arrived == 0) {
        w.kind = kind;
        w.mask = mask;
        w.pc = pc;
    } else if (w.kind != kind || (!aligned_kind(kind) && w.mask != mask) || (aligned_kind(kind) && w.pc != pc)) {
        std::string msg = "lane " + std::to_string(t.lane) + " reaches " + coll_name(kind);
        if (!aligned_kind(kind)) msg += " (mask " + lanes_text(mask) + ")";
        msg += " while lanes " + lanes_text(w.arrived) + " wait at " + coll_name(w.kind);
        if (!aligned_kind(w.kind)) msg += " (mask " + lanes_text(w.mask) + ")";
        msg += w.kind == kind ? " elsewhere: the warp has diverged" : ": the warp has diverged";
        Thread& other = g.threads[t.warp * WARP + __builtin_ctz(w.arrived)];
        report("divergent warp collective", &t, pc, msg, &other, w.pc);
        abort_launch();
    }
    w.arrived |= 1u << t.lane;
    set_run(t, Run::Blocked);
    t.wait = WaitOn::Collective;
    t.wait_pc = pc;
    if (g.options & (OPT_BANKS | OPT_COUNT)) flush_bank_log(t.warp);
    try_complete(t.warp);
    if (t.run == Run::Blocked) block_current(WaitOn::Collective, pc);
}

// ---- entry points -----------------------------------------------------------------------------

void syncwarp(unsigned mask) { rendezvous(C_SYNCWARP, mask, ATTN_CALLER()); }

unsigned shfl(unsigned mask, unsigned value, int lane_arg, int width, int mode) {
    Thread& t = *g.cur;
    t.coll.value = value;
    t.coll.lane_arg = lane_arg;
    t.coll.width = width;
    t.coll.mode = mode;
    rendezvous(C_SHFL, mask, ATTN_CALLER());
    return t.coll.result;
}

void ldmatrix_x4(unsigned (&r)[4], unsigned addr, bool trans) {
    Thread& t = *g.cur;
    t.coll.addr = addr;
    t.coll.trans = trans;
    t.coll.out4 = r;
    rendezvous(C_LDSM, 0xffffffffu, ATTN_CALLER());
}

void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    Thread& t = *g.cur;
    t.coll.d = d;
    t.coll.a = a;
    t.coll.b0 = b0;
    t.coll.b1 = b1;
    rendezvous(C_MMA, 0xffffffffu, ATTN_CALLER());
}

}  // namespace attn_cpu
