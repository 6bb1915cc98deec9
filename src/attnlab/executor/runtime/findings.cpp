// Findings: what a sanitizer would report, one per hazard (its kind and pair of source sites, as
// compute-sanitizer's racecheck groups them), with the first occurrence's message, block, warp and
// lane, how many times it happened, and how many distinct bytes and threads it touched.
#include <dlfcn.h>

#include <cstring>

#include "runtime.h"

namespace attn_cpu {

constexpr size_t MAX_FINDINGS = 200;

std::string thread_name(const Thread& t) {
    return "warp " + std::to_string(t.warp) + " lane " + std::to_string(t.lane);
}

std::string lanes_text(unsigned mask) {
    if (mask == 0xffffffffu) return "0-31";
    std::string out;
    for (int l = 0; l < 32;) {
        if (!(mask & (1u << l))) { ++l; continue; }
        int e = l;
        while (e + 1 < 32 && (mask & (1u << (e + 1)))) ++e;
        if (!out.empty()) out += ",";
        out += e > l ? std::to_string(l) + "-" + std::to_string(e) : std::to_string(l);
        l = e + 1;
    }
    return out.empty() ? "none" : out;
}

constexpr size_t MAX_DISTINCT = 1 << 20;  // bytes or threads remembered per finding

static void note_touch(Finding& f, Thread* t, uint64_t where, unsigned nbytes) {
    if (t && f.threads.size() < MAX_DISTINCT) f.threads.insert((uint64_t)g.block_linear * MAX_THREADS + t->tid);
    for (unsigned i = 0; i < nbytes && f.bytes.size() < MAX_DISTINCT; ++i) f.bytes.insert(where + i);
}

void report(const char* kind, Thread* t, void* pc, const std::string& message, Thread* other, void* pc2,
            uint64_t where, unsigned nbytes) {
    if (where == ~0ull) nbytes = 0;
    for (Finding& f : g.findings)
        if (f.kind == kind && f.pc == pc && f.pc2 == pc2) {
            ++f.count;
            note_touch(f, t, where, nbytes);
            return;
        }
    if (g.findings.size() >= MAX_FINDINGS) return;
    Finding f;
    f.kind = kind;
    f.message = message;
    f.block = view.block_idx;
    if (t) { f.warp = t->warp; f.lane = t->lane; }
    if (other) { f.other_warp = other->warp; f.other_lane = other->lane; }
    f.pc = pc;
    f.pc2 = pc2;
    note_touch(f, t, where, nbytes);
    g.findings.push_back(std::move(f));
}

// An address in the kernel library as an offset addr2line understands (0 when unknown). A return
// address points after its call: one byte back lands inside the calling instruction.
unsigned long module_offset(void* pc) {
    if (!pc) return 0;
    Dl_info info;
    if (!dladdr(pc, &info) || !info.dli_fbase) return 0;
    return (unsigned long)((uintptr_t)pc - 1 - (uintptr_t)info.dli_fbase);
}

std::string pc_token(void* pc) {
    char buf[40];
    snprintf(buf, sizeof buf, "{pc:%lx}", module_offset(pc));
    return buf;
}

std::string findings_text() {
    std::string out;
    for (const Finding& f : g.findings) {
        char head[256];
        snprintf(head, sizeof head, "%s\t%ld\t%u,%u,%u\t%d\t%d\t%lx\t%d\t%d\t%lx\t%zu\t%zu\t", f.kind.c_str(),
                 f.count, f.block.x, f.block.y, f.block.z, f.warp, f.lane, module_offset(f.pc), f.other_warp,
                 f.other_lane, module_offset(f.pc2), f.bytes.size(), f.threads.size());
        out += head;
        for (char c : f.message) out += (c == '\t' || c == '\n') ? ' ' : c;
        out += '\n';
    }
    return out;
}

}  // namespace attn_cpu
