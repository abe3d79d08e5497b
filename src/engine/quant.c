/*
 * quant: type traits, scalar reference (de)quantization and dot products,
 * and the run-time choice of SIMD kernels (quant_x86.c).
 *
 * Block layouts and dequantization formulas are GGUF/ggml format facts
 * (llama.cpp ggml-common.h / ggml-quants.c); the code is written here.
 * The dequantizers evaluate in exactly ggml's order (e.g. (d*sc)*q - dmin*m
 * in float) so that results are bit-identical; this file is built with
 * -ffp-contract=off so that the compiler does not fuse those into FMAs.
 */
#include "engine/quant.h"

#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant_impl.h"
#include "gpupool/engine.h"

_Static_assert(sizeof(gpe_block_q4_0) == 18, "q4_0 block size");
_Static_assert(sizeof(gpe_block_q8_0) == 34, "q8_0 block size");
_Static_assert(sizeof(gpe_block_q4_k) == 144, "q4_k block size");
_Static_assert(sizeof(gpe_block_q5_k) == 176, "q5_k block size");
_Static_assert(sizeof(gpe_block_q6_k) == 210, "q6_k block size");
_Static_assert(sizeof(gpe_block_q8_k) == 292, "q8_k block size");

/* ----------------------------------------------------------------- traits */

typedef struct type_traits {
    const char *name;
    int64_t blck;       /* elements per block; 0 = not a type */
    size_t bytes;       /* bytes per block */
    bool supported;     /* dequantize + vec_dot available */
    gpe_type dot_type;  /* activation type for vec_dot */
} type_traits;

/* Sizes: ggml's type_traits table (format facts). */
static const type_traits k_traits[GPE_TYPE_COUNT] = {
    [GPE_TYPE_F32] = {"F32", 1, 4, true, GPE_TYPE_F32},
    [GPE_TYPE_F16] = {"F16", 1, 2, true, GPE_TYPE_F16},
    [GPE_TYPE_Q4_0] = {"Q4_0", 32, 18, true, GPE_TYPE_Q8_0},
    [GPE_TYPE_Q4_1] = {"Q4_1", 32, 20, false, GPE_TYPE_F32},
    [GPE_TYPE_Q5_0] = {"Q5_0", 32, 22, false, GPE_TYPE_F32},
    [GPE_TYPE_Q5_1] = {"Q5_1", 32, 24, false, GPE_TYPE_F32},
    [GPE_TYPE_Q8_0] = {"Q8_0", 32, 34, true, GPE_TYPE_Q8_0},
    [GPE_TYPE_Q8_1] = {"Q8_1", 32, 36, false, GPE_TYPE_F32},
    [GPE_TYPE_Q2_K] = {"Q2_K", 256, 84, false, GPE_TYPE_F32},
    [GPE_TYPE_Q3_K] = {"Q3_K", 256, 110, false, GPE_TYPE_F32},
    [GPE_TYPE_Q4_K] = {"Q4_K", 256, 144, true, GPE_TYPE_Q8_K},
    [GPE_TYPE_Q5_K] = {"Q5_K", 256, 176, true, GPE_TYPE_Q8_K},
    [GPE_TYPE_Q6_K] = {"Q6_K", 256, 210, true, GPE_TYPE_Q8_K},
    [GPE_TYPE_Q8_K] = {"Q8_K", 256, 292, false, GPE_TYPE_F32},
    [GPE_TYPE_IQ2_XXS] = {"IQ2_XXS", 256, 66, false, GPE_TYPE_F32},
    [GPE_TYPE_IQ2_XS] = {"IQ2_XS", 256, 74, false, GPE_TYPE_F32},
    [GPE_TYPE_IQ3_XXS] = {"IQ3_XXS", 256, 98, false, GPE_TYPE_F32},
    [GPE_TYPE_IQ1_S] = {"IQ1_S", 256, 50, false, GPE_TYPE_F32},
    [GPE_TYPE_IQ4_NL] = {"IQ4_NL", 32, 18, false, GPE_TYPE_F32},
    [GPE_TYPE_IQ3_S] = {"IQ3_S", 256, 110, false, GPE_TYPE_F32},
    [GPE_TYPE_IQ2_S] = {"IQ2_S", 256, 82, false, GPE_TYPE_F32},
    [GPE_TYPE_IQ4_XS] = {"IQ4_XS", 256, 136, false, GPE_TYPE_F32},
    [GPE_TYPE_I8] = {"I8", 1, 1, false, GPE_TYPE_F32},
    [GPE_TYPE_I16] = {"I16", 1, 2, false, GPE_TYPE_F32},
    [GPE_TYPE_I32] = {"I32", 1, 4, false, GPE_TYPE_F32},
    [GPE_TYPE_I64] = {"I64", 1, 8, false, GPE_TYPE_F32},
    [GPE_TYPE_F64] = {"F64", 1, 8, false, GPE_TYPE_F32},
    [GPE_TYPE_IQ1_M] = {"IQ1_M", 256, 56, false, GPE_TYPE_F32},
    [GPE_TYPE_BF16] = {"BF16", 1, 2, true, GPE_TYPE_F32},
    [GPE_TYPE_TQ1_0] = {"TQ1_0", 256, 54, false, GPE_TYPE_F32},
    [GPE_TYPE_TQ2_0] = {"TQ2_0", 256, 66, false, GPE_TYPE_F32},
    [GPE_TYPE_MXFP4] = {"MXFP4", 32, 17, false, GPE_TYPE_F32},
};

