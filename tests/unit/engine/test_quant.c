/*
 * quant: hand-made blocks with known values, bit-exact dequantization of the
 * llama.cpp-made files against tests/data/tiny-random.json, activation
 * quantizers, and every SIMD path against the scalar reference.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "engine/gguf.h"
#include "engine/quant.h"

static uint64_t g_rng = 0x243F6A8885A308D3ull;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static float rndf(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0) * 2.0f - 1.0f; }

/* ----------------------------------------------------------------- traits */

static void test_traits(void **state)
{
    (void)state;
    assert_int_equal(gpe_type_block_size(GPE_TYPE_Q4_K), 256);
    assert_int_equal(gpe_type_block_bytes(GPE_TYPE_Q4_K), 144);
    assert_int_equal(gpe_type_block_bytes(GPE_TYPE_Q5_K), 176);
    assert_int_equal(gpe_type_block_bytes(GPE_TYPE_Q6_K), 210);
    assert_int_equal(gpe_type_block_bytes(GPE_TYPE_Q8_0), 34);
    assert_int_equal(gpe_type_block_bytes(GPE_TYPE_Q4_0), 18);
    assert_int_equal(gpe_type_block_bytes(GPE_TYPE_Q8_K), 292);
    assert_int_equal(gpe_row_size(GPE_TYPE_F16, 7), 14);
    assert_int_equal(gpe_row_size(GPE_TYPE_Q8_0, 64), 68);
    assert_int_equal(gpe_row_size(GPE_TYPE_Q8_0, 33), 0);
    assert_int_equal(gpe_row_size(4, 32), 0);
    assert_false(gpe_type_known(4));
    assert_false(gpe_type_known(31));
    assert_false(gpe_type_known(1000));
    assert_true(gpe_type_known(GPE_TYPE_IQ2_XXS));
    assert_false(gpe_type_supported(GPE_TYPE_Q2_K));
    assert_true(gpe_type_supported(GPE_TYPE_BF16));
    assert_string_equal(gpe_type_name(GPE_TYPE_Q5_K), "Q5_K");
    assert_string_equal(gpe_type_name(77), "unknown");
    assert_int_equal(gpe_vec_dot_type(GPE_TYPE_Q4_0), GPE_TYPE_Q8_0);
    assert_int_equal(gpe_vec_dot_type(GPE_TYPE_Q6_K), GPE_TYPE_Q8_K);
    assert_int_equal(gpe_vec_dot_type(GPE_TYPE_F16), GPE_TYPE_F16);
    assert_int_equal(gpe_vec_dot_type(GPE_TYPE_BF16), GPE_TYPE_F32);
    float out[32];
    assert_false(gpe_dequantize_row(GPE_TYPE_Q2_K, "", out, 256));
    assert_false(gpe_dequantize_row(GPE_TYPE_Q8_0, "", out, 31));
}

static void test_half(void **state)
{
    (void)state;
    assert_true(gpe_fp16_to_fp32(0x3C00) == 1.0f);
    assert_true(gpe_fp16_to_fp32(0xC000) == -2.0f);
    assert_true(gpe_fp16_to_fp32(0x7BFF) == 65504.0f);
    assert_true(gpe_fp16_to_fp32(0x0001) == ldexpf(1.0f, -24));
    assert_true(gpe_fp16_to_fp32(0x0400) == ldexpf(1.0f, -14));
    assert_true(signbit(gpe_fp16_to_fp32(0x8000)));
    assert_true(isinf(gpe_fp16_to_fp32(0x7C00)));
    assert_true(isnan(gpe_fp16_to_fp32(0x7E00)));
    /* round to nearest even */
    assert_int_equal(gpe_fp32_to_fp16(1.0f + ldexpf(1.0f, -11)), 0x3C00);
    assert_int_equal(gpe_fp32_to_fp16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3C02);
    assert_int_equal(gpe_fp32_to_fp16(65519.0f), 0x7BFF);
    assert_int_equal(gpe_fp32_to_fp16(65520.0f), 0x7C00);
    assert_int_equal(gpe_fp32_to_fp16(ldexpf(1.0f, -25)), 0x0000);          /* tie -> even 0 */
    assert_int_equal(gpe_fp32_to_fp16(ldexpf(3.0f, -25)), 0x0002);          /* tie -> even 2 */
    /* every half survives the round trip */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = gpe_fp16_to_fp32((uint16_t)h);
        if (isnan(f))
            assert_true(isnan(gpe_fp16_to_fp32(gpe_fp32_to_fp16(f))));
        else if (gpe_fp32_to_fp16(f) != h)
            fail_msg("half 0x%04x -> %g -> 0x%04x", h, f, gpe_fp32_to_fp16(f));
    }
    assert_true(gpe_bf16_to_fp32(0x3F80) == 1.0f);
    assert_int_equal(gpe_fp32_to_bf16(1.0f), 0x3F80);
    assert_int_equal(gpe_fp32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3F80);   /* tie -> even */
    assert_int_equal(gpe_fp32_to_bf16(1.0f + 3 * ldexpf(1.0f, -8)), 0x3F82);
}

