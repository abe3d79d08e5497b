/*
 * agent: the protocol loop. See agent.h for the threading model and
 * docs/protocol.md for the wire contract.
 *
 * Everything below runs on the loop thread except the sink_* callbacks,
 * which a backend calls from the loop (bind_loop) or from threads of its
 * own; they touch only the job's event queue and flags under a->mu and
 * wake the loop (on the loop's thread the release of a sink bracket may
 * run the loop's turn itself: backend.h).
 */
#include "agent/agent.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <curl/curl.h>
#include <event2/event.h>
#include <jansson.h>

#include "agent/agent_facts.h"
#include "agent/curl_loop.h"
#include "common/gp_json.h"
#include "agent/agent_util.h"
#include "common/gp_log.h"
#include "common/gp_util.h"

#ifndef AGENT_VERSION
#define AGENT_VERSION "0.0.0"
#endif

#define MAX_RESPONSE_BYTES (16u << 20)  /* server replies are small; bound them */
#define MAX_BATCH_EVENTS 1024           /* events per upload */
#define UPLOAD_GIVE_UP_MS (120 * 1000)  /* a job whose uploads fail this long is dropped */
#define SHUTDOWN_FLUSH_MS 5000          /* after stopping jobs: time to upload their ends */
#define MAX_JOB_ID 128

/* ======================================================================== */
/* Types                                                                    */
/* ======================================================================== */

typedef enum {
    REQ_ENROLL,
    REQ_POLL,
    REQ_WORK,
    REQ_EVENTS,
    REQ_EVENTS_BATCH,
    REQ_DEREGISTER
} req_kind;

typedef struct agent_job agent_job;

/* What a sink's event asks of the loop (job_note_locked). */
typedef enum { WAKE_NONE, WAKE_SOON, WAKE_URGENT } wake_kind;

/* Easy handles kept for reuse (issue 24): a relayed request costs two
 * requests to the server (its upload and the long-poll parked again), and
 * curl_easy_init with its 16 KiB buffer per request was 6 % of the agent's
 * instructions and a malloc large enough to consolidate the heap. */
#define EASY_IDLE_MAX 16

/* One request to the server in flight on the multi handle. */
typedef struct req {
    req_kind kind;
    CURL *easy;
    struct curl_slist *hdrs; /* its own headers (a correlation id), or NULL: a->hdrs */
    char *body;          /* what is posted (owned; libcurl reads it in place) */
    gp_buf resp;
    bool too_big;        /* reply exceeded MAX_RESPONSE_BYTES */
    int srv;             /* index into agent.servers of the server it went to */
    agent_job *job;      /* REQ_EVENTS: the job (borrowed; it waits for us) */
    agent_job **batch;   /* REQ_EVENTS_BATCH: its jobs, in the body's order (owned array) */
    size_t n_batch;
    char errbuf[CURL_ERROR_SIZE]; /* libcurl's detail (TLS verification errors) */
} req;

struct agent_job {
    char id[MAX_JOB_ID];
    char *correlation_id;   /* owned, may be NULL */
    agent *a;
    /* --- under a->mu (backend threads write these) --- */
    agent_evq q;
    bool backend_done;      /* the terminal callback was delivered */
    char *stop_seq;         /* the stop string generation ended on (owned), or NULL */
    json_t *upstream_meta;  /* an upstream pool's x_pool_meta (owned), or NULL */
    bool stop_shutdown;     /* we stopped it: agent shutting down */
    bool stop_deadline;     /* we stopped it: its deadline passed */
    bool dirty;             /* on a->dirty: the loop has yet to look at what changed */
    agent_job *dirty_next;
    /* --- loop thread only --- */
    /* What the loop last saw (jobs_review; issue 24: it looks at the jobs that
     * changed, never at every job): */
    unsigned snap_flags;    /* agent_evq_flags, backend_done, agent_evq_done when */
    bool snap_done;         /* taken off a->dirty */
    bool snap_evq_done;
    bool seen_ready;        /* events to upload, none in flight, not cancelled */
    bool seen_urgent;       /* ... among them its first output or its end (a->n_urgent) */
    bool seen_done;         /* the backend finished it (no longer in a->n_running) */
    bool in_bq;             /* on a->bq: waits for the next batched upload */
    agent_job *bq_prev, *bq_next;
    agent_timer dl_timer;   /* in a->deadlines while deadline_ms is to come */
    agent_timer retry_timer; /* in a->retries while ready but before next_upload_ms */
    bool cancelled;         /* server said stop: drop events, upload nothing */
    bool cancel_sent;       /* backend->job_cancel already called */
    bool upload_refused;    /* its events were refused once: an error event replaced them */
    req *upload;            /* upload in flight, or NULL */
    uint64_t next_upload_ms;
    uint64_t failing_since_ms; /* 0 = last upload fine */
    agent_backoff ub;
    uint64_t deadline_ms;   /* monotonic; 0 = none */
    int srv;                /* the server that assigned it (index into agent.servers): its
                               events go there only, whichever server the agent polls now */
    agent_job *next, *prev; /* a->jobs */
    agent_idnode hnode;     /* in a->jtab under id */
};

struct agent {
    const agent_options *o;
    agent_backend *be;
    CURLM *multi;
    char id[37];
    char **servers;         /* --server's URLs, without trailing '/' (owned) */
    int n_servers;
    int cur;                /* the server polled now: sticky while it answers */
    int turn_fails;         /* servers failed in a row since the last success */
    uint64_t auth_refused_since; /* first 401 since the last accepted poll (0: none) */
    const char *base;       /* servers[cur] */
    char *auth_header;      /* "Authorization: Bearer ..." or NULL */
    bool key_from_file;     /* the key came from DIR/agent.key */
    bool token_ignored;     /* --token given but agent.key exists */
    char *name;
    json_t *labels;
    json_t *static_facts;   /* platform, cpu, gpus (refreshed per poll for gpus) */

    pthread_mutex_t mu;     /* job queues and flags shared with backend threads */
    agent_job *jobs;
    agent_idtab jtab;       /* a->jobs by id (job_find) */
    size_t n_jobs;
    int n_running;          /* jobs the backend still runs, as the loop saw them */
    /* --- under mu --- */
    agent_job *dirty;       /* jobs with something new for the loop (job_link_locked) */
    int lazy_srv;           /* the loop will look anyway soon (a batch in flight or due)
                               at the jobs of this server: a non-urgent change to one
                               of them is linked without a wake (-1: none) */
    int lazy_urgent_srv;    /* both uploads to this server are in flight (the batch and
                               the urgent one): a job's first output there cannot go
                               before one returns, and that reply makes the loop look:
                               no wake for it (-1: none). An end still wakes (its
                               slot is free for new work) */
    /* --- loop thread --- */
    agent_job **review;     /* scratch: the jobs taken off dirty (room for n_jobs) */
    size_t review_cap;
    agent_job *bq_head, *bq_tail; /* ready jobs waiting for the next batched upload */
    size_t n_bq;
    int bq_cur;             /* cur and events_batch when they were queued: a change */
    bool bq_batch;          /* sends them another way (bq_requeue) */
    int n_urgent;           /* ready jobs with their first output or end to send */
    agent_timers deadlines; /* jobs' dl_timer */
    agent_timers retries;   /* jobs' retry_timer */

    req *enroll_req;
    uint64_t next_enroll_ms;
    bool enrolling;         /* --token given, no agent.key yet: enroll before polling */

    req *poll_req;
    req *work_req;
    req *work_stale;        /* a free_slots 0 long-poll replaced by one with free slots:
                               in flight until the server answers it 204 */
    int work_free;          /* free_slots the work_req in flight announced */
    bool prefix_reported;   /* long-polls carry the backend's prefix_cache facts */
    bool no_liveness;       /* the server refused free_slots 0 (older server) */
    gp_buf live_ids;        /* running_jobs of the long-poll as JSON text (no brackets) */
    bool live_dirty;        /* a job came or went, or cur moved: live_ids is stale */
    uint64_t live_sent_ms;  /* when a long-poll last carried running_jobs (0: never,
                               or cur moved): see AGENT_LIVE_LIST_MS */
    char instance[33];      /* random per process: the server tells restarts apart */
    char delivery_seen[65]; /* `delivery` of the last work reply processed */
    uint64_t next_poll_ms;
    uint64_t next_work_ms;
    uint32_t poll_interval_ms;
    uint32_t work_wait_ms;
    bool registered;        /* last poll succeeded */
    bool events_batch;      /* the server takes POST /agents/events (poll features) */
    req *batch_req;         /* the batched upload in flight, or NULL */
    req *urgent_req;        /* a batch of urgent jobs only (first output, end), sent while
                               batch_req is in flight, or NULL (batch_urgent_due) */
    uint64_t batch_since_ms; /* first pending event not yet in a batch (0: none) */
    bool server_down_logged;
    agent_backoff backoff;  /* server reachability (poll and work) */

    bool draining;          /* stopping (SIGTERM): announce draining, take no new work */
    bool server_drain;      /* the last poll reply carried a drain command: take no
                             * new work while it does (not announced as our own
                             * state, so an admin's undrain takes effect at once) */
    bool drain_announced;   /* a poll carrying "draining" was acknowledged */
    req *dereg_req;         /* POST /agents/deregister in flight (clean stop) */
    bool leaving;           /* deregistering: no new poll or long-poll */
    bool dereg_done;        /* answered, failed or timed out: exit */
    bool stopping;          /* exit once drained */
    bool jobs_stopped;      /* drain deadline passed: jobs were told to stop */
    uint64_t drain_deadline_ms;
    uint64_t final_deadline_ms;
    int exit_code;
    bool fatal;             /* leave now with exit_code (enrollment refused, key revoked) */

    atomic_int stop_req;    /* 0 none, 1 drain, 2 hard (set by agent_stop) */
    atomic_bool wake_sent;  /* a wake is pending, not yet seen by the loop (loop_wake_now) */

    /* The loop (issue 24: one thread). libevent objects are touched only
     * on the loop's thread; other threads (backend threads, the signal
     * thread) wake it through wake_fd, an eventfd. */
    struct event_base *evb;
    struct event *turn_ev;  /* runs loop_turn: activated, or at its wake time */
    struct event *wake_ev;  /* wake_fd readable: another thread woke the loop */
    struct event *curl_tev; /* libcurl's timer for the server requests */
    int wake_fd;
    pthread_t loop_th;      /* the thread in agent_run (valid while looping) */
    atomic_bool looping;
    bool kick;              /* a server request was added: drive libcurl now */
    bool in_turn;           /* loop_turn runs (a wake inside it activates turn_ev) */
    bool ended;             /* loop_turn said leave */
    CURL *easy_idle[EASY_IDLE_MAX]; /* finished requests' handles, for the next ones */
    int n_easy_idle;
    struct curl_slist *hdrs; /* every request's headers (set_key) */
    struct curl_slist **hdrs_old; /* lists set_key replaced (a handle may point at one) */
    size_t n_hdrs_old;
    CURLU **uh;             /* per server: /agents/work, /agents/events parsed once */
    bool proxy_env;         /* a proxy variable was set at start (proxy_env_set) */
};

/* ======================================================================== */
/* Small helpers                                                            */
/* ======================================================================== */

static uint32_t rnd32(void)
{
    uint32_t r;
    gp_random_bytes(&r, sizeof r);
    return r;
}

static bool job_id_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n >= MAX_JOB_ID)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

/* A job by id: a hash, not a walk of every job per assigned job or
 * cancel (issue 24). */
static agent_job *job_find(agent *a, const char *id)
{
    agent_idnode *nd = agent_idtab_find(&a->jtab, id);
    return nd ? (agent_job *)((char *)nd - offsetof(agent_job, hnode)) : NULL;
}

/* The backend's slots (backend.h): all of them, and those it offers now. */
static void slot_counts(agent *a, int *total, int *usable)
{
    if (a->be->ops->slots) {
        a->be->ops->slots(a->be, total, usable);
        if (*total < 1)
            *total = 1;
        return;
    }
    *total = *usable = a->o->slots > 0 ? (int)a->o->slots : 1;
}

/* Jobs the backend still runs (a counter: jobs_review). */
static int busy_slots(agent *a)
{
    return a->n_running;
}

/* Ask the backend to stop a job (once). */
static void job_cancel(agent *a, agent_job *j)
{
    if (j->cancel_sent)
        return;
    j->cancel_sent = true;
    a->be->ops->job_cancel(a->be, j->id);
}

/* ======================================================================== */
/* Event sink (the loop's thread or a backend's)                            */
/* ======================================================================== */

static void loop_turn(agent *a);

/* Another thread: make the loop run a turn. */
static void loop_wake_fd(agent *a)
{
    uint64_t one = 1;
    while (write(a->wake_fd, &one, sizeof one) < 0 && errno == EINTR)
        ;
}

/* Wake the loop after queueing events (issue 24). One wakeup until the
 * loop has looked: a zero-delay upstream hands the backend 64 tokens in one
 * read, which cost 64 writes, 64 polls and 64 reads on the loop thread (73
 * send calls per request under strace) when each woke it. The loop clears
 * the flag before it scans the queues, so an event pushed after the scan
 * always wakes it again. On the loop's own thread (a backend bound to the
 * loop: bind_loop) there is no system call. `between` (the release that
 * ends a backend's callback, which brackets its sink calls, for events
 * that are not urgent) runs the turn there and then. Otherwise the turn's
 * event is made active: at AGENT_PRI_NEW it sends the loop back to
 * epoll_wait after the callback running now, ahead of the relaying
 * callbacks still queued, and that pass also takes the server's replies
 * (a long-poll's new jobs, an upload's answer that lets the next first
 * outputs go). At 1,000 paced streams each such pass re-reports every
 * stream still readable (level-triggered): worth it for a first output or
 * an end, not for every token (time to first token p50 2.6-2.8 ms, against
 * 14-19 ms with every wake inline and 11.5-12 ms with only first outputs
 * active, on one core shared with the server: docs/scaling.md, ninth
 * round). */
static void loop_wake_now(agent *a, bool between)
{
    if (atomic_exchange(&a->wake_sent, true))
        return;
    if (!atomic_load(&a->looping) || !pthread_equal(pthread_self(), a->loop_th))
        loop_wake_fd(a);
    else if (between && !a->in_turn)
        loop_turn(a);
    else
        event_active(a->turn_ev, EV_TIMEOUT, 0);
}