static const type_traits *traits(uint32_t t)
{
    if (t >= GPE_TYPE_COUNT || k_traits[t].blck == 0)
        return NULL;
    return &k_traits[t];
}

bool gpe_type_known(uint32_t t) { return traits(t) != NULL; }

bool gpe_type_supported(uint32_t t)
{
    const type_traits *tt = traits(t);
    return tt && tt->supported;
}

const char *gpe_type_name(uint32_t t)
{
    const type_traits *tt = traits(t);
    return tt ? tt->name : "unknown";
}

int64_t gpe_type_block_size(uint32_t t)
{
    const type_traits *tt = traits(t);
    return tt ? tt->blck : 0;
}

size_t gpe_type_block_bytes(uint32_t t)
{
    const type_traits *tt = traits(t);
    return tt ? tt->bytes : 0;
}

size_t gpe_row_size(uint32_t t, int64_t n)
{
    const type_traits *tt = traits(t);
    if (!tt || n < 0 || n % tt->blck != 0)
        return 0;
    return (size_t)(n / tt->blck) * tt->bytes;
}

gpe_type gpe_vec_dot_type(gpe_type t)
{
    const type_traits *tt = traits(t);
    return tt ? tt->dot_type : GPE_TYPE_F32;
}

/* ------------------------------------------------------------ conversions */

float gpe_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in float */
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    if (exp == 31)
        bits = sign | 0x7f800000u | (man << 13);
    else
        bits = sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t gpe_fp32_to_fp16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)                         /* inf / NaN (kept quiet) */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
    if (ax >= 0x477ff000u)                         /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {                        /* below 2^-14: subnormal */
        float v;
        memcpy(&v, &ax, 4);
        /* scaling by 2^24 is exact; nearbyintf rounds half to even */
        return (uint16_t)(sign | (uint32_t)nearbyintf(v * 16777216.0f));
    }
    uint32_t h = (((ax >> 23) - 112) << 10) | ((ax & 0x7fffffu) >> 13);
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;                                       /* carry may bump the exponent: fine */
    return (uint16_t)(sign | h);
}

float gpe_bf16_to_fp32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t gpe_fp32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 64);         /* quiet NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* --------------------------------------------------------- dequantization */

