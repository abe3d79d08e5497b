/* The cancel records a poll carries to an agent (jobs.c: kept per agent,
 * so that a poll costs that agent's records; bench/bench_cancels.c
 * measures that). What the records must do, whatever their layout:
 * - isolation: an agent's poll lists its records only, and the reply that
 *   carried them drops those of that agent only, with hundreds of agents
 *   (their ids share the agent-id hash's buckets) and the same job on
 *   record for two agents (a failover away from the first);
 * - no duplicate for the same (agent, job), however often it is added;
 * - expiry: a record no reply carried goes after the keep, the younger
 *   ones stay;
 * - an agent forgotten (admin remove): its records go, no one else's;
 * - out of memory (fixture_oom.h: the N-th malloc, calloc, realloc or
 *   strdup fails, N = 1, 2, ... until a run ends without reaching it): a
 *   record is made whole or not at all, the others are untouched, and a
 *   cancelled job without one is still stopped by its agent's next upload
 *   (cancel:true), as before.
 * Real registry, scheduler and jobs table (fixture_fleet.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/gp_json.h"
#include "common/gp_util.h"
#include "fixture_fleet.h"
#include "fixture_oom.h"
#include "server/jobs/jobs.h"

#define MANY 300 /* agents: 4,096 buckets, so some share one (birthday) */
#define IDCAP 40 /* a job id and its terminator (gps_job.id) */

/* The job ids a command list names, checked: all cancels, no id twice,
 * exactly the n of want (any order). */
static bool list_is(const json_t *cmds, char (*want)[IDCAP], size_t n)
{
    if (!cmds || json_array_size(cmds) != n)
        return false;
    for (size_t i = 0; i < n; i++) {
        int found = 0;
        size_t k;
        const json_t *c;
        json_array_foreach(cmds, k, c)
        {
            const char *type = json_string_value(json_object_get(c, "type"));
            const char *id = json_string_value(json_object_get(c, "job_id"));
            found += type && id && strcmp(type, "cancel") == 0 && strcmp(id, want[i]) == 0;
        }
        if (found != 1)
            return false;
    }
    return true;
}

static bool pending_is(fleet *f, registry_agent *a, char (*want)[IDCAP], size_t n)
{
    json_t *cmds = gps_jobs_pending_cancels(f->jobs, a->id);
    bool ok = list_is(cmds, want, n);
    json_decref(cmds);
    return ok;
}

/* Agent a's poll reply carrying its list is written. */
static void poll_written(fleet *f, registry_agent *a)
{
    json_t *cmds = gps_jobs_pending_cancels(f->jobs, a->id);
    assert_non_null(cmds);
    gps_jobs_cancels_sent(f->jobs, a->id, cmds);
    json_decref(cmds);
}

/* A job for a, taken by a: the job (id into id). */
static gps_job *give(fleet *f, registry_agent *a, char *id)
{
    gps_job_spec s = fleet_spec("m1", 64);
    gps_job *job = fleet_submit(f, &s);
    json_t *w = fleet_take(f, a);
    snprintf(id, IDCAP, "%s", json_string_value(json_object_get(w, "job_id")));
    json_decref(w);
    assert_string_equal(id, job->id);
    return job;
}

typedef struct many {
    fleet f;
    registry_agent *ag[MANY];
    gps_job *job[MANY][2];
    char id[MANY][2][IDCAP];
} many;

/* MANY agents with two jobs each, all cancelled (their clients left):
 * each agent has two records. */
static many *many_new(const gps_jobs_opts *o)
{
    many *m = calloc(1, sizeof *m);
    assert_non_null(m);
    fleet_init(&m->f, o, NULL);
    for (int i = 0; i < MANY; i++)
        m->ag[i] = fleet_agent(&m->f, i + 1, "m1", NULL, 2, 1000);
    for (int i = 0; i < MANY; i++)
        for (int k = 0; k < 2; k++)
            m->job[i][k] = give(&m->f, m->ag[i], m->id[i][k]);
    for (int i = 0; i < MANY; i++)
        for (int k = 0; k < 2; k++)
            gps_jobs_cancel(m->f.jobs, m->job[i][k], "client left");
    return m;
}

static void many_free(many *m)
{
    fleet_free(&m->f);
    free(m);
}

