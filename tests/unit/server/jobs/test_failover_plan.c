/* The failover decision (issue 10 item 9): gps_failover_decide's table
 * (mode x output sent x attempts x where a live agent is -> fail, requeue,
 * continue, fallback, backoff), the backoff's bounds, and the jobs module
 * carrying a plan out with a real registry, scheduler and event loop: a
 * job whose model lost its last agent moves to its fallback model, a
 * repeated failover waits its backoff, a job cancelled in its backoff is
 * never placed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture_fleet.h"
#include "server/jobs/jobs.h"

#define C GPS_FAILOVER_CONTINUE
#define R GPS_FAILOVER_RESTART
#define E GPS_FAILOVER_ERROR

static void test_decide_table(void **st)
{
    (void)st;
    static const struct {
        gps_failover_mode mode;
        bool sent, tools;
        int attempts;
        bool model_live;
        int fallback_live;
        gps_fo_action action;
        int fallback;
        bool waits;
    } t[] = {
        /* nothing sent: a transparent requeue in continue and restart mode */
        {C, false, false, 1, true, -1, GPS_FO_REQUEUE, -1, false},
        {R, false, false, 1, true, -1, GPS_FO_REQUEUE, -1, false},
        /* output sent: continue continues, restart and error fail */
        {C, true, false, 1, true, -1, GPS_FO_CONTINUE, -1, false},
        {R, true, false, 1, true, -1, GPS_FO_FAIL_LOST, -1, false},
        {E, false, false, 1, true, -1, GPS_FO_FAIL_LOST, -1, false},
        {E, true, false, 1, true, 0, GPS_FO_FAIL_LOST, -1, false},
        /* tool call pieces relayed: no retry can be clean */
        {C, false, true, 1, true, -1, GPS_FO_FAIL_LOST, -1, false},
        /* the second and later retries wait a backoff */
        {C, false, false, 2, true, -1, GPS_FO_REQUEUE, -1, true},
        {C, true, false, 2, true, -1, GPS_FO_CONTINUE, -1, true},
        /* attempts used up (max 3) */
        {C, false, false, 3, true, -1, GPS_FO_FAIL_EXHAUSTED, -1, false},
        {C, true, false, 3, false, 1, GPS_FO_FAIL_EXHAUSTED, -1, false},
        {R, true, false, 3, true, -1, GPS_FO_FAIL_LOST, -1, false},
        /* the model's last live agent is gone: the first fallback with one */
        {C, true, false, 1, false, 1, GPS_FO_CONTINUE, 1, false},
        {R, false, false, 1, false, 2, GPS_FO_REQUEUE, 2, false},
        {C, false, false, 2, false, 0, GPS_FO_REQUEUE, 0, true},
        /* a live agent of the model left: it keeps the job (fallback unused) */
        {C, true, false, 1, true, 1, GPS_FO_CONTINUE, -1, false},
        /* no live agent anywhere: stays queued for its model */
        {C, true, false, 1, false, -1, GPS_FO_CONTINUE, -1, false},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        gps_fo_facts f = {.mode = t[i].mode, .output_sent = t[i].sent,
                          .tools_relayed = t[i].tools, .attempts = t[i].attempts,
                          .max_attempts = 3, .model_live = t[i].model_live,
                          .fallback_live = t[i].fallback_live, .backoff_base_ms = 50,
                          .backoff_cap_ms = 2000, .rnd = 12345};
        gps_fo_plan p = gps_failover_decide(&f);
        if (p.action != t[i].action || p.fallback != t[i].fallback ||
            (p.delay_ms > 0) != t[i].waits)
            fail_msg("row %zu: action %d fallback %d delay %lld", i, (int)p.action, p.fallback,
                     p.delay_ms);
    }
}

