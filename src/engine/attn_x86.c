/*
 * attn_x86: AVX2 (+FMA, F16C) and AVX-512 kernels of the attention (the
 * contract of each is in attn_impl.h).
 *
 * Each function carries its own target attribute, so the file builds with
 * the project's generic flags and attn.c picks a set at run time (the ISA
 * the quant module chose). Scores put 16 keys of one K block in the lanes
 * (the cache stores K blocks transposed, kv.h); the sums over V put
 * dimensions in the lanes. Either way every lane runs the portable kernel's
 * sequence of operations for its element, so the results are the same bits
 * on every path.
 */
#include "engine/attn_impl.h"

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define T_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
#define AI __attribute__((always_inline)) inline
#define RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* Lanes of block b (keys 16 b .. 16 b + 15) inside [lo, hi], as bits. */
static inline uint32_t block_lanes(int b, int lo, int hi)
{
    const int first = lo > 16 * b ? lo - 16 * b : 0;
    const int last = hi < 16 * b + 15 ? hi - 16 * b : 15;
    return ((1u << (last + 1)) - 1u) & ~((1u << first) - 1u);
}

/* The next of the fewest chunks of at most max rows that cover n rows,
 * as even as can be (8 rows in 4 + 4 rather than 6 + 2: a thin chunk
 * spends as many loads of V on fewer sums). */
static inline int even_chunk(int n, int max)
{
    const int chunks = (n + max - 1) / max;
    return (n + chunks - 1) / chunks;
}

/* Zero s[0, 16 b0) and s[16 (b1 + 1), n): keys of no block the row uses. */
static void zero_outside(float *s, int b0, int b1, int n)
{
    memset(s, 0, (size_t)b0 * 16 * sizeof(float));
    memset(s + (size_t)(b1 + 1) * 16, 0, (size_t)(n - (b1 + 1) * 16) * sizeof(float));
}

/* ================================================================ AVX2 */

T_AVX2 static void y_f16_to_f32(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = _cvtsh_ss(src[i]);
}

T_AVX2 static void y_round_f16(float *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), RNE)));
    for (; i < n; i++)
        x[i] = _cvtsh_ss(_cvtss_sh(x[i], RNE));
}

