/*
 * quant_x86: AVX2/FMA/F16C and AVX-512 (F, BW, VL, DQ) dot products.
 *
 * Each function carries its own target attribute, so the file builds with
 * the project's generic flags and quant.c picks the kernels once at run time
 * (__builtin_cpu_supports). Integer parts use the maddubs trick: the weight
 * is the sign source (|w| as the unsigned operand, a*sign(w) as the signed
 * one), which is exact for every weight byte including -128 since
 * activations stay within [-127, 127].
 */
#include "engine/quant_impl.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define T_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))

bool gpe__have_x86_kernels(void) { return true; }

/* ================================================================ AVX2 */

T_AVX2 static inline float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

T_AVX2 static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* Sum of products of 32 signed weight bytes with 32 activation bytes, as 8 int32. */
T_AVX2 static inline __m256i dot32_i8(__m256i w, __m256i a)
{
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

T_AVX2 static float avx2_dot_f32(int64_t n, const void *w, const void *a)
{
    const float *x = w, *y = a;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), s0);
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++)
        s += x[i] * y[i];
    return s;
}

T_AVX2 static float avx2_dot_f16(int64_t n, const void *w, const void *a)
{
    const uint16_t *x = w, *y = a;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))),
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i))), s0);
        s1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i + 8))),
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i + 8))), s1);
    }
    float s = hsum256(_mm256_add_ps(s0, s1));
    for (; i < n; i++)
        s += h2f(x[i]) * h2f(y[i]);
    return s;
}

T_AVX2 static float avx2_dot_bf16(int64_t n, const void *w, const void *a)
{
    const uint16_t *x = w;
    const float *y = a;
    __m256 s0 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        s0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)),
                             _mm256_loadu_ps(y + i), s0);
    }
    float s = hsum256(s0);
    for (; i < n; i++)
        s += gpe_bf16_to_fp32(x[i]) * y[i];
    return s;
}

T_AVX2 static float avx2_dot_q8_0(int64_t n, const void *w, const void *a)
{
    const gpe_block_q8_0 *x = w, *y = a;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GPE_QK; i++) {
        const __m256i p = dot32_i8(_mm256_loadu_si256((const __m256i *)x[i].qs),
                                   _mm256_loadu_si256((const __m256i *)y[i].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), _mm256_cvtepi32_ps(p),
                              acc);
    }
    return hsum256(acc);
}

/* 32 Q4_0 values as signed bytes -8..7, in element order. */
T_AVX2 static inline __m256i q4_0_unpack(const uint8_t *qs)
{
    const __m128i q = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0xF);
    const __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
    return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
}

T_AVX2 static float avx2_dot_q4_0(int64_t n, const void *w, const void *a)
{
    const gpe_block_q4_0 *x = w;
    const gpe_block_q8_0 *y = a;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GPE_QK; i++) {
        const __m256i p = dot32_i8(q4_0_unpack(x[i].qs), _mm256_loadu_si256((const __m256i *)y[i].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), _mm256_cvtepi32_ps(p),
                              acc);
    }
    return hsum256(acc);
}

/* Branch-free unpack of the 8 six-bit scales and mins of a Q4_K/Q5_K block
 * (the packing gpe__scale_min_k4 reads one at a time). */
static inline void kq_unpack(const uint8_t *q, uint8_t sc[8], uint8_t mn[8])
{
    uint32_t a, b, c;
    memcpy(&a, q, 4);
    memcpy(&b, q + 4, 4);
    memcpy(&c, q + 8, 4);
    const uint32_t s0 = a & 0x3f3f3f3fu, m0 = b & 0x3f3f3f3fu;
    const uint32_t s1 = (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);
    const uint32_t m1 = ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4);
    memcpy(sc, &s0, 4);
    memcpy(sc + 4, &s1, 4);
    memcpy(mn, &m0, 4);
    memcpy(mn + 4, &m1, 4);
}

