/* gps_jobs_submit (jobs.h): a job is assigned at once to a ready agent,
 * queued in order otherwise, refused with the status and code a dialect
 * answers with (404 unknown model, 503 no live agent, 429 queue full: the
 * spec is emptied either way), moved to its first fallback model with
 * capacity, and written to the request log once, with the input that the
 * log keeps (nothing for OpenAI without log_prompts, the dialect's
 * stored_request for a native task). Real registry, scheduler, jobs and
 * SQLite store (fixture_fleet.h, db_fixture.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/event.h>

#include <unistd.h>

#include "common/gp_log.h"
#include "fixture_fleet.h"
#include "server/jobs/jobs.h"
#include "server/metrics.h"
#include "server/store/store.h"

#include "db_fixture.h"

static void test_assigned_at_once_to_a_ready_agent(void **state)
{
    (void)state;
    fleet f;
    fleet_init(&f, NULL, NULL);
    registry_agent *a = fleet_agent(&f, 1, "m1", NULL, 2, 1000);
    assert_int_equal(sched_agent_ready(f.s, a, 1), 0);
    gps_job_spec s = fleet_spec("m1", 12);
    s.has_seed = true;
    s.seed = 77;
    gps_job *job = fleet_submit(&f, &s);
    assert_null(s.model); /* moved in */
    assert_int_equal(job->state, GPS_JOB_ASSIGNED);
    assert_int_equal(job->attempts, 1);
    assert_string_equal(job->agent_id, a->id);
    assert_int_equal(strncmp(job->id, "job_", 4), 0);
    assert_int_equal(strlen(job->id), 4 + 24);
    assert_string_equal(job->correlation_id, "corr");
    assert_ptr_equal(gps_jobs_find(f.jobs, job->id), job);
    /* handed to the parked long-poll in the same call */
    assert_int_equal(f.delivered, 1);
    assert_ptr_equal(f.delivered_to, a);
    json_t *w = json_array_get(f.delivery, 0);
    assert_string_equal(json_string_value(json_object_get(w, "job_id")), job->id);
    assert_string_equal(json_string_value(json_object_get(w, "model")), "m1");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(w, "params"),
                                                        "max_tokens")),
                     12);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(w, "sampler"), "seed")),
                     77);
    assert_int_equal(gps_jobs_agent_assigned(f.jobs, a->id), 1);
    fleet_free(&f);
}

/* Issue 25 finding 3: each key's jobs carry a tenant tag of their own (32
 * hex digits, not the key id), the same for every job of the key, narrowed
 * by x_pool_options.tenant; no key, or prefix_cache_scope pool: no tag. */
static gps_job *submit_as(fleet *f, const char *key_id, const char *sub)
{
    gps_job_spec s = fleet_spec("m1", 4);
    s.tenant_sub = sub ? strdup(sub) : NULL;
    gps_submit_err err;
    gps_job *job = gps_jobs_submit(f->jobs, &s, "corr", key_id, &err);
    assert_non_null(job);
    return job;
}

static void test_tenant_tags(void **state)
{
    (void)state;
    for (int pool = 0; pool < 2; pool++) {
        gps_jobs_opts o = fleet_opts();
        o.prefix_cache_pool = pool;
        fleet f;
        fleet_init(&f, &o, NULL);
        registry_agent *a = fleet_agent(&f, 1, "m1", NULL, 2, 1000);
        (void)a;
        gps_job *k1 = submit_as(&f, "key1", NULL), *k1b = submit_as(&f, "key1", NULL);
        gps_job *k2 = submit_as(&f, "key2", NULL), *k1s = submit_as(&f, "key1", "down");
        gps_job *none = submit_as(&f, "", NULL);
        assert_string_equal(none->tenant, "");
        if (pool) {
            assert_string_equal(k1->tenant, "");
            assert_string_equal(k2->tenant, "");
            assert_string_equal(k1s->tenant, "");
        } else {
            assert_int_equal(strlen(k1->tenant), 32);
            assert_string_equal(k1->tenant, k1b->tenant);
            assert_string_not_equal(k1->tenant, k2->tenant);
            assert_string_not_equal(k1->tenant, k1s->tenant);
            assert_null(strstr(k1->tenant, "key1"));
        }
        json_t *w = gps_job_wire(k1, 0, 60);
        if (pool)
            assert_null(json_object_get(w, "tenant"));
        else
            assert_string_equal(json_string_value(json_object_get(w, "tenant")), k1->tenant);
        json_decref(w);
        w = gps_job_wire(none, 0, 60);
        assert_null(json_object_get(w, "tenant"));
        json_decref(w);
        fleet_free(&f);
    }
}

