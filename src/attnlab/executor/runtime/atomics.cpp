// Atomic functions on shared and global memory (CUDA C++ Programming Guide, "Atomic Functions";
// PTX ISA 9.7.13.5 atom), and the kernel's printf.
//
// A fiber runs alone until it waits, so a read-modify-write here is atomic by construction. What
// the executor adds is the check: the access is bounds-checked like any other, marked atomic in
// the shadow (runtime/memory.cpp), so that two atomics never race while a plain access unordered
// with an atomic one does.
#include <cstdarg>
#include <cstring>

#include "runtime.h"

namespace attn_cpu {

namespace {

template <class T>
T apply(int op, T old, T v, T compare) {
    switch (op) {
        case A_ADD: return (T)(old + v);
        case A_SUB: return (T)(old - v);
        case A_EXCH: return v;
        case A_MIN: return v < old ? v : old;
        case A_MAX: return v > old ? v : old;
        case A_CAS: return old == compare ? v : old;
        default: return old;
    }
}

template <class T>
T apply_bits(int op, T old, T v, T compare) {
    switch (op) {
        case A_AND: return old & v;
        case A_OR: return old | v;
        case A_XOR: return old ^ v;
        case A_INC: return old >= v ? 0 : old + 1;  // ((old >= v) ? 0 : (old + 1)), as CUDA specifies
        case A_DEC: return (old == 0 || old > v) ? v : old - 1;
        default: return apply(op, old, v, compare);
    }
}

template <class T, bool Bits>
uint64_t run(void* p, int op, uint64_t operand, uint64_t compare) {
    T old, v, c;
    memcpy(&old, p, sizeof(T));
    memcpy(&v, &operand, sizeof(T));
    memcpy(&c, &compare, sizeof(T));
    T result;
    if constexpr (Bits)
        result = apply_bits<T>(op, old, v, c);
    else
        result = apply<T>(op, old, v, c);
    memcpy(p, &result, sizeof(T));
    uint64_t bits = 0;
    memcpy(&bits, &old, sizeof(T));
    return bits;
}

}  // namespace

uint64_t atomic_rmw(void* p, int op, int type, uint64_t operand, uint64_t compare) {
    Thread& t = *g.cur;
    void* pc = ATTN_CALLER();
    const unsigned size = (type == T_U64 || type == T_F64 || type == T_I64) ? 8 : 4;
    if ((uintptr_t)p & (size - 1)) {
        report("misaligned access", &t, pc, "an atomic on " + std::to_string(size) + " bytes at an address that is not " +
                                                std::to_string(size) + "-byte aligned");
        return 0;
    }
    // An access out of bounds is reported and not performed (the GPU would fault or corrupt).
    if (!atomic_access(t, p, size, pc)) return 0;
    switch (type) {
        case T_I32: return run<int32_t, true>(p, op, operand, compare);
        case T_U32: return run<uint32_t, true>(p, op, operand, compare);
        case T_U64: return run<uint64_t, true>(p, op, operand, compare);
        case T_I64: return run<int64_t, true>(p, op, operand, compare);
        case T_F32: return run<float, false>(p, op, operand, compare);
        default: return run<double, false>(p, op, operand, compare);
    }
}

// printf: formatted into the launch's text (at most 1 MB, then one line saying it stopped).
int device_printf(const char* format, ...) {
    constexpr size_t LIMIT = 1 << 20;
    if (g.printed.size() >= LIMIT) return 0;
    char buf[1024];
    va_list args;
    va_start(args, format);
    const int n = vsnprintf(buf, sizeof buf, format, args);
    va_end(args);
    if (n < 0) return n;
    g.printed.append(buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
    if (g.printed.size() >= LIMIT) g.printed += "\n[printf output stopped at 1 MB]\n";
    return n;
}

}  // namespace attn_cpu