static void test_isolation(void **state)
{
    (void)state;
    many *m = many_new(NULL);
    for (int i = 0; i < MANY; i++)
        assert_true(pending_is(&m->f, m->ag[i], m->id[i], 2));
    /* Every other agent's reply is written, in an order that drops an
     * agent's newest first and its older one later (the first record of
     * its bucket's chain, then the rest). */
    for (int i = 0; i < MANY; i += 2) {
        json_t *one = json_pack("[{s:s,s:s}]", "type", "cancel", "job_id", m->id[i][1]);
        gps_jobs_cancels_sent(m->f.jobs, m->ag[i]->id, one);
        json_decref(one);
        /* Another agent's job id in this agent's reply drops nothing. */
        json_t *other = json_pack("[{s:s,s:s}]", "type", "cancel", "job_id",
                                  m->id[(i + 1) % MANY][0]);
        gps_jobs_cancels_sent(m->f.jobs, m->ag[i]->id, other);
        json_decref(other);
        assert_true(pending_is(&m->f, m->ag[i], m->id[i], 1));
    }
    for (int i = 0; i < MANY; i++) {
        if (i % 2 == 0) {
            poll_written(&m->f, m->ag[i]);
            assert_true(pending_is(&m->f, m->ag[i], NULL, 0));
        } else {
            assert_true(pending_is(&m->f, m->ag[i], m->id[i], 2));
        }
    }
    many_free(m);
}

/* The same job on record for two agents: taken by a, a lost (failover:
 * record a), requeued and taken by b, its client leaves (record b). */
static void test_same_job_two_agents(void **state)
{
    (void)state;
    fleet f;
    fleet_init(&f, NULL, NULL);
    registry_agent *a = fleet_agent(&f, 1, "m1", NULL, 1, 1000);
    char id[1][IDCAP];
    gps_job *job = give(&f, a, id[0]);
    gps_jobs_agent_lost(f.jobs, a->id, "agent_dead");
    assert_int_equal(job->state, GPS_JOB_QUEUED);
    registry_agent *b = fleet_agent(&f, 2, "m1", NULL, 1, 1000);
    json_t *w = fleet_take(&f, b);
    json_decref(w);
    assert_string_equal(job->agent_id, b->id);
    gps_jobs_cancel(f.jobs, job, "client left");
    assert_true(pending_is(&f, a, id, 1));
    assert_true(pending_is(&f, b, id, 1));
    poll_written(&f, a);
    assert_true(pending_is(&f, a, NULL, 0));
    assert_true(pending_is(&f, b, id, 1));
    fleet_free(&f);
}

/* However often (agent, job) is put on record it is there once: a job
 * that fails over from a to b and back to a, and away from a again (the
 * attempt after a loss avoids the agent lost, so it alternates). */
static void test_no_duplicates(void **state)
{
    (void)state;
    gps_jobs_opts o = fleet_opts();
    o.max_attempts = 5;
    fleet f;
    fleet_init(&f, &o, NULL);
    registry_agent *ag[2] = {fleet_agent(&f, 1, "m1", NULL, 1, 1000),
                             fleet_agent(&f, 2, "m1", NULL, 1, 1000)};
    char id[1][IDCAP];
    gps_job *job = give(&f, ag[0], id[0]);
    for (int i = 0; i < 3; i++) {
        registry_agent *from = ag[i % 2], *to = ag[(i + 1) % 2];
        gps_jobs_agent_lost(f.jobs, from->id, "agent_dead");
        assert_int_equal(job->state, GPS_JOB_QUEUED);
        assert_true(pending_is(&f, from, id, 1));
        to = fleet_agent(&f, i % 2 ? 1 : 2, "m1", NULL, 1, 2000 + i);
        json_t *w = fleet_take(&f, to);
        json_decref(w);
        assert_string_equal(job->agent_id, to->id);
    }
    /* Now on b: its client leaves (b's record made again). */
    gps_jobs_cancel(f.jobs, job, "client left");
    assert_true(pending_is(&f, ag[0], id, 1));
    assert_true(pending_is(&f, ag[1], id, 1));
    poll_written(&f, ag[0]);
    poll_written(&f, ag[1]);
    assert_true(pending_is(&f, ag[0], NULL, 0));
    assert_true(pending_is(&f, ag[1], NULL, 0));
    fleet_free(&f);
}

typedef struct expiry {
    many *m;
    int from, to; /* agents whose records are to be gone */
} expiry;

static bool records_gone(void *arg)
{
    expiry *e = arg;
    for (int i = e->from; i < e->to; i++) {
        json_t *cmds = gps_jobs_pending_cancels(e->m->f.jobs, e->m->ag[i]->id);
        bool none = json_array_size(cmds) == 0;
        json_decref(cmds);
        if (!none)
            return false;
    }
    return true;
}

/* Kept 1 s: the records made 0.6 s after the first ones are all there
 * when the first ones have gone (sweeps every 250 ms), and go in turn. */
