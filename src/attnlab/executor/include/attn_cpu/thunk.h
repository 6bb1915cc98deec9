// Entry points the executor's Python side calls, one pair per extern "C" kernel, appended to the
// kernel's translation unit by attnlab.executor.build:
//   attn_cpu_thunk_<entry>(void** args)  calls the kernel with *args[i] as argument i (the layout of
//                                        cuLaunchKernel's kernelParams);
//   attn_cpu_signature_<entry>()         one letter per parameter (p pointer, i int, u unsigned,
//                                        f float, l long long, d double), so Python can check the
//                                        arguments it passes before any launch.
#pragma once
#include <type_traits>
#include <utility>

namespace attn_cpu {

template <class T>
constexpr char type_code() {
    return std::is_pointer<T>::value                  ? 'p'
           : std::is_same<T, int>::value              ? 'i'
           : std::is_same<T, unsigned>::value         ? 'u'
           : std::is_same<T, float>::value            ? 'f'
           : std::is_same<T, long long>::value        ? 'l'
           : std::is_same<T, double>::value           ? 'd'
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