/* sum_j mn[j] * (bsums[2j] + bsums[2j+1]) as 4 int32 lanes. */
T_AVX2 static inline __m128i kq_mins(const uint8_t mn[8], const int16_t *bsums)
{
    const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bsums),
                                         _mm_loadu_si128((const __m128i *)(bsums + 8)));
    return _mm_madd_epi16(pairs, _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn)));
}

/* The 8 scales as int16 in both 128-bit lanes. */
T_AVX2 static inline __m256i kq_scales256(const uint8_t sc[8])
{
    return _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
}

/* pshufb patterns: all int16 lanes = scale k. */
T_AVX2 static inline __m256i kq_pick(int k)
{
    return _mm256_set1_epi16((short)(((2 * k + 1) << 8) | (2 * k)));
}

T_AVX2 static float avx2_dot_q4_k(int64_t n, const void *w, const void *a)
{
    const gpe_block_q4_k *x = w;
    const gpe_block_q8_k *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < n / GPE_QK_K; i++) {
        uint8_t sc[8], mn[8];
        kq_unpack(x[i].scales, sc, mn);
        const float da = y[i].d;
        accm = _mm_fmadd_ps(_mm_set1_ps(h2f(x[i].dmin) * da), _mm_cvtepi32_ps(kq_mins(mn, y[i].bsums)),
                            accm);
        const __m256i scv = kq_scales256(sc);
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
            const __m256i lo = _mm256_and_si256(q, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            const __m256i a0 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c));
            const __m256i a1 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c + 32));
            const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a0),
                                                 _mm256_shuffle_epi8(scv, kq_pick(2 * c)));
            const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a1),
                                                 _mm256_shuffle_epi8(scv, kq_pick(2 * c + 1)));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * da), _mm256_cvtepi32_ps(sumi), acc);
    }
    __m128 m = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return hsum256(acc) - _mm_cvtss_f32(m);
}

T_AVX2 static float avx2_dot_q5_k(int64_t n, const void *w, const void *a)
{
    const gpe_block_q5_k *x = w;
    const gpe_block_q8_k *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < n / GPE_QK_K; i++) {
        uint8_t sc[8], mn[8];
        kq_unpack(x[i].scales, sc, mn);
        const float da = y[i].d;
        accm = _mm_fmadd_ps(_mm_set1_ps(h2f(x[i].dmin) * da), _mm_cvtepi32_ps(kq_mins(mn, y[i].bsums)),
                            accm);
        const __m256i scv = kq_scales256(sc);
        __m256i qh = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
            /* bit 2c of qh -> +16 on the low nibbles, bit 2c+1 -> on the high ones */
            const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(qh, one), 4);
            const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4);
            qh = _mm256_srli_epi16(qh, 2);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), h0);
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h1);
            const __m256i a0 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c));
            const __m256i a1 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c + 32));
            const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a0),
                                                 _mm256_shuffle_epi8(scv, kq_pick(2 * c)));
            const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a1),
                                                 _mm256_shuffle_epi8(scv, kq_pick(2 * c + 1)));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * da), _mm256_cvtepi32_ps(sumi), acc);
    }
    __m128 m = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return hsum256(acc) - _mm_cvtss_f32(m);
}

/* Q6_K: values are q-32 with q in 0..63; the -32 is folded in through the
 * activation's per-16 sums: sum sc*q*a - 32*sum sc*bsum. */
static inline int q6_corr(const int8_t *scales, const int16_t *bsums)
{
    int s = 0;
    for (int g = 0; g < 16; g++)
        s += scales[g] * bsums[g];
    return 32 * s;
}

