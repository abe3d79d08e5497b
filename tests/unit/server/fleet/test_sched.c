/*
 * Unit tests for the scheduler: round-robin order, model/alias/label
 * matching, prefer_agent, affinity TTL, weighted scores, queue bounds and
 * order, O(1) removal, ready-set membership, tools jobs in a mixed fleet
 * (issue 4), and decision cost with 10 and 10,000 agents (printed, not
 * asserted).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "server/fleet/sched.h"

#define T0 1000000ULL

/* ------------------------------------------------------------ fixture */

typedef struct fx {
    registry *reg;
    sched *s;
} fx;

static void fx_init(fx *f, sched_policy pol, size_t max_queue)
{
    registry_config rc;
    registry_config_default(&rc);
    rc.grace_ms = 0;
    f->reg = registry_create(&rc);
    assert_non_null(f->reg);
    sched_config sc;
    sched_config_default(&sc);
    sc.policy = pol;
    sc.max_queue = max_queue;
    f->s = sched_create(f->reg, &sc);
    assert_non_null(f->s);
}

static void fx_free(fx *f)
{
    sched_destroy(f->s);
    registry_destroy(f->reg);
}

static void agent_uuid(int i, char out[37])
{
    snprintf(out, 37, "00000000-0000-4000-8000-%012d", i);
}

/* Register agent i serving `models_json`, with optional labels JSON. */
static registry_agent *add_agent(fx *f, int i, const char *models_json, const char *labels_json,
                                 uint64_t now)
{
    char id[37], body[1024];
    agent_uuid(i, id);
    snprintf(body, sizeof(body),
             "{\"agent_id\":\"%s\",\"name\":\"a%d\",\"models\":%s,\"slots\":{\"total\":4}%s%s}",
             id, i, models_json, labels_json ? ",\"labels\":" : "", labels_json ? labels_json : "");
    json_t *j = json_loads(body, 0, NULL);
    assert_non_null(j);
    registry_facts facts;
    char err[128];
    if (registry_facts_parse(j, &facts, err, sizeof(err)) != 0)
        fail_msg("parse: %s", err);
    json_decref(j);
    registry_agent *a = registry_heartbeat(f->reg, &facts, now, 0);
    registry_facts_free(&facts);
    assert_non_null(a);
    return a;
}

static registry_agent *add_m1(fx *f, int i)
{
    return add_agent(f, i, "[{\"id\":\"m1\"}]", NULL, T0);
}

static void job_init(sched_job *j, const char *model, sched_priority p)
{
    memset(j, 0, sizeof(*j));
    j->model = model;
    j->priority = p;
    j->prefer_strict = -1;
}

static registry_agent *submit_assigned(fx *f, sched_job *j, uint64_t now)
{
    registry_agent *a = NULL;
    sched_result r = sched_submit(f->s, j, now, &a);
    if (r != SCHED_ASSIGNED)
        fail_msg("expected assigned, got %s", sched_result_name(r));
    assert_ptr_equal(j->agent, a);
    return a;
}


/* ---------------------------------------------------- prefix routing */

/* A chat job's messages from a compact list of contents: "s" = the system
 * prompt, anything else a user/assistant turn in order. */
static json_t *conv(const char *const *turns)
{
    json_t *msgs = json_array();
    for (int i = 0; turns[i]; i++) {
        const char *role = strcmp(turns[i], "s") == 0 ? "system" : (i % 2 ? "user" : "assistant");
        if (i == 0 && strcmp(turns[i], "s") != 0)
            role = "user";
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", role, "content", turns[i]));
    }
    json_t *job = json_pack("{s:o}", "messages", msgs);
    assert_non_null(job);
    return job;
}

/* Agent a advertises (one slot) the prompt of turns. */
static void advertise(fx *f, registry_agent *a, const char *const *turns)
{
    json_t *job = conv(turns);
    gp_prefix_chain c;
    assert_int_equal(gp_prefix_chain_of_job(job, &c), 0);
    gp_prefix_desc d;
    gp_prefix_desc_of_chain(&c, &d);
    json_t *pc = json_pack("{s:b,s:[{s:i,s:b,s:i,s:o}]}", "enabled", 1, "slots", "slot", 0,
                           "busy", 0, "tokens", 100, "prefix", gp_prefix_desc_json(&d));
    char err[128];
    assert_int_equal(registry_agent_set_prefix(a, pc, err, sizeof err), 0);
    assert_int_equal(sched_agent_update(f->s, a), 0);
    json_decref(pc);
    json_decref(job);
    gp_prefix_chain_free(&c);
}

typedef struct prefix_row {
    const char *what;
    const char *const *held[3];     /* what agents 0..2 advertise (NULL: nothing) */
    const char *const *request;
    int ready[3];                   /* free slots of each (0: not ready) */
    int want_agent;                 /* index (round robin's first is agent 0) */
    long want_units;
} prefix_row;

static const char *const T_SU1[] = {"s", "u1", NULL};
static const char *const T_SU1A1U2[] = {"s", "u1", "a1", "u2", NULL};
static const char *const T_SU1A1U2A2U3[] = {"s", "u1", "a1", "u2", "a2", "u3", NULL};
static const char *const T_SUX[] = {"s", "ux", NULL};
static const char *const T_U1[] = {"u1", NULL};
static const char *const T_U1A1U2[] = {"u1", "a1", "u2", NULL};

