/*
 * agent_internal: the agent's private types (struct agent, its jobs, its
 * requests to the server) and the functions its files share. Include it
 * only from agent.c, agent_jobs.c, agent_server.c, agent_upload.c and
 * agent_loop.c; every other module goes through agent.h and backend.h. A
 * function one of these files defines for the others carries the ag_
 * prefix and is declared at the end of this header; everything else stays
 * static in its file.
 *
 *   agent_jobs.c    small helpers, the event sink, /agents/work (job_begin)
 *   agent_server.c  requests to the server, /agents/poll, /agents/enroll
 *   agent_upload.c  /agents/jobs/{id}/events, one per job or batched
 *   agent_loop.c    completions and the loop (agent_run)
 *   agent.c         lifecycle (agent_create, agent_stop, agent_destroy)
 *
 * The agent is the protocol loop. See agent.h for the threading model and
 * docs/protocol.md for the wire contract.
 *
 * Everything in these files runs on the loop thread except the sink_*
 * callbacks (agent_jobs.c), which a backend calls from the loop (bind_loop)
 * or from threads of its own; they touch only the job's event queue and
 * flags under a->mu and wake the loop (on the loop's thread the release of
 * a sink bracket may run the loop's turn itself: backend.h).
 */
#ifndef AGENT_AGENT_INTERNAL_H
#define AGENT_AGENT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>
#include <event2/event.h>
#include <jansson.h>

#include "agent/agent.h"
#include "agent/agent_util.h"
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
    agent_idtab jtab;       /* a->jobs by id (ag_job_find) */
    size_t n_jobs;
    int n_running;          /* jobs the backend still runs, as the loop saw them */
    /* --- under mu --- */
    agent_job *dirty;       /* jobs with something new for the loop (ag_job_link_locked) */
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
                               batch_req is in flight, or NULL (ag_batch_urgent_due) */
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
    struct event *turn_ev;  /* runs ag_loop_turn: activated, or at its wake time */
    struct event *wake_ev;  /* wake_fd readable: another thread woke the loop */
    struct event *curl_tev; /* libcurl's timer for the server requests */
    int wake_fd;
    pthread_t loop_th;      /* the thread in agent_run (valid while looping) */
    atomic_bool looping;
    bool kick;              /* a server request was added: drive libcurl now */
    bool in_turn;           /* ag_loop_turn runs (a wake inside it activates turn_ev) */
    bool ended;             /* ag_loop_turn said leave */
    CURL *easy_idle[EASY_IDLE_MAX]; /* finished requests' handles, for the next ones */
    int n_easy_idle;
    struct curl_slist *hdrs; /* every request's headers (ag_set_key) */
    struct curl_slist **hdrs_old; /* lists ag_set_key replaced (a handle may point at one) */
    size_t n_hdrs_old;
    CURLU **uh;             /* per server: /agents/work, /agents/events parsed once */
    bool proxy_env;         /* a proxy variable was set at start (ag_proxy_env_set) */
};

/* ======================================================================== */
/* Shared between the agent's files (ag_: see the top of this header)       */
/* ======================================================================== */

/* agent.c: a's fields to their starting values (a zeroed; o and backend
 * borrowed as agent_create's), before anything that can fail: what
 * agent_create and a test's bare agent start from. */
void ag_init(agent *a, const agent_options *o, agent_backend *backend);

/* agent_jobs.c: small helpers */
uint32_t ag_rnd32(void);
agent_job *ag_job_find(agent *a, const char *id);
void ag_slot_counts(agent *a, int *total, int *usable);
int ag_busy_slots(agent *a);
void ag_job_cancel(agent *a, agent_job *j);

/* agent_jobs.c: the event sink, /agents/work */
void ag_loop_wake_fd(agent *a);
void ag_job_link_locked(agent *a, agent_job *j);
void ag_job_free(agent_job *j);
/* The /agents/work body as text (owned; *len its length), whole or NULL
 * (out of memory: not sent, tried again a second later). */
char *ag_work_body(agent *a, int free_slots, size_t *len);
void ag_work_start(agent *a, int free_slots);
void ag_work_stale_done(agent *a, CURLcode rc, long status, json_t *body);
void ag_work_done(agent *a, CURLcode rc, long status, json_t *body);

/* agent_server.c: requests to the server, /agents/poll, /agents/enroll */
bool ag_proxy_env_set(void);
req *ag_req_start_text(agent *a, int srv, req_kind kind, const char *path, char *text,
                       size_t len, long timeout_ms, const char *correlation_id);
req *ag_req_start(agent *a, req_kind kind, const char *path, json_t *body, long timeout_ms,
                  const char *correlation_id);
void ag_req_done_free(agent *a, req *r);
void ag_req_abort(agent *a, req *r);
/* The /agents/poll body (new reference), whole or NULL (out of memory:
 * not sent, tried again a second later). */
json_t *ag_poll_body(agent *a);
void ag_poll_start(agent *a);
uint32_t ag_server_unreachable(agent *a, const char *what, const char *detail);
const char *ag_error_text(json_t *body);
const char *ag_error_code(json_t *body);
void ag_auth_lost(agent *a, const char *what, long status, json_t *body);
int ag_set_key(agent *a, const char *key);
void ag_enroll_start(agent *a);
void ag_enroll_done(agent *a, CURLcode rc, long status, json_t *body);
void ag_poll_done(agent *a, CURLcode rc, long status, json_t *body);

/* agent_upload.c */
void ag_upload_start(agent *a, agent_job *j, uint64_t now);
void ag_upload_done(agent *a, agent_job *j, CURLcode rc, long status, json_t *body);
void ag_batch_start(agent *a, uint64_t now, bool urgent_only);
bool ag_batch_urgent_due(const agent *a);
bool ag_batch_done_fast(agent *a, req *r);
void ag_batch_done(agent *a, req *r, CURLcode rc, long status, json_t *body);

/* agent_loop.c */
void ag_loop_turn(agent *a);
/* j's events upload could not start: again at `at`. */
void ag_job_retry_at(agent *a, agent_job *j, uint64_t at);
void ag_job_seen(agent *a, agent_job *j, unsigned flags);
int ag_loop_init(agent *a, char *err, size_t errlen);

#endif