static void test_backoff_bounds(void **st)
{
    (void)st;
    /* attempt -> [lo, hi] at base 50, cap 2000: d = 50 * 2^(attempts-2)
     * capped, equal jitter in [d/2, d] */
    static const struct {
        int attempts;
        long long lo, hi;
    } t[] = {{0, 0, 0}, {1, 0, 0}, {2, 25, 50}, {3, 50, 100}, {4, 100, 200},
             {7, 800, 1600}, {8, 1000, 2000}, {50, 1000, 2000}};
    static const uint32_t rnds[] = {0, 1, 7, 999, 0x7fffffffu, 0xffffffffu};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        bool lo_seen = false;
        for (size_t r = 0; r < sizeof rnds / sizeof rnds[0]; r++) {
            long long d = gps_failover_backoff_ms(t[i].attempts, 50, 2000, rnds[r]);
            if (d < t[i].lo || d > t[i].hi)
                fail_msg("attempts %d rnd %u: %lld not in [%lld, %lld]", t[i].attempts,
                         rnds[r], d, t[i].lo, t[i].hi);
            lo_seen |= d == t[i].lo;
        }
        assert_true(lo_seen); /* rnd 0 gives the lower bound: the jitter is real */
    }
    /* 0 = off */
    assert_int_equal(gps_failover_backoff_ms(5, 0, 2000, 3), 0);
    assert_int_equal(gps_failover_backoff_ms(5, 50, 0, 3), 0);
}

/* ---- the jobs module carrying a plan out ---- */

#define DA "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define DB "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

typedef struct fx {
    fleet fl;
    char fo_model[32];      /* "model" of the last failover event ("" = none) */
    int failovers;
    int errors;
    bool hold_output;       /* the client sees nothing (a non-streamed reply) */
    char err_code[48];      /* the last error event's code and status */
    int err_status;
} fx;

/* The wire of the last job handed to an agent (delivered or taken). */
#define WIRE(f) json_array_get((f).fl.delivery, 0)

static registry_agent *add_agent(fx *f, int i, const char *model, const char *digest)
{
    return fleet_agent(&f->fl, i, model, digest, 2, 1000);
}

static void fx_init(fx *f, int backoff_base_ms)
{
    memset(f, 0, sizeof *f);
    gps_jobs_opts o = fleet_opts();
    o.max_attempts = 5;
    o.backoff_base_ms = backoff_base_ms;
    o.backoff_cap_ms = 2000;
    fleet_init(&f->fl, &o, NULL);
}

static void fx_free(fx *f) { fleet_free(&f->fl); }

static void on_event(gps_job *job, gps_event_type t, json_t *ev, void *arg)
{
    fx *f = arg;
    if ((t == GPS_EV_TOKEN || t == GPS_EV_TOOL_CALL) && !f->hold_output)
        gps_job_mark_output_sent(job);
    if (t == GPS_EV_FAILOVER) {
        const char *m = json_string_value(json_object_get(ev, "model"));
        snprintf(f->fo_model, sizeof f->fo_model, "%s", m ? m : "");
        f->failovers++;
    }
    if (t == GPS_EV_ERROR) {
        f->errors++;
        const char *c = json_string_value(json_object_get(ev, "code"));
        snprintf(f->err_code, sizeof f->err_code, "%s", c ? c : "");
        f->err_status = (int)json_integer_value(json_object_get(ev, "status"));
    }
}

static gps_job *submit(fx *f, const char *model, const char *fallback)
{
    gps_job_spec s = fleet_spec(model, 20);
    if (fallback) {
        s.fallback_models[0] = strdup(fallback);
        s.n_fallback = 1;
    }
    gps_job *job = fleet_submit(&f->fl, &s);
    assert_int_equal(gps_job_subscribe(job, on_event, f), 0);
    return job;
}

static void take(fx *f, registry_agent *a)
{
    json_decref(f->fl.delivery);
    f->fl.delivery = json_pack("[o]", fleet_take(&f->fl, a));
}

static void apply(fx *f, gps_job *job, registry_agent *a, const char *events)
{
    assert_int_equal(fleet_apply(&f->fl, job, a, job->agent_seq, events), 0);
}

static const char *TOKENS = "[{\"type\":\"started\"},{\"type\":\"token\",\"text\":\"Once\","
                            "\"token_id\":5},{\"type\":\"token\",\"text\":\" upon\","
                            "\"token_id\":6}]";

/* Model A's only agent dies mid-stream; B's agent is free: the job moves
 * to B at once (no queue_timeout wait), continues the text (another file:
 * text continuation), and the dialects see B as the serving model and A
 * as the requested one. */