static void test_prefix_routing_table(void **st)
{
    (void)st;
    static const prefix_row rows[] = {
        {"next turn goes where the first ran", {NULL, T_SU1, NULL}, T_SU1A1U2, {1, 1, 1}, 1, 2},
        {"the deepest holder wins", {T_SU1, NULL, T_SU1A1U2}, T_SU1A1U2A2U3, {1, 1, 1}, 2, 4},
        {"a shared system prompt alone does not route", {NULL, T_SUX, NULL}, T_SU1, {1, 1, 1},
         0, 0},
        {"a one-message previous turn routes (whole chain held)", {NULL, NULL, T_U1},
         T_U1A1U2, {1, 1, 1}, 2, 1},
        {"the holder without a free slot is skipped", {NULL, T_SU1, NULL}, T_SU1A1U2, {1, 0, 1},
         0, 0},
        {"a shallower holder serves when the deepest is busy", {T_SU1, NULL, T_SU1A1U2},
         T_SU1A1U2A2U3, {1, 1, 0}, 0, 2},
        {"nothing held: policy", {NULL, NULL, NULL}, T_SU1A1U2, {1, 1, 1}, 0, 0},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        const prefix_row *row = &rows[r];
        fx f;
        fx_init(&f, SCHED_ROUND_ROBIN, 100);
        registry_agent *ag[3];
        for (int i = 0; i < 3; i++) {
            ag[i] = add_m1(&f, i);
            if (row->ready[i])
                assert_int_equal(sched_agent_ready(f.s, ag[i], row->ready[i]), 0);
            if (row->held[i])
                advertise(&f, ag[i], row->held[i]);
        }
        json_t *job = conv(row->request);
        gp_prefix_chain c;
        assert_int_equal(gp_prefix_chain_of_job(job, &c), 0);
        sched_job j;
        job_init(&j, "m1", SCHED_INTERACTIVE);
        j.prefix = &c;
        registry_agent *a = submit_assigned(&f, &j, T0);
        if (j.prefix_units != row->want_units || a != ag[row->want_agent])
            fail_msg("row '%s': got units %ld", row->what, j.prefix_units);
        gp_prefix_chain_free(&c);
        json_decref(job);
        fx_free(&f);
    }
}

/* Equal holders take turns; prefix_routing off ignores what is held; an
 * agent forgotten by the scheduler leaves the index. */
static void test_prefix_routing_rotation_and_off(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, SCHED_ROUND_ROBIN, 100);
    registry_agent *ag[3];
    for (int i = 0; i < 3; i++) {
        ag[i] = add_m1(&f, i);
        assert_int_equal(sched_agent_ready(f.s, ag[i], 4), 0);
    }
    advertise(&f, ag[0], T_SU1);
    advertise(&f, ag[2], T_SU1);
    assert_int_equal(sched_prefix_entries(f.s), 4); /* points n=1, n=2 of two slots */
    json_t *job = conv(T_SU1A1U2);
    gp_prefix_chain c;
    assert_int_equal(gp_prefix_chain_of_job(job, &c), 0);
    registry_agent *got[4];
    for (int k = 0; k < 4; k++) {
        sched_job j;
        job_init(&j, "m1", SCHED_INTERACTIVE);
        j.prefix = &c;
        got[k] = submit_assigned(&f, &j, T0);
        assert_int_equal(j.prefix_units, 2);
    }
    assert_ptr_equal(got[0], ag[0]);
    assert_ptr_equal(got[1], ag[2]);
    assert_ptr_equal(got[2], ag[0]);
    assert_ptr_equal(got[3], ag[2]);
    sched_agent_forget(f.s, ag[0]);
    assert_int_equal(sched_prefix_entries(f.s), 2);
    fx_free(&f);

    sched_config sc;
    sched_config_default(&sc);
    sc.prefix_routing = false;
    registry_config rc;
    registry_config_default(&rc);
    f.reg = registry_create(&rc);
    f.s = sched_create(f.reg, &sc);
    for (int i = 0; i < 2; i++) {
        ag[i] = add_m1(&f, i);
        assert_int_equal(sched_agent_ready(f.s, ag[i], 4), 0);
    }
    advertise(&f, ag[1], T_SU1);
    assert_int_equal(sched_prefix_entries(f.s), 0);
    sched_job j;
    job_init(&j, "m1", SCHED_INTERACTIVE);
    j.prefix = &c;
    assert_ptr_equal(submit_assigned(&f, &j, T0), ag[0]); /* round robin: first agent */
    assert_int_equal(j.prefix_units, 0);
    gp_prefix_chain_free(&c);
    json_decref(job);
    fx_free(&f);
}

/* -------------------------------------------------------------- tests */

static void test_round_robin_order(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, SCHED_ROUND_ROBIN, 100);
    registry_agent *ag[3];
    for (int i = 0; i < 3; i++) {
        ag[i] = add_m1(&f, i);
        assert_int_equal(sched_agent_ready(f.s, ag[i], 100), 0);
    }
    sched_job jobs[6];
    for (int k = 0; k < 6; k++) {
        job_init(&jobs[k], "m1", SCHED_INTERACTIVE);
        assert_ptr_equal(submit_assigned(&f, &jobs[k], T0), ag[k % 3]);
    }
    /* Same order when every assignment answers the long-poll and the agent
     * parks a new one (the usual case: one job per poll). */
    for (int k = 0; k < 9; k++) {
        sched_job j;
        job_init(&j, "m1", SCHED_INTERACTIVE);
        registry_agent *a = submit_assigned(&f, &j, T0);
        assert_ptr_equal(a, ag[k % 3]);
        sched_agent_unready(f.s, a);
        assert_false(sched_agent_is_ready(f.s, a));
        sched_agent_ready(f.s, a, 1);
    }
    assert_int_equal(ag[0]->active, 2 + 3);
    fx_free(&f);
}

static void test_models_and_aliases(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, SCHED_ROUND_ROBIN, 100);
    registry_agent *a = add_agent(&f, 1, "[{\"id\":\"m1\",\"aliases\":[\"tiny\"]}]", NULL, T0);
    registry_agent *b = add_agent(&f, 2, "[{\"id\":\"m2\"}]", NULL, T0);
    sched_agent_ready(f.s, a, 50);
    sched_agent_ready(f.s, b, 50);
    for (int k = 0; k < 20; k++) {
        sched_job j1, j2, j3;
        job_init(&j1, "m1", SCHED_INTERACTIVE);
        job_init(&j2, "m2", SCHED_BATCH);
        job_init(&j3, "tiny", SCHED_INTERACTIVE);
        assert_ptr_equal(submit_assigned(&f, &j1, T0), a);
        assert_ptr_equal(submit_assigned(&f, &j2, T0), b);
        assert_ptr_equal(submit_assigned(&f, &j3, T0), a);
    }
    /* nobody serves m3 */
    sched_job j;
    job_init(&j, "m3", SCHED_INTERACTIVE);
    assert_int_equal(sched_submit(f.s, &j, T0, NULL), SCHED_NO_AGENT);
    assert_false(registry_model_known(f.reg, "m3"));

    /* queued jobs for m1 and the alias are never pulled by b */
    sched_agent_unready(f.s, a);
    sched_job q1, q2;
    job_init(&q1, "m1", SCHED_INTERACTIVE);
    job_init(&q2, "tiny", SCHED_INTERACTIVE);
    assert_int_equal(sched_submit(f.s, &q1, T0, NULL), SCHED_QUEUED);
    assert_int_equal(sched_submit(f.s, &q2, T0, NULL), SCHED_QUEUED);
    sched_job *out[4];
    assert_int_equal(sched_dispatch(f.s, b, out, 4, T0), 0);
    sched_agent_ready(f.s, a, 4);
    assert_int_equal(sched_dispatch(f.s, a, out, 4, T0 + 10), 2);
    assert_ptr_equal(out[0], &q1);
    assert_ptr_equal(out[1], &q2);
    assert_ptr_equal(q2.agent, a);
    assert_false(sched_job_queued(&q1));
    fx_free(&f);
}

