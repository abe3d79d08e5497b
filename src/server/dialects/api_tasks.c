/*
 * api_tasks: the native task API (contract in api_tasks.h): the handlers
 * of /v2/tasks, the module's tick, and its lifecycle.
 *
 * The module's files (what they share is in api_tasks_priv.h, private to
 * them):
 *   - api_tasks.c (this file): handlers, tick, new/free/register;
 *   - api_tasks_parse.c: a task's body into a job spec (pure);
 *   - api_tasks_run.c: a live task: its event log, subscribers and their
 *     pacing, the job events it turns into task events;
 *   - api_tasks_restore.c: tasks taken back after a restart;
 *   - api_tasks_shared.c: several servers on one database: followers of a
 *     task another server runs, leases, claims, cancels through the row.
 */
#include "server/dialects/api_tasks_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/keyvalq_struct.h>
#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/dialects/poolmeta.h"
#include "server/dialects/reqcheck.h"
#include "server/http/errors.h"
#include "server/http/held.h"
#include "server/http/http.h"
#include "server/http/sse.h"
#include "server/http/textcheck.h"

/* Streams whose catch-up ran out of memory, again (a finished task's has
 * no later event to wake it). A catch-up may finish its stream. */
static void retry_subs(task *t)
{
    task_sub *next;
    for (task_sub *s = t->subs; s; s = next) {
        next = s->next;
        if (s->retry)
            tasks_sub_catch_up(t, s);
    }
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    gps_tasks *g = arg;
    uint64_t now = gp_now_mono_us();
    task *next;
    if (g->shared)
        tasks_shared_tick(g, now);
    for (follow *f = g->follows; f; f = f->fnext)
        gps_stream_keepalive(&f->s, now, KEEPALIVE_US);
    /* Events held by the finished tasks seen so far, newest first (the
     * list is newest first): past hot_max_events the older ones go cold
     * early. A non-token event is a few jansson objects (~1 KiB; a token
     * in a run is ~12 B plus its text, task_log.h), so without this
     * bound the memory of hot tasks grows with the request rate times
     * task_hot_sec. The newest finished task stays whatever its
     * size (one task's events are bounded by its max_tokens and
     * max_job_event_bytes): its replays are paced from memory, while a
     * replay from the store frames the whole log at once. */
    size_t hot_events = 0;
    for (task *t = g->head; t; t = next) {
        next = t->next;
        if (now >= t->retry_us)
            tasks_flush(t); /* after a failed write; else a no-op */
        if (t->create_reply && now - t->created_us > g->lease_us)
            tasks_create_refuse(g, t);
        retry_subs(t);
        size_t nev = gps_tlog_count(t->log);
        if (t->terminal) {
            /* Not before its log is in the store (its cold replay comes
             * from there), unless the store stays broken. */
            bool stored = !t->inflight_seq && tasks_released(t) >= nev;
            bool over = g->hot_max_events && hot_events > 0 &&
                        hot_events + nev > g->hot_max_events;
            if (!t->subs && ((now - t->finished_us > g->hot_us &&
                              (stored || now - t->finished_us > 2 * g->hot_us)) ||
                             (over && stored))) {
                tasks_free(g, t);
                continue;
            }
            hot_events += nev;
            continue;
        }
        if (!t->job) {
            tasks_resubmit(g, t, now);
            continue;
        }
        tasks_retry_end(t); /* an ended job whose end or error waits for memory */
        if (gps_job_state_of(t->job) == GPS_JOB_QUEUED) {
            long long pos = (long long)gps_jobs_queue_position(g->jobs, t->job);
            if (pos != t->last_pos)
                tasks_emit_queued(t);
        }
        for (task_sub *s = t->subs; s; s = s->next)
            gps_stream_keepalive(&s->s, now, KEEPALIVE_US);
    }
}

/* ------------------------------------------------------------------ */
/* Handlers                                                            */
/* ------------------------------------------------------------------ */

static void count_request(gps_tasks *g, const char *outcome, uint64_t start_us)
{
    gps_metrics_request(g->metrics, "native", outcome, (double)(gp_now_mono_us() - start_us) / 1e6);
}

