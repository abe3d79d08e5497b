/* api_tasks: see api_tasks.h. */
#include "server/dialects/api_tasks.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/dialects/poolmeta.h"
#include "server/dialects/reqcheck.h"
#include "server/dialects/task_log.h"
#include "server/auth/auth.h"
#include "server/http/errors.h"
#include "server/http/held.h"
#include "server/stream/stream.h"
#include "server/http/http.h"
#include "server/metrics.h"
#include "server/http/sse.h"
#include "server/store/store.h"
#include "server/http/textcheck.h"

#define MAX_STOP 16
#define NBUCKETS 1024
#define TICK_MS 250
#define KEEP_HOT_SEC 300 /* default: terminal tasks stay in memory 5 minutes */
#define KEEPALIVE_US (15ull * 1000000ull)
/* A job_events write that failed (queue full, a failed COMMIT) is tried
 * again from the tick, at most this often. */
#define FLUSH_RETRY_US (250ull * 1000ull)
/* Several servers (gps_tasks_set_shared): a follower of a task run by
 * another server reads the store's new events this often; expired leases
 * are claimed this often, at most CLAIM_MAX tasks at a time; a lease is
 * renewed three times per its length. */
#define FOLLOW_MS 100
#define CLAIM_MS 500
#define CLAIM_MAX 16
#define DEFAULT_LEASE_SEC 10
/* A follower that finds the row finished without a terminal event in the
 * log gives up after this many reads (the client's reconnect is answered
 * from the row, cold_done). */
#define FOLLOW_FINISHED_POLLS 20
/* Wake-ups across servers (LISTEN/NOTIFY, gps_store_listen; issue 28): an
 * owner notifies CH_TASK_JOB (payload: the task's id) after each events
 * batch, so that its followers and cancel waiters elsewhere read at once;
 * a server that asked a cancel through the row notifies CH_TASK_CANCEL, so
 * that the owners read their cancels at once. The polls above stay, for a
 * notification lost; what a notification announces is never read before
 * its write commits (gps_store_notify). */
#define CH_TASK_JOB "gps_task_job"
#define CH_TASK_CANCEL "gps_task_cancel"

/* ------------------------------------------------------------------ */
/* Parsing                                                             */
/* ------------------------------------------------------------------ */




int gps_tasks_parse(const json_t *body, gps_job_spec *s, char *msg, size_t msglen,
                    const char **param)
{
    memset(s, 0, sizeof *s);
    s->api = "native";
    s->temperature = 1.0;
    s->top_p = 1.0;
    s->priority = GPS_PRIO_INTERACTIVE;
    *param = NULL;
    msg[0] = '\0';
    if (!json_is_object(body))
        GPS_FAIL(NULL, "request body must be a JSON object");
    const json_t *model = json_object_get(body, "model");
    if (!json_is_string(model) || json_string_length(model) == 0 ||
        json_string_length(model) > 256)
        GPS_FAIL("model", "'model' is required: a non-empty string of at most 256 bytes");
    s->model = strdup(json_string_value(model));

    const json_t *p = json_object_get(body, "prompt");
    const json_t *m = json_object_get(body, "messages");
    if (!gps_absent(p) && !gps_absent(m))
        GPS_FAIL("prompt", "give either 'prompt' or 'messages', not both");
    if (!gps_absent(p)) {
        if (!json_is_string(p))
            GPS_FAIL("prompt", "'prompt' must be a string");
        s->kind = GPS_JOB_COMPLETION;
        s->prompt = strdup(json_string_value(p));
    } else if (!gps_absent(m)) {
        if (!json_is_array(m) || json_array_size(m) == 0)
            GPS_FAIL("messages", "'messages' must be a non-empty array");
        s->kind = GPS_JOB_CHAT;
        s->messages = json_array();
        size_t i;
        json_t *e;
        json_array_foreach(m, i, e)
        {
            const char *role = json_string_value(json_object_get(e, "role"));
            const json_t *c = json_object_get(e, "content");
            if (!role || (strcmp(role, "system") && strcmp(role, "user") &&
                          strcmp(role, "assistant")))
                GPS_FAIL("messages", "messages[%zu].role must be system, user or assistant", i);
            if (!json_is_string(c))
                GPS_FAIL("messages", "messages[%zu].content must be a string", i);
            json_array_append_new(s->messages, json_pack("{s:s,s:O}", "role", role, "content", c));
        }
    } else {
        GPS_FAIL("prompt", "'prompt' or 'messages' is required");
    }

    const json_t *mt = json_object_get(body, "max_tokens");
    if (!json_is_integer(mt) || json_integer_value(mt) < 1 ||
        json_integer_value(mt) > GPS_MAX_TOKENS_LIMIT)
        GPS_FAIL("max_tokens", "'max_tokens' is required: an integer between 1 and %d",
             GPS_MAX_TOKENS_LIMIT);
    s->max_tokens = json_integer_value(mt);
    if (gps_sampling_parse(body, s, 2, MAX_STOP, msg, msglen, param) < 0)
        goto fail;
    if (gps_seed_parse(json_object_get(body, "seed"), s) < 0)
        GPS_FAIL("seed", "'seed' must be an integer");
    if (!s->has_seed) {
        /* Recorded with the job so the run can be reproduced. */
        uint32_t r;
        gp_random_bytes(&r, sizeof r);
        s->seed = (long long)(r & 0x7fffffff);
    }
    s->has_seed = true;
    if (gps_priority_parse(json_object_get(body, "priority"), &s->priority) < 0)
        GPS_FAIL("priority", "'priority' must be \"interactive\" or \"batch\"");
    const json_t *sid = json_object_get(body, "session_id");
    if (!gps_absent(sid)) {
        if (!json_is_string(sid) || json_string_length(sid) == 0 || json_string_length(sid) > 256)
            GPS_FAIL("session_id", "'session_id' must be a non-empty string of at most 256 bytes");
        s->session = strdup(json_string_value(sid));
    }
    if (gps_pool_options_parse(json_object_get(body, "x_pool_options"), s, msg, msglen, param) <
        0)
        goto fail;
    if (!s->model || (s->kind == GPS_JOB_COMPLETION && !s->prompt) ||
        (s->kind == GPS_JOB_CHAT && !s->messages))
        GPS_FAIL(NULL, "out of memory");
    return 0;
fail:
    gps_job_spec_clear(s);
    return -1;
}

long long gps_tasks_last_event_id(const char *s)
{
    if (!s || !*s)
        return 0;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 0)
        return -1;
    return v;
}

/* ------------------------------------------------------------------ */
/* Tasks                                                               */
/* ------------------------------------------------------------------ */

typedef struct task task;

/* One open events stream. */
typedef struct task_sub {
    gps_tasks *owner;
    task *t;                      /* NULL once detached */
    /* The held reply (stream.h): hold, peer-close watch, backpressure,
     * slow-client drop, keep-alives. s.req: NULL once the client left. */
    gps_stream s;
    /* The cursor over the task's event log: events[0..ev_sent) were
     * written; the rest wait in the log while the client is behind. A
     * long event (the end event carries the whole text) goes out in
     * slices: part bytes of its text were written so far. */
    size_t ev_sent;
    size_t part;
    /* Last-Event-ID: events with seq <= after are the client's already,
     * also those recorded after it connected (issue 10 item 5). */
    long long after;
    struct task_sub *next;
} task_sub;

/* Bytes framed per catch-up write. */
#define CATCHUP_SLICE (64 * 1024)

