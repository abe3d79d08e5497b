/* The hand-off of a job to another server (docs/scaling.md 3e), the parts
 * without a database: the wire object an offer carries becomes, on the
 * claimer, a spec whose job sends its agent the same wire (handoff.h);
 * and a remote job's life in jobs.c (gps_jobs_handoff hooks): offered when
 * no agent here serves the model, assigned to the claimer as its
 * pseudo-agent, fed its relayed events, offered again after the claimer's
 * loss while its client saw nothing, ended with AGENT_LOST after output or
 * on a stall, and the end told once. Real registry, scheduler and jobs
 * (fixture_fleet.h). And, on a real SQLite file two stores share (two
 * servers), what a server reads back of the shared rows (a claimed
 * offer's spec and constraints; the peers' models and free agents; the
 * relayed batches) and what it writes of its own free agents, under a
 * failing allocator (fixture_oom.h arm_beneath: linked with
 * --wrap=malloc,calloc,realloc). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/gp_json.h"
#include "common/gp_util.h"
#include "db_fixture.h"
#include "fixture_fleet.h"
#include "fixture_oom.h"
#include "server/auth/auth.h"
#include "server/auth/limits.h"
#include "server/handoff.h"
#include "server/jobs/jobs.h"
#include "server/store/store.h"

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

/* ---- the shared database, under memory pressure ---- */

/* A prompt long enough that jansson's lexer grows its token buffer for it
 * (a growth that fails drops a byte and the load succeeds, or reads and
 * writes past the buffer). Texts with a \u escape go to jansson's own
 * (checked) load, and hold short strings only: BELL. */
#define HO_PROMPT "Once upon a time, in a datacenter far away, a prompt long enough to grow"
#define HO_BELL "bell\a"

static gps_store *ho_store(const tctx *t, struct event_base *base)
{
    char err[256] = "";
    gps_store_opts o = {.commit_interval_ms = 1};
    gps_store *s = gps_store_open(t->db, base, &o, err, sizeof err);
    if (!s)
        fail_msg("open %s: %s", t->db, err);
    return s;
}

/* Run base's loop for ms milliseconds, or until *flag is set (flag may be
 * NULL). */