T_AVX2 static float avx2_dot_q6_k(int64_t n, const void *w, const void *a)
{
    const gpe_block_q6_k *x = w;
    const gpe_block_q8_k *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    float accc = 0.0f;
    for (int64_t i = 0; i < n / GPE_QK_K; i++) {
        const uint8_t *ql = x[i].ql, *qhp = x[i].qh;
        const int8_t *sc = x[i].scales, *qa = y[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++, ql += 64, qhp += 32, sc += 8, qa += 128) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)qhp);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
            for (int k = 0; k < 4; k++) {
                const __m256i av = _mm256_loadu_si256((const __m256i *)(qa + 32 * k));
                const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], av), s));
            }
        }
        const float d = h2f(x[i].d) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        accc += d * (float)q6_corr(x[i].scales, y[i].bsums);
    }
    return hsum256(acc) - accc;
}

void gpe__kernels_avx2(gpe__kernels *k)
{
    k->dot[GPE_TYPE_F32] = avx2_dot_f32;
    k->dot[GPE_TYPE_F16] = avx2_dot_f16;
    k->dot[GPE_TYPE_BF16] = avx2_dot_bf16;
    k->dot[GPE_TYPE_Q8_0] = avx2_dot_q8_0;
    k->dot[GPE_TYPE_Q4_0] = avx2_dot_q4_0;
    k->dot[GPE_TYPE_Q4_K] = avx2_dot_q4_k;
    k->dot[GPE_TYPE_Q5_K] = avx2_dot_q5_k;
    k->dot[GPE_TYPE_Q6_K] = avx2_dot_q6_k;
}

/* ============================================================== AVX-512 */

/* Products of 64 signed weight bytes with 64 activation bytes, as 16 int32. */
T_AVX512 static inline __m512i dot64_i8(__m512i w, __m512i a)
{
    const __mmask64 neg = _mm512_movepi8_mask(w);
    const __m512i sa = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(w), sa), _mm512_set1_epi16(1));
}

T_AVX512 static inline __m512i cat256(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

T_AVX512 static inline __m512 scale2(float d0, float d1)
{
    return _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
}

T_AVX512 static float avx512_dot_f32(int64_t n, const void *w, const void *a)
{
    const float *x = w, *y = a;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), _mm512_loadu_ps(y + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), _mm512_loadu_ps(y + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16)
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), s0);
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

T_AVX512 static float avx512_dot_f16(int64_t n, const void *w, const void *a)
{
    const uint16_t *x = w, *y = a;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))),
                             _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i))), s0);
        s1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i + 16))),
                             _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i + 16))), s1);
    }
    if (i + 16 <= n) {
        s0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))),
                             _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i))), s0);
        i += 16;
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    for (; i < n; i++)
        s += h2f(x[i]) * h2f(y[i]);
    return s;
}

T_AVX512 static float avx512_dot_bf16(int64_t n, const void *w, const void *a)
{
    const uint16_t *x = w;
    const float *y = a;
    __m512 s0 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + i)));
        s0 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), _mm512_loadu_ps(y + i), s0);
    }
    float s = _mm512_reduce_add_ps(s0);
    for (; i < n; i++)
        s += gpe_bf16_to_fp32(x[i]) * y[i];
    return s;
}

T_AVX512 static float avx512_dot_q8_0(int64_t n, const void *w, const void *a)
{
    const gpe_block_q8_0 *x = w, *y = a;
    const int64_t nb = n / GPE_QK;
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i wv = cat256(_mm256_loadu_si256((const __m256i *)x[i].qs),
                                  _mm256_loadu_si256((const __m256i *)x[i + 1].qs));
        const __m512i av = cat256(_mm256_loadu_si256((const __m256i *)y[i].qs),
                                  _mm256_loadu_si256((const __m256i *)y[i + 1].qs));
        acc = _mm512_fmadd_ps(scale2(h2f(x[i].d) * h2f(y[i].d), h2f(x[i + 1].d) * h2f(y[i + 1].d)),
                              _mm512_cvtepi32_ps(dot64_i8(wv, av)), acc);
    }
    float s = _mm512_reduce_add_ps(acc);
    if (i < nb) {
        const __m256i p = dot32_i8(_mm256_loadu_si256((const __m256i *)x[i].qs),
                                   _mm256_loadu_si256((const __m256i *)y[i].qs));
        s += h2f(x[i].d) * h2f(y[i].d) * hsum256(_mm256_cvtepi32_ps(p));
    }
    return s;
}