static void test_queued_in_order_until_an_agent_asks(void **state)
{
    (void)state;
    fleet f;
    fleet_init(&f, NULL, NULL);
    registry_agent *a = fleet_agent(&f, 1, "m1", NULL, 2, 1000);   /* live, not ready */
    gps_job_spec s1 = fleet_spec("m1", 5), s2 = fleet_spec("m1", 5);
    gps_job *j1 = fleet_submit(&f, &s1);
    gps_job *j2 = fleet_submit(&f, &s2);
    assert_int_equal(j1->state, GPS_JOB_QUEUED);
    assert_int_equal(j2->state, GPS_JOB_QUEUED);
    assert_int_equal(j1->attempts, 0);
    assert_string_equal(j1->agent_id, "");
    assert_int_equal(gps_jobs_queue_position(f.jobs, j1), 0);
    assert_int_equal(gps_jobs_queue_position(f.jobs, j2), 1);
    /* Two submits in the same microsecond keep their order. */
    uint64_t created = j2->created_us, queued = j2->queued_since_us;
    j2->created_us = j1->created_us;
    j2->queued_since_us = j1->queued_since_us;
    assert_int_equal(gps_jobs_queue_position(f.jobs, j1), 0);
    assert_int_equal(gps_jobs_queue_position(f.jobs, j2), 1);
    j2->created_us = created;
    j2->queued_since_us = queued;
    assert_int_equal(gps_jobs_active(f.jobs), 2);
    assert_int_equal(f.delivered, 0);
    json_t *w = fleet_take(&f, a);
    assert_string_equal(json_string_value(json_object_get(w, "job_id")), j1->id);
    json_decref(w);
    assert_int_equal(j1->state, GPS_JOB_ASSIGNED);
    assert_int_equal(gps_jobs_queue_position(f.jobs, j2), 0);
    fleet_free(&f);
}

/* Refusals: the status, code and Retry-After a dialect sends. */
static void test_refused(void **state)
{
    (void)state;
    gps_jobs_opts o = fleet_opts();
    o.max_queue = 2;
    o.poll_interval_sec = 4;
    static const struct {
        const char *model;
        int status;
        const char *code;
        bool retry_after;
    } t[] = {
        {"nope", 404, "MODEL_NOT_FOUND", false},   /* no agent ever served it */
        {"gone", 503, "NO_AGENT", true},           /* known, its agent went offline */
        {"m1", 429, "QUEUE_FULL", true},           /* two already queued */
    };
    fleet f;
    fleet_init(&f, &o, NULL);
    fleet_agent(&f, 1, "m1", NULL, 1, 1000);
    registry_agent *g = fleet_agent(&f, 2, "gone", NULL, 1, 1000);
    registry_deregister(f.reg, g, 1000);
    for (int i = 0; i < 2; i++) {
        gps_job_spec s = fleet_spec("m1", 5);
        fleet_submit(&f, &s);
    }
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        gps_job_spec s = fleet_spec(t[i].model, 5);
        gps_submit_err err;
        assert_null(gps_jobs_submit(f.jobs, &s, "corr", "", &err));
        assert_null(s.model);   /* emptied on failure too */
        assert_null(s.prompt);
        assert_string_equal(s.api, "openai");
        if (err.status != t[i].status || strcmp(err.code, t[i].code) != 0 ||
            (err.retry_after_sec > 0) != t[i].retry_after)
            fail_msg("%s: %d %s retry %d", t[i].model, err.status, err.code,
                     err.retry_after_sec);
        assert_non_null(strstr(err.message, t[i].model));
    }
    assert_int_equal(gps_jobs_active(f.jobs), 2);
    fleet_free(&f);
}

/* fallback_models at submit: the first that can take or queue the job
 * serves it; with none, the first model's error is the answer. */
