/*
 * jobs_priv: what the files of the jobs module share, private to the .c
 * files of src/server/jobs: the table (struct gps_jobs), its records, and
 * the functions one file of the module calls in another.
 *
 * Never include this from another module or from a test: callers see
 * jobs.h, and a test that must build a job by hand includes
 * jobs_internal.h (struct gps_job) only.
 *
 * Names: jobs_ (no gps_ in front) marks a function that crosses files
 * inside the module and is not part of jobs.h.
 *
 * The files: jobs.c (the table, subscribers, cancellation records,
 * timers, accessors), jobs_wire.c (a job as its agent receives it),
 * jobs_submit.c (a new job and the queue), jobs_assign.c (placing and
 * delivering a job to an agent), jobs_failover.c (token-exact
 * continuation, failover, hand-off, lost agents), jobs_finish.c (the
 * request-log row, how a job ends), jobs_events.c (an agent's events).
 */
#ifndef GPS_JOBS_PRIV_H
#define GPS_JOBS_PRIV_H

#include "server/jobs/jobs.h"
#include "server/jobs/jobs_internal.h"

#include "server/auth/limits.h"
#include "server/metrics.h"

#define NBUCKETS 4096          /* id hash; chains stay short for thousands of jobs */
#define NRBUCKETS 16384        /* finished-job records: at most 131,072 (max_records)
                                  is chains of 8, walked only by late uploads */
#define NCBUCKETS 4096         /* cancel records by agent id: 10,000 agents with
                                  records are chains of ~2.5 agents */
#define MAX_TOKENS_SLACK 64       /* tokens tolerated beyond max_tokens (stop-string holdback) */

/* A job an agent must be told to stop (client gone, timeout, failover away
 * from a stalled agent). Sent as a poll command and as cancel:true.
 *
 * Kept per agent, so that a poll (pending list, sent) and an upload's
 * take cost that agent's records, not every agent's: an agent's records
 * are a list (same_prev/same_next) whose first record, the newest, is in
 * the agent-id hash chain (hnext, set on first records only). No node
 * per agent: one allocation per record, as before. All records are also
 * on one list oldest first (older/newer), so that expiry looks only at
 * the expired ones. */
typedef struct cancel_rec {
    struct cancel_rec *hnext;                 /* next agent's first record (bucket) */
    struct cancel_rec *same_prev, *same_next; /* this agent's, newest first */
    struct cancel_rec *older, *newer;         /* all, by age */
    uint64_t since_us;
    char agent_id[64];
    char job_id[40];
} cancel_rec;

/* What is left of a finished job once nobody reads it (retire): what a
 * late upload from its agent needs to be answered cancel:true or 409,
 * ~150 bytes where the whole job was ~1.9 KiB. At thousands of requests a
 * second the jobs kept KEEP_TERMINAL_US were hundreds of MB, and the id
 * table's chains, walked by every upload entry, grew with them. */
typedef struct done_rec {
    struct done_rec *hnext;  /* id hash chain */
    struct done_rec *next;   /* in the order they finished */
    uint64_t retired_us;     /* kept KEEP_TERMINAL_US from then */
    gps_job_state state;
    char id[40];
    char agent_id[64];
} done_rec;