static void ho_run(struct event_base *base, int ms, const int *flag)
{
    uint64_t end = gp_now_mono_ms() + (uint64_t)ms;
    while ((!flag || !*flag) && gp_now_mono_ms() < end) {
        struct timeval tv = {0, 1000};
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
}

static void ho_beat_cb(void *arg, int status)
{
    *(int *)arg = status == 0 ? 1 : -1;
}

/* Server id's row, its lease live for an hour. */
static void ho_beat(gps_store *s, struct event_base *base, const char *id)
{
    int done = 0;
    int64_t now = gp_now_wall_ms();
    gps_store_server_row r = {.id = id, .name = id, .version = "1", .pid = 1, .started_at = now,
                              .heartbeat_at = now, .lease_until = now + 3600000};
    assert_int_equal(gps_store_server_beat_async(s, &r, ho_beat_cb, &done), 0);
    ho_run(base, 5000, &done);
    assert_int_equal(done, 1);
}

/* Rows of a cells read, as text ("(null)" for NULL). */
typedef struct ho_cells {
    int calls, status;
    size_t nrows, ncols;
    char cell[4][6][512];
} ho_cells;

static void ho_on_cells(void *arg, int status, const gps_store_cells *res)
{
    ho_cells *c = arg;
    c->calls++;
    c->status = status;
    for (size_t i = 0; res && i < res->nrows && i < 4; i++)
        for (size_t k = 0; k < res->ncols && k < 6; k++) {
            const char *v = res->cell[i * res->ncols + k];
            snprintf(c->cell[i][k], sizeof c->cell[i][k], "%s", v ? v : "(null)");
        }
    c->nrows = res ? res->nrows : 0;
    c->ncols = res ? res->ncols : 0;
}

/* The offer's row and batches: (state, claimed_by, attempt, first_seq,
 * events); no row when it is gone. */
static ho_cells ho_follow(gps_store *s, struct event_base *base, const char *job_id)
{
    ho_cells c = {0};
    assert_int_equal(gps_store_handoff_follow_async(s, job_id, 0, ho_on_cells, &c), 0);
    ho_run(base, 5000, &c.calls);
    assert_int_equal(c.status, 0);
    return c;
}

/* The fleet's deliver callback for the sweeps: the parked poll answered
 * (the fixture's reads the wire text back, with allocations of its own the
 * sweep would count and fail). */
static long long ho_deliver(registry_agent *a, const gp_buf *jobs, void *arg)
{
    (void)jobs;
    fleet *f = arg;
    f->delivered++;
    sched_agent_unready(f->s, a);
    return 0;
}

/* Agent i of f serving model, labelled gpu=<gpu>, one slot, parked (its
 * poll waits: what a claim or a free entry counts). */
static registry_agent *ho_agent(fleet *f, int i, const char *model, const char *gpu)
{
    char id[64];
    snprintf(id, sizeof id, "00000000-0000-4000-8000-%012x", (unsigned)i);
    json_t *j = json_pack("{s:s,s:s,s:[{s:s}],s:{s:i},s:{s:s}}", "agent_id", id, "name", "a",
                          "models", "id", model, "slots", "total", 1, "labels", "gpu", gpu);
    registry_facts facts;
    char err[160];
    if (registry_facts_parse(j, &facts, err, sizeof err) != 0)
        fail_msg("%s", err);
    json_decref(j);
    registry_agent *a = registry_heartbeat(f->reg, &facts, gp_now_mono_ms(), 0);
    registry_facts_free(&facts);
    assert_non_null(a);
    return a;
}

static void ho_park(fleet *f, registry_agent *a)
{
    if (sched_agent_is_ready(f->s, a))
        return;
    gp_buf t;
    gp_buf_init(&t);
    assert_int_equal(gps_jobs_take_for_agent(f->jobs, a, 1, 0, &t), 0);
    gp_buf_free(&t);
    assert_true(sched_agent_is_ready(f->s, a));
}

/* Offer id of model by srvA (its jobs row first), spec as the wire. */
static void ho_offer(gps_store *a, const char *id, const json_t *spec)
{
    int64_t now = gp_now_wall_ms();
    gps_store_job_row r = {.id = id, .api = "openai", .model = "tiny", .status = "queued",
                           .created_at = now};
    assert_int_equal(gps_store_job_insert_owned(a, r, "srvA"), 0);
    assert_int_equal(gps_store_handoff_offer(a, id, "tiny", spec, "srvA", now, now + 600000), 0);
}

/* A claimed offer as the claimer saw it: its proxy job here with the very
 * spec, or (not run) the row waiting still, or claimed with no batch
 * (proxy_new failed: the offering server's stall timer ends it), or with
 * INTERNAL "out of memory" as the job's error: never a spec read short or
 * changed, never a refusal (HANDOFF_FAILED) that blames the offer. Counts
 * in *ran / *refused; false when it is none of those. */
static bool ho_claimed_ok(fleet *fb, gps_store *a, struct event_base *base, const char *id,
                          const char *prompt, const char *user, int *ran, int *refused)
{
    gps_job *job = gps_jobs_find(fb->jobs, id);
    if (job) {
        (*ran)++;
        bool same = job->spec.prompt && strcmp(job->spec.prompt, prompt) == 0 &&
                    job->spec.user && strcmp(job->spec.user, user) == 0 &&
                    job->spec.n_labels == 1 && strcmp(job->spec.labels[0].value, "a100") == 0;
        if (!same)
            print_message("%s ran with prompt '%s', user '%s', %zu label(s)\n", id,
                          job->spec.prompt ? job->spec.prompt : "(none)",
                          job->spec.user ? job->spec.user : "(none)", job->spec.n_labels);
        return same;
    }
    ho_cells c = ho_follow(a, base, id);
    if (c.nrows == 0) {
        print_message("%s: the offer is gone\n", id);
        return false;
    }
    (*refused)++;
    if (strcmp(c.cell[0][0], "waiting") == 0 || strcmp(c.cell[0][4], "(null)") == 0)
        return true;
    json_t *ev = json_loads(c.cell[0][4], 0, NULL);
    const json_t *e0 = json_array_get(ev, 0);
    bool ok = json_array_size(ev) == 1 &&
              strcmp(json_string_value(json_object_get(e0, "code")), "INTERNAL") == 0 &&
              strcmp(json_string_value(json_object_get(e0, "message")), "out of memory") == 0;
    if (!ok)
        print_message("%s: the claimer answered %s\n", id, c.cell[0][4]);
    json_decref(ev);
    return ok;
}

/* The job's end from its agent (frees the agent's slot), or a cancel
 * while it waits. */
static void ho_finish(fleet *f, const char *id)
{
    gps_job *job = gps_jobs_find(f->jobs, id);
    if (!job || gps_job_terminal(job))
        return;
    if (gps_job_state_of(job) == GPS_JOB_QUEUED) {
        gps_jobs_cancel(f->jobs, job, "test");
        return;
    }
    json_t *ev = json_pack("[{s:s,s:s,s:{s:i,s:i}}]", "type", "end", "finish_reason", "stop",
                           "usage", "prompt_tokens", 1, "completion_tokens", 0);
    bool cancel = false;
    long long expected = -1;
    char msg[128];
    assert_int_equal(gps_jobs_apply_events(f->jobs, id, job->agent_id, 0, ev, &cancel,
                                           &expected, msg, sizeof msg),
                     0);
    json_decref(ev);
}

/* The claimer (srvB) on a failing allocator, from its start to its proxy
 * jobs: of three offers of srvA's, X (a long prompt) and Z (a \u escape in
 * its spec and constraints) fit an agent of B's (gpu=a100), Y (gpu=h100)
 * none. Every run: X and Z run here with the very spec, or are not run
 * (waiting still, or claimed and answered INTERNAL "out of memory"); Y is
 * never claimed. The code before read a spec lost to out of memory as one
 * that lacks kind, model or params (HANDOFF_FAILED), kept a prompt with a
 * byte dropped, and read constraints lost as none (Y claimed and run on
 * an agent its labels exclude). */
static void test_claimer_reads_oom(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    assert_non_null(base);
    gps_store *a = ho_store(t, base);
    assert_true(gps_store_has_handoffs(a));
    ho_beat(a, base, "srvA");
    ho_beat(a, base, "srvB");
    fleet fb;
    fleet_init_on(&fb, base, NULL, NULL, NULL);
    gps_jobs_set_deliver(fb.jobs, ho_deliver, &fb);
    registry_agent *ag[2] = {ho_agent(&fb, 1, "tiny", "a100"), ho_agent(&fb, 2, "tiny", "a100")};
    gps_handoff_opts o = {.server_id = "srvB", .period_ms = 2, .models_ms = 3600000,
                          .queue_timeout_sec = 60, .request_timeout_sec = 60};
    size_t bad = 0, n;
    int ran = 0, refused = 0;
    for (n = 1;; n++) {
        char x[40], y[40], z[40];
        snprintf(x, sizeof x, "job_x%zu", n);
        snprintf(y, sizeof y, "job_y%zu", n);
        snprintf(z, sizeof z, "job_z%zu", n);
        json_t *sx = json_pack("{s:s,s:s,s:s,s:{s:i,s:f,s:f},s:s,s:s,s:{s:{s:s}}}", "job_id", x,
                               "kind", "completion", "model", "tiny", "params", "max_tokens", 16,
                               "temperature", 0.0, "top_p", 1.0, "prompt", HO_PROMPT, "user",
                               "u1", "constraints", "labels", "gpu", "a100");
        json_t *sy = json_pack("{s:s,s:s,s:s,s:{s:i},s:s,s:s,s:{s:{s:s}}}", "job_id", y, "kind",
                               "completion", "model", "tiny", "params", "max_tokens", 16,
                               "prompt", "hi", "user", "u1", "constraints", "labels", "gpu",
                               "h100");
        json_t *sz = json_pack("{s:s,s:s,s:s,s:{s:i},s:s,s:s,s:{s:{s:s},s:s}}", "job_id", z,
                               "kind", "completion", "model", "tiny", "params", "max_tokens", 16,
                               "prompt", "hi", "user", HO_BELL, "constraints", "labels", "gpu",
                               "a100", "note", HO_BELL);
        ho_offer(a, x, sx);
        ho_offer(a, y, sy);
        ho_offer(a, z, sz);
        json_decref(sx);
        json_decref(sy);
        json_decref(sz);
        assert_int_equal(gps_store_flush(a), 0);
        for (int i = 0; i < 2; i++)
            ho_park(&fb, ag[i]);
        gps_store *b = ho_store(t, base);

        arm_beneath(n);
        gps_handoff *h = gps_handoff_start(base, b, fb.jobs, &o);
        uint64_t end = gp_now_mono_ms() + 150;
        while (h && !(gps_jobs_find(fb.jobs, x) && gps_jobs_find(fb.jobs, z)) &&
               gp_now_mono_ms() < end)
            ho_run(base, 1, NULL);
        bool hit = disarm();

        ho_run(base, 10, NULL); /* an error batch queued: written */
        gps_handoff_stop(h);
        gps_store_close(b); /* (before the free: its callbacks run until then) */
        gps_handoff_free(h);
        if (!ho_claimed_ok(&fb, a, base, x, HO_PROMPT, "u1", &ran, &refused) ||
            !ho_claimed_ok(&fb, a, base, z, "hi", HO_BELL, &ran, &refused)) {
            print_message("run %zu: a claimed offer read short or refused as the offer's\n", n);
            bad++;
        }
        ho_cells cy = ho_follow(a, base, y);
        if (cy.nrows != 1 || strcmp(cy.cell[0][0], "waiting") != 0) {
            print_message("run %zu: the offer no agent here fits was %s\n", n,
                          cy.nrows ? cy.cell[0][0] : "gone");
            bad++;
        }
        ho_finish(&fb, x);
        ho_finish(&fb, z);
        assert_int_equal(gps_store_handoff_end(a, x, true), 0);
        assert_int_equal(gps_store_handoff_end(a, y, true), 0);
        assert_int_equal(gps_store_handoff_end(a, z, true), 0);
        if (!hit)
            break;
    }
    print_message("claimer sweep: %zu runs, %d proxies ran, %d offers not run\n", n, ran,
                  refused);
    assert_true(n > 50);
    assert_true(refused > 0);
    assert_int_equal(bad, 0);
    fleet_free(&fb);
    gps_store_close(a);
    event_base_free(base);
}

/* The claimer (srvB) on a failing allocator with one agent, one slot
 * free, and three offers of srvA's that it fits: every run, at most one
 * of them is claimed and taken on here (more would wait here for a slot
 * this server does not have, when another server might have run them). The code before
 * counted the slot given to an offer without checking that the count
 * was stored: where it was not, the next offer took the same slot. */
static void test_claimer_slots_oom(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    assert_non_null(base);
    gps_store *a = ho_store(t, base);
    ho_beat(a, base, "srvA");
    ho_beat(a, base, "srvB");
    fleet fb;
    fleet_init_on(&fb, base, NULL, NULL, NULL);
    gps_jobs_set_deliver(fb.jobs, ho_deliver, &fb);
    registry_agent *ag = ho_agent(&fb, 1, "tiny", "a100");
    gps_handoff_opts o = {.server_id = "srvB", .period_ms = 2, .models_ms = 3600000,
                          .queue_timeout_sec = 60, .request_timeout_sec = 60};
    size_t bad = 0, n, claimed_runs = 0;
    for (n = 1;; n++) {
        char id[3][40];
        for (int k = 0; k < 3; k++) {
            snprintf(id[k], sizeof id[k], "job_s%d_%zu", k, n);
            json_t *sp = json_pack("{s:s,s:s,s:s,s:{s:i},s:s,s:{s:{s:s}}}", "job_id", id[k],
                                   "kind", "completion", "model", "tiny", "params",
                                   "max_tokens", 16, "prompt", "hi", "constraints", "labels",
                                   "gpu", "a100");
            ho_offer(a, id[k], sp);
            json_decref(sp);
        }
        assert_int_equal(gps_store_flush(a), 0);
        ho_park(&fb, ag);
        gps_store *b = ho_store(t, base);

        arm_beneath(n);
        gps_handoff *h = gps_handoff_start(base, b, fb.jobs, &o);
        uint64_t end = gp_now_mono_ms() + 100;
        while (h && gp_now_mono_ms() < end && !(gps_jobs_find(fb.jobs, id[0]) ||
                                                gps_jobs_find(fb.jobs, id[1]) ||
                                                gps_jobs_find(fb.jobs, id[2])))
            ho_run(base, 1, NULL);
        bool hit = disarm();

        ho_run(base, 10, NULL); /* a claim in flight: answered */
        gps_handoff_stop(h);
        gps_store_close(b);
        gps_handoff_free(h);
        /* Claimed and taken on here: a job of this server's. (A claim
         * whose job could not be made here is answered INTERNAL, or left
         * to the offering server's stall timer: its slot stays free, and a
         * later claim may take it.) */
        int here = 0, claimed = 0;
        for (int k = 0; k < 3; k++) {
            ho_cells c = ho_follow(a, base, id[k]);
            claimed += c.nrows == 1 && strcmp(c.cell[0][0], "claimed") == 0 &&
                       strcmp(c.cell[0][1], "srvB") == 0;
            here += gps_jobs_find(fb.jobs, id[k]) != NULL;
        }
        if (here > 1) {
            print_message("run %zu: %d offers taken on for one free slot (%d claimed)\n", n,
                          here, claimed);
            bad++;
        }
        claimed_runs += here > 0;
        for (int k = 0; k < 3; k++) {
            ho_finish(&fb, id[k]);
            assert_int_equal(gps_store_handoff_end(a, id[k], true), 0);
        }
        if (!hit)
            break;
    }
    print_message("claimer slots sweep: %zu runs, %zu with an offer taken on\n", n,
                  claimed_runs);
    assert_true(n > 50);
    assert_true(claimed_runs > 0);
    assert_int_equal(bad, 0);
    fleet_free(&fb);
    gps_store_close(a);
    event_base_free(base);
}

/* The agent's events of test_relay_oom: three tokens, then the end. */
static const char *const ho_relay_tokens[3] = {"alpha ", "beta ", "gamma"};

/* Apply evs (an array, built before the sweep arms) as the agent's
 * upload seq of job id, sent again as the agent does while the server
 * answers 500 (out of memory). */
static void ho_agent_sends(fleet *f, const char *id, long long seq, json_t *evs)
{
    for (int i = 0; i < 5; i++) {
        gps_job *job = gps_jobs_find(f->jobs, id);
        if (!job || gps_job_terminal(job))
            break;
        bool cancel = false;
        long long expected = -1;
        char msg[128];
        char agent[64];
        snprintf(agent, sizeof agent, "%s", job->agent_id);
        if (gps_jobs_apply_events(f->jobs, id, agent, seq, evs, &cancel, &expected, msg,
                                  sizeof msg) != 500)
            break;
    }
}

/* What srvB relayed of job id as srvA reads it: false (and why printed)
 * when it has a hole: a token missing or out of order, batches not
 * numbered one after the other, an event after the last, an end after
 * fewer tokens than the agent sent, or an error other than this server's
 * out of memory. *failed: it ended INTERNAL "out of memory". */
static bool ho_relayed_whole(gps_store *a, struct event_base *base, const char *id,
                             bool *failed)
{
    ho_cells c = ho_follow(a, base, id);
    *failed = false;
    if (c.nrows >= 4) {
        print_message("%s: %zu batches (the test reads 4)\n", id, c.nrows);
        return false;
    }
    size_t tokens = 0;
    long long next = -1;
    bool last = false, ok = true;
    for (size_t r = 0; ok && r < c.nrows; r++) {
        if (strcmp(c.cell[r][4], "(null)") == 0)
            continue;
        long long first = atoll(c.cell[r][3]);
        if (next >= 0 && first != next) {
            print_message("%s: a batch from %lld after one up to %lld\n", id, first, next - 1);
            ok = false;
        }
        json_t *evs = json_loads(c.cell[r][4], 0, NULL);
        if (!evs)
            fail_msg("%s: batch %zu reads '%s'", id, r, c.cell[r][4]);
        next = first + (long long)json_array_size(evs);
        for (size_t i = 0; ok && i < json_array_size(evs); i++) {
            const json_t *e = json_array_get(evs, i);
            const char *type = json_string_value(json_object_get(e, "type"));
            const char *text = json_string_value(json_object_get(e, "text"));
            const char *code = json_string_value(json_object_get(e, "code"));
            const char *msg = json_string_value(json_object_get(e, "message"));
            if (last) {
                print_message("%s: a %s event after the last\n", id, type);
                ok = false;
            } else if (strcmp(type, "token") == 0) {
                ok = tokens < 3 && strcmp(text, ho_relay_tokens[tokens]) == 0;
                if (!ok)
                    print_message("%s: token '%s' where token %zu was due\n", id, text, tokens);
                tokens++;
            } else if (strcmp(type, "end") == 0) {
                last = true;
                ok = tokens == 3;
                if (!ok)
                    print_message("%s: the end after %zu of 3 tokens\n", id, tokens);
            } else if (strcmp(type, "error") == 0) {
                last = *failed = true;
                ok = code && msg && strcmp(code, "INTERNAL") == 0 &&
                     strcmp(msg, "out of memory") == 0;
                if (!ok)
                    print_message("%s: error %s '%s'\n", id, code, msg);
            }
        }
        json_decref(evs);
    }
    return ok;
}

/* The claimer (srvB) relaying a claimed job's events back, on a failing
 * allocator from the agent's first token to its end (each upload sent
 * again on 500, as the agent does): every run, srvA reads the tokens the
 * agent sent in order and then the end, or the ones before a failure and
 * then INTERNAL "out of memory" (the job ended here): never a token
 * missing. The code before left an event it could not copy or queue out
 * of the batches, and numbered the next batch on from there: srvA's
 * client lost a token. */
static void test_relay_oom(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    assert_non_null(base);
    gps_store *a = ho_store(t, base);
    ho_beat(a, base, "srvA");
    ho_beat(a, base, "srvB");
    fleet fb;
    fleet_init_on(&fb, base, NULL, NULL, NULL);
    gps_jobs_set_deliver(fb.jobs, ho_deliver, &fb);
    registry_agent *ag = ho_agent(&fb, 1, "tiny", "a100");
    gps_handoff_opts o = {.server_id = "srvB", .period_ms = 2, .models_ms = 3600000,
                          .queue_timeout_sec = 60, .request_timeout_sec = 60};
    size_t bad = 0, n;
    int failed_runs = 0;
    for (n = 1;; n++) {
        char id[40];
        snprintf(id, sizeof id, "job_r%zu", n);
        json_t *sp = json_pack("{s:s,s:s,s:s,s:{s:i},s:s}", "job_id", id, "kind", "completion",
                               "model", "tiny", "params", "max_tokens", 16, "prompt", "hi");
        ho_offer(a, id, sp);
        json_decref(sp);
        assert_int_equal(gps_store_flush(a), 0);
        ho_park(&fb, ag);
        gps_store *b = ho_store(t, base);
        gps_handoff *h = gps_handoff_start(base, b, fb.jobs, &o);
        assert_non_null(h);
        gps_job *job = NULL;
        for (int i = 0; i < 2000 && !job; i++) {
            ho_run(base, 1, NULL);
            job = gps_jobs_find(fb.jobs, id);
        }
        assert_non_null(job);
        assert_int_equal(gps_job_state_of(job), GPS_JOB_ASSIGNED);

        json_t *up[4];
        for (int k = 0; k < 3; k++)
            up[k] = json_pack("[{s:s,s:s}]", "type", "token", "text", ho_relay_tokens[k]);
        up[3] = json_pack("[{s:s,s:s,s:{s:i,s:i}}]", "type", "end", "finish_reason", "stop",
                          "usage", "prompt_tokens", 1, "completion_tokens", 3);
        arm_beneath(n);
        for (int k = 0; k < 4; k++)
            ho_agent_sends(&fb, id, k, up[k]);
        bool hit = disarm();
        for (int k = 0; k < 4; k++)
            json_decref(up[k]);

        ho_run(base, 60, NULL); /* the batches queued: written */
        gps_handoff_stop(h);
        gps_store_close(b);
        gps_handoff_free(h);
        bool failed;
        if (!ho_relayed_whole(a, base, id, &failed)) {
            print_message("run %zu: srvA's client would miss a token\n", n);
            bad++;
        }
        failed_runs += failed;
        ho_finish(&fb, id);
        assert_int_equal(gps_store_handoff_end(a, id, true), 0);
        if (!hit)
            break;
    }
    print_message("relay sweep: %zu runs, %d ended INTERNAL\n", n, failed_runs);
    assert_true(n > 10);
    assert_true(failed_runs > 0);
    assert_int_equal(bad, 0);
    fleet_free(&fb);
    gps_store_close(a);
    event_base_free(base);
}

/* srvA's free entries as the peers read them (the row whose models are
 * the ones srvA's agents serve), new reference, or NULL when none. */
static json_t *ho_free_of_a(gps_store *b, struct event_base *base)
{
    ho_cells c = {0};
    assert_int_equal(gps_store_handoff_peers_async(b, "srvB", gp_now_wall_ms(), ho_on_cells, &c),
                     0);
    ho_run(base, 5000, &c.calls);
    assert_int_equal(c.status, 0);
    assert_int_equal(c.ncols, 2);
    for (size_t i = 0; i < c.nrows; i++)
        if (strstr(c.cell[i][0], "other-model"))
            return strcmp(c.cell[i][1], "(null)") ? J(c.cell[i][1]) : NULL;
    return NULL;
}

/* The peers' models as srvA's jobs see them hold tiny (srvB) and srvC's. */
static bool ho_peers_known(fleet *fa)
{
    const json_t *pm = gps_jobs_peer_models(fa->jobs);
    return json_object_get(pm, "tiny") && json_object_get(pm, "c" HO_BELL);
}

/* The relayed tokens of test_offering_reads_oom. */
static const char *const ho_tokens[3] = {HO_PROMPT, "and a second token, long enough as well",
                                         HO_BELL};

/* A relayed batch of the test's (srvB, attempt 1) for job id from idx. */
static void ho_relay(gps_store *b, struct event_base *base, const char *id, long long idx,
                     json_t *events /* stolen */)
{
    ho_cells c = {0};
    long long first = GPS_HANDOFF_SEQ_BASE + idx;
    assert_int_equal(gps_store_handoff_events_async(b, id, "srvB", 1, first,
                                                    first + (long long)json_array_size(events) - 1,
                                                    events, ho_on_cells, &c),
                     0);
    ho_run(base, 5000, &c.calls);
    assert_int_equal(c.status, 0);
    json_decref(events);
}

/* The offering server (srvA) on a failing allocator, its hand-off running:
 * it follows a job srvB claimed (two relayed batches, one with long
 * tokens, one with a \u escape), reads the peers (srvB serves tiny, srvC
 * a model whose name has a \u escape) and writes its own free agents
 * (two, labels long enough that their key's dump grows). Every run: the
 * job's text is the relayed text once the batches are read (a batch lost
 * to out of memory is read again, never applied changed; one the jobs
 * module could not apply whole for want of memory, 500, is read again
 * and applied from the event it stopped at: never a token lost); the
 * peers' models are never lost (a read lost to out of memory is dropped
 * whole: the jobs of a model missing would be refused 404); srvA's free
 * entries as written are whole or not written. The code before applied a
 * token with a byte dropped, replaced the peers' models with a read short
 * of one, and wrote free entries short of an agent; its jobs module lost a
 * token whose text could not be appended, counting it all the same. */
static void test_offering_reads_oom(void **state)
{
    tctx *t = *state;
    /* srvA runs on base; the test's store (srvB's writes, the reads that
     * check) on a base of its own, so that waiting for them never runs
     * srvA's timers (its follow would read the batches before the sweep
     * arms). */
    struct event_base *base = event_base_new(), *base2 = event_base_new();
    assert_non_null(base);
    assert_non_null(base2);
    gps_store *a = ho_store(t, base), *b = ho_store(t, base2);
    ho_beat(b, base2, "srvA");
    ho_beat(b, base2, "srvB");
    ho_beat(b, base2, "srvC");
    json_t *tiny = json_pack("[s]", "tiny"), *cm = json_pack("[s]", "c" HO_BELL);
    json_t *bfree = json_pack("[{s:[s],s:{},s:i}]", "m", "tiny", "l", "n", 2);
    json_t *cfree = json_pack("[{s:[s],s:{},s:i}]", "m", "c" HO_BELL, "l", "n", 1);
    assert_int_equal(gps_store_server_models(b, "srvB", tiny), 0);
    assert_int_equal(gps_store_server_models(b, "srvC", cm), 0);
    assert_int_equal(gps_store_server_free(b, "srvB", bfree), 0);
    assert_int_equal(gps_store_server_free(b, "srvC", cfree), 0);
    assert_int_equal(gps_store_flush(b), 0);
    json_decref(tiny);
    json_decref(cm);
    json_decref(bfree);
    json_decref(cfree);

    fleet fa;
    fleet_init_on(&fa, base, NULL, NULL, a);
    gps_jobs_set_deliver(fa.jobs, ho_deliver, &fa);
    ho_park(&fa, ho_agent(&fa, 1, "other-model-with-a-rather-long-name",
                          "nvidia-a100-sxm4-80gb-in-the-rack-by-the-window"));
    ho_park(&fa, ho_agent(&fa, 2, "other-model-with-a-rather-long-name",
                          "nvidia-h100-sxm5-80gb-in-the-rack-by-the-door"));
    gps_handoff_opts o = {.server_id = "srvA", .period_ms = 3, .models_ms = 7,
                          .queue_timeout_sec = 60, .request_timeout_sec = 60};
    gps_handoff *h = gps_handoff_start(base, a, fa.jobs, &o);
    assert_non_null(h);
    int known = 0;
    for (int i = 0; i < 500 && !known; i++) {
        ho_run(base, 2, NULL);
        known = ho_peers_known(&fa);
    }
    assert_true(known);
    assert_int_equal(gps_store_flush(a), 0);
    json_t *want_free = ho_free_of_a(b, base2);
    assert_int_equal(json_array_size(want_free), 2);

    const char *want_text = HO_PROMPT "and a second token, long enough as well" HO_BELL;
    size_t bad = 0, n;
    for (n = 1;; n++) {
        gps_job_spec sp = fleet_spec("tiny", 64);
        gps_job *job = fleet_submit(&fa, &sp);
        char id[40];
        snprintf(id, sizeof id, "%s", gps_job_id(job));
        assert_true(gps_job_remote(job));
        assert_int_equal(gps_store_flush(a), 0);
        ho_cells cl = {0};
        json_t *ids = json_pack("[s]", id);
        assert_int_equal(gps_store_handoff_claim_ids_async(b, "srvB", gp_now_wall_ms(), ids,
                                                           ho_on_cells, &cl),
                         0);
        json_decref(ids);
        ho_run(base2, 5000, &cl.calls);
        assert_int_equal(cl.nrows, 1);
        ho_relay(b, base2, id, 0,
                 json_pack("[{s:s,s:s},{s:s,s:s}]", "type", "token", "text", ho_tokens[0],
                           "type", "token", "text", ho_tokens[1]));
        ho_relay(b, base2, id, 2,
                 json_pack("[{s:s,s:s}]", "type", "token", "text", ho_tokens[2]));

        arm_beneath(n);
        uint64_t t0 = gp_now_mono_ms();
        while (gp_now_mono_ms() < t0 + 80 &&
               (gp_now_mono_ms() < t0 + 10 || strcmp(gps_job_text(job), want_text) != 0))
            ho_run(base, 1, NULL);
        bool hit = disarm();

        assert_int_equal(gps_store_flush(a), 0);
        json_t *got_free = ho_free_of_a(b, base2);
        if (!json_equal(got_free, want_free)) {
            print_message("run %zu: srvA's free entries written other than they are\n", n);
            print_diff("free", got_free, want_free);
            bad++;
        }
        json_decref(got_free);
        if (!ho_peers_known(&fa)) {
            print_message("run %zu: the peers' models lost one\n", n);
            bad++;
        }
        for (int i = 0; i < 500 && strcmp(gps_job_text(job), want_text) != 0 &&
                        !gps_job_terminal(job);
             i++)
            ho_run(base, 1, NULL);
        if (strcmp(gps_job_text(job), want_text) != 0) {
            print_message("run %zu: the job's text is '%s' (%s)\n", n, gps_job_text(job),
                          gps_job_terminal(job) ? "ended" : "running");
            bad++;
        }
        gps_jobs_cancel(fa.jobs, job, "test");
        if (!hit)
            break;
    }
    print_message("offering sweep: %zu runs\n", n);
    assert_true(n > 50);
    assert_int_equal(bad, 0);
    json_decref(want_free);
    gps_handoff_stop(h);
    fleet_free(&fa);
    gps_store_close(a);
    gps_store_close(b);
    gps_handoff_free(h);
    event_base_free(base);
    event_base_free(base2);
}

int main(void)
{
    gp_json_init(); /* as the server's main: the checked loads count jansson's failures */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire_round_trip),
        cmocka_unit_test(test_remote_job_life),
        cmocka_unit_test(test_queued_offer_first_wins),
        cmocka_unit_test(test_issue28_requeued_job_offered),
        cmocka_unit_test(test_issue28_let_in_job_offered),
        cmocka_unit_test_setup_teardown(test_claimer_reads_oom, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claimer_slots_oom, setup, teardown),
        cmocka_unit_test_setup_teardown(test_offering_reads_oom, setup, teardown),
        cmocka_unit_test_setup_teardown(test_relay_oom, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