static void h_create(gps_req *r, void *arg)
{
    gps_tasks *g = arg;
    json_t *body = gps_req_job_json(r);
    if (!body) {
        count_request(g, "invalid_request", r->start_us);
        return;
    }
    gps_job_spec spec;
    char msg[512];
    const char *param = NULL;
    int rc = gps_tasks_parse(body, &spec, msg, sizeof msg, &param);
    if (rc < 0) {
        json_decref(body);
        const char *code;
        int status = gps_parse_refusal(rc, &code);
        gps_req_error(r, status, code, msg, param);
        count_request(g, "invalid_request", r->start_us);
        return;
    }
    long long seed = spec.seed;
    task *t = calloc(1, sizeof *t);
    gps_tlog *events = gps_tlog_new();
    /* The whole validated body with its seed: what a restart resubmits,
     * written with the job's row (one write). Without the seed a restart
     * would draw another one and not reproduce the run. */
    if (!t || !events || json_object_set_new(body, "seed", json_integer(seed)) < 0) {
        free(t);
        gps_tlog_free(events);
        json_decref(body);
        gps_job_spec_clear(&spec);
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
        return;
    }
    spec.stored_request = body;
    gps_submit_err e;
    snprintf(spec.pool_via, sizeof spec.pool_via, "%s", r->pool_via);
    gps_job *job = gps_jobs_submit(g->jobs, &spec, r->correlation_id, r->key_id, &e);
    gps_job_spec_clear(&spec);
    if (!job) {
        free(t);
        gps_tlog_free(events);
        gps_send_error_retry(r->req, GPS_DIALECT_NATIVE, e.status, e.code, e.message,
                             e.status == 404 ? "model" : NULL, r->correlation_id,
                             e.retry_after_sec);
        count_request(g, e.code, r->start_us);
        return;
    }
    t->owner = g;
    t->job = job;
    t->log = events;
    t->last_pos = -1;
    t->created_us = r->start_us;
    snprintf(t->id, sizeof t->id, "%s", gps_job_id(job));
    snprintf(t->key_id, sizeof t->key_id, "%s", r->key_id);
    snprintf(t->corr, sizeof t->corr, "%s", r->correlation_id);
    tasks_link(g, t);
    bool heard = gps_job_subscribe(job, tasks_on_job_event, t) == 0;
    if (g->shared) {
        /* After the row's insert (same queue): its first events are
         * fenced by this attempt. */
        t->lease_attempt = 1;
        gps_job_set_lease_attempt(job, 1);
        gps_store_task_own(g->store, t->id, g->server_id,
                           gp_now_wall_ms() + (int64_t)(g->lease_us / 1000), 1);
    }
    if (heard)
        tasks_emit_queued(t);
    else
        tasks_oom_end(t, "queued"); /* its job's events cannot reach it: it would never end */
    char url[96];
    snprintf(url, sizeof url, "/v2/tasks/%s/events", t->id);
    char loc[96];
    snprintf(loc, sizeof loc, "/v2/tasks/%s", t->id);
    gps_req_add_header(r, "Location", loc);
    json_t *reply = json_pack("{s:s,s:s,s:I,s:s,s:I}", "job_id", t->id, "status",
                              gps_job_state_name(gps_job_state_of(job)), "queue_position",
                              (json_int_t)(t->last_pos > 0 ? t->last_pos : 0), "events_url",
                              url, "seed", (json_int_t)seed);
    if (g->shared && reply && t->durable == 0) {
        t->create_reply = reply;
        gps_held_start(&t->create_held, r->req, false, 0, NULL, NULL);
    } else {
        gps_http_send_json(r->req, 202, reply);
    }
    /* Not requests_total: a task counts there once, with its outcome, when
     * it ends (count_outcome). */
    if (g->metrics)
        gps_metrics_add(g->metrics, "tasks_accepted_total", NULL, 1);
}

void gps_tasks_set_auth(gps_tasks *g, gps_auth *auth)
{
    g->auth = auth;
}

/* May the caller's key see a task owned by owner ("" or NULL: created
 * while auth was off)? Auth off: everyone. On: its own key, and an
 * owner-less task only an admin key (it may hold anyone's prompt). */