static void test_fallback_when_model_has_no_live_agent(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, 50);
    registry_agent *a = add_agent(&f, 1, "A", DA);
    registry_agent *b = add_agent(&f, 2, "B", DB);
    gps_job *job = submit(&f, "A", "B");
    take(&f, a);
    apply(&f, job, a, TOKENS);
    assert_int_equal(sched_agent_ready(f.fl.s, b, 1), 0);
    gps_jobs_agent_lost(f.fl.jobs, a->id, "test");
    assert_int_equal(f.failovers, 1);
    assert_string_equal(f.fo_model, "B");
    assert_int_equal(f.fl.delivered, 1);         /* the first retry: at once */
    assert_ptr_equal(f.fl.delivered_to, b);
    assert_string_equal(json_string_value(json_object_get(WIRE(f), "model")), "B");
    assert_string_equal(json_string_value(json_object_get(WIRE(f), "continuation")),
                        "Once upon");
    assert_null(json_object_get(WIRE(f), "continuation_ids"));
    assert_string_equal(job->spec.model, "B");
    assert_string_equal(job->requested_model, "A");
    assert_string_equal(job->continuation_mode, "text");
    /* B's agent finishes it */
    apply(&f, job, b, "[{\"type\":\"token\",\"text\":\" a\"},{\"type\":\"end\","
                      "\"finish_reason\":\"stop\",\"usage\":{\"completion_tokens\":1}}]");
    assert_int_equal(job->state, GPS_JOB_DONE);
    assert_string_equal(job->text.data, "Once upon a");
    assert_int_equal(job->completion_tokens, 3);
    fx_free(&f);
}

/* A live agent of A is left (busy): the job stays with A, queued, even
 * though B's agent is free, until that agent is lost too; and a job
 * already on its fallback moves back to the requested model when the
 * fallback's agent dies. */
static void test_model_with_live_agent_keeps_the_job(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, 50);
    registry_agent *a1 = add_agent(&f, 1, "A", DA);
    registry_agent *a2 = add_agent(&f, 3, "A", DA);
    registry_agent *b = add_agent(&f, 2, "B", DB);
    gps_job *job = submit(&f, "A", "B");
    take(&f, a1);
    apply(&f, job, a1, TOKENS);
    assert_int_equal(sched_agent_ready(f.fl.s, b, 1), 0);
    gps_jobs_agent_lost(f.fl.jobs, a1->id, "test");
    assert_int_equal(f.fl.delivered, 0);
    assert_int_equal(job->state, GPS_JOB_QUEUED);
    assert_string_equal(job->spec.model, "A");
    assert_null(job->requested_model);
    assert_string_equal(f.fo_model, "");
    /* a2 dies too while the job waits in A's queue (a1 is still suspect,
     * as an agent killed a moment ago is): it moves to B */
    registry_mark_suspect(f.fl.reg, a1, 2000, "test");
    gps_jobs_agent_lost(f.fl.jobs, a2->id, "test");
    assert_int_equal(f.fl.delivered, 1);
    assert_ptr_equal(f.fl.delivered_to, b);
    assert_string_equal(job->spec.model, "B");
    assert_string_equal(job->requested_model, "A");
    assert_string_equal(json_string_value(json_object_get(WIRE(f), "model")), "B");
    assert_string_equal(job->continuation_mode, "text");
    /* a job without fallback_models stays queued for its model */
    gps_job *j2 = submit(&f, "A", NULL);
    assert_int_equal(j2->state, GPS_JOB_QUEUED);
    registry_agent *b2 = add_agent(&f, 4, "B", DB);
    assert_int_equal(sched_agent_ready(f.fl.s, b2, 1), 0);
    gps_jobs_agent_lost(f.fl.jobs, a1->id, "test");
    assert_int_equal(j2->state, GPS_JOB_QUEUED);
    assert_string_equal(j2->spec.model, "A");
    sched_agent_unready(f.fl.s, b2);
    fx_free(&f);

    /* submit falls back to B (A has no agent); B's agent dies, A's came:
     * back to the requested model, requested_model cleared */
    fx_init(&f, 0);
    b = add_agent(&f, 2, "B", DB);
    job = submit(&f, "A", "B");
    assert_string_equal(job->spec.model, "B");
    assert_string_equal(job->requested_model, "A");
    take(&f, b);
    apply(&f, job, b, TOKENS);
    a1 = add_agent(&f, 1, "A", DA);
    gps_jobs_agent_lost(f.fl.jobs, b->id, "test");
    assert_string_equal(f.fo_model, "A");
    assert_string_equal(job->spec.model, "A");
    assert_null(job->requested_model);
    take(&f, a1);
    assert_string_equal(json_string_value(json_object_get(WIRE(f), "model")), "A");
    fx_free(&f);
}

