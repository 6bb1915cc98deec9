// Warp-collective operations: the lanes of a warp meet, the last to arrive performs the
// operation for all of them, and each goes on with its own result.
//
// Who must arrive (PTX ISA 9.7.9.6 shfl.sync, 9.7.13.2 bar.warp.sync, 9.7.13.9 vote.sync,
// 9.7.13.10 match.sync, 9.7.13.12 redux.sync, and the .aligned instructions ldmatrix 9.7.14.5.15
// and mma 9.7.14.5.14 / wmma 9.7.14.4):
//   __shfl_*_sync, __syncwarp, __ballot_sync, __any/__all/__uni_sync, __match_*_sync,
//   __reduce_*_sync: the non-exited lanes named by the mask, each passing the same mask and
//   executing the instruction with the same qualifiers (shfl's mode, vote's, ...); a lane that
//   has exited is simply not waited for.
//   ldmatrix, mma.sync, wmma.*: .aligned, so every lane of the warp, at the same instruction.
// Since sm_70 (independent thread scheduling) lanes under different masks may each be waiting
// at their own collective (two half-warps, or lanes 0-7 at one of mask 0xff before all sixteen
// meet under 0xffff): a warp keeps a group per mask in flight, and each completes on its own.
// Findings: a lane that calls with a mask not naming itself; lanes waiting at different
// collectives under one mask (divergence); collectives under overlapping masks that wait for
// each other's lanes, two or more in a cycle (none can ever complete); a shuffle that reads a
// lane which has exited (its value is undefined); an .aligned operation when a lane of the warp
// has exited.
// __activemask is a meeting of its own: the lanes at one call when the rest of the warp waits or
// has exited (activemask below).
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
        case C_VOTE: return "vote.sync";
        case C_MATCH: return "match.sync";
        case C_REDUX: return "redux.sync";
        default: return "nothing";
    }
}

static bool aligned_kind(int kind) {
    return kind == C_LDSM || kind == C_MMA || kind == C_WMMA_LOAD || kind == C_WMMA_STORE || kind == C_WMMA_MMA;
}

// The instruction with its qualifiers, as findings name it: lanes meet only at the same.
static std::string op_name(int kind, int op) {
    static const char* const shfl[] = {".bfly", ".idx", ".down", ".up"};
    static const char* const vote[] = {".ballot", ".any", ".all", ".uni"};
    static const char* const match[] = {"match.any.sync.b32", "match.all.sync.b32", "match.any.sync.b64",
                                        "match.all.sync.b64"};
    static const char* const redux[] = {".add.u32", ".add.s32", ".min.u32", ".min.s32", ".max.u32",
                                        ".max.s32", ".and.b32", ".or.b32", ".xor.b32"};
    switch (kind) {
        case C_SHFL: return std::string("shfl.sync") + shfl[op & 3];
        case C_VOTE: return std::string("vote.sync") + vote[op & 3];
        case C_MATCH: return match[op & 3];
        case C_REDUX: return std::string("redux.sync") + redux[op % 9];
        default: return coll_name(kind);
    }
}

// The lanes a collective waits for (those of them that have not exited): an .aligned one every
// lane of the warp, the others the lanes their mask names.
static unsigned needed_lanes(const Warp& w, int kind, unsigned mask) {
    return aligned_kind(kind) ? w.lanes : (mask & w.lanes);
}

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
        if (w.exited & (1u << j)) {  // legal to wait past, not to read from: the register is gone
            report("warp collective mask", &t, t.coll.pc,
                   "shuffle reads lane " + std::to_string(j) + ", which has exited: its value is undefined");
            t.coll.result = 0xffffffffu;
            continue;
        }
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

// vote.sync (PTX ISA 9.7.13.9): the ballot has bit l set for each lane l of the mask whose
// predicate is true (a lane outside the mask contributes 0); .any, .all and .uni reduce the
// predicates of the mask's non-exited lanes, which are exactly the mask's lanes here.
static void perform_vote(const CollGroup& grp, unsigned lanes, int base) {
    const unsigned voters = lanes & grp.mask;
    unsigned ballot = 0;
    for (int l = 0; l < WARP; ++l)
        if ((voters >> l & 1u) && g.threads[base + l].coll.value) ballot |= 1u << l;
    unsigned r;
    switch (grp.op) {
        case VOTE_BALLOT: r = ballot; break;
        case VOTE_ANY: r = ballot != 0; break;
        case VOTE_ALL: r = ballot == voters; break;
        default: r = ballot == 0 || ballot == voters; break;  // .uni
    }
    for (int l = 0; l < WARP; ++l)
        if (lanes >> l & 1u) g.threads[base + l].coll.result = r;
}

