/*
 * Model loading when memory runs out (gpe_model_load: the GGUF reader, the
 * weights, the tokenizer): every run whose allocation failed either loads
 * the model whole (where a failure only costs speed: the packed weights,
 * the tokenizer's chunking trie) or says GPE_ERR_NOMEM with an "out of
 * memory" message, and frees everything (the leak check under ASan). Never
 * GPE_ERR_FORMAT: a caller takes that for a damaged file (gpupool-run's
 * "cannot load model (FORMAT)", the agent's refusal) when a retry could
 * load it.
 *
 * The N-th of the engine's malloc, calloc, realloc and strdup fails (ld
 * --wrap: part-49-load-oom.cmake, tests/unit/server/fixture_oom.h
 * arm_libc), for N = 1, 2, ... until a run ends without reaching it, on
 * stories260K (SentencePiece vocabulary, weights and vocabulary only) and
 * on llama.cpp's gpt-2 vocabulary (byte-level BPE: the merges). Then the
 * same files still load as they did, and a damaged file is still FORMAT.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "gpupool/engine.h"

#define GPS_FIXTURE_OOM_LIBC
#define GPS_FIXTURE_OOM_STRDUP
#include "../server/fixture_oom.h"

#define STORIES GP_SOURCE_DIR "/models/stories260K.gguf"
#define GPT2_VOCAB GP_SOURCE_DIR "/tests/data/vocab/ggml-vocab-gpt-2.gguf"

static gpe_status load(const char *path, bool vocab_only, gpe_model **m, char *err,
                       size_t errlen)
{
    gpe_model_params mp = gpe_model_default_params();
    mp.backend = GPE_BACKEND_CPU;
    mp.vocab_only = vocab_only;
    return gpe_model_load(path, &mp, m, err, errlen);
}

/* The sweep over one load; returns how many runs failed an allocation. */
static int sweep(const char *path, bool vocab_only)
{
    char err[512];
    gpe_model *ref = NULL;
    gpe_status st = load(path, vocab_only, &ref, err, sizeof err);
    if (st != GPE_OK)
        fail_msg("%s: reference load: %s (%s)", path, err, gpe_status_name(st));
    const int n_vocab = gpe_model_n_vocab(ref);
    gpe_model_free(ref);

    int n_failed = 0;
    for (size_t n = 1;; n++) {
        gpe_model *m = NULL;
        err[0] = '\0';
        arm_libc(n);
        st = load(path, vocab_only, &m, err, sizeof err);
        const bool hit = disarm();
        if (!hit) {
            if (st != GPE_OK)
                fail_msg("%s: run %zu without a failure: %s (%s)", path, n, err,
                         gpe_status_name(st));
            gpe_model_free(m);
            break;
        }
        n_failed++;
        if (st == GPE_OK) {
            /* a failure that only costs speed: the model is the same */
            assert_non_null(m);
            assert_int_equal(gpe_model_n_vocab(m), n_vocab);
            gpe_model_free(m);
            continue;
        }
        if (st != GPE_ERR_NOMEM || m != NULL || !strstr(err, "out of memory"))
            fail_msg("%s%s: allocation %zu failed: %s, \"%s\" (want NOMEM, \"out of memory\")",
                     path, vocab_only ? " (vocabulary only)" : "", n, gpe_status_name(st), err);
    }
    return n_failed;
}

static void test_stories_sweep(void **state)
{
    (void)state;
    assert_true(sweep(STORIES, false) > 5);
}

static void test_stories_vocab_sweep(void **state)
{
    (void)state;
    assert_true(sweep(STORIES, true) > 5);
}

static void test_gpt2_vocab_sweep(void **state)
{
    (void)state;
    assert_true(sweep(GPT2_VOCAB, true) > 5);
}

/* A damaged file is still FORMAT (what NOMEM must not be mistaken for):
 * stories260K with its header cut inside the vocabulary. */
static void test_damaged_is_format(void **state)
{
    (void)state;
    FILE *f = fopen(STORIES, "rb");
    assert_non_null(f);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_true(n == sizeof buf);
    char path[] = "/tmp/gp_load_oom_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *o = fdopen(fd, "wb");
    assert_non_null(o);
    assert_int_equal(fwrite(buf, 1, n, o), n);
    fclose(o);
    char err[512];
    gpe_model *m = NULL;
    gpe_status st = load(path, true, &m, err, sizeof err);
    unlink(path);
    assert_null(m);
    if (st != GPE_ERR_FORMAT)
        fail_msg("cut file: %s (%s), want FORMAT", err, gpe_status_name(st));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_sweep),
        cmocka_unit_test(test_stories_vocab_sweep),
        cmocka_unit_test(test_gpt2_vocab_sweep),
        cmocka_unit_test(test_damaged_is_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
