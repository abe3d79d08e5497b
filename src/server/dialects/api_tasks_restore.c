/*
 * api_tasks_restore.c: tasks a restart left unfinished, taken back from the
 * store: resubmitted with their text so far, or failed when they cannot be.
 */
#include "server/dialects/api_tasks_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/dialects/poolmeta.h"
#include "server/dialects/reqcheck.h"
#include "server/http/errors.h"
#include "server/http/held.h"
#include "server/http/http.h"
#include "server/http/sse.h"
#include "server/http/textcheck.h"

/* ------------------------------------------------------------------ */
/* Restart recovery                                                    */
/* ------------------------------------------------------------------ */

void tasks_link(gps_tasks *g, task *t)
{
    unsigned b = tasks_bucket_of(t->id);
    t->hnext = g->buckets[b];
    g->buckets[b] = t;
    t->next = g->head;
    if (g->head)
        g->head->prev = t;
    g->head = t;
}

/* A restored task that cannot run again: its terminal error event, and
 * the request-log row finished (the jobs module never knew this task). */
void tasks_restore_fail(gps_tasks *g, task *t, const char *code, const char *message)
{
    tasks_emit(t, "error", json_pack("{s:s,s:s}", "code", code, "message", message), true);
    if (g->store) {
        gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT(t->id);
        u.lease_attempt = t->lease_attempt;
        u.status = strcmp(code, "CANCELLED") == 0 ? "cancelled" : "failed";
        u.error_code = code;
        u.error_message = message;
        u.finished_at = gp_now_wall_ms();
        gps_store_job_update_async(g->store, u);
    }
}

/* Submit a restored task again, under its id, with its recorded seed and
 * the text it had generated as continuation. Until an agent serving the
 * model is back (agents reconnect after a server restart) the submission
 * is refused: try again each tick until the deadline. */
void tasks_resubmit(gps_tasks *g, task *t, uint64_t now)
{
    gps_job_spec spec;
    char msg[512];
    const char *param = NULL;
    if (gps_tasks_parse(t->resume_body, &spec, msg, sizeof msg, &param) < 0) {
        char m[600];
        snprintf(m, sizeof m, "the stored request cannot be resubmitted: %s", msg);
        tasks_restore_fail(g, t, "SERVER_RESTART", m);
        return;
    }
    spec.resume_id = strdup(t->id);
    if (t->resume_tokens > 0 && t->resume_text) {
        spec.resume_text = strdup(t->resume_text);
        spec.resume_tokens = t->resume_tokens;
    }
    if (spec.resume_text && t->resume_ids) {
        /* Token-exact on an agent serving the same file, else from the
         * text (the jobs module decides at the assignment, as for a failover). */
        spec.resume_ids = malloc(t->n_resume_ids * sizeof *spec.resume_ids);
        if (spec.resume_ids) {
            memcpy(spec.resume_ids, t->resume_ids, t->n_resume_ids * sizeof *spec.resume_ids);
            spec.n_resume_ids = t->n_resume_ids;
            snprintf(spec.resume_digest, sizeof spec.resume_digest, "%s", t->resume_digest);
        }
    }
    /* Same shape as a continuation failover (the jobs module): the tokens
     * that follow continue the text the client already has. Built before
     * the submit: out of memory here is tried again, not the task failed. */
    json_t *fo = t->resume_tokens > 0
                     ? json_pack("{s:s,s:s,s:i,s:I}", "from_agent", t->resume_agent, "reason",
                                 "SERVER_RESTART", "attempt", t->resume_attempts + 1,
                                 "completion_tokens", (json_int_t)t->resume_tokens)
                     : NULL;
    if (!spec.resume_id || (t->resume_tokens > 0 && (!spec.resume_text || !fo)) ||
        (spec.resume_text && t->resume_ids && !spec.resume_ids)) {
        json_decref(fo);
        gps_job_spec_clear(&spec);
        return; /* ENOMEM: next tick */
    }
    gps_submit_err e;
    gps_job *job = gps_jobs_submit(g->jobs, &spec, t->corr, t->key_id, &e);
    gps_job_spec_clear(&spec);
    if (!job) {
        json_decref(fo);
        /* 500: out of memory here, as passing as a busy queue: the
         * task is tried again, not failed for it (until the deadline). */
        bool later = e.status == 503 || e.status == 429 || e.status == 404 || e.status == 500;
        if (later && now < t->resume_deadline_us)
            return;
        char m[400];
        snprintf(m, sizeof m, "the task could not be resumed after a server restart: %s",
                 e.message);
        tasks_restore_fail(g, t, e.code ? e.code : "SERVER_RESTART", m);
        return;
    }
    t->job = job;
    gps_job_set_lease_attempt(job, t->lease_attempt); /* its row: for this attempt only */
    if (gps_job_subscribe(job, tasks_on_job_event, t) < 0) {
        /* Its events could not reach the task: it would never end. The
         * job is under the task's id now: not submitted again. */
        json_decref(fo);
        tasks_oom_end(t, "started");
        return;
    }
    gp_log_write(GP_LOG_INFO, "task_resumed", t->corr,
                 json_pack("{s:s,s:I,s:I}", "job_id", t->id, "events",
                           (json_int_t)gps_tlog_count(t->log), "completion_tokens",
                           (json_int_t)t->resume_tokens),
                 "native task resubmitted after a server restart");
    if (fo)
        tasks_emit(t, "failover", fo, false);
    if (gps_job_state_of(job) == GPS_JOB_QUEUED)
        tasks_emit_queued(t);
    else
        t->last_pos = -1;
    json_decref(t->resume_body);
    t->resume_body = NULL;
    free(t->resume_text);
    t->resume_text = NULL;
    free(t->resume_ids);
    t->resume_ids = NULL;
    t->n_resume_ids = t->cap_resume_ids = 0;
}

