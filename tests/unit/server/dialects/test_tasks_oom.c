/* Native tasks under memory pressure: a task's event log is whole or the
 * task ends with the pool's own failure. Sweeps (fixture_oom.h arm_libc:
 * the N-th of jansson's and the project's malloc, calloc and realloc
 * fails, N = 1, 2, ... until a run does not reach it) over
 *  - a live task (api_tasks_run.c) fed a job's events by its agent: every
 *    run ends with the whole log (started, tokens with their ids, metrics,
 *    end with the text), or with the log's reserved terminal error
 *    (INTERNAL, out of memory) after the events before the one that could
 *    not be recorded, each of them whole; never a log with a token, an id
 *    or an event's data left out, never a task that does not end; the log
 *    ends as GET says (the job's state): an end event that could not be
 *    recorded (the job is done) is recorded by the tick once memory is
 *    back, never the INTERNAL error for a task GET says is done; the same
 *    for a job that fails (its agent reports an error, the server fails
 *    it): the log ends with the error GET reports, code and message,
 *    never the INTERNAL error beside a GET that says the job's code;
 *  - its first queued event: whole, or announced again by the tick;
 *  - a restore from the store (api_tasks_restore.c): the whole stored log
 *    and seed, or nothing restored (-2: read again later), never a log cut
 *    short;
 *  - a restored task's resubmission: a submit that ran out of memory
 *    (500) is tried again at the next tick, never the task failed for it;
 *    once submitted, the task hears its job (else it ended INTERNAL).
 * Real jobs table, scheduler and agent (fixture_fleet.h); no store. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/gp_util.h"
#include "server/dialects/api_tasks.h"
#include "server/dialects/api_tasks_priv.h"
#include "server/metrics.h"
#include "server/store/store.h"

#include "../fixture_oom.h"
#include "fixture_fleet.h"

#define DIGEST "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

/* The agent's upload and what the task's log must say after it. */
#define UPLOAD_HEAD                                                 \
    "[{\"type\":\"started\"},"                                        \
    "{\"type\":\"token\",\"text\":\"Once\",\"token_ids\":[11,12]},"  \
    "{\"type\":\"metrics\",\"tokens_per_sec\":2.5},"                  \
    "{\"type\":\"token\",\"text\":\" upon\",\"token_ids\":[13]},"    \
    "{\"type\":\"token\",\"text\":\" a\",\"token_id\":14}"
#define UPLOAD_END                                                  \
    UPLOAD_HEAD ",{\"type\":\"end\",\"finish_reason\":\"stop\","        \
                "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}]"
/* The same job failed by its agent (a code its agent's own failure does
 * not fail over: the request's), or left running, for the server to fail
 * (as when it loses the agent and no other serves the model). */
#define UPLOAD_ERROR                                                \
    UPLOAD_HEAD ",{\"type\":\"error\",\"code\":\"CONTEXT_OVERFLOW\","  \
                "\"message\":\"the prompt and max_tokens exceed the context\"}]"
#define UPLOAD_RUNNING UPLOAD_HEAD "]"
static const char *const TOK_TEXT[] = {"Once", " upon", " a"};
static const char *const TOK_IDS[] = {"[11,12]", "[13]", "[14]"};
/* The types in order (queued first: the task's creation); the last is
 * the variant's (end, or error). */
static const char *const TYPES[] = {"queued", "started", "token", "metrics",
                                    "token",  "token",   "end"};
#define N_EVENTS 7

/* One sweep's job: its upload, then (server_fail) the server fails the
 * job with code and message; the log's last event when nothing ran out of
 * memory: end, or error with code and message. */
typedef struct variant {
    const char *name;
    const char *upload;
    bool server_fail;
    const char *code, *message; /* NULL: the job ends done */
} variant;

static const variant V_END = {"end", UPLOAD_END, false, NULL, NULL};
static const variant V_AGENT_ERROR = {"agent error", UPLOAD_ERROR, false, "CONTEXT_OVERFLOW",
                                      "the prompt and max_tokens exceed the context"};
static const variant V_SERVER_FAIL = {"server fail", UPLOAD_RUNNING, true, "AGENT_LOST",
                                      "the agent was lost and no other serves the model"};

