// Entry points the executor's Python side calls, one pair per extern "C" kernel, appended to the
// kernel's translation unit by attnlab.executor.build:
//   attn_cpu_thunk_<entry>(void** args)  calls the kernel with *args[i] as argument i (the layout of
//                                        cuLaunchKernel's kernelParams);
//   attn_cpu_signature_<entry>()         one letter per parameter (p pointer, P pointer to const,
//                                        b bool, c char, C unsigned char, s short, S unsigned
//                                        short, i int, u unsigned, l long long, L unsigned long
//                                        long, f float, d double, h __half; ? anything else), so
//                                        Python can check the arguments before any launch.
#pragma once
#include <type_traits>
#include <utility>

namespace attn_cpu {

template <class T>
constexpr char type_code() {
    using P = std::remove_pointer_t<T>;
    constexpr bool wide = sizeof(long) == 8;
    return std::is_pointer<T>::value                         ? (std::is_const<P>::value ? 'P' : 'p')
           : std::is_same<T, bool>::value                    ? 'b'
           : std::is_same<T, char>::value                    ? 'c'
           : std::is_same<T, signed char>::value             ? 'c'
           : std::is_same<T, unsigned char>::value           ? 'C'
           : std::is_same<T, short>::value                   ? 's'
           : std::is_same<T, unsigned short>::value          ? 'S'
           : std::is_same<T, int>::value                     ? 'i'
           : std::is_same<T, unsigned>::value                ? 'u'
           : std::is_same<T, long long>::value               ? 'l'
           : (std::is_same<T, long>::value && wide)          ? 'l'
           : std::is_same<T, unsigned long long>::value      ? 'L'
           : (std::is_same<T, unsigned long>::value && wide) ? 'L'
           : std::is_same<T, float>::value                   ? 'f'
           : std::is_same<T, double>::value                  ? 'd'
           : std::is_same<T, __half>::value                  ? 'h'
                                                             : '?';
}

// Reads the argument array, which Python owns: not instrumented, so not a global access.
template <class... A, size_t... I>
__attribute__((no_sanitize("thread"), noinline)) void invoke(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(args[I])...);
}
template <class... A>
void invoke(void (*kernel)(A...), void** args) {
    invoke(kernel, args, std::index_sequence_for<A...>{});
}
template <class... A>
const char* signature(void (*)(A...)) {
    static const char codes[] = {type_code<std::remove_cv_t<A>>()..., 0};
    return codes;
}

}  // namespace attn_cpu

#define ATTN_CPU_THUNK(entry)                                                                           \
    extern "C" __attribute__((visibility("default"))) void attn_cpu_thunk_##entry(void** args) {        \
        attn_cpu::invoke(entry, args);                                                                  \
    }                                                                                                   \
    extern "C" __attribute__((visibility("default"))) const char* attn_cpu_signature_##entry() {       \
        return attn_cpu::signature(entry);                                                              \
    }
