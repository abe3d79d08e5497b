/*
 * gpupool-run generate: stream a continuation of a prompt.
 *
 * Plain mode writes the text to stdout as it is generated and a timing line
 * to stderr. --json writes one JSON object per line per token,
 * {"id": N, "text": "..."}, then one summary object with the counts and
 * timings. A token's text may end inside a UTF-8 character (byte-fallback
 * tokens); such bytes are held back and sent with the next token, so every
 * "text" is valid UTF-8.
 */
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/gp_json.h"
#include "run/run.h"

static const char *NAME = "generate";

static void usage(FILE *out)
{
    fprintf(out,
            "usage: gpupool-run generate -m FILE -p TEXT [options]\n\n"
            "  -m, --model FILE     GGUF model file (required)\n"
            "  -p, --prompt TEXT    prompt (required); BOS is added as the model asks\n"
            "  -n, --n-predict N    tokens to generate (default 128)\n"
            "      --temp T         temperature, 0 = greedy (default 0.8)\n"
            "      --top-k K        top-k, 0 = off (default 40)\n"
            "      --top-p P        top-p, 1 = off (default 0.95)\n"
            "      --min-p P        min-p, 0 = off (default 0.05)\n"
            "      --repeat-penalty R  1 = off (default 1)\n"
            "      --seed S         sampler seed (default: from the clock; printed)\n"
            "  -t, --threads N      threads (default: online CPUs)\n"
            "      --kv-f16         F16 KV cache (half the memory, llama.cpp's default)\n"
            "      --backend B      cpu (default) or cuda\n"
            "      --device N       CUDA device index (default 0)\n"
            "      --devices LIST   CUDA devices, e.g. 0,1: the layers split over them in order\n"
            "                       (by free memory; an index may repeat)\n"
            "  -c, --ctx N          context length (default: prompt + n, at most the model's)\n"
            "      --no-eog         do not stop at end-of-generation tokens\n"
            "      --json           one JSON object per token, then a summary object\n"
            "  -h, --help           this help\n");
}

typedef struct gen_opts {
    const char *model;
    const char *prompt;
    long n_predict;
    double temp, top_p, min_p, repeat_penalty;
    long top_k;
    uint64_t seed;
    bool seed_set;
    long threads;
    long n_ctx;
    bool json;
    bool no_eog;
    const char *backend;
    long device;
    bool kv_f16;
    const char *devices;
} gen_opts;

