/* The agent's job sink (src/agent/agent_jobs.c) when memory runs out: a
 * value the end event is to carry (stop_sequence, upstream_meta) that
 * cannot be copied breaks the job's queue, as a failed push does, instead
 * of letting the end go without it (a quietly wrong success); a value
 * dropped on purpose (an upstream_meta over 4096 bytes) is still dropped;
 * and a job_start that fails for want of memory (AGENT_JOB_START_NOMEM)
 * ends the job AGENT_OUT_OF_MEMORY (failed over), not INVALID_REQUEST
 * (the client's 400).
 *
 * The agent is the loop's state and no loop: an agent struct with what
 * job_begin and the sinks touch, a backend that keeps the sink it is given,
 * and jobs handed in as a work reply (ag_work_stale_done). The allocation
 * that fails is the N-th of jansson's and the agent's own (malloc, calloc,
 * realloc, strdup: ld --wrap, part-agent-jobs-oom.cmake) through the
 * server sweeps' failing allocator (tests/unit/server/fixture_oom.h). */
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

#include "agent/agent_internal.h"
#include "agent/backend.h"

#define GPS_FIXTURE_OOM_LIBC
#define GPS_FIXTURE_OOM_STRDUP
#include "../server/fixture_oom.h"

/* ------------------------------------------------- a backend that waits */

static agent_job_sink g_sink; /* the last job_start's */
static int g_start_rc;        /* what job_start returns */

static void fake_destroy(agent_backend *b)
{
    (void)b;
}

static int fake_job_start(agent_backend *b, json_t *job, const agent_job_sink *sink, char *err,
                          size_t errlen)
{
    (void)b;
    (void)job;
    g_sink = *sink;
    if (g_start_rc != 0)
        snprintf(err, errlen, "%s", g_start_rc == AGENT_JOB_START_NOMEM
                                        ? "out of memory"
                                        : "the job is not one this backend runs");
    return g_start_rc;
}

static void fake_job_cancel(agent_backend *b, const char *job_id)
{
    (void)b;
    (void)job_id;
}

static const agent_backend_ops fake_ops = {
    .name = "fake",
    .destroy = fake_destroy,
    .job_start = fake_job_start,
    .job_cancel = fake_job_cancel,
};
static agent_backend fake_be = {.ops = &fake_ops};

/* ------------------------------------------------------------ the agent */

typedef struct fixture {
    agent a;
    int pipe_fd[2]; /* the loop's wake (nobody reads it: one write, wake_sent latches) */
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    assert_int_equal(pipe(f->pipe_fd), 0);
    agent *a = &f->a;
    ag_init(a, NULL, &fake_be);
    a->wake_fd = f->pipe_fd[1];
    g_start_rc = 0;
    memset(&g_sink, 0, sizeof g_sink);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    agent *a = &f->a;
    while (a->jobs) {
        agent_job *j = a->jobs;
        a->jobs = j->next;
        ag_job_free(j);
    }
    agent_idtab_free(&a->jtab);
    agent_timers_free(&a->deadlines);
    agent_timers_free(&a->retries);
    gp_buf_free(&a->live_ids);
    free(a->review);
    pthread_mutex_destroy(&a->mu);
    close(f->pipe_fd[0]);
    close(f->pipe_fd[1]);
    free(f);
    return 0;
}

/* Job `id` assigned by a work reply; its backend started (g_sink). */
static agent_job *begin(agent *a, const char *id)
{
    json_t *body = json_pack("{s:[{s:s,s:s}]}", "jobs", "job_id", id, "kind", "chat");
    assert_non_null(body);
    ag_work_stale_done(a, CURLE_OK, 200, body);
    json_decref(body);
    agent_job *j = ag_job_find(a, id);
    assert_non_null(j);
    return j;
}

/* Every event j's queue holds (its upload's "events" array). */
static json_t *events(agent_job *j)
{
    size_t seq = 0;
    json_t *s = agent_evq_take(&j->q, 0, &seq);
    assert_non_null(s);
    char *text = NULL;
    assert_true(asprintf(&text, "[%s]", json_string_value(s)) > 0);
    json_decref(s);
    json_t *arr = J(text);
    free(text);
    return arr;
}

static const json_t *last_event(const json_t *evs)
{
    size_t n = json_array_size(evs);
    assert_true(n > 0);
    return json_array_get(evs, n - 1);
}

static const char *type_of(const json_t *ev)
{
    return json_string_value(json_object_get(ev, "type"));
}

static const char *code_of(const json_t *ev)
{
    return json_string_value(json_object_get(ev, "code"));
}

/* ---------------------------------------------------------------- tests */

/* With memory to spare the end carries both values. */
static void test_values_carried(void **state)
{
    agent *a = &((fixture *)*state)->a;
    agent_job *j = begin(a, "job-ok");
    json_t *meta = J("{\"agent_id\":\"inner\",\"attempts\":2}");
    g_sink.token(g_sink.ctx, "hi", 2, -1);
    g_sink.stop_sequence(g_sink.ctx, "STOP");
    g_sink.upstream_meta(g_sink.ctx, meta);
    g_sink.end(g_sink.ctx, "stop", 3, 1);
    assert_false(agent_evq_broken(&j->q));
    json_t *evs = events(j);
    const json_t *end = last_event(evs);
    assert_string_equal(type_of(end), "end");
    assert_string_equal(json_string_value(json_object_get(end, "stop_sequence")), "STOP");
    assert_true(json_equal(json_object_get(end, "upstream_meta"), meta));
    json_decref(evs);
    json_decref(meta);
}