static void test_fallback_at_submit(void **state)
{
    (void)state;
    fleet f;
    fleet_init(&f, NULL, NULL);
    fleet_agent(&f, 1, "B", NULL, 1, 1000);
    fleet_agent(&f, 2, "C", NULL, 1, 1000);
    gps_job_spec s = fleet_spec("A", 5);
    s.fallback_models[0] = strdup("nope");
    s.fallback_models[1] = strdup("C");
    s.fallback_models[2] = strdup("B");
    s.n_fallback = 3;
    gps_job *job = fleet_submit(&f, &s);
    assert_int_equal(job->state, GPS_JOB_QUEUED);
    assert_string_equal(job->spec.model, "C");
    assert_string_equal(job->requested_model, "A");

    gps_job_spec s2 = fleet_spec("A", 5);
    s2.fallback_models[0] = strdup("nope");
    s2.n_fallback = 1;
    gps_submit_err err;
    assert_null(gps_jobs_submit(f.jobs, &s2, "corr", "", &err));
    assert_int_equal(err.status, 404);
    assert_non_null(strstr(err.message, "'A'"));
    fleet_free(&f);
}

/* ---- the request log ---- */

typedef struct row {
    int calls, status;
    char api[16], status_s[16], model[16];
    json_t *request;
} row;

static void row_cb(void *arg, int status, const gps_store_job_info *j)
{
    row *r = arg;
    r->calls++;
    r->status = status;
    if (!j)
        return;
    snprintf(r->api, sizeof r->api, "%s", j->api);
    snprintf(r->status_s, sizeof r->status_s, "%s", j->status);
    snprintf(r->model, sizeof r->model, "%s", j->model);
    r->request = j->request ? json_deep_copy(j->request) : NULL;
}

static bool row_read(void *arg) { return ((row *)arg)->calls > 0; }

static row read_row(fleet *f, gps_store *st, const char *id)
{
    row r = {0};
    assert_int_equal(gps_store_job_get_async(st, id, row_cb, &r), 0);
    assert_true(fleet_run_until(f, row_read, &r, 10000));
    assert_int_equal(r.status, 0);
    return r;
}

static void test_request_log_written_once(void **state)
{
    tctx *t = *state;
    char err[256];
    struct event_base *base = event_base_new();
    gps_store *st = gps_store_open(t->db, base, NULL, err, sizeof err);
    if (!st)
        fail_msg("%s", err);
    fleet f;
    fleet_init_on(&f, base, NULL, NULL, st);
    fleet_agent(&f, 1, "m1", NULL, 1, 1000);

    gps_job_spec so = fleet_spec("m1", 5);                  /* OpenAI, no log_prompts */
    gps_job *jo = fleet_submit(&f, &so);
    gps_job_spec sn = fleet_spec("m1", 6);                  /* native, built by jobs.c */
    sn.api = "native";
    gps_job *jn = fleet_submit(&f, &sn);
    gps_job_spec sb = fleet_spec("m1", 7);                  /* native with its body */
    sb.api = "native";
    json_t *body = json_pack("{s:s,s:s,s:i,s:i,s:f}", "model", "m1", "prompt", "hello",
                             "max_tokens", 7, "seed", 5, "temperature", 0.25);
    sb.stored_request = json_incref(body);
    gps_job *jb = fleet_submit(&f, &sb);
    assert_null(sb.stored_request);
    assert_null(jb->spec.stored_request);   /* taken by the write, not kept */
    assert_int_equal(gps_store_flush(st), 0);
    gps_store_stats stats;
    gps_store_get_stats(st, &stats);
    /* one write per job: the insert (a native body used to be a second) */
    assert_int_equal(stats.ops_committed, 3);
    assert_int_equal(stats.ops_failed, 0);

    row r = read_row(&f, st, jo->id);
    assert_string_equal(r.api, "openai");
    assert_string_equal(r.status_s, "queued");
    assert_string_equal(r.model, "m1");
    assert_null(r.request);
    r = read_row(&f, st, jn->id);
    assert_string_equal(r.api, "native");
    json_t *want = json_pack("{s:s,s:i}", "prompt", "hello", "max_tokens", 6);
    assert_true(json_equal(r.request, want));
    json_decref(want);
    json_decref(r.request);
    r = read_row(&f, st, jb->id);
    assert_true(json_equal(r.request, body));
    json_decref(r.request);
    json_decref(body);

    fleet_free(&f);
    gps_store_close(st);
    event_base_free(base);
}