struct task {
    gps_tasks *owner;
    gps_job *job;                 /* subscribed until the task is evicted */
    char id[40];
    char key_id[65];
    gps_tlog *log;                /* its events, 1..n (task_log.h) */
    bool terminal;
    long long last_pos;           /* last queue position announced (-1 none) */
    uint64_t finished_us;
    task_sub *subs;
    uint64_t created_us;          /* for request_duration_seconds at the end */
    /* Durability (issue 10 item 6): an event goes to clients only once it
     * is committed to job_events, so that its id means the same thing
     * after a crash. events[0..durable) are committed (released to
     * clients); events[durable..inflight_n) are in the one batch in
     * flight (store op inflight_seq, 0: none); the rest wait for it. */
    size_t durable;
    size_t inflight_n;
    uint64_t inflight_seq;
    uint64_t retry_us;            /* a failed write: not before this */
    struct task *fnext;           /* gps_tasks.inflight list */
    /* Restored at start-up and not resubmitted yet (job is NULL): the
     * stored request, to resubmit until resume_deadline_us. */
    json_t *resume_body;
    char *resume_text;            /* token texts of the stored events */
    long long resume_tokens;      /* token events among them */
    int resume_attempts;
    char resume_agent[64];        /* agent of the last started event */
    int32_t *resume_ids;          /* token ids of the stored token events, all of */
    size_t n_resume_ids, cap_resume_ids; /* them (NULL: some lack theirs) */
    char resume_digest[65];       /* the model file they belong to */
    char corr[65];
    uint64_t resume_deadline_us;
    /* Shared: the lease attempt this server holds the task under (the
     * fencing token of its event, row and checkpoint writes); 0: not
     * fenced (one server). */
    int64_t lease_attempt;
    bool lease_checking;          /* a lease read in flight (after a failed write) */
    /* Shared: the 202 of its creation, sent once its first events (and so
     * its row, queued before them) are committed, so that any server can
     * read the task whose id a client got. */
    gps_held create_held;
    json_t *create_reply;
    struct task *hnext, *next, *prev;
};

/* An events stream, served by this server, of a task that another server
 * runs (shared store): the new events are read from the store every
 * FOLLOW_MS until the terminal one. */
typedef struct follow {
    gps_tasks *g;                 /* NULL once the tasks table is gone */
    gps_stream s;
    char id[40];
    long long next;               /* the next seq to send */
    long long after;              /* Last-Event-ID */
    bool polling;                 /* a store read in flight (it owns f then) */
    bool rewake;                  /* woken while polling: read again when it returns */
    bool gone;                    /* the client left while polling: free at the read */
    int finished_polls;
    struct follow *fnext;
} follow;

/* A store read started by the claim loop: orphaned (g NULL) when the
 * tasks table goes first. */
typedef struct pend {
    gps_tasks *g;
    int64_t attempt;
    char id[40];                  /* lease checks, claims: the task's */
    bool cancel;                  /* a claim: a cancel was asked through the row */
    struct pend *next;
} pend;

/* A DELETE of a task that another server runs (shared store, migration
 * 0012): the cancel is asked through the row; the reply waits until the
 * row is finished (its owner cancelled it, or it ended first), read every
 * FOLLOW_MS, at most until deadline_us (then 202: asked, not yet done). */
typedef struct cwait {
    gps_tasks *g;                 /* NULL once the tasks table is gone */
    gps_held held;                /* held.req: NULL once the client left */
    char id[40];
    char corr[65];
    uint64_t deadline_us;         /* 0: the request is not committed yet */
    int reply_status;             /* 200, or 202 once the deadline passed */
    bool polling;                 /* a store op in flight (it owns w then) */
    struct cwait *next;
} cwait;

/* Per-model service time (assignment to end), for the wait estimate. */
typedef struct svc_rec {
    char model[257];
    double ewma_ms;
    struct svc_rec *next;
} svc_rec;

struct gps_tasks {
    struct event_base *base;
    gps_jobs *jobs;
    gps_store *store;
    gps_metrics *metrics;
    int request_timeout_sec;
    uint64_t hot_us;              /* terminal tasks stay in memory this long */
    size_t hot_max_events;        /* ... while all of them hold fewer events (0 = no cap) */
    task *buckets[NBUCKETS];
    task *head;
    svc_rec *svc;
    struct event *tick;
    gps_auth *auth;               /* borrowed; NULL: no key is admin here */
    task *inflight;               /* tasks with a job_events write in flight */
    bool gated;                   /* events wait for their commit (store with job_events) */
    /* Several servers on one database (gps_tasks_set_shared). */
    bool shared;
    char server_id[40];
    uint64_t lease_us;
    uint64_t renew_due_us, claim_due_us;
    bool claiming;                /* a claim read in flight */
    pend *pends;                  /* store reads of the claim loop in flight */
    follow *follows;
    struct event *follow_ev;      /* FOLLOW_MS while follows or cwaits is not empty */
    /* Cancels through the row (migration 0012): asked by DELETEs answered
     * here for tasks other servers run, read for the tasks held here. */
    bool row_cancels;
    bool cancels_reading;         /* a read of the cancels asked in flight */
    uint64_t cancels_due_us;
    cwait *cwaits;
    gps_store_listener *listener; /* wake-ups (NULL: polls only) */
    int follow_ms;                /* follow_ev's period: FOLLOW_MS unless set */
};

static unsigned bucket_of(const char *id)
{
    uint32_t h = 2166136261u;
    for (; *id; id++)
        h = (h ^ (unsigned char)*id) * 16777619u;
    return h % NBUCKETS;
}

static task *task_find(gps_tasks *g, const char *id)
{
    for (task *t = g->buckets[bucket_of(id)]; t; t = t->hnext)
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

typedef struct slot_count {
    const char *model;
    long long slots;
} slot_count;

static void slots_cb(void *ud, registry_agent *a)
{
    slot_count *c = ud;
    if (a->state == REGISTRY_HEALTHY && registry_agent_serves(a, c->model))
        c->slots += a->slots_total > 0 ? a->slots_total : 1;
}

/* Rough wait before the job starts: the jobs ahead spread over the slots
 * that serve the model, each taking the recent service time. */
static long long estimate_wait_ms(gps_tasks *g, const gps_job *job, size_t pos)
{
    const char *model = gps_job_model(job);
    svc_rec *r = svc_get(g, model, false);
    if (!r || r->ewma_ms <= 0)
        return (long long)sched_estimated_wait_ms(gps_jobs_sched(g->jobs), model);
    slot_count c = {model, 0};
    registry_foreach(gps_jobs_registry(g->jobs), slots_cb, &c);
    long long slots = c.slots > 0 ? c.slots : 1;
    return (long long)((double)((long long)pos / slots + 1) * r->ewma_ms);
}

static void sse_frame(gp_buf *out, const json_t *ev)
{
    char idbuf[32];
    snprintf(idbuf, sizeof idbuf, "%lld", (long long)json_integer_value(json_object_get(ev, "seq")));
    gps_sse_format_json(out, json_string_value(json_object_get(ev, "type")), idbuf,
                        json_object_get(ev, "data"));
}


static void sub_remove(task *t, task_sub *s)
{
    for (task_sub **pp = &t->subs; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            return;
        }
}

/* Events a client may be sent: those durable in the store (all of them
 * without a store: nothing would survive a restart anyway). */
static size_t released(const task *t)
{
    return t->owner->gated ? t->durable : gps_tlog_count(t->log);
}

/* Hand events[from..) to the store as one job_events batch (async,
 * group-committed: never blocks the loop). Returns the op's seq, 0 when
 * the write was refused (queue full, ENOMEM). */
static uint64_t task_write(task *t, size_t from)
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
static void task_flush(task *t)
{
    gps_tasks *g = t->owner;
    size_t n = gps_tlog_count(t->log);
    if (!g->gated || t->inflight_seq || t->durable >= n)
        return;
    uint64_t seq = task_write(t, t->durable);
    if (!seq) {
        t->retry_us = gp_now_mono_us() + FLUSH_RETRY_US; /* the tick tries again */
        return;
    }
    t->inflight_seq = seq;
    t->inflight_n = n;
    t->fnext = g->inflight;
    g->inflight = t;
}

static bool sub_catch_up(task *t, task_sub *s);
static void lease_check(task *t);

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
static void create_refuse(gps_tasks *g, task *t)
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
static void on_commit(void *arg, uint64_t done_seq, bool failed)
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
                lease_check(t); /* refused as an older attempt? */
            continue;
        }
        t->durable = t->inflight_n;
        create_answer(t);
        task_flush(t);
        task_sub *s = t->subs;
        while (s) {
            task_sub *sn = s->next;
            sub_catch_up(t, s); /* may finish s (unlinked; freed later) */
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

static void sub_free(void *arg)
{
    task_sub *s = arg;
    gps_stream_clear(&s->s);
    free(s);
}

/* Frame part of a long event: its data with "text" last (the end event),
 * written as one data line in slices, each ending on a UTF-8 boundary.
 * Compact JSON never holds a raw newline, so the line may span chunks.
 * Appends to out from s->part on; returns true when the event is done. */
static bool frame_long_event(gp_buf *out, task_sub *s, const json_t *ev)
{
    const json_t *data = json_object_get(ev, "data");
    const json_t *text = json_object_get(data, "text");
    const char *tx = json_string_value(text);
    size_t len = json_string_length(text);
    if (s->part == 0) {
        json_t *head = json_deep_copy(data);
        json_object_del(head, "text");
        char *h = json_dumps(head, JSON_COMPACT);
        json_decref(head);
        if (!h)
            return false;
        size_t hl = strlen(h);
        gp_buf_appendf(out, "event: %s\nid: %lld\ndata: ",
                       json_string_value(json_object_get(ev, "type")),
                       (long long)json_integer_value(json_object_get(ev, "seq")));
        /* {"a":1} -> {"a":1,"text":"  ({} -> {"text":") */
        gp_buf_append(out, h, hl - 1);
        gp_buf_appendf(out, "%s\"text\":\"", hl > 2 ? "," : "");
        free(h);
    }
    size_t n = gps_sse_utf8_slice(tx + s->part, len - s->part, CATCHUP_SLICE);
    json_t *piece = json_stringn(tx + s->part, n);
    char *e = piece ? json_dumps(piece, JSON_ENCODE_ANY) : NULL;
    json_decref(piece);
    if (e) {
        gp_buf_append(out, e + 1, strlen(e) - 2); /* without the quotes */
        free(e);
    }
    s->part += n;
    if (s->part < len)
        return false;
    gp_buf_append(out, "\"}\n\n", 4);
    s->part = 0;
    return true;
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
static bool sub_catch_up(task *t, task_sub *s)
{
    size_t lim = released(t);
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
                oom = true; /* ENOMEM: the next event or write tries again */
                break;
            }
            bool more = false;
            if (s->part > 0 || is_long_event(ev))
                more = !frame_long_event(out, s, ev);
            else
                sse_frame(out, ev);
            json_decref(ev);
            if (more)
                break; /* more slices: send this one first */
            s->ev_sent++;
        }
        gps_stream_send(&s->s);
    }
    if (s->s.req && t->terminal && s->ev_sent >= gps_tlog_count(t->log) &&
        lim >= gps_tlog_count(t->log)) {
        sub_remove(t, s);
        gps_stream_end(&s->s);
        gps_stream_free_later(&s->s, sub_free); /* (a drain may have called us) */
        return true;
    }
    return false;
}

/* requests_total{api="native"}: a task's outcome, once, when it ends (its
 * terminal event): ok, or the error code (CANCELLED: cancelled). */
static void count_outcome(task *t, const char *type, const json_t *data)
{
    gps_tasks *g = t->owner;
    const char *code = json_string_value(json_object_get(data, "code"));
    const char *outcome = strcmp(type, "end") == 0 ? "ok" : code ? code : "AGENT_ERROR";
    gps_metrics_request(g->metrics, "native", outcome,
                        (double)(gp_now_mono_us() - t->created_us) / 1e6);
}

/* The event just recorded: stored, then sent to the open streams once it
 * is durable (on_commit; at once without a store). */
static void task_publish(task *t)
{
    task_flush(t);
    task_sub *s = t->subs; /* without a store: sent now; else at the commit */
    while (s) {
        task_sub *next = s->next;
        sub_catch_up(t, s); /* may finish s (unlinked; freed later) */
        s = next;
    }
}

/* Record an event (data and hidden stolen: hidden's members go to the
 * store beside seq/type/data, never to a client) and publish it. */
static void task_emit_hidden(task *t, const char *type, json_t *data, json_t *hidden,
                             bool terminal)
{
    if (t->terminal) {
        json_decref(data);
        json_decref(hidden);
        return;
    }
    if (terminal)
        json_incref(data); /* count_outcome reads it */
    if (gps_tlog_append(t->log, type, data, hidden) < 0) {
        if (terminal)
            json_decref(data);
        return;
    }
    if (terminal) {
        t->terminal = true;
        t->finished_us = gp_now_mono_us();
        count_outcome(t, type, data);
        json_decref(data);
    }
    task_publish(t);
}

static void task_emit(task *t, const char *type, json_t *data, bool terminal)
{
    task_emit_hidden(t, type, data, NULL, terminal);
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
            for (size_t i = 0; ids && i < n; i++)
                ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
            if (!ids)
                n = 0;
        } else if (json_is_integer(id)) {
            one = (int32_t)json_integer_value(id);
            ids = &one;
            n = 1;
        }
    }
    int rc = gps_tlog_append_token(t->log, text ? text : "", text ? strlen(text) : 0, ids, n);
    if (ids != &one)
        free(ids);
    if (rc == 0)
        task_publish(t);
}

static void emit_queued(task *t)
{
    gps_job *job = t->job;
    size_t pos = gps_jobs_queue_position(t->owner->jobs, job);
    t->last_pos = (long long)pos;
    task_emit(t, "queued",
              json_pack("{s:I,s:I}", "position", (json_int_t)pos, "estimated_wait_ms",
                        (json_int_t)estimate_wait_ms(t->owner, job, pos)),
              false);
}

static void on_job_event(gps_job *job, gps_event_type type, json_t *ev, void *arg)
{
    task *t = arg;
    gps_tasks *g = t->owner;
    switch (type) {
    case GPS_EV_STARTED: {
        /* The file the job's token ids belong to, for a restart (hidden). */
        const char *dg = gps_job_ids_digest(job);
        task_emit_hidden(t, "started",
                         json_pack("{s:s,s:i}", "agent_id", gps_job_agent_id(job),
                                   "attempt", gps_job_attempts(job)),
                         dg ? json_pack("{s:s}", "digest", dg) : NULL, false);
        t->last_pos = -1;
        break;
    }
    case GPS_EV_TOKEN: {
        if (t->last_pos >= 0 || gps_tlog_count(t->log) == 1) {
            /* No started event from the agent: announce the start anyway. */
            bool seen = false;
            for (size_t i = 0; !seen && i < gps_tlog_count(t->log); i++)
                seen = strcmp(gps_tlog_type(t->log, i), "started") == 0;
            const char *dg = gps_job_ids_digest(job);
            if (!seen)
                task_emit_hidden(t, "started",
                                 json_pack("{s:s,s:i}", "agent_id", gps_job_agent_id(job),
                                           "attempt", gps_job_attempts(job)),
                                 dg ? json_pack("{s:s}", "digest", dg) : NULL, false);
            t->last_pos = -1;
        }
        task_emit_token(t, ev);
        gps_job_mark_output_sent(job);
        break;
    }
    case GPS_EV_METRICS: {
        json_t *d = json_deep_copy(ev);
        json_object_del(d, "type");
        task_emit(t, "metrics", d, false);
        break;
    }
    case GPS_EV_FAILOVER: {
        /* The agent was lost after tokens were recorded: another agent
         * continues from the text so far. One more numbered, non-terminal
         * event; the tokens that follow continue the same text. */
        json_t *d = json_deep_copy(ev);
        json_object_del(d, "type");
        task_emit(t, "failover", d, false);
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
        const char *fr = gps_job_finish_reason(job);
        task_emit(t, "end",
                  json_pack("{s:s,s:{s:I,s:I},s:s%}", "finish_reason", fr[0] ? fr : "stop",
                            "usage", "prompt_tokens", (json_int_t)gps_job_prompt_tokens(job),
                            "completion_tokens", (json_int_t)gps_job_completion_tokens(job),
                            "text", gps_job_text(job), gps_job_text_len(job)),
                  true);
        break;
    }
    case GPS_EV_ERROR: {
        const char *code = json_string_value(json_object_get(ev, "code"));
        const char *message = json_string_value(json_object_get(ev, "message"));
        task_emit(t, "error",
                  json_pack("{s:s,s:s}", "code", code ? code : "AGENT_ERROR", "message",
                            message ? message : "the job failed"),
                  true);
        break;
    }
    default:
        return;
    }
    if (t->terminal && g->store)
        gps_store_checkpoint_fenced(g->store, t->id, gps_job_text(job),
                                    gps_job_text_len(job), (long long)gps_tlog_count(t->log),
                                    t->lease_attempt);
}

static void task_free(gps_tasks *g, task *t)
{
    task **pp = &g->buckets[bucket_of(t->id)];
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
        sub_free(s);
        s = n;
    }
    if (t->job)
        gps_job_unsubscribe(t->job, on_job_event, t);
    if (t->inflight_seq)
        inflight_unlink(g, t);
    create_answer(t);
    gps_tlog_free(t->log);
    json_decref(t->resume_body);
    free(t->resume_text);
    free(t->resume_ids);
    free(t);
}

/* ------------------------------------------------------------------ */
/* Restart recovery                                                    */
/* ------------------------------------------------------------------ */

static void task_link(gps_tasks *g, task *t)
{
    unsigned b = bucket_of(t->id);
    t->hnext = g->buckets[b];
    g->buckets[b] = t;
    t->next = g->head;
    if (g->head)
        g->head->prev = t;
    g->head = t;
}

/* A restored task that cannot run again: its terminal error event, and
 * the request-log row finished (the jobs module never knew this task). */
static void restore_fail(gps_tasks *g, task *t, const char *code, const char *message)
{
    task_emit(t, "error", json_pack("{s:s,s:s}", "code", code, "message", message), true);
    if (g->store) {
        gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT(t->id);
        u.lease_attempt = t->lease_attempt;
        u.status = strcmp(code, "CANCELLED") == 0 ? "cancelled" : "failed";
        u.error_code = code;
        u.finished_at = gp_now_wall_ms();
        gps_store_job_update_async(g->store, u);
    }
}

/* Submit a restored task again, under its id, with its recorded seed and
 * the text it had generated as continuation. Until an agent serving the
 * model is back (agents reconnect after a server restart) the submission
 * is refused: try again each tick until the deadline. */
static void task_resubmit(gps_tasks *g, task *t, uint64_t now)
{
    gps_job_spec spec;
    char msg[512];
    const char *param = NULL;
    if (gps_tasks_parse(t->resume_body, &spec, msg, sizeof msg, &param) < 0) {
        char m[600];
        snprintf(m, sizeof m, "the stored request cannot be resubmitted: %s", msg);
        restore_fail(g, t, "SERVER_RESTART", m);
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
    if (!spec.resume_id || (t->resume_tokens > 0 && !spec.resume_text) ||
        (spec.resume_text && t->resume_ids && !spec.resume_ids)) {
        gps_job_spec_clear(&spec);
        return; /* ENOMEM: next tick */
    }
    gps_submit_err e;
    gps_job *job = gps_jobs_submit(g->jobs, &spec, t->corr, t->key_id, &e);
    gps_job_spec_clear(&spec);
    if (!job) {
        bool later = e.status == 503 || e.status == 429 || e.status == 404;
        if (later && now < t->resume_deadline_us)
            return;
        char m[400];
        snprintf(m, sizeof m, "the task could not be resumed after a server restart: %s",
                 e.message);
        restore_fail(g, t, e.code ? e.code : "SERVER_RESTART", m);
        return;
    }
    t->job = job;
    gps_job_set_lease_attempt(job, t->lease_attempt); /* its row: for this attempt only */
    gps_job_subscribe(job, on_job_event, t);
    gp_log_write(GP_LOG_INFO, "task_resumed", t->corr,
                 json_pack("{s:s,s:I,s:I}", "job_id", t->id, "events",
                           (json_int_t)gps_tlog_count(t->log), "completion_tokens",
                           (json_int_t)t->resume_tokens),
                 "native task resubmitted after a server restart");
    if (t->resume_tokens > 0)
        /* Same shape as a continuation failover (the jobs module): the tokens that
         * follow continue the text the client already has. */
        task_emit(t, "failover",
                  json_pack("{s:s,s:s,s:i,s:I}", "from_agent", t->resume_agent, "reason",
                            "SERVER_RESTART", "attempt", t->resume_attempts + 1,
                            "completion_tokens", (json_int_t)t->resume_tokens),
                  false);
    if (gps_job_state_of(job) == GPS_JOB_QUEUED)
        emit_queued(t);
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
 * -1 when it has none (or ENOMEM): no token-exact resume then. */
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
            return -1;
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

static int task_restore(gps_tasks *g, const gps_store_job_info *j, int64_t lease_attempt)
{
    if (!g || !j || !j->id || !j->api || strcmp(j->api, "native") != 0 ||
        !json_is_object(j->request) || !json_object_get(j->request, "model") ||
        task_find(g, j->id))
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
        if (!type || gps_tlog_append_stored(events, ev) < 0)
            break;
        last_type = gps_tlog_type(events, i);
        if (strcmp(type, "token") == 0) {
            const char *tx = json_string_value(json_object_get(data, "text"));
            if (tx && gp_buf_append(&text, tx, strlen(tx)) < 0)
                goto oom;
            t->resume_tokens++;
            if (ids_ok && resume_ids_add(t, json_object_get(ev, "ids")) < 0)
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
    if (last_type && (strcmp(last_type, "end") == 0 || strcmp(last_type, "error") == 0)) {
        /* It ended, but the row was not updated before the crash: the log
         * is the truth. Keep the task hot (it replays from memory). */
        t->terminal = true;
        t->finished_us = gp_now_mono_us();
        json_t *lastev = gps_tlog_get(events, gps_tlog_count(events) - 1);
        json_t *d = json_object_get(lastev, "data");
        if (g->store) {
            gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT(t->id);
            u.lease_attempt = t->lease_attempt;
            bool done = strcmp(last_type, "end") == 0;
            u.status = done ? "done" : "failed";
            u.finish_reason = done ? json_string_value(json_object_get(d, "finish_reason")) : NULL;
            u.error_code = done ? NULL : json_string_value(json_object_get(d, "code"));
            u.finished_at = gp_now_wall_ms();
            gps_store_job_update_async(g->store, u);
            if (done)
                gps_store_checkpoint_fenced(g->store, t->id, text.data ? text.data : "",
                                            text.len, (long long)gps_tlog_count(events),
                                            t->lease_attempt);
        }
        json_decref(lastev);
    }
    /* Kept while the task has no job: resubmission, status (model, seed). */
    t->resume_body = json_deep_copy(j->request);
    if (!t->resume_body)
        goto oom;
    if (j->has_seed)
        json_object_set_new(t->resume_body, "seed", json_integer(j->seed));
    if (t->terminal) {
        gp_buf_free(&text);
        task_link(g, t);
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
    task_link(g, t);
    return 0;
oom:
    gp_buf_free(&text);
    if (t) {
        json_decref(t->resume_body);
        free(t->resume_ids);
    }
    gps_tlog_free(events);
    free(t);
    return -1;
}

int gps_tasks_restore(gps_tasks *g, const gps_store_job_info *j)
{
    /* Shared: another server may run it (its lease says): the claim loop
     * takes over those whose lease expired, each once. */
    if (g && g->shared && j && j->api && strcmp(j->api, "native") == 0)
        return 0;
    return task_restore(g, j, 0);
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

/* ------------------------------------------------------------------ */
/* Several servers on one database (docs/scaling.md "Native tasks     */
/* across servers")                                                    */
/* ------------------------------------------------------------------ */

static void follow_free(follow *f)
{
    gps_stream_clear(&f->s);
    free(f);
}

static void follow_unlink(gps_tasks *g, follow *f)
{
    for (follow **pp = &g->follows; *pp; pp = &(*pp)->fnext)
        if (*pp == f) {
            *pp = f->fnext;
            break;
        }
    f->fnext = NULL;
}

/* The terminal event went out (or the task is gone): end the reply. */
static void follow_end(follow *f)
{
    if (f->g)
        follow_unlink(f->g, f);
    gps_stream_end(&f->s);
    follow_free(f);
}

static bool is_terminal_type(const char *type)
{
    return type && (strcmp(type, "end") == 0 || strcmp(type, "error") == 0);
}

/* Frame the events of one stored batch (a JSON array as text) that come
 * next; true when the terminal one was among them. A gap (a batch not
 * committed yet) stops: the next read brings it. */
static bool follow_frame_batch(follow *f, const char *text)
{
    json_t *arr = text ? json_loads(text, 0, NULL) : NULL;
    bool terminal = false;
    size_t i;
    json_t *ev;
    json_array_foreach(arr, i, ev)
    {
        long long seq = (long long)json_integer_value(json_object_get(ev, "seq"));
        if (seq < f->next)
            continue;
        if (seq != f->next)
            break;
        if (seq > f->after)
            sse_frame(&f->s.out, ev);
        f->next++;
        if (is_terminal_type(json_string_value(json_object_get(ev, "type")))) {
            terminal = true;
            break;
        }
    }
    json_decref(arr);
    return terminal;
}

/* Run follow_tick every follow_ms while there is something to read. */
static void follow_ev_start(gps_tasks *g)
{
    int ms = g->follow_ms > 0 ? g->follow_ms : FOLLOW_MS;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (!event_pending(g->follow_ev, EV_TIMEOUT, NULL))
        event_add(g->follow_ev, &tv);
}

static void follow_done(void *arg, int status, const gps_store_cells *res)
{
    follow *f = arg;
    f->polling = false;
    if (f->gone || !f->g) {
        if (f->g)
            follow_unlink(f->g, f);
        follow_free(f);
        return;
    }
    if (status < 0 || !res)
        return; /* the next read tries again */
    if (res->nrows == 0) {
        follow_end(f); /* the task is gone (purged) */
        return;
    }
    bool terminal = false;
    long long before = f->next;
    for (size_t r = 0; r < res->nrows && !terminal; r++)
        terminal = follow_frame_batch(f, res->cell[r * res->ncols + 1]);
    gps_stream_send(&f->s);
    bool finished = res->cell[0] != NULL;
    if (f->next > before)
        f->finished_polls = 0; /* the log still grows */
    if (terminal || (finished && ++f->finished_polls > FOLLOW_FINISHED_POLLS)) {
        follow_end(f);
        return;
    }
    if (f->rewake) {
        f->rewake = false;
        f->polling = gps_store_task_follow_async(f->g->store, f->id, f->next - 1, follow_done,
                                                 f) == 0;
    }
}

static json_t *status_cold(const gps_store_job_info *j);

static void cwait_unlink(cwait *w)
{
    if (w->g)
        for (cwait **pp = &w->g->cwaits; *pp; pp = &(*pp)->next)
            if (*pp == w) {
                *pp = w->next;
                break;
            }
    w->g = NULL;
}

/* Answer (when the client is still there) and free. */
static void cwait_end(cwait *w, int status, json_t *body)
{
    cwait_unlink(w);
    gps_held_release(&w->held);
    if (w->held.req && body)
        gps_http_send_json(w->held.req, status, body);
    else
        json_decref(body);
    free(w);
}

static void cwait_error(cwait *w, int status, const char *code, const char *msg, int retry)
{
    cwait_unlink(w);
    gps_held_release(&w->held);
    if (w->held.req)
        gps_send_error_retry(w->held.req, GPS_DIALECT_NATIVE, status, code, msg, NULL, w->corr,
                             retry);
    free(w);
}

/* The row, read whole once it is finished (or the deadline passed): the
 * status a DELETE on its owner would have answered. */
static void cwait_got(void *arg, int status, const gps_store_job_info *j)
{
    cwait *w = arg;
    w->polling = false;
    if (status != 0 || !j) {
        if (status > 0)
            cwait_error(w, 404, "JOB_NOT_FOUND", "no such task", 0);
        else
            cwait_error(w, 500, "INTERNAL", "the task store could not be read", 0);
        return;
    }
    json_t *o = status_cold(j);
    if (o && w->reply_status == 202)
        json_object_set_new(o, "cancel_requested", json_true());
    cwait_end(w, w->reply_status, o);
}

static void cwait_finish(cwait *w, int reply_status)
{
    w->reply_status = reply_status;
    w->polling = gps_store_job_get_async(w->g->store, w->id, cwait_got, w) == 0;
    if (!w->polling)
        cwait_error(w, 500, "INTERNAL", "the task store could not be read", 0);
}

static void cwait_polled(void *arg, int status, const gps_store_cells *res)
{
    cwait *w = arg;
    w->polling = false;
    if (!w->g || !w->held.req) {
        cwait_end(w, 0, NULL);
        return;
    }
    if (status < 0 || !res)
        return; /* the next tick reads again */
    if (res->nrows == 0)
        cwait_error(w, 404, "JOB_NOT_FOUND", "no such task", 0);
    else if (res->cell[0])
        cwait_finish(w, 200);
}

/* The cancel was asked (committed), or not (the task had finished). */
static void cwait_asked(void *arg, int status, const gps_store_cells *res)
{
    cwait *w = arg;
    w->polling = false;
    if (!w->g || !w->held.req) {
        cwait_end(w, 0, NULL);
        return;
    }
    if (status != 0 || !res) {
        cwait_error(w, 503, "SERVER_BUSY",
                    "the cancel could not be written to the database; retry, here or on another "
                    "server",
                    1);
        return;
    }
    if (res->changes == 0) {
        cwait_finish(w, 200); /* finished meanwhile: its final status */
        return;
    }
    gp_log_write(GP_LOG_INFO, "task_cancel_asked", w->corr, json_pack("{s:s}", "job_id", w->id),
                 "native task run by another server: cancel asked through the database");
    gps_store_notify(w->g->store, CH_TASK_CANCEL, ""); /* its owner reads it at once */
    /* Its owner reads the asks every CLAIM_MS; an owner that is gone
     * leaves it to the server that claims its lease. */
    w->deadline_us = gp_now_mono_us() + w->g->lease_us + 10000000ull;
    follow_ev_start(w->g);
}

static void cwaits_poll(gps_tasks *g, uint64_t now)
{
    cwait *next;
    for (cwait *w = g->cwaits; w; w = next) {
        next = w->next;
        if (w->polling || !w->deadline_us)
            continue;
        if (!w->held.req)
            cwait_end(w, 0, NULL);
        else if (now >= w->deadline_us)
            cwait_finish(w, 202);
        else
            w->polling = gps_store_task_follow_async(g->store, w->id, LLONG_MAX, cwait_polled,
                                                     w) == 0;
    }
}

/* A DELETE of an unfinished task another server runs: ask it through the
 * row. Takes req over; false (req untouched) on ENOMEM or a full queue. */
static bool cwait_start(gps_tasks *g, struct evhttp_request *req, const char *id,
                        const char *corr)
{
    cwait *w = calloc(1, sizeof *w);
    if (!w)
        return false;
    w->g = g;
    snprintf(w->id, sizeof w->id, "%s", id);
    snprintf(w->corr, sizeof w->corr, "%s", corr);
    if (gps_store_task_cancel_request_async(g->store, id, gp_now_wall_ms(), cwait_asked, w) < 0) {
        free(w);
        return false;
    }
    w->polling = true;
    /* The connection's timeout covers the longest wait (cwait_asked). */
    gps_held_start(&w->held, req, false, (int)(g->lease_us / 1000000u) + 20, NULL, NULL);
    w->next = g->cwaits;
    g->cwaits = w;
    return true;
}

static void follow_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gps_tasks *g = arg;
    for (follow *f = g->follows; f; f = f->fnext) {
        if (f->polling)
            continue;
        f->polling = gps_store_task_follow_async(g->store, f->id, f->next - 1, follow_done, f) ==
                     0;
    }
    cwaits_poll(g, gp_now_mono_us());
    if (!g->follows && !g->cwaits)
        event_del(g->follow_ev);
}

static void follow_gone(void *arg)
{
    follow *f = arg;
    if (f->polling) {
        /* The read in flight frees it. */
        f->gone = true;
        return;
    }
    if (f->g)
        follow_unlink(f->g, f);
    follow_free(f);
}

static const gps_stream_ops FOLLOW_OPS = {
    .gone = follow_gone,
};

/* Follow a task that another server runs: out holds the stored events
 * framed so far (seqs up to next - 1). Takes req over; false (req
 * untouched) when this server does not follow (one server, ENOMEM). */
static bool follow_start(gps_tasks *g, struct evhttp_request *req, const char *id,
                         const char *corr, long long next, long long after, gp_buf *out)
{
    if (!g->follow_ev)
        return false;
    follow *f = calloc(1, sizeof *f);
    if (!f)
        return false;
    f->g = g;
    f->next = next;
    f->after = after;
    snprintf(f->id, sizeof f->id, "%s", id);
    gps_stream_init(&f->s, &FOLLOW_OPS, f, req, corr);
    snprintf(f->s.job_id, sizeof f->s.job_id, "%s", id);
    gps_stream_start(&f->s);
    gp_buf_append(&f->s.out, out->data ? out->data : "", out->len);
    f->fnext = g->follows;
    g->follows = f;
    gps_stream_hold(&f->s, g->request_timeout_sec + 30);
    gps_stream_send(&f->s);
    /* One read now: a notification of what committed after out was read
     * came before this follow existed. */
    f->polling = gps_store_task_follow_async(g->store, f->id, f->next - 1, follow_done, f) == 0;
    follow_ev_start(g);
    return true;
}

static pend *pend_new(gps_tasks *g, int64_t attempt)
{
    pend *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->g = g;
    p->attempt = attempt;
    p->next = g->pends;
    g->pends = p;
    return p;
}

/* Unlinks p; returns its gps_tasks (NULL: orphaned) and frees p. */
static gps_tasks *pend_take(pend *p)
{
    gps_tasks *g = p->g;
    if (g)
        for (pend **pp = &g->pends; *pp; pp = &(*pp)->next)
            if (*pp == p) {
                *pp = p->next;
                break;
            }
    free(p);
    return g;
}

/* The task's lease went to another server (this one stalled or was cut
 * off past it, and its event writes are refused): stop running it here
 * without touching its row, and end its streams without a terminal event
 * (clients reconnect with Last-Event-ID, to any server, and follow the log
 * its new holder writes). */
static void task_lost(gps_tasks *g, task *t, int64_t now_attempt)
{
    gp_log_write(GP_LOG_WARN, "task_lease_lost", t->corr,
                 json_pack("{s:s,s:I,s:I}", "job_id", t->id, "attempt",
                           (json_int_t)t->lease_attempt, "lease_attempt",
                           (json_int_t)now_attempt),
                 "native task taken over by another server: stopped here");
    gps_job *job = t->job;
    if (job) {
        gps_job_unsubscribe(job, on_job_event, t);
        t->job = NULL;
        gps_job_mark_row_lost(job);
        gps_jobs_cancel(g->jobs, job, "lease_lost");
    }
    task_free(g, t);
}

static void lease_checked(void *arg, int status, const gps_store_cells *res)
{
    pend *p = arg;
    char id[40];
    snprintf(id, sizeof id, "%s", p->id);
    gps_tasks *g = pend_take(p);
    task *t = g ? task_find(g, id) : NULL;
    if (!t)
        return;
    t->lease_checking = false;
    if (status != 0 || !res)
        return; /* the database is away: the write is tried again */
    const char *at = res->nrows ? res->cell[0] : NULL;
    int64_t now_attempt = at ? strtoll(at, NULL, 10) : 0;
    if (now_attempt != t->lease_attempt)
        task_lost(g, t, now_attempt);
}

/* After a fenced write failed: is the lease still this server's? */
static void lease_check(task *t)
{
    gps_tasks *g = t->owner;
    if (t->lease_checking)
        return;
    pend *p = pend_new(g, t->lease_attempt);
    if (!p)
        return;
    snprintf(p->id, sizeof p->id, "%s", t->id);
    t->lease_checking = gps_store_task_lease_async(g->store, t->id, lease_checked, p) == 0;
    if (!t->lease_checking)
        pend_take(p);
}

/* Cancel a task held here: a DELETE here, or one answered by another
 * server and asked through the row. */
static void task_cancel(gps_tasks *g, task *t)
{
    if (t->job)
        gps_jobs_cancel(g->jobs, t->job, "api_delete"); /* no-op when already terminal */
    else if (!t->terminal)
        restore_fail(g, t, "CANCELLED", "the task was cancelled");
}

/* A cancel asked through the row (a DELETE another server answered). */
static void task_cancel_asked(gps_tasks *g, task *t)
{
    gp_log_write(GP_LOG_INFO, "task_cancelled_remote", t->corr,
                 json_pack("{s:s}", "job_id", t->id),
                 "native task cancelled by a DELETE answered by another server");
    task_cancel(g, t);
}

/* The cancels other servers asked for tasks this server holds. */
static void cancels_read(void *arg, int status, const gps_store_cells *res)
{
    gps_tasks *g = pend_take(arg);
    if (!g)
        return;
    g->cancels_reading = false;
    for (size_t r = 0; status == 0 && res && r < res->nrows; r++) {
        const char *id = res->cell[r * res->ncols];
        task *t = id ? task_find(g, id) : NULL;
        if (!t || t->terminal)
            continue; /* being claimed (read next time), or ending */
        task_cancel_asked(g, t);
    }
}

/* Read the cancels asked of this server's tasks, while it runs any. */
static void cancels_tick(gps_tasks *g, uint64_t now)
{
    if (!g->row_cancels || g->cancels_reading || now < g->cancels_due_us)
        return;
    g->cancels_due_us = now + CLAIM_MS * 1000ull;
    bool running = false;
    for (task *t = g->head; t && !running; t = t->next)
        running = !t->terminal;
    pend *p = running ? pend_new(g, 0) : NULL;
    if (!p)
        return;
    g->cancels_reading = gps_store_task_cancels_async(g->store, g->server_id, cancels_read, p) ==
                         0;
    if (!g->cancels_reading)
        pend_take(p);
}

/* A task this server claimed, read whole: resume it as a restart does. */
static void claimed_job(void *arg, int status, const gps_store_job_info *j)
{
    pend *p = arg;
    int64_t attempt = p->attempt;
    bool cancel = p->cancel;
    gps_tasks *g = pend_take(p);
    if (!g || status != 0 || !j)
        return; /* not ours to run after all: its lease expires again */
    if (task_restore(g, j, attempt) < 0) {
        gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT(j->id);
        u.lease_attempt = attempt;
        u.status = "failed";
        u.error_code = "SERVER_RESTART";
        u.finished_at = gp_now_wall_ms();
        gps_store_job_update_async(g->store, u);
        return;
    }
    task *t = task_find(g, j->id);
    gp_log_write(GP_LOG_INFO, "task_claimed", t->corr,
                 json_pack("{s:s,s:I,s:I}", "job_id", t->id, "attempt", (json_int_t)attempt,
                           "events", (json_int_t)gps_tlog_count(t->log)),
                 "native task taken over from a server whose lease expired");
    if (cancel)
        task_cancel_asked(g, t); /* before it runs again */
}

/* A claimed task's cancel mark read (its owner died with a DELETE asked):
 * then the task itself. */
static void claim_cancel_read(void *arg, int status, const gps_store_cells *res)
{
    pend *p = arg;
    if (!p->g) {
        pend_take(p);
        return;
    }
    p->cancel = status == 0 && res && res->nrows > 0 && res->cell[0];
    if (gps_store_job_get_async(p->g->store, p->id, claimed_job, p) < 0)
        pend_take(p);
}

static void claim_done(void *arg, int status, const gps_store_cells *res)
{
    gps_tasks *g = pend_take(arg);
    if (!g)
        return;
    g->claiming = false;
    for (size_t r = 0; status == 0 && res && r < res->nrows; r++) {
        const char *id = res->cell[r * res->ncols];
        const char *at = res->cell[r * res->ncols + 1];
        int64_t attempt = at ? strtoll(at, NULL, 10) : 0;
        if (!id)
            continue;
        task *t = task_find(g, id);
        if (t && !t->terminal)
            /* Ours once, its lease lapsed (a stalled loop, the database
             * away) and maybe another server wrote the log meanwhile: the
             * stored log is the truth, not this copy. */
            task_lost(g, t, attempt);
        else if (t)
            continue; /* ended here; its row update is on its way */
        pend *p = pend_new(g, attempt);
        if (!p)
            continue;
        snprintf(p->id, sizeof p->id, "%s", id);
        if (g->row_cancels ? gps_store_task_cancel_get_async(g->store, id, claim_cancel_read, p) < 0
                           : gps_store_job_get_async(g->store, id, claimed_job, p) < 0)
            pend_take(p);
    }
}

static void models_cb(void *ud, registry_agent *a)
{
    json_t *names = ud;
    if (a->state != REGISTRY_HEALTHY)
        return;
    for (size_t i = 0; i < a->n_models; i++) {
        json_array_append_new(names, json_string(a->models[i].id));
        for (size_t k = 0; k < a->models[i].n_aliases; k++)
            json_array_append_new(names, json_string(a->models[i].aliases[k]));
    }
}

/* Renew this server's leases; claim expired ones of the models its agents
 * serve (a server without such an agent leaves them to one that has). */
static void shared_tick(gps_tasks *g, uint64_t now)
{
    int64_t wall = gp_now_wall_ms();
    int64_t lease_ms = (int64_t)(g->lease_us / 1000);
    if (now >= g->renew_due_us) {
        gps_store_task_renew(g->store, g->server_id, wall + lease_ms);
        g->renew_due_us = now + g->lease_us / 3;
    }
    cancels_tick(g, now);
    if (g->claiming || now < g->claim_due_us)
        return;
    g->claim_due_us = now + CLAIM_MS * 1000ull;
    json_t *models = json_array();
    if (models)
        registry_foreach(gps_jobs_registry(g->jobs), models_cb, models);
    pend *p = json_array_size(models) ? pend_new(g, 0) : NULL;
    if (p) {
        g->claiming = gps_store_task_claim_async(g->store, g->server_id, wall + lease_ms, wall,
                                                 models, CLAIM_MAX, claim_done, p) == 0;
        if (!g->claiming)
            pend_take(p);
    }
    json_decref(models);
}

/* A notification (gps_store_listen): read now what it names, unless a
 * read of it is in flight already (the poll brings what that one missed).
 * channel NULL (the listener (re)started): the polls go on as ever. */
static void tasks_woken(void *arg, const char *channel, const char *payload)
{
    gps_tasks *g = arg;
    if (!channel || !payload)
        return;
    if (strcmp(channel, CH_TASK_CANCEL) == 0) {
        g->cancels_due_us = 0;
        cancels_tick(g, gp_now_mono_us());
        return;
    }
    if (strcmp(channel, CH_TASK_JOB) != 0)
        return;
    for (follow *f = g->follows; f; f = f->fnext) {
        if (f->gone || strcmp(f->id, payload) != 0)
            continue;
        if (f->polling) {
            /* the read in flight may have begun before this write
             * committed: dropping the wake-up left the follower to its
             * poll (a hang where polls are off) */
            f->rewake = true;
            continue;
        }
        f->polling = gps_store_task_follow_async(g->store, f->id, f->next - 1, follow_done,
                                                 f) == 0;
    }
    uint64_t now = gp_now_mono_us();
    for (cwait *w = g->cwaits; w; w = w->next)
        if (!w->polling && w->deadline_us && w->held.req && now < w->deadline_us &&
            strcmp(w->id, payload) == 0)
            w->polling = gps_store_task_follow_async(g->store, w->id, LLONG_MAX, cwait_polled,
                                                     w) == 0;
}

void gps_tasks_set_follow_ms(gps_tasks *g, int ms)
{
    if (g && ms > 0)
        g->follow_ms = ms;
}

int gps_tasks_set_shared(gps_tasks *g, const char *server_id, int lease_sec)
{
    if (!g || !g->base || !g->gated || !server_id || !*server_id ||
        !gps_store_has_task_leases(g->store))
        return -1;
    g->follow_ev = event_new(g->base, -1, EV_PERSIST, follow_tick, g);
    if (!g->follow_ev)
        return -1;
    g->shared = true;
    g->row_cancels = gps_store_has_task_cancel(g->store);
    snprintf(g->server_id, sizeof g->server_id, "%s", server_id);
    g->lease_us = (uint64_t)(lease_sec > 0 ? lease_sec : DEFAULT_LEASE_SEC) * 1000000ull;
    static const char *const channels[] = {CH_TASK_JOB, CH_TASK_CANCEL, NULL};
    g->listener = gps_store_listen(g->store, g->base, channels, tasks_woken, g);
    return 0;
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    gps_tasks *g = arg;
    uint64_t now = gp_now_mono_us();
    task *next;
    if (g->shared)
        shared_tick(g, now);
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
            task_flush(t); /* after a failed write; else a no-op */
        if (t->create_reply && now - t->created_us > g->lease_us)
            create_refuse(g, t);
        size_t nev = gps_tlog_count(t->log);
        if (t->terminal) {
            /* Not before its log is in the store (its cold replay comes
             * from there), unless the store stays broken. */
            bool stored = !t->inflight_seq && released(t) >= nev;
            bool over = g->hot_max_events && hot_events > 0 &&
                        hot_events + nev > g->hot_max_events;
            if (!t->subs && ((now - t->finished_us > g->hot_us &&
                              (stored || now - t->finished_us > 2 * g->hot_us)) ||
                             (over && stored))) {
                task_free(g, t);
                continue;
            }
            hot_events += nev;
            continue;
        }
        if (!t->job) {
            task_resubmit(g, t, now);
            continue;
        }
        if (gps_job_state_of(t->job) == GPS_JOB_QUEUED) {
            long long pos = (long long)gps_jobs_queue_position(g->jobs, t->job);
            if (pos != t->last_pos)
                emit_queued(t);
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
        gps_req_error(r, 400, "INVALID_REQUEST", msg, param);
        count_request(g, "invalid_request", r->start_us);
        return;
    }
    task *t = calloc(1, sizeof *t);
    gps_tlog *events = gps_tlog_new();
    if (!t || !events) {
        free(t);
        gps_tlog_free(events);
        json_decref(body);
        gps_job_spec_clear(&spec);
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
        return;
    }
    long long seed = spec.seed;
    /* The whole validated body with its seed: what a restart resubmits,
     * written with the job's row (one write). */
    json_object_set_new(body, "seed", json_integer(seed));
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
    task_link(g, t);
    gps_job_subscribe(job, on_job_event, t);
    if (g->shared) {
        /* After the row's insert (same queue): its first events are
         * fenced by this attempt. */
        t->lease_attempt = 1;
        gps_job_set_lease_attempt(job, 1);
        gps_store_task_own(g->store, t->id, g->server_id,
                           gp_now_wall_ms() + (int64_t)(g->lease_us / 1000), 1);
    }
    emit_queued(t);
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
    task *t = task_find(g, r->params[0]);
    return t && may_see(g, r->key_id, t->key_id) ? t : NULL;
}

/* A restored task waiting to be resubmitted (or failed before it was). */
static json_t *status_restored(task *t)
{
    size_t n = gps_tlog_count(t->log);
    json_t *last = n ? gps_tlog_get(t->log, n - 1) : NULL;
    json_t *d = json_object_get(last, "data");
    const char *type = json_string_value(json_object_get(last, "type"));
    json_t *o = json_pack("{s:s,s:I}", "job_id", t->id, "events", (json_int_t)n);
    if (!o) {
        json_decref(last);
        return json_object();
    }
    json_t *b = t->resume_body;
    json_object_set(o, "model", json_object_get(b, "model"));
    json_object_set(o, "seed", json_object_get(b, "seed"));
    if (!t->terminal) {
        json_object_set_new(o, "status", json_string("queued"));
    } else if (type && strcmp(type, "end") == 0) {
        json_object_set_new(o, "status", json_string("done"));
        json_object_set_new(o, "result", json_pack("{s:O,s:O}", "text",
                                                   json_object_get(d, "text"), "finish_reason",
                                                   json_object_get(d, "finish_reason")));
    } else {
        const char *code = json_string_value(json_object_get(d, "code"));
        json_object_set_new(o, "status", json_string(code && strcmp(code, "CANCELLED") == 0
                                                         ? "cancelled"
                                                         : "failed"));
        json_object_set_new(o, "error", json_deep_copy(d));
    }
    json_decref(last);
    return o;
}

static json_t *status_hot(task *t)
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
                          (json_int_t)released(t));
    if (state == GPS_JOB_QUEUED)
        json_object_set_new(o, "queue_position",
                            json_integer((json_int_t)gps_jobs_queue_position(t->owner->jobs, job)));
    uint64_t created = gps_job_created_us(job), first = gps_job_first_token_us(job);
    uint64_t end = gps_job_finished_us(job) ? gps_job_finished_us(job) : gp_now_mono_us();
    json_t *tm = json_pack("{s:I,s:I}", "queue_ms", (json_int_t)gps_job_queue_ms(job),
                           "total_ms", (json_int_t)((end - created) / 1000));
    if (first)
        json_object_set_new(tm, "ttft_ms", json_integer((json_int_t)((first - created) / 1000)));
    json_object_set_new(o, "timings", tm);
    json_object_set_new(o, "usage",
                        json_pack("{s:I,s:I}", "prompt_tokens",
                                  (json_int_t)gps_job_prompt_tokens(job), "completion_tokens",
                                  (json_int_t)gps_job_completion_tokens(job)));
    const char *fr = gps_job_finish_reason(job);
    if (state == GPS_JOB_DONE)
        json_object_set_new(o, "result",
                            json_pack("{s:s%,s:s}", "text", gps_job_text(job),
                                      gps_job_text_len(job), "finish_reason",
                                      fr[0] ? fr : "stop"));
    json_object_set_new(o, "x_pool_meta", gps_pool_meta(job));
    if (state == GPS_JOB_FAILED || state == GPS_JOB_CANCELLED) {
        size_t n = gps_tlog_count(t->log);
        json_t *last = n ? gps_tlog_get(t->log, n - 1) : NULL;
        json_t *d = json_object_get(last, "data");
        json_object_set_new(o, "error",
                            json_pack("{s:s,s:s}", "code", gps_job_error_code(job), "message",
                                      json_string_value(json_object_get(d, "message"))
                                          ? json_string_value(json_object_get(d, "message"))
                                          : gps_job_error_code(job)));
        json_decref(last);
    }
    return o;
}

static json_t *status_cold(const gps_store_job_info *j)
{
    json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:i,s:s}", "job_id", j->id, "status", j->status,
                          "model", j->model, "priority", j->priority ? "batch" : "interactive",
                          "attempts", j->attempts, "agent_id", j->agent_id ? j->agent_id : "");
    json_object_set_new(o, "seed", j->has_seed ? json_integer(j->seed) : json_null());
    json_t *tm = json_object();
    if (j->queue_ms >= 0)
        json_object_set_new(tm, "queue_ms", json_integer(j->queue_ms));
    if (j->ttft_ms >= 0)
        json_object_set_new(tm, "ttft_ms", json_integer(j->ttft_ms));
    if (j->total_ms >= 0)
        json_object_set_new(tm, "total_ms", json_integer(j->total_ms));
    json_object_set_new(o, "timings", tm);
    json_object_set_new(o, "usage",
                        json_pack("{s:I,s:I}", "prompt_tokens",
                                  (json_int_t)(j->prompt_tokens > 0 ? j->prompt_tokens : 0),
                                  "completion_tokens",
                                  (json_int_t)(j->completion_tokens > 0 ? j->completion_tokens
                                                                        : 0)));
    if (strcmp(j->status, "done") == 0)
        json_object_set_new(o, "result",
                            json_pack("{s:s%,s:s}", "text",
                                      j->checkpoint_text ? j->checkpoint_text : "",
                                      j->checkpoint_text ? j->checkpoint_len : 0,
                                      "finish_reason",
                                      j->finish_reason ? j->finish_reason : "stop"));
    else if (j->error_code)
        json_object_set_new(o, "error", json_pack("{s:s,s:s}", "code", j->error_code, "message",
                                                  j->error_code));
    return o;
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
        cwait_start(c->g, c->held.req, j->id, c->corr)) {
        /* Unfinished and not here: another server runs it. */
        free(c);
        return;
    }
    if (c->kind != COLD_EVENTS) {
        /* A task out of memory is finished (or was failed at a restart):
         * DELETE has nothing left to cancel. */
        gps_http_send_json(c->held.req, 200, status_cold(j));
        free(c);
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(c->held.req), "X-Gpupool-Replay",
                      "store");
    gp_buf out;
    gp_buf_init(&out);
    /* The stored event log (job_events): exactly the events after last_id. */
    long long next = 1;
    bool terminal = false;
    size_t i;
    json_t *ev;
    json_array_foreach(j->events, i, ev)
    {
        if (json_integer_value(json_object_get(ev, "seq")) != next)
            break;
        const char *type = json_string_value(json_object_get(ev, "type"));
        terminal = type && (strcmp(type, "end") == 0 || strcmp(type, "error") == 0);
        if (next > c->last_id)
            sse_frame(&out, ev);
        next++;
        if (terminal)
            break;
    }
    /* Unfinished and not here: another server runs it (shared store).
     * Follow its log as it grows. */
    if (!terminal && j->finished_at <= 0 &&
        follow_start(c->g, c->held.req, j->id, c->corr, next, c->last_id, &out)) {
        gp_buf_free(&out);
        free(c);
        return;
    }
    gps_sse_start(c->held.req);
    /* No log (a task finished before migration 0002, or its last batch
     * was lost): the terminal event, made from the row and checkpoint. */
    long long seq = j->events ? next : (j->checkpoint_seq > 0 ? j->checkpoint_seq : 1);
    if (!terminal && c->last_id < seq && j->finished_at > 0) {
        json_t *data;
        const char *type;
        if (strcmp(j->status, "done") == 0) {
            type = "end";
            data = json_pack("{s:s,s:{s:I,s:I},s:s%}", "finish_reason",
                             j->finish_reason ? j->finish_reason : "stop", "usage",
                             "prompt_tokens",
                             (json_int_t)(j->prompt_tokens > 0 ? j->prompt_tokens : 0),
                             "completion_tokens",
                             (json_int_t)(j->completion_tokens > 0 ? j->completion_tokens : 0),
                             "text", j->checkpoint_text ? j->checkpoint_text : "",
                             j->checkpoint_text ? j->checkpoint_len : 0);
        } else {
            type = "error";
            data = json_pack("{s:s,s:s}", "code", j->error_code ? j->error_code : "FAILED",
                             "message", j->error_code ? j->error_code : "the job failed");
        }
        json_t *ev = json_pack("{s:I,s:s,s:o}", "seq", (json_int_t)seq, "type", type, "data",
                               data);
        sse_frame(&out, ev);
        json_decref(ev);
    }
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
    gps_http_send_json(r->req, 200, status_hot(t));
}

