/* The hand-off of a job to another server (docs/scaling.md 3e), the parts
 * without a database: the wire object an offer carries becomes, on the
 * claimer, a spec whose job sends its agent the same wire (handoff.h);
 * and a remote job's life in jobs.c (gps_jobs_handoff hooks): offered when
 * no agent here serves the model, assigned to the claimer as its
 * pseudo-agent, fed its relayed events, offered again after the claimer's
 * loss while its client saw nothing, ended with AGENT_LOST after output or
 * on a stall, and the end told once. Real registry, scheduler and jobs
 * (fixture_fleet.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture_fleet.h"
#include "server/auth/auth.h"
#include "server/auth/limits.h"
#include "server/handoff.h"
#include "server/jobs/jobs.h"

/* fleet_agent's agent i serving m1 with 2 slots, labelled gpu=<gpu>. */
static void labelled_agent(fleet *f, int i, const char *gpu)
{
    char id[64];
    snprintf(id, sizeof id, "00000000-0000-4000-8000-%012x", (unsigned)i);
    json_t *j = json_pack("{s:s,s:s,s:[{s:s}],s:{s:i},s:{s:s}}", "agent_id", id, "name", "a",
                          "models", "id", "m1", "slots", "total", 2, "labels", "gpu", gpu);
    registry_facts facts;
    char err[160];
    if (registry_facts_parse(j, &facts, err, sizeof err) != 0)
        fail_msg("%s", err);
    json_decref(j);
    assert_non_null(registry_heartbeat(f->reg, &facts, 1000, 0));
    registry_facts_free(&facts);
}