/* A lost agent ends every job it had, even when each failover finishes the
 * job (failover "error": AGENT_LOST), which moves it from the live list to
 * the finished one while the loss walks the live list; and finished jobs
 * are no longer counted as the agent's. */
static void test_agent_lost_ends_every_job(void **state)
{
    (void)state;
    fleet f;
    fleet_init(&f, NULL, NULL);
    registry_agent *a = fleet_agent(&f, 1, "m1", NULL, 4, 1000);
    gps_job *jobs[3];
    for (int i = 0; i < 3; i++) {
        gps_job_spec s = fleet_spec("m1", 8);
        s.failover = GPS_FAILOVER_ERROR;
        jobs[i] = fleet_submit(&f, &s);
        json_decref(fleet_take(&f, a));
        assert_int_equal(jobs[i]->state, GPS_JOB_ASSIGNED);
    }
    assert_int_equal(gps_jobs_agent_assigned(f.jobs, a->id), 3);
    gps_jobs_agent_lost(f.jobs, a->id, "agent_dead");
    for (int i = 0; i < 3; i++) {
        assert_int_equal(jobs[i]->state, GPS_JOB_FAILED);
        assert_string_equal(jobs[i]->error_code, "AGENT_LOST");
        /* Still findable (late uploads get cancel:true) while kept. */
        assert_ptr_equal(gps_jobs_find(f.jobs, jobs[i]->id), jobs[i]);
    }
    assert_int_equal(gps_jobs_agent_assigned(f.jobs, a->id), 0);
    fleet_free(&f);
}

/* A long-poll with n free slots takes up to n queued jobs in one reply,
 * past the scheduler's batch of 64: a burst reaches its agent in one round
 * trip. */
static void test_one_reply_takes_every_free_slot(void **state)
{
    (void)state;
    fleet f;
    gps_jobs_opts o = fleet_opts();
    o.max_queue = 300;
    fleet_init(&f, &o, NULL);
    registry_agent *a = fleet_agent(&f, 1, "m1", NULL, 1024, 1000);
    for (int i = 0; i < 150; i++) {
        gps_job_spec s = fleet_spec("m1", 8);
        assert_int_equal(fleet_submit(&f, &s)->state, GPS_JOB_QUEUED);
    }
    gp_buf got;
    gp_buf_init(&got);
    assert_int_equal(gps_jobs_take_for_agent(f.jobs, a, 140, 1, &got), 140);
    json_t *arr = json_loadb(got.data, got.len, 0, NULL);
    assert_int_equal(json_array_size(arr), 140);
    json_decref(arr);
    got.len = 0;
    assert_int_equal(gps_jobs_take_for_agent(f.jobs, a, 1024, 2, &got), 10);
    arr = json_loadb(got.data, got.len, 0, NULL);
    assert_int_equal(json_array_size(arr), 10);
    json_decref(arr);
    gp_buf_free(&got);
    assert_int_equal(gps_jobs_agent_assigned(f.jobs, a->id), 150);
    fleet_free(&f);
}

static void keep_sub(gps_job *job, gps_event_type type, json_t *ev, void *arg)
{
    (void)job;
    (void)type;
    (void)ev;
    (void)arg;
}

typedef struct find_arg {
    gps_jobs *jobs;
    char id[40];
} find_arg;

static bool retired(void *arg)
{
    find_arg *fa = arg;
    return gps_jobs_find(fa->jobs, fa->id) == NULL;
}

static int late_upload(gps_jobs *jobs, const char *id, const char *agent_id, bool *cancel)
{
    json_t *evs = json_loads("[{\"type\":\"token\",\"text\":\" late\"}]", 0, NULL);
    long long expected = 0;
    char msg[160];
    int rc = gps_jobs_apply_events(jobs, id, agent_id, 2, evs, cancel, &expected, msg, sizeof msg);
    json_decref(evs);
    return rc;
}

/* Records are bounded in number too (max_records): past it the oldest
 * goes first, and a late upload for it gets 404 JOB_NOT_FOUND (which
 * stops the job on its agent as cancel:true would). */
