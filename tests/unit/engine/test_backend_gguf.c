/*
 * The agent's gguf backend (src/agent/backend_gguf.c) on stories260K:
 * several jobs decoded together in fewer slots than jobs (queueing), greedy
 * text identical to llama.cpp's reference, stop strings, max_tokens,
 * count_tokens, chat rendering, cancellation, context overflow, bad jobs,
 * and model facts for /agents/poll.
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

#define STORIES GP_SOURCE_DIR "/models/stories260K.gguf"

/* One job's events, collected by the sink (thread-safe). */
typedef struct rec {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char text[8192];
    size_t len;
    int n_tokens, n_started, n_metrics, n_terminal;
    char reason[32], code[64];
    long long prompt_tokens, completion_tokens;
} rec;

static void on_started(void *c) { rec *r = c; pthread_mutex_lock(&r->mu); r->n_started++; pthread_mutex_unlock(&r->mu); }
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
    r->n_tokens++;
    pthread_mutex_unlock(&r->mu);
}
static void on_metrics(void *c, json_t *m) { (void)m; rec *r = c; pthread_mutex_lock(&r->mu); r->n_metrics++; pthread_mutex_unlock(&r->mu); }
static void on_end(void *c, const char *reason, long long pt, long long ct)
{
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    snprintf(r->reason, sizeof r->reason, "%s", reason);
    r->prompt_tokens = pt;
    r->completion_tokens = ct;
    r->n_terminal++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}
