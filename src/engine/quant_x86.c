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

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include "engine/quant_x86.h"

#define T_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

bool gpe__have_x86_kernels(void) { return true; }

/* ================================================================ AVX2 */

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

/* Q8_0 quantizer, byte for byte quant.c's: amax by max_ps (a NaN input is
 * skipped, as fmaxf skips it), the same d and id, round-half-even by
 * round_ps (nearbyintf in the default rounding mode). */
T_AVX2 static void avx2_quant_q8_0(const float *x, void *dst, int64_t nb)
{
    gpe_block_q8_0 *y = dst;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < nb; i++, x += GPE_QK) {
        __m256 v[4], mx = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            mx = _mm256_max_ps(_mm256_and_ps(v[k], absmask), mx);
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float amax = _mm_cvtss_f32(m);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = gpe_fp32_to_fp16(d);
        const __m256 idv = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], idv),
                                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        /* the packs work per 128-bit lane: dwords come out as q0 0-3, q1
         * 0-3, q2 0-3, q3 0-3 | q0 4-7, ...; the permute restores order */
        const __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)y[i].qs,
                            _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
}

/* F32 -> F16 by F16C (round to nearest even, as gpe_fp32_to_fp16), eight
 * at a time. A NaN comes out as F16C keeps it (payload's top bits); the
 * scalar conversion gives sign | 0x7e00, so NaN lanes are set to that. */
T_AVX2 static int64_t avx2_quant_f16(const float *x, void *dst, int64_t n)
{
    uint16_t *o = dst;
    const __m128i abs = _mm_set1_epi16(0x7fff), inf = _mm_set1_epi16(0x7c00);
    const __m128i sgn = _mm_set1_epi16((short)0x8000), qnan = _mm_set1_epi16(0x7e00);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, abs), inf);
        h = _mm_blendv_epi8(h, _mm_or_si128(_mm_and_si128(h, sgn), qnan), nan);
        _mm_storeu_si128((__m128i *)(o + i), h);
    }
    return i;
}

/*
 * The AVX2 kernels below (F32 excepted) are, like the AVX-512 ones, written
 * once for nt activation rows (1..4, rows a + k*as) sharing one pass over
 * the weight row; the single-row dot is the nt = 1 instance, so batching
 * never changes a token's bits.
 */
#define AI __attribute__((always_inline)) inline
#define ROW(T, k) ((const T *)(a + (size_t)(k) * as))

T_AVX2 static AI void k2_f16(int64_t n, const uint16_t *x, const uint8_t *a, size_t as, int nt,
                             float *out)
{
    __m256 s0[4], s1[4];
    for (int k = 0; k < nt; k++)
        s0[k] = s1[k] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i + 8)));
        for (int k = 0; k < nt; k++) {
            const uint16_t *y = ROW(uint16_t, k);
            s0[k] = _mm256_fmadd_ps(w0, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i))), s0[k]);
            s1[k] = _mm256_fmadd_ps(w1, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i + 8))),
                                    s1[k]);
        }
    }
    for (int k = 0; k < nt; k++) {
        const uint16_t *y = ROW(uint16_t, k);
        float s = hsum256(_mm256_add_ps(s0[k], s1[k]));
        for (int64_t j = i; j < n; j++)
            s += h2f(x[j]) * h2f(y[j]);
        out[k] = s;
    }
}

T_AVX2 static AI void k2_bf16(int64_t n, const uint16_t *x, const uint8_t *a, size_t as, int nt,
                              float *out)
{
    __m256 s0[4];
    for (int k = 0; k < nt; k++)
        s0[k] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        const __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        for (int k = 0; k < nt; k++)
            s0[k] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(ROW(float, k) + i), s0[k]);
    }
    for (int k = 0; k < nt; k++) {
        const float *y = ROW(float, k);
        float s = hsum256(s0[k]);
        for (int64_t j = i; j < n; j++)
            s += gpe_bf16_to_fp32(x[j]) * y[j];
        out[k] = s;
    }
}

/* 32 Q4_0 values as signed bytes -8..7, in element order. */
T_AVX2 static inline __m256i q4_0_unpack(const uint8_t *qs)
{
    const __m128i q = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0xF);
    const __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
    return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
}

T_AVX2 static AI __m256i w32_q8_0(const gpe_block_q8_0 *b)
{
    return _mm256_loadu_si256((const __m256i *)b->qs);
}
T_AVX2 static AI __m256i w32_q4_0(const gpe_block_q4_0 *b) { return q4_0_unpack(b->qs); }

/* Integer dot of 32 unsigned bytes u with 32 signed bytes s as 8 int32
 * lanes (lane j: bytes 4j..4j+3). maddubs cannot saturate here (|w| <= 128,
 * |a| <= 127: a pair sums to at most 32512), so the VNNI dpbusd
 * (target avx512vnni, below) gives the same integers in one instruction. */
T_AVX2 static AI __m256i doti_avx2(__m256i u, __m256i s)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/*
 * Q4_0 (AVX2, AVX-512 and AVX-512 VNNI instances), and its 8-row gemm
 * below, in one float order: block i's integer dot is exact, and
 * float lane i % 8 of the accumulator takes fma(fl(dw * da), (float)isum,
 * lane) in block order; the result is hsum256 of the 8 lanes. Blocks go in
 * eights: their integer vectors are reduced to one vector of 8 sums.
 * |w| and the weight's scale are shared by the tokens. ad (matmul only,
 * else NULL): the activation scales as floats, ad[k * nb + i] for token k,
 * block i, converted once per matmul; same value, same bits.
 */
/* 8 f16 scales, stride bytes apart from p, as floats; lanes from nq on
 * are 0. */
T_AVX2 static AI __m256 f16x8(const uint8_t *p, size_t stride, int nq)
{
    /* built in a register: eight 2-byte stores read back as one vector
     * would stall on store forwarding */
    __m128i h = _mm_setzero_si128();
    uint16_t v;
#define F16X8_LANE(q)                                       \
    if (q < nq) {                                           \
        memcpy(&v, p + (size_t)(q) * stride, 2);            \
        h = _mm_insert_epi16(h, v, q);                      \
    }
    F16X8_LANE(0) F16X8_LANE(1) F16X8_LANE(2) F16X8_LANE(3)
    F16X8_LANE(4) F16X8_LANE(5) F16X8_LANE(6) F16X8_LANE(7)
#undef F16X8_LANE
    return _mm256_cvtph_ps(h);
}

#define BLOCK32(TGT, NAME, WT, UNPACK, DOTI)                                                     \
    TGT static AI void NAME(int64_t n, const WT *x, const uint8_t *a, size_t as, const float *ad, \
                            int nt, float *out)                                                  \
    {                                                                                            \
        const int64_t nb = n / GPE_QK;                                                           \
        __m256 acc[4];                                                                           \
        for (int k = 0; k < nt; k++)                                                             \
            acc[k] = _mm256_setzero_ps();                                                        \
        for (int64_t i0 = 0; i0 < nb; i0 += 8) {                                                 \
            const int nq = nb - i0 < 8 ? (int)(nb - i0) : 8;                                     \
            /* pairs of blocks, then pairs of pairs: at most 3 vectors live per token */         \
            __m256i quad[2][4];                                                                  \
            _Pragma("GCC unroll 2") for (int hq = 0; hq < 2; hq++) {                             \
                __m256i pair[2][4];                                                              \
                _Pragma("GCC unroll 2") for (int pq = 0; pq < 2; pq++) {                         \
                    __m256i v[2][4];                                                             \
                    _Pragma("GCC unroll 2") for (int e = 0; e < 2; e++) {                        \
                        const int q = 4 * hq + 2 * pq + e;                                       \
                        if (q >= nq) { /* zero sum and scale: the lane gets +0 */                \
                            for (int k = 0; k < nt; k++)                                         \
                                v[e][k] = _mm256_setzero_si256();                                \
                            continue;                                                            \
                        }                                                                        \
                        const WT *xb = &x[i0 + q];                                               \
                        const __m256i wv = UNPACK(xb);                                           \
                        const __m256i aw = _mm256_sign_epi8(wv, wv);                             \
                        for (int k = 0; k < nt; k++) {                                           \
                            const gpe_block_q8_0 *y = ROW(gpe_block_q8_0, k) + i0 + q;           \
                            v[e][k] = DOTI(aw, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y->qs), wv)); \
                        }                                                                        \
                    }                                                                            \
                    for (int k = 0; k < nt; k++)                                                 \
                        pair[pq][k] = _mm256_hadd_epi32(v[0][k], v[1][k]);                       \
                }                                                                                \
                for (int k = 0; k < nt; k++)                                                     \
                    quad[hq][k] = _mm256_hadd_epi32(pair[0][k], pair[1][k]);                     \
            }                                                                                    \
            const __m256 dw = f16x8((const uint8_t *)&x[i0].d, sizeof(WT), nq);                  \
            for (int k = 0; k < nt; k++) {                                                       \
                const __m256i isum = _mm256_add_epi32(_mm256_permute2x128_si256(quad[0][k], quad[1][k], 0x20), \
                                                      _mm256_permute2x128_si256(quad[0][k], quad[1][k], 0x31)); \
                const __m256 da = ad && nq == 8 ? _mm256_loadu_ps(ad + k * nb + i0)              \
                                                : f16x8((const uint8_t *)&(ROW(gpe_block_q8_0, k) + i0)->d, \
                                                        sizeof(gpe_block_q8_0), nq);             \
                acc[k] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum), acc[k]); \
            }                                                                                    \
        }                                                                                        \
        for (int k = 0; k < nt; k++)                                                             \
            out[k] = hsum256(acc[k]);                                                            \
    }
