/* The mask's fast path inside pattern strings (src/engine/grammar.c
 * mask_pattern): on real vocabularies, at every pattern position of random
 * walks under schemas with patterns and formats, the tokens it allows are
 * exactly those that feeding each token's bytes to a copy of the matcher
 * state allows (token_ok, the slow path it replaces), budget included.
 * Includes grammar.c to reach its statics (docs: tests may). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../../src/engine/grammar.c"

static const char *const schemas[] = {
    /* bench_grammar's PATTERN_SCHEMA */
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":24,"
    "\"pattern\":\"^[A-Z][a-z]+( [A-Z][a-z]+)?$\"},\"day\":{\"type\":\"string\",\"format\":"
    "\"date\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12,"
    "\"pattern\":\"^[a-z-]+$\"},\"maxItems\":4},\"ok\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"day\",\"tags\",\"ok\"],\"additionalProperties\":false}",
    /* unanchored, with lengths on both sides */
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"[0-9]+x\","
    "\"minLength\":3,\"maxLength\":9},\"b\":{\"type\":\"string\",\"pattern\":\"[^a]z|.b\"}},"
    "\"required\":[\"a\",\"b\"]}",
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"format\":\"email\"},\"maxItems\":3}",
};

static uint32_t rng = 12345;
static uint32_t rnd(void)
{
    rng = rng * 1103515245u + 12345u;
    return rng >> 8;
}

/* Compare the mask with token_ok at the current state (a pattern position). */
static int compare(gpe_grammar *g, const float *logits, int nv, int left)
{
    const float *m = gpe_grammar_mask(g, logits, nv, left);
    int64_t limit = left > 0 ? (int64_t)left - 1 : GPE_JS_INF - 1;
    int n_exp = 0;
    bool *exp = calloc((size_t)nv, sizeof *exp);
    assert_non_null(exp);
    for (int t = 0; t < nv; t++) {
        exp[t] = !g->v->eog[t] && g->v->off[t + 1] > g->v->off[t] && token_ok(g, t, limit);
        n_exp += exp[t];
    }
    if (n_exp > 0)   /* (none: the mask falls back, compared elsewhere) */
        for (int t = 0; t < nv; t++)
            if (exp[t] != (m[t] != -INFINITY))
                fail_msg("token %d: mask %d, token_ok %d (left %d)", t, m[t] != -INFINITY,
                         exp[t], left);
    free(exp);
    return n_exp;
}

static void walk(gpe_model *m, const char *schema, int steps)
{
    int nv = gpe_model_n_vocab(m);
    float *logits = malloc((size_t)nv * sizeof *logits);
    assert_non_null(logits);
    for (int t = 0; t < nv; t++)
        logits[t] = (float)(rnd() % 1000) / 100.0f;
    char err[256];
    gpe_grammar *g = NULL;
    int compared = 0, step = 0;
    while (step < steps) {
        if (!g)
            if (gpe_grammar_init(m, schema, &g, err, sizeof err) != GPE_OK)
                fail_msg("%s: %s", schema, err);
        /* a tight budget now and then, so the completion bound bites */
        int left = rnd() % 4 == 0 ? 3 + (int)(rnd() % 12) : 200;
        const gpe_js_node *nd;
        int64_t chars;
        uint64_t st;
        if (gpe_jg_in_pattern(&g->st, g->prog, &nd, &chars, &st) &&
            compare(g, logits, nv, left) > 0)
            compared++;
        const float *l = gpe_grammar_mask(g, logits, nv, left);
        int n_ok = 0, pick = -1;
        for (int t = 0; t < nv; t++)
            if (l[t] != -INFINITY && rnd() % (unsigned)++n_ok == 0)
                pick = t;
        step++;
        if (pick < 0 || g->v->eog[pick] || gpe_grammar_accept(g, pick) != GPE_OK ||
            gpe_grammar_done(g)) {
            gpe_grammar_free(g);
            g = NULL;
        }
    }
    gpe_grammar_free(g);
    free(logits);
    assert_true(compared > steps / 4);
}

static void test_mask_pattern_matches_token_ok(void **state)
{
    (void)state;
    static const char *const vocabs[] = {"llama-spm", "gpt-2"};
    for (size_t i = 0; i < sizeof vocabs / sizeof vocabs[0]; i++) {
        char path[512], err[256];
        snprintf(path, sizeof path, GP_SOURCE_DIR "/tests/data/vocab/ggml-vocab-%s.gguf",
                 vocabs[i]);
        gpe_model_params vp = gpe_model_default_params();
        vp.vocab_only = true;
        gpe_model *m = NULL;
        if (gpe_model_load(path, &vp, &m, err, sizeof err))
            fail_msg("%s: %s", path, err);
        for (size_t k = 0; k < sizeof schemas / sizeof schemas[0]; k++)
            walk(m, schemas[k], 120);
        gpe_model_free(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mask_pattern_matches_token_ok),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