static bool may_see(gps_tasks *g, const char *caller, const char *owner)
{
    if (!caller[0])
        return true;
    if (owner && owner[0])
        return strcmp(owner, caller) == 0;
    const gps_auth_key *k = g->auth ? gps_auth_key_find(g->auth, caller) : NULL;
    return k && k->role == GPS_KEY_ADMIN;
}

/* A task the caller may see (may_see), else NULL: answered like someone
 * else's task, 404. */
static task *visible(gps_tasks *g, gps_req *r)
{
    task *t = tasks_find(g, r->params[0]);
    return t && may_see(g, r->key_id, t->key_id) ? t : NULL;
}

/* The status builders below are whole or NULL (out of memory): a task
 * without its result or error is not its status (gps_http_send_json then
 * answers 500). Each json_object_set_new takes its value, NULL included,
 * so they only count the failures. */
static int set(json_t *o, const char *key, json_t *v)
{
    return json_object_set_new(o, key, v) < 0 ? 1 : 0;
}

/* The error object of a failed or cancelled task: its code, and the
 * message of its last event's data (else the code again). */
static json_t *error_object(const char *code, const json_t *data)
{
    const char *m = json_string_value(json_object_get(data, "message"));
    return json_pack("{s:s,s:s}", "code", code, "message", m ? m : code);
}