struct gps_jobs {
    struct event_base *base;
    json_t *tok_ev; /* the token event handed to subscribers for a read upload (reused) */
    json_t *tok_id; /* its token_id while it has one (a second reference) */
    json_t *tok_text; /* its "text" (borrowed from tok_ev) */
    /* The error event a job's subscribers get when the one it ends with
     * cannot be built (out of memory): {type: error, code: INTERNAL,
     * message: "out of memory", status: 500}. Made with the table, so that
     * it is there when memory is short; never changed (a subscriber may
     * keep a reference). */
    json_t *oom_ev;
    uint64_t report_stamp; /* the last agent report (gps_jobs_agent_report) */
    /* The fields of the per-job log lines, refilled in place (jobs_log_fields). */
    json_t *log_submitted, *log_assigned, *log_done;
    gps_jobs_opts opts;
    unsigned char tenant_secret[32]; /* keys the tenant tags (random per process) */
    registry *reg;
    sched *sched;
    struct gps_store *store;
    char owner_server[40]; /* this server's id on a shared DB, "" otherwise */
    gps_metrics *metrics;
    gps_jobs_deliver_fn deliver;
    void *deliver_arg;
    gps_limits *limits;         /* borrowed, may be NULL */
    gps_jobs_handoff handoff;   /* hand-off hooks (all NULL: none) */
    gps_job *buckets[NBUCKETS];
    /* Two lists, so that what walks the jobs an agent or a queue has (per
     * poll, per long-poll, per sweep) never walks the finished ones kept
     * for KEEP_TERMINAL_US (at 900 requests/s, 270,000 of them): head is
     * the live jobs, newest first; done_head..done_tail the finished ones
     * in the order they finished, so that expiry only looks at the oldest. */
    gps_job *head;
    gps_job *done_head, *done_tail;
    size_t n_done;
    size_t n_live;
    done_rec *rbuckets[NRBUCKETS]; /* retired finished jobs, by id */
    done_rec *rhead, *rtail;    /* the same, oldest first (expiry) */
    size_t n_recs;
    cancel_rec *cbuckets[NCBUCKETS]; /* cancel records: each agent's newest, by agent id */
    cancel_rec *cold, *cnew;         /* the same records, oldest first (expiry) */
    struct event *sweep;
    int notify_depth;           /* >0 while subscriber callbacks run */
};

/* Append a string literal to a gp_buf (the wire text, the work replies). */
#define LIT(b, s) gp_buf_append((b), (s), sizeof(s) - 1)

/* ---- jobs.c ---- */
void jobs_table_insert(gps_jobs *j, gps_job *job);
void jobs_list_to_done(gps_jobs *j, gps_job *job);
done_rec *jobs_done_rec_find(gps_jobs *j, const char *id);
void jobs_release_reservation(gps_job *job);
void jobs_job_free(gps_job *job);
void jobs_count(gps_jobs *j, const char *name, const char *labels, double v);
bool jobs_wants_tree(const gps_job *job);
void jobs_notify(gps_jobs *j, gps_job *job, gps_event_type type, json_t *ev);
void jobs_cancel_add(gps_jobs *j, const char *agent_id, const char *job_id);
bool jobs_cancel_take(gps_jobs *j, const char *agent_id, const char *job_id);

/* ---- jobs_submit.c ---- */
bool jobs_offerable(gps_jobs *j, const gps_job *job, bool queued);

/* ---- jobs_assign.c ---- */
json_t *jobs_log_fields(json_t **slot);
bool jobs_lf_str(json_t *o, const char *k, const char *v);
bool jobs_lf_int(json_t *o, const char *k, long long v);
bool jobs_lf_bool(json_t *o, const char *k, bool v);
json_t *jobs_log_fields_ref(json_t *o, bool ok);
bool jobs_withdraw_first(gps_jobs *j, gps_job *job, registry_agent *a, bool give_back);
void jobs_deliver_to(gps_jobs *j, gps_job *job, registry_agent *a, int depth);
void jobs_place(gps_jobs *j, gps_job *job, int depth);
void jobs_requeue_or_fail(gps_jobs *j, gps_job *job, int depth);

/* ---- jobs_failover.c ---- */
/* The tokens a token event stands for (its ids kept while the job's are
 * token-exact), or -1 out of memory with nothing recorded. */
long long jobs_ids_record_one(gps_job *job, long long token_id);
long long jobs_ids_record(gps_job *job, const json_t *ev);
void jobs_resume_ids_take(gps_job *job);
void jobs_continuation_plan(gps_job *job, registry_agent *a);
bool jobs_other_agent_live(gps_jobs *j, const gps_job *job, const char *exclude);
int jobs_fallback_live(gps_jobs *j, const gps_job *job, const char *exclude);
void jobs_fail_over(gps_jobs *j, gps_job *job, const char *why);

/* ---- jobs_finish.c ---- */
void jobs_persist_insert(gps_jobs *j, gps_job *job);
long long jobs_total_ms(const gps_job *job);
void jobs_persist(gps_jobs *j, gps_job *job);
void jobs_end_on_agent(gps_jobs *j, gps_job *job, bool ok);
void jobs_finish(gps_jobs *j, gps_job *job, gps_job_state st);
void jobs_fail_job(gps_jobs *j, gps_job *job, int status, const char *code,
                   const char *message, int retry_after);

#endif
