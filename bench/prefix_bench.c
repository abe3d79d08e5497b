/*
 * prefix-bench: the prompt-prefix cache on a replayed conversation.
 *
 *   gguf-random --shape custom --n-embd 768 --n-layer 12 --n-head 12 --n-head-kv 12 \
 *               --n-ff 2048 --n-vocab 8000 --type q8_0 -o /tmp/pb.gguf
 *   prefix-bench --model /tmp/pb.gguf [--turns 20] [--threads 2] [--reply 24]
 *
 * A conversation of --turns turns (a long system prompt, then per turn a
 * user message of a few sentences and the model's greedy reply) is replayed
 * through the agent's gguf backend (src/agent/backend_gguf.c, the code the
 * agent runs) as chat jobs that resend the whole conversation each turn, as
 * agentic clients do. Two backends run it side by side, turn by turn
 * interleaved (so that load on a shared machine hits both alike): one with
 * the prefix cache (the agent's default), one with --no-prefix-cache. Per
 * turn it prints the prompt's tokens, the prefill tokens each computed, the
 * time to first token (admission to the first sampled token: the prefill)
 * and the whole job's time; then totals. The replies of both must be
 * identical (the cache changes no output): a difference is reported and
 * the exit status is 1. Printed only: no timing is asserted anywhere.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "agent/backend.h"

typedef struct rec {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char text[16384];
    size_t len;
    bool done;
    char code[64];
    long long prompt, cached;
    double ttft_ms;
} rec;

static void on_token(void *c, const char *t, size_t n, int32_t id)
{
    (void)id;
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    if (r->len + n < sizeof r->text) {
        memcpy(r->text + r->len, t, n);
        r->len += n;
        r->text[r->len] = '\0';
    }
    pthread_mutex_unlock(&r->mu);
}

static void on_metrics(void *c, json_t *m)
{
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    r->prompt = json_integer_value(json_object_get(m, "prompt_tokens"));
    r->cached = json_integer_value(json_object_get(m, "prompt_tokens_cached"));
    r->ttft_ms = json_number_value(json_object_get(m, "time_to_first_token_ms"));
    pthread_mutex_unlock(&r->mu);
}

static void finish(rec *r, const char *code)
{
    pthread_mutex_lock(&r->mu);
    snprintf(r->code, sizeof r->code, "%s", code);
    r->done = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void on_end(void *c, const char *reason, long long pt, long long ct)
{
    (void)reason;
    (void)pt;
    (void)ct;
    finish(c, "");
}

static void on_error(void *c, const char *code, const char *msg)
{
    fprintf(stderr, "prefix-bench: job error %s: %s\n", code, msg);
    finish(c, code);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Runs one chat job to its end; fills r, returns the job's wall time (ms)
 * or -1 on error. */
static double run_job(agent_backend *b, json_t *job, rec *r)
{
    memset(r->text, 0, 1);
    r->len = 0;
    r->done = false;
    r->code[0] = '\0';
    r->prompt = r->cached = 0;
    r->ttft_ms = 0;
    agent_job_sink s = {.ctx = r, .token = on_token, .metrics = on_metrics, .end = on_end,
                        .error = on_error};
    char err[256];
    double t0 = now_ms();
    if (b->ops->job_start(b, job, &s, err, sizeof err) != 0) {
        fprintf(stderr, "prefix-bench: job_start: %s\n", err);
        return -1;
    }
    pthread_mutex_lock(&r->mu);
    while (!r->done)
        pthread_cond_wait(&r->cv, &r->mu);   /* the backend always ends a started job */
    pthread_mutex_unlock(&r->mu);
    return r->code[0] ? -1 : now_ms() - t0;
}

/* Deterministic text of n words from a small word list. */
static void words(char *out, size_t cap, int n, unsigned *seed)
{
    static const char *w[] = {
        "the", "file", "function", "returns", "an", "error", "when", "the", "buffer", "is",
        "full", "please", "fix", "test", "build", "server", "agent", "model", "token", "cache",
        "slot", "request", "reply", "stream", "event", "config", "option", "value", "line",
        "check", "and", "then", "run", "again", "with", "more", "threads", "memory", "it",
        "works", "fails", "because", "of", "missing", "header", "in", "this", "module"};
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < n && len + 16 < cap; i++) {
        *seed = *seed * 1103515245u + 12345u;
        const char *x = w[(*seed >> 16) % (sizeof w / sizeof w[0])];
        len += (size_t)snprintf(out + len, cap - len, "%s%s", i ? " " : "", x);
        if ((*seed >> 8) % 9 == 0 && len + 2 < cap)
            len += (size_t)snprintf(out + len, cap - len, ".");
    }
}

