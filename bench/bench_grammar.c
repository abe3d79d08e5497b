/*
 * bench_grammar: the cost of JSON-Schema-constrained sampling (issue 26).
 * Printed, never asserted.
 *
 *   1. stories260K end to end (decode + sample), tokens/s without a schema,
 *      with json_object and with a schema of bounded strings;
 *   2. the mask alone on real vocabularies (llama.cpp's vocab-only files
 *      in tests/data/vocab: SPM 32k, GPT-2 50k, DeepSeek 100k), random
 *      logits: microseconds per token for sample only vs mask + sample +
 *      accept.
 *
 * Usage: bench_grammar [tokens]   (default 3000 per measurement)
 * Times are this thread's CPU time (the decode runs on 1 thread).
 */
#include <gpupool/engine.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":24},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},\"tags\":{\"type\":\"array\","
    "\"items\":{\"type\":\"string\",\"maxLength\":12},\"maxItems\":4},\"ok\":{\"type\":"
    "\"boolean\"}},\"required\":[\"name\",\"age\",\"tags\",\"ok\"],"
    "\"additionalProperties\":false}";

/* The same shape with its strings held to patterns and formats (each
 * token's bytes stepped through the automaton: no plain-text fast path). */
static const char *PATTERN_SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":24,"
    "\"pattern\":\"^[A-Z][a-z]+( [A-Z][a-z]+)?$\"},\"day\":{\"type\":\"string\",\"format\":"
    "\"date\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12,"
    "\"pattern\":\"^[a-z-]+$\"},\"maxItems\":4},\"ok\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"day\",\"tags\",\"ok\"],\"additionalProperties\":false}";

/* CPU time of this thread: the machines these run on are shared, and
 * time spent preempted is not the grammar's. */
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One run of `total` generated tokens on stories260K, restarting the
 * generation (fresh prompt) whenever it ends. mode: 0 none, 1 json_object,
 * 2 SCHEMA. Returns tokens/s. */
static double e2e(gpe_model *m, gpe_ctx *ctx, int mode, int total, double *mask_us)
{
    double in_mask = 0;
    char err[256];
    gpe_sampler_params sp = gpe_sampler_default_params();
    sp.temperature = 1.0f;
    sp.seed = 7;
    gpe_sampler *s = gpe_sampler_init(&sp);
    gpe_batch *b = gpe_batch_init(64);
    int32_t toks[64];
    int nv = gpe_model_n_vocab(m), done = 0;
    double t0 = now();
    while (done < total) {
        gpe_grammar *g = NULL;
        if (mode && gpe_grammar_init(m, mode == 2 ? SCHEMA : NULL, &g, err, sizeof err)) {
            fprintf(stderr, "grammar: %s\n", err);
            exit(1);
        }
        int n = gpe_tokenize(m, "Once upon a time", 16, true, false, toks, 64);
        gpe_seq_clear(ctx, 0);
        gpe_batch_clear(b);
        for (int i = 0; i < n; i++)
            gpe_batch_add(b, toks[i], i, 0, i == n - 1);
        gpe_decode(ctx, b, err, sizeof err);
        int pos = n, last = n - 1;
        for (int step = 0; step < 256 && done < total; step++) {
            const float *l = gpe_get_logits(ctx, last);
            double tm = now();
            if (g)
                l = gpe_grammar_mask(g, l, nv, 256 - step);
            in_mask += now() - tm;
            int32_t t = gpe_sampler_sample(s, l, nv);
            done++;
            tm = now();
            if (g)
                gpe_grammar_accept(g, t);
            in_mask += now() - tm;
            if (gpe_token_is_eog(m, t) || (g && gpe_grammar_done(g)))
                break;
            gpe_batch_clear(b);
            gpe_batch_add(b, t, pos++, 0, true);
            last = 0;
            gpe_decode(ctx, b, err, sizeof err);
        }
        gpe_grammar_free(g);
    }
    double dt = now() - t0;
    gpe_batch_free(b);
    gpe_sampler_free(s);
    *mask_us = in_mask / total * 1e6;
    return total / dt;
}

static uint64_t rng = 88172645463325252ULL;
static float rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-53) * 8.0f;
}

/* Mask cost on a vocabulary: us per token. schema: NULL json_object, ""
 * none (sample only). */