T_AVX512 static float avx512_dot_q4_0(int64_t n, const void *w, const void *a)
{
    const gpe_block_q4_0 *x = w;
    const gpe_block_q8_0 *y = a;
    const int64_t nb = n / GPE_QK;
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i wv = cat256(q4_0_unpack(x[i].qs), q4_0_unpack(x[i + 1].qs));
        const __m512i av = cat256(_mm256_loadu_si256((const __m256i *)y[i].qs),
                                  _mm256_loadu_si256((const __m256i *)y[i + 1].qs));
        acc = _mm512_fmadd_ps(scale2(h2f(x[i].d) * h2f(y[i].d), h2f(x[i + 1].d) * h2f(y[i + 1].d)),
                              _mm512_cvtepi32_ps(dot64_i8(wv, av)), acc);
    }
    float s = _mm512_reduce_add_ps(acc);
    if (i < nb) {
        const __m256i p = dot32_i8(q4_0_unpack(x[i].qs), _mm256_loadu_si256((const __m256i *)y[i].qs));
        s += h2f(x[i].d) * h2f(y[i].d) * hsum256(_mm256_cvtepi32_ps(p));
    }
    return s;
}

/* pshufb pattern per 128-bit lane: lanes 0-1 take int16 scale k0, lanes 2-3 k1. */
T_AVX512 static inline __m512i kq_pick2(int k0, int k1)
{
    const __m256i lo = _mm256_set1_epi16((short)(((2 * k0 + 1) << 8) | (2 * k0)));
    const __m256i hi = _mm256_set1_epi16((short)(((2 * k1 + 1) << 8) | (2 * k1)));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

T_AVX512 static inline float hsum128(__m128 v)
{
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v);
}

T_AVX512 static float avx512_dot_q4_k(int64_t n, const void *w, const void *a)
{
    const gpe_block_q4_k *x = w;
    const gpe_block_q8_k *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m512i pick[4] = {kq_pick2(0, 1), kq_pick2(2, 3), kq_pick2(4, 5), kq_pick2(6, 7)};
    __m512 acc = _mm512_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < n / GPE_QK_K; i++) {
        uint8_t sc[8], mn[8];
        kq_unpack(x[i].scales, sc, mn);
        const float da = y[i].d;
        accm = _mm_fmadd_ps(_mm_set1_ps(h2f(x[i].dmin) * da), _mm_cvtepi32_ps(kq_mins(mn, y[i].bsums)),
                            accm);
        const __m512i scv = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
        __m512i sumi = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
            const __m512i qv = cat256(_mm256_and_si256(q, m4),
                                      _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
            const __m512i av = _mm512_loadu_si512((const void *)(y[i].qs + 64 * c));
            sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(_mm512_maddubs_epi16(qv, av),
                                                            _mm512_shuffle_epi8(scv, pick[c])));
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(h2f(x[i].d) * da), _mm512_cvtepi32_ps(sumi), acc);
    }
    return _mm512_reduce_add_ps(acc) - hsum128(accm);
}

