/*
 * jobs: the job lifecycle, from a client request to its last event.
 *
 *   submit ─▶ QUEUED ─(an agent with a parked long-poll takes it)─▶ ASSIGNED
 *   ASSIGNED ─started/token─▶ RUNNING ─end─▶ DONE
 *   QUEUED/ASSIGNED/RUNNING ─error, timeout─▶ FAILED
 *   QUEUED/ASSIGNED/RUNNING ─client gone, cancel─▶ CANCELLED
 *   ASSIGNED/RUNNING ─agent lost, nothing sent to the client─▶ QUEUED (attempt+1)
 *
 * Every job keeps what its events produced (text, counters; not the events
 * themselves, which are relayed and dropped) and
 * a list of subscribers. A dialect subscribes with a callback and turns
 * events into its wire format. Callbacks run on the loop thread. A
 * subscriber never frees the job: it unsubscribes (which only marks) and
 * the job is freed at a safe point (a zero-delay timer) once it is
 * terminal and has no live subscriber.
 *
 * The module owns the job table (by id), queue/request/stall timers,
 * failover and cancellation, and writes the request log through the store.
 * Matching a job to an agent goes through the scheduler, at two moments
 * only: when a job is placed (submit, retry after failover: sched_submit
 * hands it to a ready agent with a parked long-poll at once) and when an
 * agent asks for work or its parked poll can take work again (agents_api
 * calls gps_jobs_hand_out: sched_dispatch). There is no other
 * trigger to call. The delivery of jobs to a parked long-poll
 * goes through a deliver callback installed by agents_api.
 */
#ifndef GPS_JOBS_H
#define GPS_JOBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <jansson.h>

#include "common/gp_util.h"
#include "server/fleet/registry.h"
#include "server/fleet/sched.h"

typedef enum {
    GPS_JOB_COMPLETION = 0,
    GPS_JOB_CHAT,
    GPS_JOB_COUNT_TOKENS,
    GPS_JOB_EMBED,           /* /v1/embeddings: spec.input, embedding events, then end */
} gps_job_kind;
typedef enum { GPS_PRIO_INTERACTIVE = 0, GPS_PRIO_BATCH = 1 } gps_job_priority;
/* x_pool_options.failover: what happens when the job's agent is lost.
 *   continue: before output reached the client, a transparent requeue;
 *             after, another agent continues from the text sent so far
 *   restart:  a transparent requeue while nothing was sent, else an error
 *   error:    no failover at all: the job fails with AGENT_LOST at once */
typedef enum {
    GPS_FAILOVER_CONTINUE = 0,
    GPS_FAILOVER_RESTART,
    GPS_FAILOVER_ERROR,
} gps_failover_mode;
#define GPS_MAX_FALLBACK_MODELS 4

typedef enum {
    GPS_JOB_QUEUED = 0,
    GPS_JOB_ASSIGNED,   /* handed to an agent, no event yet */
    GPS_JOB_RUNNING,    /* at least one event from the agent */
    GPS_JOB_DONE,
    GPS_JOB_FAILED,
    GPS_JOB_CANCELLED,
} gps_job_state;

const char *gps_job_state_name(gps_job_state s);
const char *gps_job_kind_name(gps_job_kind k);

/* What the client asked for, in dialect-neutral form. Owned by the job
 * once submitted (gps_job_spec_clear frees the members). */
typedef struct gps_job_spec {
    gps_job_kind kind;
    char *model;
    char *prompt;            /* completion */
    json_t *messages;        /* chat: array of {role, content:string}; with tools also
                                OpenAI assistant tool_calls and role "tool" messages */
    json_t *input;           /* embed: array of strings or of arrays of token ids (owned) */
    json_t *tools;           /* chat: OpenAI function tools, or NULL (owned) */
    json_t *tool_choice;     /* OpenAI form ("auto", "none", "required", {function}), or NULL */
    json_t *response_format; /* structured output, OpenAI chat form (dialects/rformat.h), or
                                NULL for text (owned) */
    long long max_tokens;
    double temperature;
    double top_p;
    long long top_k;
    json_t *stop;            /* array of strings, or NULL */
    bool has_seed;
    long long seed;
    char *user;
    gps_job_priority priority;
    char *prefer_agent;
    char *session;           /* affinity key (x_pool_options.session); NULL = use user */
    /* x_pool_options.tenant: a pool downstream's own tenant tag, which
     * narrows the key's prompt-prefix tenant (never widens it); owned. */
    char *tenant_sub;
    registry_label *labels;  /* constraints (x_pool_options.labels); owned, n_labels */
    size_t n_labels;
    gps_failover_mode failover;  /* x_pool_options.failover; default continue */
    /* x_pool_options.fallback_models: tried in order when model has no
     * capacity at submit (no live agent, unknown, queue full). Owned. */
    char *fallback_models[GPS_MAX_FALLBACK_MODELS];
    size_t n_fallback;
    const char *api;         /* static: "openai", "anthropic", "native" */
    /* The client is shown the prompt's size before the first token (an
     * Anthropic stream's message_start, issue 26 item 4): the job asks the
     * agent to report it first (wire "prompt_tokens_first", docs/protocol.md). */
    bool prompt_tokens_first;
    /* The pools the request passed through, this one last (gps_req's
     * pool_via): an agent whose upstream is a pool passes it on as
     * X-Pool-Via ("" = none, e.g. a task resubmitted after a restart). */
    char pool_via[128];
    /* Restart recovery (api_tasks): resubmit a stored task under its id
     * (the request-log row exists: updated, not inserted) with the text it
     * had generated before the restart as continuation (resume_tokens
     * tokens; > 0 makes the first attempt a continuation). Owned; NULL/0
     * for a new job. */
    char *resume_id;
    char *resume_text;
    long long resume_tokens;
    /* ... and, when known, the token ids behind resume_text and the digest
     * of the model file they came from: an agent serving that file
     * continues token-exact, any other from the text (issue 25 finding
     * 8). Owned; NULL/0 when unknown. */
    int32_t *resume_ids;
    size_t n_resume_ids;
    char resume_digest[65];
    /* The input to keep in the request log's row, as given (owned; a new
     * job only). NULL: the jobs module keeps prompt/messages (+ max_tokens for a
     * native task) when log_prompts is on or the task is native. A native
     * task passes its whole validated body here so that the row is written
     * once, with what a restart resubmits. */
    json_t *stored_request;
    /* A hand-off's proxy (docs/scaling.md 3e, on the server that claimed
     * it): the job runs under resume_id (the offering server's id) and
     * writes no request-log row (the offering server keeps it and accounts
     * the client's key). */
    bool handoff_proxy;
} gps_job_spec;

void gps_job_spec_clear(gps_job_spec *s);

typedef enum {
    GPS_EV_STARTED = 0,
    GPS_EV_TOKEN,
    GPS_EV_METRICS,
    GPS_EV_END,
    GPS_EV_ERROR,
    GPS_EV_FAILOVER,   /* server-made: {from_agent, reason, attempt, completion_tokens};
                          never from an agent, never terminal */
    GPS_EV_TOOL_CALL,  /* {index, id?, name?, arguments}: a piece of a tool call; the
                          first piece of a call carries id and name */
    GPS_EV_EMBEDDING,  /* {index, embedding}: an embed job's vector of input index, base64
                          of little-endian float32 (docs/protocol.md "Embeddings") */
    GPS_EV_UNKNOWN,
} gps_event_type;

gps_event_type gps_event_type_parse(const char *s);

typedef struct gps_job gps_job;
typedef struct gps_jobs gps_jobs;

/* Subscriber callback. ev is borrowed: the event as stored ("type" and its
 * fields). end: finish_reason, usage {prompt_tokens, completion_tokens}.
 * error: code, message, and "status" (the HTTP status a dialect uses
 * before its first byte), plus "retry_after" when it makes sense. */
typedef void (*gps_job_event_fn)(gps_job *job, gps_event_type type, json_t *ev, void *arg);

/* struct gps_job is defined in jobs_internal.h, private to the jobs module (and to
 * unit tests that build jobs by hand): everyone else reads a job through
 * the accessors below. */

/* The digest of the model file the job's generated token ids belong to
 * while they are token-exact (every token so far came with its ids, all
 * from that file), else NULL. Borrowed: valid until the job changes. */
const char *gps_job_ids_digest(const gps_job *job);

/* Read access for the client dialects, the relay and the admin API, which
 * never read struct gps_job's fields (private to the jobs module: jobs_internal.h).
 * Strings are borrowed: valid until the job changes. */
const char *gps_job_id(const gps_job *job);
/* The model that serves (spec.model: a fallback's when one took it). */
const char *gps_job_model(const gps_job *job);
/* The model asked for when a fallback serves, else NULL. */
const char *gps_job_requested_model(const gps_job *job);
/* The text relayed so far: NUL-terminated ("" when none), and its bytes. */
const char *gps_job_text(const gps_job *job);
size_t gps_job_text_len(const gps_job *job);
/* How many times the job's text was dropped (a transparent requeue before
 * any output was sent): a cursor into the text made before is stale. */
unsigned gps_job_text_resets(const gps_job *job);
/* From the end event: finish_reason ("" before), the stop string the
 * agent stopped on (NULL: none), the token counts, whether the prompt
 * count was estimated (count_tokens). */
const char *gps_job_finish_reason(const gps_job *job);
const char *gps_job_stop_sequence(const gps_job *job);
long long gps_job_prompt_tokens(const gps_job *job);
long long gps_job_completion_tokens(const gps_job *job);
bool gps_job_count_estimated(const gps_job *job);
/* Monotonic time of the first token, 0 before it. */
uint64_t gps_job_first_token_us(const gps_job *job);
/* What x_pool_meta and the x-pool-* headers tell (poolmeta.h): the agent
 * ("" none), agents tried, time queued, the current assignment's and the
 * end's monotonic times (0: not yet), the model file's digest ("" unknown),
 * prompt units the slot held, an upstream pool's meta (borrowed, NULL),
 * how the attempt continues earlier output ("tokens" | "text" | NULL). */
const char *gps_job_agent_id(const gps_job *job);
int gps_job_attempts(const gps_job *job);
long long gps_job_queue_ms(const gps_job *job);
uint64_t gps_job_assigned_us(const gps_job *job);
uint64_t gps_job_finished_us(const gps_job *job);
const char *gps_job_model_digest(const gps_job *job);
long gps_job_prefix_units(const gps_job *job);
json_t *gps_job_upstream_meta(const gps_job *job);
const char *gps_job_continuation_mode(const gps_job *job);
/* What a task's status tells (api_tasks): the state, the request's
 * priority and seed (`_of`: the types hold the plain names), the monotonic time it was created, the error code of
 * a failed or cancelled job ("" otherwise). */
gps_job_state gps_job_state_of(const gps_job *job);
gps_job_priority gps_job_priority_of(const gps_job *job);
long long gps_job_seed(const gps_job *job);
uint64_t gps_job_created_us(const gps_job *job);
const char *gps_job_error_code(const gps_job *job);
/* What the admin API's job listing tells: the dialect that submitted it
 * (spec.api, static, may be NULL), its kind, the key's id and the
 * correlation id ("" none), the wall-clock creation time, and the
 * request's session and user (NULL when not given). */
const char *gps_job_api(const gps_job *job);
gps_job_kind gps_job_kind_of(const gps_job *job);
const char *gps_job_key_id(const gps_job *job);
const char *gps_job_correlation_id(const gps_job *job);
int64_t gps_job_created_wall_ms(const gps_job *job);
const char *gps_job_session(const gps_job *job);
const char *gps_job_user(const gps_job *job);

/* Submit errors: the status and code a dialect should answer with. */
typedef struct gps_submit_err {
    int status;                   /* 400, 404, 429, 503, 500 */
    const char *code;             /* INVALID_REQUEST (generation asked of an encoder),
                                     MODEL_NOT_FOUND, QUEUE_FULL, RATE_LIMITED, TOKEN_LIMIT,
                                     NO_AGENT, INTERNAL */
    char message[256];
    int retry_after_sec;          /* 0 = none */
} gps_submit_err;

/* Deliver callback (agents_api): jobs were assigned to agent a by the
 * scheduler while its long-poll was parked; jobs is the JSON array of their
 * wire objects as text (gps_job_wire_append; borrowed). The callback
 * answers the parked request and calls sched_agent_unready. Returns the
 * reply's delivery number (> 0, see gps_jobs_agent_report; 0: unnumbered)
 * when handed over, -1 when the agent has no parked long-poll any more
 * (the jobs are then requeued). jobs NULL: the jobs could not be written
 * (out of memory): the callback answers the parked request 500, so that
 * the agent polls again, and returns -1 (the jobs are requeued); so does
 * a reply it cannot write itself. */
typedef long long (*gps_jobs_deliver_fn)(registry_agent *a, const gp_buf *jobs, void *arg);

typedef struct gps_jobs_opts {
    int max_queue;
    int queue_timeout_sec;
    int request_timeout_sec;
    int stall_timeout_sec;
    int max_attempts;
    int poll_interval_sec;
    bool log_prompts;
    bool prefix_cache_pool;        /* prefix_cache_scope pool: one tenant for all keys */
    long long max_job_event_bytes; /* bytes of events one agent attempt may send
                                      (0 = GPS_JOBS_MAX_EVENT_BYTES_DEFAULT) */
    int backoff_base_ms;           /* failover backoff (gps_failover_backoff_ms); */
    int backoff_cap_ms;            /*   0 = retries never wait */
    size_t max_records;            /* finished-job records kept at most, the oldest
                                      dropped first (0 = GPS_JOBS_MAX_RECORDS_DEFAULT) */
    int cancel_keep_ms;            /* a cancel record no poll reply carried is dropped
                                      after this (0 = 600 s) */
} gps_jobs_opts;

/* 131,072 records are ~20 MB: the whole KEEP_TERMINAL_US (60 s) up to
 * ~2,200 requests/s, the last ~19 s at 7,000 (~74 MB by time alone). A
 * record dropped early only turns a late upload's cancel:true or 409
 * into 404 JOB_NOT_FOUND, which stops the job on its agent just the same. */
#define GPS_JOBS_MAX_RECORDS_DEFAULT 131072

/* ---- the failover decision (docs/architecture.md "Failover") ----
 * Pure, so that its table is tested on its own; jobs_fail_over (jobs_failover.c)
 * gathers the facts and carries the plan out. */
typedef enum {
    GPS_FO_FAIL_LOST = 0,   /* 502 AGENT_LOST: mode error, restart after output, tool calls sent */
    GPS_FO_FAIL_EXHAUSTED,  /* 503 AGENT_LOST: max_attempts reached */
    GPS_FO_REQUEUE,         /* nothing sent: a transparent retry from scratch */
    GPS_FO_CONTINUE,        /* output sent, mode continue: the next agent continues it */
} gps_fo_action;

typedef struct gps_fo_facts {
    gps_failover_mode mode;
    bool output_sent;       /* job->client_saw_output */
    bool tools_relayed;     /* tool call pieces went to the subscribers */
    int attempts;           /* agents tried so far, the lost one included */
    int max_attempts;
    bool model_live;        /* a live agent other than the lost one serves the job's model */
    int fallback_live;      /* first other model of the job's chain (requested model, then
                               fallback_models in the client's order) with such an agent;
                               -1 = none or no fallback_models */
    int backoff_base_ms, backoff_cap_ms;
    uint32_t rnd;           /* jitter source */
} gps_fo_facts;

typedef struct gps_fo_plan {
    gps_fo_action action;
    int fallback;           /* REQUEUE/CONTINUE: chain index to move to; -1 = same model */
    long long delay_ms;     /* REQUEUE/CONTINUE: wait this long before placing; 0 = now */
} gps_fo_plan;

/* The job's model keeps the retry while any live agent serves it (a
 * restarted agent soon takes it); when none does, the first fallback model
 * with a live agent takes it at once instead of the job waiting out
 * queue_timeout. With neither, the job stays queued for its model. */
gps_fo_plan gps_failover_decide(const gps_fo_facts *f);
/* Backoff before the retry that follows the failure of attempt number
 * `attempts`: 0 for the first (the client waits on that retry: a free
 * agent must take it at once); then base * 2^(attempts-2) capped at cap,
 * with equal jitter: uniformly in [d/2, d] (rnd picks), so a burst of jobs
 * lost together does not come back in lockstep. */
long long gps_failover_backoff_ms(int attempts, int base_ms, int cap_ms, uint32_t rnd);

/* Bounds on what an agent makes the server keep for one job (docs/
 * operations.md, "Limits and hostile peers"). An attempt may send at most
 * min(max_job_event_bytes, BASE + (max_tokens + 64) * PER_TOKEN) bytes of
 * events (compact JSON); past that the job fails with 502
 * AGENT_OUTPUT_TOO_LARGE and the agent is told to cancel. Events are not
 * kept once applied: only the text relayed so far and counters. */
#define GPS_JOBS_MAX_EVENT_BYTES_DEFAULT (64LL << 20)
#define GPS_JOBS_EVENT_BYTES_BASE (256LL << 10)
#define GPS_JOBS_EVENT_BYTES_PER_TOKEN 512LL
#define GPS_JOBS_MAX_METRICS_RELAYED 16 /* metrics events relayed per attempt; later ones
                                           update the counters only */

struct gps_metrics;
struct gps_store;
struct gps_limits;

/* reg, s, store (may be NULL: no persistence), metrics are borrowed and must
 * outlive the jobs table. */
gps_jobs *gps_jobs_new(struct event_base *base, const gps_jobs_opts *opts, registry *reg,
                       sched *s, struct gps_store *store, struct gps_metrics *metrics);
void gps_jobs_free(gps_jobs *j);
void gps_jobs_set_deliver(gps_jobs *j, gps_jobs_deliver_fn fn, void *arg);
/* Per-key limits (limits.h; borrowed, may stay NULL = no limits): submit
 * refuses over-rate keys with 429 RATE_LIMITED / TOKEN_LIMIT, holds jobs
 * beyond a key's max_concurrent out of the scheduler (still QUEUED, same
 * queue timeout) until one of its jobs ends, and accounts finished jobs'
 * tokens to their key. Resumed jobs (restart) are not admitted again. */
void gps_jobs_set_limits(gps_jobs *j, struct gps_limits *l);
/* On a database several servers share: the jobs this process creates are
 * stored with this server's id (jobs.owner_server), so that another
 * server fails them only once this one is gone (docs/scaling.md "Requests
 * of a server that is gone"). NULL or "": none (SQLite). */
void gps_jobs_set_owner_server(gps_jobs *j, const char *server_id);
registry *gps_jobs_registry(gps_jobs *j);
sched *gps_jobs_sched(gps_jobs *j);
struct gps_metrics *gps_jobs_metrics(gps_jobs *j);

/* Create a job from spec (moved in: spec is left empty on success and on
 * failure alike) and queue it. Returns the job, or NULL with err filled
 * (no agent serves the model, queue full, ...). The caller subscribes at
 * once (same loop turn; no event can be delivered before it returns). */
gps_job *gps_jobs_submit(gps_jobs *j, gps_job_spec *spec, const char *correlation_id,
                         const char *key_id, gps_submit_err *err);
/* Add / remove a subscriber. Removing only marks it; safe inside callbacks. */
int gps_job_subscribe(gps_job *job, gps_job_event_fn fn, void *arg);
void gps_job_unsubscribe(gps_job *job, gps_job_event_fn fn, void *arg);
/* A subscriber that reads token text from the job's text (gps_job_text,
 * gps_job_text_resets): its token events may come with ev NULL (no tree is
 * built per token when every live subscriber is such a one), and so may
 * its started, metrics, end and failover events (it reads the job's
 * fields); an error event always has its tree. */
int gps_job_subscribe_cursor(gps_job *job, gps_job_event_fn fn, void *arg);
/* The client got bytes that came from the agent: after this a lost agent
 * can no longer be hidden by a transparent requeue. */
void gps_job_mark_output_sent(gps_job *job);
/* A shared native task's row (api_tasks): written for this lease attempt
 * only (> 0); and its row is another server's now (the lease was taken
 * over): never written again. */
void gps_job_set_lease_attempt(gps_job *job, int64_t attempt);
void gps_job_mark_row_lost(gps_job *job);
/* Cancel (idempotent). The agent learns it from its next event upload or
 * poll. Subscribers get no further events. */
void gps_jobs_cancel(gps_jobs *j, gps_job *job, const char *reason);
/* The client side decided the job is complete (a stop sequence matched on
 * the server): the job ends DONE with finish_reason, subscribers get an
 * `end` event and the agent is told to stop. No-op on a terminal job. */
void gps_jobs_finish_early(gps_jobs *j, gps_job *job, const char *finish_reason);
/* The server itself fails the job (a subscriber could not record one of
 * its events whole: out of memory): it ends FAILED with code, message and
 * the status a dialect uses, subscribers get its error event and the agent
 * is told to stop. No-op on a terminal job. */
void gps_jobs_fail(gps_jobs *j, gps_job *job, int status, const char *code,
                   const char *message);
/* Queued jobs of the same model that will be served before job (0 = next;
 * also 0 when not queued). O(jobs). */
size_t gps_jobs_queue_position(gps_jobs *j, const gps_job *job);
/* A live job, or a finished one still read (a subscriber left) or not yet
 * swept (250 ms); NULL otherwise. */
gps_job *gps_jobs_find(gps_jobs *j, const char *id);
/* What is left of a finished job freed at a sweep, for KEEP_TERMINAL_US
 * (60 s) after, or until max_records newer ones: its state and last agent
 * (agent_len bytes at most, "" when none). false when there is no such
 * record. */
bool gps_jobs_find_record(gps_jobs *j, const char *id, gps_job_state *state, char *agent_id,
                          size_t agent_len);
bool gps_job_terminal(const gps_job *job);

/* ---- hand-off to another server (docs/scaling.md 3e; handoff.h) ----
 * On a shared database a job that no agent of this server can take
 * (sched_submit: no agent for the model) is offered to the other servers
 * when can_offer says one of them serves the model: it stays here with its
 * subscribers, QUEUED and "remote" (not in the scheduler), offer is told
 * (after its row's insert is queued), and the hand-off module drives it:
 * gps_jobs_remote_assign when a server claims it, then the claimer's
 * relayed events through gps_jobs_apply_events with the claimer's server
 * id as the agent id; gps_jobs_remote_lost when the claimer is gone. ended
 * is told once when an offered or remote job becomes terminal (any
 * reason).
 *
 * A job that waits in this server's queue (its model's agents here are all
 * busy) is offered too when can_offer says so and withdraw is set: it
 * stays in the scheduler ("offered"). Whichever comes first takes it: a
 * peer's claim (the follower's gps_jobs_remote_assign takes it out of the
 * scheduler) or a local agent. Before a local agent gets it, the offer is
 * withdrawn: the scheduler's slot is given back (the agent stays ready),
 * the job waits out of the scheduler, and withdraw starts the database's
 * conditional delete; its answer, gps_jobs_offer_withdrawn, places the job
 * again (withdrawn: at the front of its queue, so the agent that chose it
 * normally gets it) or leaves it to the peer that claimed it (remote). A
 * job that was never offered dispatches as before, at once. */
typedef struct gps_jobs_handoff {
    bool (*can_offer)(void *arg, const gps_job *job);
    /* For a job that waits in this server's queue (optional; NULL: as
     * can_offer): true only while a peer could take it now (a free agent
     * there fits it). One not offered at submit is offered later through
     * gps_jobs_offer_queued. */
    bool (*can_offer_queued)(void *arg, const gps_job *job);
    /* true: offered (its row's insert is queued and the job followed). */
    bool (*offer)(void *arg, gps_job *job);
    /* Start the withdraw of job's offer: true when under way (the answer
     * comes through gps_jobs_offer_withdrawn, later, never inside this
     * call), false when there is no offer to withdraw (dispatch now). */
    bool (*withdraw)(void *arg, gps_job *job);
    void (*ended)(void *arg, gps_job *job);
    /* The models the other live servers serve, as the keys of an object
     * (borrowed, valid until the next loop turn; NULL: none known). */
    const json_t *(*peer_models)(void *arg);
    void *arg;
} gps_jobs_handoff;
/* h is copied; NULL removes the hooks. */
void gps_jobs_set_handoff(gps_jobs *j, const gps_jobs_handoff *h);
/* The models only a hand-off can reach (hooks' peer_models), for
 * /v1/models: borrowed, NULL when there is no hand-off or none is known. */
const json_t *gps_jobs_peer_models(gps_jobs *j);
/* What constrains where job may run, for an offer to another server (new
 * reference; NULL on ENOMEM): {labels: {key: value}, prefer_agent,
 * fallback_models: [names after the serving model, in the client's
 * order], failover: continue | restart | error, needs_tools,
 * needs_embeddings, needs_generation}; absent members are unset. */
json_t *gps_job_constraints(const gps_job *job);
/* The jobs waiting in this server's queue that were not offered: each
 * that the hooks' can_offer_queued accepts now is offered, oldest first
 * (a peer's agent came free). Returns how many were. O(jobs). */
size_t gps_jobs_offer_queued(gps_jobs *j);
/* The names job may run under, the serving model first and then the
 * client's other names (fallback_models) in its order: at most max into
 * names (borrowed, valid while the job lives); returns how many. */
size_t gps_job_models(const gps_job *job, const char **names, size_t max);
/* Was the job offered to another server (remote)? */
bool gps_job_remote(const gps_job *job);
/* A remote QUEUED job, or an offered one still queued here, was claimed
 * by server_id: ASSIGNED to it as its pseudo-agent (attempt + 1, event seq
 * from 0; an offered job leaves this server's scheduler and becomes
 * remote). -1 when the job is neither. */
int gps_jobs_remote_assign(gps_jobs *j, gps_job *job, const char *server_id);
/* The claimer of a remote job is gone (why "server_lost": its row is
 * waiting again, or another server's): as after an agent loss, the job is
 * offered again when its client saw nothing (QUEUED remote; attempts
 * bounded by max_attempts), else it ends with AGENT_LOST. Any other why
 * (a stall seen here) ends it with AGENT_LOST. No-op unless the job is a
 * remote one ASSIGNED or RUNNING. */
void gps_jobs_remote_lost(gps_jobs *j, gps_job *job, const char *why);
/* The answer to the hooks' withdraw: withdrawn (the offer's row was still
 * waiting and is gone), the job is placed here again; not withdrawn (a
 * peer claimed it first), the job becomes remote and the follower drives
 * it. No-op unless the job is QUEUED and withdrawing. */
void gps_jobs_offer_withdrawn(gps_jobs *j, gps_job *job, bool withdrawn);

/* ---- agent side (agents_api) ---- */

/* The most jobs one reply carries (an agent's free_slots above it count
 * as this many; agents_api refuses more than 1024). */
#define GPS_JOBS_TAKE_MAX 1024

/* Agent a asks for work with free_slots: it becomes ready in the
 * scheduler, and the jobs queued for it go to it in one reply, written by
 * reply (as the deliver callback: the JSON array of their wire objects;
 * it returns the reply's delivery number, > 0, increasing per server
 * process, 0: unnumbered, recorded on each job so that
 * gps_jobs_agent_report can tell what the agent has seen; -1 when the
 * reply could not be written and a 500 went instead; jobs NULL: the jobs
 * could not be written, it answers 500 and returns -1). The agent is
 * unready when reply is called (its poll is answered).
 * Returns how many jobs went out. A job is assigned only if a reply that
 * carries it went out: one whose wire cannot be written (out of memory)
 * is left out of the reply with those after it, and every job of a reply
 * not written goes back to the head of its queue, unassigned, its attempt
 * not counted, never straight back to a (unready). -1: nothing went out
 * (reply answered 500: the agent polls again). 0: nothing queued for it,
 * reply not called: park the long-poll, the agent stays ready until
 * sched_agent_unready. */
long gps_jobs_hand_out(gps_jobs *j, registry_agent *a, int free_slots, gps_jobs_deliver_fn reply,
                       void *arg);
/* gps_jobs_hand_out with a reply that appends the jobs' JSON array to out
 * ("[]" when it returns 0), numbered delivery: for tests and a caller
 * whose reply cannot fail after it (one that writes it later could no
 * longer give the jobs back). */
long gps_jobs_take_for_agent(gps_jobs *j, registry_agent *a, int free_slots, uint64_t delivery,
                             gp_buf *out);
/* Apply an event batch. Returns 0 (*cancel set), 404 unknown job, 409 when
 * not assigned to agent_id (*expected_seq = -1) or a seq gap
 * (*expected_seq = what the server has), 400 for a malformed event (msg),
 * 500 out of memory (msg "out of memory"): the events before the one it
 * stopped at were applied, that one and the rest not at all; the same
 * batch sent again (same seq) applies the rest. */
int gps_jobs_apply_events(gps_jobs *j, const char *job_id, const char *agent_id, long long seq,
                          json_t *events, bool *cancel, long long *expected_seq, char *msg,
                          size_t msglen);
/* The same for events the caller already checked with
 * gps_agent_events_check (agent_check.h): every event is not checked a
 * second time (the check was a seventh of an upload's cost). */
int gps_jobs_apply_checked_events(gps_jobs *j, const char *job_id, const char *agent_id,
                                  long long seq, json_t *events, bool *cancel,
                                  long long *expected_seq, char *msg, size_t msglen);
/* One event of an upload read without a jansson tree per token
 * (upload_read.h): a token's fields; a started, metrics or end event of
 * the plain shape every agent sends, as its fields (plain); or any other
 * event as an object. */
typedef struct gps_event_in {
    json_t *ev;          /* a non-token event (borrowed), or NULL: a token or plain */
    const char *text;    /* token: its text, len bytes, no NUL inside (borrowed) */
    size_t len;
    long long token_id;  /* token: -1 when absent */
    size_t bytes;        /* the event's size as compact JSON (the event budget) */
    /* plain: checked as gps_agent_event_check_sized checks its tree; raw
     * (borrowed, the upload's body) is its JSON, parsed only for a
     * subscriber that reads trees. */
    bool plain;
    bool progress;       /* plain: a progress event (type GPS_EV_UNKNOWN) */
    gps_event_type type; /* plain: GPS_EV_STARTED, GPS_EV_METRICS, GPS_EV_END or that */
    const char *raw;
    size_t raw_len;
    long long prompt_tokens, completion_tokens; /* metrics, end.usage: -1 when absent */
    long long progress_done, progress_total;    /* progress: -1 when absent */
    double tokens_per_sec;                      /* metrics: when has_tps */
    bool has_tps, count_estimated;              /* metrics */
    const char *finish_reason, *stop_sequence;  /* end: NUL-terminated (upload text) or NULL */
} gps_event_in;
/* gps_jobs_apply_checked_events for such events (checked the same way);
 * same returns, except that the agent's registry entry is not touched
 * (registry_touch): the caller does it once per upload, after the entries
 * of which one at least returned 0. Subscribers get a token event holding
 * type, text and token_id (when the agent sent one) only; NULL when every
 * live subscriber is a cursor one (gps_job_subscribe_cursor). */
