/* The agent's heartbeat (/agents/poll) and long-poll (/agents/work)
 * bodies when memory runs out: whole or not sent (ag_poll_start and
 * ag_work_start try again a second later), never a body that tells the
 * server less than the truth. A running job left out of running_jobs has
 * its attempt ended by the server (agent_dropped_job, docs/protocol.md
 * "Liveness") while the agent still generates it; gpus, the static facts,
 * the backend or the instance left out misdescribe the agent.
 *
 * The agent is the loop's state and no loop (as test_agent_jobs_oom.c):
 * an agent struct with what the bodies read, a backend with a model and
 * live facts, and jobs handed in as a work reply. The allocation that
 * fails is the N-th of jansson's and the agent's own (malloc, calloc,
 * realloc, strdup: ld --wrap, part-agent-poll-body-oom.cmake) through the
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

#include "agent/agent_facts.h"
#include "agent/agent_internal.h"
#include "agent/backend.h"

#define GPS_FIXTURE_OOM_LIBC
#define GPS_FIXTURE_OOM_STRDUP
#include "../server/fixture_oom.h"

#define N_JOBS 5

/* ------------------------------------------- a backend with live facts */

static void fake_destroy(agent_backend *b)
{
    (void)b;
}

/* Whole or NULL, as backend.h asks. */
static json_t *fake_models(agent_backend *b)
{
    (void)b;
    return json_pack("[{s:s,s:[s],s:s,s:i,s:b}]", "id", "tiny-model", "aliases", "tiny",
                     "quantization", "q8_0", "context_length", 4096, "loaded", 1);
}

/* As the deploy backend with two models (backend_deploy.c
 * merge_facts_locked): the first model's facts go into the body, its
 * prefix_cache among them; the second's engines join them; then the
 * prefix_cache goes (two models' slot numbers collide). Cut short, the
 * body holds the first model's prefix_cache and -1 is returned. */
static int fake_poll_facts(agent_backend *b, json_t *body)
{
    (void)b;
    if (json_object_set_new(body, "queue_depth", json_integer(2)) < 0 ||
        json_object_set_new(body, "prefix_cache",
                            json_pack("{s:b,s:[{s:i,s:i}]}", "enabled", 1, "slots", "slot", 0,
                                      "tokens", 128)) < 0 ||
        json_object_set_new(body, "engines",
                            json_pack("[{s:s,s:i},{s:s,s:i}]", "model", "first-model-name",
                                      "slots", 2, "model", "second-model-name", "slots",
                                      2)) < 0)
        return -1;
    json_object_del(body, "prefix_cache");
    return 0;
}

static int fake_job_start(agent_backend *b, json_t *job, const agent_job_sink *sink, char *err,
                          size_t errlen)
{
    (void)b;
    (void)job;
    (void)sink;
    (void)err;
    (void)errlen;
    return 0;
}

static void fake_job_cancel(agent_backend *b, const char *job_id)
{
    (void)b;
    (void)job_id;
}

static const agent_backend_ops fake_ops = {
    .name = "fake",
    .destroy = fake_destroy,
    .models = fake_models,
    .poll_facts = fake_poll_facts,
    .job_start = fake_job_start,
    .job_cancel = fake_job_cancel,
};
static agent_backend fake_be = {.ops = &fake_ops};

/* ------------------------------------------------------------ the agent */

typedef struct fixture {
    agent a;
    agent_options o;
    int pipe_fd[2]; /* the loop's wake (nobody reads it) */
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    assert_int_equal(pipe(f->pipe_fd), 0);
    f->o.slots = 8;
    agent *a = &f->a;
    ag_init(a, &f->o, &fake_be);
    a->wake_fd = f->pipe_fd[1];
    snprintf(a->id, sizeof a->id, "%s", "0b8f4c1e-agent-under-test");
    snprintf(a->instance, sizeof a->instance, "%s", "inst0123456789abcdef");
    a->name = strdup("poll-body-host");
    a->labels = json_pack("{s:s}", "zone", "eu-1");
    a->static_facts = agent_facts_static();
    assert_non_null(a->name);
    assert_non_null(a->labels);
    assert_non_null(a->static_facts);
    /* The running jobs, from one work reply whose token the agent has seen. */
    json_t *jobs = json_array();
    for (int i = 0; i < N_JOBS; i++) {
        char id[32];
        snprintf(id, sizeof id, "job-running-%d", i);
        json_array_append_new(jobs, json_pack("{s:s,s:s}", "job_id", id, "kind", "chat"));
    }
    json_t *reply = json_pack("{s:o,s:s}", "jobs", jobs, "delivery", "epoch1.7");
    assert_non_null(reply);
    ag_work_stale_done(a, CURLE_OK, 200, reply);
    json_decref(reply);
    assert_int_equal(a->n_jobs, N_JOBS);
    assert_string_equal(a->delivery_seen, "epoch1.7");
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
    free(a->name);
    json_decref(a->labels);
    json_decref(a->static_facts);
    pthread_mutex_destroy(&a->mu);
    close(f->pipe_fd[0]);
    close(f->pipe_fd[1]);
    free(f);
    return 0;
}