static void test_records_capped_oldest_first(void **state)
{
    (void)state;
    gps_jobs_opts o = fleet_opts();
    o.max_records = 2;
    fleet f;
    fleet_init(&f, &o, NULL);
    registry_agent *a = fleet_agent(&f, 1, "m1", NULL, 4, 1000);
    find_arg fa[3];
    for (int i = 0; i < 3; i++) {
        gps_job_spec s = fleet_spec("m1", 8);
        gps_job *job = fleet_submit(&f, &s);
        json_decref(fleet_take(&f, a));
        fa[i].jobs = f.jobs;
        snprintf(fa[i].id, sizeof fa[i].id, "%s", job->id);
        assert_int_equal(fleet_apply(&f, job, a, 0,
                                     "[{\"type\":\"end\",\"finish_reason\":\"stop\","
                                     "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":0}}]"),
                         0);
        /* One at a time, so that they retire in this order. */
        assert_true(fleet_run_until(&f, retired, &fa[i], 5000));
    }
    gps_job_state st;
    char agent[64];
    assert_false(gps_jobs_find_record(f.jobs, fa[0].id, &st, agent, sizeof agent));
    assert_true(gps_jobs_find_record(f.jobs, fa[1].id, &st, agent, sizeof agent));
    assert_true(gps_jobs_find_record(f.jobs, fa[2].id, &st, agent, sizeof agent));
    bool cancel = false;
    assert_int_equal(late_upload(f.jobs, fa[0].id, a->id, &cancel), 404);
    assert_int_equal(late_upload(f.jobs, fa[2].id, a->id, &cancel), 0);
    assert_false(cancel);
    gps_metrics *m = gps_metrics_new();
    assert_non_null(m);
    assert_int_equal(gps_metrics_define_server(m), 0);
    gps_jobs_collect(f.jobs, m);
    assert_true(gps_metrics_get(m, "job_records", NULL) == 2.0);
    gps_metrics_free(m);
    fleet_free(&f);
}

/* A finished job nobody reads any more is freed at the next sweep; a
 * record of it (memory that does not grow with the job's size, and a job
 * table that holds only the live jobs) answers a late upload from its
 * agent as the job would have: no cancel for one that ended well, cancel
 * for one that did not, 409 for another agent. One with a live subscriber
 * (a native task replaying from memory) is left whole. */
