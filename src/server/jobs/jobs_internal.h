/*
 * jobs_internal: the definition of struct gps_job, private to the jobs
 * module (jobs.c and the jobs_*.c files beside it; what those files share
 * besides is in jobs_priv.h, which tests never include).
 *
 * Include this only from the module and from unit tests that must build or
 * inspect jobs by hand (tests/unit/server); every other module reads a job
 * through the accessors in jobs.h, so that the job's fields can change
 * without touching the dialects, the relay or the admin API.
 */
#ifndef GPS_JOBS_INTERNAL_H
#define GPS_JOBS_INTERNAL_H

#include "server/jobs/jobs.h"

struct gps_job {
    char id[40];                  /* "job_" + 24 hex */
    char correlation_id[65];
    char key_id[65];
    /* The prompt-prefix tenant (docs/protocol.md "Prompt-prefix cache"):
     * hex HMAC of the key id under this process's secret, so an agent sees
     * an opaque tag; "" = the one shared tenant (no key, or
     * prefix_cache_scope pool). Sent with the job as "tenant". */
    char tenant[33];
    gps_job_spec spec;
    gps_job_state state;
    int attempts;                 /* agents tried so far */
    char agent_id[64];            /* current/last agent ("" when none) */
    char model_digest[65];        /* sha256 of that agent's model file ("" when unknown) */
    bool count_estimated;         /* count_tokens: the agent estimated (no count endpoint) */
    char *stop_sequence;          /* end: the stop string the agent stopped on (owned), or NULL */
    json_t *upstream_meta;        /* end: an upstream pool's x_pool_meta (owned), or NULL */
    gp_prefix_chain prefix_chain; /* its prompt chain for prefix routing (owned; empty
                                     when no agent advertises prefixes) */
    long prefix_units;            /* units of the prompt the chosen slot held (0: none) */
    gp_buf text;                  /* text relayed to subscribers so far */
    unsigned text_resets;         /* times text was dropped (gps_job_text_resets) */
    long long completion_tokens;  /* tokens relayed, all attempts together */
    long long continued_tokens;   /* tokens before the current attempt (continuation) */
    const char *requested_model;  /* the model asked for when a fallback serves
                                     (points into spec.fallback_models), else NULL;
                                     spec.model is then the model that serves */
    bool client_saw_output;       /* a subscriber sent bytes that depend on the agent */
    uint64_t created_us;          /* monotonic */
    int64_t created_wall_ms;
    uint64_t assigned_us;         /* last assignment */
    uint64_t first_token_us;      /* 0 until the first token */
    uint64_t last_event_us;
    long long queue_ms;           /* total time spent queued */
    long long agent_seq;          /* events accepted from the current agent */
    long long agent_bytes;        /* bytes of those events (bounded, see above) */
    int metrics_relayed;          /* metrics events relayed this attempt */
    double tokens_per_sec;        /* last reported by the agent (metrics event) */
    long long prompt_tokens;      /* from end.usage */
    long long progress_done;      /* latest `progress` event of this attempt (prefill): */
    long long progress_total;     /*   prompt tokens done / in all; 0 = none yet */
    char finish_reason[16];       /* from end: stop | length | tool_calls */
    char error_code[48];          /* failed / cancelled */
    const char *error_message;    /* borrowed from the error event, during the
                                     jobs_finish that ends the job only: the
                                     row keeps it (jobs_persist) */
    /* How the current attempt continues earlier output (continue-mode
     * failover): "tokens" (from the generated token ids, byte-exact: the
     * agents serve the same model file by digest), "text" (the text so far
     * appended to the prompt), NULL when it does not continue anything.
     * Static string. x_pool_meta.continuation. */
    const char *continuation_mode;

    /* ---- private to the module ---- */
    gps_jobs *owner;
    /* Token-exact continuation: the ids behind the relayed text, in order
     * (all attempts; bounded by max_tokens), valid while ids_ok: every
     * token event carried its ids and every attempt ran on a model file
     * with digest ids_digest. */
    int32_t *gen_ids;
    size_t n_gen_ids, cap_gen_ids;
    bool ids_ok;
    char ids_digest[65];
    long long sampler_seed;       /* seed every attempt samples with (wire sampler.seed) */
    sched_job sj;                 /* scheduler view; embedded (container_of) */
    /* The models this job may run on, in the client's order: the requested
     * one, then fallback_models (pointers to the spec's strings, which
     * submit and failover swap between spec.model and fallback_models). */
    char *chain[1 + GPS_MAX_FALLBACK_MODELS];
    size_t n_chain;
    struct event *retry_ev;       /* failover backoff timer (lazy) */
    bool in_backoff;              /* QUEUED, waiting on retry_ev (not in the scheduler) */
    char exclude_agent[64];       /* agent lost on the previous attempt */
    struct gps_job_sub *subs;
    bool cancel_pending;          /* agent must be told to stop */
    size_t tool_bytes;            /* tool call argument bytes relayed (bounded) */
    bool ended_on_agent;          /* registry_job_end called for this assignment */
    bool row_lost;                /* its row is another server's now (a native task
                                     whose lease was taken over): never written */
    int64_t lease_attempt;        /* > 0: its row is written for this lease attempt
                                     only (a shared native task, api_tasks_shared.c) */
    bool remote;                  /* offered to another server (gps_jobs_handoff): never
                                     in this server's scheduler */
    bool offered;                 /* QUEUED in this server's scheduler and offered to the
                                     other servers too (a waiting handoffs row): the first
                                     of a local dispatch (after the offer's withdraw) and
                                     a peer's claim wins */
    bool withdrawing;             /* offered, and a local agent chose it: out of the
                                     scheduler until the withdraw answers */
    char withdraw_agent[64];      /* that agent (its slot is kept ready for the job) */
    bool held;                    /* QUEUED but waiting for its key's max_concurrent
                                     (not in the scheduler) */
    bool counted;                 /* counted as running in the key's limits */
    long long reserved_tokens;    /* held against the key's tokens_per_day until it ends */
    bool sched_observed;          /* scheduling latency recorded (first assignment) */
    uint64_t queued_since_us;
    uint64_t finished_us;
    uint64_t delivery;            /* the work reply that carried this attempt to its agent
                                     (agents_api's sequence); 0 = not delivered yet */
    uint64_t report_mark;         /* the agent report that last listed it (jobs_failover.c) */
    struct gps_job *hnext;        /* id hash chain */
    struct gps_job *prev, *next;  /* the live list, or (done) the finished list */
    bool done;                    /* on the finished list (terminal) */
};

#endif