/* agent_sink_hold/release (backend.h): per thread (the loop's or a backend's). */
static _Thread_local int hold_depth;
static _Thread_local agent *held_wake; /* the agent to wake at the release */
static _Thread_local bool held_urgent;  /* and a wake among them was WAKE_URGENT */

static void loop_wake(agent *a, wake_kind kind)
{
    if (kind == WAKE_NONE)
        return;
    if (hold_depth == 0) {
        loop_wake_now(a, false);
        return;
    }
    if (held_wake && held_wake != a) {
        loop_wake_now(held_wake, false); /* two agents in one process (tests) */
        held_urgent = false;
    }
    held_wake = a;
    held_urgent |= kind == WAKE_URGENT;
}

void agent_sink_hold(void)
{
    hold_depth++;
}

void agent_sink_release(void)
{
    if (hold_depth == 0 || --hold_depth > 0)
        return;
    agent *a = held_wake;
    bool urgent = held_urgent;
    held_wake = NULL;
    held_urgent = false;
    if (a)
        loop_wake_now(a, !urgent);
}

/* Put j on the loop's list of jobs to look at (a->mu held; either thread). */
static void job_link_locked(agent *a, agent_job *j)
{
    if (j->dirty)
        return;
    j->dirty = true;
    j->dirty_next = a->dirty;
    a->dirty = j;
}

/* j's queue changed from `before` (agent_evq_flags) with a->mu held; or it
 * ended (terminal). The loop looks only at jobs linked on a->dirty, so a
 * change it must act on links j; a push that adds no flag (an upload of
 * j's is in flight, or j already waits for one) tells it nothing new
 * (issue 24: every paced token woke the loop into a walk of every job).
 * WAKE_NONE for a change the loop is bound to see anyway before acting
 * (a->lazy_srv, a->lazy_urgent_srv); WAKE_URGENT for an end, or a first
 * output that can go now; else WAKE_SOON. */
static wake_kind job_note_locked(agent *a, agent_job *j, unsigned before, bool terminal)
{
    unsigned gained = agent_evq_flags(&j->q) & ~before;
    if (!gained && !terminal)
        return WAKE_NONE;
    job_link_locked(a, j);
    if (terminal || ((gained & AGENT_EVQ_URGENT) && a->lazy_urgent_srv != j->srv))
        return WAKE_URGENT;
    return a->lazy_srv != j->srv ? WAKE_SOON : WAKE_NONE;
}

/* Queue ev (reference stolen); output: a token or a tool call (the job's
 * first one is marked: agent_evq_mark_output). */
static void sink_push_ev(agent_job *j, json_t *ev, bool output)
{
    agent *a = j->a;
    pthread_mutex_lock(&a->mu);
    unsigned before = agent_evq_flags(&j->q);
    if (agent_evq_push(&j->q, ev) == 0 && output)
        agent_evq_mark_output(&j->q);
    wake_kind wake = job_note_locked(a, j, before, false);
    pthread_mutex_unlock(&a->mu);
    loop_wake(a, wake);
}

static void sink_push(agent_job *j, json_t *ev)
{
    sink_push_ev(j, ev, false);
}

static void sink_push_output(agent_job *j, json_t *ev)
{
    sink_push_ev(j, ev, true);
}

static void sink_started(void *ctx)
{
    sink_push(ctx, json_pack("{s:s}", "type", "started"));
}

/* A token event is queued as its compact JSON text, rendered straight
 * into the job's queue (agent_evq_push_token): an object per token and its
 * size walk and dump were a third of the agent's instructions per relayed
 * request, a jansson string per token and its free an eighth of the rest
 * (issue 24). */
static void sink_token(void *ctx, const char *text, size_t len, int32_t token_id)
{
    agent_job *j = ctx;
    agent *a = j->a;
    pthread_mutex_lock(&a->mu);
    unsigned before = agent_evq_flags(&j->q);
    if (agent_evq_push_token(&j->q, text, len, token_id) == 0)
        agent_evq_mark_output(&j->q);
    wake_kind wake = job_note_locked(a, j, before, false);
    pthread_mutex_unlock(&a->mu);
    loop_wake(a, wake);
}

/* A token event with the ids of every token sampled since the previous
 * token event (docs/protocol.md): token_id is the last, token_ids all of
 * them when there is more than one. */
static void sink_token_ids(void *ctx, const char *text, size_t len, const int32_t *ids,
                           size_t n_ids)
{
    json_t *t = json_stringn(text, len);
    if (!t)
        t = json_string("\xef\xbf\xbd");
    json_t *ev = json_pack("{s:s,s:o}", "type", "token", "text", t);
    if (ev && n_ids > 0)
        json_object_set_new(ev, "token_id", json_integer(ids[n_ids - 1]));
    if (ev && n_ids > 1) {
        json_t *arr = json_array();
        for (size_t i = 0; arr && i < n_ids; i++)
            json_array_append_new(arr, json_integer(ids[i]));
        if (arr)
            json_object_set_new(ev, "token_ids", arr);
    }
    sink_push_output(ctx, ev);
}

/* m (borrowed) with "type":"metrics" set, rendered from m itself
 * (agent_evq_push_typed): a deep copy per request was a quarter of it. */
static void sink_metrics(void *ctx, json_t *m)
{
    agent_job *j = ctx;
    agent *a = j->a;
    pthread_mutex_lock(&a->mu);
    unsigned before = agent_evq_flags(&j->q);
    agent_evq_push_typed(&j->q, m, "metrics");
    wake_kind wake = job_note_locked(a, j, before, false);
    pthread_mutex_unlock(&a->mu);
    loop_wake(a, wake);
}

static void sink_tool_call(void *ctx, int index, const char *id, const char *name,
                           const char *args, size_t args_len)
{
    json_t *a = json_stringn(args ? args : "", args ? args_len : 0);
    if (!a)
        a = json_string("");
    json_t *ev = json_pack("{s:s,s:i,s:o}", "type", "tool_call", "index", index, "arguments", a);
    if (ev && id)
        json_object_set_new(ev, "id", json_string(id));
    if (ev && name)
        json_object_set_new(ev, "name", json_string(name));
    sink_push_output(ctx, ev);
}

static void sink_progress(void *ctx, long long done, long long total)
{
    sink_push(ctx, json_pack("{s:s,s:I,s:I}", "type", "progress", "prompt_tokens_done",
                             (json_int_t)done, "prompt_tokens_total", (json_int_t)total));
}

/* {"type":"embedding","index":i,"embedding":base64 of dim little-endian
 * float32} (docs/protocol.md "Embeddings"; the hosts are little-endian). */
static void sink_embedding(void *ctx, int index, const float *v, int dim)
{
    char *b64 = gp_base64_encode(v, (size_t)dim * sizeof *v);
    json_t *ev = b64 ? json_pack("{s:s,s:i,s:s}", "type", "embedding", "index", index,
                                 "embedding", b64)
                     : NULL;
    free(b64);
    sink_push(ctx, ev);
}

static void sink_stop_sequence(void *ctx, const char *seq)
{
    agent_job *j = ctx;
    char *copy = seq ? strdup(seq) : NULL;
    pthread_mutex_lock(&j->a->mu);
    free(j->stop_seq);
    j->stop_seq = copy;
    pthread_mutex_unlock(&j->a->mu);
}

/* What the server accepts of upstream values (src/server/fleet/agent_check.h:
 * GPS_AGENT_MAX_UPSTREAM_META, GPS_AGENT_MAX_TOKENS). An upstream beyond
 * them would make the server refuse the whole upload: such values are
 * dropped here, with a warning (issue 25). */
#define AGENT_MAX_UPSTREAM_META 4096
#define AGENT_MAX_TOKENS 1000000000LL

static void sink_upstream_meta(void *ctx, json_t *meta)
{
    agent_job *j = ctx;
    json_t *copy = json_is_object(meta) ? json_deep_copy(meta) : NULL;
    size_t n = copy ? json_dumpb(copy, NULL, 0, JSON_COMPACT) : 0;
    if (n > AGENT_MAX_UPSTREAM_META) {
        gp_log_write(GP_LOG_WARN, "upstream_value_dropped", j->correlation_id,
                     json_pack("{s:s,s:s,s:I}", "job_id", j->id, "field", "x_pool_meta",
                               "bytes", (json_int_t)n),
                     "the upstream's x_pool_meta is over %d bytes: not passed on",
                     AGENT_MAX_UPSTREAM_META);
        json_decref(copy);
        copy = NULL;
    }
    pthread_mutex_lock(&j->a->mu);
    json_decref(j->upstream_meta);
    j->upstream_meta = copy;
    pthread_mutex_unlock(&j->a->mu);
}

/* A token count from the upstream, or -1 (unknown) when absurd. */
static long long sane_count(agent_job *j, const char *field, long long v)
{
    if (v <= AGENT_MAX_TOKENS)
        return v;
    gp_log_write(GP_LOG_WARN, "upstream_value_dropped", j->correlation_id,
                 json_pack("{s:s,s:s,s:I}", "job_id", j->id, "field", field, "value",
                           (json_int_t)v),
                 "the upstream reported %lld %s: not passed on", v, field);
    return -1;
}

static void sink_end(void *ctx, const char *finish_reason, long long pt, long long ct)
{
    agent_job *j = ctx;
    pt = sane_count(j, "prompt_tokens", pt);
    ct = sane_count(j, "completion_tokens", ct);
    json_t *usage = json_object();
    if (pt >= 0)
        json_object_set_new(usage, "prompt_tokens", json_integer(pt));
    if (ct >= 0)
        json_object_set_new(usage, "completion_tokens", json_integer(ct));
    const char *fr = "stop";
    if (finish_reason && strcmp(finish_reason, "length") == 0)
        fr = "length";
    else if (finish_reason && strcmp(finish_reason, "tool_calls") == 0)
        fr = "tool_calls";
    json_t *ev = json_pack("{s:s,s:s,s:o}", "type", "end", "finish_reason", fr, "usage", usage);
    agent *a = j->a;
    pthread_mutex_lock(&a->mu);
    if (ev && j->stop_seq && strcmp(fr, "stop") == 0)
        json_object_set_new(ev, "stop_sequence", json_string(j->stop_seq));
    if (ev && j->upstream_meta) {
        json_object_set_new(ev, "upstream_meta", j->upstream_meta);
        j->upstream_meta = NULL;
    }
    agent_evq_push(&j->q, ev);
    j->backend_done = true;
    job_note_locked(a, j, 0, true);
    pthread_mutex_unlock(&a->mu);
    loop_wake(a, WAKE_URGENT);
}

static void sink_error(void *ctx, const char *code, const char *message)
{
    agent_job *j = ctx;
    agent *a = j->a;
    pthread_mutex_lock(&a->mu);
    /* A stop we caused is reported for what it is, not as a cancellation. */
    if (j->stop_shutdown) {
        code = "AGENT_SHUTDOWN";
        message = "the agent shut down before the job finished";
    } else if (j->stop_deadline) {
        code = "TIMEOUT";
        message = "the job ran past its deadline";
    }
    json_t *ev = json_pack("{s:s,s:s,s:s}", "type", "error", "code", code ? code : "INTERNAL_ERROR",
                           "message", message ? message : "");
    agent_evq_push(&j->q, ev);
    j->backend_done = true;
    job_note_locked(a, j, 0, true);
    pthread_mutex_unlock(&a->mu);
    loop_wake(a, WAKE_URGENT);
}

/* ======================================================================== */
/* Requests to the server                                                   */
/* ======================================================================== */

static size_t req_write_cb(char *p, size_t sz, size_t nm, void *ud)
{
    req *r = ud;
    size_t n = sz * nm;
    if (r->resp.len + n > MAX_RESPONSE_BYTES) {
        r->too_big = true;
        return 0; /* abort the transfer */
    }
    if (gp_buf_append(&r->resp, p, n) < 0)
        return 0;
    return n;
}

static void req_free(req *r)
{
    if (!r)
        return;
    free(r->batch);
    free(r->body);
    if (r->easy)
        curl_easy_cleanup(r->easy);
    curl_slist_free_all(r->hdrs);
    gp_buf_free(&r->resp);
    free(r);
}

/* An easy handle with what every request sets alike: a finished request's
 * (kept as it was: issue 24, curl_easy_reset and setting everything again
 * cost ~3,000 instructions a request) or a new one. */
static CURL *easy_take(agent *a)
{
    if (a->n_easy_idle)
        return a->easy_idle[--a->n_easy_idle];
    CURL *e = curl_easy_init();
    if (!e)
        return NULL;
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, req_write_cb);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    if (!a->proxy_env) {
        /* What libcurl concludes from an environment without proxy
         * variables, said once: it read five of them per request. */
        curl_easy_setopt(e, CURLOPT_PROXY, "");
        curl_easy_setopt(e, CURLOPT_NOPROXY, "");
    }
    /* https:// servers are verified (chain and host name) unless the
     * operator explicitly opted out (agent_config refuses --insecure
     * without its confirmation flag). */
    if (a->o->ca_file)
        curl_easy_setopt(e, CURLOPT_CAINFO, a->o->ca_file);
    if (a->o->insecure) {
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 0L);
    } else {
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
    }
    return e;
}

/* Whether the environment names a proxy for libcurl (the variables it
 * reads for http:// and https:// URLs, and no_proxy). */