static void dequant_q4_0(const gpe_block_q4_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += GPE_QK) {
        const float d = gpe_fp16_to_fp32(b[i].d);
        for (int j = 0; j < GPE_QK / 2; j++) {
            y[j] = (float)((b[i].qs[j] & 0xF) - 8) * d;
            y[j + GPE_QK / 2] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q8_0(const gpe_block_q8_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += GPE_QK) {
        const float d = gpe_fp16_to_fp32(b[i].d);
        for (int j = 0; j < GPE_QK; j++)
            y[j] = (float)b[i].qs[j] * d;
    }
}

static void dequant_q4_k(const gpe_block_q4_k *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const float d = gpe_fp16_to_fp32(b[i].d), dmin = gpe_fp16_to_fp32(b[i].dmin);
        const uint8_t *q = b[i].qs;
        for (int c = 0; c < 4; c++, q += 32) {
            uint8_t sc, m;
            gpe__scale_min_k4(2 * c, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            gpe__scale_min_k4(2 * c + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

static void dequant_q5_k(const gpe_block_q5_k *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const float d = gpe_fp16_to_fp32(b[i].d), dmin = gpe_fp16_to_fp32(b[i].dmin);
        const uint8_t *ql = b[i].qs, *qh = b[i].qh;
        for (int c = 0; c < 4; c++, ql += 32) {
            uint8_t sc, m;
            const uint8_t u1 = (uint8_t)(1u << (2 * c)), u2 = (uint8_t)(2u << (2 * c));
            gpe__scale_min_k4(2 * c, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            gpe__scale_min_k4(2 * c + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
        }
    }
}

/* Unpack the 256 six-bit values of a Q6_K block, minus 32, into q. */
static void q6_k_unpack(const gpe_block_q6_k *b, int8_t q[GPE_QK_K])
{
    const uint8_t *ql = b->ql, *qh = b->qh;
    for (int n = 0; n < GPE_QK_K; n += 128, ql += 64, qh += 32) {
        for (int l = 0; l < 32; l++) {
            q[n + l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            q[n + l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            q[n + l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            q[n + l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

static void dequant_q6_k(const gpe_block_q6_k *b, float *y, int64_t nb)
{
    int8_t q[GPE_QK_K];
    for (int64_t i = 0; i < nb; i++, y += GPE_QK_K) {
        const float d = gpe_fp16_to_fp32(b[i].d);
        q6_k_unpack(&b[i], q);
        /* element e uses scale e/16; ggml order: (d * sc) * q */
        for (int e = 0; e < GPE_QK_K; e++)
            y[e] = d * (float)b[i].scales[e / 16] * (float)q[e];
    }
}

bool gpe_dequantize_row(gpe_type t, const void *src, float *dst, int64_t n)
{
    if (!gpe_type_supported(t) || gpe_row_size(t, n) == 0)
        return n == 0 && gpe_type_supported(t);
    const int64_t nb = n / k_traits[t].blck;
    switch (t) {
    case GPE_TYPE_F32:
        memcpy(dst, src, (size_t)n * 4);
        return true;
    case GPE_TYPE_F16: {
        const uint8_t *p = src;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = gpe_fp16_to_fp32(h);
        }
        return true;
    }
    case GPE_TYPE_BF16: {
        const uint8_t *p = src;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = gpe_bf16_to_fp32(h);
        }
        return true;
    }
    case GPE_TYPE_Q4_0: dequant_q4_0(src, dst, nb); return true;
    case GPE_TYPE_Q8_0: dequant_q8_0(src, dst, nb); return true;
    case GPE_TYPE_Q4_K: dequant_q4_k(src, dst, nb); return true;
    case GPE_TYPE_Q5_K: dequant_q5_k(src, dst, nb); return true;
    case GPE_TYPE_Q6_K: dequant_q6_k(src, dst, nb); return true;
    default: return false;
    }
}

/* ----------------------------------------------------------- quantization */

static const gpe__kernels *kernels(void);

/* Q8_0 as ggml's x86 CPU path does it: d = amax/127 (stored f16),
 * q = round-half-even(x * 127/amax). */
static void quant_q8_0(const float *x, gpe_block_q8_0 *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += GPE_QK) {
        float amax = 0.0f;
        for (int j = 0; j < GPE_QK; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = gpe_fp32_to_fp16(d);
        for (int j = 0; j < GPE_QK; j++)
            y[i].qs[j] = (int8_t)nearbyintf(x[j] * id);
    }
}

/* Q8_K as ggml's reference: iscale = -127/max with max the signed value of
 * largest magnitude, q = min(127, round-half-even(iscale*x)), d = 1/iscale. */
static void quant_q8_k(const float *x, gpe_block_q8_k *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += GPE_QK_K) {
        float max = 0.0f, amax = 0.0f;
        for (int j = 0; j < GPE_QK_K; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < GPE_QK_K; j++) {
            const int v = (int)nearbyintf(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < GPE_QK_K / 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)s;
        }
        y[i].d = 1.0f / iscale;
    }
}

/* Q4_0: d = max/-8 with max the signed value of largest magnitude (so the
 * extreme lands on -8), q = clamp(round(x/d) + 8, 0, 15). */
static void quant_q4_0(const float *x, gpe_block_q4_0 *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += GPE_QK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < GPE_QK; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = gpe_fp32_to_fp16(d);
        for (int j = 0; j < GPE_QK / 2; j++) {
            int a = (int)floorf(x[j] * id + 8.5f), b = (int)floorf(x[j + 16] * id + 8.5f);
            a = a < 0 ? 0 : a > 15 ? 15 : a;
            b = b < 0 ? 0 : b > 15 ? 15 : b;
            y[i].qs[j] = (uint8_t)(a | (b << 4));
        }
    }
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Q4_K: per sub-block of 32 a plain min/max affine fit (min clamped to <= 0),
 * scales and mins quantized to 6 bits against the block's largest. */
static void kquant_fit(const float *x, float levels, uint16_t *d_out, uint16_t *dmin_out,
                       uint8_t scales[12], uint8_t q[GPE_QK_K])
{
    /* The half Q4_K and Q5_K share: per 32-value sub-block an offset fit
     * with `levels` steps, its 6-bit scale and min packed as the
     * dequantizers read them, and each value's level 0..levels in q. */
    float sc[8], mn[8], max_sc = 0.0f, max_mn = 0.0f;
    for (int j = 0; j < 8; j++) {
        float lo = 0.0f, hi = 0.0f;
        for (int l = 0; l < 32; l++) {
            lo = fminf(lo, x[32 * j + l]);
            hi = fmaxf(hi, x[32 * j + l]);
        }
        sc[j] = (hi - lo) / levels;
        mn[j] = -lo;
        max_sc = fmaxf(max_sc, sc[j]);
        max_mn = fmaxf(max_mn, mn[j]);
    }
    const float is = max_sc > 0 ? 63.0f / max_sc : 0.0f;
    const float im = max_mn > 0 ? 63.0f / max_mn : 0.0f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)clampi((int)nearbyintf(is * sc[j]), 0, 63);
        lm[j] = (uint8_t)clampi((int)nearbyintf(im * mn[j]), 0, 63);
        /* a sub-block whose scale rounded to 0 but has data: keep it at 1 */
        if (ls[j] == 0 && sc[j] > 0)
            ls[j] = 1;
    }
    *d_out = gpe_fp32_to_fp16(max_sc / 63.0f);
    *dmin_out = gpe_fp32_to_fp16(max_mn / 63.0f);
    memset(scales, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            scales[j] = ls[j];
            scales[j + 4] = lm[j];
        } else {
            scales[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            scales[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            scales[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
    const float d = gpe_fp16_to_fp32(*d_out), dmin = gpe_fp16_to_fp32(*dmin_out);
    const int top = (int)levels;
    for (int j = 0; j < 8; j++) {
        const float dd = d * ls[j], dm = dmin * lm[j];
        for (int l = 0; l < 32; l++)
            q[32 * j + l] =
                dd > 0 ? (uint8_t)clampi((int)nearbyintf((x[32 * j + l] + dm) / dd), 0, top) : 0;
    }
}

static void quant_q4_k(const float *x, gpe_block_q4_k *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += GPE_QK_K) {
        uint8_t q[GPE_QK_K];
        kquant_fit(x, 15.0f, &y[i].d, &y[i].dmin, y[i].scales, q);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
}

/* Q5_K: Q4_K's fit with 31 levels; the fifth bit of value l of chunk c
 * goes to qh[l] bit 2c (low half) or 2c+1 (high half). */
static void quant_q5_k(const float *x, gpe_block_q5_k *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += GPE_QK_K) {
        uint8_t q[GPE_QK_K];
        kquant_fit(x, 31.0f, &y[i].d, &y[i].dmin, y[i].scales, q);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                const uint8_t a = q[64 * c + l], b = q[64 * c + 32 + l];
                y[i].qs[32 * c + l] = (uint8_t)((a & 0xF) | ((b & 0xF) << 4));
                y[i].qh[l] |= (uint8_t)(((a >> 4) << (2 * c)) | ((b >> 4) << (2 * c + 1)));
            }
    }
}

/* Q6_K: per sub-block of 16 a symmetric scale (max|x|/32), the 16 scales
 * as int8 against the block's largest; packing is q6_k_unpack's inverse. */
static void quant_q6_k(const float *x, gpe_block_q6_k *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += GPE_QK_K) {
        float sc[16], max_sc = 0.0f;
        for (int j = 0; j < 16; j++) {
            float amax = 0.0f;
            for (int l = 0; l < 16; l++)
                amax = fmaxf(amax, fabsf(x[16 * j + l]));
            sc[j] = amax / 31.0f;
            max_sc = fmaxf(max_sc, sc[j]);
        }
        const float is = max_sc > 0 ? 127.0f / max_sc : 0.0f;
        y[i].d = gpe_fp32_to_fp16(max_sc / 127.0f);
        const float d = gpe_fp16_to_fp32(y[i].d);
        uint8_t q[GPE_QK_K];
        for (int j = 0; j < 16; j++) {
            int ls = clampi((int)nearbyintf(is * sc[j]), 0, 127);
            if (ls == 0 && sc[j] > 0)
                ls = 1;
            y[i].scales[j] = (int8_t)ls;
            const float dd = d * (float)ls;
            for (int l = 0; l < 16; l++)
                q[16 * j + l] = dd > 0 ? (uint8_t)clampi((int)nearbyintf(x[16 * j + l] / dd) + 32, 0, 63)
                                       : 32;
        }
        for (int h = 0; h < 2; h++) {
            uint8_t *ql = y[i].ql + 64 * h, *qh = y[i].qh + 32 * h;
            const uint8_t *v = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((v[l] & 0xF) | ((v[l + 64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((v[l + 32] & 0xF) | ((v[l + 96] & 0xF) << 4));
                qh[l] = (uint8_t)((v[l] >> 4) | ((v[l + 32] >> 4) << 2) | ((v[l + 64] >> 4) << 4) |
                                  ((v[l + 96] >> 4) << 6));
            }
        }
    }
}

bool gpe_quantize_row(gpe_type t, const float *x, void *dst, int64_t n)
{
    if (n < 0 || gpe_row_size(t, n) == 0)
        return n == 0 && gpe_type_known(t);
    uint8_t *p = dst;
    switch (t) {
    case GPE_TYPE_F32: memcpy(dst, x, (size_t)n * 4); return true;
    case GPE_TYPE_F16: {
        int64_t i = 0;
        if (kernels()->quant_f16)
            i = kernels()->quant_f16(x, dst, n);
        for (; i < n; i++) {
            uint16_t h = gpe_fp32_to_fp16(x[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        return true;
    }
    case GPE_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = gpe_fp32_to_bf16(x[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        return true;
    case GPE_TYPE_Q8_0:
        if (kernels()->quant_q8_0)
            kernels()->quant_q8_0(x, dst, n / GPE_QK);
        else
            quant_q8_0(x, dst, n / GPE_QK);
        return true;
    case GPE_TYPE_Q4_0: quant_q4_0(x, dst, n / GPE_QK); return true;
    case GPE_TYPE_Q4_K: quant_q4_k(x, dst, n / GPE_QK_K); return true;
    case GPE_TYPE_Q5_K: quant_q5_k(x, dst, n / GPE_QK_K); return true;
    case GPE_TYPE_Q6_K: quant_q6_k(x, dst, n / GPE_QK_K); return true;
    case GPE_TYPE_Q8_K: quant_q8_k(x, dst, n / GPE_QK_K); return true;
    default: return false;
    }
}

bool gpe_quantize_row_act(gpe_type wt, const float *x, void *dst, int64_t n)
{
    if (!gpe_type_supported(wt) || n < 0 || n % k_traits[wt].blck != 0)
        return false;
    return gpe_quantize_row(k_traits[wt].dot_type, x, dst, n);
}

/* ------------------------------------------------------ scalar dot products */
/* The references accumulate in double: they are the oracle for the SIMD
 * kernels, and speed does not matter here. */

static float dot_f32(int64_t n, const void *w, const void *a)
{
    const float *x = w, *y = a;
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)x[i] * y[i];
    return (float)s;
}

static float dot_f16(int64_t n, const void *w, const void *a)
{
    const uint16_t *x = w, *y = a;
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)gpe_fp16_to_fp32(x[i]) * gpe_fp16_to_fp32(y[i]);
    return (float)s;
}

static float dot_bf16(int64_t n, const void *w, const void *a)
{
    const uint16_t *x = w;
    const float *y = a;
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)gpe_bf16_to_fp32(x[i]) * y[i];
    return (float)s;
}

static float dot_q4_0(int64_t n, const void *w, const void *a)
{
    const gpe_block_q4_0 *x = w;
    const gpe_block_q8_0 *y = a;
    double s = 0;
    for (int64_t i = 0; i < n / GPE_QK; i++) {
        int isum = 0;
        for (int j = 0; j < GPE_QK / 2; j++)
            isum += ((x[i].qs[j] & 0xF) - 8) * y[i].qs[j] + ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
        s += (double)gpe_fp16_to_fp32(x[i].d) * gpe_fp16_to_fp32(y[i].d) * isum;
    }
    return (float)s;
}

static float dot_q8_0(int64_t n, const void *w, const void *a)
{
    const gpe_block_q8_0 *x = w, *y = a;
    double s = 0;
    for (int64_t i = 0; i < n / GPE_QK; i++) {
        int isum = 0;
        for (int j = 0; j < GPE_QK; j++)
            isum += x[i].qs[j] * y[i].qs[j];
        s += (double)gpe_fp16_to_fp32(x[i].d) * gpe_fp16_to_fp32(y[i].d) * isum;
    }
    return (float)s;
}

static float dot_q4_k(int64_t n, const void *w, const void *a)
{
    const gpe_block_q4_k *x = w;
    const gpe_block_q8_k *y = a;
    double s = 0;
    for (int64_t i = 0; i < n / GPE_QK_K; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            gpe__scale_min_k4(j, x[i].scales, &sc, &m);
            const uint8_t *q = x[i].qs + 32 * (j / 2);
            const int8_t *qa = y[i].qs + 32 * j;
            int p = 0;
            for (int l = 0; l < 32; l++)
                p += ((j & 1) ? (q[l] >> 4) : (q[l] & 0xF)) * qa[l];
            sumi += sc * p;
            summ += m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        }
        s += (double)gpe_fp16_to_fp32(x[i].d) * y[i].d * sumi -
             (double)gpe_fp16_to_fp32(x[i].dmin) * y[i].d * summ;
    }
    return (float)s;
}

static float dot_q5_k(int64_t n, const void *w, const void *a)
{
    const gpe_block_q5_k *x = w;
    const gpe_block_q8_k *y = a;
    double s = 0;
    for (int64_t i = 0; i < n / GPE_QK_K; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            gpe__scale_min_k4(j, x[i].scales, &sc, &m);
            const uint8_t *q = x[i].qs + 32 * (j / 2);
            const int8_t *qa = y[i].qs + 32 * j;
            int p = 0;
            for (int l = 0; l < 32; l++) {
                int v = (j & 1) ? (q[l] >> 4) : (q[l] & 0xF);
                v += ((x[i].qh[l] >> j) & 1) << 4;
                p += v * qa[l];
            }
            sumi += sc * p;
            summ += m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        }
        s += (double)gpe_fp16_to_fp32(x[i].d) * y[i].d * sumi -
             (double)gpe_fp16_to_fp32(x[i].dmin) * y[i].d * summ;
    }
    return (float)s;
}

static float dot_q6_k(int64_t n, const void *w, const void *a)
{
    const gpe_block_q6_k *x = w;
    const gpe_block_q8_k *y = a;
    int8_t q[GPE_QK_K];
    double s = 0;
    for (int64_t i = 0; i < n / GPE_QK_K; i++) {
        q6_k_unpack(&x[i], q);
        int sumi = 0;
        for (int g = 0; g < 16; g++) {
            int p = 0;
            for (int l = 0; l < 16; l++)
                p += q[16 * g + l] * y[i].qs[16 * g + l];
            sumi += x[i].scales[g] * p;
        }
        s += (double)gpe_fp16_to_fp32(x[i].d) * y[i].d * sumi;
    }
    return (float)s;
}

void gpe__kernels_scalar(gpe__kernels *k)
{
    memset(k, 0, sizeof *k);
    k->dot[GPE_TYPE_F32] = dot_f32;
    k->dot[GPE_TYPE_F16] = dot_f16;
    k->dot[GPE_TYPE_BF16] = dot_bf16;
    k->dot[GPE_TYPE_Q4_0] = dot_q4_0;
    k->dot[GPE_TYPE_Q8_0] = dot_q8_0;
    k->dot[GPE_TYPE_Q4_K] = dot_q4_k;
    k->dot[GPE_TYPE_Q5_K] = dot_q5_k;
    k->dot[GPE_TYPE_Q6_K] = dot_q6_k;
}

/* ----------------------------------------------------------------- dispatch */

static gpe__kernels g_kern[3];
static gpe_isa g_best = GPE_ISA_SCALAR;
static _Atomic int g_isa = GPE_ISA_SCALAR;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* clang 14 cannot ask __builtin_cpu_supports about F16C; every AVX2 CPU has it. */
#if defined(__clang__)
#define HAVE_F16C() 1
#else
#define HAVE_F16C() __builtin_cpu_supports("f16c")
#endif

static void kernels_init(void)
{
    gpe__kernels_scalar(&g_kern[GPE_ISA_SCALAR]);
    g_kern[GPE_ISA_AVX2] = g_kern[GPE_ISA_SCALAR];
    g_kern[GPE_ISA_AVX512] = g_kern[GPE_ISA_SCALAR];
#if defined(__x86_64__)
    if (gpe__have_x86_kernels()) {
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HAVE_F16C()) {
            gpe__kernels_avx2(&g_kern[GPE_ISA_AVX2]);
            g_best = GPE_ISA_AVX2;
            if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
                g_kern[GPE_ISA_AVX512] = g_kern[GPE_ISA_AVX2];
                gpe__kernels_avx512(&g_kern[GPE_ISA_AVX512]);
                g_best = GPE_ISA_AVX512;
            }
        }
    }
#endif
    gpe_isa use = g_best;
    /* GPUPOOL_ISA=scalar|avx2|avx512 caps the choice (benchmarks, debugging). */
    const char *env = getenv("GPUPOOL_ISA");
    if (env) {
        for (int i = 0; i <= (int)g_best; i++)
            if (strcmp(env, gpe_isa_name((gpe_isa)i)) == 0)
                use = (gpe_isa)i;
    }
    atomic_store(&g_isa, (int)use);
}

static const gpe__kernels *kernels(void)
{
    pthread_once(&g_once, kernels_init);
    return &g_kern[atomic_load_explicit(&g_isa, memory_order_relaxed)];
}

gpe_isa gpe_quant_best_isa(void)
{
    pthread_once(&g_once, kernels_init);
    return g_best;
}

gpe_isa gpe_quant_isa(void)
{
    pthread_once(&g_once, kernels_init);
    return (gpe_isa)atomic_load(&g_isa);
}

bool gpe_quant_set_isa(gpe_isa isa)
{
    pthread_once(&g_once, kernels_init);
    if ((int)isa < 0 || isa > g_best)
        return false;
    atomic_store(&g_isa, (int)isa);
    return true;
}

const char *gpe_isa_name(gpe_isa isa)
{
    switch (isa) {
    case GPE_ISA_AVX512: return "avx512";
    case GPE_ISA_AVX2: return "avx2";
    default: return "scalar";
    }
}

const char *gpe_cpu_features(void) { return gpe_isa_name(gpe_quant_isa()); }

float gpe_vec_dot(gpe_type wt, int64_t n, const void *wrow, const void *act)
{
    return kernels()->dot[wt](n, wrow, act);
}

/* Rows in chunks of ROW_CHUNK: the chunk's weight bytes stay in L1/L2 while
 * every activation row passes over them, so weights stream from memory
 * once per call whatever n_tok is. */
#define ROW_CHUNK 16
/* Below this many tokens the blocked kernel's per-call unpacking of the
 * weights costs more than it saves (Q4_0 decode, 2 threads: 4 sequences
 * were slower with it, 8 faster). */
#define GEMM_MIN_TOK 8

void gpe_matmul_rows(gpe_type wt, const void *W, int64_t row_begin, int64_t row_end,
                     int64_t n_cols, const void *act, int n_tok, size_t act_row_bytes,
                     float *out, int64_t ldo)
{
    const gpe__kernels *k = kernels();
    const gpe__dot_fn dot = k->dot[wt];
    gpe__dotn_fn dotn = n_tok > 1 ? k->dotn[wt] : NULL;
    const size_t rs = gpe_row_size(wt, n_cols);
    const char *w = W, *a = act;
    /* Prompt-sized batches: the blocked kernel, where there is one, takes
     * what it can (whole groups of rows) and the rest goes on below. */
    if (k->gemm[wt] && n_tok >= GEMM_MIN_TOK)
        row_begin = k->gemm[wt](n_cols, W, rs, row_begin, row_end, act, act_row_bytes, n_tok, out, ldo);
    /* Q8_0 activations: their f16 block scales as floats, once per call
     * instead of once per (row, token, block) in the kernel. Without the
     * memory, the per-token dot computes the same values. */
    float *ad = NULL;
    const int64_t nb = n_cols / GPE_QK;
    if (dotn && k_traits[wt].dot_type == GPE_TYPE_Q8_0) {
        ad = malloc((size_t)n_tok * (size_t)nb * sizeof *ad);
        if (!ad)
            dotn = NULL;
        for (int t = 0; ad && t < n_tok; t++) {
            const gpe_block_q8_0 *y = (const gpe_block_q8_0 *)(a + (size_t)t * act_row_bytes);
            for (int64_t i = 0; i < nb; i++)
                ad[(size_t)t * (size_t)nb + (size_t)i] = gpe_fp16_to_fp32(y[i].d);
        }
    }
    for (int64_t r0 = row_begin; r0 < row_end; r0 += ROW_CHUNK) {
        const int64_t r1 = r0 + ROW_CHUNK < row_end ? r0 + ROW_CHUNK : row_end;
        int t = 0;
        if (dotn) {
            /* groups of up to 4 tokens share each pass over a weight row */
            for (; t < n_tok; t += 4) {
                const int nt = n_tok - t < 4 ? n_tok - t : 4;
                const char *at = a + (size_t)t * act_row_bytes;
                const float *adt = ad ? ad + (size_t)t * (size_t)nb : NULL;
                for (int64_t r = r0; r < r1; r++) {
                    float o[4];
                    dotn(n_cols, w + (size_t)r * rs, at, act_row_bytes, adt, nt, o);
                    for (int j = 0; j < nt; j++)
                        out[(int64_t)(t + j) * ldo + r] = o[j];
                }
            }
        }
        for (; t < n_tok; t++) {
            const char *at = a + (size_t)t * act_row_bytes;
            float *o = out + (int64_t)t * ldo;
            for (int64_t r = r0; r < r1; r++)
                o[r] = dot(n_cols, w + (size_t)r * rs, at);
        }
    }
    free(ad);
}

/* --------------------------------------------------------- packed weights */

#define PACK_ROWS 8

/* Bytes per group of 8 rows and block (quant.h's layouts); 0: no packed form. */
static size_t pack_block_bytes(gpe_type t)
{
    switch (t) {
    case GPE_TYPE_Q4_0: return 144;
    case GPE_TYPE_Q4_K: return 1184;
    case GPE_TYPE_Q5_K: return 1440;
    case GPE_TYPE_Q6_K: return 1680;
    default: return 0;
    }
}

size_t gpe_pack_size(gpe_type t, int64_t n_rows, int64_t n_cols)
{
    const size_t bb = pack_block_bytes(t);
    const int64_t bs = gpe_type_block_size(t);
    if (!bb || n_rows < PACK_ROWS || n_cols <= 0 || n_cols % bs)
        return 0;
    return (size_t)(n_rows / PACK_ROWS) * (size_t)(n_cols / bs) * bb;
}

/* words [J][r] = word J of each row's field (rows' fields src[r], nw words). */
static uint8_t *pack_words(uint8_t *o, const uint8_t *const src[PACK_ROWS], int nw)
{
    for (int j = 0; j < nw; j++)
        for (int r = 0; r < PACK_ROWS; r++, o += 4)
            memcpy(o, src[r] + 4 * j, 4);
    return o;
}

/* One group-block: the 8 rows' block i (b[r] its first byte). */
static void pack_block(gpe_type t, const uint8_t *const b[PACK_ROWS], uint8_t *o)
{
    const uint8_t *f[PACK_ROWS];
    switch (t) {
    case GPE_TYPE_Q4_0:
        for (int r = 0; r < PACK_ROWS; r++, o += 2) {
            memcpy(o, b[r], 2);
            f[r] = b[r] + offsetof(gpe_block_q4_0, qs);
        }
        pack_words(o, f, 4);
        return;
    case GPE_TYPE_Q4_K:
    case GPE_TYPE_Q5_K:
        for (int r = 0; r < PACK_ROWS; r++) {
            memcpy(o + 2 * r, b[r], 2);          /* d */
            memcpy(o + 16 + 2 * r, b[r] + 2, 2); /* dmin */
            for (int s = 0; s < 8; s++)
                gpe__scale_min_k4(s, b[r] + 4, o + 32 + 8 * s + r, o + 96 + 8 * s + r);
        }
        o += 160;
        if (t == GPE_TYPE_Q5_K) { /* qh first: the kernel reads it with every qs word */
            for (int r = 0; r < PACK_ROWS; r++)
                f[r] = b[r] + offsetof(gpe_block_q5_k, qh);
            o = pack_words(o, f, 8);
        }
        for (int r = 0; r < PACK_ROWS; r++)
            f[r] = b[r] + (t == GPE_TYPE_Q4_K ? offsetof(gpe_block_q4_k, qs) : offsetof(gpe_block_q5_k, qs));
        pack_words(o, f, 32);
        return;
    case GPE_TYPE_Q6_K:
        for (int r = 0; r < PACK_ROWS; r++) {
            memcpy(o + 2 * r, b[r] + offsetof(gpe_block_q6_k, d), 2);
            for (int g = 0; g < 16; g++)
                o[16 + 8 * g + r] = b[r][offsetof(gpe_block_q6_k, scales) + g];
        }
        o += 144;
        /* in the order the kernel reads them: per half h and word j, ql
         * words 16h + j and 16h + 8 + j, then qh word 8h + j */
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 8; j++) {
                const int src[3][2] = {{offsetof(gpe_block_q6_k, ql), 16 * h + j},
                                       {offsetof(gpe_block_q6_k, ql), 16 * h + 8 + j},
                                       {offsetof(gpe_block_q6_k, qh), 8 * h + j}};
                for (int k = 0; k < 3; k++) {
                    for (int r = 0; r < PACK_ROWS; r++)
                        f[r] = b[r] + src[k][0] + 4 * src[k][1];
                    o = pack_words(o, f, 1);
                }
            }
        return;
    default:
        return;
    }
}

bool gpe_pack_rows(gpe_type t, const void *W, int64_t n_rows, int64_t n_cols, void *dst)
{
    if (!gpe_pack_size(t, n_rows, n_cols))
        return false;
    const size_t bb = pack_block_bytes(t), rs = gpe_row_size(t, n_cols);
    const size_t blk = gpe_type_block_bytes(t);
    const int64_t nb = n_cols / gpe_type_block_size(t), ng = n_rows / PACK_ROWS;
    uint8_t *o = dst;
    for (int64_t g = 0; g < ng; g++) {
        for (int64_t i = 0; i < nb; i++, o += bb) {
            const uint8_t *b[PACK_ROWS];
            for (int r = 0; r < PACK_ROWS; r++)
                b[r] = (const uint8_t *)W + (size_t)(g * PACK_ROWS + r) * rs + (size_t)i * blk;
            pack_block(t, b, o);
        }
    }
    return true;
}

void gpe_matmul_packed(gpe_type t, const void *P, const void *W, int64_t row_begin,
                       int64_t row_end, int64_t n_cols, const void *act, int n_tok,
                       size_t act_row_bytes, float *out, int64_t ldo)
{
    const gpe__packed_fn fn = kernels()->packed[t];
    const int64_t g0 = (row_begin + PACK_ROWS - 1) / PACK_ROWS, g1 = row_end / PACK_ROWS;
    if (!P || !fn || g0 >= g1 ||
        !fn(n_cols, P, g0, g1, act, act_row_bytes, n_tok, out, ldo)) {
        gpe_matmul_rows(t, W, row_begin, row_end, n_cols, act, n_tok, act_row_bytes, out, ldo);
        return;
    }
    if (row_begin < g0 * PACK_ROWS)
        gpe_matmul_rows(t, W, row_begin, g0 * PACK_ROWS, n_cols, act, n_tok, act_row_bytes, out, ldo);
    if (g1 * PACK_ROWS < row_end)
        gpe_matmul_rows(t, W, g1 * PACK_ROWS, row_end, n_cols, act, n_tok, act_row_bytes, out, ldo);
}