// match.sync (PTX ISA 9.7.13.10): .any gives each lane the mask's non-exited lanes that hold its
// value; .all gives every lane those lanes if they all hold one value, and 0 if not.
static void perform_match(const CollGroup& grp, unsigned lanes, int base) {
    const bool wide = grp.op == MATCH_ANY_B64 || grp.op == MATCH_ALL_B64;
    const bool all = grp.op == MATCH_ALL_B32 || grp.op == MATCH_ALL_B64;
    const unsigned members = lanes & grp.mask;
    auto key = [&](int l) {
        const CollArgs& c = g.threads[base + l].coll;
        return wide ? (uint64_t)c.value_hi << 32 | c.value : (uint64_t)c.value;
    };
    bool uniform = true;
    for (int l = 0; l < WARP; ++l) {
        if (!(lanes >> l & 1u)) continue;
        unsigned same = 0;
        for (int m = 0; m < WARP; ++m)
            if ((members >> m & 1u) && key(m) == key(l)) same |= 1u << m;
        g.threads[base + l].coll.result = same;
        if ((members >> l & 1u) && same != members) uniform = false;
    }
    if (all)
        for (int l = 0; l < WARP; ++l)
            if (lanes >> l & 1u) g.threads[base + l].coll.result = uniform ? members : 0u;
}

