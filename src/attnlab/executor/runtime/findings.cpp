// Findings: what a sanitizer would report, deduplicated by kind and source location, with the
// first occurrence's block, warp and lane and a count of the rest.
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

void report(const char* kind, Thread* t, void* pc, const std::string& message, Thread* other, void* pc2) {
    for (Finding& f : g.findings)
        if (f.kind == kind && f.pc == pc && f.pc2 == pc2) {
            ++f.count;
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
    g.findings.push_back(f);
}

// An address in the kernel library as an offset addr2line understands (0 when unknown). A return
// address points after its call: one byte back lands inside the calling instruction.
unsigned long module_offset(void* pc) {
    if (!pc) return 0;
    Dl_info info;
    if (!dladdr(pc, &info) || !info.dli_fbase) return 0;
    return (unsigned long)((uintptr_t)pc - 1 - (uintptr_t)info.dli_fbase);
}

std::string findings_text() {
    std::string out;
    for (const Finding& f : g.findings) {
        char head[256];
        snprintf(head, sizeof head, "%s\t%ld\t%u,%u,%u\t%d\t%d\t%lx\t%d\t%d\t%lx\t", f.kind.c_str(), f.count,
                 f.block.x, f.block.y, f.block.z, f.warp, f.lane, module_offset(f.pc), f.other_warp, f.other_lane,
                 module_offset(f.pc2));
        out += head;
        for (char c : f.message) out += (c == '\t' || c == '\n') ? ' ' : c;
        out += '\n';
    }
    return out;
}

}  // namespace attn_cpu
