/*
 * gpupool-run bench: prompt-processing and generation speed, like
 * llama-bench's pp512 / tg128.
 *
 *   ppP: one gpe_decode of P tokens of one sequence (logits for the last
 *        one only), from an empty cache.
 *   tgN: N decode steps of one token each, from an empty cache, logits at
 *        every step. With --seqs S, each step decodes S sequences together
 *        (one batch: the weights are read once per step for all S) and the
 *        figure is the total tokens/s of the S sequences.
 * With --depth D (llama-bench's -d), the sequences first hold D tokens
 * (decoded untimed, once) and every test starts at position D: ppP @ dD is
 * a P-token prompt after D tokens of context, tgN @ dD a decode with D
 * tokens of context (what long conversations and agent prompts cost).
 * Each test runs once untimed (warm-up: page cache, thread wake-up, lazily
 * loaded GPU kernels; the prompt test at full size, the generation test
 * short), then
 * -r times; the mean and standard deviation of tokens/s are printed.
 * Token ids are a fixed pseudo-random sequence (speed does not depend on
 * them). Figures are printed only; nothing is asserted.
 */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "run/run.h"

static const char *NAME = "bench";

static void usage(FILE *out)
{
    fprintf(out,
            "usage: gpupool-run bench -m FILE [-p 512] [-n 128] [-t N[,N...]] [-r 3] [--seqs S] "
            "[-d D] [--json]\n\n"
            "  -m, --model FILE     GGUF model file (required)\n"
            "  -p, --n-prompt P     prompt tokens for the ppP test, 0 = skip (default 512)\n"
            "  -n, --n-gen N        tokens for the tgN test, 0 = skip (default 128)\n"
            "  -t, --threads LIST   thread counts, comma separated (default: online CPUs)\n"
            "  -r, --reps R         timed repetitions per test (default 3)\n"
            "      --seqs S         sequences decoded together in tgN (default 1)\n"
            "  -d, --depth D        tokens of context before each test (default 0)\n"
            "      --json           one JSON object per result line instead of the table\n"
            "      --backend B      cpu (default) or cuda; --device N: CUDA device index\n"
            "      --devices LIST   CUDA devices, e.g. 0,1: the layers split over them in order\n"
            "      --kv-f16         F16 KV cache (llama.cpp's default) instead of F32\n"
            "  -h, --help           this help\n");
}

typedef struct bench_opts {
    const char *model;
    long n_prompt, n_gen, reps, seqs, depth;
    int threads[16];
    int n_threads;
    bool json;
    const char *backend;
    long device;
    bool kv_f16;
    const char *devices;
} bench_opts;

static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* Sequences 0..seqs-1 hold depth tokens each (decoded n_batch at a time). */
static int fill_depth(gpe_ctx *c, gpe_batch *b, int n_batch, int depth, int seqs, int n_vocab)
{
    char err[256];
    uint32_t s = 4242;
    for (int q = 0; q < seqs; q++) {
        gpe_seq_clear(c, q);
        for (int i0 = 0; i0 < depth; i0 += n_batch) {
            const int n = depth - i0 < n_batch ? depth - i0 : n_batch;
            gpe_batch_clear(b);
            for (int i = 0; i < n; i++)
                gpe_batch_add(b, (int32_t)(lcg(&s) % (uint32_t)n_vocab), i0 + i, q, i == n - 1);
            if (gpe_decode(c, b, err, sizeof err) != GPE_OK) {
                fprintf(stderr, "gpupool-run %s: decode (depth): %s\n", NAME, err);
                return -1;
            }
        }
    }
    return 0;
}

/* One timed run of a test after depth tokens of context; returns seconds,
 * or a negative value on error. */
static double run_pp(gpe_ctx *c, gpe_batch *b, int depth, int n_prompt, int n_vocab)
{
    char err[256];
    uint32_t s = 12345;
    gpe_seq_truncate(c, 0, depth);
    gpe_batch_clear(b);
    for (int i = 0; i < n_prompt; i++)
        gpe_batch_add(b, (int32_t)(lcg(&s) % (uint32_t)n_vocab), depth + i, 0,
                      i == n_prompt - 1);
    double t0 = gpr_now();
    if (gpe_decode(c, b, err, sizeof err) != GPE_OK) {
        fprintf(stderr, "gpupool-run %s: decode: %s\n", NAME, err);
        return -1;
    }
    return gpr_now() - t0;
}

static double run_tg(gpe_ctx *c, gpe_batch *b, int depth, int n_gen, int seqs, int n_vocab)
{
    char err[256];
    uint32_t s = 777;
    for (int q = 0; q < seqs; q++)
        gpe_seq_truncate(c, q, depth);
    double t0 = gpr_now();
    for (int i = 0; i < n_gen; i++) {
        gpe_batch_clear(b);
        for (int q = 0; q < seqs; q++)
            gpe_batch_add(b, (int32_t)(lcg(&s) % (uint32_t)n_vocab), depth + i, q, true);
        if (gpe_decode(c, b, err, sizeof err) != GPE_OK) {
            fprintf(stderr, "gpupool-run %s: decode: %s\n", NAME, err);
            return -1;
        }
    }
    return gpr_now() - t0;
}