/* --------------------------------------------------------- hand-made blocks */

static void test_hand_q8_0_q4_0(void **state)
{
    (void)state;
    gpe_block_q8_0 b8 = {.d = gpe_fp32_to_fp16(0.5f)};
    for (int j = 0; j < 32; j++)
        b8.qs[j] = (int8_t)(j - 16);
    float y[32];
    assert_true(gpe_dequantize_row(GPE_TYPE_Q8_0, &b8, y, 32));
    for (int j = 0; j < 32; j++)
        assert_true(y[j] == 0.5f * (float)(j - 16));

    gpe_block_q4_0 b4 = {.d = gpe_fp32_to_fp16(2.0f)};
    for (int j = 0; j < 16; j++)
        b4.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    assert_true(gpe_dequantize_row(GPE_TYPE_Q4_0, &b4, y, 32));
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == 2.0f * (float)(j - 8));
        assert_true(y[j + 16] == 2.0f * (float)(7 - j));
    }
}

/* Q4_K: scales/mins per the documented 6-bit packing; d = 1, dmin = 0.5. */
static void test_hand_q4_k(void **state)
{
    (void)state;
    gpe_block_q4_k b;
    memset(&b, 0, sizeof b);
    b.d = gpe_fp32_to_fp16(1.0f);
    b.dmin = gpe_fp32_to_fp16(0.5f);
    const int sc[8] = {1, 2, 3, 4, 40, 50, 60, 63}, mn[8] = {0, 1, 2, 3, 20, 33, 47, 63};
    for (int j = 0; j < 4; j++) {
        b.scales[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        b.scales[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        b.scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
    /* value e of the block: nibble (e % 16) */
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            b.qs[32 * c + l] = (uint8_t)((l % 16) | (((l + 5) % 16) << 4));
    float y[256];
    assert_true(gpe_dequantize_row(GPE_TYPE_Q4_K, &b, y, 256));
    for (int e = 0; e < 256; e++) {
        const int j = e / 32, l = e % 32;
        const int q = (j % 2 == 0) ? l % 16 : (l + 5) % 16;
        const float want = (float)sc[j] * (float)q - 0.5f * (float)mn[j];
        if (y[e] != want)
            fail_msg("q4_k element %d: %g != %g", e, y[e], want);
    }
}

static void test_hand_q5_k_q6_k(void **state)
{
    (void)state;
    /* Q5_K: all low nibbles 3, qh bit j set only for odd sub-blocks -> q = 3 or 19 */
    gpe_block_q5_k b5;
    memset(&b5, 0, sizeof b5);
    b5.d = gpe_fp32_to_fp16(0.5f);
    b5.dmin = gpe_fp32_to_fp16(0.25f);
    for (int j = 0; j < 4; j++) {
        b5.scales[j] = 2;       /* sc 2 for sub-blocks 0..3, 4..7 via low nibble below */
        b5.scales[j + 4] = 4;   /* min 4 */
        b5.scales[j + 8] = 0x42;   /* sub-blocks 4..7: sc 2, min 4 */
    }
    memset(b5.qs, 0x33, sizeof b5.qs);
    memset(b5.qh, 0xAA, sizeof b5.qh);
    float y[256];
    assert_true(gpe_dequantize_row(GPE_TYPE_Q5_K, &b5, y, 256));
    for (int e = 0; e < 256; e++) {
        const int j = e / 32, q = (j & 1) ? 19 : 3;
        assert_true(y[e] == 0.5f * 2.0f * (float)q - 0.25f * 4.0f);
    }
    /* Q6_K: every q = 33 (low nibble 1, high bits 2) -> value 1 * d * scale */
    gpe_block_q6_k b6;
    memset(&b6, 0, sizeof b6);
    b6.d = gpe_fp32_to_fp16(0.25f);
    for (int k = 0; k < 16; k++)
        b6.scales[k] = (int8_t)(k - 8);
    memset(b6.ql, 0x11, sizeof b6.ql);
    memset(b6.qh, 0xAA, sizeof b6.qh);
    assert_true(gpe_dequantize_row(GPE_TYPE_Q6_K, &b6, y, 256));
    for (int e = 0; e < 256; e++)
        assert_true(y[e] == 0.25f * (float)(e / 16 - 8));
    /* element-position check: one q different at element 100 (half 0, l = 36 -> q2 slot 4..) */
    b6.ql[4 + 32] = 0x15;   /* ql[l+32] low nibble -> element 32+4 = 36 */
    assert_true(gpe_dequantize_row(GPE_TYPE_Q6_K, &b6, y, 256));
    assert_true(y[36] == 0.25f * (float)(36 / 16 - 8) * 5.0f);   /* q = 37 -> 5 */
    assert_true(y[35] == 0.25f * (float)(35 / 16 - 8));
}

static void test_quantizers(void **state)
{
    (void)state;
    float x[256], y[256];
    for (int j = 0; j < 256; j++)
        x[j] = (float)(j - 128) / 128.0f;
    /* Q8_K: max magnitude is x[0] = -1 -> iscale = 127, d = 1/127 */
    gpe_block_q8_k k;
    assert_true(gpe_quantize_row(GPE_TYPE_Q8_K, x, &k, 256));
    assert_true(k.d == 1.0f / 127.0f);
    for (int j = 0; j < 256; j++) {
        int want = (int)nearbyintf(127.0f * x[j]);
        assert_int_equal(k.qs[j], want > 127 ? 127 : want);
    }
    for (int g = 0; g < 16; g++) {
        int s = 0;
        for (int l = 0; l < 16; l++)
            s += k.qs[16 * g + l];
        assert_int_equal(k.bsums[g], s);
    }
    /* all zero */
    float z[256] = {0};
    assert_true(gpe_quantize_row(GPE_TYPE_Q8_K, z, &k, 256));
    assert_true(k.d == 0.0f);
    /* Q8_0: amax/127 stored as f16 */
    gpe_block_q8_0 q8[8];
    assert_true(gpe_quantize_row(GPE_TYPE_Q8_0, x, q8, 256));
    assert_true(gpe_fp16_to_fp32(q8[0].d) == gpe_fp16_to_fp32(gpe_fp32_to_fp16(1.0f / 127.0f)));
    assert_int_equal(q8[0].qs[0], -127);
    /* round trips with bounded error */
    for (int j = 0; j < 256; j++)
        x[j] = rndf() * 3.0f;
    struct { gpe_type t; float tol; } rt[] = {
        {GPE_TYPE_Q8_0, 0.02f}, {GPE_TYPE_Q4_0, 0.5f}, {GPE_TYPE_Q4_K, 0.35f},
        {GPE_TYPE_Q5_K, 0.2f},  {GPE_TYPE_Q6_K, 0.1f},
        {GPE_TYPE_F16, 0.002f}, {GPE_TYPE_BF16, 0.02f}, {GPE_TYPE_F32, 0.0f},
    };
    uint8_t buf[1024];
    for (size_t i = 0; i < sizeof rt / sizeof rt[0]; i++) {
        assert_true(gpe_quantize_row(rt[i].t, x, buf, 256));
        assert_true(gpe_dequantize_row(rt[i].t, buf, y, 256));
        for (int j = 0; j < 256; j++)
            if (fabsf(y[j] - x[j]) > rt[i].tol)
                fail_msg("%s round trip: x %g -> %g", gpe_type_name(rt[i].t), x[j], y[j]);
    }
    assert_false(gpe_quantize_row(GPE_TYPE_Q2_K, x, buf, 256));
}

/* ---------------------------------------------------- tiny-random.json refs */

static void test_reference_dequant(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/tiny-random.json", GP_TEST_DATA);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root)
        fail_msg("%s: %s", path, jerr.text);
    json_t *models = json_object_get(root, "models");
    assert_true(json_is_object(models));
    const char *fname;
    json_t *model;
    int checked = 0;
    json_object_foreach(models, fname, model) {
        snprintf(path, sizeof path, "%s/%s", GP_MODEL_DATA, fname);
        char err[512];
        gpe_gguf *g = NULL;
        if (gpe_gguf_open(path, &g, err, sizeof err) != GPE_OK)
            fail_msg("%s", err);
        const char *tname;
        json_t *ref;
        json_object_foreach(json_object_get(model, "dequant"), tname, ref) {
            const char *tensor = json_string_value(json_object_get(ref, "tensor"));
            const gpe_gguf_tensor *t = gpe_gguf_tensor_get(g, tensor);
            assert_non_null(t);
            assert_string_equal(gpe_type_name(t->type), tname);
            float *y = malloc((size_t)t->n_elements * sizeof *y);
            assert_non_null(y);
            assert_true(gpe_dequantize_row(t->type, t->data, y, t->n_elements));
            json_t *first = json_object_get(ref, "first_1024");
            assert_int_equal(json_array_size(first), 1024);
            for (size_t i = 0; i < 1024; i++) {
                const float want = (float)json_number_value(json_array_get(first, i));
                if (y[i] != want)
                    fail_msg("%s %s[%zu]: %.9g != %.9g", fname, tensor, i, y[i], want);
            }
            double sum = 0, sq = 0;
            for (int64_t i = 0; i < t->n_elements; i++) {
                sum += y[i];
                sq += (double)y[i] * y[i];
            }
            const double wsum = json_number_value(json_object_get(ref, "sum"));
            const double wsq = json_number_value(json_object_get(ref, "sum_sq"));
            if (fabs(sum - wsum) > 1e-6 * fmax(fabs(wsum), 1.0) || fabs(sq - wsq) > 1e-6 * wsq)
                fail_msg("%s %s: sum %.12g / %.12g, sum_sq %.12g / %.12g", fname, tensor, sum,
                         wsum, sq, wsq);
            free(y);
            checked++;
        }
        gpe_gguf_close(g);
    }
    assert_int_equal(checked, 9);
    json_decref(root);
}

/* --------------------------------------------------- dot products and SIMD */

/* Random weight row of type t (n elements) with sane scales. */
static void *random_weights(gpe_type t, int64_t n)
{
    const size_t rs = gpe_row_size(t, n);
    uint8_t *w = malloc(rs + 1);
    assert_non_null(w);
    for (size_t i = 0; i < rs; i++)
        w[i] = (uint8_t)rnd();
    const int64_t nb = n / gpe_type_block_size(t);
    const size_t bb = gpe_type_block_bytes(t);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = w + (size_t)b * bb;
        uint16_t h1 = gpe_fp32_to_fp16(rndf() * 0.1f), h2 = gpe_fp32_to_fp16(rndf() * 0.1f);
        switch (t) {
        case GPE_TYPE_F32: {
            float f = rndf() * 2.0f;
            memcpy(p, &f, 4);
            break;
        }
        case GPE_TYPE_F16: h1 = gpe_fp32_to_fp16(rndf() * 2.0f); memcpy(p, &h1, 2); break;
        case GPE_TYPE_BF16: h1 = gpe_fp32_to_bf16(rndf() * 2.0f); memcpy(p, &h1, 2); break;
        case GPE_TYPE_Q4_0:
        case GPE_TYPE_Q8_0: memcpy(p, &h1, 2); break;
        case GPE_TYPE_Q4_K:
        case GPE_TYPE_Q5_K: memcpy(p, &h1, 2); memcpy(p + 2, &h2, 2); break;
        case GPE_TYPE_Q6_K: memcpy(p + 208, &h1, 2); break;
        default: fail();
        }
    }
    return w;
}

/* Exact-ish dot of the dequantized weight row with the dequantized
 * activation (double), and the sum of |terms| for tolerances. */
static double deq_dot(gpe_type t, int64_t n, const void *w, const void *act, double *mag)
{
    float *wf = malloc((size_t)n * 4), *af = malloc((size_t)n * 4);
    assert_true(gpe_dequantize_row(t, w, wf, n));
    const gpe_type vt = gpe_vec_dot_type(t);
    if (vt == GPE_TYPE_Q8_K) {
        const gpe_block_q8_k *k = act;
        for (int64_t i = 0; i < n; i++)
            af[i] = k[i / 256].d * (float)k[i / 256].qs[i % 256];
    } else {
        assert_true(gpe_dequantize_row(vt, act, af, n));
    }
    double s = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)wf[i] * af[i];
        m += fabs((double)wf[i] * af[i]);
    }
    free(wf);
    free(af);
    *mag = m;
    return s;
}

