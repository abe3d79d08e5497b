/*
 * quant_x86_f16: blocked F16 and BF16 matmuls for prompt-sized batches
 * (AVX2 and AVX-512), the gemm entries of the kernel table.
 *
 * The per-token F16 kernels (quant_x86.c) convert every activation element
 * once per (weight row, token) and every weight element once per (row,
 * group of up to 4 tokens). Here the activations are converted to F32 once
 * per call (exact: every F16 value is a float; BF16's vec_dot type is F32
 * already), and an R x T tile of weight rows and tokens shares each
 * converted weight vector and each activation load.
 *
 * Each (row, token) pair keeps exactly the accumulators, the element order
 * and the final reduction of its ISA's per-token kernel, so every output is
 * bit-identical to gpe_vec_dot.
 *
 * Loops, outer to inner: panels of tokens (their F32 activations stay in
 * L2), tiles of R rows, tiles of T tokens, each tile over whole rows: a
 * tile's R weight rows stay in L1 while the panel's tokens pass over them
 * in long runs the prefetchers follow. (Blocking the columns too, with the
 * pairs' accumulators stored between chunks, measured slower on Zen 4: the
 * short runs of each chunk were not prefetched in time.)
 */
#include "engine/quant_x86.h"

#include <stdlib.h>

#if defined(__x86_64__)

#define AI __attribute__((always_inline)) inline

/* One tile: row r's weights at w + r * rs bytes, token t's F32
 * activations at a + t * as floats, pair (r, t) to out[t * ldo + r]. */
typedef struct tile_args {
    const uint8_t *w;
    size_t rs;
    const float *a;
    size_t as;
    int64_t n;
    float *out;
    int64_t ldo;
} tile_args;

/* nr <= R rows x nt <= T tokens. */
typedef void (*tile_fn)(const tile_args *p, int nr, int nt);

typedef struct gemm_kernel {
    tile_fn tile;
    int R, T;
} gemm_kernel;

/* Tokens per panel: the panel's F32 activations within about a third of
 * L2. A whole number of tiles, at least one. */
static int panel_tokens(size_t as, int T)
{
    const size_t budget = 384u * 1024u / sizeof(float);
    const int p = (int)(budget / as) / T * T;
    return p < T ? T : p;
}

/* Rows [r0, r1) x n_tok F32 activation rows (as floats apart); returns r1. */
static int64_t gemm_tiles(const gemm_kernel *K, int64_t n, const void *W, size_t rs, int64_t r0,
                          int64_t r1, const float *a, size_t as, int n_tok, float *out, int64_t ldo)
{
    const int R = K->R, T = K->T, ntp = panel_tokens(as, T);
    for (int tp = 0; tp < n_tok; tp += ntp) {
        const int tpe = n_tok - tp < ntp ? n_tok : tp + ntp;
        for (int64_t r = r0; r < r1; r += R) {
            for (int t = tp; t < tpe; t += T) {
                const tile_args p = {.w = (const uint8_t *)W + (size_t)r * rs, .rs = rs,
                                     .a = a + (size_t)t * as, .as = as, .n = n,
                                     .out = out + (int64_t)t * ldo + r, .ldo = ldo};
                K->tile(&p, r1 - r < R ? (int)(r1 - r) : R, tpe - t < T ? tpe - t : T);
            }
        }
    }
    return r1;
}

/* F16: the activations to F32 first, once per call. */
T_AVX2 static int64_t gemm_f16(const gemm_kernel *K, int64_t n, const void *W, size_t rs, int64_t r0,
                               int64_t r1, const void *act, size_t as, int n_tok, float *out,
                               int64_t ldo)
{
    const size_t fas = ((size_t)n + 15) / 16 * 16;   /* whole 64-byte lines */
    float *f = aligned_alloc(64, (size_t)n_tok * fas * sizeof *f);
    if (!f)
        return r0;
    for (int t = 0; t < n_tok; t++) {
        const uint16_t *y = (const uint16_t *)((const uint8_t *)act + (size_t)t * as);
        float *o = f + (size_t)t * fas;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            _mm256_store_ps(o + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i))));
        for (; i < n; i++)
            o[i] = h2f(y[i]);
    }
    const int64_t done = gemm_tiles(K, n, W, rs, r0, r1, f, fas, n_tok, out, ldo);
    free(f);
    return done;
}