static int parse(int argc, char **argv, gen_opts *o)
{
    enum { O_TEMP = 256, O_TOPK, O_TOPP, O_MINP, O_REP, O_SEED, O_JSON, O_NOEOG, O_BACKEND,
           O_DEVICE, O_KV16, O_DEVICES };
    static const struct option lo[] = {
        { "model", required_argument, 0, 'm' },   { "prompt", required_argument, 0, 'p' },
        { "n-predict", required_argument, 0, 'n' }, { "temp", required_argument, 0, O_TEMP },
        { "top-k", required_argument, 0, O_TOPK }, { "top-p", required_argument, 0, O_TOPP },
        { "min-p", required_argument, 0, O_MINP }, { "repeat-penalty", required_argument, 0, O_REP },
        { "seed", required_argument, 0, O_SEED }, { "threads", required_argument, 0, 't' },
        { "ctx", required_argument, 0, 'c' },     { "json", no_argument, 0, O_JSON },
        { "no-eog", no_argument, 0, O_NOEOG },    { "help", no_argument, 0, 'h' },
        { "backend", required_argument, 0, O_BACKEND }, { "device", required_argument, 0, O_DEVICE },
        { "kv-f16", no_argument, 0, O_KV16 },
        { "devices", required_argument, 0, O_DEVICES },
        { 0, 0, 0, 0 },
    };
    /* defaults, in one place */
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->temp = 0.8;
    o->top_k = 40;
    o->top_p = 0.95;
    o->min_p = 0.05;
    o->repeat_penalty = 1.0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:p:n:t:c:h", lo, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'n': ok = gpr_parse_int(NAME, "-n", optarg, 0, 1 << 22, &o->n_predict); break;
        case O_TEMP: ok = gpr_parse_float(NAME, "--temp", optarg, 0, 100, &o->temp); break;
        case O_TOPK: ok = gpr_parse_int(NAME, "--top-k", optarg, 0, 1 << 22, &o->top_k); break;
        case O_TOPP: ok = gpr_parse_float(NAME, "--top-p", optarg, 0, 1, &o->top_p); break;
        case O_MINP: ok = gpr_parse_float(NAME, "--min-p", optarg, 0, 1, &o->min_p); break;
        case O_REP:
            ok = gpr_parse_float(NAME, "--repeat-penalty", optarg, 0, 100, &o->repeat_penalty);
            break;
        case O_SEED:
            ok = gpr_parse_u64(NAME, "--seed", optarg, &o->seed);
            o->seed_set = true;
            break;
        case 't': ok = gpr_parse_int(NAME, "--threads", optarg, 1, 512, &o->threads); break;
        case 'c': ok = gpr_parse_int(NAME, "--ctx", optarg, 1, 1 << 22, &o->n_ctx); break;
        case O_JSON: o->json = true; break;
        case O_NOEOG: o->no_eog = true; break;
        case O_KV16: o->kv_f16 = true; break;
        case O_BACKEND: o->backend = optarg; ok = gpr_check_backend(NAME, optarg); break;
        case O_DEVICE: ok = gpr_parse_int(NAME, "--device", optarg, 0, 1024, &o->device); break;
        case O_DEVICES: {
            int d[GPE_MAX_DEVICES], nd;
            o->devices = optarg;
            ok = gpr_parse_devices(NAME, optarg, d, &nd);
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
    if (!o->model || !o->prompt) {
        fprintf(stderr, "gpupool-run %s: -m FILE and -p TEXT are required\n\n", NAME);
        usage(stderr);
        return 2;
    }
    return -1;
}

/* What the token loop writes with: a token's text and, for --json, what
 * is pending (a cut UTF-8 character's bytes held back, then the next
 * token's). Both grow as a long token needs: a vocabulary's token may be
 * any length, and fixed buffers lost the text of one longer than them. */
typedef struct gen_out {
    char *piece;
    size_t piece_cap;
    char *pend;
    size_t npend, pend_cap;
} gen_out;

static void gen_out_free(gen_out *g)
{
    free(g->piece);
    free(g->pend);
}

/* The JSON line of one token's text, s[0..n) (a new string), or NULL when
 * memory ran out. Text that is not UTF-8 but no cut sequence either (a
 * vocabulary's odd bytes) goes as U+FFFD; a pack that failed for memory
 * (jansson's count moved) is not taken for such text. */
static char *token_line(int32_t id, const char *s, size_t n)
{
    unsigned long f0 = gp_json_alloc_failures();
    json_t *j = json_pack("{s:i, s:s%}", "id", (json_int_t)id, "text", s, n);
    if (!j && gp_json_alloc_failures() == f0)
        j = json_pack("{s:i, s:s}", "id", (json_int_t)id, "text", "\xEF\xBF\xBD");
    char *line = j && gp_json_alloc_failures() == f0
                     ? gp_json_dumps_checked(j, JSON_COMPACT | JSON_ENSURE_ASCII)
                     : NULL;
    json_decref(j);
    return line;
}

/* Emits one token, its text in g->piece[0..len): plain text, or a JSON
 * line with the UTF-8-complete part of what is pending. false when memory
 * ran out (said on stderr): the output stops short, never goes on without
 * the token's text. */
static bool emit(const gen_opts *o, gen_out *g, int32_t id, size_t len)
{
    if (!o->json) {
        fwrite(g->piece, 1, len, stdout);
        fflush(stdout);
        return true;
    }
    if (g->npend + len > g->pend_cap) {
        size_t cap = g->npend + len < 64 ? 64 : g->npend + len;
        char *p = realloc(g->pend, cap);
        if (!p)
            goto nomem;
        g->pend = p;
        g->pend_cap = cap;
    }
    if (len)
        memcpy(g->pend + g->npend, g->piece, len);
    g->npend += len;
    size_t ok = gpr_utf8_complete(g->pend, g->npend);
    char *line = token_line(id, g->pend, ok);
    if (!line)
        goto nomem;
    printf("%s\n", line);
    fflush(stdout);
    free(line);
    memmove(g->pend, g->pend + ok, g->npend - ok);
    g->npend -= ok;
    return true;
nomem:
    fprintf(stderr, "\ngpupool-run %s: token %d: out of memory\n", NAME, (int)id);
    return false;
}

/* The prompt's tokens (*ids: malloc'd, the caller frees it), or -1
 * (said on stderr). */
static int tokenize_prompt(gpe_model *m, const char *prompt, int32_t **ids_out)
{
    const size_t plen = strlen(prompt);
    int cap = (int)(plen + 16);
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    *ids_out = ids;
    int n = ids ? gpe_tokenize(m, prompt, plen, true, false, ids, cap) : INT32_MIN;
    if (n < 0 && n != INT32_MIN) { /* -(needed) */
        cap = -n;
        int32_t *bigger = realloc(ids, (size_t)cap * sizeof *ids);
        n = INT32_MIN;
        if (bigger) {
            *ids_out = ids = bigger;
            n = gpe_tokenize(m, prompt, plen, true, false, ids, cap);
        }
    }
    if (n < 0) {
        /* INT32_MIN: out of memory (the ids' room or the tokenizer's) */
        fprintf(stderr, "gpupool-run %s: cannot tokenize the prompt%s\n", NAME,
                n == INT32_MIN ? ": out of memory" : "");
        return -1;
    }
    if (n == 0) {
        fprintf(stderr, "gpupool-run %s: the prompt is empty and the model adds no BOS\n", NAME);
        return -1;
    }
    return n;
}

/* A JSON value as one line on stdout; false when memory ran out (said on
 * stderr): never a line that lost a key, never "(null)". */
static bool put_json_line(json_t *j, size_t flags)
{
    char *s = j ? gp_json_dumps_checked(j, flags) : NULL;
    json_decref(j);
    if (!s) {
        fprintf(stderr, "gpupool-run %s: the summary: out of memory\n", NAME);
        return false;
    }
    printf("%s\n", s);
    free(s);
    return true;
}

/* The run's figures: a JSON line (--json) or a line on stderr. false when
 * memory ran out (said on stderr). */
static bool print_summary(const gen_opts *o, const gpe_model_info *info, int n, long n_gen,
                          const char *stop, uint64_t seed, double t_prompt, double t_gen,
                          size_t npend)
{
    if (o->json) {
        if (npend > 0 && /* trailing bytes of a cut character */
            !put_json_line(json_pack("{s:s}", "text", "\xEF\xBF\xBD"),
                           JSON_COMPACT | JSON_ENSURE_ASCII))
            return false;
        return put_json_line(
            json_pack("{s:b, s:s, s:i, s:i, s:s, s:I, s:f, s:f, s:f, s:f, s:i, s:s}", "summary", 1,
                      "model", info->name, "n_prompt", n, "n_generated", (json_int_t)n_gen,
                      "stop", stop, "seed", (json_int_t)seed, "prompt_ms", t_prompt * 1e3,
                      "gen_ms", t_gen * 1e3, "prompt_tokens_per_s",
                      t_prompt > 0 ? n / t_prompt : 0.0, "gen_tokens_per_s",
                      t_gen > 0 && n_gen > 0 ? n_gen / t_gen : 0.0, "threads", (int)o->threads,
                      "cpu", gpe_cpu_features()),
            JSON_COMPACT);
    }
    printf("\n");
    fprintf(stderr,
            "[prompt %d tokens in %.1f ms (%.1f t/s); generated %ld tokens in %.1f ms "
            "(%.1f t/s); stop: %s; seed %llu]\n",
            n, t_prompt * 1e3, t_prompt > 0 ? n / t_prompt : 0.0, n_gen, t_gen * 1e3,
            t_gen > 0 && n_gen > 0 ? n_gen / t_gen : 0.0, stop, (unsigned long long)seed);
    return true;
}

static int exec_generate(int argc, char **argv)
{
    gen_opts o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    rc = 1;

    gpe_model *m = NULL;
    gpe_ctx *ctx = NULL;
    gpe_batch *b = NULL;
    gpe_sampler *smp = NULL;
    int32_t *ids = NULL;
    gen_out g = {0};
    char err[512];

    if (!(m = gpr_load_model_on(NAME, o.model, o.backend, (int)o.device, o.devices)))
        goto done;
    gpe_model_info info;
    gpe_model_get_info(m, &info);
    int n = tokenize_prompt(m, o.prompt, &ids);
    if (n < 0)
        goto done;
    long n_ctx = o.n_ctx ? o.n_ctx : (long)n + o.n_predict;
    if (!o.n_ctx && n_ctx > info.n_ctx_train)
        n_ctx = info.n_ctx_train;
    if (n >= n_ctx) {
        fprintf(stderr, "gpupool-run %s: the prompt (%d tokens) does not fit the context (%ld)\n",
                NAME, n, n_ctx);
        goto done;
    }
    gpe_ctx_params cp = gpe_ctx_default_params();
    cp.n_ctx = (int)n_ctx;
    cp.n_threads = (int)o.threads;
    cp.n_batch = n > 512 ? 512 : n;
    cp.kv_f16 = o.kv_f16;
    gpe_status st = gpe_ctx_init(m, &cp, &ctx, err, sizeof err);
    if (st != GPE_OK) {
        fprintf(stderr, "gpupool-run %s: %s\n", NAME, err);
        goto done;
    }

    gpe_sampler_params sp = gpe_sampler_default_params();
    sp.temperature = (float)o.temp;
    sp.top_k = (int)o.top_k;
    sp.top_p = (float)o.top_p;
    sp.min_p = (float)o.min_p;
    sp.repeat_penalty = (float)o.repeat_penalty;
    sp.seed = o.seed_set ? o.seed : (uint64_t)time(NULL);
    smp = gpe_sampler_init(&sp);
    b = gpe_batch_init(n);
    if (!smp || !b) {
        fprintf(stderr, "gpupool-run %s: out of memory\n", NAME);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        gpe_sampler_accept(smp, ids[i]);
        gpe_batch_add(b, ids[i], i, 0, i == n - 1);
    }

    const int n_vocab = gpe_model_n_vocab(m);
    double t0 = gpr_now();
    if ((st = gpe_decode(ctx, b, err, sizeof err)) != GPE_OK) {
        fprintf(stderr, "gpupool-run %s: decode: %s\n", NAME, err);
        goto done;
    }
    double t_prompt = gpr_now() - t0;
    const float *logits = gpe_get_logits(ctx, n - 1);
    const char *stop = "length";
    long n_gen = 0;
    double t1 = gpr_now();
    for (; n_gen < o.n_predict; n_gen++) {
        int32_t tok = gpe_sampler_sample(smp, logits, n_vocab);
        if (tok < 0) {
            /* the sampler's scratch, or a token its penalties had to keep,
             * could not be allocated: no token, not token -1 decoded */
            fprintf(stderr, "\ngpupool-run %s: sampling: out of memory\n", NAME);
            goto done;
        }
        gpe_sampler_accept(smp, tok);
        if (!o.no_eog && gpe_token_is_eog(m, tok)) {
            stop = "eog";
            break;
        }
        int len = gpr_piece(m, tok, false, &g.piece, &g.piece_cap);
        if (len < 0) {
            fprintf(stderr, "\ngpupool-run %s: token %d: out of memory\n", NAME, (int)tok);
            goto done;
        }
        if (!emit(&o, &g, tok, (size_t)len))
            goto done;
        if (n_gen + 1 >= o.n_predict) {
            n_gen++;
            break;   /* stop = "length"; no need to decode the last token */
        }
        if (n + n_gen + 1 >= n_ctx) {
            n_gen++;
            stop = "context";
            break;
        }
        gpe_batch_clear(b);
        gpe_batch_add(b, tok, n + (int)n_gen, 0, true);
        if ((st = gpe_decode(ctx, b, err, sizeof err)) != GPE_OK) {
            fprintf(stderr, "\ngpupool-run %s: decode: %s\n", NAME, err);
            goto done;
        }
        logits = gpe_get_logits(ctx, 0);
    }
    double t_gen = gpr_now() - t1;
    if (print_summary(&o, &info, n, n_gen, stop, sp.seed, t_prompt, t_gen, g.npend))
        rc = 0;
    fflush(stdout);

done:
    gen_out_free(&g);
    gpe_sampler_free(smp);
    gpe_batch_free(b);
    gpe_ctx_free(ctx);
    gpe_model_free(m);
    free(ids);
    return rc;
}

const gpr_cmd gpr_cmd_generate = {
    "generate", "generate text from a prompt (streams; --json for token objects)",
    exec_generate, usage,
};