static const gpe_type k_types[] = {GPE_TYPE_F32, GPE_TYPE_F16, GPE_TYPE_BF16, GPE_TYPE_Q8_0,
                                   GPE_TYPE_Q4_0, GPE_TYPE_Q4_K, GPE_TYPE_Q5_K, GPE_TYPE_Q6_K};

static void sizes_for(gpe_type t, int64_t *sz, int *nsz)
{
    static const int64_t f[] = {1, 7, 15, 16, 17, 33, 64, 100, 1023, 4099};
    static const int64_t b32[] = {32, 64, 96, 160, 4128};
    static const int64_t b256[] = {256, 512, 768, 2304};
    const int64_t *s = f;
    int n = 10;
    if (gpe_type_block_size(t) == 32) {
        s = b32;
        n = 5;
    } else if (gpe_type_block_size(t) == 256) {
        s = b256;
        n = 4;
    }
    memcpy(sz, s, (size_t)n * sizeof *sz);
    *nsz = n;
}

static void test_dot_paths(void **state)
{
    (void)state;
    const gpe_isa best = gpe_quant_best_isa();
    print_message("best ISA: %s\n", gpe_isa_name(best));
    for (size_t ti = 0; ti < sizeof k_types / sizeof k_types[0]; ti++) {
        const gpe_type t = k_types[ti];
        int64_t sz[10];
        int nsz;
        sizes_for(t, sz, &nsz);
        for (int si = 0; si < nsz; si++) {
            for (int rep = 0; rep < 3; rep++) {
                const int64_t n = sz[si];
                void *w = random_weights(t, n);
                float *x = malloc((size_t)n * 4);
                for (int64_t i = 0; i < n; i++)
                    x[i] = rndf() * (rep == 2 ? 100.0f : 1.0f);
                const gpe_type vt = gpe_vec_dot_type(t);
                void *act = malloc(gpe_row_size(vt, n) + 1);
                assert_true(gpe_quantize_row_act(t, x, act, n));
                double mag;
                const double exact = deq_dot(t, n, w, act, &mag);
                assert_true(gpe_quant_set_isa(GPE_ISA_SCALAR));
                const float ref = gpe_vec_dot(t, n, w, act);
                /* the scalar reference against the dequantized formula */
                if (fabs(ref - exact) > 1e-6 * mag + 1e-30)
                    fail_msg("%s n=%ld scalar %.9g vs dequant %.9g", gpe_type_name(t), (long)n,
                             ref, exact);
                for (int isa = GPE_ISA_AVX2; isa <= (int)best; isa++) {
                    assert_true(gpe_quant_set_isa((gpe_isa)isa));
                    const float v = gpe_vec_dot(t, n, w, act);
                    if (fabs(v - ref) > 1e-5 * mag + 1e-30)
                        fail_msg("%s n=%ld %s %.9g vs scalar %.9g (mag %g)", gpe_type_name(t),
                                 (long)n, gpe_isa_name((gpe_isa)isa), v, ref, mag);
                }
                free(w);
                free(x);
                free(act);
            }
        }
    }
    assert_true(gpe_quant_set_isa(best));
    assert_false(gpe_quant_set_isa((gpe_isa)7));
}