/* Append a stored token event's ids (its hidden "ids") to the task's;
 * -1 when it has none: no token-exact resume then; -2 ENOMEM (the resume
 * is not made from the text instead: the task is read again later). */
static int resume_ids_add(task *t, const json_t *ids)
{
    size_t n = json_array_size(ids);
    if (n == 0)
        return -1;
    if (t->n_resume_ids + n > t->cap_resume_ids) {
        size_t nc = t->cap_resume_ids ? t->cap_resume_ids : 64;
        while (nc < t->n_resume_ids + n)
            nc *= 2;
        int32_t *p = realloc(t->resume_ids, nc * sizeof *p);
        if (!p)
            return -2;
        t->resume_ids = p;
        t->cap_resume_ids = nc;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v))
            return -1;
        t->resume_ids[t->n_resume_ids++] = (int32_t)json_integer_value(v);
    }
    return 0;
}

int tasks_restore(gps_tasks *g, const gps_store_job_info *j, int64_t lease_attempt)
{
    if (!g || !j || !j->id || !j->api || strcmp(j->api, "native") != 0 ||
        !json_is_object(j->request) || !json_object_get(j->request, "model") ||
        tasks_find(g, j->id))
        return -1;
    task *t = calloc(1, sizeof *t);
    gps_tlog *events = gps_tlog_new();
    gp_buf text;
    gp_buf_init(&text);
    if (!t || !events)
        goto oom;
    t->owner = g;
    t->last_pos = -1;
    snprintf(t->id, sizeof t->id, "%s", j->id);
    snprintf(t->key_id, sizeof t->key_id, "%s", j->key_id ? j->key_id : "");
    snprintf(t->corr, sizeof t->corr, "%s", j->correlation_id ? j->correlation_id : "");
    t->resume_attempts = j->attempts;
    t->lease_attempt = lease_attempt;
    /* The stored log, up to its first gap: seq must stay 1..n. */
    const char *last_type = NULL;
    /* Token-exact resume (issue 25 finding 8): while every token event
     * holds its ids, their concatenation and the digest of the file they
     * came from (a started event's, hidden) let an agent serving that
     * file continue as if nothing had happened. */
    bool ids_ok = true;
    size_t i;
    json_t *ev;
    json_array_foreach(j->events, i, ev)
    {
        if (json_integer_value(json_object_get(ev, "seq")) != (json_int_t)i + 1)
            break;
        const char *type = json_string_value(json_object_get(ev, "type"));
        json_t *data = json_object_get(ev, "data");
        if (!type || !data)
            break;
        /* A well-formed event not recorded is out of memory: never a log
         * cut short there (a resume from less text than the client has). */
        if (gps_tlog_append_stored(events, ev) < 0)
            goto oom;
        last_type = gps_tlog_type(events, i);
        if (strcmp(type, "token") == 0) {
            const char *tx = json_string_value(json_object_get(data, "text"));
            if (tx && gp_buf_append(&text, tx, strlen(tx)) < 0)
                goto oom;
            t->resume_tokens++;
            int rc = ids_ok ? resume_ids_add(t, json_object_get(ev, "ids")) : 0;
            if (rc == -2)
                goto oom;
            if (rc < 0)
                ids_ok = false;
        } else if (strcmp(type, "started") == 0) {
            const char *a = json_string_value(json_object_get(data, "agent_id"));
            const char *dg = json_string_value(json_object_get(ev, "digest"));
            snprintf(t->resume_agent, sizeof t->resume_agent, "%s", a ? a : "");
            if (dg)
                snprintf(t->resume_digest, sizeof t->resume_digest, "%s", dg);
        }
    }
    if (!ids_ok || !t->resume_digest[0] || t->n_resume_ids == 0) {
        free(t->resume_ids);
        t->resume_ids = NULL;
        t->n_resume_ids = t->cap_resume_ids = 0;
    } else {
        /* Tokens as the job counts them (an event may stand for several). */
        t->resume_tokens = (long long)t->n_resume_ids;
    }
    t->log = events;
    t->durable = t->inflight_n = gps_tlog_count(t->log); /* read from the store */
    t->created_us = gp_now_mono_us();
    /* Kept while the task has no job: resubmission, status (model, seed).
     * Copied before a finished log's row is written: -2 (out of memory)
     * then has written nothing. */
    t->resume_body = json_deep_copy(j->request);
    if (!t->resume_body)
        goto oom;
    /* Without its seed a resubmission would draw another one. */
    if (j->has_seed && json_object_set_new(t->resume_body, "seed", json_integer(j->seed)) < 0)
        goto oom;
    if (last_type && (strcmp(last_type, "end") == 0 || strcmp(last_type, "error") == 0)) {
        /* It ended, but the row was not updated before the crash: the log
         * is the truth. Keep the task hot (it replays from memory). */
        json_t *lastev = gps_tlog_get(events, gps_tlog_count(events) - 1);
        if (!lastev)
            goto oom; /* (a row finished without its code or reason: not written) */
        t->terminal = true;
        t->finished_us = gp_now_mono_us();
        json_t *d = json_object_get(lastev, "data");
        if (g->store) {
            gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT(t->id);
            u.lease_attempt = t->lease_attempt;
            bool done = strcmp(last_type, "end") == 0;
            u.status = done ? "done" : "failed";
            u.finish_reason = done ? json_string_value(json_object_get(d, "finish_reason")) : NULL;
            u.error_code = done ? NULL : json_string_value(json_object_get(d, "code"));
            u.error_message = done ? NULL : json_string_value(json_object_get(d, "message"));
            u.finished_at = gp_now_wall_ms();
            gps_store_job_update_async(g->store, u);
            if (done)
                gps_store_checkpoint_fenced(g->store, t->id, text.data ? text.data : "",
                                            text.len, (long long)gps_tlog_count(events),
                                            t->lease_attempt);
        }
        json_decref(lastev);
    }
    if (t->terminal) {
        gp_buf_free(&text);
        tasks_link(g, t);
        return 0;
    }
    if (text.len) {
        t->resume_text = strndup(text.data, text.len);
        if (!t->resume_text)
            goto oom;
    }
    gp_buf_free(&text);
    t->resume_deadline_us =
        gp_now_mono_us() + (uint64_t)(g->request_timeout_sec > 0 ? g->request_timeout_sec : 600) *
                               1000000ull;
    tasks_link(g, t);
    return 0;
oom:
    gp_buf_free(&text);
    if (t) {
        json_decref(t->resume_body);
        free(t->resume_ids);
    }
    gps_tlog_free(events);
    free(t);
    return -2;
}