/* A tile function NAME for FULL(p, dr, dt, R, T): the R x T instance and,
 * at the edges (fewer rows or tokens left), R x 1 or 1 x 1 instances for
 * the sub-tile at row dr, token dt. Each instance is a function of its
 * own: GCC allocated the 24 accumulators of one instance to registers, but
 * spilled some in the hot loop when the instances shared a function. */
#define TILE_FN(TGT, NAME, FULL, R, T)                                                         \
    TGT static __attribute__((noinline)) void NAME##_full(const tile_args *p)                \
    {                                                                                          \
        FULL(p, 0, 0, R, T);                                                                   \
    }                                                                                          \
    TGT static __attribute__((noinline)) void NAME##_col(const tile_args *p, int dt)         \
    {                                                                                          \
        FULL(p, 0, dt, R, 1);                                                                  \
    }                                                                                          \
    TGT static __attribute__((noinline)) void NAME##_one(const tile_args *p, int dr, int dt) \
    {                                                                                          \
        FULL(p, dr, dt, 1, 1);                                                                 \
    }                                                                                          \
    static void NAME(const tile_args *p, int nr, int nt)                                       \
    {                                                                                          \
        if (nr == (R) && nt == (T)) {                                                          \
            NAME##_full(p);                                                                    \
        } else if (nr == (R)) {                                                                \
            for (int t = 0; t < nt; t++)                                                       \
                NAME##_col(p, t);                                                              \
        } else {                                                                               \
            for (int r = 0; r < nr; r++)                                                       \
                for (int t = 0; t < nt; t++)                                                   \
                    NAME##_one(p, r, t);                                                       \
        }                                                                                      \
    }

/* The loops over r < R and t < T (constants in each instance) unrolled
 * outright, so that the accumulators are registers. */
#define UNROLL _Pragma("GCC unroll 8")

/* An activation vector loaded once into a register for the R rows: left
 * to itself GCC folds the load into each of the R FMAs, and the loads,
 * not the FMAs, then bound the loop (Zen 4: 2 ymm or 1 zmm load a cycle). */
#define KEEP_IN_REG(v) __asm__("" : "+v"(v))

/* ================================================================ AVX2 */

#define A2_RMAX 3
#define A2_TMAX 3

/* Weights w[i..i+7] as floats: F16 or BF16 (the upper half of a float). */
T_AVX2 static AI __m256 a2_w8(const uint16_t *w, bool bf16)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)w);
    if (bf16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    return _mm256_cvtph_ps(v);
}

/* One 8-column step at i of every (row, token) pair into s. */
T_AVX2 static AI void a2_step(const uint16_t *const *x, const float *a, size_t as, int64_t i, int R,
                              int T, bool bf16, __m256 s[A2_RMAX][A2_TMAX])
{
    __m256 wv[A2_RMAX];
    UNROLL for (int r = 0; r < R; r++)
        wv[r] = a2_w8(x[r] + i, bf16);
    UNROLL for (int t = 0; t < T; t++) {
        __m256 av = _mm256_loadu_ps(a + (size_t)t * as + i);
        KEEP_IN_REG(av);
        UNROLL for (int r = 0; r < R; r++)
            s[r][t] = _mm256_fmadd_ps(wv[r], av, s[r][t]);
    }
}