/* matmul_rows == one vec_dot per (row, token), on every path. */
static void test_matmul_rows(void **state)
{
    (void)state;
    const gpe_isa best = gpe_quant_best_isa();
    /* 11 tokens: the blocked kernel (8 or more tokens; 34 rows = 4 groups
     * of 8 and a remainder), with pairs and a single; 7: groups of 4 and a
     * remainder of 3 for the per-row kernels */
    enum { ROWS = 37, NTOK = 11 };
    for (size_t ti = 0; ti < sizeof k_types / sizeof k_types[0]; ti++) {
        const gpe_type t = k_types[ti];
        const int64_t n = 512;
        const size_t rs = gpe_row_size(t, n);
        uint8_t *W = malloc(rs * ROWS);
        for (int r = 0; r < ROWS; r++) {
            void *w = random_weights(t, n);
            memcpy(W + rs * r, w, rs);
            free(w);
        }
        const gpe_type vt = gpe_vec_dot_type(t);
        const size_t ars = gpe_row_size(vt, n);
        uint8_t *act = malloc(ars * NTOK);
        float x[512];
        for (int k = 0; k < NTOK; k++) {
            for (int i = 0; i < n; i++)
                x[i] = rndf();
            assert_true(gpe_quantize_row_act(t, x, act + ars * k, n));
        }
        for (int c = 0; c < 2 * ((int)best + 1); c++) {
            const int isa = c / 2, ntok = c % 2 ? 7 : NTOK;
            assert_true(gpe_quant_set_isa((gpe_isa)isa));
            float out[NTOK * 40];
            for (int i = 0; i < NTOK * 40; i++)
                out[i] = -12345.0f;
            gpe_matmul_rows(t, W, 3, ROWS, n, act, ntok, ars, out, 40);
            for (int k = 0; k < ntok; k++) {
                for (int r = 0; r < 40; r++) {
                    if (r < 3 || r >= ROWS) {
                        assert_true(out[k * 40 + r] == -12345.0f);
                        continue;
                    }
                    const float want = gpe_vec_dot(t, n, W + rs * r, act + ars * k);
                    assert_true(out[k * 40 + r] == want);
                }
            }
        }
        free(W);
        free(act);
    }
    assert_true(gpe_quant_set_isa(best));
}