static void test_expiry(void **state)
{
    (void)state;
    gps_jobs_opts o = fleet_opts();
    o.cancel_keep_ms = 1000;
    o.request_timeout_sec = o.queue_timeout_sec = o.stall_timeout_sec = 3600;
    many *m = many_new(&o); /* records of all MANY agents */
    /* Half of them are made again, later: taken off (written) and put
     * back by a second job each. */
    uint64_t t0 = gp_now_mono_ms();
    while (gp_now_mono_ms() - t0 < 600)
        event_base_loop(m->f.base, EVLOOP_NONBLOCK);
    for (int i = MANY / 2; i < MANY; i++) {
        poll_written(&m->f, m->ag[i]);
        for (int k = 0; k < 2; k++) {
            m->ag[i] = fleet_agent(&m->f, i + 1, "m1", NULL, 2, 3000);
            m->job[i][k] = give(&m->f, m->ag[i], m->id[i][k]);
            gps_jobs_cancel(m->f.jobs, m->job[i][k], "client left");
        }
    }
    expiry first = {m, 0, MANY / 2}, second = {m, MANY / 2, MANY};
    assert_false(records_gone(&first));
    assert_true(fleet_run_until(&m->f, records_gone, &first, 5000));
    for (int i = MANY / 2; i < MANY; i++)
        assert_true(pending_is(&m->f, m->ag[i], m->id[i], 2));
    assert_true(fleet_run_until(&m->f, records_gone, &second, 5000));
    many_free(m);
}

/* An agent forgotten (admin remove): its records go, every other agent's
 * stay (some share its bucket), and it starts empty if it comes back. */
/* A cancelled job's agent uploads (nothing new): whether it is told to
 * stop, and the upload takes its record. */
static bool upload_says_cancel(fleet *f, registry_agent *a, gps_job *job)
{
    json_t *none = json_array();
    bool cancel = false;
    long long exp;
    char msg[256];
    int rc = gps_jobs_apply_events(f->jobs, job->id, a->id, 0, none, &cancel, &exp, msg,
                                   sizeof msg);
    json_decref(none);
    assert_int_equal(rc, 0);
    return cancel;
}

static void test_cancel_records_oom(void **state)
{
    (void)state;
    size_t n, bad = 0, short_of = 0;
    for (n = 1;; n++) {
        fleet f;
        fleet_init(&f, NULL, NULL);
        registry_agent *a = fleet_agent(&f, 1, "m1", NULL, 2, 1000);
        registry_agent *b = fleet_agent(&f, 2, "m1", NULL, 1, 1000);
        char ida[2][IDCAP], idb[1][IDCAP];
        gps_job *ja[2] = {give(&f, a, ida[0]), give(&f, a, ida[1])};
        gps_job *jb = give(&f, b, idb[0]);
        gps_jobs_cancel(f.jobs, jb, "client left"); /* made before: untouched */
        arm_beneath(n);
        for (int i = 0; i < 2; i++)
            gps_jobs_cancel(f.jobs, ja[i], "client left");
        bool hit = disarm();
        /* What is on record for a: some of its two, whole, none twice. */
        char held[2][IDCAP];
        size_t nh = 0;
        for (int i = 0; i < 2; i++) {
            json_t *cmds = gps_jobs_pending_cancels(f.jobs, a->id);
            size_t k;
            const json_t *c;
            int found = 0;
            json_array_foreach(cmds, k, c)
            {
                found += strcmp(json_string_value(json_object_get(c, "job_id")), ida[i]) == 0;
            }
            json_decref(cmds);
            if (found > 1)
                bad++;
            if (found == 1)
                memcpy(held[nh++], ida[i], IDCAP);
        }
        if (!pending_is(&f, a, held, nh)) {
            print_message("run %zu: a's list is not its records\n", n);
            bad++;
        }
        short_of += nh < 2;
        if (!pending_is(&f, b, idb, 1)) {
            print_message("run %zu: b's record was touched\n", n);
            bad++;
        }
        /* With or without its record, a cancelled job's agent is told at
         * its next upload, which takes the record. */
        for (int i = 0; i < 2; i++) {
            /* Cancelled, or failed INTERNAL when its end could not be
             * told (out of memory): over either way. */
            if (ja[i]->state != GPS_JOB_CANCELLED && ja[i]->state != GPS_JOB_FAILED) {
                print_message("run %zu: job %d is %s\n", n, i, gps_job_state_name(ja[i]->state));
                bad++;
                continue;
            }
            if (!upload_says_cancel(&f, a, ja[i])) {
                print_message("run %zu: job %d's upload is not told to stop\n", n, i);
                bad++;
            }
        }
        assert_true(pending_is(&f, a, NULL, 0));
        /* The table goes on: a new record for a. */
        char idn[1][IDCAP];
        gps_job *jn = give(&f, a, idn[0]);
        gps_jobs_cancel(f.jobs, jn, "client left");
        assert_true(pending_is(&f, a, idn, 1));
        fleet_free(&f);
        if (!hit)
            break;
    }
    print_message("cancel records sweep: %zu runs, %zu short of a record\n", n, short_of);
    assert_true(short_of > 0);
    assert_int_equal(bad, 0);
}

int main(void)
{
    gp_json_init(); /* as the server's main: jansson's allocations counted (gp_json.h) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_isolation),
        cmocka_unit_test(test_same_job_two_agents),
        cmocka_unit_test(test_no_duplicates),
        cmocka_unit_test(test_expiry),
        cmocka_unit_test(test_cancel_records_oom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