/* ------------------------------------------------------------ checking */

/* gpus as NVML gives them, whose live figures (utilization, temperature)
 * change between two calls: the same GPUs with the same facts named. */
static bool same_gpus(const json_t *got, const json_t *want)
{
    if (!json_is_array(got) || json_array_size(got) != json_array_size(want))
        return false;
    for (size_t i = 0; i < json_array_size(want); i++) {
        const json_t *g = json_array_get(got, i), *w = json_array_get(want, i);
        const char *k;
        const json_t *v;
        if (json_object_size(g) != json_object_size(w))
            return false;
        json_object_foreach((json_t *)w, k, v) if (!json_object_get(g, k)) return false;
    }
    return true;
}

/* got is want, member for member (gpus as same_gpus); else the first
 * member that differs is printed. */
static bool same_body(const json_t *got, const json_t *want, size_t n)
{
    const char *k;
    const json_t *v;
    bool ok = json_object_size(got) == json_object_size(want);
    json_object_foreach((json_t *)want, k, v)
    {
        const json_t *g = json_object_get(got, k);
        bool same = strcmp(k, "gpus") == 0 ? same_gpus(g, v) : json_equal(g, v);
        if (!same) {
            char *t = g ? json_dumps(g, JSON_COMPACT) : NULL;
            print_message("allocation %zu failed: \"%s\" is %s\n", n, k, t ? t : "missing");
            free(t);
            ok = false;
        }
    }
    json_object_foreach((json_t *)got, k, v) if (!json_object_get(want, k))
    {
        print_message("allocation %zu failed: an extra \"%s\"\n", n, k);
        ok = false;
    }
    return ok;
}

/* ---------------------------------------------------------------- tests */

/* With memory to spare the heartbeat says it all: every running job, the
 * delivery token, the static facts, gpus ([] without NVML), the backend. */
static void test_poll_body_whole(void **state)
{
    agent *a = &((fixture *)*state)->a;
    json_t *b = ag_poll_body(a);
    assert_non_null(b);
    assert_int_equal(json_array_size(json_object_get(b, "running_jobs")), N_JOBS);
    assert_string_equal(json_string_value(json_object_get(b, "delivery_seen")), "epoch1.7");
    assert_string_equal(json_string_value(json_object_get(b, "instance")), a->instance);
    assert_string_equal(json_string_value(json_object_get(b, "backend")), "fake");
    assert_true(json_is_array(json_object_get(b, "gpus")));
    assert_non_null(json_object_get(b, "platform"));
    assert_non_null(json_object_get(b, "cpu"));
    assert_non_null(json_object_get(b, "engines"));
    assert_null(json_object_get(b, "prefix_cache"));
    assert_int_equal(json_array_size(json_object_get(b, "models")), 1);
    json_decref(b);
}

/* The N-th allocation fails, N = 1, 2, ... until a run reaches none: the
 * body is NULL (no poll now, one a second later) or the whole body. */
static void test_poll_body_sweep(void **state)
{
    agent *a = &((fixture *)*state)->a;
    json_t *want = ag_poll_body(a);
    assert_non_null(want);
    int bad = 0, dropped = 0;
    size_t n;
    for (n = 1;; n++) {
        arm_libc(n);
        json_t *b = ag_poll_body(a);
        bool hit = disarm();
        if (!b)
            dropped++;
        else if (!same_body(b, want, n))
            bad++;
        json_decref(b);
        if (!hit)
            break;
    }
    print_message("poll body: %zu allocations swept, %d not sent, %d said less\n", n - 1,
                  dropped, bad);
    json_decref(want);
    assert_true(dropped > 0);
    assert_int_equal(bad, 0);
}

/* The long-poll's body: NULL or whole. Its running_jobs list every job,
 * and the backend's facts cut short add no prefix_cache (here the whole
 * facts have none: a cut one would be the first model's alone). */
static void test_work_body_sweep(void **state)
{
    agent *a = &((fixture *)*state)->a;
    size_t len = 0;
    char *text = ag_work_body(a, 3, &len);
    assert_non_null(text);
    json_t *want = J(text);
    free(text);
    assert_int_equal(json_array_size(json_object_get(want, "running_jobs")), N_JOBS);
    assert_null(json_object_get(want, "prefix_cache"));
    int bad = 0, dropped = 0;
    size_t n;
    for (n = 1;; n++) {
        a->live_dirty = true; /* the list rebuilt, as after a job came or went */
        a->live_sent_ms = 0;  /* and due */
        arm_libc(n);
        text = ag_work_body(a, 3, &len);
        bool hit = disarm();
        if (!text) {
            dropped++;
        } else {
            json_t *b = J(text);
            if (!same_body(b, want, n))
                bad++;
            json_decref(b);
        }
        free(text);
        if (!hit)
            break;
    }
    print_message("work body: %zu allocations swept, %d not sent, %d said less\n", n - 1,
                  dropped, bad);
    json_decref(want);
    assert_true(dropped > 0);
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_poll_body_whole, setup, teardown),
        cmocka_unit_test_setup_teardown(test_poll_body_sweep, setup, teardown),
        cmocka_unit_test_setup_teardown(test_work_body_sweep, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
