/*
 * Unit tests of agent liveness (docs/protocol.md "Liveness"): the registry's
 * instance ids, the jobs module's judgement of an agent's running_jobs list
 * against delivery numbers, and agents_api's disconnect grace timer (a
 * real libevent timer on a real event base; no HTTP).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/event.h>

#include "common/gp_util.h"
#include "fixture_fleet.h"
#include "server/agents_api.h"
#include "server/fleet/agent_check.h"
#include "server/jobs/jobs.h"
#include "server/fleet/registry.h"
#include "server/fleet/sched.h"

#define GRACE_MS 50

typedef struct fixture {
    fleet fl;
    gps_agents *g;
    registry_agent *a, *b;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    /* agents_api first: the registry reports transitions to it */
    struct event_base *base = event_base_new();
    gps_agents_opts ao = {.poll_interval_sec = 15, .work_wait_sec = 25,
                          .agent_timeout_sec = 90, .disconnect_grace_ms = GRACE_MS};
    f->g = gps_agents_new(base, &ao, NULL, NULL);
    assert_non_null(f->g);
    registry_config rc;
    registry_config_default(&rc);
    rc.listener = gps_agents_on_transition;
    rc.listener_ud = f->g;
    gps_jobs_opts jo = {.max_queue = 100, .queue_timeout_sec = 600, .request_timeout_sec = 600,
                        .stall_timeout_sec = 600, .max_attempts = 5, .poll_interval_sec = 15};
    fleet_init_on(&f->fl, base, &jo, &rc, NULL);
    assert_int_equal(gps_agents_attach(f->g, f->fl.reg, f->fl.s, f->fl.jobs), 0);
    /* the real clock: agents_api ticks the registry with it */
    f->a = fleet_agent(&f->fl, 0xa, "m", NULL, 1, gp_now_mono_ms());
    f->b = fleet_agent(&f->fl, 0xb, "m", NULL, 1, gp_now_mono_ms());
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    struct event_base *base = f->fl.base;
    gps_agents_free(f->g);
    fleet_free(&f->fl);
    event_base_free(base);
    free(f);
    return 0;
}

/* A queued job for model m (no agent is ready: it waits). */
static gps_job *submit(fixture *f)
{
    gps_job_spec sp = fleet_spec("m", 10);
    gps_job *job = fleet_submit(&f->fl, &sp);
    assert_int_equal(job->state, GPS_JOB_QUEUED);
    return job;
}

/* Agent ag asks for one job and gets job, delivered as number n. */
static void deliver(fixture *f, registry_agent *ag, gps_job *job, uint64_t n)
{
    json_t *w = fleet_take_numbered(&f->fl, ag, n);
    assert_string_equal(json_string_value(json_object_get(w, "job_id")), job->id);
    json_decref(w);
    assert_int_equal(job->state, GPS_JOB_ASSIGNED);
    assert_string_equal(job->agent_id, ag->id);
    assert_int_equal(job->delivery, n);
}

static json_t *ids(const char *id)
{
    return id ? json_pack("[s]", id) : json_array();
}

static void run_for_ms(fixture *f, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_base_loopexit(f->fl.base, &tv);
    event_base_dispatch(f->fl.base);
}

/* ------------------------------------------------------------------ */

static void test_instance_ids(void **state)
{
    fixture *f = *state;
    registry_agent *a = f->a;
    assert_false(registry_note_instance(a, NULL));   /* an older agent says nothing */
    assert_false(registry_note_instance(a, ""));
    assert_string_equal(a->instance, "");
    assert_false(registry_note_instance(a, "inst-one")); /* first seen: not a restart */
    assert_false(registry_note_instance(a, "inst-one"));
    assert_false(registry_note_instance(a, NULL));
    assert_string_equal(a->instance, "inst-one");
    assert_true(registry_note_instance(a, "inst-two")); /* a new process */
    assert_string_equal(a->instance, "inst-two");
    assert_false(registry_note_instance(a, "inst-two"));
}