static void test_wire_round_trip(void **state)
{
    (void)state;
    fleet f;
    fleet_init(&f, NULL, NULL);
    fleet_agent(&f, 1, "m1", NULL, 2, 1000);
    gps_job_spec s = fleet_spec("m1", 33);
    s.kind = GPS_JOB_CHAT;
    free(s.prompt);
    s.prompt = NULL;
    s.messages = json_pack("[{s:s,s:s}]", "role", "user", "content", "hi there");
    s.stop = json_pack("[s]", "END");
    s.has_seed = true;
    s.seed = 7;
    s.temperature = 0.5;
    s.top_p = 0.9;
    s.top_k = 40;
    s.user = strdup("u1");
    s.session = strdup("sess");
    s.priority = GPS_PRIO_BATCH;
    s.prompt_tokens_first = true;
    s.tenant_sub = strdup("t1");
    /* What constrains scheduling travels with the offer (issue 28, 3e). */
    s.labels = calloc(1, sizeof *s.labels);
    s.labels[0] = (registry_label){strdup("gpu"), strdup("a100")};
    s.n_labels = 1;
    s.fallback_models[0] = strdup("m2");
    s.n_fallback = 1;
    s.prefer_agent = strdup("00000000-0000-4000-8000-000000000001");
    s.failover = GPS_FAILOVER_RESTART;
    labelled_agent(&f, 1, "a100");
    gps_job *job = fleet_submit(&f, &s);
    json_t *w1 = gps_job_wire(job, gp_now_mono_us(), 60);
    json_object_set_new(w1, "constraints", gps_job_constraints(job));

    gps_job_spec s2;
    char err[160];
    assert_int_equal(gps_handoff_spec_from_wire(w1, &s2, err, sizeof err), 0);
    assert_int_equal(s2.n_labels, 1);
    assert_string_equal(s2.labels[0].key, "gpu");
    assert_string_equal(s2.labels[0].value, "a100");
    assert_int_equal(s2.n_fallback, 1);
    assert_string_equal(s2.fallback_models[0], "m2");
    assert_string_equal(s2.prefer_agent, "00000000-0000-4000-8000-000000000001");
    assert_int_equal(s2.failover, GPS_FAILOVER_RESTART);
    s2.resume_id = strdup("job_000000000000000000000042");
    s2.handoff_proxy = true;
    gps_job *proxy = fleet_submit(&f, &s2);
    assert_string_equal(gps_job_id(proxy), "job_000000000000000000000042");
    json_t *w2 = gps_job_wire(proxy, gp_now_mono_us(), 60);
    const char *same[] = {"kind", "model", "params", "messages", "user", "session", "priority",
                          "prompt_tokens_first", "prompt", "continuation"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        if (!json_equal(json_object_get(w1, same[i]), json_object_get(w2, same[i])))
            fail_msg("wire field %s differs", same[i]);
    /* The tenant tag narrows the claimer's own: set, and not the same. */
    const char *t1 = json_string_value(json_object_get(w1, "tenant"));
    const char *t2 = json_string_value(json_object_get(w2, "tenant"));
    assert_non_null(t1);
    assert_non_null(t2);
    assert_string_not_equal(t1, t2);
    /* A proxy is never offered again and is not remote. */
    assert_false(gps_job_remote(proxy));

    json_t *bad = json_pack("{s:s}", "kind", "chat");
    assert_int_equal(gps_handoff_spec_from_wire(bad, &s2, err, sizeof err), -1);
    gps_job_spec_clear(&s2);
    json_decref(bad);
    json_decref(w1);
    json_decref(w2);
    fleet_free(&f);
}

typedef struct hooks_seen {
    int offered, ended, withdraws;
    gps_job *last_ended, *last_withdraw;
    bool peer;
} hooks_seen;

static bool h_can(void *arg, const gps_job *job)
{
    (void)job;
    return ((hooks_seen *)arg)->peer;
}
static bool h_offer(void *arg, gps_job *job)
{
    (void)job;
    ((hooks_seen *)arg)->offered++;
    return true;
}
static bool h_withdraw(void *arg, gps_job *job)
{
    hooks_seen *h = arg;
    h->withdraws++;
    h->last_withdraw = job;
    return true;
}
static void h_ended(void *arg, gps_job *job)
{
    hooks_seen *h = arg;
    h->ended++;
    h->last_ended = job;
}

static int apply(fleet *f, gps_job *job, const char *server, long long seq, const char *events)
{
    json_t *ev = json_loads(events, 0, NULL);
    assert_non_null(ev);
    bool cancel = false;
    long long expected = -1;
    char msg[128];
    int rc = gps_jobs_apply_events(f->jobs, gps_job_id(job), server, seq, ev, &cancel, &expected,
                                   msg, sizeof msg);
    json_decref(ev);
    return rc;
}

static void test_remote_job_life(void **state)
{
    (void)state;
    fleet f;
    fleet_init(&f, NULL, NULL);
    hooks_seen hs = {.peer = false};
    gps_jobs_handoff hk = {.can_offer = h_can, .offer = h_offer, .ended = h_ended, .arg = &hs};
    /* (no withdraw hook: a job queued here is never offered) */
    gps_jobs_set_handoff(f.jobs, &hk);

    /* No peer serves it: refused as before (404). */
    gps_job_spec s = fleet_spec("far", 10);
    gps_submit_err err;
    assert_null(gps_jobs_submit(f.jobs, &s, "c", "", &err));
    assert_int_equal(err.status, 404);
    assert_int_equal(hs.offered, 0);

    hs.peer = true;
    s = fleet_spec("far", 10);
    gps_job *job = fleet_submit(&f, &s);
    assert_true(gps_job_remote(job));
    assert_int_equal(hs.offered, 1);
    assert_int_equal(gps_job_state_of(job), GPS_JOB_QUEUED);
    /* Not this server's pseudo-agent yet: its events are refused. */
    assert_int_equal(apply(&f, job, "srv_b", 0, "[{\"type\":\"token\",\"text\":\"x\"}]"), 409);

    assert_int_equal(gps_jobs_remote_assign(f.jobs, job, "srv_b"), 0);
    assert_int_equal(gps_job_state_of(job), GPS_JOB_ASSIGNED);
    assert_string_equal(gps_job_agent_id(job), "srv_b");
    assert_int_equal(gps_jobs_remote_assign(f.jobs, job, "srv_b"), -1);
    assert_int_equal(apply(&f, job, "srv_b", 0,
                           "[{\"type\":\"started\"},{\"type\":\"token\",\"text\":\"Hi\"}]"),
                     0);
    assert_string_equal(gps_job_text(job), "Hi");
    /* A batch again (re-read): applied once. */
    assert_int_equal(apply(&f, job, "srv_b", 0,
                           "[{\"type\":\"started\"},{\"type\":\"token\",\"text\":\"Hi\"}]"),
                     0);
    assert_string_equal(gps_job_text(job), "Hi");
    assert_int_equal(apply(&f, job, "srv_x", 2, "[{\"type\":\"token\",\"text\":\"!\"}]"), 409);

    /* The claimer is gone and the client saw nothing: offered again. */
    gps_jobs_remote_lost(f.jobs, job, "server_lost");
    assert_int_equal(gps_job_state_of(job), GPS_JOB_QUEUED);
    assert_string_equal(gps_job_text(job), "");
    assert_int_equal(hs.ended, 0);
    assert_int_equal(gps_jobs_remote_assign(f.jobs, job, "srv_c"), 0);
    assert_int_equal(gps_job_attempts(job), 2);
    assert_int_equal(apply(&f, job, "srv_c", 0, "[{\"type\":\"token\",\"text\":\"Yo\"}]"), 0);
    gps_job_mark_output_sent(job);
    /* After output: AGENT_LOST, the end told once. */
    gps_jobs_remote_lost(f.jobs, job, "server_lost");
    assert_int_equal(gps_job_state_of(job), GPS_JOB_FAILED);
    assert_string_equal(gps_job_error_code(job), "AGENT_LOST");
    assert_int_equal(hs.ended, 1);
    assert_ptr_equal(hs.last_ended, job);

    /* A stall seen here ends it even without output; a done one tells
     * its end too. */
    s = fleet_spec("far", 10);
    gps_job *j2 = fleet_submit(&f, &s);
    assert_int_equal(gps_jobs_remote_assign(f.jobs, j2, "srv_b"), 0);
    gps_jobs_remote_lost(f.jobs, j2, "stalled");
    assert_int_equal(gps_job_state_of(j2), GPS_JOB_FAILED);
    assert_int_equal(hs.ended, 2);
    s = fleet_spec("far", 10);
    gps_job *j3 = fleet_submit(&f, &s);
    assert_int_equal(gps_jobs_remote_assign(f.jobs, j3, "srv_b"), 0);
    assert_int_equal(apply(&f, j3, "srv_b", 0,
                           "[{\"type\":\"token\",\"text\":\"ok\"},{\"type\":\"end\","
                           "\"finish_reason\":\"stop\",\"usage\":{\"prompt_tokens\":3,"
                           "\"completion_tokens\":1}}]"),
                     0);
    assert_int_equal(gps_job_state_of(j3), GPS_JOB_DONE);
    assert_int_equal(hs.ended, 3);
    /* Cancelled while waiting for a claim. */
    s = fleet_spec("far", 10);
    gps_job *j4 = fleet_submit(&f, &s);
    gps_jobs_cancel(f.jobs, j4, "client_gone");
    assert_int_equal(hs.ended, 4);
    assert_ptr_equal(hs.last_ended, j4);
    fleet_free(&f);
}

/* What a's poll for one slot gets now: the reply's array (owned), maybe
 * empty (fleet_take wants exactly one job). */
static json_t *take_any(fleet *f, registry_agent *a)
{
    gp_buf t;
    gp_buf_init(&t);
    size_t n = gps_jobs_take_for_agent(f->jobs, a, 1, 0, &t);
    json_t *arr = json_loadb(t.data, t.len, 0, NULL);
    gp_buf_free(&t);
    assert_non_null(arr);
    assert_int_equal(json_array_size(arr), n);
    return arr;
}

/* Issue 28 (3e, a job queued here offered too): m1's one agent here is
 * busy, so a second job waits in this server's queue and is offered while
 * queued. When the agent frees up, the job is not sent to it before the
 * offer's withdraw answers: withdrawn, the agent gets it (its slot was kept
 * ready); claimed first by a peer, it runs there, never here. A job never
 * offered (no peer) dispatches at once, as before; the slot kept for a job
 * a peer took meanwhile goes to the next queued job. */
static void test_queued_offer_first_wins(void **state)
{
    (void)state;
    fleet f;
    fleet_init(&f, NULL, NULL);
    hooks_seen hs = {.peer = false};
    gps_jobs_handoff hk = {.can_offer = h_can, .offer = h_offer, .withdraw = h_withdraw,
                           .ended = h_ended, .arg = &hs};
    gps_jobs_set_handoff(f.jobs, &hk);
    registry_agent *a = fleet_agent(&f, 1, "m1", NULL, 1, 1000);

    gps_job_spec s = fleet_spec("m1", 10);
    gps_job *busy = fleet_submit(&f, &s);
    json_t *w = fleet_take(&f, a); /* the agent's one slot: busy */
    json_decref(w);
    assert_int_equal(hs.offered, 0); /* no peer serves it: never offered */
    hs.peer = true;

    /* Withdrawn: the agent that chose it gets it once the answer comes. */
    s = fleet_spec("m1", 10);
    gps_job *j1 = fleet_submit(&f, &s);
    assert_int_equal(hs.offered, 1);
    assert_false(gps_job_remote(j1));
    assert_int_equal(gps_job_state_of(j1), GPS_JOB_QUEUED);
    assert_int_equal(fleet_apply(&f, busy, a, 0,
                                 "[{\"type\":\"end\",\"finish_reason\":\"stop\",\"usage\":"
                                 "{\"prompt_tokens\":1,\"completion_tokens\":0}}]"),
                     0);
    json_t *got = take_any(&f, a);
    assert_int_equal(json_array_size(got), 0); /* not before the withdraw answers */
    json_decref(got);
    assert_int_equal(hs.withdraws, 1);
    assert_ptr_equal(hs.last_withdraw, j1);
    assert_int_equal(gps_job_state_of(j1), GPS_JOB_QUEUED);
    assert_int_equal(sched_agent_free_slots(f.s, a), 1); /* the slot kept for it */
    int before = f.delivered;
    gps_jobs_offer_withdrawn(f.jobs, j1, true);
    assert_int_equal(f.delivered, before + 1);
    assert_ptr_equal(f.delivered_to, a);
    assert_string_equal(json_string_value(json_object_get(json_array_get(f.delivery, 0),
                                                          "job_id")),
                        gps_job_id(j1));
    assert_int_equal(gps_job_state_of(j1), GPS_JOB_ASSIGNED);
    gps_jobs_offer_withdrawn(f.jobs, j1, true); /* a second answer: no-op */
    assert_int_equal(f.delivered, before + 1);

    /* Claimed first (the withdraw comes too late): it is the peer's, the
     * agent here never gets it. */
    s = fleet_spec("m1", 10);
    gps_job *j2 = fleet_submit(&f, &s);
    assert_int_equal(hs.offered, 2);
    assert_int_equal(fleet_apply(&f, j1, a, 0,
                                 "[{\"type\":\"end\",\"finish_reason\":\"stop\",\"usage\":"
                                 "{\"prompt_tokens\":1,\"completion_tokens\":0}}]"),
                     0);
    got = take_any(&f, a);
    assert_int_equal(json_array_size(got), 0);
    json_decref(got);
    assert_int_equal(hs.withdraws, 2);
    gps_jobs_offer_withdrawn(f.jobs, j2, false);
    assert_true(gps_job_remote(j2));
    assert_int_equal(gps_jobs_remote_assign(f.jobs, j2, "srv_b"), 0);
    assert_string_equal(gps_job_agent_id(j2), "srv_b");
    assert_int_equal(f.delivered, before + 1);

    /* Claimed while still queued here (no local agent chose it yet): it
     * leaves this server's queue; the agent's next poll finds nothing.
     * (The slot j2's withdraw kept: the agent's poll is answered first.) */
    sched_agent_unready(f.s, a);
    s = fleet_spec("m1", 10);
    gps_job *j3 = fleet_submit(&f, &s);
    assert_int_equal(hs.offered, 3);
    assert_int_equal(gps_jobs_remote_assign(f.jobs, j3, "srv_c"), 0);
    assert_true(gps_job_remote(j3));
    got = take_any(&f, a);
    assert_int_equal(json_array_size(got), 0);
    json_decref(got);
    assert_int_equal(hs.withdraws, 2);

    /* Cancelled while its withdraw is under way: its end is told (the row
     * is cancelled), a late answer changes nothing. */
    sched_agent_unready(f.s, a);
    s = fleet_spec("m1", 10);
    gps_job *j4 = fleet_submit(&f, &s);
    got = take_any(&f, a);
    assert_int_equal(json_array_size(got), 0);
    json_decref(got);
    assert_int_equal(hs.withdraws, 3);
    int ended = hs.ended;
    gps_jobs_cancel(f.jobs, j4, "client_gone");
    assert_int_equal(hs.ended, ended + 1);
    gps_jobs_offer_withdrawn(f.jobs, j4, true);
    assert_int_equal(gps_job_state_of(j4), GPS_JOB_CANCELLED);
    assert_int_equal(f.delivered, before + 1);

    /* A withdraw too late: the slot kept for it takes the next job queued
     * for the agent at once (here one never offered), rather than the
     * agent's parked poll waiting for its timeout. */
    sched_agent_unready(f.s, a);
    s = fleet_spec("m1", 10);
    gps_job *j5 = fleet_submit(&f, &s);
    hs.peer = false;
    s = fleet_spec("m1", 10);
    gps_job *j6 = fleet_submit(&f, &s);
    got = take_any(&f, a);
    assert_int_equal(json_array_size(got), 0);
    json_decref(got);
    assert_ptr_equal(hs.last_withdraw, j5);
    gps_jobs_offer_withdrawn(f.jobs, j5, false);
    assert_true(gps_job_remote(j5));
    assert_int_equal(f.delivered, before + 2);
    assert_int_equal(gps_job_state_of(j6), GPS_JOB_ASSIGNED);
    assert_string_equal(gps_job_agent_id(j6), a->id);

    /* j2's claimer is lost before any output: offered again and, an agent
     * here serving m1, queued here too; the agent's next poll withdraws
     * the offer before it gets the job. */
    int nw = hs.withdraws;
    gps_jobs_remote_lost(f.jobs, j2, "server_lost");
    assert_false(gps_job_remote(j2));
    assert_int_equal(gps_job_state_of(j2), GPS_JOB_QUEUED);
    got = take_any(&f, a);
    assert_int_equal(json_array_size(got), 0);
    json_decref(got);
    assert_int_equal(hs.withdraws, nw + 1);
    assert_ptr_equal(hs.last_withdraw, j2);
    gps_jobs_offer_withdrawn(f.jobs, j2, true);
    assert_int_equal(gps_job_state_of(j2), GPS_JOB_ASSIGNED);
    assert_string_equal(gps_job_agent_id(j2), a->id);
    fleet_free(&f);
}

/* Issue 28: a job requeued here after its agent's loss is offered too,
 * as at submit: queued here (another agent here busy), offered and kept
 * in the queue; no agent left here, handed to the peers only. (The code
 * before offered at submit and after a claimer's loss only: the first
 * stayed queued here, the second failed NO_AGENT.) */
static void test_issue28_requeued_job_offered(void **state)
{
    (void)state;
    fleet f;
    fleet_init(&f, NULL, NULL);
    hooks_seen hs = {.peer = false};
    gps_jobs_handoff hk = {.can_offer = h_can, .offer = h_offer, .withdraw = h_withdraw,
                           .ended = h_ended, .arg = &hs};
    gps_jobs_set_handoff(f.jobs, &hk);
    registry_agent *a1 = fleet_agent(&f, 1, "m1", NULL, 1, 1000);
    registry_agent *a2 = fleet_agent(&f, 2, "m1", NULL, 1, 1000);
    gps_job_spec s = fleet_spec("m1", 10);
    gps_job *x = fleet_submit(&f, &s);
    json_decref(fleet_take(&f, a1));
    s = fleet_spec("m1", 10);
    gps_job *y = fleet_submit(&f, &s);
    json_decref(fleet_take(&f, a2));
    assert_int_equal(gps_job_state_of(x), GPS_JOB_ASSIGNED);
    assert_int_equal(gps_job_state_of(y), GPS_JOB_ASSIGNED);
    assert_int_equal(hs.offered, 0); /* no peer then */
    hs.peer = true;

    char id1[64], id2[64];
    snprintf(id1, sizeof id1, "%s", a1->id);
    snprintf(id2, sizeof id2, "%s", a2->id);
    gps_jobs_agent_lost(f.jobs, id1, "test");
    assert_int_equal(gps_job_state_of(x), GPS_JOB_QUEUED);
    assert_false(gps_job_remote(x));
    assert_int_equal(hs.offered, 1);

    gps_jobs_agent_lost(f.jobs, id2, "test");
    assert_int_equal(gps_job_state_of(y), GPS_JOB_QUEUED);
    assert_int_equal(hs.offered, 2);
    assert_int_equal(gps_jobs_remote_assign(f.jobs, y, "srv_b"), 0);
    assert_true(gps_job_remote(y));
    assert_string_equal(gps_job_agent_id(y), "srv_b");
    fleet_free(&f);
}

/* Issue 28: a job let in after its key's max_concurrent hold, and queued
 * here (the agent's slot still busy), is offered too (the code before
 * did not: it waited here only). */
static void test_issue28_let_in_job_offered(void **state)
{
    (void)state;
    fleet f;
    fleet_init(&f, NULL, NULL);
    gps_auth *auth = gps_auth_new(NULL);
    assert_non_null(auth);
    gps_key_spec ks = {.role = GPS_KEY_CLIENT, .name = "k"};
    ks.limits.max_concurrent = 1;
    char key[GPS_AUTH_KEY_LEN + 1], kid[GPS_AUTH_ID_LEN + 1];
    assert_int_equal(gps_auth_key_create_spec(auth, &ks, key, kid), 0);
    gps_limits *lim = gps_limits_new(auth, NULL);
    assert_non_null(lim);
    gps_jobs_set_limits(f.jobs, lim);
    hooks_seen hs = {.peer = false};
    gps_jobs_handoff hk = {.can_offer = h_can, .offer = h_offer, .withdraw = h_withdraw,
                           .ended = h_ended, .arg = &hs};
    gps_jobs_set_handoff(f.jobs, &hk);
    registry_agent *a = fleet_agent(&f, 1, "m1", NULL, 1, 1000);

    gps_submit_err err;
    gps_job_spec s = fleet_spec("m1", 10);
    gps_job *x = gps_jobs_submit(f.jobs, &s, "corr", kid, &err);
    assert_non_null(x);
    json_decref(fleet_take(&f, a));
    assert_int_equal(gps_job_state_of(x), GPS_JOB_ASSIGNED);
    s = fleet_spec("m1", 10);
    gps_job *held = gps_jobs_submit(f.jobs, &s, "corr", kid, &err);
    assert_non_null(held);
    assert_int_equal(hs.offered, 0); /* held for the key: not offered */
    hs.peer = true;

    /* x cancelled: its slot stays taken until the agent says it stopped,
     * the held job is let in and queued here, and offered. */
    gps_jobs_cancel(f.jobs, x, "client_gone");
    assert_int_equal(gps_job_state_of(held), GPS_JOB_QUEUED);
    assert_false(gps_job_remote(held));
    assert_int_equal(hs.offered, 1);
    fleet_free(&f);
    gps_limits_free(lim);
    gps_auth_free(auth);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire_round_trip),
        cmocka_unit_test(test_remote_job_life),
        cmocka_unit_test(test_queued_offer_first_wins),
        cmocka_unit_test(test_issue28_requeued_job_offered),
        cmocka_unit_test(test_issue28_let_in_job_offered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