/* F16 (nacc = 2), k2_f16's order: columns i..i+7 of each 16 into s0,
 * i+8..i+15 into s1, hsum256(s0 + s1), then the tail one by one. BF16
 * (nacc = 1), k2_bf16's: by 8 into s0, hsum256(s0), the tail. The tail is
 * the per-token kernels' expression, s += w * y, so that the compiler
 * contracts it into an FMA in both or in neither (for F16 it makes no
 * difference: a product of two halves is exact in a float). */
T_AVX2 static AI void a2_full(const tile_args *p, int dr, int dt, int R, int T, int nacc, bool bf16)
{
    const uint16_t *x[A2_RMAX];
    const float *a = p->a + (size_t)dt * p->as;
    __m256 s[2][A2_RMAX][A2_TMAX];
    UNROLL for (int r = 0; r < R; r++) {
        x[r] = (const uint16_t *)(p->w + (size_t)(dr + r) * p->rs);
        UNROLL for (int t = 0; t < T; t++)
            s[0][r][t] = s[1][r][t] = _mm256_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 8 * nacc <= p->n; i += 8 * nacc) {
        a2_step(x, a, p->as, i, R, T, bf16, s[0]);
        if (nacc == 2)
            a2_step(x, a, p->as, i + 8, R, T, bf16, s[1]);
    }
    UNROLL for (int r = 0; r < R; r++) {
        UNROLL for (int t = 0; t < T; t++) {
            const float *y = a + (size_t)t * p->as;
            float v = hsum256(nacc == 2 ? _mm256_add_ps(s[0][r][t], s[1][r][t]) : s[0][r][t]);
            for (int64_t j = i; j < p->n; j++)
                v += (bf16 ? bf2f(x[r][j]) : h2f(x[r][j])) * y[j];
            p->out[(int64_t)(dt + t) * p->ldo + dr + r] = v;
        }
    }
}

/* F16: two accumulators per pair, 3 x 2 pairs (with 3 row vectors and a
 * token vector, all 16 ymm registers; faster than 2 x 3, whose token
 * vectors serve 2 rows only). BF16: one, 3 x 3 (3 x 4 pushed an
 * accumulator to the stack). */
#define A2_F16(p, dr, dt, R, T) a2_full(p, dr, dt, R, T, 2, false)
#define A2_BF16(p, dr, dt, R, T) a2_full(p, dr, dt, R, T, 1, true)
TILE_FN(T_AVX2, a2_tile_f16, A2_F16, 3, 2)
TILE_FN(T_AVX2, a2_tile_bf16, A2_BF16, 3, 3)

static const gemm_kernel k_a2_f16 = {a2_tile_f16, 3, 2};
static const gemm_kernel k_a2_bf16 = {a2_tile_bf16, 3, 3};

int64_t gpe__gemm_f16_avx2(int64_t n, const void *W, size_t rs, int64_t r0, int64_t r1,
                           const void *act, size_t as, int n_tok, float *out, int64_t ldo)
{
    return gemm_f16(&k_a2_f16, n, W, rs, r0, r1, act, as, n_tok, out, ldo);
}

int64_t gpe__gemm_bf16_avx2(int64_t n, const void *W, size_t rs, int64_t r0, int64_t r1,
                            const void *act, size_t as, int n_tok, float *out, int64_t ldo)
{
    return gemm_tiles(&k_a2_bf16, n, W, rs, r0, r1, act, as / sizeof(float), n_tok, out, ldo);
}

/* ============================================================== AVX-512 */

#define A5_RMAX 4
#define A5_TMAX 6

T_AVX512 static AI __m512 a5_w16(const uint16_t *w, bool bf16)
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)w);
    if (bf16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
    return _mm512_cvtph_ps(v);
}