static void test_finished_jobs_retired_to_records(void **state)
{
    (void)state;
    fleet f;
    fleet_init(&f, NULL, NULL);
    registry_agent *a = fleet_agent(&f, 1, "m1", NULL, 4, 1000);
    gps_job *jobs[3];
    find_arg fa[3];
    for (int i = 0; i < 3; i++) {
        gps_job_spec s = fleet_spec("m1", 8);
        jobs[i] = fleet_submit(&f, &s);
        json_decref(fleet_take(&f, a));
        fa[i].jobs = f.jobs;
        snprintf(fa[i].id, sizeof fa[i].id, "%s", jobs[i]->id);
    }
    assert_int_equal(gps_job_subscribe(jobs[1], keep_sub, NULL), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(fleet_apply(&f, jobs[i], a, 0,
                                     "[{\"type\":\"token\",\"text\":\"Once upon\"},"
                                     "{\"type\":\"end\",\"finish_reason\":\"stop\","
                                     "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}]"),
                         0);
    assert_int_equal(jobs[0]->state, GPS_JOB_DONE);
    gps_jobs_cancel(f.jobs, jobs[2], "client gone");
    assert_true(fleet_run_until(&f, retired, &fa[0], 5000));
    assert_true(retired(&fa[2]));
    bool cancel = true;
    assert_int_equal(late_upload(f.jobs, fa[0].id, a->id, &cancel), 0);
    assert_false(cancel);
    assert_int_equal(late_upload(f.jobs, fa[2].id, a->id, &cancel), 0);
    assert_true(cancel);
    assert_int_equal(late_upload(f.jobs, fa[0].id, "another-agent", &cancel), 409);
    assert_int_equal(late_upload(f.jobs, "job_000000000000000000000000", a->id, &cancel), 404);
    /* What the admin view shows of it (GET /admin/jobs/{id}, no stored row). */
    gps_job_state st;
    char agent[64];
    assert_true(gps_jobs_find_record(f.jobs, fa[2].id, &st, agent, sizeof agent));
    assert_int_equal(st, GPS_JOB_CANCELLED);
    assert_string_equal(agent, a->id);
    assert_false(gps_jobs_find_record(f.jobs, fa[1].id, &st, agent, sizeof agent));
    /* The subscribed one is whole. */
    assert_ptr_equal(gps_jobs_find(f.jobs, fa[1].id), jobs[1]);
    assert_int_equal(jobs[1]->text.len, 9);
    assert_non_null(jobs[1]->spec.prompt);
    /* Once its subscriber has gone, at the next sweep. */
    gps_job_unsubscribe(jobs[1], keep_sub, NULL);
    assert_true(fleet_run_until(&f, retired, &fa[1], 5000));
    assert_true(gps_jobs_find_record(f.jobs, fa[1].id, &st, agent, sizeof agent));
    assert_int_equal(st, GPS_JOB_DONE);
    /* The gauges: three records, no job held whole. */
    gps_metrics *m = gps_metrics_new();
    assert_non_null(m);
    assert_int_equal(gps_metrics_define_server(m), 0);
    gps_jobs_collect(f.jobs, m);
    assert_true(gps_metrics_get(m, "job_records", NULL) == 3.0);
    assert_true(gps_metrics_get(m, "jobs_in_memory", NULL) == 0.0);
    gps_metrics_free(m);
    fleet_free(&f);
}

/* The fields part of the next log line of event ev in the file at *p:
 * what follows "correlation_id":"corr", up to the line's closing brace. */
static char *next_fields(FILE *fp, const char *ev)
{
    static char line[4096];
    char want[64];
    snprintf(want, sizeof want, "\"event\":\"%s\"", ev);
    while (fgets(line, sizeof line, fp))
        if (strstr(line, want)) {
            char *at = strstr(line, "\"correlation_id\":\"corr\",");
            assert_non_null(at);
            at += strlen("\"correlation_id\":\"corr\",");
            char *end = strrchr(at, '}');
            assert_non_null(end);
            *end = '\0';
            return at;
        }
    fail_msg("no %s line", ev);
    return NULL;
}

/* What json_pack's object wrote as those fields (o stolen). */
static void assert_fields(FILE *fp, const char *ev, json_t *o)
{
    assert_non_null(o);
    char *d = json_dumps(o, JSON_COMPACT);
    d[strlen(d) - 1] = '\0';
    assert_string_equal(next_fields(fp, ev), d + 1);
    free(d);
    json_decref(o);
}

/* The log goes to a new temporary file at level lvl (path: its name,
 * "/tmp/...XXXXXX"); log_capture_end closes it, opens it for reading and
 * puts the level back. */
typedef struct log_capture {
    char path[64];
    bool info; /* the level was info before */
} log_capture;

static void log_capture_start(log_capture *lc, const char *name, gp_log_level lvl)
{
    snprintf(lc->path, sizeof lc->path, "/tmp/test_jobs_submit_%s_XXXXXX", name);
    int fd = mkstemp(lc->path);
    assert_true(fd >= 0);
    close(fd);
    lc->info = gp_log_enabled(GP_LOG_INFO);
    gp_log_set_level(lvl);
    assert_int_equal(gp_log_open(lc->path), 0);
}

static FILE *log_capture_end(log_capture *lc)
{
    gp_log_open(NULL);
    gp_log_set_level(lc->info ? GP_LOG_INFO : GP_LOG_WARN);
    FILE *fp = fopen(lc->path, "r");
    assert_non_null(fp);
    unlink(lc->path); /* (open: read to the end all the same) */
    return fp;
}

/* Issue 24, fourth round: the fields of job_submitted, job_assigned (both
 * at debug) and job_done are refilled in one object per line kind instead of a
 * json_pack per line. The lines must be the ones the json_pack objects
 * wrote, job after job: a session, then none (its key gone again), a
 * user standing in for it, a batch job, values that need escapes. */
static void test_log_lines_as_json_pack_wrote(void **state)
{
    (void)state;
    log_capture lc;
    log_capture_start(&lc, "log", GP_LOG_DEBUG);
    fleet f;
    fleet_init(&f, NULL, NULL);
    registry_agent *a = fleet_agent(&f, 1, "m1", NULL, 8, 1000);
    struct {
        const char *session, *user;
        bool batch;
    } c[] = {{"s\"1\\\xc3\xa9", NULL, false}, {NULL, NULL, true}, {NULL, "u\n2", false},
             {"s4", "u4", false}, {NULL, NULL, false}};
    gps_job *jobs[5];
    for (int i = 0; i < 5; i++) {
        gps_job_spec s = fleet_spec("m1", 8);
        s.session = c[i].session ? strdup(c[i].session) : NULL;
        s.user = c[i].user ? strdup(c[i].user) : NULL;
        s.priority = c[i].batch ? GPS_PRIO_BATCH : GPS_PRIO_INTERACTIVE;
        jobs[i] = fleet_submit(&f, &s);
        json_decref(fleet_take(&f, a));
        char evs[256];
        snprintf(evs, sizeof evs,
                 "[{\"type\":\"end\",\"finish_reason\":\"%s\",\"usage\":{\"prompt_tokens\":%d,"
                 "\"completion_tokens\":%d}}]",
                 i & 1 ? "length" : "stop", 3 + i, 1000000 * i);
        assert_int_equal(fleet_apply(&f, jobs[i], a, 0, evs), 0);
    }
    FILE *fp = log_capture_end(&lc);
    for (int i = 0; i < 5; i++) {
        gps_job *job = jobs[i];
        json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:s,s:b}", "job_id", job->id, "model", "m1",
                              "kind", "completion", "api", "openai", "priority",
                              c[i].batch ? "batch" : "interactive", "held", 0);
        const char *session = c[i].session ? c[i].session : c[i].user;
        if (session)
            json_object_set_new(o, "session", json_string(session));
        assert_fields(fp, "job_submitted", o);
        assert_fields(fp, "job_assigned",
                      json_pack("{s:s,s:s,s:i,s:I}", "job_id", job->id, "agent_id", a->id,
                                "attempt", 1, "queue_ms", (json_int_t)job->queue_ms));
        assert_fields(fp, "job_done",
                      json_pack("{s:s,s:s,s:s,s:I,s:I,s:I,s:s}", "job_id", job->id, "model",
                                "m1", "agent_id", a->id, "ms",
                                (json_int_t)((job->finished_us - job->created_us) / 1000),
                                "prompt_tokens", (json_int_t)(3 + i), "completion_tokens",
                                (json_int_t)(1000000 * i), "finish_reason",
                                i & 1 ? "length" : "stop"));
    }
    fclose(fp);
    fleet_free(&f);
}