/* The stop string's copy fails: the job's queue breaks (no end without
 * its stop_sequence), and the loop is told (AGENT_EVQ_BROKEN). */
static void test_stop_sequence_lost(void **state)
{
    agent *a = &((fixture *)*state)->a;
    agent_job *j = begin(a, "job-stop");
    g_sink.token(g_sink.ctx, "hi", 2, -1);
    arm_libc(1);
    g_sink.stop_sequence(g_sink.ctx, "STOP");
    assert_true(disarm());
    assert_true(agent_evq_broken(&j->q));
    assert_true(agent_evq_flags(&j->q) & AGENT_EVQ_BROKEN);
    assert_true(j->dirty); /* linked for the loop, which stops the backend */
    g_sink.end(g_sink.ctx, "stop", 3, 1);
    json_t *evs = events(j);
    assert_int_equal(json_array_size(evs), 2); /* the token, then the out-of-memory error */
    assert_string_equal(type_of(json_array_get(evs, 0)), "token");
    assert_string_equal(type_of(last_event(evs)), "error");
    assert_string_equal(code_of(last_event(evs)), "AGENT_OUT_OF_MEMORY");
    json_decref(evs);
}

/* The upstream meta's copy or measure fails at any of its allocations:
 * the end carries the meta whole, or the queue breaks; never an end
 * without it. */
static void test_upstream_meta_sweep(void **state)
{
    agent *a = &((fixture *)*state)->a;
    json_t *meta = J("{\"agent_id\":\"inner\",\"attempts\":2,\"upstream\":{\"model\":\"m\","
                     "\"tiers\":[1,2,{\"x\":\"a longer string than sixteen bytes\"}]}}");
    int bad = 0, broke = 0;
    size_t n;
    for (n = 1;; n++) {
        char id[32];
        snprintf(id, sizeof id, "job-meta-%zu", n);
        agent_job *j = begin(a, id);
        arm(n); /* jansson's: the deep copy and the dump that measures it */
        g_sink.upstream_meta(g_sink.ctx, meta);
        bool hit = disarm();
        g_sink.end(g_sink.ctx, "stop", 3, 1);
        json_t *evs = events(j);
        const json_t *end = last_event(evs);
        if (agent_evq_broken(&j->q)) {
            broke++;
            bad += !hit || strcmp(code_of(end), "AGENT_OUT_OF_MEMORY") != 0;
        } else if (strcmp(type_of(end), "end") != 0 ||
                   !json_equal(json_object_get(end, "upstream_meta"), meta)) {
            print_message("allocation %zu failed: the end went without its upstream_meta\n",
                          n);
            bad++;
        }
        json_decref(evs);
        if (!hit)
            break;
    }
    print_message("upstream_meta: %zu allocations swept, %d broke the queue, %d broke the "
                  "rule\n", n - 1, broke, bad);
    json_decref(meta);
    assert_true(broke > 0);
    assert_int_equal(bad, 0);
}

/* A meta over 4096 bytes is dropped on purpose (the server would refuse
 * the upload): the end goes without it, the queue whole. */
static void test_upstream_meta_too_large_dropped(void **state)
{
    agent *a = &((fixture *)*state)->a;
    agent_job *j = begin(a, "job-big");
    char big[5000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    json_t *meta = json_pack("{s:s}", "note", big);
    g_sink.upstream_meta(g_sink.ctx, meta);
    g_sink.end(g_sink.ctx, "stop", 3, 1);
    assert_false(agent_evq_broken(&j->q));
    json_t *evs = events(j);
    const json_t *end = last_event(evs);
    assert_string_equal(type_of(end), "end");
    assert_null(json_object_get(end, "upstream_meta"));
    json_decref(evs);
    json_decref(meta);
}

/* A job_start that ran out of memory: the agent's own failure. One that
 * refused the job: the client's. */
static void test_job_start_nomem(void **state)
{
    agent *a = &((fixture *)*state)->a;
    g_start_rc = AGENT_JOB_START_NOMEM;
    agent_job *j = begin(a, "job-nomem");
    json_t *evs = events(j);
    assert_int_equal(json_array_size(evs), 1);
    assert_string_equal(code_of(last_event(evs)), "AGENT_OUT_OF_MEMORY");
    assert_true(j->backend_done);
    json_decref(evs);
    g_start_rc = -1;
    j = begin(a, "job-refused");
    evs = events(j);
    assert_string_equal(code_of(last_event(evs)), "INVALID_REQUEST");
    json_decref(evs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_values_carried, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_sequence_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(test_upstream_meta_sweep, setup, teardown),
        cmocka_unit_test_setup_teardown(test_upstream_meta_too_large_dropped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_job_start_nomem, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