/* Q8_0 keeps llama.cpp's order (float lane j of the accumulator takes
 * fma(fl(dw * da), (float)(int32 lane j of the block's dot), lane j) for
 * bytes 4j..4j+3 of every block; the result is hsum256): with activations
 * rounded to Q8_0 before every product, a tiny random model's logits move
 * by several 1e-2 under any other order (tests/data/arch's Q8_0 file), so
 * this is what lets the engine land within 1e-5 of llama.cpp there. */
#define BLOCK32J(TGT, NAME, WT, UNPACK, DOTI)                                                     \
    TGT static AI void NAME(int64_t n, const WT *x, const uint8_t *a, size_t as, const float *ad, \
                            int nt, float *out)                                                  \
    {                                                                                            \
        const int64_t nb = n / GPE_QK;                                                           \
        __m256 acc[4];                                                                           \
        for (int k = 0; k < nt; k++)                                                             \
            acc[k] = _mm256_setzero_ps();                                                        \
        for (int64_t i = 0; i < nb; i++) {                                                       \
            const __m256i wv = UNPACK(&x[i]);                                                    \
            const __m256i aw = _mm256_sign_epi8(wv, wv);                                         \
            const __m256 dw = _mm256_set1_ps(h2f(x[i].d));                                       \
            for (int k = 0; k < nt; k++) {                                                       \
                const gpe_block_q8_0 *y = ROW(gpe_block_q8_0, k) + i;                            \
                const __m256i sa = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y->qs), wv); \
                const __m256 da = ad ? _mm256_broadcast_ss(ad + k * nb + i) : _mm256_set1_ps(h2f(y->d)); \
                acc[k] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(DOTI(aw, sa)), \
                                         acc[k]);                                                \
            }                                                                                    \
        }                                                                                        \
        for (int k = 0; k < nt; k++)                                                             \
            out[k] = hsum256(acc[k]);                                                            \
    }
BLOCK32J(T_AVX2, k2_q8_0, gpe_block_q8_0, w32_q8_0, doti_avx2)
BLOCK32(T_AVX2, k2_q4_0, gpe_block_q4_0, w32_q4_0, doti_avx2)

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

/* One 64-value chunk of a Q4_K (hbits false) / Q5_K block as unsigned
 * bytes: lo = low nibbles of the chunk's 32 qs bytes (values 0..31 of the
 * chunk), hi = high nibbles (32..63), plus 16 from qh's next two bits for
 * Q5_K (*qh is shifted on for the next chunk). Shared by the AVX2 and
 * AVX-512 kernels. */
T_AVX2 static AI void kq_chunk(const uint8_t *qs, bool hbits, __m256i *qh, __m256i *lo, __m256i *hi)
{
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    const __m256i q = _mm256_loadu_si256((const __m256i *)qs);
    *lo = _mm256_and_si256(q, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    if (hbits) {
        *lo = _mm256_or_si256(*lo, _mm256_slli_epi16(_mm256_and_si256(*qh, one), 4));
        *hi = _mm256_or_si256(*hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(*qh, 1), one), 4));
        *qh = _mm256_srli_epi16(*qh, 2);
    }
}

/* One half (128 values) of a Q6_K block as unsigned 6-bit bytes 0..63:
 * q[j] = values 32j..32j+31 of the half (low 4 bits from ql, high 2 from
 * qh). Shared by the AVX2 and AVX-512 kernels. */
T_AVX2 static AI void q6_half(const uint8_t *ql, const uint8_t *qhp, __m256i q[4])
{
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)qhp);
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
}

/*
 * The K-quant kernels' order of float operations (AVX2, AVX-512 and the
 * blocked gemm below give the same bits): per 256-value block the integer
 * sums are exact (isum = sum over sub-blocks of scale * sum q*a, and for
 * Q4_K/Q5_K imin = sum of min * activation pair sums; Q6_K folds its -32
 * into isum), then, block after block in order,
 *     acc  = fma(fl(d * da),    (float)isum, acc)
 *     accm = fma(fl(dmin * da), (float)imin, accm)
 * and the result is acc - accm. A block's float work is two scalar fmas,
 * which lets the gemm keep one row per vector lane.
 */
T_AVX2 static inline int hsum_i32x8(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}
T_AVX2 static inline int hsum_i32x4(__m128i s)
{
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}
/* acc + d * (float)i with one rounding, as _mm256_fmadd_ps does per lane. */
T_AVX2 static inline float fma_acc(float d, int i, float acc)
{
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(d), _mm_set_ss((float)i), _mm_set_ss(acc)));
}

/* Q4_K (hbits = false) and Q5_K (true), chunk by chunk (64 values: low
 * nibbles of qs[32c..] then high ones, +16 from qh bits 2c / 2c+1 for Q5_K);
 * each chunk's unpacked weights and scales serve every token. */
T_AVX2 static AI void k2_kq(int64_t n, const uint8_t *xb, size_t bbytes, size_t qs_off, bool hbits,
                            const uint8_t *a, size_t as, int nt, float *out)
{
    float acc[4], accm[4];
    for (int k = 0; k < nt; k++)
        acc[k] = accm[k] = 0.0f;
    for (int64_t i = 0; i < n / GPE_QK_K; i++) {
        const uint8_t *b = xb + (size_t)i * bbytes;   /* d, dmin, scales[12] at 0, 2, 4 */
        uint16_t dh, mh;
        memcpy(&dh, b, 2);
        memcpy(&mh, b + 2, 2);
        const float dw = h2f(dh), dmw = h2f(mh);
        uint8_t sc[8], mn[8];
        kq_unpack(b + 4, sc, mn);
        const __m256i scv = kq_scales256(sc);
        const uint8_t *qs = b + qs_off;
        __m256i qh = hbits ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        __m256i sumi[4];
        for (int k = 0; k < nt; k++)
            sumi[k] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i lo, hi;
            kq_chunk(qs + 32 * c, hbits, &qh, &lo, &hi);
            const __m256i s0 = _mm256_shuffle_epi8(scv, kq_pick(2 * c));
            const __m256i s1 = _mm256_shuffle_epi8(scv, kq_pick(2 * c + 1));
            for (int k = 0; k < nt; k++) {
                const int8_t *qa = ROW(gpe_block_q8_k, k)[i].qs + 64 * c;
                const __m256i p0 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)qa)), s0);
                const __m256i p1 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(qa + 32))), s1);
                sumi[k] = _mm256_add_epi32(sumi[k], _mm256_add_epi32(p0, p1));
            }
        }
        for (int k = 0; k < nt; k++) {
            const gpe_block_q8_k *y = ROW(gpe_block_q8_k, k) + i;
            acc[k] = fma_acc(dw * y->d, hsum_i32x8(sumi[k]), acc[k]);
            accm[k] = fma_acc(dmw * y->d, hsum_i32x4(kq_mins(mn, y->bsums)), accm[k]);
        }
    }
    for (int k = 0; k < nt; k++)
        out[k] = acc[k] - accm[k];
}

/* Q6_K: values are q-32 with q in 0..63; the -32 is folded in through the
 * activation's per-16 sums: sum sc*q*a - 32*sum sc*bsum, exact in int32. */
T_AVX2 static inline int q6_corr(const int8_t *scales, const int16_t *bsums)
{
    const __m256i cm = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)scales)),
                                         _mm256_loadu_si256((const __m256i *)bsums));
    return 32 * hsum_i32x8(cm);
}

T_AVX2 static AI void k2_q6_k(int64_t n, const gpe_block_q6_k *x, const uint8_t *a, size_t as,
                              int nt, float *out)
{
    float acc[4];
    for (int k = 0; k < nt; k++)
        acc[k] = 0.0f;
    for (int64_t i = 0; i < n / GPE_QK_K; i++) {
        const uint8_t *ql = x[i].ql, *qhp = x[i].qh;
        const int8_t *sc = x[i].scales;
        __m256i sumi[4];
        for (int k = 0; k < nt; k++)
            sumi[k] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++, ql += 64, qhp += 32, sc += 8) {
            __m256i q[4];
            q6_half(ql, qhp, q);
            for (int j = 0; j < 4; j++) {
                const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[2 * j + 1]), _mm_set1_epi16(sc[2 * j]));
                for (int k = 0; k < nt; k++) {
                    const int8_t *qa = ROW(gpe_block_q8_k, k)[i].qs + 128 * h + 32 * j;
                    sumi[k] = _mm256_add_epi32(
                        sumi[k], _mm256_madd_epi16(
                                     _mm256_maddubs_epi16(q[j], _mm256_loadu_si256((const __m256i *)qa)), s));
                }
            }
        }
        const float dw = h2f(x[i].d);
        for (int k = 0; k < nt; k++) {
            const gpe_block_q8_k *y = ROW(gpe_block_q8_k, k) + i;
            acc[k] = fma_acc(dw * y->d, hsum_i32x8(sumi[k]) - q6_corr(x[i].scales, y->bsums), acc[k]);
        }
    }
    for (int k = 0; k < nt; k++)
        out[k] = acc[k];
}

/* Instances: the single-row dot (nt = 1) and the nt-row version; the switch
 * gives each nt its own fully unrolled copy. */
#define KWRAP(TGT, NAME, CALL)                                                                   \
    TGT static float NAME##_dot(int64_t n, const void *w, const void *a0)                       \
    {                                                                                            \
        const uint8_t *a = a0;                                                                   \
        const size_t as = 0;                                                                     \
        const float *ad = NULL;                                                                  \
        float out[1];                                                                            \
        (void)ad;                                                                                \
        const int nt = 1;                                                                        \
        CALL;                                                                                    \
        return out[0];                                                                           \
    }                                                                                            \
    TGT static void NAME##_dotn(int64_t n, const void *w, const void *a0, size_t as,            \
                                const float *ad, int ntok, float *out)                           \
    {                                                                                            \
        const uint8_t *a = a0;                                                                   \
        (void)ad;                                                                                \
        switch (ntok) {                                                                          \
        case 1: { const int nt = 1; CALL; break; }                                               \
        case 2: { const int nt = 2; CALL; break; }                                               \
        case 3: { const int nt = 3; CALL; break; }                                               \
        default: { const int nt = 4; CALL; break; }                                              \
        }                                                                                        \
    }