/* A restored task waiting to be resubmitted (or failed before it was). */
static json_t *status_restored(task *t)
{
    size_t n = gps_tlog_count(t->log);
    json_t *last = n ? gps_tlog_get(t->log, n - 1) : NULL;
    if (n && !last)
        return NULL;
    json_t *d = json_object_get(last, "data");
    const char *type = json_string_value(json_object_get(last, "type"));
    json_t *o = json_pack("{s:s,s:I}", "job_id", t->id, "events", (json_int_t)n);
    int bad = !o;
    json_t *b = t->resume_body;
    if (o) {
        json_t *model = json_object_get(b, "model"), *seed = json_object_get(b, "seed");
        bad += model && json_object_set(o, "model", model) < 0;
        bad += seed && json_object_set(o, "seed", seed) < 0;
        if (!t->terminal) {
            bad += set(o, "status", json_string("queued"));
        } else if (type && strcmp(type, "end") == 0) {
            bad += set(o, "status", json_string("done"));
            bad += set(o, "result", json_pack("{s:O,s:O}", "text", json_object_get(d, "text"),
                                              "finish_reason",
                                              json_object_get(d, "finish_reason")));
        } else {
            const char *code = json_string_value(json_object_get(d, "code"));
            bad += set(o, "status", json_string(code && strcmp(code, "CANCELLED") == 0
                                                    ? "cancelled"
                                                    : "failed"));
            if (d) /* (a restored log's last event without data: no error to show) */
                bad += set(o, "error", json_deep_copy(d));
        }
    }
    json_decref(last);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *tasks_status(task *t)
{
    gps_job *job = t->job;
    if (!job)
        return status_restored(t);
    gps_job_state state = gps_job_state_of(job);
    json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:I,s:i,s:s,s:I}", "job_id", t->id, "status",
                          gps_job_state_name(state), "model", gps_job_model(job), "priority",
                          gps_job_priority_of(job) == GPS_PRIO_BATCH ? "batch" : "interactive",
                          "seed", (json_int_t)gps_job_seed(job), "attempts",
                          gps_job_attempts(job), "agent_id", gps_job_agent_id(job), "events",
                          (json_int_t)tasks_released(t));
    if (!o)
        return NULL;
    int bad = 0;
    if (state == GPS_JOB_QUEUED)
        bad += set(o, "queue_position",
                   json_integer((json_int_t)gps_jobs_queue_position(t->owner->jobs, job)));
    uint64_t created = gps_job_created_us(job), first = gps_job_first_token_us(job);
    uint64_t end = gps_job_finished_us(job) ? gps_job_finished_us(job) : gp_now_mono_us();
    json_t *tm = json_pack("{s:I,s:I}", "queue_ms", (json_int_t)gps_job_queue_ms(job),
                           "total_ms", (json_int_t)((end - created) / 1000));
    if (tm && first)
        bad += set(tm, "ttft_ms", json_integer((json_int_t)((first - created) / 1000)));
    bad += set(o, "timings", tm);
    bad += set(o, "usage",
               json_pack("{s:I,s:I}", "prompt_tokens", (json_int_t)gps_job_prompt_tokens(job),
                         "completion_tokens", (json_int_t)gps_job_completion_tokens(job)));
    const char *fr = gps_job_finish_reason(job);
    if (state == GPS_JOB_DONE)
        bad += set(o, "result",
                   json_pack("{s:s%,s:s}", "text", gps_job_text(job), gps_job_text_len(job),
                             "finish_reason", fr[0] ? fr : "stop"));
    if (gps_pool_meta_shown(job))
        bad += set(o, "x_pool_meta", gps_pool_meta(job));
    if (state == GPS_JOB_FAILED || state == GPS_JOB_CANCELLED) {
        /* The message of the log's error event; while that event waits
         * for memory (end_pending), of the job's error event it will be
         * made from: GET says now what the log will end with. */
        size_t n = t->end_pending ? 0 : gps_tlog_count(t->log);
        json_t *last = n ? gps_tlog_get(t->log, n - 1) : NULL;
        bad += n && !last;
        const json_t *data = t->end_pending ? t->error_ev : json_object_get(last, "data");
        bad += set(o, "error", error_object(gps_job_error_code(job), data));
        json_decref(last);
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* What a failed task read from its row says as its error's message: the
 * one the row keeps (migration 0014), else, for a row written before it or
 * without one, its code. */
static const char *cold_message(const gps_store_job_info *j)
{
    return j->error_message && j->error_message[0] ? j->error_message : j->error_code;
}

json_t *tasks_status_cold(const gps_store_job_info *j)
{
    json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:i,s:s}", "job_id", j->id, "status", j->status,
                          "model", j->model, "priority", j->priority ? "batch" : "interactive",
                          "attempts", j->attempts, "agent_id", j->agent_id ? j->agent_id : "");
    if (!o)
        return NULL;
    int bad = set(o, "seed", j->has_seed ? json_integer(j->seed) : json_null());
    json_t *tm = json_object();
    if (tm && j->queue_ms >= 0)
        bad += set(tm, "queue_ms", json_integer(j->queue_ms));
    if (tm && j->ttft_ms >= 0)
        bad += set(tm, "ttft_ms", json_integer(j->ttft_ms));
    if (tm && j->total_ms >= 0)
        bad += set(tm, "total_ms", json_integer(j->total_ms));
    bad += set(o, "timings", tm);
    bad += set(o, "usage",
               json_pack("{s:I,s:I}", "prompt_tokens",
                         (json_int_t)(j->prompt_tokens > 0 ? j->prompt_tokens : 0),
                         "completion_tokens",
                         (json_int_t)(j->completion_tokens > 0 ? j->completion_tokens : 0)));
    if (strcmp(j->status, "done") == 0)
        bad += set(o, "result",
                   json_pack("{s:s%,s:s}", "text", j->checkpoint_text ? j->checkpoint_text : "",
                             j->checkpoint_text ? j->checkpoint_len : 0, "finish_reason",
                             j->finish_reason ? j->finish_reason : "stop"));
    else if (j->error_code)
        bad += set(o, "error", json_pack("{s:s,s:s}", "code", j->error_code, "message",
                                         cold_message(j)));
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* A finished task's terminal event made from its row and checkpoint (its
 * log lacks it: a task finished before migration 0002, or its last batch
 * was lost), framed onto out. 0, or -1 (ENOMEM: out as it was). */
static int cold_terminal(gp_buf *out, const gps_store_job_info *j, long long seq)
{
    json_t *data;
    const char *type;
    if (strcmp(j->status, "done") == 0) {
        type = "end";
        data = json_pack("{s:s,s:{s:I,s:I},s:s%}", "finish_reason",
                         j->finish_reason ? j->finish_reason : "stop", "usage", "prompt_tokens",
                         (json_int_t)(j->prompt_tokens > 0 ? j->prompt_tokens : 0),
                         "completion_tokens",
                         (json_int_t)(j->completion_tokens > 0 ? j->completion_tokens : 0),
                         "text", j->checkpoint_text ? j->checkpoint_text : "",
                         j->checkpoint_text ? j->checkpoint_len : 0);
    } else {
        type = "error";
        data = json_pack("{s:s,s:s}", "code", j->error_code ? j->error_code : "FAILED",
                         "message", j->error_code ? cold_message(j) : "the job failed");
    }
    json_t *ev = json_pack("{s:I,s:s,s:o}", "seq", (json_int_t)seq, "type", type, "data", data);
    int rc = ev ? tasks_sse_frame(out, ev) : -1;
    json_decref(ev);
    return rc;
}