/* At the default level (info) a request writes one line, job_done, as an
 * access log: job_submitted and job_assigned are debug lines (three lines a
 * request were 9 % of the server's CPU at 64 zero-delay clients). */
static void test_one_info_line_a_request(void **state)
{
    (void)state;
    log_capture lc;
    log_capture_start(&lc, "info", GP_LOG_INFO);
    fleet f;
    fleet_init(&f, NULL, NULL);
    registry_agent *a = fleet_agent(&f, 1, "m1", NULL, 8, 1000);
    gps_job_spec s = fleet_spec("m1", 8);
    gps_job *job = fleet_submit(&f, &s);
    json_decref(fleet_take(&f, a));
    assert_int_equal(fleet_apply(&f, job, a, 0,
                                 "[{\"type\":\"end\",\"finish_reason\":\"stop\"}]"),
                     0);
    FILE *fp = log_capture_end(&lc);
    char line[4096];
    int done = 0;
    while (fgets(line, sizeof line, fp)) {
        assert_null(strstr(line, "\"event\":\"job_submitted\""));
        assert_null(strstr(line, "\"event\":\"job_assigned\""));
        done += strstr(line, "\"event\":\"job_done\"") != NULL;
    }
    assert_int_equal(done, 1);
    fclose(fp);
    fleet_free(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agent_lost_ends_every_job),
        cmocka_unit_test(test_one_reply_takes_every_free_slot),
        cmocka_unit_test(test_finished_jobs_retired_to_records),
        cmocka_unit_test(test_records_capped_oldest_first),
        cmocka_unit_test(test_log_lines_as_json_pack_wrote),
        cmocka_unit_test(test_one_info_line_a_request),
        cmocka_unit_test(test_assigned_at_once_to_a_ready_agent),
        cmocka_unit_test(test_queued_in_order_until_an_agent_asks),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_tenant_tags),
        cmocka_unit_test(test_fallback_at_submit),
        cmocka_unit_test_setup_teardown(test_request_log_written_once, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