KWRAP(T_AVX2, avx2_f16, k2_f16(n, w, a, as, nt, out))
KWRAP(T_AVX2, avx2_bf16, k2_bf16(n, w, a, as, nt, out))
KWRAP(T_AVX2, avx2_q8_0, k2_q8_0(n, w, a, as, ad, nt, out))
KWRAP(T_AVX2, avx2_q4_0, k2_q4_0(n, w, a, as, ad, nt, out))
KWRAP(T_AVX2, avx2_q4_k, k2_kq(n, w, sizeof(gpe_block_q4_k), offsetof(gpe_block_q4_k, qs), false, a, as, nt, out))
KWRAP(T_AVX2, avx2_q5_k, k2_kq(n, w, sizeof(gpe_block_q5_k), offsetof(gpe_block_q5_k, qs), true, a, as, nt, out))
KWRAP(T_AVX2, avx2_q6_k, k2_q6_k(n, w, a, as, nt, out))

#define GEMM_DECL(NAME)                                                                      \
    static int64_t NAME(int64_t n, const void *W, size_t rs, int64_t r0, int64_t r1,         \
                        const void *act, size_t as, int n_tok, float *out, int64_t ldo);
GEMM_DECL(g8avx2_q4_0)
GEMM_DECL(kq8_q4_k_avx2)
GEMM_DECL(kq8_q5_k_avx2)
GEMM_DECL(kq8_q6_k_avx2)
#define PACKED_DECL(NAME)                                                                    \
    static bool NAME(int64_t n, const void *P, int64_t g0, int64_t g1, const void *act,        \
                     size_t as, int n_tok, float *out, int64_t ldo);
PACKED_DECL(pk_q4_0_avx2)
PACKED_DECL(pk_q4_k_avx2)
PACKED_DECL(pk_q5_k_avx2)
PACKED_DECL(pk_q6_k_avx2)

void gpe__kernels_avx2(gpe__kernels *k)
{
    k->dot[GPE_TYPE_F32] = avx2_dot_f32;
#define SET(T, NAME)                     \
    k->dot[T] = NAME##_dot;              \
    k->dotn[T] = NAME##_dotn;
    SET(GPE_TYPE_F16, avx2_f16)
    SET(GPE_TYPE_BF16, avx2_bf16)
    SET(GPE_TYPE_Q8_0, avx2_q8_0)
    SET(GPE_TYPE_Q4_0, avx2_q4_0)
    SET(GPE_TYPE_Q4_K, avx2_q4_k)
    SET(GPE_TYPE_Q5_K, avx2_q5_k)
    SET(GPE_TYPE_Q6_K, avx2_q6_k)
    k->gemm[GPE_TYPE_Q4_0] = g8avx2_q4_0;
    k->gemm[GPE_TYPE_Q4_K] = kq8_q4_k_avx2;
    k->gemm[GPE_TYPE_Q5_K] = kq8_q5_k_avx2;
    k->gemm[GPE_TYPE_Q6_K] = kq8_q6_k_avx2;
    k->packed[GPE_TYPE_Q4_0] = pk_q4_0_avx2;
    k->packed[GPE_TYPE_Q4_K] = pk_q4_k_avx2;
    k->packed[GPE_TYPE_Q5_K] = pk_q5_k_avx2;
    k->packed[GPE_TYPE_Q6_K] = pk_q6_k_avx2;
    k->gemm[GPE_TYPE_F16] = gpe__gemm_f16_avx2;
    k->gemm[GPE_TYPE_BF16] = gpe__gemm_bf16_avx2;
    k->quant_q8_0 = avx2_quant_q8_0;
    k->quant_f16 = avx2_quant_f16;
#undef SET
}

/* ============================================================== AVX-512 */
/*
 * Each AVX-512 kernel is written once for nt activation rows (1..4, rows
 * a + k*as) sharing one pass over the weight row: the weight unpacking is
 * done once for all of them. The single-row dot is the nt = 1 instance of
 * the same code, so a token's result is bit-identical whether or not other
 * tokens share the pass (decode results do not depend on batching).
 */
T_AVX512 static inline __m512i cat256(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

T_AVX512 static AI void k512_f32(int64_t n, const float *x, const uint8_t *a, size_t as, int nt,
                                 float *out)
{
    __m512 s0[4], s1[4], s2[4], s3[4];
    for (int k = 0; k < nt; k++)
        s0[k] = s1[k] = s2[k] = s3[k] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m512 w0 = _mm512_loadu_ps(x + i), w1 = _mm512_loadu_ps(x + i + 16);
        const __m512 w2 = _mm512_loadu_ps(x + i + 32), w3 = _mm512_loadu_ps(x + i + 48);
        for (int k = 0; k < nt; k++) {
            const float *y = ROW(float, k);
            s0[k] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(y + i), s0[k]);
            s1[k] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(y + i + 16), s1[k]);
            s2[k] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(y + i + 32), s2[k]);
            s3[k] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(y + i + 48), s3[k]);
        }
    }
    for (; i + 16 <= n; i += 16) {
        const __m512 w0 = _mm512_loadu_ps(x + i);
        for (int k = 0; k < nt; k++)
            s0[k] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(ROW(float, k) + i), s0[k]);
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        const __m512 w0 = _mm512_maskz_loadu_ps(m, x + i);
        for (int k = 0; k < nt; k++)
            s1[k] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, ROW(float, k) + i), s1[k]);
    }
    for (int k = 0; k < nt; k++)
        out[k] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0[k], s1[k]),
                                                    _mm512_add_ps(s2[k], s3[k])));
}

T_AVX512 static AI void k512_f16(int64_t n, const uint16_t *x, const uint8_t *a, size_t as, int nt,
                                 float *out)
{
    __m512 s0[4], s1[4];
    for (int k = 0; k < nt; k++)
        s0[k] = s1[k] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i)));
        const __m512 w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i + 16)));
        for (int k = 0; k < nt; k++) {
            const uint16_t *y = ROW(uint16_t, k);
            s0[k] = _mm512_fmadd_ps(w0, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i))), s0[k]);
            s1[k] = _mm512_fmadd_ps(w1, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i + 16))),
                                    s1[k]);
        }
    }
    const bool half = i + 16 <= n;
    if (half) {
        const __m512 w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i)));
        for (int k = 0; k < nt; k++)
            s0[k] = _mm512_fmadd_ps(
                w0, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ROW(uint16_t, k) + i))), s0[k]);
        i += 16;
    }
    for (int k = 0; k < nt; k++) {
        const uint16_t *y = ROW(uint16_t, k);
        float s = _mm512_reduce_add_ps(_mm512_add_ps(s0[k], s1[k]));
        for (int64_t j = i; j < n; j++)
            s += h2f(x[j]) * h2f(y[j]);
        out[k] = s;
    }
}

T_AVX512 static AI void k512_bf16(int64_t n, const uint16_t *x, const uint8_t *a, size_t as, int nt,
                                  float *out)
{
    __m512 s0[4];
    for (int k = 0; k < nt; k++)
        s0[k] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + i)));
        const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        for (int k = 0; k < nt; k++)
            s0[k] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(ROW(float, k) + i), s0[k]);
    }
    for (int k = 0; k < nt; k++) {
        const float *y = ROW(float, k);
        float s = _mm512_reduce_add_ps(s0[k]);
        for (int64_t j = i; j < n; j++)
            s += gpe_bf16_to_fp32(x[j]) * y[j];
        out[k] = s;
    }
}

/* Q8_0 and Q4_0: 32-element blocks, one 256-bit step per block (on
 * Skylake-SP this beats pairing two 34-byte blocks into one 512-bit vector:
 * the inserts and the two-scale vector cost more than the wider multiply
 * saves). With VNNI the integer dot is one dpbusd. */
T_VNNI static AI __m256i doti_vnni(__m256i u, __m256i s)
{
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}
BLOCK32J(T_AVX512, k512_q8_0, gpe_block_q8_0, w32_q8_0, doti_avx2)
BLOCK32(T_AVX512, k512_q4_0, gpe_block_q4_0, w32_q4_0, doti_avx2)
BLOCK32J(T_VNNI, kvnni_q8_0, gpe_block_q8_0, w32_q8_0, doti_vnni)
BLOCK32(T_VNNI, kvnni_q4_0, gpe_block_q4_0, w32_q4_0, doti_vnni)

/*
 * Q4_0 / Q8_0 prompt-sized matmuls, 8 weight rows at a time.
 *
 * 8 rows' blocks are unpacked once per call and transposed so that vector j
 * holds bytes 4j..4j+3 of each of the 8 rows (lane r = row r); one dpbusd
 * with the token's 4 activation bytes broadcast adds, in lane r, row r's
 * sum over those 4 values; 8 of them make the block's exact integer dot.
 * The activations are made unsigned (a + 128, what dpbusd wants) once per
 * call, and -128 * (sum of the block's weight bytes) starts the dot, which
 * keeps it exact. The float work is the per-token kernel's, lane-wise (Q4_0:
 * see "Q4_0 ... in one float order"; Q8_0: llama.cpp's, one accumulator per
 * byte group): every output is bit-identical to dot().
 */
typedef struct g8_blk {
    __m256i w[8];      /* transposed weight bytes (signed) */
    __m256i c;         /* -128 * the sum of the block's 32 weight bytes, per row */
    __m256i cj[8];     /* the same per byte group j (Q8_0's order) */
    __m256 dw;         /* the 8 rows' block scales */
} g8_blk;