int gps_tasks_restore(gps_tasks *g, const gps_store_job_info *j)
{
    /* Shared: another server may run it (its lease says): the claim loop
     * takes over those whose lease expired, each once. */
    if (g && g->shared && j && j->api && strcmp(j->api, "native") == 0)
        return 0;
    /* -2 (out of memory) passed on: start-up reads each row once, so the
     * caller must not take it for a row that cannot be restored. */
    return tasks_restore(g, j, 0);
}

/* gps_tasks_restore_unfinished's walk over the rows. */
typedef struct unfinished_ctx {
    gps_tasks *g;
    bool others_swept;
    bool oom;      /* a native task could not be restored: out of memory */
    char oom_id[40];
} unfinished_ctx;

static int unfinished_row(void *arg, const gps_store_job_info *j)
{
    unfinished_ctx *c = arg;
    int rc = gps_tasks_restore(c->g, j);
    if (rc == 0)
        return 0;
    if (rc == -2) {
        /* Not failed for it: the load stops and the server does not start
         * (gps_tasks_restore_unfinished). */
        c->oom = true;
        snprintf(c->oom_id, sizeof c->oom_id, "%s", j->id ? j->id : "");
        return 1;
    }
    if (c->others_swept)
        return 0;
    /* Not a native task (its client was connected to the previous
     * process), or a native task's row that cannot be resumed (damaged). A
     * write dropped here leaves the row to the next start: not a reason to
     * refuse this one (the queue may be full of these very writes). */
    gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT(j->id);
    u.status = "failed";
    u.error_code = "SERVER_RESTART";
    u.error_message = "the server restarted and the request could not be resumed";
    u.finished_at = gp_now_wall_ms();
    gps_store_job_update_async(c->g->store, u);
    return 0;
}