static void test_prefer_agent(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, SCHED_ROUND_ROBIN, 100);
    registry_agent *a = add_m1(&f, 0), *b = add_m1(&f, 1), *c = add_m1(&f, 2);
    sched_agent_ready(f.s, a, 10);
    sched_agent_ready(f.s, b, 10);
    sched_agent_ready(f.s, c, 10);
    sched_job j;
    for (int k = 0; k < 3; k++) {
        job_init(&j, "m1", SCHED_INTERACTIVE);
        j.prefer_agent = c->id;
        assert_ptr_equal(submit_assigned(&f, &j, T0), c);
    }
    /* c not ready: fall back (default) ... */
    sched_agent_unready(f.s, c);
    job_init(&j, "m1", SCHED_INTERACTIVE);
    j.prefer_agent = c->id;
    registry_agent *got = submit_assigned(&f, &j, T0);
    assert_true(got == a || got == b);
    /* ... or wait for it when strict */
    sched_job s1;
    job_init(&s1, "m1", SCHED_INTERACTIVE);
    s1.prefer_agent = c->id;
    s1.prefer_strict = 1;
    assert_int_equal(sched_submit(f.s, &s1, T0, NULL), SCHED_QUEUED);
    sched_job *out[4];
    assert_int_equal(sched_dispatch(f.s, a, out, 4, T0), 0);   /* not for a */
    sched_agent_ready(f.s, c, 2);
    assert_int_equal(sched_dispatch(f.s, c, out, 4, T0), 1);
    assert_ptr_equal(out[0], &s1);
    /* strict preference for an unknown agent: no agent */
    job_init(&s1, "m1", SCHED_INTERACTIVE);
    s1.prefer_agent = "00000000-0000-4000-8000-999999999999";
    s1.prefer_strict = 1;
    assert_int_equal(sched_submit(f.s, &s1, T0, NULL), SCHED_NO_AGENT);
    fx_free(&f);
}

static void test_labels(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, SCHED_ROUND_ROBIN, 100);
    registry_agent *eu = add_agent(&f, 1, "[{\"id\":\"m1\"}]", "{\"region\":\"eu\",\"gpu\":\"4090\"}", T0);
    registry_agent *us = add_agent(&f, 2, "[{\"id\":\"m1\"}]", "{\"region\":\"us\",\"gpu\":\"4090\"}", T0);
    registry_agent *us2 = add_agent(&f, 3, "[{\"id\":\"m1\"}]", "{\"region\":\"us\",\"gpu\":\"a100\"}", T0);
    sched_agent_ready(f.s, eu, 100);
    sched_agent_ready(f.s, us, 100);
    sched_agent_ready(f.s, us2, 100);
    registry_label us_l[] = {{"region", "us"}};
    registry_label us4090[] = {{"region", "us"}, {"gpu", "4090"}};
    registry_label ap[] = {{"region", "ap"}};
    for (int k = 0; k < 10; k++) {
        sched_job j;
        job_init(&j, "m1", SCHED_INTERACTIVE);
        j.labels = us_l;
        j.n_labels = 1;
        registry_agent *got = submit_assigned(&f, &j, T0);
        assert_true(got == us || got == us2);
        job_init(&j, "m1", SCHED_INTERACTIVE);
        j.labels = us4090;
        j.n_labels = 2;
        assert_ptr_equal(submit_assigned(&f, &j, T0), us);
    }
    sched_job q;
    job_init(&q, "m1", SCHED_BATCH);
    q.labels = ap;
    q.n_labels = 1;
    assert_int_equal(sched_submit(f.s, &q, T0, NULL), SCHED_QUEUED);
    sched_job *out[2];
    assert_int_equal(sched_dispatch(f.s, eu, out, 2, T0), 0);
    /* a queued us job goes to a us agent, not eu */
    sched_job q2;
    job_init(&q2, "m1", SCHED_BATCH);
    q2.labels = us_l;
    q2.n_labels = 1;
    sched_agent_unready(f.s, us);
    sched_agent_unready(f.s, us2);
    assert_int_equal(sched_submit(f.s, &q2, T0, NULL), SCHED_QUEUED);
    assert_int_equal(sched_dispatch(f.s, eu, out, 2, T0), 0);
    sched_agent_ready(f.s, us2, 1);
    assert_int_equal(sched_dispatch(f.s, us2, out, 2, T0), 1);
    assert_ptr_equal(out[0], &q2);
    /* exclude_agent (failover retry) */
    sched_job x;
    job_init(&x, "m1", SCHED_INTERACTIVE);
    x.exclude_agent = eu->id;
    sched_agent_ready(f.s, us, 5);
    for (int k = 0; k < 4; k++) {
        job_init(&x, "m1", SCHED_INTERACTIVE);
        x.exclude_agent = eu->id;
        assert_ptr_equal(submit_assigned(&f, &x, T0), us);
    }
    sched_remove(f.s, &q);
    fx_free(&f);
}

static void test_affinity_ttl(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, SCHED_WEIGHTED, 100);
    registry_agent *a = add_m1(&f, 0), *b = add_m1(&f, 1);
    sched_agent_ready(f.s, a, 100);
    sched_agent_ready(f.s, b, 100);
    sched_job j;
    job_init(&j, "m1", SCHED_INTERACTIVE);
    j.session = "user-42";
    registry_agent *first = submit_assigned(&f, &j, T0);
    registry_agent *other = first == a ? b : a;
    assert_string_equal(sched_affinity_get(f.s, "user-42", T0), first->id);
    /* load `first` so that without affinity `other` would win */
    for (int k = 0; k < 3; k++)
        registry_job_begin(f.reg, first);
    sched_job n;
    job_init(&n, "m1", SCHED_INTERACTIVE);
    assert_ptr_equal(submit_assigned(&f, &n, T0 + 1), other);
    registry_job_end(f.reg, other, true, 0);
    /* the session sticks until 5 minutes after its last use */
    job_init(&j, "m1", SCHED_INTERACTIVE);
    j.session = "user-42";
    assert_ptr_equal(submit_assigned(&f, &j, T0 + 299999), first);
    uint64_t last = T0 + 299999;
    assert_non_null(sched_affinity_get(f.s, "user-42", last + 299999));
    assert_null(sched_affinity_get(f.s, "user-42", last + 300000));   /* expired */
    job_init(&j, "m1", SCHED_INTERACTIVE);
    j.session = "user-42";
    assert_ptr_equal(submit_assigned(&f, &j, last + 300000), other);
    /* sched_tick drops expired entries */
    sched_tick(f.s, last + 300000 + 300000);
    assert_null(sched_affinity_get(f.s, "user-42", last + 300001));
    fx_free(&f);
}