/* A task over job, as the POST handler makes it (api_tasks.c). */
static task *task_on(gps_tasks *g, gps_job *job)
{
    task *t = calloc(1, sizeof *t);
    assert_non_null(t);
    t->log = gps_tlog_new();
    assert_non_null(t->log);
    t->owner = g;
    t->job = job;
    t->last_pos = -1;
    t->created_us = gp_now_mono_us();
    snprintf(t->id, sizeof t->id, "%s", gps_job_id(job));
    tasks_link(g, t);
    assert_int_equal(gps_job_subscribe(job, tasks_on_job_event, t), 0);
    tasks_emit_queued(t);
    return t;
}

static json_t *event_at(const task *t, size_t i)
{
    json_t *ev = gps_tlog_get(t->log, i);
    assert_non_null(ev);
    assert_int_equal(json_integer_value(json_object_get(ev, "seq")), (json_int_t)i + 1);
    return ev;
}

/* Event i of a task's log is the one expected there (v: the sweep's
 * job), whole. */
static bool event_whole(const json_t *ev, size_t i, size_t *tok, const variant *v)
{
    const char *type = json_string_value(json_object_get(ev, "type"));
    const json_t *d = json_object_get(ev, "data");
    const char *want = i == N_EVENTS - 1 && v->code ? "error" : TYPES[i];
    if (!type || strcmp(type, want) != 0 || !json_is_object(d))
        return false;
    if (strcmp(type, "error") == 0) {
        const char *c = json_string_value(json_object_get(d, "code"));
        const char *m = json_string_value(json_object_get(d, "message"));
        return c && m && strcmp(c, v->code) == 0 && strcmp(m, v->message) == 0;
    }
    if (strcmp(type, "queued") == 0)
        return json_is_integer(json_object_get(d, "position")) &&
               json_is_integer(json_object_get(d, "estimated_wait_ms"));
    if (strcmp(type, "started") == 0)
        return json_is_string(json_object_get(d, "agent_id")) &&
               json_is_integer(json_object_get(d, "attempt")) &&
               json_is_string(json_object_get(ev, "digest"));
    if (strcmp(type, "metrics") == 0)
        return json_real_value(json_object_get(d, "tokens_per_sec")) == 2.5;
    if (strcmp(type, "token") == 0) {
        json_t *ids = J(TOK_IDS[*tok]);
        const char *text = json_string_value(json_object_get(d, "text"));
        bool ok = text && strcmp(text, TOK_TEXT[*tok]) == 0 &&
                  json_equal(json_object_get(ev, "ids"), ids);
        json_decref(ids);
        (*tok)++;
        return ok;
    }
    /* end */
    const char *text = json_string_value(json_object_get(d, "text"));
    return text && strcmp(text, "Once upon a") == 0 &&
           json_is_string(json_object_get(d, "finish_reason")) &&
           json_is_object(json_object_get(d, "usage"));
}

/* One run's log: each event whole in its place, then the end or the
 * reserved out-of-memory error (INTERNAL). Returns false, printing why,
 * when it is not. */
static bool log_whole(const task *t, size_t run, const variant *v)
{
    size_t n = gps_tlog_count(t->log), tok = 0;
    if (!t->terminal || n == 0) {
        print_message("run %zu: the task did not end (%zu events)\n", run, n);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *ev = event_at(t, i);
        const char *type = json_string_value(json_object_get(ev, "type"));
        bool ok;
        const json_t *d = json_object_get(ev, "data");
        const char *code = json_string_value(json_object_get(d, "code"));
        if (i == n - 1 && strcmp(type, "error") == 0 && code &&
            strcmp(code, "INTERNAL") == 0) {
            ok = strcmp(json_string_value(json_object_get(d, "message")), "out of memory") ==
                 0;
        } else {
            ok = i < N_EVENTS && event_whole(ev, i, &tok, v);
        }
        if (!ok) {
            char *s = json_dumps(ev, JSON_COMPACT);
            print_message("run %zu: event %zu of %zu is not the one expected there: %s\n", run,
                          i + 1, n, s ? s : "?");
            free(s);
        }
        json_decref(ev);
        if (!ok)
            return false;
    }
    return true;
}

/* Upload events (loaded before the allocator is armed) as the agent does:
 * sent again while the server answers 500 (out of memory). */
static void upload(fleet *f, gps_job *job, registry_agent *a, json_t *events)
{
    bool cancel;
    long long exp;
    char msg[256];
    int rc = 500;
    for (int k = 0; k < 4 && rc == 500; k++)
        rc = gps_jobs_apply_events(f->jobs, gps_job_id(job), a->id, 0, events, &cancel, &exp,
                                   msg, sizeof msg);
}

/* GET's body for the task (the handler's builder): its status, and the
 * error (code, message) of a failed job or the result of a done one. */