/* One 16-column step at i of every (row, token) pair into s. */
T_AVX512 static AI void a5_step(const uint16_t *const *x, const float *a, size_t as, int64_t i,
                                int R, int T, bool bf16, __m512 s[A5_RMAX][A5_TMAX])
{
    __m512 wv[A5_RMAX];
    UNROLL for (int r = 0; r < R; r++)
        wv[r] = a5_w16(x[r] + i, bf16);
    UNROLL for (int t = 0; t < T; t++) {
        __m512 av = _mm512_loadu_ps(a + (size_t)t * as + i);
        KEEP_IN_REG(av);
        UNROLL for (int r = 0; r < R; r++)
            s[r][t] = _mm512_fmadd_ps(wv[r], av, s[r][t]);
    }
}

/* F16 (nacc = 2), k512_f16's order: columns i..i+15 of each 32 into s0,
 * i+16..i+31 into s1, a last 16 into s0, reduce(s0 + s1), then the tail
 * one by one. BF16 (nacc = 1), k512_bf16's: by 16 into s0, reduce(s0), the
 * tail. */
T_AVX512 static AI void a5_full(const tile_args *p, int dr, int dt, int R, int T, int nacc, bool bf16)
{
    const uint16_t *x[A5_RMAX];
    const float *a = p->a + (size_t)dt * p->as;
    __m512 s[2][A5_RMAX][A5_TMAX];
    UNROLL for (int r = 0; r < R; r++) {
        x[r] = (const uint16_t *)(p->w + (size_t)(dr + r) * p->rs);
        UNROLL for (int t = 0; t < T; t++)
            s[0][r][t] = s[1][r][t] = _mm512_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 16 * nacc <= p->n; i += 16 * nacc) {
        a5_step(x, a, p->as, i, R, T, bf16, s[0]);
        if (nacc == 2)
            a5_step(x, a, p->as, i + 16, R, T, bf16, s[1]);
    }
    if (nacc == 2 && i + 16 <= p->n) {
        a5_step(x, a, p->as, i, R, T, bf16, s[0]);
        i += 16;
    }
    UNROLL for (int r = 0; r < R; r++) {
        UNROLL for (int t = 0; t < T; t++) {
            const float *y = a + (size_t)t * p->as;
            float v = _mm512_reduce_add_ps(nacc == 2 ? _mm512_add_ps(s[0][r][t], s[1][r][t])
                                                     : s[0][r][t]);
            for (int64_t j = i; j < p->n; j++)
                v += (bf16 ? bf2f(x[r][j]) : h2f(x[r][j])) * y[j];
            p->out[(int64_t)(dt + t) * p->ldo + dr + r] = v;
        }
    }
}

/* F16: two accumulators per pair, 3 x 4 pairs; BF16: one, 4 x 6. 24
 * accumulators plus the row and token vectors fit the 32 zmm registers. */
#define A5_F16(p, dr, dt, R, T) a5_full(p, dr, dt, R, T, 2, false)
#define A5_BF16(p, dr, dt, R, T) a5_full(p, dr, dt, R, T, 1, true)
TILE_FN(T_AVX512, a5_tile_f16, A5_F16, 3, 4)
TILE_FN(T_AVX512, a5_tile_bf16, A5_BF16, 4, 6)

static const gemm_kernel k_a5_f16 = {a5_tile_f16, 3, 4};
static const gemm_kernel k_a5_bf16 = {a5_tile_bf16, 4, 6};

int64_t gpe__gemm_f16_avx512(int64_t n, const void *W, size_t rs, int64_t r0, int64_t r1,
                             const void *act, size_t as, int n_tok, float *out, int64_t ldo)
{
    return gemm_f16(&k_a5_f16, n, W, rs, r0, r1, act, as, n_tok, out, ldo);
}

int64_t gpe__gemm_bf16_avx512(int64_t n, const void *W, size_t rs, int64_t r0, int64_t r1,
                              const void *act, size_t as, int n_tok, float *out, int64_t ldo)
{
    return gemm_tiles(&k_a5_bf16, n, W, rs, r0, r1, act, as / sizeof(float), n_tok, out, ldo);
}

#endif