static void test_weighted_scores(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, SCHED_WEIGHTED, 100);
    registry_agent *a = add_m1(&f, 0), *b = add_m1(&f, 1);
    /* a: 100 tok/s, idle, 1 done (rel 2/3); b: 50 tok/s, 2 active, 1 done */
    registry_job_begin(f.reg, a);
    registry_job_end(f.reg, a, true, 100.0);
    registry_job_begin(f.reg, b);
    registry_job_end(f.reg, b, true, 50.0);
    registry_job_begin(f.reg, b);
    registry_job_begin(f.reg, b);
    /* default weights 1,1,1,1,2; slots_total 4
     * a: (1-0) + 1/1 + 100/100 + 2/3 = 3.6667
     * b: (1-0.5) + 1/3 + 50/100 + 2/3 = 2.0
     * b with affinity: 4.0 */
    double sa = sched_agent_score(f.s, a, 100.0, false, T0);
    double sb = sched_agent_score(f.s, b, 100.0, false, T0);
    double sba = sched_agent_score(f.s, b, 100.0, true, T0);
    assert_true(sa > 3.6666 && sa < 3.6667);
    assert_true(sb > 1.9999 && sb < 2.0001);
    assert_true(sba > 3.9999 && sba < 4.0001);
    sched_agent_ready(f.s, b, 10);
    sched_agent_ready(f.s, a, 10);
    sched_job j;
    job_init(&j, "m1", SCHED_INTERACTIVE);
    assert_ptr_equal(submit_assigned(&f, &j, T0), a);   /* now a has 1 active */
    /* a: 0.75 + 0.5 + 1 + 2/3 = 2.9167 > b 2.0 */
    job_init(&j, "m1", SCHED_INTERACTIVE);
    assert_ptr_equal(submit_assigned(&f, &j, T0), a);   /* a: 2 active */
    /* a: 0.5 + 1/3 + 1 + 2/3 = 2.5 > 2.0 */
    job_init(&j, "m1", SCHED_INTERACTIVE);
    assert_ptr_equal(submit_assigned(&f, &j, T0), a);   /* a: 3 active */
    /* a: 0.25 + 0.25 + 1 + 2/3 = 2.1667 > 2.0 */
    job_init(&j, "m1", SCHED_INTERACTIVE);
    assert_ptr_equal(submit_assigned(&f, &j, T0), a);   /* a: 4 active */
    /* a: 0 + 0.2 + 1 + 2/3 = 1.8667 < 2.0: b now */
    job_init(&j, "m1", SCHED_INTERACTIVE);
    assert_ptr_equal(submit_assigned(&f, &j, T0), b);
    fx_free(&f);
}

static void test_weighted_ramp(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, SCHED_WEIGHTED, 100);
    registry_agent *a = add_m1(&f, 0), *b = add_m1(&f, 1);
    registry_mark_suspect(f.reg, a, T0 + 1, NULL);
    add_m1(&f, 0);                               /* heartbeat: healthy, ramp from 0 */
    assert_int_equal(a->state, REGISTRY_HEALTHY);
    sched_agent_ready(f.s, a, 10);
    sched_agent_ready(f.s, b, 10);
    assert_true(sched_agent_score(f.s, a, 0, false, T0) == 0.0);
    sched_job j;
    for (int k = 0; k < 3; k++) {                /* b takes it despite load */
        job_init(&j, "m1", SCHED_INTERACTIVE);
        assert_ptr_equal(submit_assigned(&f, &j, T0 + 10), b);
    }
    /* after the ramp a is preferred (b has 3 active) */
    job_init(&j, "m1", SCHED_INTERACTIVE);
    assert_ptr_equal(submit_assigned(&f, &j, T0 + 60000), a);
    fx_free(&f);
}

static void test_queue_bound_and_order(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, SCHED_ROUND_ROBIN, 5);
    registry_agent *a = add_m1(&f, 0);           /* serves m1, not parked */
    sched_job b1, b2, i1, i2, i3, extra;
    job_init(&b1, "m1", SCHED_BATCH);
    job_init(&b2, "m1", SCHED_BATCH);
    job_init(&i1, "m1", SCHED_INTERACTIVE);
    job_init(&i2, "m1", SCHED_INTERACTIVE);
    job_init(&i3, "m1", SCHED_INTERACTIVE);
    job_init(&extra, "m1", SCHED_INTERACTIVE);
    assert_int_equal(sched_submit(f.s, &b1, T0 + 1, NULL), SCHED_QUEUED);
    assert_int_equal(sched_submit(f.s, &b2, T0 + 2, NULL), SCHED_QUEUED);
    assert_int_equal(sched_submit(f.s, &i1, T0 + 3, NULL), SCHED_QUEUED);
    assert_int_equal(sched_submit(f.s, &i2, T0 + 4, NULL), SCHED_QUEUED);
    assert_int_equal(sched_submit(f.s, &i3, T0 + 5, NULL), SCHED_QUEUED);
    /* max_queue + 1th */
    assert_int_equal(sched_submit(f.s, &extra, T0 + 6, NULL), SCHED_QUEUE_FULL);
    assert_false(sched_job_queued(&extra));
    assert_int_equal(sched_queue_depth(f.s, "m1", SCHED_INTERACTIVE), 3);
    assert_int_equal(sched_queue_depth(f.s, "m1", SCHED_BATCH), 2);
    assert_int_equal(sched_queued_total(f.s), 5);
    assert_int_equal(i2.enqueue_ms, T0 + 4);

    /* remove from the middle */
    assert_true(sched_remove(f.s, &i2));
    assert_false(sched_remove(f.s, &i2));
    assert_int_equal(sched_queue_depth(f.s, "m1", SCHED_INTERACTIVE), 2);
    /* a failover job goes to the head of its priority */
    sched_job fo;
    job_init(&fo, "m1", SCHED_BATCH);
    fo.front = true;
    assert_int_equal(sched_submit(f.s, &fo, T0 + 7, NULL), SCHED_QUEUED);

    sched_agent_ready(f.s, a, 3);
    sched_job *out[8];
    assert_int_equal(sched_dispatch(f.s, a, out, 8, T0 + 1000), 3);   /* free slots = 3 */
    assert_ptr_equal(out[0], &i1);                                    /* interactive first */
    assert_ptr_equal(out[1], &i3);                                    /* FIFO */
    assert_ptr_equal(out[2], &fo);                                    /* failover head */
    assert_false(sched_agent_is_ready(f.s, a));                       /* slots used up */
    assert_int_equal(sched_estimated_wait_ms(f.s, "m1") > 0, 1);
    sched_agent_ready(f.s, a, 4);
    assert_int_equal(sched_dispatch(f.s, a, out, 1, T0 + 1000), 1);   /* max respected */
    assert_ptr_equal(out[0], &b1);
    assert_int_equal(sched_dispatch(f.s, a, out, 8, T0 + 1000), 1);
    assert_ptr_equal(out[0], &b2);
    assert_int_equal(sched_queued_total(f.s), 0);
    assert_int_equal(sched_agent_free_slots(f.s, a), 2);
    assert_int_equal(a->active, 5);
    fx_free(&f);
}