/* 8x8 transpose of 32-bit elements: r[k] lane j -> r'[j] lane k. */
T_AVX2 static AI void tr8x8(__m256i r[8])
{
    __m256i t[8], u[8];
    for (int k = 0; k < 8; k += 2) {
        t[k] = _mm256_unpacklo_epi32(r[k], r[k + 1]);
        t[k + 1] = _mm256_unpackhi_epi32(r[k], r[k + 1]);
    }
    for (int k = 0; k < 8; k += 4) {
        u[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);
        u[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);
        u[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
        u[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x20);
        r[j + 4] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x31);
    }
}

/* c + the int32 lanes of the dot of unsigned bytes u with signed bytes s:
 * one dpbusd with VNNI; maddubs + madd on AVX2, exact only while a byte
 * pair stays within int16 (255 * 8 * 2 for Q4_0's -8..7: AVX2 does Q4_0
 * only). */
T_VNNI static AI __m256i dotc_vnni(__m256i c, __m256i u, __m256i s)
{
    return _mm256_dpbusd_epi32(c, u, s);
}
T_AVX2 static AI __m256i dotc_avx2(__m256i c, __m256i u, __m256i s)
{
    return _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

/* nt (1 or 2) tokens against one 8-row group; out rows r0..r0+7. Fully
 * unrolled, so that the 8 or 16 accumulators (one per block lane) live in
 * registers (AVX2 has 16 of them: one token at a time there). */
#define G8_TOKENS(TGT, NAME, DOTC)                                                              \
    TGT static AI void NAME(int64_t nb, const g8_blk *B, const uint8_t *ax, size_t axs,        \
                            const float *ad, int nt, float *out, int64_t ldo)                  \
    {                                                                                           \
        __m256 acc[2][8];                                                                       \
        for (int k = 0; k < nt; k++)                                                            \
            for (int l = 0; l < 8; l++)                                                         \
                acc[k][l] = _mm256_setzero_ps();                                                \
        for (int64_t i0 = 0; i0 < nb; i0 += 8) {                                                \
            _Pragma("GCC unroll 8") for (int l = 0; l < 8; l++) {                               \
                const int64_t i = i0 + l;                                                       \
                if (i >= nb)                                                                    \
                    break;                                                                      \
                _Pragma("GCC unroll 2") for (int k = 0; k < nt; k++) {                          \
                    const uint8_t *a4 = ax + k * axs + 32 * i;                                  \
                    __m256i p = _mm256_load_si256(&B[i].c);                                     \
                    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                       \
                        int32_t v4;                                                             \
                        memcpy(&v4, a4 + 4 * j, 4);                                             \
                        p = DOTC(p, _mm256_set1_epi32(v4), _mm256_load_si256(&B[i].w[j]));      \
                    }                                                                           \
                    const __m256 sc = _mm256_mul_ps(B[i].dw, _mm256_broadcast_ss(ad + k * nb + i)); \
                    acc[k][l] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p), acc[k][l]);          \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        for (int k = 0; k < nt; k++) {                                                          \
            const __m256 *v = acc[k]; /* hsum256's order, lane-wise */                          \
            const __m256 s = _mm256_add_ps(                                                     \
                _mm256_add_ps(_mm256_add_ps(v[0], v[4]), _mm256_add_ps(v[2], v[6])),            \
                _mm256_add_ps(_mm256_add_ps(v[1], v[5]), _mm256_add_ps(v[3], v[7])));           \
            _mm256_storeu_ps(out + k * ldo, s);                                                 \
        }                                                                                       \
    }
/* Q8_0's (llama.cpp's) order: one accumulator per byte group j, each
 * group's dot converted and scaled on its own. */
#define G8J_TOKENS(TGT, NAME, DOTC)                                                              \
    TGT static AI void NAME(int64_t nb, const g8_blk *B, const uint8_t *ax, size_t axs,        \
                            const float *ad, int nt, float *out, int64_t ldo)                  \
    {                                                                                           \
        __m256 acc[2][8];                                                                       \
        for (int k = 0; k < nt; k++)                                                            \
            for (int j = 0; j < 8; j++)                                                         \
                acc[k][j] = _mm256_setzero_ps();                                                \
        for (int64_t i = 0; i < nb; i++) {                                                      \
            __m256 sc[2];                                                                       \
            for (int k = 0; k < nt; k++)                                                        \
                sc[k] = _mm256_mul_ps(B[i].dw, _mm256_broadcast_ss(ad + k * nb + i));           \
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                               \
                const __m256i w = _mm256_load_si256(&B[i].w[j]);                                \
                _Pragma("GCC unroll 2") for (int k = 0; k < nt; k++) {                          \
                    int32_t a4;                                                                 \
                    memcpy(&a4, ax + k * axs + 32 * i + 4 * j, 4);                              \
                    const __m256i p = DOTC(_mm256_load_si256(&B[i].cj[j]), _mm256_set1_epi32(a4), w); \
                    acc[k][j] = _mm256_fmadd_ps(sc[k], _mm256_cvtepi32_ps(p), acc[k][j]);       \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        for (int k = 0; k < nt; k++) {                                                          \
            const __m256 *v = acc[k]; /* hsum256's order, lane-wise */                          \
            const __m256 s = _mm256_add_ps(                                                     \
                _mm256_add_ps(_mm256_add_ps(v[0], v[4]), _mm256_add_ps(v[2], v[6])),            \
                _mm256_add_ps(_mm256_add_ps(v[1], v[5]), _mm256_add_ps(v[3], v[7])));           \
            _mm256_storeu_ps(out + k * ldo, s);                                                 \
        }                                                                                       \
    }
G8J_TOKENS(T_VNNI, g8j_tokens_vnni, dotc_vnni)
G8_TOKENS(T_VNNI, g8_tokens_vnni, dotc_vnni)
G8_TOKENS(T_AVX2, g8_tokens_avx2, dotc_avx2)

/* Rows [r0, r1) in groups of 8 against n_tok tokens; returns the first row
 * not done (a remainder under 8 rows, or r0 without memory). */
#define G8(TGT, NAME, WT, UNPACK, TOKENS, DOTC, NTMAX)                                         \
    TGT static int64_t NAME(int64_t n, const void *W, size_t rs, int64_t r0, int64_t r1,    \
                               const void *act, size_t as, int n_tok, float *out, int64_t ldo) \
    {                                                                                           \
        const int64_t nb = n / GPE_QK;                                                          \
        const int64_t rend = r0 + (r1 - r0) / 8 * 8;                                           \
        const size_t axs = (size_t)n;                                                           \
        g8_blk *B = aligned_alloc(32, (size_t)nb * sizeof *B);                                  \
        uint8_t *ax = malloc((size_t)n_tok * axs);                                              \
        float *ad = malloc((size_t)n_tok * (size_t)nb * sizeof *ad);                            \
        if (!B || !ax || !ad) {                                                                 \
            free(B);                                                                            \
            free(ax);                                                                           \
            free(ad);                                                                           \
            return r0;                                                                          \
        }                                                                                       \
        const __m256i flip = _mm256_set1_epi8((char)0x80);                                      \
        for (int t = 0; t < n_tok; t++) {                                                       \
            const gpe_block_q8_0 *y = (const gpe_block_q8_0 *)((const uint8_t *)act + (size_t)t * as); \
            for (int64_t i = 0; i < nb; i++) {                                                  \
                _mm256_storeu_si256((__m256i *)(ax + t * axs + 32 * i),                         \
                                    _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)y[i].qs), flip)); \
                ad[t * nb + i] = h2f(y[i].d);                                                   \
            }                                                                                   \
        }                                                                                       \
        for (int64_t r = r0; r < rend; r += 8) {                                                \
            for (int64_t i = 0; i < nb; i++) {                                                  \
                __m256i v[8];                                                                   \
                uint16_t d[8];                                                                  \
                for (int k = 0; k < 8; k++) {                                                   \
                    const WT *x = (const WT *)((const uint8_t *)W + (size_t)(r + k) * rs) + i;  \
                    v[k] = UNPACK(x);                                                           \
                    d[k] = x->d;                                                                \
                }                                                                               \
                tr8x8(v);                                                                       \
                __m256i c = _mm256_setzero_si256();                                             \
                for (int j = 0; j < 8; j++) {                                                   \
                    B[i].w[j] = v[j];                                                           \
                    B[i].cj[j] = _mm256_sub_epi32(_mm256_setzero_si256(),                       \
                                                  DOTC(_mm256_setzero_si256(), flip, v[j]));    \
                    c = _mm256_add_epi32(c, B[i].cj[j]);                                        \
                }                                                                               \
                B[i].c = c;                                                                     \
                B[i].dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d));                 \
            }                                                                                   \
            int t = 0;                                                                          \
            for (; NTMAX == 2 && t + 2 <= n_tok; t += 2)                                        \
                TOKENS(nb, B, ax + t * axs, axs, ad + t * nb, 2, out + t * ldo + r, ldo);       \
            for (; t < n_tok; t++)                                                              \
                TOKENS(nb, B, ax + t * axs, axs, ad + t * nb, 1, out + t * ldo + r, ldo);       \
        }                                                                                       \
        free(B);                                                                                \
        free(ax);                                                                               \
        free(ad);                                                                               \
        return rend;                                                                            \
    }
G8(T_VNNI, g8_q8_0, gpe_block_q8_0, w32_q8_0, g8j_tokens_vnni, dotc_vnni, 2)
G8(T_VNNI, g8_q4_0, gpe_block_q4_0, w32_q4_0, g8_tokens_vnni, dotc_vnni, 2)
G8(T_AVX2, g8avx2_q4_0, gpe_block_q4_0, w32_q4_0, g8_tokens_avx2, dotc_avx2, 1)

