/*
 * Prompt-prefix reuse in the engine (issue 13, "Prompt-prefix cache"):
 * a sequence that holds another request's tokens is truncated to the
 * common prefix with gpe_seq_truncate and only the rest is decoded. Its
 * logits at the last prompt position must equal a fresh prefill's (within
 * float rounding: the cached rows were computed in other batch shapes, some
 * by single-token decode) and its greedy continuation must be identical.
 *
 * Models: stories260K (llama), the qwen2 F16 and Q8_0 architecture files
 * (biases, NEOX rope, quantized activations) and gemma2 (sliding window on
 * alternate layers: the window is by position, so truncation keeps it
 * right). A small n_batch makes every prefill run in several chunks.
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

#define N_GEN 16
#define MAX_TOK 512
#define TOL 1e-4

typedef struct fixture {
    gpe_model *m;
    gpe_ctx *ctx;
    gpe_batch *b;
    int n_vocab;
} fixture;

static void fx_open(fixture *f, const char *path, int n_seq)
{
    char err[256];
    memset(f, 0, sizeof *f);
    gpe_model_params mp = gpe_model_default_params();
    if (gpe_model_load(path, &mp, &f->m, err, sizeof err) != GPE_OK)
        fail_msg("load %s: %s", path, err);
    gpe_ctx_params cp = gpe_ctx_default_params();
    cp.n_ctx = 320;
    cp.n_seq = n_seq;
    cp.n_threads = 2;
    cp.n_batch = 24;
    if (gpe_ctx_init(f->m, &cp, &f->ctx, err, sizeof err) != GPE_OK)
        fail_msg("ctx: %s", err);
    f->b = gpe_batch_init(MAX_TOK);
    f->n_vocab = gpe_model_n_vocab(f->m);
}

static void fx_close(fixture *f)
{
    gpe_batch_free(f->b);
    gpe_ctx_free(f->ctx);
    gpe_model_free(f->m);
}

/* Decode toks[0..n) into seq after what it holds; copy the last token's
 * logits into out (n_vocab floats) when out is not NULL. */
static void feed(fixture *f, int seq, const int32_t *toks, int n, float *out)
{
    char err[256];
    gpe_batch_clear(f->b);
    int p0 = gpe_seq_len(f->ctx, seq);
    for (int i = 0; i < n; i++)
        gpe_batch_add(f->b, toks[i], p0 + i, seq, i == n - 1);
    if (gpe_decode(f->ctx, f->b, err, sizeof err) != GPE_OK)
        fail_msg("decode: %s", err);
    if (out)
        memcpy(out, gpe_get_logits(f->ctx, n - 1), (size_t)f->n_vocab * sizeof *out);
}