static void test_estimated_wait(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, SCHED_ROUND_ROBIN, 10);
    registry_agent *a = add_m1(&f, 0);
    assert_int_equal(sched_estimated_wait_ms(f.s, "m1"), 0);
    sched_job j;
    job_init(&j, "m1", SCHED_INTERACTIVE);
    assert_int_equal(sched_submit(f.s, &j, T0, NULL), SCHED_QUEUED);
    sched_agent_ready(f.s, a, 1);
    sched_job *out[1];
    assert_int_equal(sched_dispatch(f.s, a, out, 1, T0 + 500), 1);
    assert_int_equal(sched_estimated_wait_ms(f.s, "m1"), 500);
    fx_free(&f);
}

static void count_q(void *ud, const char *model, size_t i, size_t b)
{
    size_t *n = ud;
    if (strcmp(model, "m1") == 0)
        n[0] += i, n[1] += b;
}

static void test_ready_membership(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, SCHED_ROUND_ROBIN, 100);
    registry_agent *a = add_m1(&f, 0), *b = add_m1(&f, 1);
    assert_false(sched_agent_is_ready(f.s, a));
    sched_agent_ready(f.s, a, 2);
    assert_true(sched_agent_is_ready(f.s, a));
    assert_int_equal(sched_agent_free_slots(f.s, a), 2);
    sched_job j1, j2, j3;
    job_init(&j1, "m1", SCHED_INTERACTIVE);
    job_init(&j2, "m1", SCHED_INTERACTIVE);
    job_init(&j3, "m1", SCHED_INTERACTIVE);
    assert_ptr_equal(submit_assigned(&f, &j1, T0), a);
    assert_ptr_equal(submit_assigned(&f, &j2, T0), a);
    assert_false(sched_agent_is_ready(f.s, a));          /* slots filled */
    assert_int_equal(sched_submit(f.s, &j3, T0, NULL), SCHED_QUEUED);
    size_t depth[2] = {0, 0};
    sched_foreach_queue(f.s, count_q, depth);
    assert_int_equal(depth[0], 1);

    /* the parked poll of b drops: suspect at once, gets nothing */
    sched_agent_ready(f.s, b, 1);
    sched_agent_unready(f.s, b);
    registry_mark_suspect(f.reg, b, T0 + 5, NULL);
    sched_agent_update(f.s, b);
    assert_false(sched_agent_is_ready(f.s, b));
    sched_job *out[2];
    assert_int_equal(sched_dispatch(f.s, b, out, 2, T0 + 5), 0);

    /* suspect while its poll stays parked (missed heartbeat): leaves the
     * ready set, and comes back on the next heartbeat without re-parking */
    sched_agent_ready(f.s, a, 1);                         /* takes j3 via dispatch */
    assert_int_equal(sched_dispatch(f.s, a, out, 2, T0 + 6), 1);
    assert_ptr_equal(out[0], &j3);
    sched_agent_ready(f.s, a, 1);
    registry_tick(f.reg, T0 + 15001);
    assert_int_equal(a->state, REGISTRY_SUSPECT);
    /* lazily: even without sched_agent_update the suspect agent is skipped */
    sched_job j4;
    job_init(&j4, "m1", SCHED_INTERACTIVE);
    assert_int_equal(sched_submit(f.s, &j4, T0 + 15002, NULL), SCHED_QUEUED);
    assert_false(sched_agent_is_ready(f.s, a));
    add_m1(&f, 0);                                        /* heartbeat */
    sched_agent_update(f.s, a);
    assert_true(sched_agent_is_ready(f.s, a));
    assert_int_equal(sched_dispatch(f.s, a, out, 2, T0 + 15003), 1);
    assert_ptr_equal(out[0], &j4);

    /* draining takes no jobs; a draining-only model has no agent */
    sched_agent_ready(f.s, a, 4);
    registry_set_drain(f.reg, a, true, T0 + 15004);
    sched_agent_update(f.s, a);
    assert_false(sched_agent_is_ready(f.s, a));
    registry_deregister(f.reg, b, T0 + 15004);
    sched_job j5;
    job_init(&j5, "m1", SCHED_INTERACTIVE);
    assert_int_equal(sched_submit(f.s, &j5, T0 + 15005, NULL), SCHED_NO_AGENT);
    assert_true(registry_model_known(f.reg, "m1"));
    registry_set_drain(f.reg, a, false, T0 + 15006);
    sched_agent_update(f.s, a);
    assert_ptr_equal(submit_assigned(&f, &j5, T0 + 15007), a);

    /* model list change: the agent leaves the old model's ready set */
    add_agent(&f, 0, "[{\"id\":\"m9\"}]", NULL, T0 + 15008);
    sched_agent_update(f.s, a);
    sched_job j6;
    job_init(&j6, "m9", SCHED_INTERACTIVE);
    assert_ptr_equal(submit_assigned(&f, &j6, T0 + 15009), a);
    job_init(&j6, "m1", SCHED_INTERACTIVE);
    assert_int_equal(sched_submit(f.s, &j6, T0 + 15010, NULL), SCHED_NO_AGENT);

    /* forget + remove */
    sched_agent_forget(f.s, a);
    assert_null(a->sched_priv);
    registry_remove(f.reg, a);
    fx_free(&f);
}