/*
 * Q4_0 packed at load (quant.h: gpe_pack_rows): the words of a group's
 * block are already rows-in-lanes, so nothing is transposed per call. The
 * nibbles are taken as they are, unsigned (a mask and a shift per vector,
 * once per block for a chunk of tokens), with the activations signed, and
 * the -8 is removed afterwards as 8 * (sum of the activation block): one
 * dpbusd per 4 values of 8 rows, against ~14 instructions per block of one
 * row in the per-token kernel. Same integers and the same float order:
 * bit-identical to dot().
 */
T_AVX2 static AI void pk_words(const uint8_t *blk, __m256i u[8])
{
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int j = 0; j < 4; j++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * j));
        u[j] = _mm256_and_si256(v, m4);                          /* values 4j..4j+3 */
        u[j + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4); /* 16+4j..16+4j+3 */
    }
}

/* Tokens per pass over a group: their 8 block lanes (8 KiB) stay in L1
 * while each block is unpacked once for all of them. One thread, Q4_0 2048
 * columns from L2, Gelem/s: 1 / 4 / 8 / 32 / 64 / 128 tokens = 71 / 103 /
 * 112 / 117 / 108 / 92; building the 8-row gemm's blocks instead (the
 * unpacked weights' prompt path) gave 70 / 84 / 82 / 89 at 8 / 32 / 64 /
 * 128 tokens. */
#define PK_CHUNK 32

#define PK_Q4_0(TGT, NAME, DOTC)                                                               \
    TGT static bool NAME(int64_t n, const void *P, int64_t g0, int64_t g1, const void *act,     \
                         size_t as, int n_tok, float *out, int64_t ldo)                         \
    {                                                                                           \
        const int64_t nb = n / GPE_QK;                                                          \
        const size_t gbytes = (size_t)nb * 8 * sizeof(gpe_block_q4_0);                          \
        float *ad = malloc((size_t)n_tok * (size_t)nb * sizeof *ad);                            \
        int32_t *a8 = malloc((size_t)n_tok * (size_t)nb * sizeof *a8);                          \
        if (!ad || !a8) {                                                                       \
            free(ad);                                                                           \
            free(a8);                                                                           \
            return false;                                                                       \
        }                                                                                       \
        for (int t = 0; t < n_tok; t++) {                                                       \
            const gpe_block_q8_0 *y = (const gpe_block_q8_0 *)((const uint8_t *)act + (size_t)t * as); \
            for (int64_t i = 0; i < nb; i++) {                                                  \
                ad[t * nb + i] = h2f(y[i].d);                                                   \
                /* 8 * the block's sum: a dot with unsigned 8s */                               \
                a8[t * nb + i] = hsum_i32x8(DOTC(_mm256_setzero_si256(), _mm256_set1_epi8(8),    \
                                                 _mm256_loadu_si256((const __m256i *)y[i].qs))); \
            }                                                                                   \
        }                                                                                       \
        __m256 accs[PK_CHUNK * 8];                                                              \
        for (int64_t g = g0; g < g1; g++) {                                                     \
            const uint8_t *pg = (const uint8_t *)P + (size_t)g * gbytes;                        \
            if (n_tok == 1) { /* decode: the 8 block lanes in registers */                      \
                const int8_t *a = ((const gpe_block_q8_0 *)act)->qs;                            \
                __m256 acc[8];                                                                  \
                for (int l = 0; l < 8; l++)                                                     \
                    acc[l] = _mm256_setzero_ps();                                               \
                for (int64_t i0 = 0; i0 < nb; i0 += 8) {                                        \
                    _Pragma("GCC unroll 8") for (int l = 0; l < 8; l++) {                       \
                        const int64_t i = i0 + l;                                               \
                        if (i >= nb)                                                            \
                            break;                                                              \
                        const uint8_t *blk = pg + (size_t)i * 8 * sizeof(gpe_block_q4_0);       \
                        const int8_t *ai = a + (size_t)i * sizeof(gpe_block_q8_0);              \
                        __m256i u[8], p = _mm256_setzero_si256();                               \
                        pk_words(blk, u);                                                       \
                        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                   \
                            int32_t v4;                                                         \
                            memcpy(&v4, ai + 4 * j, 4);                                         \
                            p = DOTC(p, u[j], _mm256_set1_epi32(v4));                           \
                        }                                                                       \
                        p = _mm256_sub_epi32(p, _mm256_set1_epi32(a8[i]));                      \
                        const __m256 sc = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk)), \
                                                        _mm256_broadcast_ss(ad + i));           \
                        acc[l] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p), acc[l]);            \
                    }                                                                           \
                }                                                                               \
                _mm256_storeu_ps(out + 8 * g,                                                   \
                                 _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6])), \
                                               _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7])))); \
                continue;                                                                       \
            }                                                                                   \
            for (int t0 = 0; t0 < n_tok; t0 += PK_CHUNK) {                                      \
                const int nt = n_tok - t0 < PK_CHUNK ? n_tok - t0 : PK_CHUNK;                   \
                for (int l = 0; l < 8 * nt; l++)                                                \
                    accs[l] = _mm256_setzero_ps();                                              \
                for (int64_t i = 0; i < nb; i++) {                                              \
                    const uint8_t *blk = pg + (size_t)i * 8 * sizeof(gpe_block_q4_0);           \
                    __m256i u[8];                                                               \
                    pk_words(blk, u);                                                           \
                    const __m256 dwv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));  \
                    for (int t = t0; t < t0 + nt; t++) {                                        \
                        const int8_t *ai =                                                      \
                            ((const gpe_block_q8_0 *)((const uint8_t *)act + (size_t)t * as) + i)->qs; \
                        __m256i p = _mm256_setzero_si256();                                     \
                        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                   \
                            int32_t v4;                                                         \
                            memcpy(&v4, ai + 4 * j, 4);                                         \
                            p = DOTC(p, u[j], _mm256_set1_epi32(v4));                           \
                        }                                                                       \
                        p = _mm256_sub_epi32(p, _mm256_set1_epi32(a8[t * nb + i]));             \
                        const __m256 sc = _mm256_mul_ps(dwv, _mm256_broadcast_ss(ad + t * nb + i)); \
                        __m256 *ac = &accs[8 * (t - t0) + (i & 7)];                             \
                        *ac = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p), *ac);                  \
                    }                                                                           \
                }                                                                               \
                for (int t = 0; t < nt; t++) {                                                  \
                    const __m256 *v = &accs[8 * t]; /* hsum256's order, lane-wise */            \
                    _mm256_storeu_ps(out + (t0 + t) * ldo + 8 * g,                              \
                                     _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v[0], v[4]), _mm256_add_ps(v[2], v[6])), \
                                                   _mm256_add_ps(_mm256_add_ps(v[1], v[5]), _mm256_add_ps(v[3], v[7])))); \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        free(ad);                                                                               \
        free(a8);                                                                               \
        return true;                                                                            \
    }
PK_Q4_0(T_VNNI, pk_q4_0_vnni, dotc_vnni)
PK_Q4_0(T_AVX2, pk_q4_0_avx2, dotc_avx2)

/*
 * K-quant prompt-sized matmuls, 8 weight rows at a time, one row per int32
 * lane. Per 8-row group and block, each row's 256 values are unpacked to
 * bytes (unsigned: Q4_K 0..15, Q5_K 0..31, Q6_K 0..63, so dpbusd / maddubs
 * take them as they are, with no sign trick) in 32-value vectors, and the 8
 * rows' vectors are transposed so that w[v][j] holds bytes 4j..4j+3 of
 * vector v of every row. One dpbusd with the token's 4 activation bytes
 * broadcast then adds, in each row's lane, the sum over those 4 values;
 * sub-block sums times the rows' scales (pmulld) make the block's exact
 * isum, and the mins (or Q6_K's -32 correction) come from vpdpwssd of the
 * rows' int16 pairs with the token's activation sums. The float work is the
 * per-token kernels' (see "The K-quant kernels' order"), lane-wise, so each
 * output is bit-identical to dot(). The block's unpacked form (2.7 KiB) is
 * built once per call and serves every token.
 */
typedef struct kq8_blk {
    __m256i w[8][8];   /* [vector v][byte group j], rows in lanes */
    __m256i sc[16];    /* sub-block scales as int32 per row (Q4_K/Q5_K: 8 of 32 values; Q6_K: 16 of 16) */
    __m256i pr[8];     /* int16 pairs per row: Q4_K/Q5_K mins (m[2p], m[2p+1]), 4 used; Q6_K scales, 8 */
    __m256 d, dmin;
} kq8_blk;

/* dpwssd: c + the int32 lanes of pairwise int16 products (exact here: the
 * sums stay far below 2^31). */
T_VNNI static AI __m256i dotw_vnni(__m256i c, __m256i a, __m256i b)
{
    return _mm256_dpwssd_epi32(c, a, b);
}
T_AVX2 static AI __m256i dotw_avx2(__m256i c, __m256i a, __m256i b)
{
    return _mm256_add_epi32(c, _mm256_madd_epi16(a, b));
}

/* int16 pairs (lo = v[2p] of row r, hi = v[2p+1]) as int32 lanes, for np pairs. */
T_AVX2 static inline void kq8_pairs(__m256i *dst, const int16_t v[8][16], int np)
{
    for (int p = 0; p < np; p++) {
        int32_t l[8];
        for (int r = 0; r < 8; r++)
            l[r] = (int32_t)(uint16_t)v[r][2 * p] | (int32_t)((uint32_t)(uint16_t)v[r][2 * p + 1] << 16);
        dst[p] = _mm256_loadu_si256((const __m256i *)l);
    }
}

/* Unpack and transpose block i of rows W + r*rs .. (8 rows). q6: Q6_K,
 * else Q4_K (hbits false) / Q5_K (true) with bbytes/qs_off as in k2_kq. */
