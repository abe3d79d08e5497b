/*
 * The agent's gguf backend (src/agent/backend_gguf_job.c) when memory runs
 * out while job_start reads a job: the job starts, or job_start returns
 * AGENT_JOB_START_NOMEM ("out of memory": the agent ends it with
 * AGENT_OUT_OF_MEMORY and it fails over); never -1, which the agent
 * reports as the client's INVALID_REQUEST (a 400 for a job that was fine).
 * A refused job is still refused (-1).
 *
 * The N-th allocation fails, for N = 1, 2, ... until a run ends without
 * reaching it: jansson's and the agent's and engine's malloc, calloc,
 * realloc and strdup (ld --wrap: part-41-backend-gguf-oom.cmake, through
 * tests/unit/server/fixture_oom.h), on stories260K. Not swept: chat jobs,
 * whose prompt the engine renders (gpe_chat_apply_tools says out of memory
 * only in its message) and tools (gguf_tools_init, likewise).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>

#include <cmocka.h>
#include <jansson.h>

#include "agent/backend.h"

#define GPS_FIXTURE_OOM_LIBC
#define GPS_FIXTURE_OOM_STRDUP
#include "../server/fixture_oom.h"

#define STORIES GP_SOURCE_DIR "/models/stories260K.gguf"


/* A job's terminal event (the decode thread sends it). */
typedef struct rec {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_terminal;
} rec;

static void on_started(void *c) { (void)c; }
static void on_token(void *c, const char *t, size_t n, int32_t id)
{
    (void)c, (void)t, (void)n, (void)id;
}
static void on_metrics(void *c, json_t *m) { (void)c, (void)m; }
static void terminal(rec *r)
{
    pthread_mutex_lock(&r->mu);
    r->n_terminal++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}
static void on_end(void *c, const char *fr, long long pt, long long ct)
{
    (void)fr, (void)pt, (void)ct;
    terminal(c);
}
static void on_error(void *c, const char *code, const char *msg)
{
    (void)code, (void)msg;
    terminal(c);
}

/* Waits (bounded: 60 s) for the terminal event. */
static void rec_wait(rec *r)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 60;
    pthread_mutex_lock(&r->mu);
    while (r->n_terminal == 0)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &dl) != 0)
            break;
    int n = r->n_terminal;
    pthread_mutex_unlock(&r->mu);
    assert_int_equal(n, 1);
}

static agent_backend *make(void)
{
    agent_options o;
    memset(&o, 0, sizeof o);
    o.model = (char *)STORIES;
    o.slots = 1;
    o.threads = 1;
    o.ctx_size = 256;
    o.prefix_cache = true;
    char err[256];
    agent_backend *b = agent_backend_gguf_create(&o, err, sizeof err);
    if (!b)
        fail_msg("create: %s", err);
    return b;
}

/* job_start on job, the n-th allocation failing (0: none); its rc, and
 * whether the failure was reached. A started job runs to its end first. */
static int start(agent_backend *b, json_t *job, size_t n, bool *hit, char *err, size_t errlen)
{
    rec r = {.n_terminal = 0};
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    agent_job_sink s = {.ctx = &r, .started = on_started, .token = on_token,
                        .metrics = on_metrics, .end = on_end, .error = on_error};
    err[0] = '\0';
    if (n)
        arm_libc(n);
    int rc = b->ops->job_start(b, job, &s, err, errlen);
    /* (the decode thread may take the failure once the job is queued: a
     * started job is not judged here) */
    *hit = disarm();
    if (rc == 0)
        rec_wait(&r);
    pthread_mutex_destroy(&r.mu);
    pthread_cond_destroy(&r.cv);
    return rc;
}

static int sweep(agent_backend *b, const char *what, json_t *job)
{
    char err[256];
    bool hit;
    assert_int_equal(start(b, job, 0, &hit, err, sizeof err), 0);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        int rc = start(b, job, n, &hit, err, sizeof err);
        if (rc != 0 && (!hit || rc != AGENT_JOB_START_NOMEM || !strstr(err, "out of memory"))) {
            print_message("%s: allocation %zu %s: rc %d (want AGENT_JOB_START_NOMEM), "
                          "\"%s\"\n", what, n, hit ? "failed" : "did not fail", rc, err);
            bad++;
        }
        if (!hit)
            break;
    }
    print_message("%s: %zu runs, %d broke the rule\n", what, n, bad);
    return bad;
}

static void test_start_sweep(void **state)
{
    (void)state;
    agent_backend *b = make();
    json_t *models = b->ops->models(b);
    const char *dg = json_string_value(json_object_get(json_array_get(models, 0), "digest"));
    assert_non_null(dg);
    /* stop strings, a response_format (a grammar) and a text continuation
     * it accepts */
    json_t *fmt = json_pack(
        "{s:s, s:s, s:s, s:s, s:{s:i, s:f, s:[s,s]}, s:{s:s, s:{s:s, s:{s:s, s:{s:{s:s}}}}}}",
        "job_id", "fmt", "kind", "completion", "prompt", "Once upon a time", "continuation",
        "{\"a", "params", "max_tokens", 2, "temperature", 0.0, "stop", "xyz", "\n\n",
        "response_format", "type", "json_schema", "json_schema", "name", "r", "schema",
        "type", "object", "properties", "a", "type", "string");
    /* a token-exact continuation (its ids and text copied) */
    json_t *ids = json_pack("{s:s, s:s, s:s, s:s, s:[i,i,i], s:s, s:{s:i, s:i}, s:{s:i}}",
                            "job_id", "ids", "kind", "completion", "prompt", "Once upon",
                            "continuation", " a time", "continuation_ids", 1, 2, 3,
                            "continuation_digest", dg, "sampler", "seed", 5, "n_sampled", 3,
                            "params", "max_tokens", 2);
    /* an embeddings job */
    json_t *emb = json_pack("{s:s, s:s, s:[s]}", "job_id", "emb", "kind", "embeddings",
                            "input", "Once");
    assert_non_null(fmt);
    assert_non_null(ids);
    assert_non_null(emb);
    json_decref(models);
    int bad = sweep(b, "response_format", fmt) + sweep(b, "continuation_ids", ids) +
              sweep(b, "embeddings", emb);
    /* a refused job is still refused */
    json_t *refused = json_pack("{s:s, s:s, s:s, s:{s:f}}", "job_id", "r", "kind", "completion",
                                "prompt", "x", "params", "temperature", -1.0);
    char err[256];
    bool hit;
    assert_int_equal(start(b, refused, 0, &hit, err, sizeof err), -1);
    json_decref(refused);
    json_decref(fmt);
    json_decref(ids);
    json_decref(emb);
    b->ops->destroy(b);
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