int tasks_cold_frames(const gps_store_job_info *j, long long last_id, gp_buf *out,
                      long long *next)
{
    size_t at = out->len;
    bool terminal = false;
    size_t i;
    json_t *ev;
    *next = 1;
    json_array_foreach(j->events, i, ev)
    {
        if (json_integer_value(json_object_get(ev, "seq")) != *next)
            break;
        const char *type = json_string_value(json_object_get(ev, "type"));
        terminal = type && (strcmp(type, "end") == 0 || strcmp(type, "error") == 0);
        if (*next > last_id && tasks_sse_frame(out, ev) < 0)
            goto oom;
        (*next)++;
        if (terminal)
            return 1;
    }
    long long seq = j->events ? *next : (j->checkpoint_seq > 0 ? j->checkpoint_seq : 1);
    if (last_id < seq && j->finished_at > 0) {
        if (cold_terminal(out, j, seq) < 0)
            goto oom;
        return 1;
    }
    return 0;
oom:
    gp_buf_truncate(out, at);
    return -1;
}

/* A store read for a task that left memory. */
typedef enum { COLD_STATUS, COLD_EVENTS, COLD_DELETE } cold_kind;
typedef struct cold_req {
    gps_tasks *g;
    cold_kind kind;
    gps_held held;                /* held.req: NULL once the client left */
    char corr[65];
    char key_id[65];
    long long last_id;
} cold_req;

static void cold_done(void *arg, int status, const gps_store_job_info *j)
{
    cold_req *c = arg;
    if (!c->held.req) {
        free(c);
        return;
    }
    gps_held_release(&c->held);
    if (status != 0 || !j || !j->api || strcmp(j->api, "native") != 0 ||
        !may_see(c->g, c->key_id, j->key_id)) {
        if (status < 0)
            gps_http_send_error(c->held.req, GPS_DIALECT_NATIVE, 500, "INTERNAL",
                                "the task store could not be read", NULL, c->corr, NULL);
        else
            gps_http_send_error(c->held.req, GPS_DIALECT_NATIVE, 404, "JOB_NOT_FOUND",
                                "no such task", NULL, c->corr, NULL);
        free(c);
        return;
    }
    if (c->kind == COLD_DELETE && j->finished_at <= 0 && c->g->row_cancels &&
        tasks_cwait_start(c->g, c->held.req, j->id, c->corr)) {
        /* Unfinished and not here: another server runs it. */
        free(c);
        return;
    }
    if (c->kind != COLD_EVENTS) {
        /* A task out of memory is finished (or was failed at a restart):
         * DELETE has nothing left to cancel. */
        gps_http_send_json(c->held.req, 200, tasks_status_cold(j));
        free(c);
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(c->held.req), "X-Gpupool-Replay",
                      "store");
    gp_buf out;
    gp_buf_init(&out);
    long long next;
    int rc = tasks_cold_frames(j, c->last_id, &out, &next);
    /* Unfinished and not here: another server runs it (shared store).
     * Follow its log as it grows. */
    if (rc == 0 && j->finished_at <= 0 &&
        tasks_follow_start(c->g, c->held.req, j->id, c->corr, next, c->last_id, &out)) {
        gp_buf_free(&out);
        free(c);
        return;
    }
    if (rc < 0) {
        /* Before the stream starts: a 500, never a replay with an event
         * left out. */
        gp_buf_free(&out);
        gps_http_send_error(c->held.req, GPS_DIALECT_NATIVE, 500, "INTERNAL", "out of memory",
                            NULL, c->corr, NULL);
        free(c);
        return;
    }
    gps_sse_start(c->held.req);
    gps_sse_send(c->held.req, &out);
    gp_buf_free(&out);
    gps_sse_end(c->held.req);
    free(c);
}