int gps_jobs_apply_upload(gps_jobs *j, const char *job_id, const char *agent_id, long long seq,
                          const gps_event_in *evs, size_t n, bool *cancel,
                          long long *expected_seq, char *msg, size_t msglen);
/* Agent declared dead (or gone): its jobs fail over (requeue when the
 * client saw nothing yet, else end with an error). */
void gps_jobs_agent_lost(gps_jobs *j, const char *agent_id, const char *why);
/* Agent agent_id stops taking new jobs while its running ones go on
 * (drained by an admin or by itself), or is about to be removed (call it
 * while the registry still has it). Queued jobs of each model it served
 * that no other agent can run now under that model (healthy or
 * registering, and taking what the job needs: tools, labels, as the
 * scheduler routes it) move to their first fallback model where one can,
 * as after a lost agent; jobs without one stay queued. Its own assigned
 * and running jobs are left alone. O(names it serves x agents + jobs
 * queued for them; a job with labels asks the agents on its own). */
void gps_jobs_agent_leaving(gps_jobs *j, const char *agent_id);
/* A heartbeat of agent_id changed its model list (registry.h,
 * models_before): each name it listed before and lists no more (or no
 * longer takes tools for: its tools jobs only) has the queued jobs that no
 * live agent can run under it moved to their first fallback model where
 * one can (agent_id itself included), as at a drain; jobs without one stay
 * queued. Nothing when the list did not change. O(names
 * of both lists + per lost name: agents x names + jobs queued for it). */
void gps_jobs_models_dropped(gps_jobs *j, const char *agent_id);
/* Jobs (ASSIGNED or RUNNING) currently assigned to agent_id. O(jobs). */
size_t gps_jobs_agent_assigned(gps_jobs *j, const char *agent_id);
/* An agent's own account of its jobs (poll or work `running_jobs`, docs/
 * protocol.md). running: array of job id strings (borrowed; NULL = the agent
 * did not say: nothing happens). seen: the last work reply the agent had
 * processed when it made the list (0 = unknown). Each job assigned to
 * agent_id that is listed is alive: its stall timer restarts. One that is
 * not listed although its delivery <= seen is gone from the agent: its
 * attempt ends at once (fail_over, reason "agent_dropped_job"). A job
 * delivered later is never judged by this list (the agent may not have
 * read that reply yet). Returns the attempts ended. O(jobs * listed). */
size_t gps_jobs_agent_report(gps_jobs *j, const char *agent_id, const json_t *running,
                             uint64_t seen);
/* Job ids assigned to agent_id that were cancelled and not acknowledged:
 * to be sent as poll commands. New reference (array of command objects),
 * or NULL out of memory. The records are kept: once the reply that
 * carries them is written, gps_jobs_cancels_sent drops them; a reply that
 * could not be (out of memory) leaves them for the agent's next poll. */
json_t *gps_jobs_pending_cancels(gps_jobs *j, const char *agent_id);
/* commands (borrowed: a poll reply's commands, pending_cancels' among
 * them) reached agent_id: its cancel records for those jobs are dropped. */
void gps_jobs_cancels_sent(gps_jobs *j, const char *agent_id, const json_t *commands);
/* Running + queued counts (shutdown, metrics). */
size_t gps_jobs_active(gps_jobs *j);
/* Metrics collector part: queue depth and running jobs. */
void gps_jobs_collect(gps_jobs *j, struct gps_metrics *m);
/* Wire form of a job for /agents/work (new reference): NULL out of
 * memory, never a wire short of a part for want of it (a string jansson
 * refuses is left out, as gps_job_wire_append leaves it). */
json_t *gps_job_wire(const gps_job *job, uint64_t now_us, int request_timeout_sec);
/* The same object appended to out as text: the bytes gp_json_dump_append
 * writes for gps_job_wire's, without the tree. 0; 1 when gps_job_wire
 * gives NULL (nothing appended); -1 ENOMEM (out as it was). */
int gps_job_wire_append(gp_buf *out, const gps_job *job, uint64_t now_us,
                        int request_timeout_sec);

#endif
