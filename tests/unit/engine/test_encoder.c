/*
 * BERT-style encoders (bert, nomic-bert; issue 26 item 2) on the tiny
 * random files of tests/data/arch, against llama.cpp's llama-embedding on
 * the same files (X.embd.json, see tests/data/SOURCES.md):
 *   - the WordPiece tokenizer gives llama.cpp's ids ([CLS] ... [SEP]);
 *   - the pooled, normalised vectors (bert: mean, nomic-bert: CLS, as the
 *     files declare) match llama.cpp's: cosine >= 0.9999 and every value
 *     within 5e-4 (unit vectors of 64 values of about 0.12; measured: at
 *     most 1e-4, from activations rounding to F16 differently);
 *   - many inputs in one gpe_embed_batch equal the inputs one by one, also
 *     when they fill a pass unevenly (a 2-sequence context, 5 inputs);
 *   - attention is bidirectional: the CLS vector (position 0) changes when a
 *     later token changes (under a causal mask it could not);
 *   - the model is embeddings-only: gpe_decode refuses it;
 *   - a file declaring causal attention, or without the LayerNorm eps or the
 *     token type count, is refused at load naming what is wrong.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <math.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "gpupool/engine.h"

#define MAXT 128
#define DIM 64

static gpe_model *load(const char *base)
{
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/arch/%s.gguf", GP_MODEL_DATA, base);
    gpe_model *m = NULL;
    gpe_model_params mp = gpe_model_default_params();
    if (gpe_model_load(path, &mp, &m, err, sizeof err) != GPE_OK)
        fail_msg("load %s: %s", path, err);
    return m;
}

static json_t *load_ref(const char *base)
{
    char path[512];
    snprintf(path, sizeof path, "%s/arch/%s.embd.json", GP_TEST_DATA, base);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        fail_msg("%s: %s", path, je.text);
    return j;
}

static gpe_ctx *ctx_make(gpe_model *m, int n_seq, int n_threads)
{
    char err[256];
    gpe_ctx_params cp = gpe_ctx_default_params();
    cp.n_seq = n_seq;
    cp.n_threads = n_threads;
    gpe_ctx *c = NULL;
    if (gpe_ctx_init(m, &cp, &c, err, sizeof err) != GPE_OK)
        fail_msg("ctx: %s", err);
    return c;
}

static void embed(gpe_ctx *c, const int32_t *const *t, const int *n, int k, float *out)
{
    char err[256];
    if (gpe_embed_batch(c, t, n, k, out, DIM, err, sizeof err) != GPE_OK)
        fail_msg("embed: %s", err);
}

static double cosine(const float *a, const double *b, int n)
{
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) {
        ab += a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += b[i] * b[i];
    }
    return ab / sqrt(aa * bb);
}

/* Tokenizes every reference input, checks the ids, returns the count. */
static int check_ids(gpe_model *m, json_t *inputs, int32_t toks[][MAXT], int *nt)
{
    int k = (int)json_array_size(inputs);
    assert_true(k >= 3 && k <= 8);
    for (int i = 0; i < k; i++) {
        json_t *in = json_array_get(inputs, (size_t)i);
        const char *text = json_string_value(json_object_get(in, "text"));
        json_t *ids = json_object_get(in, "ids");
        nt[i] = gpe_tokenize(m, text, strlen(text), true, false, toks[i], MAXT);
        assert_int_equal(nt[i], (int)json_array_size(ids));
        for (int j = 0; j < nt[i]; j++)
            if (toks[i][j] != (int32_t)json_integer_value(json_array_get(ids, (size_t)j)))
                fail_msg("'%s': token %d is %d, llama.cpp %d", text, j, (int)toks[i][j],
                         (int)json_integer_value(json_array_get(ids, (size_t)j)));
    }
    return k;
}

static void check_file(const char *base, int pooling)
{
    gpe_model *m = load(base);
    json_t *ref = load_ref(base);
    json_t *inputs = json_object_get(ref, "inputs");
    assert_true(gpe_model_embeddings_only(m));
    assert_int_equal(gpe_model_pooling(m), pooling);
    assert_int_equal(gpe_model_embedding_dim(m), DIM);

    static int32_t toks[8][MAXT];
    int nt[8];
    const int32_t *tp[8];
    int k = check_ids(m, inputs, toks, nt);
    for (int i = 0; i < k; i++)
        tp[i] = toks[i];

    float all[8 * DIM], one[8 * DIM];
    gpe_ctx *c8 = ctx_make(m, 8, 2), *c2 = ctx_make(m, 2, 1);
    embed(c8, tp, nt, k, all);
    for (int i = 0; i < k; i++)
        embed(c2, tp + i, nt + i, 1, one + i * DIM);
    for (int i = 0; i < k * DIM; i++)
        assert_true(all[i] == one[i]);   /* batching changes nothing */
    embed(c2, tp, nt, k, one);           /* 5 inputs through 2 sequences */
    for (int i = 0; i < k * DIM; i++)
        assert_true(all[i] == one[i]);

    for (int i = 0; i < k; i++) {
        json_t *v = json_object_get(json_array_get(inputs, (size_t)i), "embedding");
        double want[DIM], worst = 0.0;
        assert_int_equal(json_array_size(v), DIM);
        for (int d = 0; d < DIM; d++) {
            want[d] = json_number_value(json_array_get(v, (size_t)d));
            worst = fmax(worst, fabs(all[i * DIM + d] - want[d]));
        }
        double cs = cosine(all + i * DIM, want, DIM);
        printf("%s input %d: cosine %.7f, max abs diff %.2e\n", base, i, cs, worst);
        assert_true(cs >= 0.9999);
        assert_true(worst <= 5e-4);
    }
    gpe_ctx_free(c8);
    gpe_ctx_free(c2);
    json_decref(ref);
    gpe_model_free(m);
}

