/* POST /agents/work under memory pressure (fixture_oom.h arm_beneath: the
 * N-th of the project's malloc, calloc or realloc fails, jansson's among
 * them through gp_json's counting allocator; N = 1, 2, ... until a run
 * ends without reaching it): a job is assigned to the agent only if it is
 * in a work reply that was written; every other job is back at the head
 * of its queue, no agent recorded for it, its attempt not counted, and
 * the agent's next work request gets it, in order. The code before marked
 * a job assigned and left it out of the reply when its wire text could not
 * be appended, and kept every job of a reply that could not be sent
 * assigned to an agent that got a 500: they sat there until a failover.
 *
 * Both ways a work reply goes: a work request that finds jobs queued
 * (h_work), and a parked work request answered when a poll makes its
 * agent healthy again (agents_dispatch_parked).
 *
 * Real agents_api on a real gps_http bound to loopback, real registry,
 * scheduler and jobs (fixture_agents_http.h); the agent is plain sockets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include <unistd.h>

#include "common/gp_json.h"
#include "common/gp_util.h"
#include "fixture_agents_http.h"
#include "fixture_oom.h"

#define AGENT AGENTS_HTTP_AGENT
#define POLL_BODY AGENTS_HTTP_POLL_BODY
#define WORK_BODY "{\"agent_id\":\"" AGENT "\",\"free_slots\":2}"
#define NJOBS 2

/* Which of jobs a 200 work reply carries: marks in[], returns how many;
 * -1 when they are not the first ones in queue order. */
static int jobs_in(const char *body, gps_job *const *jobs, bool *in)
{
    json_t *r = json_loads(body, 0, NULL);
    json_t *arr = json_object_get(r, "jobs");
    if (!json_is_array(arr)) { /* (not a whole reply) */
        json_decref(r);
        return -1;
    }
    int k = (int)json_array_size(arr);
    for (int i = 0; i < NJOBS; i++) {
        const char *id = json_string_value(json_object_get(json_array_get(arr, (size_t)i),
                                                           "job_id"));
        in[i] = i < k && id && strcmp(id, gps_job_id(jobs[i])) == 0;
        if (i < k && !in[i])
            k = -1;
    }
    json_decref(r);
    return k;
}

/* Each job assigned to the agent if and only if the reply carried it; the
 * others queued with no agent and no attempt counted. Returns the problems. */
static int books_agree(size_t run, registry_agent *a, gps_job *const *jobs, const bool *in,
                       int sent)
{
    int bad = 0;
    for (int i = 0; i < NJOBS; i++) {
        const gps_job *job = jobs[i];
        bool ok = in[i] ? job->state == GPS_JOB_ASSIGNED && strcmp(job->agent_id, AGENT) == 0 &&
                              job->attempts == 1 && job->delivery > 0
                        : job->state == GPS_JOB_QUEUED && !job->agent_id[0] && job->attempts == 0;
        if (!ok) {
            print_message("run %zu: job %d (%s in the reply) is %s on '%s', attempt %d\n", run,
                          i, in[i] ? "" : "not", gps_job_state_name(job->state), job->agent_id,
                          job->attempts);
            bad++;
        }
    }
    if (a->active != sent) {
        print_message("run %zu: the agent runs %d jobs on the books, %d were sent\n", run,
                      a->active, sent);
        bad++;
    }
    return bad;
}

/* A reply on c (a work request sent) carries the jobs the first reply did
 * not, in order. */
static int rest_on(agents_http *s, size_t run, int c, gps_job *const *jobs, const bool *in)
{
    int rest = 0;
    for (int i = 0; i < NJOBS; i++)
        rest += !in[i];
    char out[16384];
    const char *body;
    int st = agents_http_reply(s, c, out, sizeof out, &body, 5000);
    json_t *r = st == 200 ? json_loads(body, 0, NULL) : NULL;
    json_t *arr = json_object_get(r, "jobs");
    int bad = (int)json_array_size(arr) != rest;
    for (int i = 0, k = 0; !bad && i < NJOBS; i++) {
        if (in[i])
            continue;
        const char *id = json_string_value(json_object_get(json_array_get(arr, (size_t)k++),
                                                           "job_id"));
        bad = !id || strcmp(id, gps_job_id(jobs[i])) != 0 || jobs[i]->attempts != 1;
    }
    if (bad)
        print_message("run %zu: the next work reply (%d) got %s\n", run, st, body);
    json_decref(r);
    return bad;
}

/* The agent's next work request (not armed) gets the jobs the first reply
 * did not carry, in order. */
static int next_gets_rest(agents_http *s, size_t run, gps_job *const *jobs, const bool *in)
{
    int rest = 0;
    for (int i = 0; i < NJOBS; i++)
        rest += !in[i];
    if (rest == 0)
        return 0;
    int c = agents_http_connect(s);
    agents_http_send_post(c, "/agents/work", WORK_BODY);
    int bad = rest_on(s, run, c, jobs, in);
    close(c);
    return bad;
}