static void cold_lookup(gps_tasks *g, gps_req *r, cold_kind kind, long long last_id)
{
    cold_req *c = calloc(1, sizeof *c);
    if (!g->store || !c) {
        free(c);
        gps_req_error(r, 404, "JOB_NOT_FOUND", "no such task", NULL);
        return;
    }
    c->g = g;
    c->kind = kind;
    c->last_id = last_id;
    snprintf(c->corr, sizeof c->corr, "%s", r->correlation_id);
    snprintf(c->key_id, sizeof c->key_id, "%s", r->key_id);
    gps_held_start(&c->held, r->req, false, 0, NULL, NULL);
    if (gps_store_job_get_async(g->store, r->params[0], cold_done, c) < 0) {
        gps_held_release(&c->held);
        free(c);
        gps_req_error(r, 500, "INTERNAL", "the task store could not be read", NULL);
    }
}

static void h_get(gps_req *r, void *arg)
{
    gps_tasks *g = arg;
    task *t = visible(g, r);
    if (!t) {
        cold_lookup(g, r, COLD_STATUS, 0);
        return;
    }
    if (t->job)
        gps_pool_headers(r->req, t->job);
    gps_http_send_json(r->req, 200, tasks_status(t));
}

static void h_delete(gps_req *r, void *arg)
{
    gps_tasks *g = arg;
    task *t = visible(g, r);
    if (!t) {
        cold_lookup(g, r, COLD_DELETE, 0);
        return;
    }
    tasks_cancel(g, t);
    gps_http_send_json(r->req, 200, tasks_status(t));
}

/* The client went away or was dropped as too slow (stream.h). The task
 * keeps running: a task outlives its watchers (a dropped client resumes
 * with Last-Event-ID). */
static void sub_gone(void *arg)
{
    task_sub *s = arg;
    if (s->t)
        tasks_sub_remove(s->t, s);
    gps_stream_free_later(&s->s, tasks_sub_free);
}

static void sub_writable(void *arg)
{
    task_sub *s = arg;
    if (s->t)
        tasks_sub_catch_up(s->t, s);
}

/* Bytes of text in the released events not yet written. */
static long long sub_behind(void *arg)
{
    task_sub *s = arg;
    return s->t ? (long long)gps_tlog_text_bytes(s->t->log, s->ev_sent, tasks_released(s->t)) : 0;
}

static const gps_stream_ops SUB_OPS = {
    .writable = sub_writable,
    .behind = sub_behind,
    .gone = sub_gone,
};

static void h_events(gps_req *r, void *arg)
{
    gps_tasks *g = arg;
    const char *hdr = gps_req_header(r, "Last-Event-ID");
    char qv[32] = "";
    if (!hdr) {
        struct evkeyvalq q;
        const char *query = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(r->req));
        if (query && evhttp_parse_query_str(query, &q) == 0) {
            const char *v = evhttp_find_header(&q, "last_event_id");
            if (v)
                snprintf(qv, sizeof qv, "%s", v);
            evhttp_clear_headers(&q);
        }
        hdr = qv;
    }
    /* A decoded %00 would cut the value ("5%00x" read as 5). */
    if (gps_query_has_control(evhttp_uri_get_query(evhttp_request_get_evhttp_uri(r->req)))) {
        gps_req_error(r, 400, "INVALID_REQUEST",
                      "query values must not contain control characters (such as %00)", NULL);
        return;
    }
    long long last = gps_tasks_last_event_id(hdr);
    if (last < 0) {
        gps_req_error(r, 400, "INVALID_REQUEST", "Last-Event-ID must be a non-negative integer",
                      "Last-Event-ID");
        return;
    }
    task *t = visible(g, r);
    if (!t) {
        cold_lookup(g, r, COLD_EVENTS, last);
        return;
    }
    /* Tells tests and operators where a replay came from. */
    evhttp_add_header(evhttp_request_get_output_headers(r->req), "X-Gpupool-Replay", "memory");
    task_sub *s = calloc(1, sizeof *s);
    if (!s) {
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
        return;
    }
    s->owner = g;
    s->t = t;
    gps_stream_init(&s->s, &SUB_OPS, s, r->req, r->correlation_id);
    snprintf(s->s.job_id, sizeof s->s.job_id, "%s", t->id);
    gps_stream_start(&s->s);
    size_t n = tasks_released(t);
    /* Those after last. An id beyond the end names events not recorded
     * yet: they are skipped when they come (tasks_sub_catch_up), the client
     * says it has them. With ids released only once durable, a client
     * can hold no id the store lost, so after a restart too an id beyond
     * the end means only "not yet" (docs/api.md). */
    s->ev_sent = last < (long long)n ? (size_t)last : n;
    s->after = last;
    s->next = t->subs;
    t->subs = s;
    gps_stream_hold(&s->s, g->request_timeout_sec + 30);
    /* The replay goes out paced, then the live events (tasks_emit). */
    tasks_sub_catch_up(t, s);
}