// redux.sync (PTX ISA 9.7.13.12): the operation over the values of the mask's non-exited lanes,
// to every one of them; .add is truncated to 32 bits, .min and .max compare as the type says.
static void perform_redux(const CollGroup& grp, unsigned lanes, int base) {
    const unsigned members = lanes & grp.mask;
    unsigned r = 0;
    bool first = true;
    for (int l = 0; l < WARP; ++l) {
        if (!(members >> l & 1u)) continue;
        const unsigned v = g.threads[base + l].coll.value;
        if (first) { r = v; first = false; continue; }
        switch (grp.op) {
            case REDUX_ADD_U32:
            case REDUX_ADD_S32: r += v; break;
            case REDUX_MIN_U32: r = std::min(r, v); break;
            case REDUX_MIN_S32: r = (unsigned)std::min((int)r, (int)v); break;
            case REDUX_MAX_U32: r = std::max(r, v); break;
            case REDUX_MAX_S32: r = (unsigned)std::max((int)r, (int)v); break;
            case REDUX_AND: r &= v; break;
            case REDUX_OR: r |= v; break;
            default: r ^= v; break;  // REDUX_XOR
        }
    }
    for (int l = 0; l < WARP; ++l)
        if (lanes >> l & 1u) g.threads[base + l].coll.result = r;
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

// Performs group `index` of the warp, which has every lane it needs, and lets its lanes go on.
static void complete(int warp, int index) {
    Warp& w = g.warps[warp];
    const CollGroup grp = w.groups[index];
    w.groups[index] = w.groups[--w.ngroups];
    const int base = warp * WARP;
    const unsigned gone = needed_lanes(w, grp.kind, grp.mask) & w.exited;
    if (aligned_kind(grp.kind) && gone) {  // an .aligned operation without every lane is undefined
        report("warp collective mask", &g.threads[base + __builtin_ctz(grp.arrived)], grp.pc,
               std::string(coll_name(grp.kind)) + " needs every lane of the warp, but lanes " + lanes_text(gone) +
                   " have exited");
        abort_launch();
    }
    const unsigned lanes = grp.arrived;
    w.kind = grp.kind;  // the performers (wmma.cpp's too) read the collective from the warp
    w.mask = grp.mask;
    w.pc = grp.pc;
    switch (grp.kind) {
        case C_SYNCWARP: perform_syncwarp(w, lanes, base); break;
        case C_SHFL: perform_shfl(w, lanes, base); break;
        case C_VOTE: perform_vote(grp, lanes, base); break;
        case C_MATCH: perform_match(grp, lanes, base); break;
        case C_REDUX: perform_redux(grp, lanes, base); break;
        case C_LDSM: perform_ldmatrix(w, lanes, base); break;
        case C_MMA: perform_mma(w, lanes, base); break;
        default: wmma_perform(w, lanes); break;
    }
    w.kind = C_NONE;
    for (int l = 0; l < WARP; ++l)
        if (lanes & (1u << l)) make_ready(g.threads[base + l]);
}

// Completes every group of the warp whose needed lanes have all arrived or exited.
static void try_complete(int warp) {
    Warp& w = g.warps[warp];
    for (int i = 0; i < w.ngroups;) {
        const CollGroup& grp = w.groups[i];
        const unsigned live = needed_lanes(w, grp.kind, grp.mask) & ~w.exited;
        if ((grp.arrived & live) == live)
            complete(warp, i);  // moves the last group into slot i: look at i again
        else
            ++i;
    }
}

// A lane exited: a collective that names it no longer waits for it (and an .aligned one reports it).
void collective_lane_exited(int warp, int lane) {
    (void)lane;
    try_complete(warp);
}

// Lanes under one mask at different instructions: on sm_70+ each waits for the others forever.
[[noreturn]] static void report_divergence(Thread& t, const CollGroup& grp, int kind, int op, unsigned mask, void* pc) {
    std::string msg = "lane " + std::to_string(t.lane) + " reaches " + op_name(kind, op);
    if (!aligned_kind(kind)) msg += " (mask " + lanes_text(mask) + ")";
    msg += " while lanes " + lanes_text(grp.arrived) + " wait at " + op_name(grp.kind, grp.op);
    if (!aligned_kind(grp.kind)) msg += " (mask " + lanes_text(grp.mask) + ")";
    msg += grp.kind == kind && grp.op == op ? " elsewhere: the warp has diverged" : ": the warp has diverged";
    Thread& other = g.threads[t.warp * WARP + __builtin_ctz(grp.arrived)];
    report("divergent warp collective", &t, pc, msg, &other, grp.pc);
    abort_launch();
    __builtin_unreachable();
}

// The groups holding lanes that group `a` still needs.
static unsigned waits_for(const Warp& w, int a) {
    const unsigned need = needed_lanes(w, w.groups[a].kind, w.groups[a].mask) & ~w.exited;
    unsigned out = 0;
    for (int b = 0; b < w.ngroups; ++b)
        if (b != a && (w.groups[b].arrived & need)) out |= 1u << b;
    return out;
}

// The groups of a cycle through group h, h first, each waiting for lanes that wait at the next
// and the last for lanes of h's; empty if there is none. Waiting lanes leave only when their
// collective completes, so none of a cycle's ever does.
static std::vector<int> cycle_through(const Warp& w, int h) {
    int queue[WARP], parent[WARP];
    int head = 0, tail = 0;
    unsigned seen = 1u << h;
    for (unsigned m = waits_for(w, h); m; m &= m - 1) {
        const int b = __builtin_ctz(m);
        seen |= 1u << b;
        parent[b] = h;
        queue[tail++] = b;
    }
    while (head < tail) {
        const int b = queue[head++];
        const unsigned next = waits_for(w, b);
        if (next >> h & 1u) {
            std::vector<int> path;
            for (int x = b; x != h; x = parent[x]) path.push_back(x);
            path.push_back(h);
            std::reverse(path.begin(), path.end());
            return path;
        }
        for (unsigned m = next & ~seen; m; m &= m - 1) {
            const int c = __builtin_ctz(m);
            seen |= 1u << c;
            parent[c] = b;
            queue[tail++] = c;
        }
    }
    return {};
}

// Lanes under overlapping masks, each group waiting for lanes that wait at another: on a GPU the
// warp hangs. Two half-warps passing each other's masks, say.
[[noreturn]] static void report_cycle(Thread& t, const Warp& w, const std::vector<int>& cycle, void* pc) {
    std::string msg;
    for (size_t i = 0; i < cycle.size(); ++i) {
        const CollGroup& a = w.groups[cycle[i]];
        const CollGroup& next = w.groups[cycle[(i + 1) % cycle.size()]];
        msg += (i ? "; lanes " : "lanes ") + lanes_text(a.arrived) + " wait at " + op_name(a.kind, a.op) + " (mask " +
               lanes_text(a.mask) + ") for lanes " + lanes_text(needed_lanes(w, a.kind, a.mask) & next.arrived);
    }
    msg += cycle.size() == 2 ? ": neither collective can complete" : ": none of these collectives can complete";
    const CollGroup& other = w.groups[cycle[1]];
    report("warp collective mask", &t, pc, msg, &g.threads[t.warp * WARP + __builtin_ctz(other.arrived)], other.pc);
    abort_launch();
    __builtin_unreachable();
}

// The calling lane (t.coll filled in by the caller) joins the warp's group of its mask, or opens
// one, and waits until that collective is done. `op`: the qualifiers lanes must share.
static void meet(int kind, int op, unsigned mask, void* pc) {
    Thread& t = *g.cur;
    Warp& w = g.warps[t.warp];
    t.coll.kind = kind;
    t.coll.mask = mask;
    t.coll.pc = pc;
    if (!aligned_kind(kind) && !(mask & (1u << t.lane))) {
        report("warp collective mask", &t, pc,
               std::string(coll_name(kind)) + " with mask " + lanes_text(mask) + ", which does not name the calling lane");
    }
    int h = -1;
    for (int i = 0; i < w.ngroups && h < 0; ++i) {
        const CollGroup& grp = w.groups[i];
        if (grp.mask != mask) continue;
        if (grp.kind != kind || grp.op != op || (aligned_kind(kind) && grp.pc != pc))
            report_divergence(t, grp, kind, op, mask, pc);
        h = i;
    }
    if (h < 0) {  // at most 31 groups are pending: each holds a waiting lane, and this lane is in none
        h = w.ngroups++;
        w.groups[h] = CollGroup{};
        w.groups[h].kind = kind;
        w.groups[h].op = op;
        w.groups[h].mask = mask;
        w.groups[h].pc = pc;
    }
    w.groups[h].arrived |= 1u << t.lane;
    if (w.ngroups > 1) {
        const std::vector<int> cycle = cycle_through(w, h);
        if (!cycle.empty()) report_cycle(t, w, cycle, pc);
    }
    set_run(t, Run::Blocked);
    t.wait = WaitOn::Collective;
    t.wait_pc = pc;
    if (g.options & (OPT_BANKS | OPT_COUNT)) flush_bank_log(t.warp);
    try_complete(t.warp);
    if (t.run == Run::Blocked) block_current(WaitOn::Collective, pc);
}

// wmma.cpp's collectives: .aligned, no qualifiers of their own to match.
void rendezvous(int kind, unsigned mask, void* pc) { meet(kind, 0, mask, pc); }

// ---- entry points -----------------------------------------------------------------------------

void syncwarp(unsigned mask) { meet(C_SYNCWARP, 0, mask, ATTN_CALLER()); }

unsigned shfl(unsigned mask, unsigned value, int lane_arg, int width, int mode) {
    Thread& t = *g.cur;
    t.coll.value = value;
    t.coll.lane_arg = lane_arg;
    t.coll.width = width;
    t.coll.mode = mode;
    meet(C_SHFL, mode & 3, mask, ATTN_CALLER());
    return t.coll.result;
}

unsigned vote(unsigned mask, int pred, int mode) {
    Thread& t = *g.cur;
    t.coll.value = pred != 0;
    meet(C_VOTE, mode, mask, ATTN_CALLER());
    return t.coll.result;
}

unsigned match(unsigned mask, unsigned long long value, int mode) {
    Thread& t = *g.cur;
    t.coll.value = (unsigned)value;
    t.coll.value_hi = (unsigned)(value >> 32);
    meet(C_MATCH, mode, mask, ATTN_CALLER());
    return t.coll.result;
}

unsigned redux(unsigned mask, unsigned value, int op) {
    Thread& t = *g.cur;
    t.coll.value = value;
    meet(C_REDUX, op, mask, ATTN_CALLER());
    return t.coll.result;
}

// activemask (PTX ISA 9.7.13.11) reads the lanes executing it together. The executor takes those
// to be the lanes that reach the same __activemask call before their warp can go on any other
// way: a lane waits there until every other lane of its warp has exited or waits somewhere (a
// barrier, a collective, this or another __activemask), and the answer is the lanes waiting at
// its call. Lanes that took the other arm of a branch, or returned early, are not in it, as on a
// GPU; no lane is in it that a GPU could not have converged there. (Which lanes a GPU converges
// at all is the hardware's choice, which is why CUDA warns against building a collective's mask
// from it.)
unsigned activemask() {
    Thread& t = *g.cur;
    g.warps[t.warp].at_activemask |= 1u << t.lane;
    block_current(WaitOn::Active, ATTN_CALLER());  // polls: it returns at once if no other lane can run
    return t.coll.result;
}

// When no lane of the warp can run, each __activemask call with lanes waiting answers them.
void activemask_poll(int warp) {
    Warp& w = g.warps[warp];
    if (!w.at_activemask || w.ready) return;
    const int base = warp * WARP;
    for (unsigned left = w.at_activemask; left;) {
        void* pc = g.threads[base + __builtin_ctz(left)].wait_pc;
        unsigned same = 0;
        for (unsigned m = left; m; m &= m - 1)
            if (g.threads[base + __builtin_ctz(m)].wait_pc == pc) same |= 1u << __builtin_ctz(m);
        for (unsigned m = same; m; m &= m - 1) {
            Thread& x = g.threads[base + __builtin_ctz(m)];
            x.coll.result = same;
            make_ready(x);
        }
        left &= ~same;
    }
    w.at_activemask = 0;
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