/* Packed weights (gpe_pack_rows + gpe_matmul_packed) == one vec_dot per
 * (row, token), on every path, for every type with a packed form:
 * decode-sized (1: its own Q4_0 kernel; 2, 3, 8) and prompt-sized (17; 40:
 * more than one of Q4_0's 32-token chunks) batches, ranges
 * that start and end inside a group of 8, and block counts that do and do
 * not fill the Q4_0 kernels' 8 lanes. */
static void test_packed_matmul(void **state)
{
    (void)state;
    const gpe_isa best = gpe_quant_best_isa();
    enum { ROWS = 37, NTOK = 40, LDO = 40 };
    assert_int_equal(gpe_pack_size(GPE_TYPE_Q8_0, ROWS, 512), 0);
    assert_int_equal(gpe_pack_size(GPE_TYPE_Q4_0, 7, 512), 0);
    assert_int_equal(gpe_pack_size(GPE_TYPE_Q4_0, ROWS, 512), 4 * 16 * 144);
    assert_int_equal(gpe_pack_size(GPE_TYPE_Q4_K, ROWS, 512), 4 * 2 * 1184);
    assert_int_equal(gpe_pack_size(GPE_TYPE_Q6_K, ROWS, 512), 4 * 2 * 1680);
    assert_false(gpe_pack_rows(GPE_TYPE_Q8_0, NULL, ROWS, 512, NULL));
    static const gpe_type types[] = {GPE_TYPE_Q4_0, GPE_TYPE_Q4_K, GPE_TYPE_Q5_K, GPE_TYPE_Q6_K};
    static const int toks[] = {1, 2, 3, 8, 17, NTOK};
    static const int64_t ranges[][2] = {{0, ROWS}, {3, ROWS}, {8, 24}, {5, 13}};
    for (size_t ti0 = 0; ti0 < sizeof types / sizeof types[0]; ti0++) {
        const gpe_type t = types[ti0];
        const int64_t ns[2] = {512, t == GPE_TYPE_Q4_0 ? 160 : 1280};
        for (int ni = 0; ni < 2; ni++) {
            const int64_t n = ns[ni];
            const size_t rs = gpe_row_size(t, n);
            uint8_t *W = malloc(rs * ROWS);
            for (int r = 0; r < ROWS; r++) {
                void *w = random_weights(t, n);
                memcpy(W + rs * r, w, rs);
                free(w);
            }
            void *P = malloc(gpe_pack_size(t, ROWS, n));
            assert_true(gpe_pack_rows(t, W, ROWS, n, P));
            const size_t ars = gpe_row_size(gpe_vec_dot_type(t), n);
            uint8_t *act = malloc(ars * NTOK);
            float *x = malloc((size_t)n * sizeof *x);
            for (int k = 0; k < NTOK; k++) {
                for (int64_t i = 0; i < n; i++)
                    x[i] = rndf();
                assert_true(gpe_quantize_row_act(t, x, act + ars * k, n));
            }
            for (int isa = 0; isa <= (int)best; isa++) {
                assert_true(gpe_quant_set_isa((gpe_isa)isa));
                for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
                    for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++) {
                        const int ntok = toks[ti];
                        const int64_t r0 = ranges[ri][0], r1 = ranges[ri][1];
                        float out[NTOK * LDO];
                        for (int i = 0; i < NTOK * LDO; i++)
                            out[i] = -12345.0f;
                        gpe_matmul_packed(t, P, W, r0, r1, n, act, ntok, ars, out, LDO);
                        for (int k = 0; k < ntok; k++) {
                            for (int r = 0; r < LDO; r++) {
                                const float got = out[k * LDO + r];
                                if (r < r0 || r >= r1) {
                                    assert_true(got == -12345.0f);
                                    continue;
                                }
                                const float want = gpe_vec_dot(t, n, W + rs * r, act + ars * k);
                                if (got != want)
                                    fail_msg("%s %s n=%ld tokens %d rows [%ld,%ld): row %d token %d: "
                                             "%.9g != %.9g", gpe_type_name(t),
                                             gpe_isa_name((gpe_isa)isa), (long)n, ntok, (long)r0,
                                             (long)r1, r, k, got, want);
                            }
                        }
                    }
                }
            }
            free(W);
            free(P);
            free(act);
            free(x);
        }
    }
    assert_true(gpe_quant_set_isa(best));
}

