/*
 * api_tasks_run.c: a live task: the table of tasks, its durable event log
 * written through the store, the subscribers it streams to (catch-up in
 * slices, then live events), and the job's events turned into the task's.
 */
#include "server/dialects/api_tasks_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/dialects/poolmeta.h"
#include "server/dialects/reqcheck.h"
#include "server/http/errors.h"
#include "server/http/held.h"
#include "server/http/http.h"
#include "server/http/sse.h"
#include "server/http/textcheck.h"

unsigned tasks_bucket_of(const char *id)
{
    uint32_t h = 2166136261u;
    for (; *id; id++)
        h = (h ^ (unsigned char)*id) * 16777619u;
    return h % NBUCKETS;
}

task *tasks_find(gps_tasks *g, const char *id)
{
    for (task *t = g->buckets[tasks_bucket_of(id)]; t; t = t->hnext)
        if (strcmp(t->id, id) == 0)
            return t;
    return NULL;
}

static svc_rec *svc_get(gps_tasks *g, const char *model, bool create)
{
    for (svc_rec *r = g->svc; r; r = r->next)
        if (strcmp(r->model, model) == 0)
            return r;
    if (!create)
        return NULL;
    svc_rec *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    snprintf(r->model, sizeof r->model, "%s", model);
    r->next = g->svc;
    g->svc = r;
    return r;
}

/* Rough wait before the job starts: the jobs ahead spread over the slots
 * that serve the model, each taking the recent service time. */
static long long estimate_wait_ms(gps_tasks *g, const gps_job *job, size_t pos)
{
    const char *model = gps_job_model(job);
    svc_rec *r = svc_get(g, model, false);
    if (!r || r->ewma_ms <= 0)
        return (long long)sched_estimated_wait_ms(gps_jobs_sched(g->jobs), model);
    long long slots = registry_model_slots(gps_jobs_registry(g->jobs), model);
    if (slots < 1)
        slots = 1;
    return (long long)((double)((long long)pos / slots + 1) * r->ewma_ms);
}

int tasks_sse_frame(gp_buf *out, const json_t *ev)
{
    char idbuf[32];
    snprintf(idbuf, sizeof idbuf, "%lld", (long long)json_integer_value(json_object_get(ev, "seq")));
    return gps_sse_format_json(out, json_string_value(json_object_get(ev, "type")), idbuf,
                               json_object_get(ev, "data"));
}

void tasks_sub_remove(task *t, task_sub *s)
{
    for (task_sub **pp = &t->subs; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            return;
        }
}

/* Events a client may be sent: those durable in the store (all of them
 * without a store: nothing would survive a restart anyway). */
size_t tasks_released(const task *t)
{
    return t->owner->gated ? t->durable : gps_tlog_count(t->log);
}

/* Hand events[from..) to the store as one job_events batch (async,
 * group-committed: never blocks the loop). Returns the op's seq, 0 when
 * the write was refused (queue full, ENOMEM). */
uint64_t tasks_write(task *t, size_t from)
{
    size_t n = gps_tlog_count(t->log);
    json_t *batch = json_array();
    size_t i = from;
    for (; batch && i < n; i++)
        if (json_array_append_new(batch, gps_tlog_get(t->log, i)) < 0)
            break; /* ENOMEM: no row with a gap */
    uint64_t seq = 0;
    int rc = -1;
    if (batch && i >= n)
        rc = t->lease_attempt > 0
                 ? gps_store_job_events_fenced(t->owner->store, t->id, batch, t->lease_attempt,
                                               &seq)
                 : gps_store_job_events_seq(t->owner->store, t->id, batch, &seq);
    if (rc == 0 && t->owner->shared)
        gps_store_notify(t->owner->store, CH_TASK_JOB, t->id); /* followers read it at once */
    if (rc < 0) {
        seq = 0;
        gp_log_warn("task_checkpoint_failed", "job %s: events %zu..%zu not stored yet", t->id,
                    from + 1, n);
    }
    json_decref(batch);
    return seq;
}

/* Write the events not yet durable, unless a batch is in flight (its
 * commit notification writes the rest: one batch per task at a time, so
 * a burst of events shares a row and a retry is never out of order). */
void tasks_flush(task *t)
{
    gps_tasks *g = t->owner;
    size_t n = gps_tlog_count(t->log);
    if (!g->gated || t->inflight_seq || t->durable >= n)
        return;
    uint64_t seq = tasks_write(t, t->durable);
    if (!seq) {
        t->retry_us = gp_now_mono_us() + FLUSH_RETRY_US; /* the tick tries again */
        return;
    }
    t->inflight_seq = seq;
    t->inflight_n = n;
    t->fnext = g->inflight;
    g->inflight = t;
}

/* Shared: answer the creation held until the row was committed. */
static void create_answer(task *t)
{
    if (!t->create_reply)
        return;
    gps_held_release(&t->create_held);
    if (t->create_held.req)
        gps_http_send_json(t->create_held.req, 202, t->create_reply);
    else
        json_decref(t->create_reply);
    t->create_reply = NULL;
}

/* Shared: the row's commit did not come within a lease (the database is
 * away): answer the held creation 503 instead of holding it until the
 * database returns, and cancel the job -- the client never learned its
 * id. The task stays until its terminal event is written, so a row that
 * did land ends cancelled rather than being claimed and run elsewhere. */
void tasks_create_refuse(gps_tasks *g, task *t)
{
    int sec = (int)(g->lease_us / 1000000u);
    char msg[200];
    snprintf(msg, sizeof msg,
             "the database did not confirm this task within %d s: it was not accepted; retry, "
             "here or on another server",
             sec);
    gps_held_release(&t->create_held);
    if (t->create_held.req)
        gps_send_error_retry(t->create_held.req, GPS_DIALECT_NATIVE, 503, "SERVER_BUSY", msg,
                             NULL, t->corr, 1);
    json_decref(t->create_reply);
    t->create_reply = NULL;
    gp_log_write(GP_LOG_WARN, "task_create_unconfirmed", t->corr,
                 json_pack("{s:s,s:i}", "job_id", t->id, "waited_sec", sec),
                 "native task not confirmed by the database in time: refused with 503");
    if (t->job)
        gps_jobs_cancel(g->jobs, t->job, "create_unconfirmed");
}

/* The store committed (or failed) its job_events writes up to done_seq:
 * release what became durable to the streams, write what waited. */
void tasks_on_commit(void *arg, uint64_t done_seq, bool failed)
{
    gps_tasks *g = arg;
    task *list = g->inflight;
    g->inflight = NULL;
    task *next;
    for (task *t = list; t; t = next) {
        next = t->fnext;
        t->fnext = NULL;
        if (t->inflight_seq > done_seq) {
            t->fnext = g->inflight; /* still in flight */
            g->inflight = t;
            continue;
        }
        t->inflight_seq = 0;
        if (failed) {
            /* Maybe this batch, maybe another: write it again (same
             * first_seq: replaces the row if it did land). */
            t->inflight_n = t->durable;
            t->retry_us = gp_now_mono_us() + FLUSH_RETRY_US;
            if (t->lease_attempt > 0)
                tasks_lease_check(t); /* refused as an older attempt? */
            continue;
        }
        t->durable = t->inflight_n;
        create_answer(t);
        tasks_flush(t);
        task_sub *s = t->subs;
        while (s) {
            task_sub *sn = s->next;
            tasks_sub_catch_up(t, s); /* may finish s (unlinked; freed later) */
            s = sn;
        }
    }
}

static void inflight_unlink(gps_tasks *g, task *t)
{
    for (task **pp = &g->inflight; *pp; pp = &(*pp)->fnext)
        if (*pp == t) {
            *pp = t->fnext;
            break;
        }
    t->fnext = NULL;
}

void tasks_sub_free(void *arg)
{
    task_sub *s = arg;
    gps_stream_clear(&s->s);
    free(s);
}

/* The head of a long event's frame: its lines up to the data's "text"
 * member, opened ({"a":1} -> ...data: {"a":1,"text":"). 0, or -1 (ENOMEM:
 * out as it was). */
static int long_event_head(gp_buf *out, const json_t *ev, const json_t *data)
{
    size_t at = out->len;
    json_t *head = json_deep_copy(data);
    /* gp_json_dumps: jansson's own dump can leave a key out and succeed */
    char *h = head && json_object_del(head, "text") == 0 ? gp_json_dumps(head) : NULL;
    json_decref(head);
    size_t hl = h ? strlen(h) : 0;
    int rc = h && gp_buf_appendf(out, "event: %s\nid: %lld\ndata: ",
                                 json_string_value(json_object_get(ev, "type")),
                                 (long long)json_integer_value(json_object_get(ev, "seq"))) == 0 &&
                     gp_buf_append(out, h, hl - 1) == 0 &&
                     gp_buf_appendf(out, "%s\"text\":\"", hl > 2 ? "," : "") == 0
                 ? 0
                 : -1;
    free(h);
    if (rc < 0)
        gp_buf_truncate(out, at);
    return rc;
}

int tasks_frame_long_event(gp_buf *out, task_sub *s, const json_t *ev)
{
    const json_t *data = json_object_get(ev, "data");
    const json_t *text = json_object_get(data, "text");
    const char *tx = json_string_value(text);
    size_t len = json_string_length(text);
    size_t at = out->len;
    if (s->part == 0 && long_event_head(out, ev, data) < 0)
        return -1;
    size_t n = gps_sse_utf8_slice(tx + s->part, len - s->part, CATCHUP_SLICE);
    /* The slice as the inside of a JSON string, as json_dumps escapes it
     * (tx is jansson's string: UTF-8, and a slice ends on a boundary). */
    if (gp_json_escape_append(out, tx + s->part, n) < 0 ||
        (s->part + n >= len && gp_buf_append(out, "\"}\n\n", 4) < 0)) {
        gp_buf_truncate(out, at);
        return -1;
    }
    s->part += n;
    if (s->part < len)
        return 0;
    s->part = 0;
    return 1;
}

/* Is ev one to write in slices (its data's last member a long "text")? */
static bool is_long_event(const json_t *ev)
{
    const json_t *data = json_object_get(ev, "data");
    const json_t *text = json_object_get(data, "text");
    if (!json_is_string(text) || json_string_length(text) <= CATCHUP_SLICE)
        return false;
    /* Byte-identical framing only when "text" is the last member. */
    const char *last = NULL;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)data, k, v) last = k;
    return last && strcmp(last, "text") == 0;
}

/* Write what s has not seen while its client keeps up; at the end of a
 * terminal task's log, end the reply and free s. Returns true when s was
 * freed. */
bool tasks_sub_catch_up(task *t, task_sub *s)
{
    size_t lim = tasks_released(t);
    bool oom = false;
    gp_buf *out = &s->s.out;
    while (s->s.req && s->ev_sent < lim && !oom) {
        if (gps_stream_blocked(&s->s))
            break; /* sub_writable resumes */
        while (s->ev_sent < lim && out->len < CATCHUP_SLICE) {
            if ((long long)s->ev_sent < s->after) {
                s->ev_sent++; /* the client has it (Last-Event-ID) */
                continue;
            }
            json_t *ev = gps_tlog_get(t->log, s->ev_sent);
            if (!ev) {
                oom = true; /* ENOMEM: the next event, write or tick tries again */
                break;
            }
            int done = s->part > 0 || is_long_event(ev) ? tasks_frame_long_event(out, s, ev)
                       : tasks_sse_frame(out, ev) == 0 ? 1
                                                       : -1;
            json_decref(ev);
            if (done < 0) {
                oom = true; /* the same: never a stream that goes on without it */
                break;
            }
            if (done == 0)
                break; /* more slices: send this one first */
            s->ev_sent++;
        }
        gps_stream_send(&s->s);
    }
    s->retry = oom;
    if (s->s.req && t->terminal && s->ev_sent >= gps_tlog_count(t->log) &&
        lim >= gps_tlog_count(t->log)) {
        tasks_sub_remove(t, s);
        gps_stream_end(&s->s);
        gps_stream_free_later(&s->s, tasks_sub_free); /* (a drain may have called us) */
        return true;
    }
    return false;
}

/* requests_total{api="native"}: a task's outcome, once, when it ends (its
 * terminal event): ok, or the error code (CANCELLED: cancelled). */
static void count_outcome(task *t, const char *type, const char *code)
{
    gps_tasks *g = t->owner;
    const char *outcome = strcmp(type, "end") == 0 ? "ok" : code ? code : "AGENT_ERROR";
    gps_metrics_request(g->metrics, "native", outcome,
                        (double)(gp_now_mono_us() - t->created_us) / 1e6);
}

/* The event just recorded: stored, then sent to the open streams once it
 * is durable (tasks_on_commit; at once without a store). */
static void task_publish(task *t)
{
    tasks_flush(t);
    task_sub *s = t->subs; /* without a store: sent now; else at the commit */
    while (s) {
        task_sub *next = s->next;
        tasks_sub_catch_up(t, s); /* may finish s (unlinked; freed later) */
        s = next;
    }
}

/* An event of t (type) could not be recorded whole (out of memory). The
 * log never goes on without it (a client would get a text with a hole, a
 * restart would resume from it), so the task ends here with the log's
 * reserved error event (INTERNAL, out of memory: gps_tlog_append_oom,
 * built with the log), which its streams and followers get as any end;
 * its job fails with the same (the agent stops, the row says failed). */
void tasks_oom_end(task *t, const char *type)
{
    /* (end_pending: the job ended, its end or error is still to come; no
     * event follows the job's end) */
    if (t->terminal || t->end_pending)
        return;
    if (gps_tlog_append_oom(t->log) < 0) {
        /* Not reached: a log keeps its reserved event until it ends. */
        gp_log_error("task_event_lost", "job %s: a %s event was not recorded", t->id, type);
        return;
    }
    t->terminal = true;
    t->finished_us = gp_now_mono_us();
    count_outcome(t, "error", "INTERNAL");
    gp_log_write(GP_LOG_WARN, "task_event_oom", t->corr,
                 json_pack("{s:s,s:s}", "job_id", t->id, "event", type),
                 "a native task's event could not be recorded (out of memory): the task "
                 "fails with INTERNAL");
    task_publish(t);
    /* After the log's end: its error event, delivered back to
     * tasks_on_job_event, finds the task terminal. */
    if (t->job)
        gps_jobs_fail(t->owner->jobs, t->job, 500, "INTERNAL", "out of memory");
}

/* Record an event (data and hidden stolen: hidden's members go to the
 * store beside seq/type/data, never to a client) and publish it. 0, or
 * -1 when out of memory (data NULL: its caller could not build it;
 * hidden_lost: a hidden member could not be built; or the log could not
 * take it): nothing recorded. */
static int task_record(task *t, const char *type, json_t *data, json_t *hidden,
                       bool hidden_lost, bool terminal)
{
    if (!data || hidden_lost) {
        json_decref(data);
        json_decref(hidden);
        return -1;
    }
    if (terminal)
        json_incref(data); /* count_outcome reads it */
    if (gps_tlog_append(t->log, type, data, hidden) < 0) {
        if (terminal)
            json_decref(data);
        return -1;
    }
    if (terminal) {
        t->terminal = true;
        t->finished_us = gp_now_mono_us();
        count_outcome(t, type, json_string_value(json_object_get(data, "code")));
        json_decref(data);
    }
    task_publish(t);
    return 0;
}

/* task_record, and when the event cannot be recorded the task ends
 * (tasks_oom_end): never a log that goes on without it. */
static void task_emit_hidden(task *t, const char *type, json_t *data, json_t *hidden,
                             bool hidden_lost, bool terminal)
{
    if (t->terminal) {
        json_decref(data);
        json_decref(hidden);
        return;
    }
    if (task_record(t, type, data, hidden, hidden_lost, terminal) < 0)
        tasks_oom_end(t, type);
}

void tasks_emit(task *t, const char *type, json_t *data, bool terminal)
{
    task_emit_hidden(t, type, data, NULL, false, terminal);
}

/* A token event: coalesced into the log's token run (task_log.h), with
 * the token ids behind it while the job's ids are token-exact (a restart
 * resumes from them, issue 25 finding 8). */
static void task_emit_token(task *t, const json_t *ev)
{
    if (t->terminal)
        return;
    const char *text = json_string_value(json_object_get(ev, "text"));
    int32_t one, *ids = NULL;
    size_t n = 0;
    if (gps_job_ids_digest(t->job)) {
        const json_t *arr = json_object_get(ev, "token_ids");
        const json_t *id = json_object_get(ev, "token_id");
        n = json_array_size(arr);
        if (n) {
            ids = malloc(n * sizeof *ids);
            if (!ids) {
                /* A token without its ids would make a restart resume
                 * from a different place than the text: not recorded. */
                tasks_oom_end(t, "token");
                return;
            }
            for (size_t i = 0; i < n; i++)
                ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
        } else if (json_is_integer(id)) {
            one = (int32_t)json_integer_value(id);
            ids = &one;
            n = 1;
        }
    }
    int rc = gps_tlog_append_token(t->log, text ? text : "", text ? strlen(text) : 0, ids, n);
    if (ids != &one)
        free(ids);
    if (rc < 0) {
        tasks_oom_end(t, "token"); /* never a text with the token left out */
        return;
    }
    task_publish(t);
}

void tasks_emit_queued(task *t)
{
    gps_job *job = t->job;
    size_t pos = gps_jobs_queue_position(t->owner->jobs, job);
    if (t->terminal)
        return;
    /* A position not announced for want of memory is announced by the
     * tick (it compares last_pos): a snapshot taken again, not an event
     * left out, so the task goes on. */
    json_t *d = json_pack("{s:I,s:I}", "position", (json_int_t)pos, "estimated_wait_ms",
                          (json_int_t)estimate_wait_ms(t->owner, job, pos));
    t->last_pos = task_record(t, "queued", d, NULL, false, false) == 0 ? (long long)pos : -2;
}

/* The started event, with the file the job's token ids belong to, for a
 * restart (hidden). */
static void task_emit_started(task *t, gps_job *job)
{
    const char *dg = gps_job_ids_digest(job);
    json_t *hidden = dg ? json_pack("{s:s}", "digest", dg) : NULL;
    task_emit_hidden(t, "started",
                     json_pack("{s:s,s:i}", "agent_id", gps_job_agent_id(job), "attempt",
                               gps_job_attempts(job)),
                     hidden, dg && !hidden, false);
}

/* A failed job's error event data: the code and message of the event
 * the job failed with (ev; NULL, never seen: the defaults). NULL when
 * out of memory. */
static json_t *error_data(const json_t *ev)
{
    const char *code = json_string_value(json_object_get(ev, "code"));
    const char *message = json_string_value(json_object_get(ev, "message"));
    return json_pack("{s:s,s:s}", "code", code ? code : "AGENT_ERROR", "message",
                     message ? message : "the job failed");
}

/* The terminal event of t's ended job, as GET says it (the job's state):
 * a done job's end, with its finish reason, usage and whole text read
 * from the job; a failed or cancelled one's error, with the code and
 * message of the job's error event (t->error_ev: the job keeps only its
 * code). Both are held until the task is evicted, so a retry builds the
 * same event. 0, or -1 out of memory: nothing recorded, the task waits
 * for it (end_pending; the tick tries again). Never the reserved
 * INTERNAL error instead: the job ended, GET and the row say how (done
 * with the whole result, failed with its code), and the log must agree
 * with them. */
static int task_record_terminal(task *t)
{
    if (t->terminal)
        return 0;
    gps_job *job = t->job;
    int rc;
    if (gps_job_state_of(job) == GPS_JOB_DONE) {
        const char *fr = gps_job_finish_reason(job);
        json_t *d = json_pack("{s:s,s:{s:I,s:I},s:s%}", "finish_reason", fr[0] ? fr : "stop",
                              "usage", "prompt_tokens", (json_int_t)gps_job_prompt_tokens(job),
                              "completion_tokens", (json_int_t)gps_job_completion_tokens(job),
                              "text", gps_job_text(job), gps_job_text_len(job));
        rc = task_record(t, "end", d, NULL, false, true);
    } else {
        rc = task_record(t, "error", error_data(t->error_ev), NULL, false, true);
    }
    t->end_pending = rc < 0;
    if (rc == 0) {
        json_decref(t->error_ev);
        t->error_ev = NULL;
    }
    return rc;
}

void tasks_retry_end(task *t)
{
    if (!t->end_pending || !t->job)
        return;
    if (task_record_terminal(t) == 0)
        gp_log_write(GP_LOG_INFO, "task_end_recorded", t->corr,
                     json_pack("{s:s}", "job_id", t->id),
                     "a native task's terminal event, delayed for want of memory, was recorded");
}

/* The job ended: its terminal event recorded, or (out of memory) left to
 * the tick, said in the log. */
static void task_job_ended(task *t, const char *type)
{
    if (task_record_terminal(t) < 0)
        gp_log_write(GP_LOG_WARN, "task_end_oom", t->corr,
                     json_pack("{s:s,s:s}", "job_id", t->id, "event", type),
                     "a native task's terminal event could not be recorded (out of memory): "
                     "the tick records it again");
}

/* A job event's copy without its type: the data of a metrics or failover
 * event. NULL when out of memory. */
static json_t *event_data(const json_t *ev)
{
    json_t *d = json_deep_copy(ev);
    if (d)
        json_object_del(d, "type");
    return d;
}

void tasks_on_job_event(gps_job *job, gps_event_type type, json_t *ev, void *arg)
{
    task *t = arg;
    gps_tasks *g = t->owner;
    bool was_terminal = t->terminal;
    switch (type) {
    case GPS_EV_STARTED: {
        task_emit_started(t, job);
        t->last_pos = -1;
        break;
    }
    case GPS_EV_TOKEN: {
        /* (last_pos -2: queued, its position not announced yet) */
        if (t->last_pos != -1 || gps_tlog_count(t->log) <= 1) {
            /* No started event from the agent: announce the start anyway. */
            bool seen = false;
            for (size_t i = 0; !seen && i < gps_tlog_count(t->log); i++)
                seen = strcmp(gps_tlog_type(t->log, i), "started") == 0;
            if (!seen)
                task_emit_started(t, job);
            t->last_pos = -1;
        }
        task_emit_token(t, ev);
        gps_job_mark_output_sent(job);
        break;
    }
    case GPS_EV_METRICS: {
        tasks_emit(t, "metrics", event_data(ev), false);
        break;
    }
    case GPS_EV_FAILOVER: {
        /* The agent was lost after tokens were recorded: another agent
         * continues from the text so far. One more numbered, non-terminal
         * event; the tokens that follow continue the same text. */
        tasks_emit(t, "failover", event_data(ev), false);
        break;
    }
    case GPS_EV_END: {
        uint64_t assigned_us = gps_job_assigned_us(job);
        if (assigned_us) {
            svc_rec *r = svc_get(g, gps_job_model(job), true);
            double ms = (double)(gp_now_mono_us() - assigned_us) / 1000.0;
            if (r)
                r->ewma_ms = r->ewma_ms > 0 ? 0.8 * r->ewma_ms + 0.2 * ms : ms;
        }
        task_job_ended(t, "end");
        break;
    }
    case GPS_EV_ERROR: {
        /* (terminal: tasks_oom_end failed the job; its log has its end) */
        if (t->terminal || t->end_pending)
            break;
        /* Kept (a reference: no allocation that could fail) until the
         * error is recorded: a retry makes the same event from it. */
        t->error_ev = json_incref(ev);
        task_job_ended(t, "error");
        break;
    }
    default:
        return;
    }
    /* Once, when the task ends (a job failed by tasks_oom_end delivers
     * its error event here while the task is terminal already), or its
     * job did and the end or error event waits (its seq: the next): the
     * row's result text, also when the server stops before that event is
     * recorded (a cold GET or replay then makes it from the row: the end
     * with this text, or the error with the row's code, the job's). */
    if (!was_terminal && (t->terminal || t->end_pending) && g->store)
        gps_store_checkpoint_fenced(g->store, t->id, gps_job_text(job),
                                    gps_job_text_len(job),
                                    (long long)gps_tlog_count(t->log) + (t->end_pending ? 1 : 0),
                                    t->lease_attempt);
}

void tasks_free(gps_tasks *g, task *t)
{
    task **pp = &g->buckets[tasks_bucket_of(t->id)];
    while (*pp && *pp != t)
        pp = &(*pp)->hnext;
    if (*pp)
        *pp = t->hnext;
    if (t->prev)
        t->prev->next = t->next;
    else if (g->head == t)
        g->head = t->next;
    if (t->next)
        t->next->prev = t->prev;
    task_sub *s = t->subs;
    while (s) {
        task_sub *n = s->next;
        gps_stream_end(&s->s);
        tasks_sub_free(s);
        s = n;
    }
    if (t->job)
        gps_job_unsubscribe(t->job, tasks_on_job_event, t);
    if (t->inflight_seq)
        inflight_unlink(g, t);
    create_answer(t);
    gps_tlog_free(t->log);
    json_decref(t->error_ev);
    json_decref(t->resume_body);
    free(t->resume_text);
    free(t->resume_ids);
    free(t);
}