static int32_t argmax(const float *v, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

/* Greedy ids after the logits in lg, one decode per token. */
static void greedy(fixture *f, int seq, float *lg, int32_t *ids)
{
    for (int g = 0; g < N_GEN; g++) {
        ids[g] = argmax(lg, f->n_vocab);
        feed(f, seq, &ids[g], 1, lg);
    }
}

static double maxdiff(const float *a, const float *b, int n)
{
    double d = 0;
    for (int i = 0; i < n; i++)
        if (fabs((double)a[i] - b[i]) > d)
            d = fabs((double)a[i] - b[i]);
    return d;
}

static void check_model(const char *path)
{
    fixture f;
    fx_open(&f, path, 3);
    const char *text =
        "Once upon a time there was a little girl named Lily. She liked to play in the park "
        "with her friends. One day she found a big red ball under a tree and she was very happy";
    int32_t p[MAX_TOK];
    int n = gpe_tokenize(f.m, text, strlen(text), true, false, p, MAX_TOK);
    assert_true(n > 30);
    const int k = n / 2;   /* the shared prefix */

    float *fresh = malloc((size_t)f.n_vocab * sizeof *fresh);
    float *lg = malloc((size_t)f.n_vocab * sizeof *lg);
    int32_t ids_fresh[N_GEN], ids[N_GEN];

    /* Cold: seq 0 prefills the whole prompt. */
    feed(&f, 0, p, n, fresh);
    memcpy(lg, fresh, (size_t)f.n_vocab * sizeof *lg);
    greedy(&f, 0, lg, ids_fresh);

    /* Warm: seq 1 first holds another request sharing p[0..k), made of a
     * prefill and single-token decodes, then reuses the prefix. */
    int32_t other[MAX_TOK];
    memcpy(other, p, (size_t)k * sizeof *other);
    for (int i = k; i < k + 20; i++)
        other[i] = (int32_t)((p[i % n] * 7 + i) % f.n_vocab);
    feed(&f, 1, other, k + 20, lg);
    int32_t junk[N_GEN];
    greedy(&f, 1, lg, junk);
    assert_int_equal(gpe_seq_len(f.ctx, 1), k + 20 + N_GEN);
    gpe_seq_truncate(f.ctx, 1, k);
    assert_int_equal(gpe_seq_len(f.ctx, 1), k);
    feed(&f, 1, p + k, n - k, lg);
    double d = maxdiff(fresh, lg, f.n_vocab);
    greedy(&f, 1, lg, ids);
    printf("# %s: %d prompt tokens, %d reused: max |logit diff| %.3g\n", path, n, k, d);
    assert_true(d <= TOL);
    assert_memory_equal(ids, ids_fresh, sizeof ids);

    /* The whole prompt cached (seq 0 holds p + generated): keep all but the
     * last prompt token, which is decoded again for its logits. */
    gpe_seq_truncate(f.ctx, 0, n - 1);
    feed(&f, 0, p + n - 1, 1, lg);
    d = maxdiff(fresh, lg, f.n_vocab);
    greedy(&f, 0, lg, ids);
    printf("# %s: all but the last token reused: max |logit diff| %.3g\n", path, d);
    assert_true(d <= TOL);
    assert_memory_equal(ids, ids_fresh, sizeof ids);

    /* Decode-made rows reused: seq 2 takes the prompt one token at a time
     * (as generated tokens are), then reuses all of it but the last. */
    for (int i = 0; i < n; i++)
        feed(&f, 2, p + i, 1, NULL);
    gpe_seq_truncate(f.ctx, 2, n - 1);
    feed(&f, 2, p + n - 1, 1, lg);
    d = maxdiff(fresh, lg, f.n_vocab);
    greedy(&f, 2, lg, ids);
    printf("# %s: rows from single-token decodes reused: max |logit diff| %.3g\n", path, d);
    assert_true(d <= TOL);
    assert_memory_equal(ids, ids_fresh, sizeof ids);

    free(fresh);
    free(lg);
    fx_close(&f);
}

static void test_stories(void **s) { (void)s; check_model(GP_SOURCE_DIR "/models/stories260K.gguf"); }
static void test_qwen2(void **s) { (void)s; check_model(GP_MODEL_DATA "/arch/tiny-random-qwen2-f16.gguf"); }
static void test_qwen2_q8(void **s) { (void)s; check_model(GP_MODEL_DATA "/arch/tiny-random-qwen2-q8_0.gguf"); }
static void test_gemma2(void **s) { (void)s; check_model(GP_MODEL_DATA "/arch/tiny-random-gemma2-f16.gguf"); }

/* Truncation's edges: beyond the length changes nothing, <= 0 clears, a
 * bad sequence or NULL context is ignored, and the next decode must start
 * at the truncated length. */
static void test_truncate_edges(void **state)
{
    (void)state;
    fixture f;
    fx_open(&f, GP_SOURCE_DIR "/models/stories260K.gguf", 2);
    int32_t t[8] = {1, 400, 401, 402, 403, 404, 405, 406};
    feed(&f, 0, t, 8, NULL);
    gpe_seq_truncate(f.ctx, 0, 100);
    assert_int_equal(gpe_seq_len(f.ctx, 0), 8);
    gpe_seq_truncate(f.ctx, 5, 2);
    gpe_seq_truncate(f.ctx, -1, 2);
    gpe_seq_truncate(NULL, 0, 2);
    assert_int_equal(gpe_seq_len(f.ctx, 0), 8);
    gpe_seq_truncate(f.ctx, 0, 3);
    assert_int_equal(gpe_seq_len(f.ctx, 0), 3);
    char err[256];
    gpe_batch_clear(f.b);
    gpe_batch_add(f.b, 7, 8, 0, true);   /* old end: refused */
    assert_int_equal(gpe_decode(f.ctx, f.b, err, sizeof err), GPE_ERR_ARG);
    assert_int_equal(gpe_seq_len(f.ctx, 0), 3);
    gpe_seq_truncate(f.ctx, 0, 0);
    assert_int_equal(gpe_seq_len(f.ctx, 0), 0);
    gpe_seq_truncate(f.ctx, 0, -4);
    assert_int_equal(gpe_seq_len(f.ctx, 0), 0);
    fx_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories),
        cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_qwen2_q8),
        cmocka_unit_test(test_gemma2),
        cmocka_unit_test(test_truncate_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