T_AVX512 static float avx512_dot_q5_k(int64_t n, const void *w, const void *a)
{
    const gpe_block_q5_k *x = w;
    const gpe_block_q8_k *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    const __m512i pick[4] = {kq_pick2(0, 1), kq_pick2(2, 3), kq_pick2(4, 5), kq_pick2(6, 7)};
    __m512 acc = _mm512_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < n / GPE_QK_K; i++) {
        uint8_t sc[8], mn[8];
        kq_unpack(x[i].scales, sc, mn);
        const float da = y[i].d;
        accm = _mm_fmadd_ps(_mm_set1_ps(h2f(x[i].dmin) * da), _mm_cvtepi32_ps(kq_mins(mn, y[i].bsums)),
                            accm);
        const __m512i scv = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
        __m256i qh = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m512i sumi = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
            const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(qh, one), 4);
            const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4);
            qh = _mm256_srli_epi16(qh, 2);
            const __m512i qv = cat256(
                _mm256_or_si256(_mm256_and_si256(q, m4), h0),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h1));
            const __m512i av = _mm512_loadu_si512((const void *)(y[i].qs + 64 * c));
            sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(_mm512_maddubs_epi16(qv, av),
                                                            _mm512_shuffle_epi8(scv, pick[c])));
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(h2f(x[i].d) * da), _mm512_cvtepi32_ps(sumi), acc);
    }
    return _mm512_reduce_add_ps(acc) - hsum128(accm);
}

T_AVX512 static float avx512_dot_q6_k(int64_t n, const void *w, const void *a)
{
    const gpe_block_q6_k *x = w;
    const gpe_block_q8_k *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
    /* int16 lane k of a 512-bit vector takes scale k/8 (one scale per 16 values) */
    const __m512i idx_lo = _mm512_srli_epi16(
        _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14,
                         13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3);
    const __m512i idx_hi = _mm512_add_epi16(idx_lo, _mm512_set1_epi16(4));
    __m512 acc = _mm512_setzero_ps();
    float accc = 0.0f;
    for (int64_t i = 0; i < n / GPE_QK_K; i++) {
        const uint8_t *ql = x[i].ql, *qhp = x[i].qh;
        const int8_t *sc = x[i].scales, *qa = y[i].qs;
        __m512i sumi = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++, ql += 64, qhp += 32, sc += 8, qa += 128) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)qhp);
            const __m256i q0 = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                               _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
            const __m256i q1 = _mm256_or_si256(
                _mm256_and_si256(l1, m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
            const __m256i q2 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
            const __m256i q3 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
            int64_t s8;
            memcpy(&s8, sc, 8);
            const __m512i sv = _mm512_castsi128_si512(_mm_cvtepi8_epi16(_mm_cvtsi64_si128(s8)));
            const __m512i a0 = _mm512_loadu_si512((const void *)qa);
            const __m512i a1 = _mm512_loadu_si512((const void *)(qa + 64));
            sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(_mm512_maddubs_epi16(cat256(q0, q1), a0),
                                                            _mm512_permutexvar_epi16(idx_lo, sv)));
            sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(_mm512_maddubs_epi16(cat256(q2, q3), a1),
                                                            _mm512_permutexvar_epi16(idx_hi, sv)));
        }
        const float d = h2f(x[i].d) * y[i].d;
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
        accc += d * (float)q6_corr(x[i].scales, y[i].bsums);
    }
    return _mm512_reduce_add_ps(acc) - accc;
}

void gpe__kernels_avx512(gpe__kernels *k)
{
    k->dot[GPE_TYPE_F32] = avx512_dot_f32;
    k->dot[GPE_TYPE_F16] = avx512_dot_f16;
    k->dot[GPE_TYPE_BF16] = avx512_dot_bf16;
    k->dot[GPE_TYPE_Q8_0] = avx512_dot_q8_0;
    k->dot[GPE_TYPE_Q4_0] = avx512_dot_q4_0;
    k->dot[GPE_TYPE_Q4_K] = avx512_dot_q4_k;
    k->dot[GPE_TYPE_Q5_K] = avx512_dot_q5_k;
    k->dot[GPE_TYPE_Q6_K] = avx512_dot_q6_k;
}

#else /* not x86-64: scalar kernels only */

bool gpe__have_x86_kernels(void) { return false; }
void gpe__kernels_avx2(gpe__kernels *k) { (void)k; }
void gpe__kernels_avx512(gpe__kernels *k) { (void)k; }

#endif