static void on_error(void *c, const char *code, const char *msg)
{
    (void)msg;
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    snprintf(r->code, sizeof r->code, "%s", code);
    r->n_terminal++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static rec *rec_new(void)
{
    rec *r = calloc(1, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    return r;
}

static void rec_free(rec *r)
{
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
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
    pthread_mutex_unlock(&r->mu);
    assert_int_equal(r->n_terminal, 1);
}

static agent_job_sink sink_for(rec *r)
{
    agent_job_sink s = { r, on_started, on_token, on_metrics, on_end, on_error };
    return s;
}

static agent_backend *make(int slots, int ctx)
{
    agent_options o;
    memset(&o, 0, sizeof o);
    o.model = (char *)STORIES;
    o.slots = slots;
    o.threads = 2;
    o.ctx_size = ctx;
    char err[256];
    agent_backend *b = agent_backend_gguf_create(&o, err, sizeof err);
    if (!b)
        fail_msg("create: %s", err);
    return b;
}

static int start(agent_backend *b, const char *json, rec *r)
{
    json_error_t je;
    json_t *job = json_loads(json, 0, &je);
    assert_non_null(job);
    agent_job_sink s = sink_for(r);
    char err[256];
    int rc = b->ops->job_start(b, job, &s, err, sizeof err);
    json_decref(job);
    return rc;
}

static void test_greedy_jobs_batched(void **state)
{
    (void)state;
    json_error_t je;
    json_t *ref = json_load_file(GP_TEST_DATA "/stories260K.greedy.json", 0, &je);
    assert_non_null(ref);
    json_t *cases = json_object_get(ref, "cases");
    agent_backend *b = make(2, 256);   /* 5 jobs, 2 slots: three wait */
    rec *r[5];
    for (int i = 0; i < 5; i++) {
        r[i] = rec_new();
        json_t *cs = json_array_get(cases, (size_t)i);
        json_t *job = json_pack("{s:s, s:s, s:s, s:{s:i, s:f, s:i}}", "job_id",
                                (char[]){ (char)('a' + i), 0 }, "kind", "completion", "prompt",
                                json_string_value(json_object_get(cs, "prompt")), "params",
                                "max_tokens", 64, "temperature", 0.0, "seed", 1);
        char *s = json_dumps(job, 0);
        assert_int_equal(start(b, s, r[i]), 0);
        free(s);
        json_decref(job);
    }
    for (int i = 0; i < 5; i++) {
        rec_wait(r[i]);
        json_t *cs = json_array_get(cases, (size_t)i);
        assert_string_equal(r[i]->reason, "length");
        assert_int_equal(r[i]->completion_tokens, 64);
        assert_int_equal(r[i]->prompt_tokens,
                         (long long)json_array_size(json_object_get(cs, "prompt_ids")));
        assert_string_equal(r[i]->text, json_string_value(json_object_get(cs, "generated_text")));
        assert_int_equal(r[i]->n_started, 1);
        assert_int_equal(r[i]->n_metrics, 1);
        rec_free(r[i]);
    }
    json_t *facts = json_object();
    b->ops->poll_facts(b, facts);
    assert_true(json_is_real(json_object_get(facts, "kv_cache_utilization")));
    json_decref(facts);
    b->ops->destroy(b);
    json_decref(ref);
}

static void test_stop_count_chat_errors(void **state)
{
    (void)state;
    agent_backend *b = make(2, 64);

    json_t *models = b->ops->models(b);
    json_t *m0 = json_array_get(models, 0);
    assert_string_equal(json_string_value(json_object_get(m0, "id")), "stories260K");
    assert_string_equal(json_string_value(json_object_get(m0, "quantization")), "F32");
    assert_string_equal(json_string_value(json_object_get(m0, "architecture")), "llama");
    assert_int_equal(json_integer_value(json_object_get(m0, "context_length")), 64);
    json_decref(models);

    /* stop string: the greedy text is ", there was a little girl named Lily." */
    rec *r = rec_new();
    assert_int_equal(start(b, "{\"job_id\":\"s\",\"kind\":\"completion\",\"prompt\":\"Once upon a "
                              "time\",\"params\":{\"max_tokens\":50,\"temperature\":0,"
                              "\"stop\":[\" girl\"]}}", r), 0);
    rec_wait(r);
    assert_string_equal(r->reason, "stop");
    assert_string_equal(r->text, ", there was a little");
    rec_free(r);

    /* count_tokens */
    r = rec_new();
    assert_int_equal(start(b, "{\"job_id\":\"c\",\"kind\":\"count_tokens\",\"prompt\":\"Once upon a "
                              "time\"}", r), 0);
    rec_wait(r);
    assert_string_equal(r->reason, "stop");
    assert_int_equal(r->prompt_tokens, 5);
    assert_int_equal(r->n_tokens, 0);
    rec_free(r);

    /* chat with the fallback template: some text, then length */
    r = rec_new();
    assert_int_equal(start(b, "{\"job_id\":\"h\",\"kind\":\"chat\",\"messages\":[{\"role\":\"user\","
                              "\"content\":\"Tell a story\"}],\"params\":{\"max_tokens\":8,"
                              "\"temperature\":0}}", r), 0);
    rec_wait(r);
    assert_true(strcmp(r->reason, "length") == 0 || strcmp(r->reason, "stop") == 0);
    assert_true(r->completion_tokens <= 8);
    rec_free(r);

    /* context overflow: a prompt longer than 64 tokens */
    char big[2048] = "{\"job_id\":\"o\",\"kind\":\"completion\",\"prompt\":\"";
    for (int i = 0; i < 80; i++)
        strcat(big, "cat ");
    strcat(big, "\"}");
    r = rec_new();
    assert_int_equal(start(b, big, r), 0);
    rec_wait(r);
    assert_string_equal(r->code, "CONTEXT_OVERFLOW");
    rec_free(r);

    /* a job that runs to the context end stops with "length" */
    r = rec_new();
    assert_int_equal(start(b, "{\"job_id\":\"L\",\"kind\":\"completion\",\"prompt\":\"Once\","
                              "\"params\":{\"max_tokens\":1000,\"temperature\":0}}", r), 0);
    rec_wait(r);
    if (r->reason[0])
        assert_true(strcmp(r->reason, "length") == 0 || strcmp(r->reason, "stop") == 0);
    /* the last sampled token needs no cache position: n_ctx + 1 at most */
    assert_true(r->prompt_tokens + r->completion_tokens <= 65);
    assert_true(r->completion_tokens >= 50);
    rec_free(r);

    /* bad jobs are refused at start, no callback */
    r = rec_new();
    assert_int_equal(start(b, "{\"job_id\":\"x\",\"kind\":\"dance\"}", r), -1);
    assert_int_equal(start(b, "{\"kind\":\"completion\",\"prompt\":\"x\"}", r), -1);
    assert_int_equal(start(b, "{\"job_id\":\"y\",\"kind\":\"chat\",\"messages\":[]}", r), -1);
    assert_int_equal(r->n_terminal, 0);
    rec_free(r);

    /* cancel a long job: exactly one terminal event */
    r = rec_new();
    assert_int_equal(start(b, "{\"job_id\":\"k\",\"kind\":\"completion\",\"prompt\":\"Once\","
                              "\"params\":{\"max_tokens\":60,\"temperature\":1}}", r), 0);
    b->ops->job_cancel(b, "k");
    b->ops->job_cancel(b, "unknown");
    rec_wait(r);
    assert_true(strcmp(r->code, "CANCELLED") == 0 || r->reason[0]);
    rec_free(r);

    /* destroy with a job still queued: it gets its terminal event */
    r = rec_new();
    assert_int_equal(start(b, "{\"job_id\":\"d\",\"kind\":\"completion\",\"prompt\":\"Once\","
                              "\"params\":{\"max_tokens\":60}}", r), 0);
    b->ops->destroy(b);
    assert_int_equal(r->n_terminal, 1);
    rec_free(r);
}

static void test_bad_model(void **state)
{
    (void)state;
    agent_options o;
    memset(&o, 0, sizeof o);
    o.model = (char *)"/nonexistent/model.gguf";
    o.slots = 1;
    char err[256];
    assert_null(agent_backend_gguf_create(&o, err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent/model.gguf"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_jobs_batched),
        cmocka_unit_test(test_stop_count_chat_errors),
        cmocka_unit_test(test_bad_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
