/*
 * Internal to attn.c / attn_x86.c: the per-ISA kernel table and the pieces
 * of arithmetic every kernel set shares. Not part of the engine's interface
 * (use attn.h).
 *
 * Every kernel set computes each element with the same sequence of float
 * operations as the portable one (fmaf chains in a fixed order, the same
 * exp polynomial, the same reduction tree), so the ISA in use changes
 * speed, never bits.
 */
#ifndef GPE_ATTN_IMPL_H
#define GPE_ATTN_IMPL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "engine/quant.h"

/* Keys per K block: the cache's K layout (kv.h), and the lane count of the
 * softmax sums. */
#define GPE_ATTN_KB 16

typedef struct gpe__attn_kern {
    /* dst[i] = src[i] (F16 bits) as float, i < n: exact. */
    void (*f16_to_f32)(const uint16_t *src, float *dst, size_t n);
    /* x[i] = x[i] rounded to F16 (nearest even) and back, i < n. */
    void (*round_f16)(float *x, size_t n);
    /* Scores of nr query rows against nb K blocks:
     *   s[r*ss + b*16 + l] = scale * (fma chain over d = 0..hd-1 of
     *                        q[r*hd + d] * kt[b*kbs + d*16 + l])
     * kt blocks are [hd][16] floats. */
    void (*qk)(const float *q, int nr, int hd, const float *kt, size_t kbs, int nb, float scale,
               float *s, size_t ss);
    /* One row of scores s[0..n) (n a multiple of 16, s[0] the first key of
     * a block) becomes softmax weights over [lo, hi]: m = max, e = exp(s -
     * m), sum in double per lane (index mod 16) then gpe__attn_sum16,
     * w = e * (float)(1 / sum) [rounded to F16 when f16]; zero outside. */
    void (*softmax)(float *s, int lo, int hi, int n, bool f16);
    /* out[r][d] = fma(w[r*ws + j], v[j*vs + d], out[r][d]) for j = 0..nk-1
     * in order, r < nr, d < hd. */
    void (*pv)(const float *w, size_t ws, int nr, const float *v, size_t vs, int nk, int hd,
               float *const *out);
} gpe__attn_kern;

/* The x86 kernel set for isa (AVX2 or AVX-512), or NULL (scalar, or a build
 * without them). Only ask for an ISA the CPU has (gpe_quant_isa does). */
const gpe__attn_kern *gpe__attn_kern_x86(gpe_isa isa);

/* exp(x) for softmax arguments (x <= 0): n = round(x log2 e), r = x - n ln 2
 * in two steps, Cephes' degree-5 polynomial for e^r (about 1 ulp), times
 * 2^n built from bits. x below -87 (and NaN) gives 0: e^-87 is far below
 * anything a sum that includes e^0 = 1 can notice. The SIMD kernels do
 * exactly these operations lane by lane. */
#define GPE_ATTN_EXP_LO (-87.0f)
#define GPE_ATTN_LOG2E 1.44269504088896341f
#define GPE_ATTN_LN2_HI 0.693359375f
#define GPE_ATTN_LN2_LO (-2.12194440e-4f)
#define GPE_ATTN_P0 1.9875691500e-4f
#define GPE_ATTN_P1 1.3981999507e-3f
#define GPE_ATTN_P2 8.3334519073e-3f
#define GPE_ATTN_P3 4.1665795894e-2f
#define GPE_ATTN_P4 1.6666665459e-1f
#define GPE_ATTN_P5 5.0000001201e-1f

static inline float gpe__attn_exp(float x)
{
    if (!(x >= GPE_ATTN_EXP_LO))
        return 0.0f;
    const float n = nearbyintf(x * GPE_ATTN_LOG2E);
    float r = fmaf(n, -GPE_ATTN_LN2_HI, x);
    r = fmaf(n, -GPE_ATTN_LN2_LO, r);
    float p = fmaf(GPE_ATTN_P0, r, GPE_ATTN_P1);
    p = fmaf(p, r, GPE_ATTN_P2);
    p = fmaf(p, r, GPE_ATTN_P3);
    p = fmaf(p, r, GPE_ATTN_P4);
    p = fmaf(p, r, GPE_ATTN_P5);
    const float y = fmaf(p, r * r, r) + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return y * two_n;
}

/* The softmax denominator from its 16 per-lane partial sums (lane i holds
 * the keys i mod 16, in key order): a fixed pairwise tree. */
static inline double gpe__attn_sum16(double l[GPE_ATTN_KB])
{
    for (int w = GPE_ATTN_KB / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++)
            l[i] += l[i + w];
    return l[0];
}

#endif