/* An agent that went suspect without sched_agent_update sits in the middle
 * of the ring: round-robin skips it (and drops it) without losing order. */
static void test_round_robin_lazy_skip(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, SCHED_ROUND_ROBIN, 100);
    registry_agent *a = add_m1(&f, 0), *b = add_m1(&f, 1), *c = add_m1(&f, 2);
    sched_agent_ready(f.s, a, 100);
    sched_agent_ready(f.s, b, 100);
    sched_agent_ready(f.s, c, 100);
    sched_job j;
    job_init(&j, "m1", SCHED_INTERACTIVE);
    assert_ptr_equal(submit_assigned(&f, &j, T0), a);
    registry_mark_suspect(f.reg, b, T0 + 1, NULL);          /* no update call */
    registry_agent *want[] = {c, a, c, a};
    for (int k = 0; k < 4; k++) {
        job_init(&j, "m1", SCHED_INTERACTIVE);
        assert_ptr_equal(submit_assigned(&f, &j, T0 + 2), want[k]);
    }
    assert_false(sched_agent_is_ready(f.s, b));
    /* the same in weighted mode, where every candidate is equal */
    fx_free(&f);
    fx_init(&f, SCHED_WEIGHTED, 100);
    a = add_m1(&f, 0), b = add_m1(&f, 1), c = add_m1(&f, 2);
    sched_agent_ready(f.s, a, 100);
    sched_agent_ready(f.s, b, 100);
    sched_agent_ready(f.s, c, 100);
    registry_mark_suspect(f.reg, b, T0 + 1, NULL);
    for (int k = 0; k < 6; k++) {
        job_init(&j, "m1", SCHED_INTERACTIVE);
        registry_agent *got = submit_assigned(&f, &j, T0 + 2);
        assert_true(got == a || got == c);
        registry_job_end(f.reg, got, true, 0);
    }
    fx_free(&f);
}

/* Destroying the scheduler with jobs still queued detaches them. */
static void test_destroy_with_queued(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, SCHED_ROUND_ROBIN, 100);
    add_m1(&f, 0);
    sched_job j[3];
    for (int k = 0; k < 3; k++) {
        job_init(&j[k], "m1", k == 1 ? SCHED_BATCH : SCHED_INTERACTIVE);
        j[k].session = "s";
        assert_int_equal(sched_submit(f.s, &j[k], T0, NULL), SCHED_QUEUED);
    }
    assert_int_equal(sched_submit(f.s, &j[0], T0, NULL), SCHED_ERROR);  /* already queued */
    sched_job bad;
    job_init(&bad, NULL, SCHED_INTERACTIVE);
    assert_int_equal(sched_submit(f.s, &bad, T0, NULL), SCHED_ERROR);
    fx_free(&f);
    for (int k = 0; k < 3; k++)
        assert_false(sched_job_queued(&j[k]));
}

static void test_parse_names(void **st)
{
    (void)st;
    sched_policy p;
    sched_priority q;
    assert_int_equal(sched_policy_parse("round_robin", &p), 0);
    assert_int_equal(p, SCHED_ROUND_ROBIN);
    assert_int_equal(sched_policy_parse("weighted", &p), 0);
    assert_int_equal(p, SCHED_WEIGHTED);
    assert_int_equal(sched_policy_parse("random", &p), -1);
    assert_int_equal(sched_policy_parse(NULL, &p), -1);
    assert_int_equal(sched_priority_parse("batch", &q), 0);
    assert_int_equal(q, SCHED_BATCH);
    assert_int_equal(sched_priority_parse("interactive", &q), 0);
    assert_int_equal(q, SCHED_INTERACTIVE);
    assert_int_equal(sched_priority_parse("urgent", &q), -1);
    assert_string_equal(sched_result_name(SCHED_QUEUE_FULL), "queue_full");
}

/* ------------------------------------------------- tools (issue 4) */

#define M1_TOOLS "[{\"id\":\"m1\",\"aliases\":[\"tiny\"],\"supports_tools\":true}]"
#define M1_PLAIN "[{\"id\":\"m1\",\"aliases\":[\"tiny\"]}]"

static void tools_job(sched_job *j, const char *model)
{
    job_init(j, model, SCHED_INTERACTIVE);
    j->needs_tools = true;
}

/* Mixed fleet, issue 4: a job with tools only ever reaches an agent whose
 * facts say supports_tools for the model (by id or alias), under both
 * policies; a plain job reaches both. */
static void test_tools_mixed_fleet(void **st)
{
    (void)st;
    sched_policy pols[] = {SCHED_ROUND_ROBIN, SCHED_WEIGHTED};
    for (int p = 0; p < 2; p++) {
        fx f;
        fx_init(&f, pols[p], 100);
        registry_agent *t = add_agent(&f, 1, M1_TOOLS, NULL, T0);
        registry_agent *n = add_agent(&f, 2, M1_PLAIN, NULL, T0);
        assert_true(registry_agent_takes_tools(t, "m1"));
        assert_true(registry_agent_takes_tools(t, "tiny"));
        assert_false(registry_agent_takes_tools(n, "m1"));
        assert_int_equal(registry_model_tools_count(f.reg, "tiny"), 1);
        sched_agent_ready(f.s, t, 1000);
        sched_agent_ready(f.s, n, 1000);
        int on_t = 0, on_n = 0;
        for (int k = 0; k < 20; k++) {
            sched_job j;
            tools_job(&j, k % 2 ? "tiny" : "m1");
            assert_ptr_equal(submit_assigned(&f, &j, T0), t);
            job_init(&j, "m1", SCHED_INTERACTIVE);
            registry_agent *a = submit_assigned(&f, &j, T0);
            on_t += a == t;
            on_n += a == n;
        }
        assert_int_equal(on_t + on_n, 20);
        if (pols[p] == SCHED_ROUND_ROBIN) {      /* plain jobs alternate */
            assert_int_equal(on_t, 10);
            assert_int_equal(on_n, 10);
        } else {                                 /* t is loaded with the tools jobs */
            assert_true(on_n >= on_t);
        }
        fx_free(&f);
    }
}