/* The second failover waits its backoff (not timed here: the job is not
 * placed before the loop runs its timer, and is placed after); a job
 * cancelled during its backoff is never placed. */
static void test_repeated_failover_waits_backoff(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, 50);
    registry_agent *a = add_agent(&f, 1, "A", DA);
    registry_agent *b = add_agent(&f, 2, "A", DA);
    registry_agent *c = add_agent(&f, 3, "A", DA);
    gps_job *job = submit(&f, "A", NULL);
    take(&f, a);
    assert_int_equal(sched_agent_ready(f.fl.s, b, 1), 0);
    gps_jobs_agent_lost(f.fl.jobs, a->id, "test");
    assert_int_equal(f.fl.delivered, 1);          /* first retry: immediate */
    assert_ptr_equal(f.fl.delivered_to, b);
    assert_int_equal(sched_agent_ready(f.fl.s, c, 1), 0);
    gps_jobs_agent_lost(f.fl.jobs, b->id, "test");
    assert_int_equal(f.fl.delivered, 1);          /* second: waits */
    assert_int_equal(job->state, GPS_JOB_QUEUED);
    assert_true(job->in_backoff);
    for (int i = 0; i < 100 && f.fl.delivered == 1; i++)
        event_base_loop(f.fl.base, EVLOOP_ONCE);
    assert_int_equal(f.fl.delivered, 2);
    assert_ptr_equal(f.fl.delivered_to, c);
    assert_false(job->in_backoff);
    assert_int_equal(job->attempts, 3);

    /* cancelled in its backoff: the timer is gone, nothing is placed */
    registry_agent *d = add_agent(&f, 4, "A", DA);
    gps_jobs_agent_lost(f.fl.jobs, c->id, "test");
    assert_true(job->in_backoff);
    gps_jobs_cancel(f.fl.jobs, job, "client gone");
    assert_false(job->in_backoff);
    assert_int_equal(sched_agent_ready(f.fl.s, d, 1), 0);
    event_base_loop(f.fl.base, EVLOOP_NONBLOCK);
    assert_int_equal(f.fl.delivered, 2);
    assert_int_equal(job->state, GPS_JOB_CANCELLED);
    sched_agent_unready(f.fl.s, d);
    fx_free(&f);
}

/* ---- what happens to an attempt, end to end (jobs.c carrying the plan
 * out): the agent running a job is lost / stalls / drops the job / reports
 * an error, before or after output reached the client, with another agent
 * of the model, a fallback model's agent, or nobody to take it, in each
 * failover mode, with attempts left or used up. docs/architecture.md
 * "Failover" states the rules. ---- */

enum trig { T_LOST, T_STALL, T_DROPPED, T_ERR_UPSTREAM, T_ERR_SHUTDOWN, T_ERR_OOM,
            T_ERR_REQUEST };
enum other { O_NONE, O_SAME, O_FALLBACK };
enum out { QUEUED_AGAIN, ON_OTHER, FAILED };

static bool attempt_over(void *arg)
{
    gps_job *job = arg;
    return job->attempts > 1 || gps_job_terminal(job) || job->state == GPS_JOB_QUEUED;
}