static bool proxy_env_set(void)
{
    static const char *const vars[] = {"http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY",
                                       "all_proxy",  "ALL_PROXY",  "no_proxy",    "NO_PROXY"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return true;
    return false;
}

/* servers[srv]+path parsed once, for the paths every relayed request
 * posts to (issue 24: libcurl parsed each request's URL again, ~5,000
 * instructions); NULL for others, or when it cannot be made (then the
 * request gives libcurl the URL text as before). */
static CURLU *server_url(agent *a, int srv, req_kind kind, const char *url)
{
    if ((kind != REQ_WORK && kind != REQ_EVENTS_BATCH) || !a->uh)
        return NULL;
    CURLU **u = &a->uh[srv * 2 + (kind == REQ_WORK ? 0 : 1)];
    if (!*u && (*u = curl_url()) &&
        curl_url_set(*u, CURLUPART_URL, url, CURLU_GUESS_SCHEME | CURLU_NON_SUPPORT_SCHEME) !=
            CURLUE_OK) {
        curl_url_cleanup(*u);
        *u = NULL;
    }
    return *u;
}

/* Start POST servers[srv]+path with the body text (len bytes; taken: the
 * request owns it from here on, also on failure, and libcurl reads it in
 * place rather than copy it). Returns the request or NULL (logged). */
static req *req_start_text(agent *a, int srv, req_kind kind, const char *path, char *text,
                           size_t len, long timeout_ms, const char *correlation_id)
{
    req *r = calloc(1, sizeof *r);
    if (!r || !text)
        goto fail;
    r->body = text;
    text = NULL;
    r->kind = kind;
    r->srv = srv;
    gp_buf_init(&r->resp);
    r->easy = easy_take(a);
    if (!r->easy || !a->hdrs)
        goto fail;
    char url[2048];
    if ((size_t)snprintf(url, sizeof url, "%s%s", a->servers[srv], path) >= sizeof url)
        goto fail;
    if (correlation_id && *correlation_id && strlen(correlation_id) < 200 &&
        !strpbrk(correlation_id, "\r\n")) {
        /* Its own list: the shared one and X-Correlation-Id. */
        for (struct curl_slist *h = a->hdrs; h; h = h->next)
            if (!(r->hdrs = curl_slist_append(r->hdrs, h->data)))
                goto fail;
        char h[256];
        snprintf(h, sizeof h, "X-Correlation-Id: %s", correlation_id);
        struct curl_slist *l = curl_slist_append(r->hdrs, h);
        if (!l)
            goto fail;
        r->hdrs = l;
    }
    CURLU *uh = server_url(a, srv, kind, url);
    curl_easy_setopt(r->easy, CURLOPT_CURLU, uh);
    if (!uh)
        curl_easy_setopt(r->easy, CURLOPT_URL, url);
    curl_easy_setopt(r->easy, CURLOPT_HTTPHEADER, r->hdrs ? r->hdrs : a->hdrs);
    curl_easy_setopt(r->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(r->easy, CURLOPT_POSTFIELDS, r->body);
    curl_easy_setopt(r->easy, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(r->easy, CURLOPT_PRIVATE, r);
    curl_easy_setopt(r->easy, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(r->easy, CURLOPT_ERRORBUFFER, r->errbuf);
    /* Named on the rare requests only (poll, enrollment, deregistration):
     * the server reads no User-Agent, and libcurl formats each byte of it
     * into every long-poll and upload. */
    curl_easy_setopt(r->easy, CURLOPT_USERAGENT,
                     kind == REQ_WORK || kind == REQ_EVENTS || kind == REQ_EVENTS_BATCH
                         ? NULL
                         : "gpupool-agent/" AGENT_VERSION);
    a->kick = true; /* loop_turn drives it before the loop sleeps */
    if (curl_multi_add_handle(a->multi, r->easy) != CURLM_OK)
        goto fail;
    return r;
fail:
    gp_log_error("request_failed", "cannot start a request to %s", path);
    free(text);
    req_free(r);
    return NULL;
}

/* Start POST servers[srv]+path with body (reference stolen). */
static req *req_start_at(agent *a, int srv, req_kind kind, const char *path, json_t *body,
                         long timeout_ms, const char *correlation_id)
{
    char *text = body ? gp_json_dumps(body) : NULL;
    json_decref(body);
    return req_start_text(a, srv, kind, path, text, text ? strlen(text) : 0, timeout_ms,
                          correlation_id);
}

/* A request to the server polled now. */
static req *req_start(agent *a, req_kind kind, const char *path, json_t *body, long timeout_ms,
                      const char *correlation_id)
{
    return req_start_at(a, a->cur, kind, path, body, timeout_ms, correlation_id);
}

/* Free a finished request (removed from the multi handle), keeping its
 * easy handle for the next request (req_start_text sets again every option
 * that differs between requests). */
static void req_done_free(agent *a, req *r)
{
    if (r->easy && a->n_easy_idle < EASY_IDLE_MAX) {
        curl_easy_setopt(r->easy, CURLOPT_ERRORBUFFER, NULL); /* r->errbuf goes */
        a->easy_idle[a->n_easy_idle++] = r->easy;
        r->easy = NULL;
    }
    req_free(r);
}

/* Abort a request in flight (its completion handler will not run). */
static void req_abort(agent *a, req *r)
{
    if (!r)
        return;
    curl_multi_remove_handle(a->multi, r->easy);
    req_free(r);
}

/* ======================================================================== */
/* /agents/poll                                                             */
/* ======================================================================== */

/* What the server needs to know this process and the jobs it holds
 * (docs/protocol.md "Liveness"): instance, every job not yet reaped
 * (running, or finished with events still to deliver), and the last work
 * reply read before the list was made. */
static void add_liveness(agent *a, json_t *body, bool with_jobs)
{
    json_object_set_new(body, "instance", json_string(a->instance));
    if (!with_jobs)
        return;
    json_t *ids = json_array();
    /* An id passed job_id_ok (ASCII): no UTF-8 check needed, one a running
     * job in every long-poll (issue 24). */
    for (agent_job *j = a->jobs; j && ids; j = j->next)
        if (j->srv == a->cur) /* another server's jobs mean nothing here */
            json_array_append_new(ids, json_string_nocheck(j->id));
    if (ids)
        json_object_set_new(body, "running_jobs", ids);
    if (a->delivery_seen[0])
        json_object_set_new(body, "delivery_seen", json_string(a->delivery_seen));
}

static json_t *poll_body(agent *a)
{
    int busy = busy_slots(a), total, usable;
    slot_counts(a, &total, &usable);
    json_t *b = json_pack("{s:s,s:s,s:s,s:o,s:{s:I,s:i},s:i,s:O,s:s}", "agent_id", a->id,
                          "name", a->name, "version", AGENT_VERSION, "models",
                          a->be->ops->models(a->be), "slots", "total",
                          (json_int_t)total, "busy", busy, "queue_depth", 0, "labels",
                          a->labels, "status", a->draining ? "draining" : "online");
    if (!b)
        return NULL;
    json_object_update(b, a->static_facts);
    json_object_set_new(b, "gpus", agent_facts_gpus());
    if (!json_object_get(b, "models"))
        json_object_set_new(b, "models", json_array());
    /* The backend in use (docs/protocol.md "Backend and GPUs"): the gguf
     * backend says cuda or cpu in its poll_facts. */
    json_object_set_new(b, "backend", json_string(a->be->ops->name));
    if (a->be->ops->poll_facts)
        a->be->ops->poll_facts(a->be, b);
    add_liveness(a, b, true);
    return b;
}

static void poll_start(agent *a)
{
    json_t *body = poll_body(a);
    a->poll_req = body ? req_start(a, REQ_POLL, "/agents/poll", body,
                                   (long)a->o->request_timeout_sec * 1000, NULL)
                       : NULL;
    if (!a->poll_req)
        a->next_poll_ms = gp_now_mono_ms() + 1000;
}

/* Leave the server polled now for the next one of the list (docs/agent.md
 * "Several servers"). Its poll, long-poll and enrollment in flight are
 * aborted (the server failed them, or will); the uploads of the jobs it
 * assigned stay with it, as after a restart of the only server. What the
 * server told us about itself is forgotten until the next one says it.
 * quiet: a move within an outage of the whole list (logged at debug). */
static void server_switch(agent *a, const char *what, const char *detail, bool quiet)
{
    int from = a->cur;
    a->cur = (a->cur + 1) % a->n_servers;
    a->base = a->servers[a->cur];
    gp_log_write(quiet ? GP_LOG_DEBUG : GP_LOG_WARN, "server_switch", NULL,
                 json_pack("{s:s,s:s,s:s,s:s}", "from", a->servers[from], "to", a->base,
                           "request", what, "reason", detail),
                 "%s failed on %s (%s); moving to %s", what, a->servers[from], detail, a->base);
    req_abort(a, a->enroll_req);
    req_abort(a, a->poll_req);
    req_abort(a, a->work_req);
    req_abort(a, a->work_stale);
    a->enroll_req = a->poll_req = a->work_req = a->work_stale = NULL;
    /* A batched upload to the old server stays its jobs' (batch_done still
     * takes its answer) but must not hold back the new server's batches
     * until it times out. */
    a->batch_req = a->urgent_req = NULL;
    a->events_batch = false;   /* until the new server's poll reply announces it */
    a->no_liveness = false;
    a->server_drain = false;   /* an operator's drain on the old server stays there */
    a->prefix_reported = false;
    a->live_dirty = true;       /* its running_jobs are another list */
    a->live_sent_ms = 0;        /* ... which the new server's first long-poll carries */
    a->delivery_seen[0] = '\0'; /* the old server's delivery numbers */
}

/* Back off after a failed request; returns the delay (ms). With several
 * servers a failure moves to the next one at once while some server of
 * the list is untried in this turn; a whole turn failing backs off as one
 * server does, so that a dead fleet is not hammered. */
static uint32_t server_unreachable(agent *a, const char *what, const char *detail)
{
    bool full_turn = ++a->turn_fails % a->n_servers == 0;
    uint32_t d = full_turn ? agent_backoff_next(&a->backoff, rnd32()) : 0;
    if (a->n_servers > 1)
        server_switch(a, what, detail, a->turn_fails > a->n_servers);
    if (!a->server_down_logged && full_turn)
        gp_log_warn("server_unreachable", "%s failed (%s); retrying with backoff", what, detail);
    else
        gp_log_debug("server_unreachable", "%s failed (%s); next try in %u ms", what, detail, d);
    a->server_down_logged = full_turn || a->server_down_logged;
    a->registered = false;
    uint64_t now = gp_now_mono_ms();
    if (!a->poll_req && a->next_poll_ms < now + d)
        a->next_poll_ms = now + d;
    a->next_work_ms = now + d;
    return d;
}

/* The error message of a native error body, for logs. */
static const char *error_text(json_t *body)
{
    const char *m = json_string_value(json_object_get(json_object_get(body, "error"), "message"));
    return m ? m : "";
}

/* The stable code of a native error body ("" when none). */
static const char *error_code(json_t *body)
{
    const char *c = json_string_value(json_object_get(json_object_get(body, "error"), "code"));
    return c ? c : "";
}

/* How long 401s from every server of a list may last before the key counts
 * as revoked: several refresh intervals of servers sharing a database. */
#define AGENT_AUTH_GRACE_MS 30000

/* The server refused our key (401): revoked, expired or unknown. Retrying
 * cannot help (with several servers: once the grace above is over), so
 * leave with a clear line rather than spin. Exit 2, like a
 * configuration error: the unit's RestartPreventExitStatus=2 keeps systemd
 * from restarting us into the same refusal every few seconds. */
static void auth_lost(agent *a, const char *what, long status, json_t *body)
{
    if (a->fatal)
        return;
    if (a->n_servers > 1) {
        /* Servers sharing a database learn of a key made on another one
         * within their refresh interval (shared_refresh_sec, docs/
         * scaling.md): a server we just moved to may not know our key yet.
         * Go on along the list for a while; a key every server still
         * refuses after that is revoked. */
        uint64_t now = gp_now_mono_ms();
        if (!a->auth_refused_since)
            a->auth_refused_since = now;
        if (now - a->auth_refused_since < AGENT_AUTH_GRACE_MS) {
            char d[200];
            snprintf(d, sizeof d, "HTTP %ld %s", status, error_code(body));
            server_unreachable(a, what, d);
            return;
        }
    }
    if (!a->key_from_file && !(a->o->token && *a->o->token)) {
        /* Started without a key against a server with auth off; a key
         * made since then turned auth on. */
        gp_log_error("auth_required",
                     "server refused this agent on %s: HTTP %ld %s %s; exiting. The server "
                     "now requires a key (auth turns on with its first key): make an "
                     "enrollment token (gpupoolctl tokens create) and start this agent with "
                     "--token TOKEN (or GPUPOOL_TOKEN in its environment file)",
                     what, status, error_code(body), error_text(body));
        a->fatal = true;
        a->exit_code = 2;
        return;
    }
    gp_log_error("auth_revoked",
                 "server refused the agent key on %s: HTTP %ld %s %s; exiting. %s%s%s", what,
                 status, error_code(body), error_text(body),
                 a->key_from_file ? "The key in " : "Check --token",
                 a->key_from_file ? a->o->state_dir : "",
                 a->key_from_file ? "/" AGENT_KEY_FILE " is no longer valid: delete it and "
                                    "start with --token NEW_ENROLLMENT_TOKEN to enroll again"
                                  : "");
    a->fatal = true;
    a->exit_code = 2;
}

/* ======================================================================== */
/* /agents/enroll                                                           */
/* ======================================================================== */

/* Use key as our Bearer credential from now on (NULL/"" = none), and
 * build the header list every request shares with it (issue 24: a list
 * per request, and libcurl formats every header byte of each request):
 * the JSON type the server requires of bodies; no "Expect: 100-continue"
 * round trip; no "Accept: *" line the server ignores. 0 or -1. */
static int set_key(agent *a, const char *key)
{
    free(a->auth_header);
    a->auth_header = NULL;
    if (key && *key) {
        size_t n = strlen(key) + 32;
        a->auth_header = malloc(n);
        if (!a->auth_header)
            return -1;
        snprintf(a->auth_header, n, "Authorization: Bearer %s", key);
    }
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    struct curl_slist *h2 = h ? curl_slist_append(h, "Expect:") : NULL;
    struct curl_slist *h3 = h2 ? curl_slist_append(h2, "Accept:") : NULL;
    struct curl_slist *h4 = h3 && a->auth_header ? curl_slist_append(h3, a->auth_header) : h3;
    struct curl_slist **old =
        h4 && a->hdrs ? realloc(a->hdrs_old, (a->n_hdrs_old + 1) * sizeof *old) : NULL;
    if (!h4 || (a->hdrs && !old)) {
        curl_slist_free_all(h);
        return -1;
    }
    if (a->hdrs) {
        /* An idle handle may still point at it: kept until agent_destroy
         * (a key changes once, at enrollment). */
        a->hdrs_old = old;
        a->hdrs_old[a->n_hdrs_old++] = a->hdrs;
    }
    a->hdrs = h;
    return 0;
}

static void enroll_start(agent *a)
{
    json_t *body = json_pack("{s:s,s:s}", "agent_id", a->id, "name", a->name);
    a->enroll_req = body ? req_start(a, REQ_ENROLL, "/agents/enroll", body,
                                     (long)a->o->request_timeout_sec * 1000, NULL)
                         : NULL;
    if (!a->enroll_req)
        a->next_enroll_ms = gp_now_mono_ms() + 1000;
}

/* The first start with --token and no agent.key: trade the enrollment
 * token for our own key (docs/agent.md). */
static void enroll_done(agent *a, CURLcode rc, long status, json_t *body)
{
    uint64_t now = gp_now_mono_ms();
    const char *code = error_code(body);
    if (rc != CURLE_OK || status >= 500 || status == 0 || status == 408 || status == 429) {
        char d[160];
        snprintf(d, sizeof d, "%s, HTTP %ld", rc != CURLE_OK ? curl_easy_strerror(rc) : "ok",
                 status);
        a->next_enroll_ms = now + server_unreachable(a, "enroll", d);
        return;
    }
    if (status == 200) {
        const char *key = json_string_value(json_object_get(body, "agent_key"));
        const char *kid = json_string_value(json_object_get(body, "key_id"));
        char err[512];
        if (!agent_key_valid(key) || agent_state_save_key(a->o->state_dir, key, err,
                                                          sizeof err) < 0) {
            /* The token's use is spent; say so rather than enroll again. */
            gp_log_error("enroll_failed", "enrolled, but could not keep the agent key: %s; "
                         "the enrollment token's use is spent, ask for a new one",
                         agent_key_valid(key) ? err : "the reply holds no valid agent_key");
            a->fatal = true;
            a->exit_code = 1;
            return;
        }
        if (set_key(a, key) < 0) {
            gp_log_error("enroll_failed", "out of memory");
            a->fatal = true;
            a->exit_code = 1;
            return;
        }
        gp_log_info("enrolled", "enrolled with %s as agent %s (key %s); the key is kept in "
                    "%s/" AGENT_KEY_FILE " and used from now on",
                    a->base, a->id, kid ? kid : "?", a->o->state_dir);
        a->key_from_file = true;
    } else if ((status == 403 && strcmp(code, "WRONG_ROLE") == 0) || status == 404 ||
               (status == 409 && strcmp(code, "ENROLLMENT_NOT_NEEDED") == 0)) {
        /* --token AGENTKEY (the key itself), a server without enrollment,
         * or one with auth off: go on with the token as it is. */
        gp_log_info("enroll_skipped", "%s; using --token as the agent key",
                    status == 403   ? "the token is not an enrollment token"
                    : status == 404 ? "the server has no enrollment endpoint"
                                    : "the server runs with auth off");
    } else {
        gp_log_error("enroll_rejected",
                     "server refused enrollment: HTTP %ld %s %s; exiting (ask the operator "
                     "for a new enrollment token)",
                     status, code, error_text(body));
        a->fatal = true;
        a->exit_code = 2;
        return;
    }
    a->enrolling = false;
    a->server_down_logged = false;
    a->turn_fails = 0;
    agent_backoff_reset(&a->backoff);
    a->next_poll_ms = now;
}

static void poll_done(agent *a, CURLcode rc, long status, json_t *body)
{
    uint64_t now = gp_now_mono_ms();
    if (rc != CURLE_OK || status >= 500 || status == 0) {
        char d[160];
        snprintf(d, sizeof d, "%s, HTTP %ld", rc != CURLE_OK ? curl_easy_strerror(rc) : "ok",
                 status);
        server_unreachable(a, "poll", d);
        return;
    }
    if (status == 401) {
        auth_lost(a, "/agents/poll", status, body);
        return;
    }
    const char *code = error_code(body);
    if (status == 403 && (strcmp(code, "AGENT_ID_TAKEN") == 0 ||
                          strcmp(code, "KEY_BOUND_TO_OTHER_AGENT") == 0)) {
        /* Our agent_id and our key belong to different agents: no retry can
         * fix that, and the unit must not restart into it (exit 2). */
        gp_log_error("agent_id_refused",
                     "server refused agent_id %s: HTTP 403 %s %s; exiting. The agent_id in "
                     "%s/agent_id and the agent key must belong together: a new box needs "
                     "its own state dir (a new agent_id) and its own key or enrollment token",
                     a->id, code, error_text(body), a->o->state_dir);
        a->fatal = true;
        a->exit_code = 2;
        return;
    }
    if (status != 200) {
        /* 400/403: a configuration problem; log it loudly and retry slowly. */
        gp_log_error("poll_rejected", "server rejected /agents/poll: HTTP %ld %s%s", status,
                     error_text(body), status == 403 ? " (check --token)" : "");
        a->registered = false;
        uint32_t d = agent_backoff_next(&a->backoff, rnd32());
        a->next_poll_ms = now + d;
        a->next_work_ms = now + d;
        return;
    }
    if (a->server_down_logged || !a->registered)
        gp_log_write(GP_LOG_INFO, "registered", NULL, json_pack("{s:s}", "server", a->base),
                     "poll accepted by %s (agent_id %s)", a->base, a->id);
    a->server_down_logged = false;
    a->registered = true;
    a->turn_fails = 0;
    a->auth_refused_since = 0;
    agent_backoff_reset(&a->backoff);
    json_int_t pi = json_integer_value(json_object_get(body, "poll_interval_sec"));
    if (pi >= 1 && pi <= 3600)
        a->poll_interval_ms = (uint32_t)pi * 1000;
    /* A server that takes batched uploads says so; an older one does not,
     * and keeps getting one upload per job. */
    bool batch = false;
    size_t fi;
    json_t *fv;
    json_array_foreach(json_object_get(body, "features"), fi, fv)
    {
        if (json_is_string(fv) && strcmp(json_string_value(fv), "events_batch") == 0)
            batch = true;
    }
    a->events_batch = batch && a->o->events_batch;
    json_int_t ww = json_integer_value(json_object_get(body, "work_wait_sec"));
    if (ww >= 1 && ww <= 3600)
        a->work_wait_ms = (uint32_t)ww * 1000;
    /* Heartbeat a little before the interval runs out (suspect after one miss). */
    a->next_poll_ms = now + a->poll_interval_ms * 3 / 4;
    if (a->draining)
        a->drain_announced = true;
    if (a->next_work_ms > now && !a->work_req)
        a->next_work_ms = now; /* re-park at once now that the server knows us */

    /* The server's deployments for us (only a deploy backend takes them;
     * an older server sends none and nothing changes). */
    const json_t *deps = json_object_get(body, "deployments");
    if (json_is_array(deps) && a->be->ops->deploy)
        a->be->ops->deploy(a->be, deps);

    json_t *cmds = json_object_get(body, "commands");
    size_t i;
    json_t *c;
    bool told_drain = false;
    json_array_foreach(cmds, i, c)
    {
        const char *type = json_string_value(json_object_get(c, "type"));
        if (!type)
            continue;
        if (strcmp(type, "cancel") == 0) {
            const char *jid = json_string_value(json_object_get(c, "job_id"));
            agent_job *j = jid ? job_find(a, jid) : NULL;
            if (j) {
                gp_log_info("job_cancel", "server cancelled job %s (poll command)", j->id);
                j->cancelled = true;
                job_cancel(a, j);
                pthread_mutex_lock(&a->mu);
                job_link_locked(a, j); /* nothing more to upload; maybe done */
                pthread_mutex_unlock(&a->mu);
            }
        } else if (strcmp(type, "drain") == 0) {
            /* An operator's drain lasts as long as the server repeats it in
             * every poll reply; it is not ours to announce back (reporting
             * "draining" would keep the agent drained after an undrain). */
            if (!a->server_drain)
                gp_log_info("drain", "server asked this agent to drain");
            told_drain = true;
        } else {
            gp_log_debug("poll_command_ignored", "unknown poll command '%s'", type);
        }
    }
    if (a->server_drain && !told_drain)
        gp_log_info("undrain", "server no longer asks this agent to drain");
    a->server_drain = told_drain;
}

/* ======================================================================== */
/* /agents/work                                                             */
/* ======================================================================== */

static void job_free(agent_job *j)
{
    agent_evq_free(&j->q);
    free(j->stop_seq);
    json_decref(j->upstream_meta);
    free(j->correlation_id);
    free(j);
}

static void job_begin(agent *a, json_t *jj)
{
    const char *jid = json_string_value(json_object_get(jj, "job_id"));
    if (!job_id_ok(jid)) {
        gp_log_error("job_invalid", "work reply holds a job without a valid job_id; skipped");
        return;
    }
    if (job_find(a, jid)) {
        gp_log_warn("job_duplicate", "job %s was assigned twice; keeping the running one", jid);
        return;
    }
    /* Room for one more job in the loop's structures first, so that
     * nothing about a running job can fail for want of memory later. */
    size_t want = a->n_jobs + 1;
    if (want > a->review_cap) {
        size_t cap = a->review_cap ? a->review_cap * 2 : 64;
        agent_job **rv = realloc(a->review, cap * sizeof *rv);
        if (!rv)
            return;
        a->review = rv;
        a->review_cap = cap;
    }
    if (agent_timers_reserve(&a->deadlines, want) < 0 ||
        agent_timers_reserve(&a->retries, want) < 0 || agent_idtab_reserve(&a->jtab, want) < 0)
        return;
    agent_job *j = calloc(1, sizeof *j);
    if (!j)
        return;
    snprintf(j->id, sizeof j->id, "%s", jid);
    j->a = a;
    j->srv = a->cur;
    agent_evq_init(&j->q);
    agent_backoff_init(&j->ub, 200, 5000);
    const char *cid = json_string_value(json_object_get(jj, "correlation_id"));
    j->correlation_id = cid ? strdup(cid) : NULL;
    json_int_t dl = json_integer_value(json_object_get(jj, "deadline_ms"));
    if (dl > 0) {
        j->deadline_ms = gp_now_mono_ms() + (uint64_t)dl;
        agent_timers_set(&a->deadlines, &j->dl_timer, j->deadline_ms);
    }
    j->next = a->jobs;
    if (a->jobs)
        a->jobs->prev = j;
    a->jobs = j;
    agent_idtab_add(&a->jtab, &j->hnode, j->id); /* room: reserved above */
    a->live_dirty = true;
    a->n_jobs++;
    a->n_running++;

    if (gp_log_enabled(GP_LOG_INFO)) /* a json_pack per job otherwise thrown away */
        gp_log_write(GP_LOG_INFO, "job_start", j->correlation_id,
                     json_pack("{s:s}", "job_id", j->id), "starting job %s", j->id);
    agent_job_sink sink = {
        .ctx = j,
        .started = sink_started,
        .token = sink_token,
        .token_ids = sink_token_ids,
        .metrics = sink_metrics,
        .tool_call = sink_tool_call,
        .progress = sink_progress,
        .embedding = sink_embedding,
        .end = sink_end,
        .stop_sequence = sink_stop_sequence,
        .upstream_meta = sink_upstream_meta,
        .error = sink_error,
    };
    char err[256] = "";
    const char *rft = json_string_value(
        json_object_get(json_object_get(jj, "response_format"), "type"));
    if (rft && strcmp(rft, "text") != 0 && !a->be->ops->structured_output) {
        /* Never the unconstrained text in place of what was asked. */
        gp_log_write(GP_LOG_WARN, "job_rejected", j->correlation_id,
                     json_pack("{s:s}", "job_id", j->id),
                     "backend %s does not apply response_format", a->be->ops->name);
        /* INVALID_REQUEST: the server answers 400 with this message */
        char why[160];
        snprintf(why, sizeof why, "response_format json_object/json_schema is not supported by "
                 "this agent's %s backend", a->be->ops->name);
        sink_error(j, "INVALID_REQUEST", why);
    } else if (a->be->ops->job_start(a->be, jj, &sink, err, sizeof err) != 0) {
        gp_log_write(GP_LOG_WARN, "job_rejected", j->correlation_id,
                     json_pack("{s:s}", "job_id", j->id), "backend rejected job: %s", err);
        /* No callback will come: report it ourselves. */
        sink_error(j, "INVALID_REQUEST", err[0] ? err : "the backend could not start the job");
    } else if (a->jobs_stopped) {
        /* Assigned while we were already stopping: hand it back at once
         * (AGENT_SHUTDOWN) rather than run it past our exit. */
        pthread_mutex_lock(&a->mu);
        j->stop_shutdown = true;
        pthread_mutex_unlock(&a->mu);
        job_cancel(a, j);
    }
}

/* The backend's prefix_cache facts (gguf), or NULL: sent with every
 * long-poll too, so that the server routes a conversation's next turn by
 * what the slots hold now, not at the last heartbeat. New reference. */
static json_t *prefix_facts(agent *a)
{
    if (!a->be->ops->poll_facts)
        return NULL;
    json_t *tmp = json_object();
    if (!tmp)
        return NULL;
    a->be->ops->poll_facts(a->be, tmp);
    json_t *pc = json_incref(json_object_get(tmp, "prefix_cache"));
    json_decref(tmp);
    return pc;
}

/*
 * How often a long-poll lists the jobs the agent holds (running_jobs, with
 * delivery_seen), once it holds more than a few. The list tells the server
 * nothing it lacks unless a job vanished without its end (the server learns
 * every end from the uploads), and its stall timers run for a minute; but a
 * busy agent re-parks after every reply, and at 1,000 paced streams each of
 * hundreds of long-polls a second carried 1,000 ids (~40 KB) that the server
 * parsed and judged against every job: 13 % of its CPU. So: every long-poll
 * while the list is short, else one a second at most (docs/protocol.md
 * "Liveness"). /agents/poll always lists them. "Short" counts the jobs of
 * every server (n_jobs): an agent busy elsewhere throttles a short list to
 * the current server too, which only delays a lost job's end there.
 */
#define AGENT_LIVE_LIST_MS 1000
#define AGENT_LIVE_LIST_SMALL 16

/* running_jobs of the server polled now as JSON text (without brackets),
 * rebuilt only when a job came or went or the server changed: a jansson
 * array of every job, dumped on every long-poll, was ~8,000 instructions a
 * relayed request at 64 streams (issue 24). 0 or -1 (ENOMEM). */
static int live_ids_text(agent *a)
{
    if (!a->live_dirty)
        return 0;
    a->live_ids.len = 0;
    bool first = true;
    for (agent_job *j = a->jobs; j; j = j->next) {
        if (j->srv != a->cur) /* another server's jobs mean nothing here */
            continue;
        /* An id passed job_id_ok: nothing in it to escape. */
        if ((!first && gp_buf_append(&a->live_ids, ",", 1) < 0) ||
            gp_buf_append(&a->live_ids, "\"", 1) < 0 ||
            gp_buf_append(&a->live_ids, j->id, strlen(j->id)) < 0 ||
            gp_buf_append(&a->live_ids, "\"", 1) < 0)
            return -1; /* stays dirty: rebuilt next time */
        first = false;
    }
    a->live_dirty = false;
    return 0;
}

/* The long-poll's body as json_pack and add_liveness made it, written as
 * text: {"agent_id":..,"free_slots":N,"instance":..,"running_jobs":[..],
 * "delivery_seen":..,"prefix_cache":{..}}; running_jobs and delivery_seen
 * only when the list is due (AGENT_LIVE_LIST_MS). Owned text, or NULL. */
static char *work_body(agent *a, int free_slots, size_t *len)
{
    gp_buf b;
    gp_buf_init(&b);
    json_t *pc = prefix_facts(a);
    uint64_t now = gp_now_mono_ms();
    bool list = a->n_jobs <= AGENT_LIVE_LIST_SMALL || a->live_sent_ms == 0 ||
                now - a->live_sent_ms >= AGENT_LIVE_LIST_MS;
    int rc = (list && live_ids_text(a) < 0) || gp_buf_append(&b, "{\"agent_id\":", 12) < 0 ||
                     gp_json_str_append(&b, a->id) < 0 ||
                     gp_buf_append(&b, ",\"free_slots\":", 14) < 0 ||
                     gp_buf_append_int(&b, free_slots) < 0 ||
                     gp_buf_append(&b, ",\"instance\":", 12) < 0 ||
                     gp_json_str_append(&b, a->instance) < 0
                 ? -1
                 : 0;
    if (rc == 0 && list) {
        rc = gp_buf_append(&b, ",\"running_jobs\":[", 17) < 0 ||
                     gp_buf_append(&b, a->live_ids.data ? a->live_ids.data : "",
                                   a->live_ids.len) < 0 ||
                     gp_buf_append(&b, "]", 1) < 0
                 ? -1
                 : 0;
        a->live_sent_ms = now ? now : 1;
    }
    if (rc == 0 && list && a->delivery_seen[0])
        rc = gp_buf_append(&b, ",\"delivery_seen\":", 17) < 0 ||
                     gp_json_str_append(&b, a->delivery_seen) < 0
                 ? -1
                 : 0;
    if (rc == 0 && pc) {
        a->prefix_reported = json_is_true(json_object_get(pc, "enabled"));
        rc = gp_buf_append(&b, ",\"prefix_cache\":", 16) < 0 || gp_json_dump_append(&b, pc) < 0
                 ? -1
                 : 0;
    }
    json_decref(pc);
    if (rc < 0 || gp_buf_append(&b, "}", 1) < 0) {
        gp_buf_free(&b);
        return NULL;
    }
    *len = b.len;
    return gp_buf_steal(&b);
}

static void work_start(agent *a, int free_slots)
{
    size_t len = 0;
    char *body = work_body(a, free_slots, &len);
    long timeout = (long)a->work_wait_ms + 15000; /* the server holds it up to work_wait */
    a->work_req = req_start_text(a, a->cur, REQ_WORK, "/agents/work", body, len, timeout, NULL);
    a->work_free = free_slots;
    if (!a->work_req)
        a->next_work_ms = gp_now_mono_ms() + 1000;
}

/* The jobs of a 200 work reply, and its delivery token (echoed from now
 * on: every job it carried is in our list before the token is sent). */
static void work_jobs(agent *a, json_t *body)
{
    json_t *jobs = json_object_get(body, "jobs");
    size_t i;
    json_t *jj;
    json_array_foreach(jobs, i, jj) job_begin(a, jj);
    const char *d = json_string_value(json_object_get(body, "delivery"));
    if (d && strlen(d) < sizeof a->delivery_seen)
        snprintf(a->delivery_seen, sizeof a->delivery_seen, "%s", d);
}

/* A replaced long-poll came back: normally the server's 204; jobs are
 * taken if the server answered it with some before the new one arrived. */
static void work_stale_done(agent *a, CURLcode rc, long status, json_t *body)
{
    if (rc == CURLE_OK && status == 200)
        work_jobs(a, body);
}

static void work_done(agent *a, CURLcode rc, long status, json_t *body)
{
    uint64_t now = gp_now_mono_ms();
    if (rc == CURLE_OK && status == 400 && a->work_free == 0 && !a->no_liveness &&
        strstr(error_text(body), "free_slots")) {
        /* An older server: no liveness long-poll while busy (as before). */
        gp_log_info("liveness_unsupported", "server refused a busy agent's long-poll (%s); "
                    "a crash while busy is noticed by its stall timeout only", error_text(body));
        a->no_liveness = true;
        a->next_work_ms = now;
        return;
    }
    if (rc != CURLE_OK || status >= 500 || status == 0) {
        char d[160];
        snprintf(d, sizeof d, "%s, HTTP %ld", rc != CURLE_OK ? curl_easy_strerror(rc) : "ok",
                 status);
        server_unreachable(a, "work", d);
        a->next_poll_ms = now; /* find out whether the server is back (and re-register) */
        return;
    }
    if (status == 204) {
        a->next_work_ms = now;
        return;
    }
    if (status == 401) { /* e.g. KEY_REVOKED: the parked poll ended at revocation */
        auth_lost(a, "/agents/work", status, body);
        return;
    }
    if (status != 200) {
        /* Unknown agent (server lost us), bad key, ...: re-register first. */
        gp_log_warn("work_rejected", "server rejected /agents/work: HTTP %ld %s", status,
                    error_text(body));
        a->registered = false;
        a->next_poll_ms = now;
        a->next_work_ms = now + agent_backoff_next(&a->backoff, rnd32());
        return;
    }
    work_jobs(a, body);
    a->next_work_ms = now;
}

/* ======================================================================== */
/* /agents/jobs/{id}/events                                                 */
/* ======================================================================== */

/* The head of an events upload's body, as json_pack and add_liveness
 * would have rendered it: ids passed job_id_ok, agent ids and instances
 * are hex and dashes, so nothing needs escaping. */
static int body_head(gp_buf *b, agent *a)
{
    return gp_buf_append(b, "{\"agent_id\":\"", 13) < 0 ||
                   gp_buf_append(b, a->id, strlen(a->id)) < 0
               ? -1
               : gp_buf_append(b, "\"", 1);
}

static int body_tail(gp_buf *b, agent *a)
{
    return gp_buf_append(b, ",\"instance\":\"", 13) < 0 ||
                   gp_buf_append(b, a->instance, strlen(a->instance)) < 0 ||
                   gp_buf_append(b, "\"}", 2) < 0
               ? -1
               : 0;
}

/* Append `"seq":N,"events":[...]` for j's pending events and begin their
 * upload (a->mu held): the events go from the queue into the body in one
 * copy. 1, 0 (nothing to send) or -1 (ENOMEM; b as it was). */
static int body_events_locked(gp_buf *b, agent_job *j)
{
    size_t mark = b->len, seq = 0;
    if (!agent_evq_ready(&j->q))
        return 0;
    int rc = gp_buf_append(b, "\"seq\":", 6) < 0 ||
                     gp_buf_append_int(b, (long long)j->q.acked) < 0 ||
                     gp_buf_append(b, ",\"events\":[", 11) < 0
                 ? -1
                 : agent_evq_take_append(&j->q, MAX_BATCH_EVENTS, &seq, b);
    if (rc > 0 && gp_buf_append(b, "]", 1) < 0) {
        agent_evq_nack(&j->q);
        rc = -1;
    }
    if (rc <= 0)
        b->len = mark;
    return rc;
}

/* j's events upload could not start: again at `at`. */
static void job_retry_at(agent *a, agent_job *j, uint64_t at);
static void job_seen(agent *a, agent_job *j, unsigned flags);

/* One upload of j's pending events to the server that assigned it. */
static void upload_start(agent *a, agent_job *j, uint64_t now)
{
    gp_buf b;
    gp_buf_init(&b);
    int rc = body_head(&b, a) < 0 || gp_buf_append(&b, ",", 1) < 0 ? -1 : 0;
    pthread_mutex_lock(&a->mu);
    if (rc == 0)
        rc = body_events_locked(&b, j);
    pthread_mutex_unlock(&a->mu);
    if (rc > 0 && body_tail(&b, a) < 0) {
        pthread_mutex_lock(&a->mu);
        agent_evq_nack(&j->q);
        pthread_mutex_unlock(&a->mu);
        rc = -1;
    }
    if (rc <= 0) {
        gp_buf_free(&b);
        if (rc < 0)
            job_retry_at(a, j, now + 1000);
        else
            job_seen(a, j, 0); /* not ready after all: never so while the loop sees right */
        return;
    }
    char path[64 + MAX_JOB_ID];
    snprintf(path, sizeof path, "/agents/jobs/%s/events", j->id);
    size_t len = b.len;
    j->upload = req_start_text(a, j->srv, REQ_EVENTS, path, gp_buf_steal(&b), len,
                               (long)a->o->request_timeout_sec * 1000, j->correlation_id);
    if (!j->upload) {
        pthread_mutex_lock(&a->mu);
        agent_evq_nack(&j->q);
        pthread_mutex_unlock(&a->mu);
        job_retry_at(a, j, gp_now_mono_ms() + 1000);
        return;
    }
    j->upload->job = j;
    job_seen(a, j, 0); /* in flight: nothing to send until it is answered */
}

static void upload_done(agent *a, agent_job *j, CURLcode rc, long status, json_t *body)
{
    uint64_t now = gp_now_mono_ms();
    j->upload = NULL;
    if (rc == CURLE_OK && status == 200) {
        pthread_mutex_lock(&a->mu);
        agent_evq_ack(&j->q);
        job_link_locked(a, j); /* j->upload went: the loop looks again */
        pthread_mutex_unlock(&a->mu);
        j->failing_since_ms = 0;
        agent_backoff_reset(&j->ub);
        if (json_is_true(json_object_get(body, "cancel")) && !j->cancelled) {
            gp_log_write(GP_LOG_INFO, "job_cancel", j->correlation_id,
                         json_pack("{s:s}", "job_id", j->id), "server cancelled job %s", j->id);
            j->cancelled = true;
            job_cancel(a, j);
        }
        return;
    }
    if (rc == CURLE_OK && status == 401) {
        pthread_mutex_lock(&a->mu);
        agent_evq_nack(&j->q);
        job_link_locked(a, j); /* j->upload went: the loop looks again */
        pthread_mutex_unlock(&a->mu);
        auth_lost(a, "an events upload", status, body);
        return;
    }
    if (rc == CURLE_OK && status == 409 && strcmp(error_code(body), "SEQ_GAP") == 0) {
        json_t *d = json_object_get(json_object_get(body, "error"), "details");
        json_int_t exp = json_integer_value(json_object_get(d, "expected_seq"));
        gp_log_warn("seq_gap", "job %s: server expects seq %lld; resending from there", j->id,
                    (long long)exp);
        pthread_mutex_lock(&a->mu);
        agent_evq_rewind(&j->q, exp > 0 ? (size_t)exp : 0);
        job_link_locked(a, j); /* j->upload went: the loop looks again */
        pthread_mutex_unlock(&a->mu);
        return;
    }
    if (rc == CURLE_OK && status == 400 && !j->upload_refused) {
        /* The server refused what the events say (a value out of its
         * bounds): without a word the client would wait for the deadline
         * (issue 25). The refused events make way for an error event that
         * ends the job now, and the backend stops. */
        j->upload_refused = true;
        char msg[600];
        snprintf(msg, sizeof msg, "the server refused this job's events: %.500s",
                 error_text(body));
        gp_log_write(GP_LOG_WARN, "upload_refused", j->correlation_id,
                     json_pack("{s:s,s:s}", "job_id", j->id, "error", error_text(body)),
                     "server refused events for job %s (HTTP 400): failing it", j->id);
        pthread_mutex_lock(&a->mu);
        agent_evq_replace_rest(&j->q, json_pack("{s:s,s:s,s:s}", "type", "error", "code",
                                                "AGENT_UPLOAD_REFUSED", "message", msg));
        job_link_locked(a, j); /* j->upload went: the loop looks again */
        pthread_mutex_unlock(&a->mu);
        job_cancel(a, j);
        return;
    }
    if (rc == CURLE_OK && status >= 400 && status < 500 && status != 408 &&
        status != 429) {
        /* 404 JOB_NOT_FOUND / 409 NOT_ASSIGNED / 400: this job is not ours to
         * continue; stop it and send nothing more. */
        gp_log_write(GP_LOG_WARN, "job_dropped", j->correlation_id,
                     json_pack("{s:s,s:s}", "job_id", j->id, "server", a->servers[j->srv]),
                     "server %s refused events for job %s: HTTP %ld %s", a->servers[j->srv],
                     j->id, status, error_text(body));
        pthread_mutex_lock(&a->mu);
        agent_evq_nack(&j->q);
        job_link_locked(a, j); /* j->upload went: the loop looks again */
        pthread_mutex_unlock(&a->mu);
        j->cancelled = true;
        job_cancel(a, j);
        return;
    }
    /* Transport error, 5xx, 408, 429: retry the same batch later. */
    pthread_mutex_lock(&a->mu);
    agent_evq_nack(&j->q);
    job_link_locked(a, j); /* j->upload went: the loop looks again */
    pthread_mutex_unlock(&a->mu);
    if (!j->failing_since_ms)
        j->failing_since_ms = now;
    uint32_t d = agent_backoff_next(&j->ub, rnd32());
    j->next_upload_ms = now + d;
    gp_log_write(GP_LOG_DEBUG, "upload_retry", j->correlation_id,
                 json_pack("{s:s,s:s}", "job_id", j->id, "server", a->servers[j->srv]),
                 "job %s: events upload to %s failed (%s, HTTP %ld); retry in %u ms", j->id,
                 a->servers[j->srv], rc != CURLE_OK ? curl_easy_strerror(rc) : "ok", status, d);
    if (now - j->failing_since_ms > UPLOAD_GIVE_UP_MS) {
        gp_log_write(GP_LOG_WARN, "job_dropped", j->correlation_id,
                     json_pack("{s:s,s:s}", "job_id", j->id, "server", a->servers[j->srv]),
                     "job %s: events could not be delivered to %s for %d s; giving up", j->id,
                     a->servers[j->srv], UPLOAD_GIVE_UP_MS / 1000);
        j->cancelled = true;
        job_cancel(a, j);
    }
}

/* Batched uploads (docs/protocol.md "Batched uploads"): the pending events
 * of every job with some, in one POST /agents/events, one such request in
 * flight. Sent as soon as the previous one is answered, so at low load a
 * token waits no longer than with one upload per job, and under load
 * everything that accumulated during a round trip travels together. Each
 * entry's outcome goes through upload_done as its own upload's would. */
#define BATCH_MAX_JOBS 1024            /* what the server takes in one (MAX_BATCH_JOBS) */
#define BATCH_MAX_BYTES (1u << 20)   /* then the rest waits for the next one */
/* How many jobs one batch carries: BATCH_JOBS, or a sixteenth of those
 * waiting when more than 1,024 wait (none waits more than ~16 round
 * trips), up to BATCH_MAX_JOBS. The server applies a batch in one
 * callback, writing to each job's client as it goes: at 1,000 paced
 * streams a batch of every waiting job (~175) kept its loop ~2 ms at a
 * time from new requests (first token p50 27 ms on relaybench's shared
 * core); at 64 the jobs left for the next batch gather their tokens, so
 * fewer, fuller writes reach the clients (server CPU 6.6 -> 5.3 s, first
 * token 3.9 ms, each token's delay after its stream's first p50 8 -> 20
 * ms, p99 41 -> 48 ms; docs/scaling.md "Twelfth round"). Urgent jobs
 * (first output, end) are at the front of a->bq: always in the next one. */
#define BATCH_JOBS 64

static size_t batch_jobs(const agent *a)
{
    size_t n = a->n_bq / 16;
    return n < BATCH_JOBS ? BATCH_JOBS : n > BATCH_MAX_JOBS ? BATCH_MAX_JOBS : n;
}

static void bq_remove(agent *a, agent_job *j);

/* One POST /agents/events with the pending events of the jobs on a->bq,
 * in their order, up to BATCH_MAX_JOBS and BATCH_MAX_BYTES (the rest stay
 * for the next one); urgent_only: of its urgent jobs only, as a->urgent_req
 * (batch_urgent_due), else as a->batch_req. A job is in one upload at a
 * time whichever request carries it, so its events keep their order and
 * the server's seq check is the same as with one batch. The body is
 * written straight from the queues under one lock:
 * {"agent_id":..,"jobs":[{"job_id":..,"seq":..,"events":[..]},..],
 * "instance":..}, byte for byte what the jansson tree of it dumped. */
static void batch_start(agent *a, uint64_t now, bool urgent_only)
{
    gp_buf b;
    gp_buf_init(&b);
    agent_job **jobs = calloc(a->n_bq ? a->n_bq : 1, sizeof *jobs);
    size_t k = 0;
    int rc = !jobs || body_head(&b, a) < 0 || gp_buf_append(&b, ",\"jobs\":[", 9) < 0 ? -1 : 0;
    pthread_mutex_lock(&a->mu);
    const size_t max_jobs = batch_jobs(a);
    for (agent_job *j = a->bq_head, *next; rc == 0 && j && k < max_jobs &&
                                          b.len < BATCH_MAX_BYTES; j = next) {
        size_t mark = b.len;
        next = j->bq_next;
        if (urgent_only && !j->seen_urgent)
            continue;
        if ((k && gp_buf_append(&b, ",", 1) < 0) || gp_buf_append(&b, "{\"job_id\":\"", 11) < 0 ||
            gp_buf_append(&b, j->id, strlen(j->id)) < 0 || gp_buf_append(&b, "\",", 2) < 0) {
            b.len = mark;
            break;
        }
        int er = body_events_locked(&b, j);
        if (er > 0 && gp_buf_append(&b, "}", 1) < 0) {
            agent_evq_nack(&j->q);
            er = -1;
        }
        if (er <= 0) {
            b.len = mark;
            if (er < 0)
                break;
            job_seen(a, j, 0); /* not ready after all: never so while the loop sees right */
            continue;
        }
        jobs[k++] = j;
    }
    bool tail_ok = k > 0 && gp_buf_append(&b, "]", 1) == 0 && body_tail(&b, a) == 0;
    if (k > 0 && !tail_ok)
        for (size_t i = 0; i < k; i++)
            agent_evq_nack(&jobs[i]->q);
    pthread_mutex_unlock(&a->mu);
    req *r = NULL;
    if (tail_ok) {
        size_t len = b.len;
        r = req_start_text(a, a->cur, REQ_EVENTS_BATCH, "/agents/events", gp_buf_steal(&b), len,
                           (long)a->o->request_timeout_sec * 1000, NULL);
        if (!r) {
            pthread_mutex_lock(&a->mu);
            for (size_t i = 0; i < k; i++)
                agent_evq_nack(&jobs[i]->q);
            pthread_mutex_unlock(&a->mu);
        }
    }
    gp_buf_free(&b);
    if (!r) {
        /* Nothing went: each job tries again in a second (as one upload would). */
        for (size_t i = 0; i < k; i++)
            job_retry_at(a, jobs[i], now + 1000);
        free(jobs);
        return;
    }
    r->batch = jobs;
    r->n_batch = k;
    for (size_t i = 0; i < k; i++) {
        jobs[i]->upload = r;
        job_seen(a, jobs[i], 0); /* in flight: off a->bq */
    }
    *(urgent_only ? &a->urgent_req : &a->batch_req) = r;
}

/* r was answered: it no longer holds back the next batch of its kind (one
 * left behind by server_switch is neither). */
static void batch_forget(agent *a, const req *r)
{
    if (a->batch_req == r)
        a->batch_req = NULL;
    if (a->urgent_req == r)
        a->urgent_req = NULL;
}

/* An urgent batch goes now: a batch is in flight (without this, any other
 * job's first output or end would wait for its round trip: under load tens
 * of ms for every new stream's first token, issue 24), no urgent batch is,
 * and some queued job is urgent (bq_add puts those first). */
static bool batch_urgent_due(const agent *a)
{
    return a->batch_req && !a->urgent_req && a->bq_head && a->bq_head->seen_urgent;
}

/* The usual 200 reply to a batch, as the server renders it:
 * {"jobs":[{"job_id":"<id>","status":200,"cancel":false|true},...]}, one
 * entry per job in the body's order. Read by comparing bytes, without a
 * jansson tree (the reply lists every job of the batch, up to every stream
 * the agent holds, on every upload: a tree and a json_pack per entry were
 * about a fifth of the agent at 100 paced streams). false: any other reply
 * (an error entry, another shape, an id that needs escaping); nothing was
 * done and batch_done reads it with jansson. */
static bool batch_done_fast(agent *a, req *r)
{
    static const char pre[] = "{\"job_id\":\"", mid[] = "\",\"status\":200,\"cancel\":";
    const char *p = r->resp.data, *end = p + r->resp.len;
    if (!p || r->n_batch == 0 || r->resp.len < 10 || memcmp(p, "{\"jobs\":[", 9) != 0)
        return false;
    p += 9;
    /* Pass 1: check every entry; pass 2 acts, so a mismatch changes nothing. */
    for (int pass = 0; pass < 2; pass++) {
        const char *q = p;
        if (pass == 1)
            batch_forget(a, r); /* as batch_done does first */
        for (size_t i = 0; i < r->n_batch; i++) {
            agent_job *j = r->batch[i];
            size_t idn = strlen(j->id);
            if (i > 0 && (q >= end || *q++ != ','))
                return false;
            if ((size_t)(end - q) < sizeof pre - 1 + idn + sizeof mid - 1 + 6 ||
                memcmp(q, pre, sizeof pre - 1) != 0 || memcmp(q + sizeof pre - 1, j->id, idn) != 0)
                return false;
            for (size_t k = 0; k < idn; k++)
                if ((unsigned char)j->id[k] < 0x20 || j->id[k] == '"' || j->id[k] == '\\')
                    return false; /* would have been escaped */
            q += sizeof pre - 1 + idn;
            if (memcmp(q, mid, sizeof mid - 1) != 0)
                return false;
            q += sizeof mid - 1;
            bool cancel = (size_t)(end - q) >= 5 && memcmp(q, "true}", 5) == 0;
            if (!cancel && ((size_t)(end - q) < 6 || memcmp(q, "false}", 6) != 0))
                return false;
            q += cancel ? 5 : 6;
            if (pass == 1) {
                json_t *one = cancel ? json_pack("{s:b}", "cancel", 1) : NULL;
                upload_done(a, j, CURLE_OK, 200, one);
                json_decref(one);
            }
        }
        if (pass == 0 && (end - q != 2 || memcmp(q, "]}", 2) != 0))
            return false;
    }
    return true;
}

static void batch_done(agent *a, req *r, CURLcode rc, long status, json_t *body)
{
    batch_forget(a, r);
    json_t *list = json_object_get(body, "jobs");
    if (rc == CURLE_OK && status == 404 && !json_is_array(list)) {
        /* No such route after all (a server swapped for an older one):
         * back to one upload per job; nothing of this batch was applied. */
        gp_log_warn("events_batch_unsupported", "server has no POST /agents/events; uploading "
                    "per job");
        a->events_batch = false;
        for (size_t i = 0; i < r->n_batch; i++) {
            agent_job *j = r->batch[i];
            j->upload = NULL;
            pthread_mutex_lock(&a->mu);
            agent_evq_nack(&j->q);
            job_link_locked(a, j);
            pthread_mutex_unlock(&a->mu);
        }
        return;
    }
    if (rc != CURLE_OK || status != 200 || !json_is_array(list)) {
        /* The whole request failed: each job as if its own upload had. */
        for (size_t i = 0; i < r->n_batch; i++)
            upload_done(a, r->batch[i], rc, status, body);
        return;
    }
    for (size_t i = 0; i < r->n_batch; i++) {
        agent_job *j = r->batch[i];
        json_t *e = json_array_get(list, i);
        const char *jid = json_string_value(json_object_get(e, "job_id"));
        if (!jid || strcmp(jid, j->id) != 0) {
            /* A reply that does not line up: retry this job's events
             * (seq makes a resend harmless). */
            upload_done(a, j, CURLE_RECV_ERROR, 0, NULL);
            continue;
        }
        long est = (long)json_integer_value(json_object_get(e, "status"));
        json_t *one = est == 200
                          ? json_pack("{s:O}", "cancel",
                                      json_object_get(e, "cancel") ? json_object_get(e, "cancel")
                                                                   : json_false())
                          : json_pack("{s:O}", "error",
                                      json_object_get(e, "error") ? json_object_get(e, "error")
                                                                  : json_object());
        upload_done(a, j, CURLE_OK, est, one);
        json_decref(one);
    }
}

/* ======================================================================== */
/* Completions and the loop                                                 */
/* ======================================================================== */

static void handle_done(agent *a, CURLMsg *m)
{
    req *r = NULL;
    curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&r);
    curl_multi_remove_handle(a->multi, m->easy_handle);
    if (!r)
        return;
    long status = 0;
    CURLcode rc = m->data.result;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
    if (r->too_big)
        rc = CURLE_WRITE_ERROR;
    if (rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CONNECT_ERROR ||
        rc == CURLE_SSL_CACERT_BADFILE || rc == CURLE_SSL_CERTPROBLEM) {
        /* A TLS failure is a configuration problem (wrong CA, wrong host
         * name, plain HTTP port): say so plainly once per outage. */
        if (!a->server_down_logged)
            gp_log_error("tls_error", "TLS with %s failed: %s: %s%s", a->servers[r->srv],
                         curl_easy_strerror(rc), r->errbuf[0] ? r->errbuf : "no detail",
                         rc == CURLE_PEER_FAILED_VERIFICATION
                             ? " (check --ca-file and the host name in --server)"
                             : "");
    }
    json_t *body = NULL;
    bool fast = r->kind == REQ_EVENTS_BATCH && rc == CURLE_OK && status == 200 &&
                batch_done_fast(a, r);
    if (rc == CURLE_OK && r->resp.len > 0 && !fast)
        body = gp_json_loadb(r->resp.data, r->resp.len);
    if (rc == CURLE_OK && status == 200 && !fast && !json_is_object(body) &&
        (r->kind != REQ_WORK || r->resp.len > 0)) {
        /* A 200 must carry a JSON object; anything else is a broken server
         * or proxy: treat like a server error. */
        gp_log_warn("bad_reply", "server reply to a %s request is not a JSON object",
                    r->kind == REQ_ENROLL ? "enroll"
                    : r->kind == REQ_POLL ? "poll"
                    : r->kind == REQ_WORK ? "work"
                                          : "events");
        status = 502;
    }
    switch (r->kind) {
    case REQ_ENROLL:
        a->enroll_req = NULL;
        enroll_done(a, rc, status, body);
        break;
    case REQ_POLL:
        a->poll_req = NULL;
        poll_done(a, rc, status, body);
        break;
    case REQ_WORK:
        if (r == a->work_stale) {
            a->work_stale = NULL;
            work_stale_done(a, rc, status, body);
            break;
        }
        a->work_req = NULL;
        work_done(a, rc, status, body);
        break;
    case REQ_EVENTS:
        upload_done(a, r->job, rc, status, body);
        break;
    case REQ_EVENTS_BATCH:
        if (!fast)
            batch_done(a, r, rc, status, body);
        break;
    case REQ_DEREGISTER:
        a->dereg_req = NULL;
        a->dereg_done = true;
        if (rc == CURLE_OK && status == 200)
            gp_log_info("deregistered", "the server marked this agent offline");
        else
            gp_log_warn("deregister_failed", "deregistration failed (%s, HTTP %ld): the "
                        "server will see this agent go silent",
                        rc == CURLE_OK ? "ok" : curl_easy_strerror(rc), status);
        break;
    }
    json_decref(body);
    req_done_free(a, r);
}

/* A clean stop tells the server (POST /agents/deregister), so that it
 * shows the agent offline rather than dead and pages nobody. Started once
 * no poll is in flight (a poll after it would register us again); true
 * while the loop should keep going for it. */
static bool deregister_step(agent *a)
{
    if (!a->registered || a->dereg_done || a->fatal)
        return false;
    if (a->dereg_req)
        return true;
    if (a->poll_req) {
        a->leaving = true; /* let it finish, start no other */
        return true;
    }
    a->leaving = true;
    json_t *body = json_pack("{s:s,s:s}", "agent_id", a->id, "instance", a->instance);
    a->dereg_req = body ? req_start(a, REQ_DEREGISTER, "/agents/deregister", body, 3000, NULL)
                        : NULL;
    if (!a->dereg_req)
        a->dereg_done = true;
    return a->dereg_req != NULL;
}

/* ------------------------------------------------------------------------
 * What the loop knows of its jobs (issue 24). Backend threads link a job
 * on a->dirty when its queue gains something the loop acts on
 * (job_note_locked); the loop's own changes (an upload answered, a cancel)
 * link it too. Once a turn the loop takes the list, with each job's state,
 * under one lock (jobs_review) and updates what it keeps: the ready jobs
 * waiting for a batch (a->bq), those waiting to retry (a->retries), the
 * urgent and running counts, and frees finished jobs. Nothing walks every
 * job on a wake-up any more.
 * ---------------------------------------------------------------------- */

static void bq_remove(agent *a, agent_job *j)
{
    if (!j->in_bq)
        return;
    *(j->bq_prev ? &j->bq_prev->bq_next : &a->bq_head) = j->bq_next;
    *(j->bq_next ? &j->bq_next->bq_prev : &a->bq_tail) = j->bq_prev;
    j->bq_prev = j->bq_next = NULL;
    j->in_bq = false;
    a->n_bq--;
}

/* Queue j for the next batch: at the end, or, urgent (its first output or
 * its end), at the front, so that a batch cut at BATCH_MAX_JOBS carries
 * it; where it is already when neither moves it. */
static void bq_add(agent *a, agent_job *j, bool urgent)
{
    if (j->in_bq && (!urgent || a->bq_head == j))
        return;
    bq_remove(a, j);
    if (urgent) {
        j->bq_prev = NULL;
        j->bq_next = a->bq_head;
        *(a->bq_head ? &a->bq_head->bq_prev : &a->bq_tail) = j;
        a->bq_head = j;
    } else {
        j->bq_next = NULL;
        j->bq_prev = a->bq_tail;
        *(a->bq_tail ? &a->bq_tail->bq_next : &a->bq_head) = j;
        a->bq_tail = j;
    }
    j->in_bq = true;
    a->n_bq++;
}

/* What the loop sees of j now: flags are agent_evq_flags of its queue,
 * read under a->mu (0 when an upload was just taken from it). */
static void job_seen(agent *a, agent_job *j, unsigned flags)
{
    bool ready = !j->cancelled && !j->upload && (flags & AGENT_EVQ_READY);
    bool urgent = ready && (flags & AGENT_EVQ_URGENT);
    if (urgent != j->seen_urgent)
        a->n_urgent += urgent ? 1 : -1;
    j->seen_urgent = urgent;
    j->seen_ready = ready;
    if (!ready) {
        bq_remove(a, j);
        agent_timers_del(&a->retries, &j->retry_timer);
    }
}

static void job_retry_at(agent *a, agent_job *j, uint64_t at)
{
    pthread_mutex_lock(&a->mu);
    unsigned flags = agent_evq_flags(&j->q);
    pthread_mutex_unlock(&a->mu);
    j->next_upload_ms = at;
    job_seen(a, j, flags);
    if (j->seen_ready) {
        bq_remove(a, j);
        agent_timers_set(&a->retries, &j->retry_timer, at); /* room: job_begin */
    }
}

/* A ready job's upload: into the next batch (to the server polled now,
 * when it takes them), on its own at once, or later (next_upload_ms).
 * *urgent is set when an urgent job went on its own, as the walk over
 * every job counted it (a batch due now goes at once with it). */
static void job_place(agent *a, agent_job *j, uint64_t now, bool *urgent)
{
    if (!j->seen_ready)
        return;
    if (now < j->next_upload_ms) {
        bq_remove(a, j);
        agent_timers_set(&a->retries, &j->retry_timer, j->next_upload_ms);
        return;
    }
    agent_timers_del(&a->retries, &j->retry_timer);
    if (a->events_batch && j->srv == a->cur) {
        bq_add(a, j, j->seen_urgent);
        return;
    }
    bq_remove(a, j);
    *urgent = *urgent || j->seen_urgent;
    upload_start(a, j, now);
}

/* Free a job finished on both sides (safe point: not inside any callback
 * of its, no upload in flight, off a->dirty: the backend is done with it). */
static void job_reap(agent *a, agent_job *j)
{
    job_seen(a, j, 0);
    agent_timers_del(&a->deadlines, &j->dl_timer);
    *(j->prev ? &j->prev->next : &a->jobs) = j->next;
    if (j->next)
        j->next->prev = j->prev;
    agent_idtab_del(&a->jtab, &j->hnode);
    a->live_dirty = true;
    a->n_jobs--;
    if (gp_log_enabled(GP_LOG_DEBUG))
        gp_log_write(GP_LOG_DEBUG, "job_done", j->correlation_id,
                     json_pack("{s:s}", "job_id", j->id), "job %s finished", j->id);
    job_free(j);
}

/* Take a->dirty with what each of its jobs holds now (one lock a turn),
 * then act on it. */
static void jobs_review(agent *a, uint64_t now, bool *urgent)
{
    size_t k = 0;
    pthread_mutex_lock(&a->mu);
    for (agent_job *j = a->dirty; j; j = j->dirty_next) {
        j->dirty = false;
        j->snap_flags = agent_evq_flags(&j->q);
        j->snap_done = j->backend_done;
        j->snap_evq_done = agent_evq_done(&j->q);
        a->review[k++] = j; /* room: job_begin */
    }
    a->dirty = NULL;
    pthread_mutex_unlock(&a->mu);
    for (size_t i = 0; i < k; i++) {
        agent_job *j = a->review[i];
        if (j->snap_done && !j->seen_done) {
            j->seen_done = true;
            a->n_running--;
        }
        if (j->snap_done && !j->upload && (j->cancelled || j->snap_evq_done)) {
            job_reap(a, j);
            continue;
        }
        job_seen(a, j, j->snap_flags);
        job_place(a, j, now, urgent);
    }
}

/* The server polled now or its taking batches changed: the jobs queued
 * for a batch go where they belong now. */
static void bq_requeue(agent *a, uint64_t now, bool *urgent)
{
    agent_job *j = a->bq_head;
    a->bq_head = a->bq_tail = NULL;
    a->n_bq = 0;
    a->bq_cur = a->cur;
    a->bq_batch = a->events_batch;
    while (j) {
        agent_job *next = j->bq_next;
        j->in_bq = false;
        j->bq_prev = j->bq_next = NULL;
        job_place(a, j, now, urgent);
        j = next;
    }
}

/* Jobs past their deadline are stopped; *wake: the next deadline. */
static void deadlines_due(agent *a, uint64_t now, uint64_t *wake)
{
    agent_timer *t;
    while ((t = agent_timers_first(&a->deadlines)) && t->at <= now) {
        agent_job *j = (agent_job *)((char *)t - offsetof(agent_job, dl_timer));
        agent_timers_del(&a->deadlines, t);
        pthread_mutex_lock(&a->mu);
        bool overdue = !j->backend_done && !j->stop_deadline;
        if (overdue)
            j->stop_deadline = true;
        pthread_mutex_unlock(&a->mu);
        if (overdue) {
            gp_log_warn("job_deadline", "job %s ran past its deadline; stopping it", j->id);
            job_cancel(a, j);
        }
    }
    if (t)
        *wake = t->at < *wake ? t->at : *wake;
}

/* Jobs whose upload waited for next_upload_ms go now; *wake: the next. */
static void retries_due(agent *a, uint64_t now, uint64_t *wake, bool *urgent)
{
    agent_timer *t;
    while ((t = agent_timers_first(&a->retries)) && t->at <= now) {
        agent_job *j = (agent_job *)((char *)t - offsetof(agent_job, retry_timer));
        agent_timers_del(&a->retries, t);
        job_place(a, j, now, urgent);
    }
    if (t)
        *wake = t->at < *wake ? t->at : *wake;
}

static void stop_all_jobs(agent *a)
{
    for (agent_job *j = a->jobs; j; j = j->next) {
        pthread_mutex_lock(&a->mu);
        bool running = !j->backend_done;
        if (running)
            j->stop_shutdown = true;
        pthread_mutex_unlock(&a->mu);
        if (running)
            job_cancel(a, j);
    }
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

static void agent_announce(agent *a)
{
    int total, usable;
    slot_counts(a, &total, &usable);
    gp_log_write(GP_LOG_INFO, "agent_start", NULL,
                 json_pack("{s:s,s:i}", "server", a->base, "servers", a->n_servers),
                 "agent %s (%s) serving through backend %s, %d slot(s), server %s%s", a->id,
                 a->name, a->be->ops->name, total, a->base,
                 a->n_servers > 1 ? " (the first of its list; it moves on failure)" : "");
    if (a->o->insecure)
        gp_log_warn("tls_insecure",
                    "INSECURE: the server's TLS certificate is NOT verified (--insecure); anyone "
                    "on the network path can impersonate %s and receive the agent key and all "
                    "prompts. Use --ca-file instead.", a->base);
    if (a->token_ignored)
        gp_log_info("token_ignored", "using the agent key in %s/" AGENT_KEY_FILE
                    "; --token is ignored", a->o->state_dir);
}

/* One look at everything (the loop's turn): stop requests, jobs that
 * changed, deadlines, uploads, the poll and the long-poll. True when the
 * agent is to leave; else *wake_at is when the next turn is due at the
 * latest (monotonic ms). */
static void stop_requests(agent *a, uint64_t now);
static void uploads_due(agent *a, uint64_t now, uint64_t *wake);
static void server_requests_due(agent *a, uint64_t now, uint64_t *wake);

static bool loop_body(agent *a, uint64_t *wake_at)
{
    uint64_t now = gp_now_mono_ms();
    atomic_store(&a->wake_sent, false); /* before the scan: see loop_wake_now */

    /* Enrollment refused or key revoked: nothing to wait for. */
    if (a->fatal) {
        stop_all_jobs(a);
        return true;
    }
    stop_requests(a, now);
    uint64_t wake = now + 1000;
    uploads_due(a, now, &wake);

    /* Leave when drained (or out of time after stopping the jobs). */
    if (a->stopping && !a->jobs && (a->drain_announced || !a->registered) &&
        !deregister_step(a))
        return true;
    if (a->jobs_stopped && now >= a->final_deadline_ms) {
        gp_log_warn("shutdown_incomplete", "leaving with undelivered job events");
        return true;
    }
    server_requests_due(a, now, &wake);
    *wake_at = wake;
    return false;
}

/* Stop requests from the signal thread: drain, then stop the jobs at the
 * drain deadline (or at once on a second request). */
static void stop_requests(agent *a, uint64_t now)
{
    int sr = atomic_load(&a->stop_req);
    if (sr >= 1 && !a->stopping) {
        gp_log_info("draining", "stop requested: draining (up to %lld s for running jobs)",
                    a->o->drain_timeout_sec);
        a->stopping = true;
        a->draining = true;
        a->drain_announced = false;
        a->drain_deadline_ms = now + (uint64_t)a->o->drain_timeout_sec * 1000;
        if (!a->poll_req)
            a->next_poll_ms = now;
    }
    if (a->stopping && !a->jobs_stopped && (sr >= 2 || now >= a->drain_deadline_ms)) {
        if (a->jobs)
            gp_log_warn("drain_timeout", "stopping the jobs still running");
        a->jobs_stopped = true;
        a->exit_code = sr >= 2 ? 1 : 0;
        a->final_deadline_ms = now + SHUTDOWN_FLUSH_MS;
        stop_all_jobs(a);
    }
}

/* Per-job upkeep: what changed (jobs_review), deadlines and retries due,
 * and uploads (batched when the server takes it and none is in flight).
 * *wake: lowered to when this is next due. */
static void uploads_due(agent *a, uint64_t now, uint64_t *wake)
{
    bool urgent = false;
    jobs_review(a, now, &urgent);
    if (a->bq_cur != a->cur || a->bq_batch != a->events_batch)
        bq_requeue(a, now, &urgent);
    deadlines_due(a, now, wake);
    retries_due(a, now, wake, &urgent);
    if (a->n_bq && !a->batch_req) {
        /* With two or more jobs running, wait up to events-batch-ms
         * after the first pending event so that the others' tokens
         * share the request; a lone job's go at once (its latency is
         * what a single stream sees), and so does a batch with a job's
         * first output or end in it. Without the wait the server's
         * answer is so quick at paced streams that an upload carried a
         * token or two: its per-request cost, not the tokens, was what
         * the server spent (issue 24). */
        if (!a->batch_since_ms)
            a->batch_since_ms = now;
        uint64_t due = a->batch_since_ms + (uint64_t)a->o->events_batch_ms;
        if (a->n_running < 2 || now >= due || urgent || a->n_urgent > 0) {
            batch_start(a, now, false);
            a->batch_since_ms = 0;
        } else {
            *wake = min_u64(*wake, due);
        }
    } else if (batch_urgent_due(a)) {
        batch_start(a, now, true);
    }
}

/* Enrollment or the heartbeat poll, and the long-poll, when due. *wake:
 * lowered to when one is next due. */
static void server_requests_due(agent *a, uint64_t now, uint64_t *wake)
{
    /* Enroll first (once), then heartbeat. */
    if (a->enrolling) {
        if (!a->enroll_req && now >= a->next_enroll_ms)
            enroll_start(a);
        if (!a->enroll_req)
            *wake = min_u64(*wake, a->next_enroll_ms);
    } else {
        if (!a->poll_req && now >= a->next_poll_ms && !a->leaving)
            poll_start(a);
        if (!a->poll_req && !a->leaving)
            *wake = min_u64(*wake, a->next_poll_ms);
    }

    /* Keep a long-poll parked at all times: with free slots it asks
     * for work; busy or draining (free_slots 0) it is the liveness
     * channel whose close tells the server this process is gone. */
    int total, usable;
    slot_counts(a, &total, &usable);
    int free_slots = usable - busy_slots(a);
    if (free_slots < 0 || a->draining || a->server_drain)
        free_slots = 0;
    if (a->no_liveness && a->draining && a->drain_announced && a->work_req) {
        req_abort(a, a->work_req); /* the server knows we are draining */
        a->work_req = NULL;
    }
    if (a->work_req && free_slots > a->work_free && !a->work_stale &&
        (a->work_free == 0 || a->prefix_reported)) {
        /* A slot freed under a liveness long-poll: park a new one that
         * asks for work; the server answers the old one 204. Not
         * aborted: its close would look like our death. With a prefix
         * cache, any freed slot re-parks: the new long-poll says what
         * the slot now holds (its reply's jobs, if the server sent the
         * old one any, are still taken: work_stale_done). */
        a->work_stale = a->work_req;
        a->work_req = NULL;
        a->next_work_ms = now;
    }
    bool want = free_slots > 0 || !a->no_liveness;
    if (!a->work_req && a->registered && want && !a->leaving) {
        if (now >= a->next_work_ms)
            work_start(a, free_slots);
        else
            *wake = min_u64(*wake, a->next_work_ms);
    }
}

/* Drive libcurl for the server requests (socket fd ready for action, or
 * CURL_SOCKET_TIMEOUT: timeouts due and requests just added) and act on
 * those that finished (outside libcurl's callbacks). True when one did. */
static bool reqs_settle(agent *a, curl_socket_t fd, int action)
{
    int running = 0;
    a->kick = false; /* a socket action also runs the timeouts due */
    curl_multi_socket_action(a->multi, fd, action, &running);
    CURLMsg *m;
    int left;
    bool any = false;
    while ((m = curl_multi_info_read(a->multi, &left))) {
        if (m->msg == CURLMSG_DONE) {
            handle_done(a, m);
            any = true;
        }
    }
    return any;
}

/* The loop's turn: loop_body until nothing it started finished at once,
 * then sleep until its wake time or an event. A request it added is
 * driven at once (not at libcurl's timer, a pass of the loop later, behind
 * a pass of relaying). */
static void loop_turn(agent *a)
{
    if (a->ended || a->in_turn)
        return;
    a->in_turn = true;
    uint64_t wake;
    for (;;) {
        if (loop_body(a, &wake)) {
            a->ended = true;
            a->in_turn = false;
            event_base_loopbreak(a->evb);
            return;
        }
        if (!a->kick || !reqs_settle(a, CURL_SOCKET_TIMEOUT, 0))
            break; /* else act on what just finished before sleeping */
    }
    a->in_turn = false;
    /* A batch in flight, or one due at `wake`: the loop will look at the
     * jobs of the server it goes to before it sends anything more there,
     * so their non-urgent changes need not wake it (lazy_srv). A job
     * linked since jobs_review, without a wake, is looked at in the next
     * pass. */
    bool lazy = a->events_batch && (a->batch_req || a->n_bq);
    pthread_mutex_lock(&a->mu);
    a->lazy_srv = lazy ? a->cur : -1;
    a->lazy_urgent_srv = a->events_batch && a->batch_req && a->batch_req->srv == a->cur &&
                                 a->urgent_req && a->urgent_req->srv == a->cur
                             ? a->cur
                             : -1;
    bool again = a->dirty != NULL;
    pthread_mutex_unlock(&a->mu);
    if (again) {
        event_active(a->turn_ev, EV_TIMEOUT, 0);
        return;
    }
    uint64_t now = gp_now_mono_ms();
    uint64_t ms = wake > now ? min_u64(wake - now, 1000) : 0;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    event_add(a->turn_ev, &tv);
}

static void on_turn(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    loop_turn(arg);
}

/* Another thread wrote the eventfd. */
static void on_wake_fd(evutil_socket_t fd, short what, void *arg)
{
    agent *a = arg;
    uint64_t n;
    (void)what;
    while (read(fd, &n, sizeof n) < 0 && errno == EINTR)
        ;
    loop_turn(a);
}

/* A server connection's socket is ready (CURLMOPT_SOCKETFUNCTION). */
static void on_req_sock(evutil_socket_t fd, short what, void *arg)
{
    agent *a = arg;
    int action = ((what & EV_READ) ? CURL_CSELECT_IN : 0) |
                 ((what & EV_WRITE) ? CURL_CSELECT_OUT : 0);
    if (reqs_settle(a, fd, action))
        loop_turn(a);
}

static void on_req_timer(evutil_socket_t fd, short what, void *arg)
{
    agent *a = arg;
    (void)fd;
    (void)what;
    if (reqs_settle(a, CURL_SOCKET_TIMEOUT, 0))
        loop_turn(a);
}

/* CURLMOPT_SOCKETFUNCTION for the server requests: watch s as libcurl asks
 * (socketp: its event), with new work (AGENT_PRI_NEW). */
static int on_req_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    agent *a = userp;
    struct event *ev = socketp;
    (void)easy;
    if (what == CURL_POLL_REMOVE) {
        if (ev)
            event_free(ev);
        return 0;
    }
    return curl_loop_watch(a->evb, a->multi, s, what, ev, AGENT_PRI_NEW, on_req_sock, a) ? 0
                                                                                         : -1;
}

/* CURLMOPT_TIMERFUNCTION for the server requests. */
static int on_req_timeout(CURLM *multi, long timeout_ms, void *userp)
{
    agent *a = userp;
    (void)multi;
    return curl_loop_timer(a->curl_tev, timeout_ms);
}

int agent_run(agent *a)
{
    a->next_poll_ms = gp_now_mono_ms();
    a->next_work_ms = UINT64_MAX;
    a->next_enroll_ms = gp_now_mono_ms();
    agent_announce(a);
    a->loop_th = pthread_self();
    atomic_store(&a->looping, true);
    a->ended = false;
    event_active(a->turn_ev, EV_TIMEOUT, 0);
    event_base_dispatch(a->evb);
    atomic_store(&a->looping, false);
    gp_log_info("agent_exit", "agent stopped (exit code %d)", a->exit_code);
    return a->exit_code;
}

/* ======================================================================== */
/* Lifecycle                                                                */
/* ======================================================================== */

/* The loop: its base (AGENT_PRI_*, backend.h), its events, libcurl's
 * callbacks for the server requests, and the backend bound to it when it
 * runs on it. 0, or -1 with err set (agent_destroy frees what was made). */
static int loop_init(agent *a, char *err, size_t errlen)
{
    a->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (a->wake_fd < 0) {
        snprintf(err, errlen, "eventfd: %s", strerror(errno));
        return -1;
    }
    a->evb = event_base_new();
    if (a->evb && event_base_priority_init(a->evb, 2) != 0) {
        event_base_free(a->evb);
        a->evb = NULL;
    }
    if (a->evb) {
        a->turn_ev = evtimer_new(a->evb, on_turn, a);
        a->wake_ev = event_new(a->evb, a->wake_fd, EV_READ | EV_PERSIST, on_wake_fd, a);
        a->curl_tev = evtimer_new(a->evb, on_req_timer, a);
    }
    if (!a->evb || !a->turn_ev || !a->wake_ev || !a->curl_tev ||
        event_priority_set(a->turn_ev, AGENT_PRI_NEW) != 0 ||
        event_priority_set(a->wake_ev, AGENT_PRI_NEW) != 0 ||
        event_priority_set(a->curl_tev, AGENT_PRI_NEW) != 0 || event_add(a->wake_ev, NULL) != 0) {
        snprintf(err, errlen, "cannot set up the agent's event loop");
        return -1;
    }
    curl_multi_setopt(a->multi, CURLMOPT_SOCKETFUNCTION, on_req_socket);
    curl_multi_setopt(a->multi, CURLMOPT_SOCKETDATA, a);
    curl_multi_setopt(a->multi, CURLMOPT_TIMERFUNCTION, on_req_timeout);
    curl_multi_setopt(a->multi, CURLMOPT_TIMERDATA, a);
    if (a->be && a->be->ops->bind_loop && a->be->ops->bind_loop(a->be, a->evb, err, errlen) != 0)
        return -1;
    return 0;
}

agent *agent_create(const agent_options *o, agent_backend *backend, char *err, size_t errlen)
{
    char *key = NULL; /* from DIR/agent.key */
    agent *a = calloc(1, sizeof *a);
    if (!a) {
        snprintf(err, errlen, "out of memory");
        if (backend)
            backend->ops->destroy(backend);
        return NULL;
    }
    a->o = o;
    a->be = backend;
    a->wake_fd = -1;
    atomic_init(&a->looping, false);
    pthread_mutex_init(&a->mu, NULL);
    atomic_init(&a->stop_req, 0);
    atomic_init(&a->wake_sent, false);
    a->lazy_srv = -1;
    a->lazy_urgent_srv = -1;
    agent_timers_init(&a->deadlines);
    agent_timers_init(&a->retries);
    agent_idtab_init(&a->jtab);
    gp_buf_init(&a->live_ids);
    a->live_dirty = true;
    a->poll_interval_ms = 15000;
    a->work_wait_ms = 25000;
    agent_backoff_init(&a->backoff, 500, 30000);

    if (agent_state_load_id(o->state_dir, a->id, err, errlen) < 0)
        goto fail;
    gp_random_hex(a->instance, 16);
    a->labels = agent_labels_parse(o->labels, err, errlen);
    if (!a->labels)
        goto fail;
    a->n_servers = agent_servers_parse(o->server, &a->servers, err, errlen);
    if (a->n_servers < 0) {
        a->n_servers = 0;
        goto fail;
    }
    a->base = a->servers[0];
    a->uh = calloc((size_t)a->n_servers * 2, sizeof *a->uh); /* NULL: URLs as text */
    a->proxy_env = proxy_env_set();
    if (o->name && *o->name) {
        a->name = strdup(o->name);
    } else {
        char host[256] = "agent";
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = '\0';
        a->name = strdup(host);
    }
    /* Our own key from an earlier enrollment wins over --token; without
     * one, --token is an enrollment token to trade first (or, refused as
     * not being one, the agent key itself). */
    int kr = agent_state_load_key(o->state_dir, &key, err, errlen);
    if (kr < 0)
        goto fail;
    bool have_token = o->token && *o->token;
    a->key_from_file = kr == 1;
    a->token_ignored = kr == 1 && have_token;
    a->enrolling = kr == 0 && have_token;
    int hk = set_key(a, kr == 1 ? key : o->token);
    a->static_facts = agent_facts_static();
    a->multi = curl_multi_init();
    if (!a->name || !a->multi || !a->static_facts || hk < 0) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    /* Several requests (long-poll, heartbeat, uploads) share a few reused
     * connections to the server(s). */
    int total, usable;
    slot_counts(a, &total, &usable);
    curl_multi_setopt(a->multi, CURLMOPT_MAXCONNECTS, (long)(total + 4));
    if (loop_init(a, err, errlen) != 0)
        goto fail;
    free(key);
    return a;
fail:
    free(key);
    agent_destroy(a);
    return NULL;
}

void agent_stop(agent *a, bool hard)
{
    int want = hard ? 2 : 1;
    int cur = atomic_load(&a->stop_req);
    while (cur < want && !atomic_compare_exchange_weak(&a->stop_req, &cur, want)) {
    }
    if (a->wake_fd >= 0)
        loop_wake_fd(a);
}

const char *agent_id(const agent *a)
{
    return a->id;
}

void agent_destroy(agent *a)
{
    if (!a)
        return;
    /* Backend first: it joins its threads, so no sink call can follow. */
    if (a->be)
        a->be->ops->destroy(a->be);
    a->be = NULL;
    if (a->multi) {
        req_abort(a, a->enroll_req);
        req_abort(a, a->poll_req);
        req_abort(a, a->work_req);
        req_abort(a, a->work_stale);
        req_abort(a, a->dereg_req);
        /* A batched upload is shared by its jobs (there may be two: one
         * left with an old server by server_switch): abort each once. */
        for (agent_job *j = a->jobs; j; j = j->next) {
            req *u = j->upload;
            for (agent_job *k = j; u && k; k = k->next)
                if (k->upload == u)
                    k->upload = NULL;
            req_abort(a, u);
        }
        a->batch_req = a->urgent_req = NULL;
    }
    agent_timers_free(&a->deadlines); /* before the jobs: it touches their nodes */
    agent_timers_free(&a->retries);
    while (a->jobs) {
        agent_job *j = a->jobs;
        a->jobs = j->next;
        job_free(j);
    }
    while (a->n_easy_idle > 0)
        curl_easy_cleanup(a->easy_idle[--a->n_easy_idle]);
    if (a->multi)
        curl_multi_cleanup(a->multi); /* its socket events freed (on_req_socket) */
    /* The loop last: the backend's events and the requests' were on it. */
    if (a->turn_ev)
        event_free(a->turn_ev);
    if (a->wake_ev)
        event_free(a->wake_ev);
    if (a->curl_tev)
        event_free(a->curl_tev);
    if (a->evb)
        event_base_free(a->evb);
    if (a->wake_fd >= 0)
        close(a->wake_fd);
    free(a->review);
    agent_idtab_free(&a->jtab);
    gp_buf_free(&a->live_ids);
    json_decref(a->labels);
    json_decref(a->static_facts);
    for (int i = 0; a->uh && i < a->n_servers * 2; i++)
        curl_url_cleanup(a->uh[i]);
    free(a->uh);
    curl_slist_free_all(a->hdrs);
    for (size_t i = 0; i < a->n_hdrs_old; i++)
        curl_slist_free_all(a->hdrs_old[i]);
    free(a->hdrs_old);
    agent_servers_free(a->servers, a->n_servers);
    free(a->name);
    free(a->auth_header);
    pthread_mutex_destroy(&a->mu);
    free(a);
}