static json_t *get_status(task *t)
{
    json_t *st = tasks_status(t);
    assert_non_null(st);
    return st;
}

/* What GET says (done with the whole result, or failed with the job's
 * code and a message) and how the log ends agree: done with `end`,
 * failed with an `error` of the same code and message. */
static bool log_agrees(task *t, size_t run)
{
    json_t *st = get_status(t);
    json_t *last = event_at(t, gps_tlog_count(t->log) - 1);
    const char *status = json_string_value(json_object_get(st, "status"));
    const char *type = json_string_value(json_object_get(last, "type"));
    bool ok = strcmp(type, "end") == 0
                  ? strcmp(status, "done") == 0
                  : strcmp(status, "failed") == 0 &&
                        json_equal(json_object_get(st, "error"), json_object_get(last, "data"));
    if (!ok) {
        char *g = json_dumps(json_object_get(st, "error"), JSON_COMPACT);
        char *l = json_dumps(last, JSON_COMPACT);
        print_message("run %zu: the log ends with %s, GET says %s %s\n", run, l ? l : "?",
                      status, g ? g : "");
        free(g);
        free(l);
    }
    json_decref(st);
    json_decref(last);
    return ok;
}

/* Does the log end with the reserved out-of-memory error? */
static bool ends_internal(const task *t)
{
    json_t *last = event_at(t, gps_tlog_count(t->log) - 1);
    const char *code = json_string_value(json_object_get(json_object_get(last, "data"), "code"));
    bool internal = code && strcmp(code, "INTERNAL") == 0;
    json_decref(last);
    return internal;
}

/* The job ended (done, or failed) but its terminal event could not be
 * recorded: the tick records it again, nothing in its place meanwhile (a
 * try that runs out of memory again changes nothing), and GET says
 * meanwhile what it says once the event is recorded. */
static size_t retry_terminal(task *t, size_t run)
{
    size_t bad = 0, before = gps_tlog_count(t->log);
    json_t *st = get_status(t);
    arm_libc(1);
    tasks_retry_end(t);
    disarm();
    if (t->terminal || gps_tlog_count(t->log) != before) {
        print_message("run %zu: a failed retry of the terminal event changed the log\n", run);
        bad++;
    }
    tasks_retry_end(t); /* the next tick's, memory back */
    json_t *after = get_status(t);
    bool same = true; /* (not events: the count of them released) */
    static const char *const keys[] = {"status", "error", "result"};
    for (size_t k = 0; k < 3; k++) {
        const json_t *x = json_object_get(st, keys[k]), *y = json_object_get(after, keys[k]);
        same = same && (x || y ? json_equal(x, y) : true);
    }
    if (!same) {
        char *b = json_dumps(st, JSON_COMPACT), *a = json_dumps(after, JSON_COMPACT);
        print_message("run %zu: GET changed when the terminal event was recorded: %s, then "
                      "%s\n",
                      run, b ? b : "?", a ? a : "?");
        free(b);
        free(a);
        bad++;
    }
    json_decref(st);
    json_decref(after);
    return bad;
}

/* The sweep over a live task fed v's job: each run's log whole and as
 * GET says. */
static void sweep_live(const variant *v)
{
    size_t bad = 0, oom_ends = 0, delayed = 0, n;
    for (n = 1;; n++) {
        fleet f;
        fleet_init(&f, NULL, NULL);
        gps_metrics *m = gps_metrics_new();
        gps_tasks *g = gps_tasks_new(NULL, f.jobs, NULL, m, 60);
        assert_non_null(g);
        registry_agent *a = fleet_agent(&f, 1, "m1", DIGEST, 1, 1000);
        gps_job_spec spec = fleet_spec("m1", 8);
        gps_job *job = fleet_submit(&f, &spec);
        task *t = task_on(g, job);
        json_decref(fleet_take(&f, a));
        json_t *events = J(v->upload);

        arm_libc(n);
        upload(&f, job, a, events);
        if (v->server_fail)
            gps_jobs_fail(f.jobs, job, 502, v->code, v->message);
        bool hit = disarm();
        if (!t->terminal && gps_job_terminal(job)) {
            delayed++;
            bad += retry_terminal(t, n);
        }

        if (!log_whole(t, n, v) || !log_agrees(t, n)) {
            bad++;
        } else if (ends_internal(t)) {
            oom_ends++;
            /* Its job ended with it: the agent is told to stop. */
            if (!gps_job_terminal(job)) {
                print_message("run %zu: the task failed, its job runs on\n", n);
                bad++;
            }
        }
        json_decref(events);
        gps_tasks_free(g);
        fleet_free(&f);
        gps_metrics_free(m);
        if (!hit)
            break;
    }
    print_message("%s: %zu runs, %zu ended out of memory, %zu terminal events recorded late\n",
                  v->name, n, oom_ends, delayed);
    assert_true(n > 20); /* the sweep reached the task's allocations */
    assert_true(oom_ends > 0);
    assert_true(delayed > 0); /* ... and the terminal event's */
    assert_int_equal(bad, 0);
}