static void report(const bench_opts *o, const gpe_model_info *in, int threads, const char *test,
                   const double *tps, int n)
{
    double mean = 0, sd = 0;
    for (int i = 0; i < n; i++)
        mean += tps[i];
    mean /= n;
    for (int i = 0; i < n; i++)
        sd += (tps[i] - mean) * (tps[i] - mean);
    sd = n > 1 ? sqrt(sd / (n - 1)) : 0;
    const char *be = o->backend && strcmp(o->backend, "cuda") == 0 ? "cuda" : gpe_cpu_features();
    if (o->json) {
        json_t *samples = json_array();
        for (int i = 0; i < n; i++)
            json_array_append_new(samples, json_real(tps[i]));
        json_t *j = json_pack("{s:s, s:s, s:I, s:I, s:i, s:s, s:s, s:f, s:f, s:o}", "model",
                              in->name, "quant", in->quant, "bytes", (json_int_t)in->weight_bytes,
                              "params", (json_int_t)in->n_params, "threads", threads, "test",
                              test, "cpu", be, "tokens_per_s", mean, "stddev", sd,
                              "samples", samples);
        char *s = json_dumps(j, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        char b1[32];
        printf("| %-24s | %-6s | %10s | %8.2f M | %-10s | %7d | %10s | %10.2f ± %7.2f |\n",
               in->name, in->quant, gpr_bytes(in->weight_bytes, b1, sizeof b1), in->n_params / 1e6,
               be, threads, test, mean, sd);
    }
    fflush(stdout);
}

static int bench_threads(const bench_opts *o, gpe_model *m, const gpe_model_info *in, int threads)
{
    int rc = 1;
    char err[256];
    gpe_ctx *c = NULL;
    gpe_batch *b = NULL;
    double *tps = calloc((size_t)o->reps, sizeof *tps);
    gpe_ctx_params cp = gpe_ctx_default_params();
    long need = (o->n_prompt > o->n_gen ? o->n_prompt : o->n_gen) + o->depth;
    cp.n_ctx = (int)(need > 0 ? need : 1);
    cp.n_seq = (int)o->seqs;
    cp.n_threads = threads;
    cp.kv_f16 = o->kv_f16;
    long nb = o->n_prompt > o->seqs ? o->n_prompt : o->seqs;
    if (nb < o->depth && nb < 512)   /* the depth is decoded in batches of this size */
        nb = o->depth < 512 ? o->depth : 512;
    cp.n_batch = (int)(nb > 0 ? nb : 1);
    const int depth = (int)o->depth;
    if (!tps)
        goto done;
    if (gpe_ctx_init(m, &cp, &c, err, sizeof err) != GPE_OK) {
        fprintf(stderr, "gpupool-run %s: %s\n", NAME, err);
        goto done;
    }
    b = gpe_batch_init(cp.n_batch);
    if (!b)
        goto done;
    int n_vocab = gpe_model_n_vocab(m);
    char test[64], at[32] = "";
    if (depth > 0)
        snprintf(at, sizeof at, " @ d%d", depth);
    if (o->n_prompt > 0) {
        if (fill_depth(c, b, cp.n_batch, depth, 1, n_vocab) < 0)
            goto done;
        /* warm-up of the same size: every kernel of this shape loaded
         * (lazy module loading) and every library heuristic chosen, as
         * llama-bench does; a short prompt took another path */
        if (run_pp(c, b, depth, (int)o->n_prompt, n_vocab) < 0)
            goto done;
        for (int r = 0; r < o->reps; r++) {
            double t = run_pp(c, b, depth, (int)o->n_prompt, n_vocab);
            if (t < 0)
                goto done;
            tps[r] = o->n_prompt / t;
        }
        snprintf(test, sizeof test, "pp%ld%s", o->n_prompt, at);
        report(o, in, threads, test, tps, (int)o->reps);
    }
    if (o->n_gen > 0) {
        if (fill_depth(c, b, cp.n_batch, depth, (int)o->seqs, n_vocab) < 0 ||
            run_tg(c, b, depth, (int)(o->n_gen < 16 ? o->n_gen : 16), (int)o->seqs, n_vocab) < 0)
            goto done;
        for (int r = 0; r < o->reps; r++) {
            double t = run_tg(c, b, depth, (int)o->n_gen, (int)o->seqs, n_vocab);
            if (t < 0)
                goto done;
            tps[r] = (double)o->n_gen * (double)o->seqs / t;
        }
        if (o->seqs > 1)
            snprintf(test, sizeof test, "tg%ld x%ld%s", o->n_gen, o->seqs, at);
        else
            snprintf(test, sizeof test, "tg%ld%s", o->n_gen, at);
        report(o, in, threads, test, tps, (int)o->reps);
    }
    rc = 0;
done:
    free(tps);
    gpe_batch_free(b);
    gpe_ctx_free(c);
    return rc;
}

static int exec_bench(int argc, char **argv)
{
    enum { O_SEQS = 256, O_JSON, O_BACKEND, O_DEVICE, O_KV16, O_DEVICES };
    static const struct option lo[] = {
        { "model", required_argument, 0, 'm' }, { "n-prompt", required_argument, 0, 'p' },
        { "n-gen", required_argument, 0, 'n' }, { "threads", required_argument, 0, 't' },
        { "reps", required_argument, 0, 'r' },  { "seqs", required_argument, 0, O_SEQS },
        { "json", no_argument, 0, O_JSON },     { "help", no_argument, 0, 'h' },
        { "backend", required_argument, 0, O_BACKEND }, { "device", required_argument, 0, O_DEVICE },
        { "kv-f16", no_argument, 0, O_KV16 },
        { "devices", required_argument, 0, O_DEVICES },
        { "depth", required_argument, 0, 'd' },
        { 0, 0, 0, 0 },
    };
    bench_opts o;
    memset(&o, 0, sizeof o);
    o.n_prompt = 512;
    o.n_gen = 128;
    o.reps = 3;
    o.seqs = 1;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:p:n:t:r:d:h", lo, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 'm': o.model = optarg; break;
        case 'p': ok = gpr_parse_int(NAME, "-p", optarg, 0, 65536, &o.n_prompt); break;
        case 'n': ok = gpr_parse_int(NAME, "-n", optarg, 0, 65536, &o.n_gen); break;
        case 'r': ok = gpr_parse_int(NAME, "-r", optarg, 1, 1000, &o.reps); break;
        case 'd': ok = gpr_parse_int(NAME, "-d", optarg, 0, 1 << 20, &o.depth); break;
        case O_SEQS: ok = gpr_parse_int(NAME, "--seqs", optarg, 1, 256, &o.seqs); break;
        case O_JSON: o.json = true; break;
        case O_KV16: o.kv_f16 = true; break;
        case O_BACKEND: o.backend = optarg; ok = gpr_check_backend(NAME, optarg); break;
        case O_DEVICE: ok = gpr_parse_int(NAME, "--device", optarg, 0, 1024, &o.device); break;
        case O_DEVICES: {
            int d[GPE_MAX_DEVICES], nd;
            o.devices = optarg;
            ok = gpr_parse_devices(NAME, optarg, d, &nd);
            break;
        }
        case 't': {
            char *dup = strdup(optarg), *save = NULL;
            o.n_threads = 0;
            for (char *tok = strtok_r(dup, ",", &save); tok && ok;
                 tok = strtok_r(NULL, ",", &save)) {
                long v;
                if (o.n_threads >= 16) {
                    fprintf(stderr, "gpupool-run %s: --threads: at most 16 values\n", NAME);
                    ok = false;
                } else if ((ok = gpr_parse_int(NAME, "--threads", tok, 1, 512, &v))) {
                    o.threads[o.n_threads++] = (int)v;
                }
            }
            if (ok && o.n_threads == 0) {
                fprintf(stderr, "gpupool-run %s: --threads: empty list\n", NAME);
                ok = false;
            }
            free(dup);
            break;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok)
            return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "gpupool-run %s: unexpected argument '%s'\n", NAME, argv[optind]);
        return 2;
    }
    if (!o.model) {
        fprintf(stderr, "gpupool-run %s: -m FILE is required\n\n", NAME);
        usage(stderr);
        return 2;
    }
    if (o.n_threads == 0)
        o.threads[o.n_threads++] = 0;

    gpe_model *m = gpr_load_model_on(NAME, o.model, o.backend, (int)o.device, o.devices);
    if (!m)
        return 1;
    gpe_model_info in;
    gpe_model_get_info(m, &in);
    if (o.depth + (o.n_prompt > o.n_gen ? o.n_prompt : o.n_gen) > in.n_ctx_train)
        fprintf(stderr, "gpupool-run %s: note: test longer than the training context (%d)\n",
                NAME, in.n_ctx_train);
    if (!o.json) {
        printf("| %-24s | %-6s | %10s | %10s | %-10s | %7s | %10s | %20s |\n", "model", "type",
               "size", "params", "backend", "threads", "test", "t/s");
        printf("| %.24s | %.6s | %.10s | %.10s | %.10s | %.7s | %.10s | %.20s |\n",
               "------------------------", "------", "----------", "----------", "----------",
               "-------", "----------", "--------------------");
    }
    int rc = 0;
    for (int i = 0; i < o.n_threads && rc == 0; i++)
        rc = bench_threads(&o, m, &in, o.threads[i]);
    gpe_model_free(m);
    return rc;
}

const gpr_cmd gpr_cmd_bench = {
    "bench", "measure prompt (ppP) and generation (tgN) tokens/s, like llama-bench",
    exec_bench, usage,
};
