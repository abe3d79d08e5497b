/* synth_quant: llama-quantize's reference quantizers (see synth_quant.h).
 * Layouts (bytes): Q4_0 = f16 d, 16 x (two 4-bit values: j and j+16);
 * Q8_0 = f16 d, 32 x int8; Q4_K = f16 d, f16 dmin, 12 bytes of packed 6-bit
 * scales and mins, 128 bytes of 4-bit values; Q5_K = as Q4_K plus 32 bytes
 * of fifth bits before the low nibbles; Q6_K = 128 bytes of low nibbles, 64
 * of high 2-bit pairs, 16 int8 scales, f16 d. */
#include "synth_quant.h"

#include <math.h>
#include <string.h>

#include "synth_gguf.h"   /* synth_f32_to_f16, synth_f16_to_f32 */

#define QK 32
#define QK_K 256
#define GROUP_EPS 1e-15f

static void put_f16(uint8_t *p, float f)
{
    uint16_t h = synth_f32_to_f16(f);
    memcpy(p, &h, 2);
}

static float get_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return synth_f16_to_f32(h);
}

/* Round to nearest (ties to even) by adding 1.5 * 2^23 and reading the
 * mantissa, as ggml does; valid for |f| < 2^22. */
static int nearest(float f)
{
    float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* ------------------------------------------------------ 32-value blocks */

/* Q8_0: d = amax / 127, q = roundf(x * (1 / d)) (half away from zero). */
static void q8_0_block(const float *x, uint8_t *out)
{
    float amax = 0.0f;
    for (int j = 0; j < QK; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(out, d);
    for (int j = 0; j < QK; j++)
        out[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

/* Q4_0: d = (the value of largest magnitude, signed) / -8; q = x / d + 8.5
 * truncated, at most 15. */
static void q4_0_block(const float *x, uint8_t *out)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    const float d = max / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(out, d);
    for (int j = 0; j < QK / 2; j++) {
        int lo = (int8_t)(x[j] * id + 8.5f), hi = (int8_t)(x[j + QK / 2] * id + 8.5f);
        lo = lo > 15 ? 15 : lo;
        hi = hi > 15 ? 15 : hi;
        out[2 + j] = (uint8_t)(lo | (hi << 4));
    }
}

/* --------------------------------------------------------------- Q6_K */

/* Symmetric levels in [-nmax, nmax) for n values (stored + nmax in L),
 * weighting each value by x^2: start from scale max/-nmax, then try 18
 * nearby scales and keep the one with the best weighted least-squares fit.
 * Returns the scale. */
static float fit_symmetric(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + clampi(nearest(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

static void q6_k_block(const float *x, uint8_t *out)
{
    int8_t L[QK_K];
    float scales[QK_K / 16], max_scale = 0, max_abs = 0;
    uint8_t *ql = out, *qh = out + 128;
    int8_t *sc = (int8_t *)(out + 192);
    memset(out, 0, 210);
    for (int ib = 0; ib < QK_K / 16; ib++) {
        scales[ib] = fit_symmetric(16, 32, x + 16 * ib, L + 16 * ib);
        if (fabsf(scales[ib]) > max_abs) {
            max_abs = fabsf(scales[ib]);
            max_scale = scales[ib];
        }
    }
    if (max_abs < GROUP_EPS)
        return;   /* all zero, d = 0 */
    const float iscale = -128.0f / max_scale;
    put_f16(out + 208, 1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ib++) {
        int v = nearest(iscale * scales[ib]);
        sc[ib] = (int8_t)(v < 127 ? v : 127);
    }
    /* Requantize with the 8-bit sub-block scales actually stored. */
    for (int j = 0; j < QK_K / 16; j++) {
        const float d = get_f16(out + 208) * sc[j];
        if (d == 0.0f)
            continue;
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (int8_t)(clampi(nearest(x[16 * j + i] / d), -32, 31) + 32);
    }
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32)
        for (int l = 0; l < 32; l++) {
            const int a = L[j + l], b = L[j + l + 32], c = L[j + l + 64], e = L[j + l + 96];
            ql[l] = (uint8_t)((a & 0xF) | ((c & 0xF) << 4));
            ql[l + 32] = (uint8_t)((b & 0xF) | ((e & 0xF) << 4));
            qh[l] = (uint8_t)((a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6));
        }
}

/* ---------------------------------------------------------- Q4_K, Q5_K */

/* Asymmetric levels 0..nmax for n values with weights w: start from the
 * full range [min(0, min x), max x], then try nstep + 1 level counts
 * (rmin + rdelta * is + nmax), each with the weighted least-squares scale
 * and offset, and keep the one with the smallest weighted squared error.
 * Returns the scale; *neg_min receives -offset (>= 0). */
static float fit_affine(int n, int nmax, const float *x, const float *w, uint8_t *L,
                        float *neg_min, float rmin, float rdelta, int nstep)
{
    uint8_t Laux[QK];
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min)
            min = x[i];
        if (x[i] > max)
            max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *neg_min = -min;
        return 0.0f;
    }
    float iscale = nmax / (max - min), scale = 1 / iscale, best = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(nearest(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        best += w[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sl = 0, sl2 = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sl += w[i] * l;
            sl2 += w[i] * l * l;
            sxl += w[i] * l * x[i];
        }
        float D = sum_w * sl2 - sl * sl;
        if (D <= 0)
            continue;
        float this_scale = (sum_w * sxl - sum_x * sl) / D;
        float this_min = (sl2 * sum_x - sl * sxl) / D;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sxl / sl2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            float diff = this_scale * Laux[i] + this_min - x[i];
            err += w[i] * (diff * diff);
        }
        if (err < best) {
            memcpy(L, Laux, (size_t)n);
            best = err;
            scale = this_scale;
            min = this_min;
        }
    }
    *neg_min = -min;
    return scale;
}

/* The 8 sub-block scales and mins of Q4_K/Q5_K, 6 bits each, in 12 bytes:
 * sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins);
 * 4-7 in the nibbles of bytes 8-11, their top 2 bits in the top bits of
 * bytes 0-7. */
static void k_scales_put(uint8_t *s, int j, uint8_t ls, uint8_t lm)
{
    if (j < 4) {
        s[j] = ls;
        s[j + 4] = lm;
    } else {
        s[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
        s[j - 4] |= (uint8_t)((ls >> 4) << 6);
        s[j] |= (uint8_t)((lm >> 4) << 6);
    }
}

static void k_scales_get(const uint8_t *s, int j, uint8_t *ls, uint8_t *lm)
{
    if (j < 4) {
        *ls = s[j] & 63;
        *lm = s[j + 4] & 63;
    } else {
        *ls = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *lm = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Q4_K (bits 4) and Q5_K (bits 5): per 32-value sub-block an affine fit
 * weighted by rms + |x|, the scales and mins quantized to 6 bits against
 * the largest of each, then every value requantized with them. */
static void qk_block(const float *x, uint8_t *out, int bits)
{
    const int nmax = bits == 4 ? 15 : 31;
    uint8_t L[QK_K], *s = out + 4;
    float scales[8], mins[8], w[QK], max_scale = 0, max_min = 0;
    memset(out, 0, bits == 4 ? 144 : 176);
    for (int j = 0; j < 8; j++) {
        const float *xj = x + QK * j;
        float sum_x2 = 0;
        for (int l = 0; l < QK; l++)
            sum_x2 += xj[l] * xj[l];
        const float av_x = sqrtf(sum_x2 / QK);
        for (int l = 0; l < QK; l++)
            w[l] = av_x + fabsf(xj[l]);
        scales[j] = bits == 4 ? fit_affine(QK, nmax, xj, w, L + QK * j, &mins[j], -1.0f, 0.1f, 20)
                              : fit_affine(QK, nmax, xj, w, L + QK * j, &mins[j], -0.5f, 0.1f, 15);
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < 8; j++) {
        uint8_t ls = (uint8_t)nearest(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)nearest(inv_min * mins[j]);
        k_scales_put(s, j, ls < 63 ? ls : 63, lm < 63 ? lm : 63);
    }
    put_f16(out, max_scale / 63.0f);
    put_f16(out + 2, max_min / 63.0f);
    for (int j = 0; j < 8; j++) {
        uint8_t ls, lm;
        k_scales_get(s, j, &ls, &lm);
        const float d = get_f16(out) * ls;
        if (d == 0.0f)
            continue;
        const float dm = get_f16(out + 2) * lm;
        for (int i = 0; i < QK; i++)
            L[QK * j + i] = (uint8_t)clampi(nearest((x[QK * j + i] + dm) / d), 0, nmax);
    }
    /* Values j and j + 32 of each 64 share a byte (low, high nibble); Q5_K
     * keeps the fifth bits in qh, bit pair 2k/2k+1 for the k-th 64. */
    uint8_t *qh = out + 16, *q = out + (bits == 4 ? 16 : 48);
    for (int n = 0, k = 0; n < QK_K; n += 64, k++, q += 32)
        for (int j = 0; j < 32; j++) {
            int a = L[n + j], b = L[n + j + 32];
            if (bits == 5) {
                qh[j] |= (uint8_t)(((a >> 4) << (2 * k)) | ((b >> 4) << (2 * k + 1)));
                a &= 0xF;
                b &= 0xF;
            }
            q[j] = (uint8_t)(a | (b << 4));
        }
}

/* ------------------------------------------------------------- public */

bool synth_qtype_parse(const char *name, synth_qtype *out)
{
    static const struct {
        const char *name;
        synth_qtype t;
    } k[] = {{"q4_0", SYNTH_Q4_0}, {"q8_0", SYNTH_Q8_0}, {"q4_k", SYNTH_Q4_K},
             {"q5_k", SYNTH_Q5_K}, {"q6_k", SYNTH_Q6_K}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strcmp(name, k[i].name) == 0) {
            *out = k[i].t;
            return true;
        }
    return false;
}

int synth_qtype_block(synth_qtype t)
{
    return t == SYNTH_Q4_0 || t == SYNTH_Q8_0 ? QK : QK_K;
}

size_t synth_qtype_block_bytes(synth_qtype t)
{
    switch (t) {
    case SYNTH_Q4_0: return 18;
    case SYNTH_Q8_0: return 34;
    case SYNTH_Q4_K: return 144;
    case SYNTH_Q5_K: return 176;
    case SYNTH_Q6_K: return 210;
    }
    return 0;
}

void synth_quantize(synth_qtype t, const float *x, int64_t n, uint8_t *out)
{
    const int qk = synth_qtype_block(t);
    const size_t bb = synth_qtype_block_bytes(t);
    for (int64_t b = 0; b < n / qk; b++, x += qk, out += bb) {
        switch (t) {
        case SYNTH_Q4_0: q4_0_block(x, out); break;
        case SYNTH_Q8_0: q8_0_block(x, out); break;
        case SYNTH_Q4_K: qk_block(x, out, 4); break;
        case SYNTH_Q5_K: qk_block(x, out, 5); break;
        case SYNTH_Q6_K: q6_k_block(x, out); break;
        }
    }
}