static void test_bert(void **state)
{
    (void)state;
    check_file("tiny-random-bert-f16", GPE_POOLING_MEAN);
}

static void test_nomic_bert(void **state)
{
    (void)state;
    check_file("tiny-random-nomic-bert-f16", GPE_POOLING_CLS);
}

/* CLS pooling reads position 0 only: with bidirectional attention it still
 * depends on the last word. */
static void test_bidirectional(void **state)
{
    (void)state;
    gpe_model *m = load("tiny-random-nomic-bert-f16");
    gpe_ctx *c = ctx_make(m, 1, 1);
    int32_t a[16], b[16];
    int na = gpe_tokenize(m, "the cat sat", 11, true, false, a, 16);
    int nb = gpe_tokenize(m, "the cat ran", 11, true, false, b, 16);
    assert_int_equal(na, 5);
    assert_int_equal(nb, 5);
    assert_int_equal(a[0], b[0]);
    float va[DIM], vb[DIM];
    const int32_t *pa = a, *pb = b;
    embed(c, &pa, &na, 1, va);
    embed(c, &pb, &nb, 1, vb);
    double diff = 0.0;
    for (int d = 0; d < DIM; d++)
        diff = fmax(diff, fabs(va[d] - vb[d]));
    assert_true(diff > 1e-3);
    gpe_ctx_free(c);
    gpe_model_free(m);
}

static void test_decode_refused(void **state)
{
    (void)state;
    char err[256] = "";
    gpe_model *m = load("tiny-random-bert-f16");
    gpe_ctx *c = ctx_make(m, 1, 1);
    gpe_batch *b = gpe_batch_init(4);
    gpe_batch_add(b, 101, 0, 0, true);
    assert_int_equal(gpe_decode(c, b, err, sizeof err), GPE_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "embeddings only"));
    gpe_batch_free(b);
    gpe_ctx_free(c);
    gpe_model_free(m);
}

/* The bert file with its bytes patched at the first occurrence of `find`
 * (same length), loaded: the load must fail with an error containing
 * `want`. */
static void load_patched(const char *find, const char *repl, size_t voff, uint8_t val,
                         const char *want)
{
    char path[512], out[128], err[256] = "";
    snprintf(path, sizeof path, "%s/arch/tiny-random-bert-f16.gguf", GP_MODEL_DATA);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static uint8_t buf[8 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    uint8_t *k = memmem(buf, n, find, strlen(find));
    assert_non_null(k);
    if (repl)
        memcpy(k, repl, strlen(repl));
    else
        k[strlen(find) + voff] = val;   /* the value after the key and its type */
    snprintf(out, sizeof out, "/tmp/gpe_test_encoder_%d.gguf", (int)getpid());
    f = fopen(out, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    fclose(f);
    gpe_model *m = NULL;
    gpe_model_params mp = gpe_model_default_params();
    gpe_status st = gpe_model_load(out, &mp, &m, err, sizeof err);
    unlink(out);
    assert_int_not_equal(st, GPE_OK);
    if (!strstr(err, want))
        fail_msg("error '%s' does not say '%s'", err, want);
}

/* What an encoder file must have: non-causal attention, a LayerNorm eps,
 * a token type count (llama.cpp refuses the last two as well). */
static void test_refused(void **state)
{
    (void)state;
    /* bool value: 4-byte type (7), then the byte */
    load_patched("bert.attention.causal", NULL, 4, 1, "causal encoders are not supported");
    load_patched("bert.attention.layer_norm_epsilon", "bert.attention.layer_norm_epsilox", 0, 0,
                 "layer_norm_epsilon");
    load_patched("tokenizer.ggml.token_type_count", "tokenizer.ggml.token_type_counx", 0, 0,
                 "token_type_count");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bert),
        cmocka_unit_test(test_nomic_bert),
        cmocka_unit_test(test_bidirectional),
        cmocka_unit_test(test_decode_refused),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
