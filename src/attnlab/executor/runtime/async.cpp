// cp.async and the other PTX instructions behind kernels/ptx.cuh, and shared-memory addressing.
//
// cp.async.cg.shared.global [dst], [src], 16, src_size (PTX ISA 9.7.9.25.3.1): src_size bytes are
// read (0: none) and the rest of the 16 are zero-filled. The copy belongs to the thread's current
// group; cp.async.commit_group closes the group (an empty one counts too); cp.async.wait_group N
// waits until at most the N most recent groups are pending (9.7.9.25.3.2-3). The executor reads
// the source at issue, writes the poison pattern over the destination, marks it pending, and
// writes the data at the wait that completes its group: a read before that wait, by any thread,
// is reported, and sees poison. The data is then written by the issuing thread, so another thread
// sees it only after a barrier that orders it after the wait.
#include <cstring>

#include "runtime.h"

namespace attn_cpu {

uint8_t* shared_pointer(unsigned offset);

unsigned shared_address(const void* generic) {
    const uintptr_t a = (uintptr_t)generic, lo = (uintptr_t)g.shared;
    if (a - lo >= SHARED_LIMIT + STATIC_SHARED_LIMIT + SHARED_SLACK) {
        report("shared out of bounds", g.cur, ATTN_CALLER(), "__cvta_generic_to_shared of an address outside shared memory");
        return 0;
    }
    return SHARED_WINDOW + (unsigned)(a - lo);
}

void* dynamic_shared(unsigned align, const char* name, size_t element) {
    (void)align;  // the arena is page-aligned
    if (g.dynamic_name.empty()) {
        g.dynamic_name = name;
        g.dynamic_element = element ? element : 1;
    }
    return g.shared;
}

void* static_shared(int id, size_t bytes, size_t align, const char* name, size_t element, int rank, const size_t* dims) {
    for (const StaticSlot& slot : g.static_slots)
        if (slot.id == id) return g.shared + SHARED_LIMIT + slot.offset;
    size_t offset = (g.static_used + align - 1) / align * align;
    if (offset + bytes > STATIC_SHARED_LIMIT) {
        report("shared out of bounds", g.cur, ATTN_CALLER(),
               std::string("static __shared__ declarations exceed 48 KB (at ") + name + ")");
        abort_launch();
    }
    g.static_slots.push_back(StaticSlot{id, offset, bytes, element ? element : 1, name, rank, dims});
    g.static_used = offset + bytes;
    return g.shared + SHARED_LIMIT + offset;
}

// "name[i][j]" for the element holding byte `at` of an array of `element`-byte elements with the
// given extents (row-major), "+ byte k" when the byte is not the element's first.
static std::string element_name(const std::string& name, size_t at, size_t element, int rank, const size_t* dims) {
    std::string out = name;
    size_t index = at / element;
    if (rank > 0) {
        size_t idx[4] = {};
        for (int d = rank - 1; d > 0; --d) {
            idx[d] = index % dims[d];
            index /= dims[d];
        }
        idx[0] = index;
        for (int d = 0; d < rank; ++d) out += "[" + std::to_string(idx[d]) + "]";
    }
    if (at % element) out += " (byte " + std::to_string(at % element) + ")";
    return out;
}

std::string shared_name(unsigned offset) {
    if (offset < SHARED_LIMIT) {
        if (g.dynamic_name.empty()) return "dynamic shared byte " + std::to_string(offset);
        const size_t unbounded[1] = {0};
        return element_name(g.dynamic_name, offset, g.dynamic_element, 1, unbounded);
    }
    const size_t at = offset - SHARED_LIMIT;
    for (const StaticSlot& slot : g.static_slots)
        if (at >= slot.offset && at < slot.offset + slot.bytes)
            return element_name(slot.name, at - slot.offset, slot.element, slot.rank, slot.dims);
    // Past every slot: named from the declaration it overruns (the one ending closest before it).
    const StaticSlot* before = nullptr;
    for (const StaticSlot& slot : g.static_slots)
        if (slot.offset + slot.bytes <= at && (!before || slot.offset > before->offset)) before = &slot;
    if (before)
        return element_name(before->name, at - before->offset, before->element, 1, nullptr) + " (past the end of " +
               before->name + ")";
    return "static shared byte " + std::to_string(at);
}

void cp_async_16(unsigned dst, const void* src, int src_bytes) {
    Thread& t = *g.cur;
    void* pc = ATTN_CALLER();
    const unsigned off = dst - SHARED_WINDOW;
    if (dst < SHARED_WINDOW || (dst & 15u) || !shared_in_bounds(off, 16)) {
        report(dst & 15u ? "misaligned access" : "shared out of bounds", &t, pc,
               "cp.async destination " + std::to_string((long long)dst - SHARED_WINDOW) +
                   (dst & 15u ? " is not 16-byte aligned" : " is outside the block's shared memory"));
        return;
    }
    if (src_bytes < 0 || src_bytes > 16) {
        report("cp.async size", &t, pc, "cp.async src-size " + std::to_string(src_bytes) + " is outside 0..16");
        return;
    }
    AsyncCopy c{off, t.next_group, pc, {}};
    if (src_bytes > 0) {
        if ((uintptr_t)src & 15u) report("misaligned access", &t, pc, "cp.async source is not 16-byte aligned");
        checked_access(t, src, (unsigned)src_bytes, false, pc);
        if (!g.aborted) memcpy(c.data, src, (size_t)src_bytes);
    }
    async_issue_shadow(t, off, pc);
    if (g.options & (OPT_BANKS | OPT_COUNT)) log_shared_access(t, off, 16, 1, pc, true);
    count_site(K_CP_ASYNC, pc, 1, 0, src_bytes);
    trace_event(t, E_CP_ASYNC, pc, off, 16, t.next_group, -1, (unsigned)src_bytes);
    memset(shared_pointer(off), 0xff, 16);  // poison until the data lands
    t.copies.push_back(c);
}

void cp_async_commit() {
    Thread& t = *g.cur;
    count_site(K_COMMIT, ATTN_CALLER(), 1, 0, 0);
    trace_event(t, E_COMMIT, ATTN_CALLER(), 0, 0, t.next_group);
    ++t.next_group;
}

void cp_async_wait(int pending) {
    Thread& t = *g.cur;
    void* pc = ATTN_CALLER();
    // Groups 0 .. next_group-1 are committed; all but the newest `pending` must be complete.
    const int complete_below = t.next_group - pending;
    count_site(K_WAIT, pc, 1, 0, 0);
    trace_event(t, E_WAIT, pc, (uint64_t)(complete_below > 0 ? complete_below : 0), 0, pending);
    size_t kept = 0;
    for (size_t i = 0; i < t.copies.size(); ++i) {
        AsyncCopy& c = t.copies[i];
        if (c.group < complete_below) {
            memcpy(shared_pointer(c.dst), c.data, 16);
            async_land_shadow(t, c.dst, pc);
        } else {
            t.copies[kept++] = c;
        }
    }
    t.copies.resize(kept);
}

float ex2_approx_ftz(float x) {
    // ex2.approx.ftz.f32 (PTX ISA 9.7.3.22): 2^x, subnormal inputs and results flushed to zero;
    // the hardware's result is within 2 ulp, this one is exact to float rounding.
    count_site(K_EXP, ATTN_CALLER(), 1, 0, 0);
    if (fabsf(x) < 1.17549435e-38f) x = 0.f;
    const float y = exp2f(x);
    return y < 1.17549435e-38f ? 0.f : y;
}

void store_global_16(void* dst, uint4 v) {
    Thread& t = *g.cur;
    checked_access(t, dst, 16, true, ATTN_CALLER());
    if (!g.aborted) memcpy(dst, &v, 16);
}

}  // namespace attn_cpu