/* F16 / BF16 blocked matmul at its edges: rows with a partial step and a
 * scalar tail (1023: AVX-512 F16 ends with a half step and 15 singles;
 * 4099: 3 singles everywhere), row and token remainders of every tile
 * shape (34 rows, 25 tokens), and at 4099 columns more tokens than one
 * panel holds. Every output must equal gpe_vec_dot exactly. */
static void test_matmul_rows_f16_edges(void **state)
{
    (void)state;
    const gpe_isa best = gpe_quant_best_isa();
    static const gpe_type types[] = {GPE_TYPE_F16, GPE_TYPE_BF16};
    static const int64_t cols[] = {1023, 4099};
    enum { R0 = 3, ROWS = 37, LDO = 40, NTOK = 25 };
    for (size_t ti = 0; ti < 2; ti++) {
        for (size_t ci = 0; ci < 2; ci++) {
            const gpe_type t = types[ti];
            const int64_t n = cols[ci];
            const size_t rs = gpe_row_size(t, n);
            uint8_t *W = malloc(rs * ROWS);
            for (int r = 0; r < ROWS; r++) {
                void *w = random_weights(t, n);
                memcpy(W + rs * r, w, rs);
                free(w);
            }
            const size_t ars = gpe_row_size(gpe_vec_dot_type(t), n);
            uint8_t *act = malloc(ars * NTOK);
            float *x = malloc((size_t)n * sizeof *x);
            for (int k = 0; k < NTOK; k++) {
                for (int64_t i = 0; i < n; i++)
                    x[i] = rndf();
                assert_true(gpe_quantize_row_act(t, x, act + ars * k, n));
            }
            for (int isa = 0; isa <= (int)best; isa++) {
                assert_true(gpe_quant_set_isa((gpe_isa)isa));
                float out[NTOK * LDO];
                for (int i = 0; i < NTOK * LDO; i++)
                    out[i] = -12345.0f;
                gpe_matmul_rows(t, W, R0, ROWS, n, act, NTOK, ars, out, LDO);
                for (int k = 0; k < NTOK; k++) {
                    for (int r = 0; r < LDO; r++) {
                        const float want = r < R0 || r >= ROWS
                                               ? -12345.0f
                                               : gpe_vec_dot(t, n, W + rs * r, act + ars * k);
                        assert_true(out[k * LDO + r] == want);
                    }
                }
            }
            free(W);
            free(act);
            free(x);
        }
    }
    assert_true(gpe_quant_set_isa(best));
}