static double mask_cost(gpe_model *m, const char *schema, int total)
{
    char err[256];
    int nv = gpe_model_n_vocab(m);
    float *logits = malloc((size_t)nv * sizeof *logits);
    gpe_sampler_params sp = gpe_sampler_default_params();
    sp.seed = 3;
    gpe_sampler *s = gpe_sampler_init(&sp);
    bool none = schema && !*schema;
    gpe_grammar *g = NULL;
    double spent = 0;
    for (int done = 0; done < total; done++) {
        for (int i = 0; i < nv; i++)
            logits[i] = rnd();
        if (!none && !g && gpe_grammar_init(m, schema, &g, err, sizeof err)) {
            fprintf(stderr, "grammar: %s\n", err);
            exit(1);
        }
        double t0 = now();
        const float *l = none ? logits : gpe_grammar_mask(g, logits, nv, 200);
        int32_t t = gpe_sampler_sample(s, l, nv);
        if (g)
            gpe_grammar_accept(g, t);
        spent += now() - t0;
        if (g && (gpe_grammar_done(g) || gpe_token_is_eog(m, t))) {
            gpe_grammar_free(g);
            g = NULL;
        }
    }
    gpe_grammar_free(g);
    gpe_sampler_free(s);
    free(logits);
    return spent / total * 1e6;
}

int main(int argc, char **argv)
{
    int total = argc > 1 ? atoi(argv[1]) : 3000;
    char err[256];
    gpe_model *m = NULL;
    gpe_model_params mp = gpe_model_default_params();
    if (gpe_model_load(GP_SOURCE_DIR "/models/stories260K.gguf", &mp, &m, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    gpe_ctx_params cp = gpe_ctx_default_params();
    cp.n_ctx = 512;
    cp.n_threads = 1;
    gpe_ctx *ctx = NULL;
    if (gpe_ctx_init(m, &cp, &ctx, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    printf("stories260K (vocab %d), decode + sample, 1 thread, %d tokens each:\n",
           gpe_model_n_vocab(m), total);
    /* Constrained runs restart more often (the value closes), so their
     * sequences are shorter: compare the grammar's own time per token. */
    static const char *const names[] = {"no schema", "json_object", "person schema"};
    for (int mode = 0; mode < 3; mode++) {
        double mus;
        double tps = e2e(m, ctx, mode, total, &mus);
        printf("  %-14s %8.0f tok/s, grammar %6.1f us/token (%4.1f%% of the step)\n",
               names[mode], tps, mus, mus * tps / 1e4);
    }
    gpe_ctx_free(ctx);
    gpe_model_free(m);

    static const char *const vocabs[] = {"llama-spm", "gpt-2", "deepseek-llm"};
    printf("mask cost on vocab-only files, random logits (us per token; sampling "
           "top-k 40 defaults):\n");
    for (size_t i = 0; i < sizeof vocabs / sizeof vocabs[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, GP_SOURCE_DIR "/tests/data/vocab/ggml-vocab-%s.gguf",
                 vocabs[i]);
        gpe_model_params vp = gpe_model_default_params();
        vp.vocab_only = true;
        if (gpe_model_load(path, &vp, &m, err, sizeof err)) {
            printf("  %-13s skipped: %s\n", vocabs[i], err);
            continue;
        }
        double t0 = now();
        gpe_grammar_vocab *v = NULL;
        if (gpe_grammar_vocab_init(m, &v))
            return 1;
        double vocab_ms = (now() - t0) * 1e3;
        t0 = now();
        for (int k = 0; k < 100; k++) {
            gpe_grammar *g = NULL;
            if (gpe_grammar_init_vocab(v, SCHEMA, &g, err, sizeof err))
                return 1;
            gpe_grammar_free(g);
        }
        double init_us = (now() - t0) / 100 * 1e6;
        gpe_grammar_vocab_free(v);
        printf("  %-13s vocab %6d: sample only %7.1f, json_object %7.1f, person schema %7.1f, "
               "with patterns %7.1f; vocab tables %.2f ms once per model, grammar per request "
               "%.0f us\n",
               vocabs[i], gpe_model_n_vocab(m), mask_cost(m, "", total / 3),
               mask_cost(m, NULL, total / 3), mask_cost(m, SCHEMA, total / 3),
               mask_cost(m, PATTERN_SCHEMA, total / 3), vocab_ms, init_us);
        gpe_model_free(m);
    }
    return 0;
}
