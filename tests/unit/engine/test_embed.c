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
 *   - bad dims, empty or too long inputs and unknown token ids are refused;
 *   - <arch>.pooling_type on gguf-random files of the same weights (same
 *     seed) with the key absent (last), 0 (none: last), 1 (mean), 2 (cls),
 *     4 (rank: unsupported): cls of an input is last of its first token;
 *     mean of two tokens lies in the span of the two positions' states
 *     (last of each prefix) with positive weights, unit length.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>

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

/* A small random llama file with pooling key p (-1: none) at path. */
static void make_file(char *path, size_t len, int p)
{
    char cmd[1024], pool[32] = "";
    snprintf(path, len, "/tmp/gpe_test_embed_%d_%d.gguf", (int)getpid(), p + 1);
    if (p >= 0)
        snprintf(pool, sizeof pool, "--pooling %d", p);
    snprintf(cmd, sizeof cmd,
             "'%s' --shape custom --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 "
             "--n-ff 128 --n-vocab 400 --type f32 --seed 5 %s -o '%s' >/dev/null",
             GGUF_RANDOM_EXE, pool, path);
    assert_int_equal(system(cmd), 0);
}

static void embed_file(int p, const int32_t *t, int n, float *out, int *pooling)
{
    char path[256], err[256];
    make_file(path, sizeof path, p);
    gpe_model *m = load(path);
    unlink(path);
    *pooling = gpe_model_pooling(m);
    if (*pooling > 0) {
        gpe_ctx *c = ctx_make(m, 64, 1, 64, 1);
        embed_one(c, t, n, out, 64);
        gpe_ctx_free(c);
    } else {
        gpe_ctx *c = ctx_make(m, 64, 1, 64, 1);
        assert_int_equal(gpe_embed(c, t, n, out, 64, err, sizeof err), GPE_ERR_UNSUPPORTED);
        gpe_ctx_free(c);
    }
    gpe_model_free(m);
}

static void test_pooling(void **state)
{
    (void)state;
    const int32_t t[2] = { 1, 300 };
    float last[64], none[64], first[64], second[64], cls[64], mean[64], rank[64];
    int pl;
    embed_file(-1, t, 2, last, &pl);
    assert_int_equal(pl, GPE_POOLING_LAST);
    embed_file(0, t, 2, none, &pl);
    assert_int_equal(pl, GPE_POOLING_LAST);
    assert_memory_equal(last, none, sizeof last);
    embed_file(-1, t, 1, first, &pl);      /* state at position 0 */
    memcpy(second, last, sizeof last);     /* state at position 1 */
    embed_file(2, t, 2, cls, &pl);
    assert_int_equal(pl, GPE_POOLING_CLS);
    assert_true(maxdiff(cls, first, 64) < 1e-6);
    embed_file(1, t, 2, mean, &pl);
    assert_int_equal(pl, GPE_POOLING_MEAN);
    embed_file(4, t, 2, rank, &pl);
    assert_int_equal(pl, -1);

    /* mean = a*first + b*second (unit vectors) with a, b > 0: solve the
     * 2x2 normal equations and check the residual. */
    double g11 = 0, g12 = 0, g22 = 0, r1 = 0, r2 = 0, nm = 0;
    for (int i = 0; i < 64; i++) {
        g11 += (double)first[i] * first[i];
        g12 += (double)first[i] * second[i];
        g22 += (double)second[i] * second[i];
        r1 += (double)first[i] * mean[i];
        r2 += (double)second[i] * mean[i];
        nm += (double)mean[i] * mean[i];
    }
    double det = g11 * g22 - g12 * g12;
    assert_true(fabs(det) > 1e-6);
    double a = (r1 * g22 - r2 * g12) / det, b = (r2 * g11 - r1 * g12) / det, res = 0;
    for (int i = 0; i < 64; i++) {
        double d = mean[i] - a * first[i] - b * second[i];
        res += d * d;
    }
    printf("mean pooling: weights %.4f %.4f, residual %.3g\n", a, b, sqrt(res));
    assert_true(a > 0 && b > 0);
    assert_true(sqrt(res) < 1e-4);
    assert_true(fabs(sqrt(nm) - 1.0) < 1e-5);
    assert_true(maxdiff(mean, last, 64) > 1e-3 && maxdiff(mean, cls, 64) > 1e-3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories),
        cmocka_unit_test(test_arch_files),
        cmocka_unit_test(test_pooling),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