T_AVX2 static AI void kq8_build(kq8_blk *B, const uint8_t *W, size_t rs, int64_t i, bool q6,
                                size_t bbytes, size_t qs_off, bool hbits)
{
    __m256i v[8][8];   /* [vector][row] before the transposes */
    int16_t pr[8][16];
    int32_t sc[16][8];
    float d[8], dm[8];
    for (int r = 0; r < 8; r++) {
        const uint8_t *b = W + (size_t)r * rs + (size_t)i * bbytes;
        if (q6) {
            const gpe_block_q6_k *x = (const gpe_block_q6_k *)b;
            for (int h = 0; h < 2; h++) {
                __m256i q[4];
                q6_half(x->ql + 64 * h, x->qh + 32 * h, q);
                for (int j = 0; j < 4; j++)
                    v[4 * h + j][r] = q[j];
            }
            for (int g = 0; g < 16; g++) {
                sc[g][r] = x->scales[g];
                pr[r][g] = x->scales[g];
            }
            d[r] = h2f(x->d);
            dm[r] = 0.0f;
        } else {
            uint16_t dh, mh;
            memcpy(&dh, b, 2);
            memcpy(&mh, b + 2, 2);
            uint8_t s8[8], m8[8];
            kq_unpack(b + 4, s8, m8);
            __m256i qh = hbits ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
            for (int c = 0; c < 4; c++)
                kq_chunk(b + qs_off + 32 * c, hbits, &qh, &v[2 * c][r], &v[2 * c + 1][r]);
            for (int s = 0; s < 8; s++) {
                sc[s][r] = s8[s];
                pr[r][s] = m8[s];
            }
            d[r] = h2f(dh);
            dm[r] = h2f(mh);
        }
    }
    for (int k = 0; k < 8; k++) {
        tr8x8(v[k]);
        for (int j = 0; j < 8; j++)
            B->w[k][j] = v[k][j];
    }
    for (int g = 0; g < (q6 ? 16 : 8); g++)
        B->sc[g] = _mm256_loadu_si256((const __m256i *)sc[g]);
    kq8_pairs(B->pr, (const int16_t(*)[16])pr, q6 ? 8 : 4);
    B->d = _mm256_loadu_ps(d);
    B->dmin = _mm256_loadu_ps(dm);
}

/* The broadcast int32 at p (4 activation bytes or two int16 sums). */
T_AVX2 static AI __m256i bc4(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* One token against one built block: acc/accm (the 8 rows' running sums)
 * advanced by one block. */
#define KQ8_TOKEN(TGT, NAME, DOTC, DOTW)                                                        \
    TGT static AI void NAME(const kq8_blk *B, const gpe_block_q8_k *y, bool q6, __m256 *acc,   \
                            __m256 *accm)                                                       \
    {                                                                                           \
        __m256i isum = _mm256_setzero_si256(), imin = _mm256_setzero_si256();                   \
        const __m256i z = _mm256_setzero_si256();                                               \
        if (q6) {                                                                               \
            _Pragma("GCC unroll 8") for (int v = 0; v < 8; v++) {                               \
                const int8_t *qa = y->qs + 32 * v;                                              \
                __m256i t0 = DOTC(z, B->w[v][0], bc4(qa));                                      \
                __m256i t1 = DOTC(z, B->w[v][4], bc4(qa + 16));                                 \
                t0 = DOTC(t0, B->w[v][1], bc4(qa + 4));                                         \
                t1 = DOTC(t1, B->w[v][5], bc4(qa + 20));                                        \
                t0 = DOTC(t0, B->w[v][2], bc4(qa + 8));                                         \
                t1 = DOTC(t1, B->w[v][6], bc4(qa + 24));                                        \
                t0 = DOTC(t0, B->w[v][3], bc4(qa + 12));                                        \
                t1 = DOTC(t1, B->w[v][7], bc4(qa + 28));                                        \
                isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(t0, B->sc[2 * v]));            \
                isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(t1, B->sc[2 * v + 1]));        \
            }                                                                                   \
            __m256i corr = z;                                                                   \
            _Pragma("GCC unroll 8") for (int p = 0; p < 8; p++)                                 \
                corr = DOTW(corr, B->pr[p], bc4(y->bsums + 2 * p));                             \
            isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(corr, 5));                          \
        } else {                                                                                \
            _Pragma("GCC unroll 8") for (int v = 0; v < 8; v++) {                               \
                const int8_t *qa = y->qs + 32 * v;                                              \
                __m256i t0 = DOTC(z, B->w[v][0], bc4(qa));                                      \
                __m256i t1 = DOTC(z, B->w[v][4], bc4(qa + 16));                                 \
                t0 = DOTC(t0, B->w[v][1], bc4(qa + 4));                                         \
                t1 = DOTC(t1, B->w[v][5], bc4(qa + 20));                                        \
                t0 = DOTC(t0, B->w[v][2], bc4(qa + 8));                                         \
                t1 = DOTC(t1, B->w[v][6], bc4(qa + 24));                                        \
                t0 = DOTC(t0, B->w[v][3], bc4(qa + 12));                                        \
                t1 = DOTC(t1, B->w[v][7], bc4(qa + 28));                                        \
                isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(_mm256_add_epi32(t0, t1), B->sc[v])); \
            }                                                                                   \
            /* sums of the 8 sub-blocks of 32, as int16, then pairs */                          \
            const __m128i s8 = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums),       \
                                              _mm_loadu_si128((const __m128i *)(y->bsums + 8))); \
            int16_t s16[8];                                                                     \
            _mm_storeu_si128((__m128i *)s16, s8);                                               \
            _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++)                                 \
                imin = DOTW(imin, B->pr[p], bc4(s16 + 2 * p));                                  \
            const __m256 dm = _mm256_mul_ps(B->dmin, _mm256_set1_ps(y->d));                     \
            *accm = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(imin), *accm);                       \
        }                                                                                       \
        const __m256 d = _mm256_mul_ps(B->d, _mm256_set1_ps(y->d));                             \
        *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), *acc);                              \
    }
KQ8_TOKEN(T_VNNI, kq8_token_vnni, dotc_vnni, dotw_vnni)
KQ8_TOKEN(T_AVX2, kq8_token_avx2, dotc_avx2, dotw_avx2)

/* Rows [r0, r1) in groups of 8; returns the first row not done. */
#define KQ8(TGT, NAME, TOKEN, Q6, BB, QOFF, HBITS)                                             \
    TGT static int64_t NAME(int64_t n, const void *W, size_t rs, int64_t r0, int64_t r1,    \
                               const void *act, size_t as, int n_tok, float *out, int64_t ldo) \
    {                                                                                           \
        const int64_t nb = n / GPE_QK_K;                                                        \
        const int64_t rend = r0 + (r1 - r0) / 8 * 8;                                           \
        kq8_blk *B = aligned_alloc(32, sizeof *B);                                              \
        __m256 *acc = aligned_alloc(32, (size_t)n_tok * 2 * sizeof *acc);                       \
        if (!B || !acc) {                                                                       \
            free(B);                                                                            \
            free(acc);                                                                          \
            return r0;                                                                          \
        }                                                                                       \
        for (int64_t r = r0; r < rend; r += 8) {                                                \
            for (int t = 0; t < 2 * n_tok; t++)                                                 \
                acc[t] = _mm256_setzero_ps();                                                   \
            for (int64_t i = 0; i < nb; i++) {                                                  \
                kq8_build(B, (const uint8_t *)W + (size_t)r * rs, rs, i, Q6, BB, QOFF, HBITS);  \
                for (int t = 0; t < n_tok; t++) {                                               \
                    const gpe_block_q8_k *y =                                                   \
                        (const gpe_block_q8_k *)((const uint8_t *)act + (size_t)t * as) + i;    \
                    TOKEN(B, y, Q6, &acc[2 * t], &acc[2 * t + 1]);                              \
                }                                                                               \
            }                                                                                   \
            for (int t = 0; t < n_tok; t++)                                                     \
                _mm256_storeu_ps(out + t * ldo + r, _mm256_sub_ps(acc[2 * t], acc[2 * t + 1])); \
        }                                                                                       \
        free(B);                                                                                \
        free(acc);                                                                              \
        return rend;                                                                            \
    }
KQ8(T_VNNI, kq8_q4_k_vnni, kq8_token_vnni, false, sizeof(gpe_block_q4_k), offsetof(gpe_block_q4_k, qs), false)
KQ8(T_VNNI, kq8_q5_k_vnni, kq8_token_vnni, false, sizeof(gpe_block_q5_k), offsetof(gpe_block_q5_k, qs), true)
KQ8(T_VNNI, kq8_q6_k_vnni, kq8_token_vnni, true, sizeof(gpe_block_q6_k), 0, false)
KQ8(T_AVX2, kq8_q4_k_avx2, kq8_token_avx2, false, sizeof(gpe_block_q4_k), offsetof(gpe_block_q4_k, qs), false)
KQ8(T_AVX2, kq8_q5_k_avx2, kq8_token_avx2, false, sizeof(gpe_block_q5_k), offsetof(gpe_block_q5_k, qs), true)
KQ8(T_AVX2, kq8_q6_k_avx2, kq8_token_avx2, true, sizeof(gpe_block_q6_k), 0, false)

/*
 * K-quants packed at load (quant.h's layouts): the 8-row gemm's blocks are
 * built from the packed words with masks and shifts (no transposes, no
 * scale unpacking), so decode gets the rows-in-lanes kernel too: per
 * block, 64 dpbusd serve 8 rows where the per-row kernel spends about as
 * many instructions on one. Same integers and float order as dot().
 */
enum { PKQ_Q4_K, PKQ_Q5_K, PKQ_Q6_K };