T_AVX2 static AI __m256 y_exp(__m256 x)
{
    const __m256 ok = _mm256_cmp_ps(x, _mm256_set1_ps(GPE_ATTN_EXP_LO), _CMP_GE_OQ);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(GPE_ATTN_LOG2E)), RNE);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-GPE_ATTN_LN2_HI), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-GPE_ATTN_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(GPE_ATTN_P0), r, _mm256_set1_ps(GPE_ATTN_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(GPE_ATTN_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(GPE_ATTN_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(GPE_ATTN_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(GPE_ATTN_P5));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(ok, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

/* Lanes of half h (0, 1) of block b inside [lo, hi], as a vector mask. */
T_AVX2 static AI __m256 y_mask(int b, int h, int lo, int hi)
{
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(16 * b + 8 * h),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i ge = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(lo - 1));
    const __m256i le = _mm256_cmpgt_epi32(_mm256_set1_epi32(hi + 1), idx);
    return _mm256_castsi256_ps(_mm256_and_si256(ge, le));
}

T_AVX2 static void y_softmax(float *s, int lo, int hi, int n, bool f16)
{
    const int b0 = lo / 16, b1 = hi / 16;
    __m256 vmx = _mm256_set1_ps(-INFINITY);
    for (int b = b0; b <= b1; b++)
        for (int h = 0; h < 2; h++)
            vmx = _mm256_max_ps(vmx, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY),
                                                      _mm256_loadu_ps(s + 16 * b + 8 * h),
                                                      y_mask(b, h, lo, hi)));
    /* the max is exact in any order */
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmx), _mm256_extractf128_ps(vmx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const __m256 mx = _mm256_set1_ps(_mm_cvtss_f32(m4));

    __m256d acc[4] = { _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                       _mm256_setzero_pd() };
    for (int b = b0; b <= b1; b++)
        for (int h = 0; h < 2; h++) {
            float *p = s + 16 * b + 8 * h;
            const __m256 e = _mm256_and_ps(y_mask(b, h, lo, hi), y_exp(_mm256_sub_ps(_mm256_loadu_ps(p), mx)));
            _mm256_storeu_ps(p, e);
            acc[2 * h] = _mm256_add_pd(acc[2 * h], _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
            acc[2 * h + 1] = _mm256_add_pd(acc[2 * h + 1], _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
        }
    double lane[GPE_ATTN_KB];
    for (int i = 0; i < 4; i++)
        _mm256_storeu_pd(lane + 4 * i, acc[i]);
    const __m256 inv = _mm256_set1_ps((float)(1.0 / gpe__attn_sum16(lane)));
    for (int i = 16 * b0; i < 16 * (b1 + 1); i += 8) {
        __m256 w = _mm256_mul_ps(_mm256_loadu_ps(s + i), inv);
        if (f16)
            w = _mm256_cvtph_ps(_mm256_cvtps_ph(w, RNE));
        _mm256_storeu_ps(s + i, w);
    }
    zero_outside(s, b0, b1, n);
}

/* NR rows x NB blocks (two 8-lane halves each) of scores. */
T_AVX2 static AI void y_qk_tile(const float *q, int hd, const float *kt, size_t kbs, float scale,
                                float *s, size_t ss, const int NR, const int NB)
{
    __m256 acc[2][2][2];
    for (int r = 0; r < NR; r++)
        for (int b = 0; b < NB; b++)
            acc[r][b][0] = acc[r][b][1] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d++) {
        __m256 k[2][2];
        for (int b = 0; b < NB; b++) {
            k[b][0] = _mm256_loadu_ps(kt + b * kbs + (size_t)d * 16);
            k[b][1] = _mm256_loadu_ps(kt + b * kbs + (size_t)d * 16 + 8);
        }
        for (int r = 0; r < NR; r++) {
            const __m256 qv = _mm256_set1_ps(q[(size_t)r * hd + d]);
            for (int b = 0; b < NB; b++) {
                acc[r][b][0] = _mm256_fmadd_ps(qv, k[b][0], acc[r][b][0]);
                acc[r][b][1] = _mm256_fmadd_ps(qv, k[b][1], acc[r][b][1]);
            }
        }
    }
    const __m256 sc = _mm256_set1_ps(scale);
    for (int r = 0; r < NR; r++)
        for (int b = 0; b < NB; b++) {
            _mm256_storeu_ps(s + r * ss + (size_t)b * 16, _mm256_mul_ps(acc[r][b][0], sc));
            _mm256_storeu_ps(s + r * ss + (size_t)b * 16 + 8, _mm256_mul_ps(acc[r][b][1], sc));
        }
}

T_AVX2 static void y_qk(const float *q, int nr, int hd, const float *kt, size_t kbs, int nb,
                        float scale, float *s, size_t ss)
{
    for (int r0 = 0; r0 < nr; r0 += 2)
        for (int b0 = 0; b0 < nb; b0 += 2) {
            const int r = nr - r0 < 2 ? nr - r0 : 2, b = nb - b0 < 2 ? nb - b0 : 2;
            const float *qr = q + (size_t)r0 * hd, *k = kt + (size_t)b0 * kbs;
            float *sr = s + (size_t)r0 * ss + (size_t)b0 * 16;
            switch (r * 4 + b) {
            case 4 + 1: y_qk_tile(qr, hd, k, kbs, scale, sr, ss, 1, 1); break;
            case 4 + 2: y_qk_tile(qr, hd, k, kbs, scale, sr, ss, 1, 2); break;
            case 8 + 1: y_qk_tile(qr, hd, k, kbs, scale, sr, ss, 2, 1); break;
            default: y_qk_tile(qr, hd, k, kbs, scale, sr, ss, 2, 2); break;
            }
        }
}

/* NR rows x ND vectors of 8 dims from d0 (the last one masked by tail). */
T_AVX2 static AI void y_pv_tile(const float *w, size_t ws, const float *v, size_t vs, int nk,
                                float *const *out, int d0, __m256i tail, const int NR, const int ND)
{
    const __m256i all = _mm256_set1_epi32(-1);
    __m256 acc[4][2];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < ND; c++)
            acc[r][c] = _mm256_maskload_ps(out[r] + d0 + 8 * c, c == ND - 1 ? tail : all);
    for (int j = 0; j < nk; j++) {
        __m256 x[2];
        for (int c = 0; c < ND; c++)
            x[c] = _mm256_maskload_ps(v + j * vs + (size_t)(d0 + 8 * c), c == ND - 1 ? tail : all);
        for (int r = 0; r < NR; r++) {
            const __m256 wr = _mm256_set1_ps(w[r * ws + (size_t)j]);
            for (int c = 0; c < ND; c++)
                acc[r][c] = _mm256_fmadd_ps(wr, x[c], acc[r][c]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < ND; c++)
            _mm256_maskstore_ps(out[r] + d0 + 8 * c, c == ND - 1 ? tail : all, acc[r][c]);
}

T_AVX2 static void y_pv(const float *w, size_t ws, int nr, const float *v, size_t vs, int nk, int hd,
                        float *const *out)
{
    for (int d0 = 0; d0 < hd; d0 += 16) {
        const int rem = hd - d0 < 16 ? hd - d0 : 16, nd = (rem + 7) / 8;
        const int last = rem - 8 * (nd - 1);
        const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(last),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int r0 = 0, r; r0 < nr; r0 += r) {
            r = even_chunk(nr - r0, 4);
            const float *wr = w + (size_t)r0 * ws;
            float *const *o = out + r0;
            switch (r * 4 + nd) {
#define PV_CASE(R, D) case (R) * 4 + (D): y_pv_tile(wr, ws, v, vs, nk, o, d0, tail, R, D); break;
                PV_CASE(1, 1) PV_CASE(1, 2) PV_CASE(2, 1) PV_CASE(2, 2)
                PV_CASE(3, 1) PV_CASE(3, 2) PV_CASE(4, 1)
                default: y_pv_tile(wr, ws, v, vs, nk, o, d0, tail, 4, 2); break;
#undef PV_CASE
            }
        }
    }
}

static const gpe__attn_kern kern_avx2 = { y_f16_to_f32, y_round_f16, y_qk, y_softmax, y_pv };

/* ============================================================= AVX-512 */

T_AVX512 static void z_f16_to_f32(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    for (; i < n; i++)
        dst[i] = _cvtsh_ss(src[i]);
}

T_AVX512 static void z_round_f16(float *x, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(x + i), RNE)));
    for (; i < n; i++)
        x[i] = _cvtsh_ss(_cvtss_sh(x[i], RNE));
}

