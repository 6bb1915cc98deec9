// The CPU executor's <cuda_fp16.h>: IEEE binary16 storage and the conversions the kernels use,
// bit-exact with the GPU's (round to nearest even; subnormals, infinities and NaN kept).
#pragma once
#include "attn_cpu/prelude.h"  // the vector types (float2); it includes this header at its end
#include <stdint.h>
#include <string.h>

struct __attribute__((aligned(2))) __half {
    unsigned short __x;
};
struct __attribute__((aligned(4))) __half2 {
    __half x, y;
};

namespace attn_cpu {
inline unsigned short float_to_half_bits(float f) {
    uint32_t x;
    __builtin_memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u)  // inf or NaN (NaN stays a quiet NaN)
        return (unsigned short)(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0u));
    if (abs >= 0x477ff000u)  // rounds to above 65504: infinity
        return (unsigned short)(sign | 0x7c00u);
    if (abs < 0x38800000u) {  // below 2^-14: a subnormal half (or zero)
        if (abs < 0x33000000u) return (unsigned short)sign;  // below half the smallest subnormal
        const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
        const int shift = 126 - (int)(abs >> 23);  // 14 .. 24
        const uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        const uint32_t r = q + (rem > halfway || (rem == halfway && (q & 1u)));
        return (unsigned short)(sign | r);
    }
    uint32_t h = ((abs - 0x38000000u) >> 13);  // rebias the exponent, keep 10 mantissa bits
    const uint32_t rem = abs & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: fine
    return (unsigned short)(sign | h);
}
inline float half_bits_to_float(unsigned short h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    if (exp == 0x1fu) {
        x = sign | 0x7f800000u | (mant << 13);
    } else if (exp == 0) {
        if (mant == 0) {
            x = sign;
        } else {  // subnormal: normalise
            int e = -1;
            do { mant <<= 1; ++e; } while (!(mant & 0x400u));
            x = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ffu) << 13);
        }
    } else {
        x = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float f;
    __builtin_memcpy(&f, &x, 4);
    return f;
}
}  // namespace attn_cpu

inline __half __float2half(float f) { return __half{attn_cpu::float_to_half_bits(f)}; }
inline __half __float2half_rn(float f) { return __float2half(f); }
inline float __half2float(__half h) { return attn_cpu::half_bits_to_float(h.__x); }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__float2half(a), __float2half(b)}; }
inline __half2 __float2half2_rn(float a) { return __floats2half2_rn(a, a); }
inline float __low2float(__half2 h) { return __half2float(h.x); }
inline float __high2float(__half2 h) { return __half2float(h.y); }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }
