/*
 * api_tasks_priv.h: what the files of the native task API share
 * (api_tasks.c lists them). Private to those files: the rest of the server
 * sees api_tasks.h only.
 */
#ifndef GPS_API_TASKS_PRIV_H
#define GPS_API_TASKS_PRIV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <event2/http.h>

#include "server/dialects/api_tasks.h"
#include "server/auth/auth.h"
#include "server/metrics.h"
#include "server/dialects/task_log.h"
#include "server/stream/stream.h"
#include "server/store/store.h"

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
    /* A catch-up stopped for want of memory: the tick tries again (a
     * finished task's stream has no later event to wake it). */
    bool retry;
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
    /* Its job ended (done, or failed) but the terminal event (end, or
     * error) could not be recorded (out of memory building or appending
     * it): the tick records it again (tasks_retry_end) until it is. The
     * job, and so GET and the row, says done with the whole result, or
     * failed with its code: the log must end with that end or error, not
     * the reserved INTERNAL error (which would tell its streams other
     * than GET). Not terminal meanwhile: its streams wait. No bound on
     * the retries: giving up could only end the log with that INTERNAL
     * error; the task holds nothing more while it waits (docs/api.md). */
    bool end_pending;
    /* The failed job's error event, while its error waits (end_pending):
     * a reference to the event the jobs table made for the failure and
     * never changes (jobs_finish.c error_event), so keeping it takes no
     * memory and the retry builds the same error (code and message; the
     * job keeps only its code), and GET says meanwhile what it will. */
    json_t *error_ev;
    long long last_pos;           /* last queue position announced (-1 none: not
                                     queued; -2 queued, not announced: ENOMEM) */
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

/* handlers, tick (api_tasks.c) */
/* GET's body for a task held here (NULL: out of memory). */
json_t *tasks_status(task *t);
json_t *tasks_status_cold(const gps_store_job_info *j);
/* A stored task's events after last_id framed onto out (its log, else
 * for a finished task the terminal event made from its row): 1 the
 * terminal event is among them, 0 not (*next: the seq the log goes on
 * with), -1 ENOMEM (out as it was: answered 500 before the stream). */
int tasks_cold_frames(const gps_store_job_info *j, long long last_id, gp_buf *out,
                      long long *next);

/* a live task (api_tasks_run.c) */
unsigned tasks_bucket_of(const char *id);
task *tasks_find(gps_tasks *g, const char *id);
/* One stored event (seq, type, data) as an SSE frame appended to out. 0,
 * or -1 (ENOMEM: out as it was; never a stream with the event left out
 * that goes on past it). */
int tasks_sse_frame(gp_buf *out, const json_t *ev);
/* The next part of a long event (its data's last member a "text" longer
 * than CATCHUP_SLICE; s->part bytes of it written so far): 1 the event's
 * frame is done, 0 more slices follow, -1 ENOMEM (out and s->part as they
 * were: the same part is framed again later). */
int tasks_frame_long_event(gp_buf *out, task_sub *s, const json_t *ev);
void tasks_sub_remove(task *t, task_sub *s);
size_t tasks_released(const task *t);
uint64_t tasks_write(task *t, size_t from);
void tasks_flush(task *t);
void tasks_create_refuse(gps_tasks *g, task *t);
void tasks_on_commit(void *arg, uint64_t done_seq, bool failed);
void tasks_sub_free(void *arg);
bool tasks_sub_catch_up(task *t, task_sub *s);
/* The task ends with its log's reserved error (INTERNAL, out of memory):
 * an event of it (type) could not be recorded whole, or its job's events
 * could not reach it. Its job, if any, fails with the same. */
void tasks_oom_end(task *t, const char *type);
/* Record and publish an event; one that cannot be recorded (data NULL
 * included: out of memory) ends the task (tasks_oom_end). */
void tasks_emit(task *t, const char *type, json_t *data, bool terminal);
/* A queued event with t's position (t->last_pos; -2 when it could not be
 * recorded, out of memory: the tick announces it again). */
void tasks_emit_queued(task *t);
/* Record the end or error event of t's ended job (t->end_pending), from
 * the tick: once it is recorded the task is terminal, its streams get it. */
void tasks_retry_end(task *t);
void tasks_on_job_event(gps_job *job, gps_event_type type, json_t *ev, void *arg);
void tasks_free(gps_tasks *g, task *t);

/* restart recovery (api_tasks_restore.c) */
void tasks_link(gps_tasks *g, task *t);
void tasks_restore_fail(gps_tasks *g, task *t, const char *code, const char *message);
void tasks_resubmit(gps_tasks *g, task *t, uint64_t now);
/* 0 restored; -1 it cannot be (not a native task's row, held here
 * already); -2 out of memory (nothing changed: it can be read again). */
int tasks_restore(gps_tasks *g, const gps_store_job_info *j, int64_t lease_attempt);

/* several servers (api_tasks_shared.c) */
void tasks_follow_free(follow *f);
/* Frame into f->s.out the events of one stored batch (text: a JSON array,
 * the owner's dump) from seq f->next on, advancing f->next; a gap (a batch
 * not committed yet) stops. 1 the terminal event was among them, 0 not,
 * -1 out of memory (f->next names the first event not framed: the next
 * read starts there). */
int tasks_follow_frame_batch(follow *f, const char *text);
void tasks_cwait_end(cwait *w, int status, json_t *body);
bool tasks_cwait_start(gps_tasks *g, struct evhttp_request *req, const char *id,
                       const char *corr);
bool tasks_follow_start(gps_tasks *g, struct evhttp_request *req, const char *id,
                        const char *corr, long long next, long long after, gp_buf *out);
void tasks_lease_check(task *t);
void tasks_cancel(gps_tasks *g, task *t);
void tasks_shared_tick(gps_tasks *g, uint64_t now);

#endif
