/*
 * embed-bench: embeddings throughput of the engine (gpe_embed_batch), in
 * inputs per second, one input per pass (batch 1) and 32 inputs sharing
 * each pass (batch 32), on the same inputs.
 *
 *   embed-bench [--model models/stories260K.gguf] [--inputs 64] [--len 32]
 *               [--threads 2] [--reps 3]
 *
 * Inputs are --inputs texts of about --len tokens (sentences from a fixed
 * list, tokenized with the model's tokenizer and cut to --len). Batch 1
 * runs on a one-sequence context; batch 32 on a 32-sequence context, 32
 * inputs a call. Both compute the same vectors (checked: the run fails when
 * they differ by more than 1e-4). The best of --reps runs of each is
 * printed; nothing is asserted about speed. llama.cpp's llama-embedding on
 * the same file is the reference the issue names (bench/README or the
 * report gives its figures when it was run).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpupool/engine.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *const SENT[] = {
    "Once upon a time there was a little girl who lived in a village near the forest. ",
    "The cat sat on the mat and looked at the bird in the tree for a long time. ",
    "Tom and Lily went to the park to play with their new red ball and a big kite. ",
    "The sun was shining and the children were happy because it was a warm day. ",
    "A small dog ran after the ball and jumped into the pond with a loud splash. ",
};

static gpe_ctx *make_ctx(gpe_model *m, int n_ctx, int n_seq, int threads)
{
    char err[256];
    gpe_ctx_params cp = gpe_ctx_default_params();
    cp.n_ctx = n_ctx;
    cp.n_seq = n_seq;
    cp.n_threads = threads;
    gpe_ctx *c = NULL;
    if (gpe_ctx_init(m, &cp, &c, err, sizeof err) != GPE_OK) {
        fprintf(stderr, "embed-bench: context: %s\n", err);
        exit(1);
    }
    return c;
}

/* Best-of-reps inputs/s embedding all inputs, `batch` inputs per call. */
static double run(gpe_ctx *c, int32_t **toks, int *nt, int n_in, int batch, int dim, int reps,
                  float *out)
{
    char err[256];
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        for (int i = 0; i < n_in; i += batch) {
            int k = n_in - i < batch ? n_in - i : batch;
            gpe_status st = gpe_embed_batch(c, (const int32_t *const *)toks + i, nt + i, k,
                                            out + (size_t)i * dim, dim, err, sizeof err);
            if (st != GPE_OK) {
                fprintf(stderr, "embed-bench: %s\n", err);
                exit(1);
            }
        }
        double ips = n_in / (now_s() - t0);
        if (ips > best)
            best = ips;
    }
    return best;
}

int main(int argc, char **argv)
{
    const char *path = "models/stories260K.gguf";
    int n_in = 64, len = 32, threads = 2, reps = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            path = argv[i + 1];
        else if (!strcmp(argv[i], "--inputs"))
            n_in = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--len"))
            len = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: embed-bench [--model F] [--inputs N] [--len N] "
                    "[--threads N] [--reps N]\n");
            return 2;
        }
    }
    if (n_in < 1 || len < 1 || threads < 1 || reps < 1)
        return 2;
    char err[256];
    gpe_model *m = NULL;
    gpe_model_params mp = gpe_model_default_params();
    if (gpe_model_load(path, &mp, &m, err, sizeof err) != GPE_OK) {
        fprintf(stderr, "embed-bench: %s\n", err);
        return 1;
    }
    const int dim = gpe_model_embedding_dim(m);
    int32_t **toks = calloc((size_t)n_in, sizeof *toks);
    int *nt = calloc((size_t)n_in, sizeof *nt);
    char text[4096];
    for (int i = 0; i < n_in; i++) {
        text[0] = '\0';
        /* Each input its own mix of sentences (so no two are equal). */
        for (int k = 0; strlen(text) < (size_t)len * 8 && k < 16; k++)
            strncat(text, SENT[(i + k * (i % 3 + 1)) % 5], sizeof text - strlen(text) - 1);
        toks[i] = malloc((size_t)(len + 8) * sizeof **toks);
        int n = gpe_tokenize(m, text, strlen(text), true, false, toks[i], len + 8);
        nt[i] = n < 0 || n > len ? len : n;
    }
    float *a = malloc((size_t)n_in * dim * sizeof *a), *b = malloc((size_t)n_in * dim * sizeof *b);
    gpe_ctx *c1 = make_ctx(m, len, 1, threads), *c32 = make_ctx(m, len, 32, threads);
    double one = run(c1, toks, nt, n_in, 1, dim, reps, a);
    double many = run(c32, toks, nt, n_in, 32, dim, reps, b);
    double worst = 0.0;
    for (size_t i = 0; i < (size_t)n_in * dim; i++)
        worst = fmax(worst, fabs((double)a[i] - b[i]));
    gpe_model_info info;
    gpe_model_get_info(m, &info);
    printf("embed-bench: %s (%s, %s, dim %d), %d inputs of %d tokens, %d threads, %s\n",
           info.name, info.arch, info.quant, dim, n_in, len, threads, gpe_cpu_features());
    printf("  batch  1: %10.1f inputs/s\n", one);
    printf("  batch 32: %10.1f inputs/s  (x%.2f)\n", many, many / one);
    printf("  max |batch 32 - batch 1| = %.3g\n", worst);
    gpe_ctx_free(c1);
    gpe_ctx_free(c32);
    for (int i = 0; i < n_in; i++)
        free(toks[i]);
    free(toks);
    free(nt);
    free(a);
    free(b);
    gpe_model_free(m);
    return worst > 1e-4 ? 1 : 0;
}