gps_tasks *gps_tasks_new(struct event_base *base, gps_jobs *jobs, gps_store *store,
                         gps_metrics *metrics, int request_timeout_sec)
{
    gps_tasks *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->base = base;
    g->jobs = jobs;
    g->store = store;
    g->metrics = metrics;
    g->request_timeout_sec = request_timeout_sec;
    g->hot_us = KEEP_HOT_SEC * 1000000ull;
    if (base) {
        g->tick = event_new(base, -1, EV_PERSIST, tick_cb, g);
        struct timeval tv = {0, TICK_MS * 1000};
        if (!g->tick || event_add(g->tick, &tv) < 0) {
            if (g->tick)
                event_free(g->tick);
            free(g);
            return NULL;
        }
    }
    /* A DB without job_events (custom migrations) cannot make events
     * durable: they go out at once, as without a store. */
    g->gated = store && gps_store_has_job_events(store);
    if (g->gated)
        gps_store_set_commit_cb(store, tasks_on_commit, g);
    return g;
}

void gps_tasks_free(gps_tasks *g)
{
    if (!g)
        return;
    gps_store_listener_free(g->listener);
    if (g->tick)
        event_free(g->tick);
    while (g->follows) {
        follow *f = g->follows;
        g->follows = f->fnext;
        f->g = NULL;
        gps_stream_end(&f->s);
        if (f->polling)
            f->gone = true; /* the read, delivered at the store's close, frees it */
        else
            tasks_follow_free(f);
    }
    while (g->cwaits) {
        cwait *w = g->cwaits;
        g->cwaits = w->next;
        w->g = NULL;
        if (!w->polling)
            tasks_cwait_end(w, 0, NULL); /* the http server's end closes its client */
    }
    if (g->follow_ev)
        event_free(g->follow_ev);
    for (pend *p = g->pends; p; p = p->next)
        p->g = NULL;
    if (g->gated)
        gps_store_set_commit_cb(g->store, NULL, NULL);
    while (g->head) {
        /* Shutdown: the events not in the store yet go there (closed after
         * this, which commits them), so a restart resumes from here. They
         * were never sent: a restart may send them, or others under
         * their ids; either way a client sees each id once. */
        task *t = g->head;
        size_t from = t->inflight_seq ? t->inflight_n : t->durable;
        if (g->gated && from < gps_tlog_count(t->log))
            tasks_write(t, from);
        tasks_free(g, t);
    }
    while (g->svc) {
        svc_rec *n = g->svc->next;
        free(g->svc);
        g->svc = n;
    }
    free(g);
}

static const gps_route ROUTES[] = {
    {EVHTTP_REQ_POST, "/v2/tasks", GPS_DIALECT_NATIVE, GPS_ROLE_CLIENT, h_create, NULL},
    {EVHTTP_REQ_GET, "/v2/tasks/{id}", GPS_DIALECT_NATIVE, GPS_ROLE_CLIENT, h_get, NULL},
    {EVHTTP_REQ_DELETE, "/v2/tasks/{id}", GPS_DIALECT_NATIVE, GPS_ROLE_CLIENT, h_delete, NULL},
    {EVHTTP_REQ_GET, "/v2/tasks/{id}/events", GPS_DIALECT_NATIVE, GPS_ROLE_CLIENT, h_events, NULL},
};

int gps_tasks_register(gps_http *h, gps_tasks *g)
{
    return gps_http_add_routes(h, ROUTES, sizeof ROUTES / sizeof ROUTES[0], g);
}