/* prefer_agent, session affinity, labels and exclude_agent do not take a
 * tools job to an agent without tools. */
static void test_tools_constraints(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, SCHED_WEIGHTED, 100);
    registry_agent *t = add_agent(&f, 1, M1_TOOLS, "{\"zone\":\"eu\"}", T0);
    registry_agent *n = add_agent(&f, 2, M1_PLAIN, "{\"zone\":\"eu\"}", T0);
    sched_agent_ready(f.s, t, 100);
    sched_agent_ready(f.s, n, 100);
    sched_job j;
    /* prefer_agent (fall back) */
    tools_job(&j, "m1");
    j.prefer_agent = n->id;
    assert_ptr_equal(submit_assigned(&f, &j, T0), t);
    /* strict prefer_agent on an agent without tools: no agent */
    tools_job(&j, "m1");
    j.prefer_agent = n->id;
    j.prefer_strict = 1;
    assert_int_equal(sched_submit(f.s, &j, T0, NULL), SCHED_NO_AGENT);
    /* the session's affinity agent does not take tools */
    job_init(&j, "m1", SCHED_INTERACTIVE);
    j.prefer_agent = n->id;
    j.session = "s1";
    assert_ptr_equal(submit_assigned(&f, &j, T0), n);
    assert_string_equal(sched_affinity_get(f.s, "s1", T0), n->id);
    tools_job(&j, "m1");
    j.session = "s1";
    assert_ptr_equal(submit_assigned(&f, &j, T0), t);
    /* labels: the smaller of the label and tools rings, the other checked */
    registry_label eu[] = {{"zone", "eu"}};
    for (int k = 0; k < 4; k++) {
        tools_job(&j, "m1");
        j.labels = eu;
        j.n_labels = 1;
        assert_ptr_equal(submit_assigned(&f, &j, T0), t);
    }
    /* the only tool agent excluded (failover retry): it waits */
    tools_job(&j, "m1");
    j.exclude_agent = t->id;
    assert_int_equal(sched_submit(f.s, &j, T0, NULL), SCHED_QUEUED);
    sched_job *out[2];
    assert_int_equal(sched_dispatch(f.s, n, out, 2, T0), 0);
    sched_remove(f.s, &j);
    fx_free(&f);
}

/* A queued tools job waits for a tool agent to free up; a free agent
 * without tools takes the plain jobs behind it and leaves it queued. */
static void test_tools_queued(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, SCHED_ROUND_ROBIN, 100);
    registry_agent *t = add_agent(&f, 1, M1_TOOLS, NULL, T0);
    registry_agent *n = add_agent(&f, 2, M1_PLAIN, NULL, T0);
    sched_agent_ready(f.s, t, 1);
    sched_job busy, q, p1, p2;
    tools_job(&busy, "m1");
    assert_ptr_equal(submit_assigned(&f, &busy, T0), t);   /* t is busy now */
    tools_job(&q, "m1");
    assert_int_equal(sched_submit(f.s, &q, T0, NULL), SCHED_QUEUED);
    job_init(&p1, "m1", SCHED_INTERACTIVE);
    assert_int_equal(sched_submit(f.s, &p1, T0 + 1, NULL), SCHED_QUEUED);
    /* n parks with two free slots: takes p1, skips q */
    sched_agent_ready(f.s, n, 2);
    sched_job *out[4];
    assert_int_equal(sched_dispatch(f.s, n, out, 4, T0 + 2), 1);
    assert_ptr_equal(out[0], &p1);
    assert_true(sched_job_queued(&q));
    assert_true(sched_agent_is_ready(f.s, n));
    /* n is still ready: a plain job goes there, another tools job queues */
    job_init(&p2, "m1", SCHED_INTERACTIVE);
    assert_ptr_equal(submit_assigned(&f, &p2, T0 + 3), n);
    sched_job q2;
    tools_job(&q2, "m1");
    assert_int_equal(sched_agent_free_slots(f.s, n), 0);
    sched_agent_ready(f.s, n, 3);
    assert_int_equal(sched_submit(f.s, &q2, T0 + 4, NULL), SCHED_QUEUED);
    assert_int_equal(sched_dispatch(f.s, n, out, 4, T0 + 4), 0);
    /* t frees up: it gets both, oldest first */
    sched_agent_ready(f.s, t, 2);
    assert_int_equal(sched_dispatch(f.s, t, out, 4, T0 + 5), 2);
    assert_ptr_equal(out[0], &q);
    assert_ptr_equal(out[1], &q2);
    assert_int_equal(sched_queued_total(f.s), 0);
    fx_free(&f);
}

/* ------------------------------------------ embeddings (issue 26) */

#define M1_EMB "[{\"id\":\"m1\",\"aliases\":[\"tiny\"],\"supports_embeddings\":true}]"

/* An embeddings job only reaches an agent whose facts say
 * supports_embeddings for the model (by id or alias), under both policies
 * and when queued; strict prefer_agent on another agent is NO_AGENT; a
 * plain job still reaches both. */
static void test_embeddings_only_on_capable_agents(void **st)
{
    (void)st;
    sched_policy pols[] = {SCHED_ROUND_ROBIN, SCHED_WEIGHTED};
    for (int p = 0; p < 2; p++) {
        fx f;
        fx_init(&f, pols[p], 100);
        registry_agent *e = add_agent(&f, 1, M1_EMB, NULL, T0);
        registry_agent *n = add_agent(&f, 2, M1_PLAIN, NULL, T0);
        assert_true(registry_agent_takes_embeddings(e, "m1"));
        assert_true(registry_agent_takes_embeddings(e, "tiny"));
        assert_false(registry_agent_takes_embeddings(n, "m1"));
        assert_false(registry_agent_takes_embeddings(e, "other"));
        sched_agent_ready(f.s, e, 1000);
        sched_agent_ready(f.s, n, 1000);
        int on_n = 0;
        for (int k = 0; k < 20; k++) {
            sched_job j;
            job_init(&j, k % 2 ? "tiny" : "m1", SCHED_INTERACTIVE);
            j.needs_embeddings = true;
            assert_ptr_equal(submit_assigned(&f, &j, T0), e);
            job_init(&j, "m1", SCHED_INTERACTIVE);
            on_n += submit_assigned(&f, &j, T0) == n;
        }
        assert_true(on_n > 0);
        sched_job j;
        job_init(&j, "m1", SCHED_INTERACTIVE);
        j.needs_embeddings = true;
        j.prefer_agent = n->id;
        j.prefer_strict = 1;
        assert_int_equal(sched_submit(f.s, &j, T0, NULL), SCHED_NO_AGENT);
        fx_free(&f);
    }

    /* Queued: the agent without embeddings skips the job, the other takes it. */
    fx f;
    fx_init(&f, SCHED_ROUND_ROBIN, 100);
    registry_agent *e = add_agent(&f, 1, M1_EMB, NULL, T0);
    registry_agent *n = add_agent(&f, 2, M1_PLAIN, NULL, T0);
    sched_job q;
    job_init(&q, "m1", SCHED_INTERACTIVE);
    q.needs_embeddings = true;
    assert_int_equal(sched_submit(f.s, &q, T0, NULL), SCHED_QUEUED);
    sched_agent_ready(f.s, n, 2);
    sched_job *out[4];
    assert_int_equal(sched_dispatch(f.s, n, out, 4, T0 + 1), 0);
    assert_true(sched_job_queued(&q));
    sched_agent_ready(f.s, e, 1);
    assert_int_equal(sched_dispatch(f.s, e, out, 4, T0 + 2), 1);
    assert_ptr_equal(out[0], &q);
    fx_free(&f);
}