static void test_live_task_oom(void **state)
{
    (void)state;
    sweep_live(&V_END);
}

/* The job fails with its agent's error: the log ends with that error (or
 * INTERNAL when an event before it could not be recorded), as GET says:
 * an error event that could not be recorded is recorded by the tick. */
static void test_live_task_error_oom(void **state)
{
    (void)state;
    sweep_live(&V_AGENT_ERROR);
}

/* The same when the server fails the job (it lost the agent). */
static void test_live_task_fail_oom(void **state)
{
    (void)state;
    sweep_live(&V_SERVER_FAIL);
}

/* The queued event a task starts with: recorded whole, or (out of
 * memory) not at all, the task queued with its position to announce
 * (last_pos -2: the tick announces it), never an event without its data. */
static void test_queued_oom(void **state)
{
    (void)state;
    size_t bad = 0, later = 0, n;
    for (n = 1;; n++) {
        fleet f;
        fleet_init(&f, NULL, NULL);
        gps_metrics *m = gps_metrics_new();
        gps_tasks *g = gps_tasks_new(NULL, f.jobs, NULL, m, 60);
        assert_non_null(g);
        fleet_agent(&f, 1, "m1", DIGEST, 1, 1000);
        gps_job_spec spec = fleet_spec("m1", 8);
        gps_job *job = fleet_submit(&f, &spec);
        task *t = calloc(1, sizeof *t);
        assert_non_null(t);
        t->log = gps_tlog_new();
        assert_non_null(t->log);
        t->owner = g;
        t->job = job;
        t->last_pos = -1;
        snprintf(t->id, sizeof t->id, "%s", gps_job_id(job));
        tasks_link(g, t);
        arm_libc(n);
        tasks_emit_queued(t);
        bool hit = disarm();
        if (gps_tlog_count(t->log) == 0 && !t->terminal && t->last_pos == -2) {
            later++;
            tasks_emit_queued(t); /* the tick's */
        }
        size_t tok = 0;
        json_t *ev = gps_tlog_get(t->log, 0);
        if (gps_tlog_count(t->log) != 1 || t->terminal || t->last_pos != 0 ||
            !event_whole(ev, 0, &tok, &V_END)) {
            char *s = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
            print_message("run %zu: %zu events, last_pos %lld: %s\n", n,
                          gps_tlog_count(t->log), t->last_pos, s ? s : "-");
            free(s);
            bad++;
        }
        json_decref(ev);
        gps_tasks_free(g);
        fleet_free(&f);
        gps_metrics_free(m);
        if (!hit)
            break;
    }
    assert_true(later > 0);
    assert_int_equal(bad, 0);
}

/* A stored task, as the store reads it back after a crash: queued,
 * started (hidden digest), two tokens with their ids. */
static const char *const STORED =
    "[{\"seq\":1,\"type\":\"queued\",\"data\":{\"position\":0,\"estimated_wait_ms\":0}},"
    "{\"seq\":2,\"type\":\"started\",\"data\":{\"agent_id\":\"a1\",\"attempt\":1},"
    "\"digest\":\"" DIGEST "\"},"
    "{\"seq\":3,\"type\":\"token\",\"data\":{\"text\":\"Once\"},\"ids\":[11,12]},"
    "{\"seq\":4,\"type\":\"token\",\"data\":{\"text\":\" upon\"},\"ids\":[13]}]";

static gps_store_job_info stored_info(json_t *request, json_t *events)
{
    gps_store_job_info j = {.id = "00000000-0000-4000-8000-0000000000aa", .api = "native",
                            .kind = "completion", .model = "m1", .key_id = "", .status = "running",
                            .attempts = 1, .has_seed = true, .seed = 77,
                            .correlation_id = "corr", .request = request, .events = events};
    return j;
}

static void test_restore_oom(void **state)
{
    (void)state;
    json_t *request = J("{\"model\":\"m1\",\"prompt\":\"p\",\"max_tokens\":8}");
    json_t *events = J(STORED);
    gps_store_job_info j = stored_info(request, events);
    size_t bad = 0, n, refused = 0;
    for (n = 1;; n++) {
        gps_metrics *m = gps_metrics_new();
        gps_tasks *g = gps_tasks_new(NULL, NULL, NULL, m, 60);
        assert_non_null(g);
        arm_libc(n);
        int rc = tasks_restore(g, &j, 0);
        bool hit = disarm();
        task *t = tasks_find(g, j.id);
        if (rc == -2) {
            refused++;
            if (t) {
                print_message("run %zu: out of memory, but a task was restored\n", n);
                bad++;
            }
        } else if (rc != 0 || !t) {
            print_message("run %zu: rc %d\n", n, rc);
            bad++;
        } else {
            json_t *got = json_array();
            for (size_t i = 0; i < gps_tlog_count(t->log); i++)
                json_array_append_new(got, gps_tlog_get(t->log, i));
            bool ok = json_equal(got, events) && t->resume_text &&
                      strcmp(t->resume_text, "Once upon") == 0 && t->n_resume_ids == 3 &&
                      json_integer_value(json_object_get(t->resume_body, "seed")) == 77;
            if (!ok) {
                char *s = json_dumps(got, JSON_COMPACT);
                print_message("run %zu: restored other than stored: %s (text %s, %zu ids)\n",
                              n, s ? s : "?", t->resume_text ? t->resume_text : "-",
                              t->n_resume_ids);
                free(s);
                bad++;
            }
            json_decref(got);
        }
        gps_tasks_free(g);
        gps_metrics_free(m);
        if (!hit)
            break;
    }
    json_decref(request);
    json_decref(events);
    assert_true(n > 10);
    assert_true(refused > 0);
    assert_int_equal(bad, 0);
}

static void test_resubmit_oom(void **state)
{
    (void)state;
    json_t *request = J("{\"model\":\"m1\",\"prompt\":\"p\",\"max_tokens\":8}");
    json_t *events = J(STORED);
    gps_store_job_info j = stored_info(request, events);
    size_t bad = 0, n, later = 0;
    for (n = 1;; n++) {
        fleet f;
        fleet_init(&f, NULL, NULL);
        fleet_agent(&f, 1, "m1", DIGEST, 1, 1000);
        gps_metrics *m = gps_metrics_new();
        gps_tasks *g = gps_tasks_new(NULL, f.jobs, NULL, m, 60);
        assert_non_null(g);
        assert_int_equal(tasks_restore(g, &j, 0), 0);
        task *t = tasks_find(g, j.id);
        assert_non_null(t);
        arm_libc(n);
        tasks_resubmit(g, t, gp_now_mono_us());
        bool hit = disarm();
        if (t->terminal) {
            /* Resubmitted, then an event of it could not be recorded: the
             * task ends with the log's reserved error, as a live one.
             * Not a task failed for memory its submit lacked a moment
             * (the old "could not be resumed ...: out of memory"). */
            json_t *last = gps_tlog_get(t->log, gps_tlog_count(t->log) - 1);
            const json_t *d = json_object_get(last, "data");
            const char *msg = json_string_value(json_object_get(d, "message"));
            if (!t->job || !msg || strcmp(msg, "out of memory") != 0) {
                char *s = json_dumps(last, JSON_COMPACT);
                print_message("run %zu: the task failed: %s\n", n, s ? s : "?");
                free(s);
                bad++;
            }
            json_decref(last);
        } else if (!t->job) {
            later++; /* the next tick tries again: it goes through then */
            tasks_resubmit(g, t, gp_now_mono_us());
            if (!t->job) {
                print_message("run %zu: not resubmitted at the next try\n", n);
                bad++;
            }
        }
        /* Resubmitted: the task hears its job (here: its cancel). */
        if (t->job && !t->terminal) {
            gps_jobs_cancel(f.jobs, t->job, "test");
            if (!t->terminal) {
                print_message("run %zu: the resubmitted task does not hear its job\n", n);
                bad++;
            }
        }
        gps_tasks_free(g);
        fleet_free(&f);
        gps_metrics_free(m);
        if (!hit)
            break;
    }
    json_decref(request);
    json_decref(events);
    assert_true(n > 10);
    assert_true(later > 0);
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_live_task_oom),
        cmocka_unit_test(test_live_task_error_oom),
        cmocka_unit_test(test_live_task_fail_oom),
        cmocka_unit_test(test_queued_oom),
        cmocka_unit_test(test_restore_oom),
        cmocka_unit_test(test_resubmit_oom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
