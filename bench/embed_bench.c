/*
 * embed-bench: embeddings throughput of the engine (gpe_embed_batch), in
 * inputs per second, one input per pass (batch 1) and 32 inputs sharing
 * each pass (batch 32), on the same inputs; beside llama.cpp's
 * llama-embedding on the same file and inputs when LLAMA_EMBEDDING names
 * that binary (the bench runs without it).
 *
 *   [LLAMA_EMBEDDING=/path/llama-embedding] embed-bench
 *       [--model models/stories260K.gguf] [--inputs 64] [--len 32]
 *       [--threads 2] [--reps 3]
 *
 * Inputs are --inputs texts of at most --len tokens: words from a fixed
 * list of sentences, added while the text still tokenizes (with the
 * model's special tokens) to --len tokens or fewer, so that both engines
 * see the same texts and token counts. Batch 1 runs on a one-sequence
 * context; batch 32 on a 32-sequence context, 32 inputs a call. Both
 * compute the same vectors (checked: the run fails when they differ by more
 * than 1e-4). The best of --reps runs of each is printed; nothing is
 * asserted about speed.
 *
 * llama-embedding is timed as whole processes (it loads the model each
 * time): the inputs/s printed are (N - 1) / (t(N inputs) - t(1 input)),
 * the load and start-up cancelling out; best of --reps. Batch 1 is one
 * input per llama_decode (N = --inputs), batch 32 one llama_decode of 32
 * inputs (N = 32); llama_ips says how; --threads threads, flash attention
 * off (as the references were made).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpupool/engine.h"

/* A throughput two ways: inputs per wall-clock second, and per second of
 * CPU time (user + system, all threads): on a shared machine the second
 * is the steadier figure. */
typedef struct rate {
    double wall, cpu;
} rate;

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

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
static rate run(gpe_ctx *c, int32_t **toks, int *nt, int n_in, int batch, int dim, int reps,
                float *out)
{
    char err[256];
    rate best = { 0.0, 0.0 };
    for (int r = 0; r < reps; r++) {
        double t0 = now_s(), c0 = cpu_s();
        for (int i = 0; i < n_in; i += batch) {
            int k = n_in - i < batch ? n_in - i : batch;
            gpe_status st = gpe_embed_batch(c, (const int32_t *const *)toks + i, nt + i, k,
                                            out + (size_t)i * dim, dim, err, sizeof err);
            if (st != GPE_OK) {
                fprintf(stderr, "embed-bench: %s\n", err);
                exit(1);
            }
        }
        double ips = n_in / (now_s() - t0), cps = n_in / (cpu_s() - c0);
        best.wall = ips > best.wall ? ips : best.wall;
        best.cpu = cps > best.cpu ? cps : best.cpu;
    }
    return best;
}

/* Input i: words of a mix of the sentences (each input its own mix, so no
 * two are equal) while the text tokenizes to at most len tokens. Returns
 * the text (malloc'd); its tokens go to toks, their count to *nt. */
static char *make_text(gpe_model *m, int i, int len, int32_t *toks, int *nt)
{
    char *text = calloc(1, 8192), mix[8192] = "";
    for (int k = 0; k < 16; k++)
        strncat(mix, SENT[(i + k * (i % 3 + 1)) % 5], sizeof mix - strlen(mix) - 1);
    *nt = 0;
    for (char *w = mix; *w;) {
        char *e = strchr(w, ' ');
        size_t wl = e ? (size_t)(e - w) + 1 : strlen(w), tl = strlen(text);
        if (tl + wl + 1 > 8192)
            break;
        memcpy(text + tl, w, wl);
        text[tl + wl] = '\0';
        int n = gpe_tokenize(m, text, strlen(text), true, false, toks, len + 8);
        if (n < 0 || n > len) {
            text[tl] = '\0';
            break;
        }
        *nt = n;
        w += wl;
    }
    /* no trailing space: llama-embedding reads the text as given */
    size_t tl = strlen(text);
    if (tl > 0 && text[tl - 1] == ' ')
        text[tl - 1] = '\0';
    gpe_tokenize(m, text, strlen(text), true, false, toks, len + 8);
    return text;
}

/* Seconds (wall, and the child's CPU in *cpu) of one llama-embedding
 * process embedding texts[0..n); -1 when it failed. */