/* Extreme quant values: Q8_0 weights of -128 and activations at +-127. */
static void test_dot_extremes(void **state)
{
    (void)state;
    const gpe_isa best = gpe_quant_best_isa();
    gpe_block_q8_0 w[4], a[4];
    for (int b = 0; b < 4; b++) {
        w[b].d = gpe_fp32_to_fp16(1.0f);
        a[b].d = gpe_fp32_to_fp16(1.0f);
        for (int j = 0; j < 32; j++) {
            w[b].qs[j] = (j & 1) ? -128 : 127;
            a[b].qs[j] = (j & 2) ? -127 : 127;
        }
    }
    double want = 0;
    for (int b = 0; b < 4; b++)
        for (int j = 0; j < 32; j++)
            want += w[b].qs[j] * a[b].qs[j];
    for (int isa = 0; isa <= (int)best; isa++) {
        assert_true(gpe_quant_set_isa((gpe_isa)isa));
        assert_true(gpe_vec_dot(GPE_TYPE_Q8_0, 128, w, a) == (float)want);
    }
    assert_true(gpe_quant_set_isa(best));
    assert_string_equal(gpe_cpu_features(), gpe_isa_name(best));
}

/* The SIMD F32 -> F16 conversion (activation rows of F16 weights, the F16
 * KV cache) gives the scalar one's bits on every path: random values,
 * halfway cases (round half to even), subnormals, the overflow edge, both
 * infinities, NaNs with payloads, and a length that leaves a scalar tail. */