T_AVX512 static AI __m512 z_exp(__m512 x)
{
    const __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(GPE_ATTN_EXP_LO), _CMP_GE_OQ);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(GPE_ATTN_LOG2E)), RNE);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-GPE_ATTN_LN2_HI), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-GPE_ATTN_LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(GPE_ATTN_P0), r, _mm512_set1_ps(GPE_ATTN_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(GPE_ATTN_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(GPE_ATTN_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(GPE_ATTN_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(GPE_ATTN_P5));
    const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(ok, y, _mm512_castsi512_ps(e));
}

T_AVX512 static void z_softmax(float *s, int lo, int hi, int n, bool f16)
{
    const int b0 = lo / 16, b1 = hi / 16;
    __m512 vmx = _mm512_set1_ps(-INFINITY);
    for (int b = b0; b <= b1; b++)
        vmx = _mm512_mask_max_ps(vmx, (__mmask16)block_lanes(b, lo, hi), vmx,
                                 _mm512_loadu_ps(s + 16 * b));
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmx));   /* exact in any order */

    __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
    for (int b = b0; b <= b1; b++) {
        float *p = s + 16 * b;
        const __m512 e = _mm512_maskz_mov_ps((__mmask16)block_lanes(b, lo, hi),
                                             z_exp(_mm512_sub_ps(_mm512_loadu_ps(p), mx)));
        _mm512_storeu_ps(p, e);
        acc0 = _mm512_add_pd(acc0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        acc1 = _mm512_add_pd(acc1, _mm512_cvtps_pd(_mm256_castpd_ps(
                                       _mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    double lane[GPE_ATTN_KB];
    _mm512_storeu_pd(lane, acc0);
    _mm512_storeu_pd(lane + 8, acc1);
    const __m512 inv = _mm512_set1_ps((float)(1.0 / gpe__attn_sum16(lane)));
    for (int b = b0; b <= b1; b++) {
        __m512 w = _mm512_mul_ps(_mm512_loadu_ps(s + 16 * b), inv);
        if (f16)
            w = _mm512_cvtph_ps(_mm512_cvtps_ph(w, RNE));
        _mm512_storeu_ps(s + 16 * b, w);
    }
    zero_outside(s, b0, b1, n);
}

/* NR rows x NB blocks of scores, one register each. */
T_AVX512 static AI void z_qk_tile(const float *q, int hd, const float *kt, size_t kbs, float scale,
                                  float *s, size_t ss, const int NR, const int NB)
{
    __m512 acc[4][4];
    for (int r = 0; r < NR; r++)
        for (int b = 0; b < NB; b++)
            acc[r][b] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        __m512 k[4];
        for (int b = 0; b < NB; b++)
            k[b] = _mm512_loadu_ps(kt + b * kbs + (size_t)d * 16);
        for (int r = 0; r < NR; r++) {
            const __m512 qv = _mm512_set1_ps(q[(size_t)r * hd + d]);
            for (int b = 0; b < NB; b++)
                acc[r][b] = _mm512_fmadd_ps(qv, k[b], acc[r][b]);
        }
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int r = 0; r < NR; r++)
        for (int b = 0; b < NB; b++)
            _mm512_storeu_ps(s + r * ss + (size_t)b * 16, _mm512_mul_ps(acc[r][b], sc));
}

T_AVX512 static void z_qk(const float *q, int nr, int hd, const float *kt, size_t kbs, int nb,
                          float scale, float *s, size_t ss)
{
    for (int r0 = 0; r0 < nr; r0 += 4)
        for (int b0 = 0; b0 < nb; b0 += 4) {
            const int r = nr - r0 < 4 ? nr - r0 : 4, b = nb - b0 < 4 ? nb - b0 : 4;
            const float *qr = q + (size_t)r0 * hd, *k = kt + (size_t)b0 * kbs;
            float *sr = s + (size_t)r0 * ss + (size_t)b0 * 16;
            switch (r * 8 + b) {
#define QK_CASE(R, B) case (R) * 8 + (B): z_qk_tile(qr, hd, k, kbs, scale, sr, ss, R, B); break;
                QK_CASE(1, 1) QK_CASE(1, 2) QK_CASE(1, 3) QK_CASE(1, 4)
                QK_CASE(2, 1) QK_CASE(2, 2) QK_CASE(2, 3) QK_CASE(2, 4)
                QK_CASE(3, 1) QK_CASE(3, 2) QK_CASE(3, 3) QK_CASE(3, 4)
                QK_CASE(4, 1) QK_CASE(4, 2) QK_CASE(4, 3)
                default: z_qk_tile(qr, hd, k, kbs, scale, sr, ss, 4, 4); break;
#undef QK_CASE
            }
        }
}

/* NR rows x ND vectors of 16 dims from d0 (the last one masked by tail). */
T_AVX512 static AI void z_pv_tile(const float *w, size_t ws, const float *v, size_t vs, int nk,
                                  float *const *out, int d0, __mmask16 tail, const int NR,
                                  const int ND)
{
    __m512 acc[6][4];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < ND; c++)
            acc[r][c] = _mm512_maskz_loadu_ps(c == ND - 1 ? tail : 0xffff, out[r] + d0 + 16 * c);
    for (int j = 0; j < nk; j++) {
        __m512 x[4];
        for (int c = 0; c < ND; c++)
            x[c] = _mm512_maskz_loadu_ps(c == ND - 1 ? tail : 0xffff, v + j * vs + (size_t)(d0 + 16 * c));
        for (int r = 0; r < NR; r++) {
            const __m512 wr = _mm512_set1_ps(w[r * ws + (size_t)j]);
            for (int c = 0; c < ND; c++)
                acc[r][c] = _mm512_fmadd_ps(wr, x[c], acc[r][c]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < ND; c++)
            _mm512_mask_storeu_ps(out[r] + d0 + 16 * c, c == ND - 1 ? tail : 0xffff, acc[r][c]);
}

T_AVX512 static void z_pv(const float *w, size_t ws, int nr, const float *v, size_t vs, int nk,
                          int hd, float *const *out)
{
    for (int d0 = 0; d0 < hd; d0 += 64) {
        const int rem = hd - d0 < 64 ? hd - d0 : 64, nd = (rem + 15) / 16;
        const __mmask16 tail = (__mmask16)((1u << (rem - 16 * (nd - 1))) - 1u);
        for (int r0 = 0, r; r0 < nr; r0 += r) {
            r = even_chunk(nr - r0, 6);
            const float *wr = w + (size_t)r0 * ws;
            float *const *o = out + r0;
            switch (r * 8 + nd) {
#define PV_CASE(R, D) case (R) * 8 + (D): z_pv_tile(wr, ws, v, vs, nk, o, d0, tail, R, D); break;
                PV_CASE(1, 1) PV_CASE(1, 2) PV_CASE(1, 3) PV_CASE(1, 4)
                PV_CASE(2, 1) PV_CASE(2, 2) PV_CASE(2, 3) PV_CASE(2, 4)
                PV_CASE(3, 1) PV_CASE(3, 2) PV_CASE(3, 3) PV_CASE(3, 4)
                PV_CASE(4, 1) PV_CASE(4, 2) PV_CASE(4, 3) PV_CASE(4, 4)
                PV_CASE(5, 1) PV_CASE(5, 2) PV_CASE(5, 3) PV_CASE(5, 4)
                PV_CASE(6, 1) PV_CASE(6, 2) PV_CASE(6, 3)
                default: z_pv_tile(wr, ws, v, vs, nk, o, d0, tail, 6, 4); break;
#undef PV_CASE
            }
        }
    }
}

static const gpe__attn_kern kern_avx512 = { z_f16_to_f32, z_round_f16, z_qk, z_softmax, z_pv };

const gpe__attn_kern *gpe__attn_kern_x86(gpe_isa isa)
{
    switch (isa) {
    case GPE_ISA_AVX512: return &kern_avx512;
    case GPE_ISA_AVX2: return &kern_avx2;
    default: return NULL;
    }
}

#else /* not x86-64: the portable kernels only */

const gpe__attn_kern *gpe__attn_kern_x86(gpe_isa isa)
{
    (void)isa;
    return NULL;
}

#endif