static void test_running_jobs_diff(void **state)
{
    fixture *f = *state;
    gps_job *job = submit(f);
    deliver(f, f->a, job, 7);
    json_t *none = ids(NULL), *mine = ids(job->id);

    /* A list made before the agent read reply 7 judges nothing. */
    assert_int_equal(gps_jobs_agent_report(f->fl.jobs, f->a->id, none, 6), 0);
    assert_int_equal(gps_jobs_agent_report(f->fl.jobs, f->a->id, none, 0), 0);
    /* An older agent (no list) neither. */
    assert_int_equal(gps_jobs_agent_report(f->fl.jobs, f->a->id, NULL, 7), 0);
    assert_int_equal(job->state, GPS_JOB_ASSIGNED);

    /* Listed: alive, and its stall timer restarts. */
    job->last_event_us = 1;
    assert_int_equal(gps_jobs_agent_report(f->fl.jobs, f->a->id, mine, 7), 0);
    assert_true(job->last_event_us > 1);
    /* Another agent's list says nothing about it. */
    assert_int_equal(gps_jobs_agent_report(f->fl.jobs, f->b->id, none, 100), 0);
    assert_int_equal(job->state, GPS_JOB_ASSIGNED);
    assert_int_equal(gps_jobs_agent_assigned(f->fl.jobs, f->a->id), 1);

    /* Read reply 7 (or later) and the job is not there: gone. */
    assert_int_equal(gps_jobs_agent_report(f->fl.jobs, f->a->id, none, 8), 1);
    assert_int_equal(job->state, GPS_JOB_QUEUED);   /* requeued: no agent ready */
    assert_int_equal(job->attempts, 1);
    assert_int_equal(gps_jobs_agent_assigned(f->fl.jobs, f->a->id), 0);
    /* The retry goes to the other agent; its delivery is judged afresh. */
    deliver(f, f->b, job, 9);
    assert_int_equal(job->attempts, 2);
    assert_int_equal(gps_jobs_agent_report(f->fl.jobs, f->b->id, none, 8), 0);
    assert_int_equal(job->state, GPS_JOB_ASSIGNED);
    json_decref(none);
    json_decref(mine);
}

static void test_progress_event(void **state)
{
    fixture *f = *state;
    gps_job *job = submit(f);
    deliver(f, f->a, job, 1);
    json_t *evs = json_loads("[{\"type\":\"started\"},{\"type\":\"progress\","
                             "\"prompt_tokens_done\":256,\"prompt_tokens_total\":1000}]",
                             0, NULL);
    bool cancel;
    long long exp;
    char msg[128];
    job->last_event_us = 1;
    assert_int_equal(gps_jobs_apply_events(f->fl.jobs, job->id, f->a->id, 0, evs, &cancel, &exp, msg,
                                           sizeof msg), 0);
    assert_true(job->last_event_us > 1);
    assert_int_equal(job->progress_done, 256);
    assert_int_equal(job->progress_total, 1000);
    assert_int_equal(job->agent_seq, 2);
    json_decref(evs);
    /* Bad counts are a malformed event (agent_check refuses the upload
     * before anything reaches jobs). */
    json_t *bad = json_loads("{\"type\":\"progress\",\"prompt_tokens_done\":-1}", 0, NULL);
    char field[96];
    assert_int_equal(gps_agent_event_check(bad, 0, field, sizeof field, msg, sizeof msg), -1);
    assert_string_equal(field, "events[0].prompt_tokens_done");
    json_decref(bad);
}

static void test_disconnect_grace(void **state)
{
    fixture *f = *state;
    gps_job *job = submit(f);
    deliver(f, f->a, job, 1);

    /* An older agent (no instance): a closed long-poll only makes it suspect. */
    gps_agents_poll_closed(f->g, f->a->id);
    assert_int_equal(f->a->state, REGISTRY_SUSPECT);
    run_for_ms(f, 4 * GRACE_MS);
    assert_int_equal(job->state, GPS_JOB_ASSIGNED);

    /* With an instance: a new long-poll within the grace keeps the job. */
    registry_note_instance(f->a, "instance-a1");
    gps_agents_poll_closed(f->g, f->a->id);
    gps_agents_poll_reopened(f->g, f->a->id);
    run_for_ms(f, 4 * GRACE_MS);
    assert_int_equal(job->state, GPS_JOB_ASSIGNED);
    assert_string_equal(job->agent_id, f->a->id);

    /* No new long-poll: the attempt ends when the grace runs out. */
    gps_agents_poll_closed(f->g, f->a->id);
    assert_int_equal(job->state, GPS_JOB_ASSIGNED); /* not before */
    for (int i = 0; i < 100 && job->state == GPS_JOB_ASSIGNED; i++)
        run_for_ms(f, GRACE_MS);
    assert_int_equal(job->state, GPS_JOB_QUEUED);
    assert_int_equal(job->attempts, 1);
    assert_string_equal(job->agent_id, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_instance_ids, setup, teardown),
        cmocka_unit_test_setup_teardown(test_running_jobs_diff, setup, teardown),
        cmocka_unit_test_setup_teardown(test_progress_event, setup, teardown),
        cmocka_unit_test_setup_teardown(test_disconnect_grace, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