T_AVX2 static AI void kq8_build_packed(kq8_blk *B, const uint8_t *blk, int kind)
{
    const __m256i m4 = _mm256_set1_epi8(0xF);
    B->d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
    if (kind == PKQ_Q6_K) {
        const uint8_t *sc = blk + 16, *q = blk + 144;
        B->dmin = _mm256_setzero_ps();
        for (int g = 0; g < 16; g++)
            B->sc[g] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 8 * g)));
        for (int p = 0; p < 8; p++)
            B->pr[p] = _mm256_or_si256(_mm256_and_si256(B->sc[2 * p], _mm256_set1_epi32(0xFFFF)),
                                       _mm256_slli_epi32(B->sc[2 * p + 1], 16));
        /* per 32-value vector v = 4h + k: low or high nibbles of ql word
         * 16h + 8(k & 1) + j, and bits 2k, 2k+1 of qh word 8h + j as bits
         * 4-5 (the three words are stored side by side) */
        const __m256i m30 = _mm256_set1_epi8(0x30);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 8; j++) {
                const uint8_t *t = q + 96 * (8 * h + j);   /* ql, ql + 8 words, qh */
                const __m256i l0 = _mm256_loadu_si256((const __m256i *)t);
                const __m256i l1 = _mm256_loadu_si256((const __m256i *)(t + 32));
                const __m256i hq = _mm256_loadu_si256((const __m256i *)(t + 64));
                B->w[4 * h][j] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                                 _mm256_and_si256(_mm256_slli_epi16(hq, 4), m30));
                B->w[4 * h + 1][j] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                                     _mm256_and_si256(_mm256_slli_epi16(hq, 2), m30));
                B->w[4 * h + 2][j] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                                     _mm256_and_si256(hq, m30));
                B->w[4 * h + 3][j] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                                     _mm256_and_si256(_mm256_srli_epi16(hq, 2), m30));
            }
        return;
    }
    const uint8_t *sc = blk + 32, *mn = blk + 96, *qh = blk + 160, *qs = blk + (kind == PKQ_Q5_K ? 416 : 160);
    B->dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16)));
    for (int s = 0; s < 8; s++)
        B->sc[s] = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 8 * s)));
    for (int p = 0; p < 4; p++)
        B->pr[p] = _mm256_or_si256(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(mn + 16 * p))),
            _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(mn + 16 * p + 8))), 16));
    const __m256i one = _mm256_set1_epi8(1);
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
        for (int j = 0; j < 8; j++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * (8 * c + j)));
            __m256i lo = _mm256_and_si256(w, m4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
            if (kind == PKQ_Q5_K) {
                /* bit 2c (low nibbles' values) and 2c+1 (high) of qh word j */
                const __m256i hq = _mm256_loadu_si256((const __m256i *)(qh + 32 * j));
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hq, 2 * c), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hq, 2 * c + 1), one), 4));
            }
            B->w[2 * c][j] = lo;
            B->w[2 * c + 1][j] = hi;
        }
}

/* One token against one packed block, without building the block: the
 * words are unpacked into registers and go straight into dpbusd (decode
 * would otherwise store 2 KiB of unpacked block and read it back per
 * block). The same integers and float operations as kq8_build_packed +
 * KQ8_TOKEN. */
#define PKQ_TOKEN1(TGT, NAME, DOTC, DOTW)                                                      \
    TGT static AI void NAME(const uint8_t *blk, const gpe_block_q8_k *y, int kind, __m256 *acc, \
                            __m256 *accm)                                                       \
    {                                                                                           \
        const __m256i m4 = _mm256_set1_epi8(0xF), z = _mm256_setzero_si256();                   \
        const __m256 da = _mm256_set1_ps(y->d);                                                 \
        __m256i isum = z;                                                                       \
        if (kind == PKQ_Q6_K) {                                                                 \
            const int8_t *sc = (const int8_t *)blk + 16;                                        \
            const uint8_t *q = blk + 144;                                                       \
            const __m256i m30 = _mm256_set1_epi8(0x30);                                         \
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {                               \
                __m256i t[4][2] = {{z, z}, {z, z}, {z, z}, {z, z}};                              \
                _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                           \
                    const uint8_t *tq = q + 96 * (8 * h + j);                                   \
                    const __m256i l0 = _mm256_loadu_si256((const __m256i *)tq);                 \
                    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(tq + 32));          \
                    const __m256i hq = _mm256_loadu_si256((const __m256i *)(tq + 64));          \
                    const __m256i w[4] = {                                                      \
                        _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hq, 4), m30)), \
                        _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hq, 2), m30)), \
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hq, m30)), \
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),         \
                                        _mm256_and_si256(_mm256_srli_epi16(hq, 2), m30))};      \
                    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)                         \
                        t[k][j >> 2] = DOTC(t[k][j >> 2], w[k], bc4(y->qs + 128 * h + 32 * k + 4 * j)); \
                }                                                                               \
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {                           \
                    const int g = 2 * (4 * h + k);                                              \
                    isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(t[k][0],                   \
                        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 8 * g))))); \
                    isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(t[k][1],                   \
                        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 8 * g + 8))))); \
                }                                                                               \
            }                                                                                   \
            __m256i corr = z;                                                                   \
            _Pragma("GCC unroll 8") for (int p = 0; p < 8; p++) {                               \
                const __m256i lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * p))); \
                const __m256i hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * p + 8))); \
                const __m256i pr = _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(0xFFFF)), \
                                                   _mm256_slli_epi32(hi, 16));                  \
                corr = DOTW(corr, pr, bc4(y->bsums + 2 * p));                                   \
            }                                                                                   \
            isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(corr, 5));                          \
        } else {                                                                                \
            const uint8_t *sc = blk + 32, *mn = blk + 96, *qh = blk + 160, *qs = blk + (kind == PKQ_Q5_K ? 416 : 160);    \
            const __m256i one = _mm256_set1_epi8(1);                                            \
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {                               \
                __m256i tl[2] = {z, z}, th[2] = {z, z};                                         \
                _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                           \
                    const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * (8 * c + j))); \
                    __m256i lo = _mm256_and_si256(w, m4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4); \
                    if (kind == PKQ_Q5_K) {                                                     \
                        const __m256i hq = _mm256_loadu_si256((const __m256i *)(qh + 32 * j));  \
                        lo = _mm256_or_si256(lo, _mm256_slli_epi16(                             \
                                                     _mm256_and_si256(_mm256_srli_epi16(hq, 2 * c), one), 4)); \
                        hi = _mm256_or_si256(hi, _mm256_slli_epi16(                             \
                                                     _mm256_and_si256(_mm256_srli_epi16(hq, 2 * c + 1), one), 4)); \
                    }                                                                           \
                    tl[j & 1] = DOTC(tl[j & 1], lo, bc4(y->qs + 64 * c + 4 * j));               \
                    th[j & 1] = DOTC(th[j & 1], hi, bc4(y->qs + 64 * c + 32 + 4 * j));          \
                }                                                                               \
                isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(_mm256_add_epi32(tl[0], tl[1]), \
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * c)))));    \
                isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(_mm256_add_epi32(th[0], th[1]), \
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * c + 8))))); \
            }                                                                                   \
            const __m128i s8 = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums),       \
                                              _mm_loadu_si128((const __m128i *)(y->bsums + 8))); \
            int16_t s16[8];                                                                     \
            _mm_storeu_si128((__m128i *)s16, s8);                                               \
            __m256i imin = z;                                                                   \
            _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {                               \
                const __m256i pr = _mm256_or_si256(                                             \
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(mn + 16 * p))),      \
                    _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(mn + 16 * p + 8))), 16)); \
                imin = DOTW(imin, pr, bc4(s16 + 2 * p));                                        \
            }                                                                                   \
            const __m256 dm = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16))), da); \
            *accm = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(imin), *accm);                       \
        }                                                                                       \
        const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk)), da); \
        *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), *acc);                              \
    }
PKQ_TOKEN1(T_VNNI, pkq_token1_vnni, dotc_vnni, dotw_vnni)
PKQ_TOKEN1(T_AVX2, pkq_token1_avx2, dotc_avx2, dotw_avx2)

#define PK_KQ(TGT, NAME, TOKEN, TOKEN1, KIND, BB)                                              \
    TGT static bool NAME(int64_t n, const void *P, int64_t g0, int64_t g1, const void *act,     \
                         size_t as, int n_tok, float *out, int64_t ldo)                         \
    {                                                                                           \
        const int64_t nb = n / GPE_QK_K;                                                        \
        if (n_tok == 1) {                                                                       \
            for (int64_t g = g0; g < g1; g++) {                                                 \
                __m256 a1 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();                      \
                for (int64_t i = 0; i < nb; i++)                                                \
                    TOKEN1((const uint8_t *)P + (size_t)(g * nb + i) * (BB),                    \
                           (const gpe_block_q8_k *)act + i, KIND, &a1, &m1);                    \
                _mm256_storeu_ps(out + 8 * g, _mm256_sub_ps(a1, m1));                           \
            }                                                                                   \
            return true;                                                                        \
        }                                                                                       \
        kq8_blk B;                                                                              \
        __m256 small[2 * 16];                                                                   \
        __m256 *acc = n_tok <= 16 ? small                                                       \
                                  : aligned_alloc(32, (size_t)n_tok * 2 * sizeof(__m256));     \
        if (!acc)                                                                               \
            return false;                                                                       \
        for (int64_t g = g0; g < g1; g++) {                                                     \
            for (int t = 0; t < 2 * n_tok; t++)                                                 \
                acc[t] = _mm256_setzero_ps();                                                   \
            for (int64_t i = 0; i < nb; i++) {                                                  \
                kq8_build_packed(&B, (const uint8_t *)P + (size_t)(g * nb + i) * (BB), KIND);  \
                for (int t = 0; t < n_tok; t++) {                                               \
                    const gpe_block_q8_k *y =                                                   \
                        (const gpe_block_q8_k *)((const uint8_t *)act + (size_t)t * as) + i;    \
                    TOKEN(&B, y, KIND == PKQ_Q6_K, &acc[2 * t], &acc[2 * t + 1]);               \
                }                                                                               \
            }                                                                                   \
            for (int t = 0; t < n_tok; t++)                                                     \
                _mm256_storeu_ps(out + t * ldo + 8 * g, _mm256_sub_ps(acc[2 * t], acc[2 * t + 1])); \
        }                                                                                       \
        if (acc != small)                                                                       \
            free(acc);                                                                          \
        return true;                                                                            \
    }