static void test_quant_f16_isas(void **state)
{
    (void)state;
    const gpe_isa best = gpe_quant_best_isa();
    enum { N = 77 };
    float x[N];
    static const uint32_t special[] = {
        0x00000000u, 0x80000000u, 0x3f800000u, 0x3f801000u, 0x3f803000u, 0x387fc000u,
        0x33800000u, 0x33000000u, 0x33000001u, 0x477fe000u, 0x477ff000u, 0x477fefffu,
        0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffa5a5a5u, 0x7f800001u, 0x00000001u};
    const int ns = (int)(sizeof special / sizeof special[0]);
    for (int i = 0; i < N; i++) {
        if (i < ns)
            memcpy(&x[i], &special[i], 4);
        else
            x[i] = rndf() * (i % 3 == 0 ? 70000.0f : i % 3 == 1 ? 1e-5f : 3.0f);
    }
    uint16_t want[N], got[N];
    assert_true(gpe_quant_set_isa(GPE_ISA_SCALAR));
    assert_true(gpe_quantize_row(GPE_TYPE_F16, x, want, N));
    for (int isa = GPE_ISA_AVX2; isa <= (int)best; isa++) {
        assert_true(gpe_quant_set_isa((gpe_isa)isa));
        memset(got, 0xAB, sizeof got);
        assert_true(gpe_quantize_row(GPE_TYPE_F16, x, got, N));
        for (int i = 0; i < N; i++)
            if (got[i] != want[i])
                fail_msg("%s element %d (0x%08x): 0x%04x != scalar 0x%04x",
                         gpe_isa_name((gpe_isa)isa), i, (unsigned)(i < ns ? special[i] : 0), got[i],
                         want[i]);
    }
    assert_true(gpe_quant_set_isa(best));
}

/* The SIMD Q8_0 quantizer gives the scalar one's bytes on every path:
 * random rows, exact halves (round half to even: amax 127 makes id 1),
 * zeros, a NaN (skipped by the max), and tiny values. */
static void test_quant_q8_0_isas(void **state)
{
    (void)state;
    const gpe_isa best = gpe_quant_best_isa();
    enum { N = 32 * 6 };
    float x[N];
    for (int i = 0; i < N; i++)
        x[i] = rndf() * 5.0f;
    for (int i = 32; i < 64; i++)   /* block 1: halves, amax 127 */
        x[i] = (float)(i - 48) + 0.5f;
    x[32] = 127.0f;
    for (int i = 64; i < 96; i++)   /* block 2: all zero */
        x[i] = 0.0f;
    x[100] = NAN;                   /* block 3 */
    for (int i = 128; i < 160; i++) /* block 4: tiny */
        x[i] = (float)(i - 140) * 1e-30f;
    x[170] = -3e4f;                 /* block 5: negative amax */
    gpe_block_q8_0 ref[N / 32], got[N / 32];
    assert_true(gpe_quant_set_isa(GPE_ISA_SCALAR));
    assert_true(gpe_quantize_row(GPE_TYPE_Q8_0, x, ref, N));
    assert_int_equal(ref[1].qs[0], 127);
    assert_int_equal(ref[1].qs[1], -14);   /* -14.5 rounds to even */
    assert_int_equal(ref[1].qs[2], -14);   /* -13.5 too */
    for (int isa = GPE_ISA_AVX2; isa <= (int)best; isa++) {
        assert_true(gpe_quant_set_isa((gpe_isa)isa));
        memset(got, 0x5a, sizeof got);
        assert_true(gpe_quantize_row(GPE_TYPE_Q8_0, x, got, N));
        for (int b = 0; b < N / 32; b++) {
            /* block 3's NaN element itself converts to no defined value */
            for (int j = 0; j < 32; j++)
                if (!(b == 3 && j == 4) && got[b].qs[j] != ref[b].qs[j])
                    fail_msg("%s block %d [%d]: %d vs scalar %d", gpe_isa_name((gpe_isa)isa), b, j,
                             got[b].qs[j], ref[b].qs[j]);
            assert_int_equal(got[b].d, ref[b].d);
        }
    }
    assert_true(gpe_quant_set_isa(best));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_traits),
        cmocka_unit_test(test_half),
        cmocka_unit_test(test_hand_q8_0_q4_0),
        cmocka_unit_test(test_hand_q4_k),
        cmocka_unit_test(test_hand_q5_k_q6_k),
        cmocka_unit_test(test_quantizers),
        cmocka_unit_test(test_quant_q8_0_isas),
        cmocka_unit_test(test_reference_dequant),
        cmocka_unit_test(test_dot_paths),
        cmocka_unit_test(test_matmul_rows),
        cmocka_unit_test(test_packed_matmul),
        cmocka_unit_test(test_matmul_rows_f16_edges),
        cmocka_unit_test(test_dot_extremes),
        cmocka_unit_test(test_quant_f16_isas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