/* Why a start-up that could not restore every task stops instead of going
 * on: a native task lives only in its row, and that row is read at start-up
 * only. Failing it for a transient allocation failure would lose it for
 * good (no one reads a failed row again); leaving it unfinished while this
 * process runs would leave its client waiting for events no one makes.
 * A server that does not start loses nothing: under systemd
 * (conf/gpupool-server.service, Restart=on-failure) it is started again
 * and reads the same rows, and so does an operator's restart. */
int gps_tasks_restore_unfinished(gps_tasks *g, bool others_swept, char *err, size_t errlen)
{
    if (!g || !g->store)
        return 0;
    unfinished_ctx c = {.g = g, .others_swept = others_swept};
    char lerr[512] = "";
    int rc = gps_store_load_unfinished_jobs(g->store, unfinished_row, &c, lerr, sizeof lerr);
    if (c.oom) {
        snprintf(err, errlen,
                 "native task %s could not be restored: out of memory (no task was failed for "
                 "it; a restart restores it)",
                 c.oom_id);
        return -1;
    }
    if (rc < 0) {
        snprintf(err, errlen,
                 "the unfinished jobs could not be read: %s (no task was failed for it; a "
                 "restart reads them again)",
                 lerr[0] ? lerr : "unknown error");
        return -1;
    }
    return 0;
}

void gps_tasks_set_hot_sec(gps_tasks *g, int sec)
{
    if (g)
        g->hot_us = (uint64_t)(sec > 0 ? sec : KEEP_HOT_SEC) * 1000000ull;
}

void gps_tasks_set_hot_max_events(gps_tasks *g, size_t n)
{
    if (g)
        g->hot_max_events = n;
}

void gps_tasks_memory(const gps_tasks *g, size_t *tasks, size_t *events)
{
    *tasks = *events = 0;
    for (const task *t = g ? g->head : NULL; t; t = t->next) {
        (*tasks)++;
        *events += gps_tlog_count(t->log);
    }
}