static agent_backend *make(const char *model, int threads, int ctx, bool pc)
{
    agent_options o;
    memset(&o, 0, sizeof o);
    o.model = (char *)model;
    o.slots = 1;
    o.threads = threads;
    o.ctx_size = ctx;
    o.prefix_cache = pc;
    o.state_dir = (char *)"/nonexistent";   /* no digest cache: hashed in memory */
    char err[512];
    agent_backend *b = agent_backend_gguf_create(&o, err, sizeof err);
    if (!b)
        fprintf(stderr, "prefix-bench: %s\n", err);
    return b;
}

static void usage(void)
{
    fprintf(stderr, "usage: prefix-bench --model FILE.gguf [--turns N (20)] [--threads N (2)]\n"
                    "                    [--reply TOKENS (24)] [--user WORDS (40)]\n"
                    "                    [--system WORDS (300)] [--ctx N (4096)]\n");
}

int main(int argc, char **argv)
{
    const char *model = NULL;
    int turns = 20, threads = 2, reply = 24, user_words = 40, sys_words = 300, ctx = 4096;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *dst = strcmp(a, "--turns") == 0     ? &turns
                   : strcmp(a, "--threads") == 0 ? &threads
                   : strcmp(a, "--reply") == 0   ? &reply
                   : strcmp(a, "--user") == 0    ? &user_words
                   : strcmp(a, "--system") == 0  ? &sys_words
                   : strcmp(a, "--ctx") == 0     ? &ctx
                                                 : NULL;
        if (strcmp(a, "--model") == 0 && v) {
            model = v;
            i++;
        } else if (dst && v && atoi(v) > 0) {
            *dst = atoi(v);
            i++;
        } else {
            usage();
            return 2;
        }
    }
    if (!model) {
        usage();
        return 2;
    }
    agent_backend *on = make(model, threads, ctx, true), *off = make(model, threads, ctx, false);
    if (!on || !off)
        return 1;
    static rec r_on, r_off;
    pthread_mutex_init(&r_on.mu, NULL);
    pthread_cond_init(&r_on.cv, NULL);
    pthread_mutex_init(&r_off.mu, NULL);
    pthread_cond_init(&r_off.cv, NULL);

    unsigned seed = 42;
    char buf[8192];
    json_t *msgs = json_array();
    words(buf, sizeof buf, sys_words, &seed);
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", buf));

    printf("prefix-bench: %s, %d turns, %d threads, replies of %d tokens, interleaved\n", model,
           turns, threads, reply);
    printf("%4s %7s | %9s %9s | %10s %10s | %10s %10s | %6s\n", "turn", "prompt", "computed",
           "computed", "ttft ms", "ttft ms", "job ms", "job ms", "ttft");
    printf("%4s %7s | %9s %9s | %10s %10s | %10s %10s | %6s\n", "", "tokens", "cache on",
           "cache off", "cache on", "cache off", "cache on", "cache off", "speed");
    long long sum_on = 0, sum_off = 0;
    double t_on = 0, t_off = 0, j_on = 0, j_off = 0;
    int rc = 0;
    for (int t = 1; t <= turns; t++) {
        words(buf, sizeof buf, user_words, &seed);
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", buf));
        char id[32];
        snprintf(id, sizeof id, "turn-%d", t);
        json_t *job = json_pack("{s:s,s:s,s:O,s:{s:i,s:f}}", "job_id", id, "kind", "chat",
                                "messages", msgs, "params", "max_tokens", reply, "temperature",
                                0.0);
        double ms_on = run_job(on, job, &r_on);
        double ms_off = run_job(off, job, &r_off);
        json_decref(job);
        if (ms_on < 0 || ms_off < 0) {
            rc = 1;
            break;
        }
        long long c_on = r_on.prompt - r_on.cached, c_off = r_off.prompt - r_off.cached;
        printf("%4d %7lld | %9lld %9lld | %10.1f %10.1f | %10.1f %10.1f | %5.1fx\n", t,
               r_on.prompt, c_on, c_off, r_on.ttft_ms, r_off.ttft_ms, ms_on, ms_off,
               r_on.ttft_ms > 0 ? r_off.ttft_ms / r_on.ttft_ms : 0.0);
        fflush(stdout);
        if (strcmp(r_on.text, r_off.text) != 0) {
            printf("turn %d: the replies differ (cache on %zu bytes, off %zu bytes)\n", t,
                   r_on.len, r_off.len);
            rc = 1;
        }
        sum_on += c_on;
        sum_off += c_off;
        t_on += r_on.ttft_ms;
        t_off += r_off.ttft_ms;
        j_on += ms_on;
        j_off += ms_off;
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "assistant", "content",
                                              r_on.text));
    }
    printf("%4s %7s | %9lld %9lld | %10.1f %10.1f | %10.1f %10.1f | %5.1fx\n", "all", "",
           sum_on, sum_off, t_on, t_off, j_on, j_off, t_on > 0 ? t_off / t_on : 0.0);
    printf("replies identical: %s\n", rc == 0 ? "yes" : "NO");
    json_decref(msgs);
    on->ops->destroy(on);
    off->ops->destroy(off);
    return rc;
}