static double llama_run(double *cpu, const char *exe, const char *model, char **texts, int n,
                        int par, int ctx, int threads)
{
    static const char sep[] = "<#sep#>";
    size_t cap = 64;
    for (int i = 0; i < n; i++)
        cap += strlen(texts[i]) + sizeof sep;
    char *prompt = calloc(1, cap), bs[32], ps[32], ts[32];
    for (int i = 0; i < n; i++) {
        if (i)
            strcat(prompt, sep);
        strcat(prompt, texts[i]);
    }
    snprintf(bs, sizeof bs, "%d", ctx);
    snprintf(ps, sizeof ps, "%d", par);
    snprintf(ts, sizeof ts, "%d", threads);
    /* The parent's buffered output must not be written twice (freopen in
     * the child flushes it). */
    fflush(stdout);
    fflush(stderr);
    double t0 = now_s();
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr))
            _exit(127);
        execl(exe, exe, "-m", model, "-t", ts, "-fa", "off", "--parallel", ps, "-c", bs, "-b",
              bs, "--embd-separator", sep, "-p", prompt, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    struct rusage ru;
    if (pid < 0 || wait4(pid, &status, 0, &ru) < 0 || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        fprintf(stderr, "embed-bench: %s failed (status %d)\n", exe, status);
        free(prompt);
        return -1.0;
    }
    free(prompt);
    *cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
    return now_s() - t0;
}

/* llama-embedding's inputs/s at `batch` inputs per llama_decode (see
 * top). It packs inputs into a decode while their tokens fit n_batch (which
 * it raises to n_ctx), up to 256 sequences, and aborts when a decode holds
 * more sequences than --parallel. Batch 1: --parallel 2, n_ctx = len + 8
 * (two inputs of more than (len + 8) / 2 tokens never share a decode).
 * Batch 32: one process embeds inputs 0..31 with n_ctx their token count,
 * one decode of exactly 32. */
static rate llama_ips(const char *exe, const char *model, char **texts, const int *nt, int n,
                      int batch, int len, int threads, int reps)
{
    rate best = { 0.0, 0.0 };
    int par = 2, ctx = len + 8;
    if (batch > 1) {
        n = n < batch ? n : batch;
        par = batch;
        ctx = 0;
        for (int i = 0; i < n; i++)
            ctx += nt[i];
    }
    for (int r = 0; r < reps; r++) {
        double c1, cn;
        double one = llama_run(&c1, exe, model, texts, 1, par, ctx, threads);
        double all = llama_run(&cn, exe, model, texts, n, par, ctx, threads);
        if (one < 0 || all < 0)
            return (rate){ -1.0, -1.0 };
        if (all > one && (n - 1) / (all - one) > best.wall)
            best.wall = (n - 1) / (all - one);
        if (cn > c1 && (n - 1) / (cn - c1) > best.cpu)
            best.cpu = (n - 1) / (cn - c1);
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
    char **texts = calloc((size_t)n_in, sizeof *texts);
    for (int i = 0; i < n_in; i++) {
        toks[i] = malloc((size_t)(len + 8) * sizeof **toks);
        texts[i] = make_text(m, i, len, toks[i], &nt[i]);
    }
    float *a = malloc((size_t)n_in * dim * sizeof *a), *b = malloc((size_t)n_in * dim * sizeof *b);
    gpe_ctx *c1 = make_ctx(m, len, 1, threads), *c32 = make_ctx(m, len, 32, threads);
    rate one = run(c1, toks, nt, n_in, 1, dim, reps, a);
    rate many = run(c32, toks, nt, n_in, 32, dim, reps, b);
    double worst = 0.0;
    for (size_t i = 0; i < (size_t)n_in * dim; i++)
        worst = fmax(worst, fabs((double)a[i] - b[i]));
    gpe_model_info info;
    gpe_model_get_info(m, &info);
    printf("embed-bench: %s (%s, %s, dim %d), %d inputs of %d tokens, %d threads, %s\n",
           info.name, info.arch, info.quant, dim, n_in, len, threads, gpe_cpu_features());
    printf("  gpupool engine      inputs/s (wall)   inputs per CPU-second\n");
    printf("  batch  1: %10.1f %22.1f\n", one.wall, one.cpu);
    printf("  batch 32: %10.1f %22.1f  (x%.2f wall)\n", many.wall, many.cpu,
           many.wall / one.wall);
    printf("  max |batch 32 - batch 1| = %.3g\n", worst);
    const char *llama = getenv("LLAMA_EMBEDDING");
    if (llama && *llama) {
        rate l1 = llama_ips(llama, path, texts, nt, n_in, 1, len, threads, reps);
        rate l32 = llama_ips(llama, path, texts, nt, n_in, 32, len, threads, reps);
        printf("  llama-embedding (%s), same file and texts:\n", llama);
        printf("  batch  1: %10.1f %22.1f\n", l1.wall, l1.cpu);
        printf("  batch 32: %10.1f %22.1f\n", l32.wall, l32.cpu);
    } else {
        printf("  (set LLAMA_EMBEDDING to a llama-embedding binary for llama.cpp's figures)\n");
    }
    gpe_ctx_free(c1);
    gpe_ctx_free(c32);
    for (int i = 0; i < n_in; i++) {
        free(toks[i]);
        free(texts[i]);
    }
    free(texts);
    free(toks);
    free(nt);
    free(a);
    free(b);
    gpe_model_free(m);
    return worst > 1e-4 ? 1 : 0;
}