static void test_attempt_outcomes(void **st)
{
    (void)st;
    static const struct {
        const char *name;
        gps_failover_mode mode;
        bool sent;             /* the client saw the tokens (else they were held) */
        bool tool;             /* a tool call piece was relayed */
        enum trig trig;
        enum other other;
        int max_attempts;
        enum out out;
        int status;            /* FAILED: the error's HTTP status and code */
        const char *code;
        bool continues;        /* the next agent gets the text so far */
    } t[] = {
        {"lost before output: requeue", C, false, false, T_LOST, O_SAME, 3, ON_OTHER, 0, NULL,
         false},
        {"lost after output: continue", C, true, false, T_LOST, O_SAME, 3, ON_OTHER, 0, NULL,
         true},
        {"restart, before output", R, false, false, T_LOST, O_SAME, 3, ON_OTHER, 0, NULL,
         false},
        {"restart, after output", R, true, false, T_LOST, O_SAME, 3, FAILED, 502, "AGENT_LOST",
         false},
        {"error mode, before output", E, false, false, T_LOST, O_SAME, 3, FAILED, 502,
         "AGENT_LOST", false},
        {"attempts used up", C, true, false, T_LOST, O_SAME, 1, FAILED, 503, "AGENT_LOST",
         false},
        {"tool call relayed", C, false, true, T_LOST, O_SAME, 3, FAILED, 502, "AGENT_LOST",
         false},
        {"nobody else: waits queued", C, true, false, T_LOST, O_NONE, 3, QUEUED_AGAIN, 0, NULL,
         true},
        {"fallback model takes it", C, true, false, T_LOST, O_FALLBACK, 3, ON_OTHER, 0, NULL,
         true},
        {"stall before output", C, false, false, T_STALL, O_SAME, 3, ON_OTHER, 0, NULL, false},
        {"stall after output, restart", R, true, false, T_STALL, O_SAME, 3, FAILED, 502,
         "AGENT_LOST", false},
        {"dropped by the agent", C, true, false, T_DROPPED, O_SAME, 3, ON_OTHER, 0, NULL, true},
        {"upstream error, other agent", C, true, false, T_ERR_UPSTREAM, O_SAME, 3, ON_OTHER, 0,
         NULL, true},
        {"upstream error, fallback", C, false, false, T_ERR_UPSTREAM, O_FALLBACK, 3, ON_OTHER,
         0, NULL, false},
        {"upstream error, nobody else", C, true, false, T_ERR_UPSTREAM, O_NONE, 3, FAILED, 502,
         "UPSTREAM_ERROR", false},
        {"upstream error after output, restart", R, true, false, T_ERR_UPSTREAM, O_SAME, 3,
         FAILED, 502, "UPSTREAM_ERROR", false},
        {"upstream error, attempts used up", C, false, false, T_ERR_UPSTREAM, O_SAME, 1, FAILED,
         502, "UPSTREAM_ERROR", false},
        {"agent shutdown, nobody else", C, false, false, T_ERR_SHUTDOWN, O_NONE, 3,
         QUEUED_AGAIN, 0, NULL, false},
        {"agent shutdown, error mode", E, false, false, T_ERR_SHUTDOWN, O_SAME, 3, FAILED, 502,
         "AGENT_SHUTDOWN", false},
        {"agent out of memory, other agent", C, true, false, T_ERR_OOM, O_SAME, 3, ON_OTHER, 0,
         NULL, true},
        {"agent out of memory, before output", C, false, false, T_ERR_OOM, O_SAME, 3, ON_OTHER,
         0, NULL, false},
        {"agent out of memory, nobody else", C, true, false, T_ERR_OOM, O_NONE, 3, FAILED, 502,
         "AGENT_OUT_OF_MEMORY", false},
        {"agent out of memory, error mode", E, false, false, T_ERR_OOM, O_SAME, 3, FAILED, 502,
         "AGENT_OUT_OF_MEMORY", false},
        {"the request's own error", C, false, false, T_ERR_REQUEST, O_SAME, 3, FAILED, 400,
         "CONTEXT_OVERFLOW", false},
    };
    static const char *TOOL = "[{\"type\":\"started\"},{\"type\":\"tool_call\",\"index\":0,"
                              "\"id\":\"call_1\",\"name\":\"f\",\"arguments\":\"{\"}]";
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        fx f;
        memset(&f, 0, sizeof f);
        gps_jobs_opts o = fleet_opts();
        o.max_attempts = t[i].max_attempts;
        o.backoff_base_ms = 50;
        o.backoff_cap_ms = 2000;
        if (t[i].trig == T_STALL)
            o.stall_timeout_sec = 1;
        fleet_init(&f.fl, &o, NULL);
        f.hold_output = !t[i].sent;
        registry_agent *a = add_agent(&f, 1, "A", DA);
        registry_agent *other = NULL;
        if (t[i].other == O_SAME)
            other = add_agent(&f, 2, "A", DA);
        else if (t[i].other == O_FALLBACK)
            other = add_agent(&f, 3, "B", DB);
        gps_job_spec sp = fleet_spec("A", 20);
        sp.failover = t[i].mode;
        if (t[i].other == O_FALLBACK) {
            sp.fallback_models[0] = strdup("B");
            sp.n_fallback = 1;
        }
        gps_job *job = fleet_submit(&f.fl, &sp);
        assert_int_equal(gps_job_subscribe(job, on_event, &f), 0);
        json_decref(f.fl.delivery); /* delivered in reply 1 */
        f.fl.delivery = json_pack("[o]", fleet_take_numbered(&f.fl, a, 1));
        apply(&f, job, a, t[i].tool ? TOOL : TOKENS);
        assert_int_equal(job->client_saw_output, t[i].sent);
        if (other)
            assert_int_equal(sched_agent_ready(f.fl.s, other, 1), 0);
        int delivered = f.fl.delivered;
        const char *err_ev = NULL;
        switch (t[i].trig) {
        case T_LOST:
            gps_jobs_agent_lost(f.fl.jobs, a->id, "test");
            break;
        case T_STALL:
            if (!fleet_run_until(&f.fl, attempt_over, job, 10000))
                fail_msg("%s: the stall was never noticed", t[i].name);
            break;
        case T_DROPPED: {
            json_t *none = json_array();
            assert_int_equal(gps_jobs_agent_report(f.fl.jobs, a->id, none, 1), 1);
            json_decref(none);
            break;
        }
        case T_ERR_UPSTREAM:
            err_ev = "[{\"type\":\"error\",\"code\":\"UPSTREAM_ERROR\",\"message\":\"x\"}]";
            break;
        case T_ERR_SHUTDOWN:
            err_ev = "[{\"type\":\"error\",\"code\":\"AGENT_SHUTDOWN\",\"message\":\"x\"}]";
            break;
        case T_ERR_OOM: /* what gpupool-agent sends (src/agent/agent_util.h) */
            err_ev = "[{\"type\":\"error\",\"code\":\"AGENT_OUT_OF_MEMORY\",\"message\":"
                     "\"the agent ran out of memory while queueing the job's output\"}]";
            break;
        case T_ERR_REQUEST:
            err_ev = "[{\"type\":\"error\",\"code\":\"CONTEXT_OVERFLOW\",\"message\":\"x\"}]";
            break;
        }
        if (err_ev)
            apply(&f, job, a, err_ev);

        bool ok = true;
        switch (t[i].out) {
        case ON_OTHER:
            ok = job->state == GPS_JOB_ASSIGNED && f.fl.delivered == delivered + 1 &&
                 f.fl.delivered_to == other && strcmp(job->agent_id, other->id) == 0 &&
                 job->attempts == 2 && f.errors == 0;
            break;
        case QUEUED_AGAIN:
            ok = job->state == GPS_JOB_QUEUED && f.fl.delivered == delivered &&
                 job->agent_id[0] == '\0' && f.errors == 0;
            break;
        case FAILED:
            ok = job->state == GPS_JOB_FAILED && f.errors == 1 &&
                 strcmp(f.err_code, t[i].code) == 0 && f.err_status == t[i].status &&
                 f.fl.delivered == delivered;
            break;
        }
        if (ok && t[i].out != FAILED) {
            /* continue: the text so far stays and is the next attempt's
             * continuation (a failover event says so); requeue: all reset */
            ok = t[i].continues ? strcmp(job->text.data, "Once upon") == 0 &&
                                      job->completion_tokens == 2 && f.failovers == 1
                                : job->text.len == 0 && job->completion_tokens == 0 &&
                                      f.failovers == 0;
            if (ok && t[i].out == ON_OTHER) {
                const char *c = json_string_value(json_object_get(WIRE(f), "continuation"));
                ok = t[i].continues ? c && strcmp(c, "Once upon") == 0 : !c || !*c;
            }
            /* the job serves the model of the agent that took it */
            if (ok && t[i].other == O_FALLBACK)
                ok = strcmp(job->spec.model, "B") == 0 &&
                     strcmp(job->requested_model, "A") == 0;
        }
        if (!ok)
            fail_msg("row %zu (%s): state %s attempts %d agent '%s' delivered %d->%d errors %d "
                     "%s/%d failovers %d text '%s'",
                     i, t[i].name, gps_job_state_name(job->state), job->attempts,
                     job->agent_id, delivered, f.fl.delivered, f.errors, f.err_code,
                     f.err_status, f.failovers, job->text.data ? job->text.data : "");
        if (t[i].out == QUEUED_AGAIN || job->in_backoff)
            gps_jobs_cancel(f.fl.jobs, job, "test over");
        fx_free(&f);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decide_table),
        cmocka_unit_test(test_backoff_bounds),
        cmocka_unit_test(test_fallback_when_model_has_no_live_agent),
        cmocka_unit_test(test_model_with_live_agent_keeps_the_job),
        cmocka_unit_test(test_repeated_failover_waits_backoff),
        cmocka_unit_test(test_attempt_outcomes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