PK_KQ(T_VNNI, pk_q4_k_vnni, kq8_token_vnni, pkq_token1_vnni, PKQ_Q4_K, 1184)
PK_KQ(T_VNNI, pk_q5_k_vnni, kq8_token_vnni, pkq_token1_vnni, PKQ_Q5_K, 1440)
PK_KQ(T_VNNI, pk_q6_k_vnni, kq8_token_vnni, pkq_token1_vnni, PKQ_Q6_K, 1680)
PK_KQ(T_AVX2, pk_q4_k_avx2, kq8_token_avx2, pkq_token1_avx2, PKQ_Q4_K, 1184)
PK_KQ(T_AVX2, pk_q5_k_avx2, kq8_token_avx2, pkq_token1_avx2, PKQ_Q5_K, 1440)
PK_KQ(T_AVX2, pk_q6_k_avx2, kq8_token_avx2, pkq_token1_avx2, PKQ_Q6_K, 1680)

/* pshufb pattern per 128-bit lane: lanes 0-1 take int16 scale k0, lanes 2-3 k1. */
T_AVX512 static inline __m512i kq_pick2(int k0, int k1)
{
    const __m256i lo = _mm256_set1_epi16((short)(((2 * k0 + 1) << 8) | (2 * k0)));
    const __m256i hi = _mm256_set1_epi16((short)(((2 * k1 + 1) << 8) | (2 * k1)));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Q4_K (hbits = false) and Q5_K (true): 4 chunks of 64 values per block,
 * chunk c = low nibbles of qs[32c..] then high nibbles (+16 from qh bits
 * 2c / 2c+1 for Q5_K). Float order: see "The K-quant kernels' order". */
T_AVX512 static AI void k512_kq(int64_t n, const uint8_t *xb, size_t bbytes, size_t qs_off,
                                bool hbits, const uint8_t *a, size_t as, int nt, float *out)
{
    const __m512i pick[4] = {kq_pick2(0, 1), kq_pick2(2, 3), kq_pick2(4, 5), kq_pick2(6, 7)};
    float acc[4], accm[4];
    for (int k = 0; k < nt; k++)
        acc[k] = accm[k] = 0.0f;
    for (int64_t i = 0; i < n / GPE_QK_K; i++) {
        const uint8_t *b = xb + (size_t)i * bbytes;   /* d, dmin, scales[12] at 0, 2, 4 */
        uint16_t dh, mh;
        memcpy(&dh, b, 2);
        memcpy(&mh, b + 2, 2);
        const float dw = h2f(dh), dmw = h2f(mh);
        uint8_t sc[8], mn[8];
        kq_unpack(b + 4, sc, mn);
        const __m512i scv =
            _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
        const uint8_t *qs = b + qs_off;
        __m256i qh = hbits ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        __m512i qv[4], scl[4];
        for (int c = 0; c < 4; c++) {
            __m256i lo, hi;
            kq_chunk(qs + 32 * c, hbits, &qh, &lo, &hi);
            qv[c] = cat256(lo, hi);
            scl[c] = _mm512_shuffle_epi8(scv, pick[c]);
        }
        for (int k = 0; k < nt; k++) {
            const gpe_block_q8_k *y = ROW(gpe_block_q8_k, k) + i;
            __m512i sumi = _mm512_setzero_si512();
            for (int c = 0; c < 4; c++)
                sumi = _mm512_add_epi32(
                    sumi, _mm512_madd_epi16(_mm512_maddubs_epi16(
                                                qv[c], _mm512_loadu_si512((const void *)(y->qs + 64 * c))),
                                            scl[c]));
            acc[k] = fma_acc(dw * y->d, _mm512_reduce_add_epi32(sumi), acc[k]);
            accm[k] = fma_acc(dmw * y->d, hsum_i32x4(kq_mins(mn, y->bsums)), accm[k]);
        }
    }
    for (int k = 0; k < nt; k++)
        out[k] = acc[k] - accm[k];
}

T_AVX512 static AI void k512_q6_k(int64_t n, const gpe_block_q6_k *x, const uint8_t *a, size_t as,
                                  int nt, float *out)
{
    /* int16 lane j of a 512-bit vector takes scale j/16 ... of its half */
    const __m512i idx_lo = _mm512_srli_epi16(
        _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14,
                         13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3);
    const __m512i idx_hi = _mm512_add_epi16(idx_lo, _mm512_set1_epi16(4));
    float acc[4];
    for (int k = 0; k < nt; k++)
        acc[k] = 0.0f;
    for (int64_t i = 0; i < n / GPE_QK_K; i++) {
        __m512i qv[4], scl[4];
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h, *qhp = x[i].qh + 32 * h;
            __m256i q[4];
            q6_half(ql, qhp, q);
            int64_t s8;
            memcpy(&s8, x[i].scales + 8 * h, 8);
            const __m512i sv = _mm512_castsi128_si512(_mm_cvtepi8_epi16(_mm_cvtsi64_si128(s8)));
            qv[2 * h] = cat256(q[0], q[1]);
            qv[2 * h + 1] = cat256(q[2], q[3]);
            scl[2 * h] = _mm512_permutexvar_epi16(idx_lo, sv);
            scl[2 * h + 1] = _mm512_permutexvar_epi16(idx_hi, sv);
        }
        const float dw = h2f(x[i].d);
        for (int k = 0; k < nt; k++) {
            const gpe_block_q8_k *y = ROW(gpe_block_q8_k, k) + i;
            __m512i sumi = _mm512_setzero_si512();
            for (int j = 0; j < 4; j++)
                sumi = _mm512_add_epi32(
                    sumi, _mm512_madd_epi16(_mm512_maddubs_epi16(
                                                qv[j], _mm512_loadu_si512((const void *)(y->qs + 64 * j))),
                                            scl[j]));
            acc[k] = fma_acc(dw * y->d, _mm512_reduce_add_epi32(sumi) - q6_corr(x[i].scales, y->bsums),
                             acc[k]);
        }
    }
    for (int k = 0; k < nt; k++)
        out[k] = acc[k];
}

KWRAP(T_AVX512, avx512_f32, k512_f32(n, w, a, as, nt, out))
KWRAP(T_AVX512, avx512_f16, k512_f16(n, w, a, as, nt, out))
KWRAP(T_AVX512, avx512_bf16, k512_bf16(n, w, a, as, nt, out))
KWRAP(T_AVX512, avx512_q8_0, k512_q8_0(n, w, a, as, ad, nt, out))
KWRAP(T_AVX512, avx512_q4_0, k512_q4_0(n, w, a, as, ad, nt, out))
KWRAP(T_VNNI, vnni_q8_0, kvnni_q8_0(n, w, a, as, ad, nt, out))
KWRAP(T_VNNI, vnni_q4_0, kvnni_q4_0(n, w, a, as, ad, nt, out))
KWRAP(T_AVX512, avx512_q4_k, k512_kq(n, w, sizeof(gpe_block_q4_k), offsetof(gpe_block_q4_k, qs), false, a, as, nt, out))
KWRAP(T_AVX512, avx512_q5_k, k512_kq(n, w, sizeof(gpe_block_q5_k), offsetof(gpe_block_q5_k, qs), true, a, as, nt, out))
KWRAP(T_AVX512, avx512_q6_k, k512_q6_k(n, w, a, as, nt, out))

void gpe__kernels_avx512(gpe__kernels *k)
{
#define SET(T, NAME)                     \
    k->dot[T] = NAME##_dot;              \
    k->dotn[T] = NAME##_dotn;
    SET(GPE_TYPE_F32, avx512_f32)
    SET(GPE_TYPE_F16, avx512_f16)
    SET(GPE_TYPE_BF16, avx512_bf16)
    SET(GPE_TYPE_Q8_0, avx512_q8_0)
    SET(GPE_TYPE_Q4_0, avx512_q4_0)
    SET(GPE_TYPE_Q4_K, avx512_q4_k)
    SET(GPE_TYPE_Q5_K, avx512_q5_k)
    SET(GPE_TYPE_Q6_K, avx512_q6_k)
    k->gemm[GPE_TYPE_F16] = gpe__gemm_f16_avx512;
    k->gemm[GPE_TYPE_BF16] = gpe__gemm_bf16_avx512;
    if (__builtin_cpu_supports("avx512vnni")) {
        SET(GPE_TYPE_Q8_0, vnni_q8_0)
        SET(GPE_TYPE_Q4_0, vnni_q4_0)
        k->gemm[GPE_TYPE_Q8_0] = g8_q8_0;
        k->gemm[GPE_TYPE_Q4_0] = g8_q4_0;
        k->gemm[GPE_TYPE_Q4_K] = kq8_q4_k_vnni;
        k->gemm[GPE_TYPE_Q5_K] = kq8_q5_k_vnni;
        k->gemm[GPE_TYPE_Q6_K] = kq8_q6_k_vnni;
        k->packed[GPE_TYPE_Q4_0] = pk_q4_0_vnni;
        k->packed[GPE_TYPE_Q4_K] = pk_q4_k_vnni;
        k->packed[GPE_TYPE_Q5_K] = pk_q5_k_vnni;
        k->packed[GPE_TYPE_Q6_K] = pk_q6_k_vnni;
    }
#undef SET
}

#else /* not x86-64: scalar kernels only */

bool gpe__have_x86_kernels(void) { return false; }
void gpe__kernels_avx2(gpe__kernels *k) { (void)k; }
void gpe__kernels_avx512(gpe__kernels *k) { (void)k; }

#endif