/* Tool support follows the facts: a tools job gets NO_AGENT when no live
 * agent takes tools for the model (the dialects drop the tools before
 * that), and a heartbeat that adds supports_tools moves the agent into the
 * tools ring. */
static void test_tools_facts_change(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, SCHED_ROUND_ROBIN, 100);
    registry_agent *n = add_agent(&f, 2, M1_PLAIN, NULL, T0);
    sched_agent_ready(f.s, n, 100);
    sched_job j;
    tools_job(&j, "m1");
    assert_int_equal(sched_submit(f.s, &j, T0, NULL), SCHED_NO_AGENT);
    job_init(&j, "m1", SCHED_INTERACTIVE);
    assert_ptr_equal(submit_assigned(&f, &j, T0), n);
    uint32_t gen = n->models_gen;
    add_agent(&f, 2, M1_TOOLS, NULL, T0 + 1);             /* heartbeat */
    assert_int_not_equal(n->models_gen, gen);
    sched_agent_update(f.s, n);
    assert_int_equal(registry_model_tools_count(f.reg, "m1"), 1);
    tools_job(&j, "tiny");
    assert_ptr_equal(submit_assigned(&f, &j, T0 + 1), n);
    /* the tool agent goes suspect: counted as live, so the job waits */
    registry_mark_suspect(f.reg, n, T0 + 2, NULL);
    sched_agent_update(f.s, n);
    tools_job(&j, "m1");
    assert_int_equal(sched_submit(f.s, &j, T0 + 2, NULL), SCHED_QUEUED);
    sched_remove(f.s, &j);
    /* and dead: no agent */
    registry_tick(f.reg, T0 + 90001);
    assert_int_equal(n->state, REGISTRY_DEAD);
    assert_int_equal(registry_model_tools_count(f.reg, "m1"), 0);
    tools_job(&j, "m1");
    assert_int_equal(sched_submit(f.s, &j, T0 + 90002, NULL), SCHED_NO_AGENT);
    fx_free(&f);
}

/* --------------------------------------------------------- decision cost */

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

/* ns per sched_submit decision with n ready agents: the best of 5 batches
 * (the machine is shared; the minimum is the least disturbed figure).
 * Agents keep plenty of free slots so each decision is an immediate
 * assignment. */
static double measure(int n, sched_policy pol, bool labelled, int decisions)
{
    fx f;
    fx_init(&f, pol, 100);
    registry_agent *last = NULL;
    for (int i = 0; i < n; i++) {
        const char *labels = (labelled && i == n - 1) ? "{\"zone\":\"rare\"}" : "{\"zone\":\"common\"}";
        last = add_agent(&f, i, "[{\"id\":\"m1\"}]", labels, T0);
        assert_int_equal(sched_agent_ready(f.s, last, 1 << 30), 0);
    }
    registry_label rare[] = {{"zone", "rare"}};
    sched_job j;
    double best = 1e18;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_ns();
        for (int k = 0; k < decisions; k++) {
            job_init(&j, "m1", SCHED_INTERACTIVE);
            if (labelled) {
                j.labels = rare;
                j.n_labels = 1;
            }
            registry_agent *a = NULL;
            sched_result r = sched_submit(f.s, &j, T0, &a);
            if (r != SCHED_ASSIGNED)
                fail_msg("not assigned: %s", sched_result_name(r));
            if (labelled && a != last)
                fail_msg("label constraint broken");
        }
        double per = (now_ns() - t0) / decisions;
        if (per < best)
            best = per;
    }
    fx_free(&f);
    return best;
}

static void test_decision_cost(void **st)
{
    (void)st;
    const int D = 20000;
    int sizes[] = {10, 10000};
    for (int i = 0; i < 2; i++) {
        printf("sched_submit, %5d ready agents: round_robin %.0f ns, weighted %.0f ns, "
               "label-constrained (1 match) %.0f ns per decision\n",
               sizes[i], measure(sizes[i], SCHED_ROUND_ROBIN, false, D),
               measure(sizes[i], SCHED_WEIGHTED, false, D),
               measure(sizes[i], SCHED_ROUND_ROBIN, true, D));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_robin_order),
        cmocka_unit_test(test_models_and_aliases),
        cmocka_unit_test(test_prefer_agent),
        cmocka_unit_test(test_labels),
        cmocka_unit_test(test_affinity_ttl),
        cmocka_unit_test(test_weighted_scores),
        cmocka_unit_test(test_weighted_ramp),
        cmocka_unit_test(test_queue_bound_and_order),
        cmocka_unit_test(test_estimated_wait),
        cmocka_unit_test(test_ready_membership),
        cmocka_unit_test(test_round_robin_lazy_skip),
        cmocka_unit_test(test_destroy_with_queued),
        cmocka_unit_test(test_parse_names),
        cmocka_unit_test(test_tools_mixed_fleet),
        cmocka_unit_test(test_tools_constraints),
        cmocka_unit_test(test_tools_queued),
        cmocka_unit_test(test_embeddings_only_on_capable_agents),
        cmocka_unit_test(test_tools_facts_change),
        cmocka_unit_test(test_decision_cost),
        cmocka_unit_test(test_prefix_routing_table),
        cmocka_unit_test(test_prefix_routing_rotation_and_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