static void h_delete(gps_req *r, void *arg)
{
    gps_tasks *g = arg;
    task *t = visible(g, r);
    if (!t) {
        cold_lookup(g, r, COLD_DELETE, 0);
        return;
    }
    task_cancel(g, t);
    gps_http_send_json(r->req, 200, status_hot(t));
}

/* The client went away or was dropped as too slow (stream.h). The task
 * keeps running: a task outlives its watchers (a dropped client resumes
 * with Last-Event-ID). */
static void sub_gone(void *arg)
{
    task_sub *s = arg;
    if (s->t)
        sub_remove(s->t, s);
    gps_stream_free_later(&s->s, sub_free);
}

static void sub_writable(void *arg)
{
    task_sub *s = arg;
    if (s->t)
        sub_catch_up(s->t, s);
}

/* Bytes of text in the released events not yet written. */
static long long sub_behind(void *arg)
{
    task_sub *s = arg;
    return s->t ? (long long)gps_tlog_text_bytes(s->t->log, s->ev_sent, released(s->t)) : 0;
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
    size_t n = released(t);
    /* Those after last. An id beyond the end names events not recorded
     * yet: they are skipped when they come (sub_catch_up), the client
     * says it has them. With ids released only once durable, a client
     * can hold no id the store lost, so after a restart too an id beyond
     * the end means only "not yet" (docs/api.md). */
    s->ev_sent = last < (long long)n ? (size_t)last : n;
    s->after = last;
    s->next = t->subs;
    t->subs = s;
    gps_stream_hold(&s->s, g->request_timeout_sec + 30);
    /* The replay goes out paced, then the live events (task_emit). */
    sub_catch_up(t, s);
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
        gps_store_set_commit_cb(store, on_commit, g);
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
            follow_free(f);
    }
    while (g->cwaits) {
        cwait *w = g->cwaits;
        g->cwaits = w->next;
        w->g = NULL;
        if (!w->polling)
            cwait_end(w, 0, NULL); /* the http server's end closes its client */
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
            task_write(t, from);
        task_free(g, t);
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