/* Register (a poll) and queue NJOBS jobs for m1, the agent not yet asking. */
static registry_agent *fleet_with_queue(agents_http *s, gps_job **jobs)
{
    int c = agents_http_connect(s);
    char out[8192];
    const char *body;
    agents_http_send_post(c, "/agents/poll", POLL_BODY);
    assert_int_equal(agents_http_reply(s, c, out, sizeof out, &body, 5000), 200);
    close(c);
    registry_agent *a = registry_get(s->f.reg, AGENT);
    assert_non_null(a);
    for (int i = 0; i < NJOBS; i++) {
        gps_job_spec sp = fleet_spec("m1", 64);
        jobs[i] = fleet_submit(&s->f, &sp);
    }
    return a;
}

/* A work request finds the jobs queued (h_work): 200 with those it carries
 * or 500, and the books say the same. */
static void test_work_oom(void **state)
{
    (void)state;
    size_t n, bad = 0, failed = 0, partial = 0;
    for (n = 1;; n++) {
        agents_http_run = n;
        agents_http s;
        agents_http_start(&s, arm_beneath);
        gps_job *jobs[NJOBS];
        registry_agent *a = fleet_with_queue(&s, jobs);
        int c = agents_http_connect(&s);
        agents_http_send_post(c, "/agents/work", WORK_BODY);
        s.arm_at = n;
        char out[16384];
        const char *body;
        int st = agents_http_reply(&s, c, out, sizeof out, &body, 5000);
        bool hit = disarm();
        close(c);
        bool in[NJOBS] = {false};
        int sent = st == 200 ? jobs_in(body, jobs, in) : 0;
        failed += st != 200;
        partial += st == 200 && sent < NJOBS;
        if ((st != 200 && st != 500) || sent < 0 || (st == 200 && sent == 0)) {
            print_message("run %zu: the work request answered %d: %s\n", n, st, body);
            bad++;
        } else {
            bad += (size_t)books_agree(n, a, jobs, in, sent);
            bad += (size_t)next_gets_rest(&s, n, jobs, in);
        }
        agents_http_stop(&s);
        if (!hit)
            break;
    }
    print_message("work sweep: %zu runs, %zu answered 500, %zu short\n", n, failed, partial);
    assert_true(failed > 0);
    assert_int_equal(bad, 0);
}

/* A parked work request, its agent made suspect (out of the scheduler's
 * ready sets) while jobs queue, is answered when a poll makes the agent
 * healthy again (agents_dispatch_parked): with the jobs it carries, or 500,
 * or still parked; and the books say the same. */
static void test_dispatch_parked_oom(void **state)
{
    (void)state;
    size_t n, bad = 0, failed = 0;
    for (n = 1;; n++) {
        agents_http_run = n;
        agents_http s;
        agents_http_start(&s, arm_beneath);
        int c = agents_http_connect(&s);
        char out[16384];
        const char *body;
        agents_http_send_post(c, "/agents/poll", POLL_BODY);
        assert_int_equal(agents_http_reply(&s, c, out, sizeof out, &body, 5000), 200);
        close(c);
        registry_agent *a = registry_get(s.f.reg, AGENT);
        int w = agents_http_connect(&s);
        agents_http_send_post(w, "/agents/work", WORK_BODY);
        assert_int_equal(agents_http_reply(&s, w, out, sizeof out, &body, 50), 0); /* parked */
        registry_mark_suspect(s.f.reg, a, gp_now_mono_ms(), "test");
        gps_job *jobs[NJOBS];
        for (int i = 0; i < NJOBS; i++) {
            gps_job_spec sp = fleet_spec("m1", 64);
            jobs[i] = fleet_submit(&s.f, &sp);
            assert_int_equal(jobs[i]->state, GPS_JOB_QUEUED);
        }
        c = agents_http_connect(&s);
        agents_http_send_post(c, "/agents/poll", POLL_BODY);
        s.arm_at = n;
        int pst = agents_http_reply(&s, c, out, sizeof out, &body, 5000);
        int st = agents_http_reply(&s, w, out, sizeof out, &body, 50);
        bool hit = disarm();
        close(c);
        bool in[NJOBS] = {false};
        int sent = st == 200 ? jobs_in(body, jobs, in) : 0;
        failed += st == 500;
        if ((pst != 200 && pst != 500) || (st != 0 && st != 200 && st != 500) || sent < 0 ||
            (st == 200 && sent == 0)) {
            print_message("run %zu: the poll answered %d, the parked work request %d: %s\n", n,
                          pst, st, body);
            bad++;
            close(w);
        } else {
            bad += (size_t)books_agree(n, a, jobs, in, sent);
            /* The next poll (the agent healthy again, if this one failed
             * before) hands the rest to the work request still parked, or
             * to the next one. */
            c = agents_http_connect(&s);
            agents_http_send_post(c, "/agents/poll", POLL_BODY);
            assert_int_equal(agents_http_reply(&s, c, out, sizeof out, &body, 5000), 200);
            close(c);
            if (st == 0)
                bad += (size_t)rest_on(&s, n, w, jobs, in);
            close(w);
            if (st != 0)
                bad += (size_t)next_gets_rest(&s, n, jobs, in);
        }
        agents_http_stop(&s);
        if (!hit)
            break;
    }
    print_message("dispatch sweep: %zu runs, %zu parked requests answered 500\n", n, failed);
    assert_true(failed > 0);
    assert_int_equal(bad, 0);
}

int main(void)
{
    gp_json_init(); /* as the server's main: jansson's allocations counted (gp_json.h) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_work_oom),
        cmocka_unit_test(test_dispatch_parked_oom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
