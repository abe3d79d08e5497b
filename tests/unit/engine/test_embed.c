/*
 * Embeddings (gpe_embed, gpe_embed_batch; issue 26 item 2) on the bundled
 * stories260K and the random-weight architecture files of tests/data/arch:
 *   - the vector has the model's n_embd entries and unit L2 norm;
 *   - the same input gives the same vector bit for bit (deterministic) and
 *     on a second context with another thread count within rounding;
 *   - different inputs give different vectors;
 *   - a batch of several inputs (more inputs than sequences, and batches
 *     small enough to split inputs across passes) equals one-by-one;
 *   - last-token pooling (files without <arch>.pooling_type): the vector of
 *     an input equals the normalised final hidden state at its last token,
 *     which does not depend on what follows, so a prefix's vector differs
 *     from the whole input's;
 *   - bad dims, empty or too long inputs and unknown token ids are refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "gpupool/engine.h"

#define STORIES GP_SOURCE_DIR "/models/stories260K.gguf"
#define MAXT 64

static const char *const TEXTS[] = {
    "Once upon a time", "The cat sat on the mat.", "Lily and Tom went to the park to play",
    "A", "She was happy", "He ran home fast and then he ate a big red apple",
};
#define N_TEXTS (int)(sizeof TEXTS / sizeof TEXTS[0])

static gpe_model *load(const char *path)
{
    char err[256];
    gpe_model *m = NULL;
    gpe_model_params mp = gpe_model_default_params();
    gpe_status st = gpe_model_load(path, &mp, &m, err, sizeof err);
    if (st != GPE_OK)
        fail_msg("load %s: %s", path, err);
    return m;
}

static gpe_ctx *ctx_make(gpe_model *m, int n_ctx, int n_seq, int n_batch, int n_threads)
{
    char err[256];
    gpe_ctx_params cp = gpe_ctx_default_params();
    cp.n_ctx = n_ctx;
    cp.n_seq = n_seq;
    cp.n_batch = n_batch;
    cp.n_threads = n_threads;
    gpe_ctx *c = NULL;
    if (gpe_ctx_init(m, &cp, &c, err, sizeof err) != GPE_OK)
        fail_msg("ctx: %s", err);
    return c;
}

static double maxdiff(const float *a, const float *b, int n)
{
    double w = 0.0;
    for (int i = 0; i < n; i++)
        w = fmax(w, fabs((double)a[i] - b[i]));
    return w;
}

static void embed_one(gpe_ctx *c, const int32_t *t, int n, float *out, int dim)
{
    char err[256];
    gpe_status st = gpe_embed(c, t, n, out, dim, err, sizeof err);
    if (st != GPE_OK)
        fail_msg("gpe_embed: %s: %s", gpe_status_name(st), err);
}

static void check_model(const char *path)
{
    char err[256];
    gpe_model *m = load(path);
    const int E = gpe_model_embedding_dim(m);
    gpe_model_info info;
    gpe_model_get_info(m, &info);
    assert_int_equal(E, info.n_embd);
    assert_int_equal(gpe_model_pooling(m), GPE_POOLING_LAST);

    static int32_t toks[N_TEXTS][MAXT];
    int nt[N_TEXTS];
    const int32_t *tp[N_TEXTS];
    for (int i = 0; i < N_TEXTS; i++) {
        nt[i] = gpe_tokenize(m, TEXTS[i], strlen(TEXTS[i]), true, false, toks[i], MAXT);
        assert_true(nt[i] > 0);
        tp[i] = toks[i];
    }
    float *one = calloc((size_t)N_TEXTS * E, sizeof *one);
    float *again = calloc((size_t)E, sizeof *again);
    float *batch = calloc((size_t)N_TEXTS * E, sizeof *batch);
    assert_non_null(one);

    gpe_ctx *c = ctx_make(m, 128, 1, 512, 2);
    for (int i = 0; i < N_TEXTS; i++) {
        float *o = one + (size_t)i * E;
        embed_one(c, toks[i], nt[i], o, E);
        double ss = 0.0;
        for (int k = 0; k < E; k++)
            ss += (double)o[k] * o[k];
        assert_true(fabs(sqrt(ss) - 1.0) < 1e-5);
        embed_one(c, toks[i], nt[i], again, E);
        assert_memory_equal(o, again, (size_t)E * sizeof *o);
    }
    for (int i = 0; i < N_TEXTS; i++)
        for (int j = i + 1; j < N_TEXTS; j++)
            assert_true(maxdiff(one + (size_t)i * E, one + (size_t)j * E, E) > 1e-3);
    /* Last-token pooling: a prefix is a different input. */
    embed_one(c, toks[2], nt[2] - 1, again, E);
    assert_true(maxdiff(again, one + 2 * (size_t)E, E) > 1e-3);

    /* Errors. */
    assert_int_equal(gpe_embed(c, toks[0], nt[0], again, E + 1, err, sizeof err), GPE_ERR_ARG);
    assert_int_equal(gpe_embed(c, toks[0], 0, again, E, err, sizeof err), GPE_ERR_ARG);
    int32_t *lng = calloc(129, sizeof *lng);
    assert_int_equal(gpe_embed(c, lng, 129, again, E, err, sizeof err), GPE_ERR_CTX_FULL);
    free(lng);
    int32_t bad[2] = { 1, (int32_t)info.n_vocab };
    assert_int_equal(gpe_embed(c, bad, 2, again, E, err, sizeof err), GPE_ERR_ARG);
    gpe_ctx_free(c);

    /* Batches: 4 sequences for 6 inputs, 8 tokens a pass (inputs split
     * across passes), another thread count. */
    c = ctx_make(m, 128, 4, 8, 1);
    gpe_status st = gpe_embed_batch(c, tp, nt, N_TEXTS, batch, E, err, sizeof err);
    if (st != GPE_OK)
        fail_msg("gpe_embed_batch: %s", err);
    double w = maxdiff(one, batch, N_TEXTS * E);
    printf("%s: dim %d, batch vs one-by-one max diff %.3g\n", info.arch, E, w);
    assert_true(w < 1e-5);
    gpe_ctx_free(c);

    free(one);
    free(again);
    free(batch);
    gpe_model_free(m);
}

static void test_stories(void **state)
{
    (void)state;
    check_model(STORIES);
}

static void test_arch_files(void **state)
{
    (void)state;
    static const char *const files[] = { "tiny-random-llama3-f16", "tiny-random-qwen3-f16",
                                         "tiny-random-gemma2-f16" };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/arch/%s.gguf", GP_MODEL_DATA, files[i]);
        check_model(path);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories),
        cmocka_unit_test(test_arch_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
