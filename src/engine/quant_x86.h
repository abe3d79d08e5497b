/*
 * Internal to quant_x86.c / quant_x86_f16.c: target attributes and the
 * horizontal sums both use. The blocked kernels must reproduce the
 * per-token dots' bits, so they share these rather than restate them.
 */
#ifndef GPUPOOL_ENGINE_QUANT_X86_H
#define GPUPOOL_ENGINE_QUANT_X86_H

#include "engine/quant_impl.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define T_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))

T_AVX2 static inline float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

T_AVX2 static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* gpe_bf16_to_fp32, inline: a call in a kernel's tail costs the vector
 * registers live across it. */
static inline float bf2f(uint16_t h)
{
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#endif
#endif
