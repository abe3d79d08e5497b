/*
 * sched: per-model job queues and the matching of jobs to agents.
 *
 * Pure data structure on top of the registry: no I/O, time passed in, not
 * thread-safe (the event-loop thread owns it). docs/scheduling.md explains
 * the policies and costs.
 *
 * Vocabulary
 * - A JOB is a sched_job the core embeds in its own job struct (use
 *   container_of / offsetof to get back); the scheduler never allocates or
 *   frees jobs. While queued, the job's strings are borrowed and must stay
 *   valid.
 * - An agent is READY while the core holds its parked POST /agents/work
 *   long-poll with free slots left: sched_agent_ready(a, free_slots). It is
 *   in the ready sets of all the names it serves while it is ready, HEALTHY
 *   (not draining) and has free slots left. Each assignment uses one slot;
 *   at 0 it leaves the ready sets.
 * - Ready sets are circular lists, one per model name (id and each alias),
 *   one per (name, label key=value) and one per name of the agents that take
 *   tools for it (supports_tools), each with a rotating cursor, so
 *   round_robin decisions are O(1) and nothing scans all agents.
 *
 * Core flow
 *   client request:  r = sched_submit(s, job, now, &agent)
 *       SCHED_ASSIGNED   -> answer that agent's parked long-poll with the job
 *                           (then sched_agent_unready: the poll is answered)
 *       SCHED_QUEUED     -> job waits; on queue_timeout / client gone call
 *                           sched_remove(s, job) (O(1))
 *       SCHED_QUEUE_FULL -> 429 (Retry-After: sched_estimated_wait_ms)
 *       SCHED_NO_AGENT   -> no live agent serves the model:
 *                           registry_model_known ? 503 : 404
 *   POST /agents/work {free_slots:N}:
 *       sched_agent_ready(s, a, N); n = sched_dispatch(s, a, jobs, N, now);
 *       n > 0 -> reply with those jobs now (then sched_agent_unready)
 *       n = 0 -> park; later sched_submit may assign to it
 *   long-poll answered / timed out / connection closed: sched_agent_unready
 *   any registry transition of the agent, or new models/labels:
 *       sched_agent_update(s, a); if it is HEALTHY again and still parked,
 *       call sched_dispatch for it.
 *   agent removed from the registry: sched_agent_forget first.
 *
 * Every assignment (ASSIGNED or dispatch) calls registry_job_begin on the
 * agent; the core calls registry_job_end once per assignment.
 */
#ifndef GPS_SCHED_H
#define GPS_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/gp_prefix.h"
#include "server/fleet/registry.h"

typedef enum sched_policy {
    SCHED_ROUND_ROBIN = 0,  /* rotate among ready agents per model (default) */
    SCHED_WEIGHTED          /* best score among a bounded sample, see below */
} sched_policy;

/* "round_robin" | "weighted" -> 0, else -1. */
int sched_policy_parse(const char *s, sched_policy *out);

typedef enum sched_priority {
    SCHED_INTERACTIVE = 0,  /* served first */
    SCHED_BATCH = 1,
    SCHED_PRIORITY_COUNT
} sched_priority;

/* "interactive" | "batch" -> 0, else -1. */
int sched_priority_parse(const char *s, sched_priority *out);

typedef struct sched_config {
    sched_policy policy;
    size_t max_queue;           /* per model name, both priorities together; 1000 */
    /* weighted: score = weight(ramp) * (w_load*(1-load) + w_active/(active+1)
     *   + w_speed*speed + w_reliability*reliability + w_affinity*affinity)
     * load = max(active, reported busy) / slots_total (clamped to 1);
     * speed = tokens_per_sec / best tokens_per_sec in the sample (0..1);
     * reliability = registry_agent_reliability; affinity = 1 for the agent
     * the job's session used last, else 0. Defaults 1, 1, 1, 1, 2. */
    double w_load, w_active, w_speed, w_reliability, w_affinity;
    size_t weighted_sample;     /* eligible ready agents scored per decision; 16 */
    uint64_t affinity_ttl_ms;   /* session -> agent memory; 300000 (5 min) */
    bool prefer_strict;         /* default for jobs: wait for prefer_agent (true)
                                   or fall back to any eligible agent (false, default) */
    bool prefix_routing;        /* send a job to the ready agent whose slot holds
                                   its longest prompt prefix (true, default) */
} sched_config;

void sched_config_default(sched_config *c);

/*
 * A job as the scheduler sees it. The core fills the public part (zero the
 * whole struct first) and keeps the struct alive while it is queued.
 */
typedef struct sched_job {
    const char *model;              /* requested name (id or alias), required */
    sched_priority priority;
    const registry_label *labels;   /* constraints: agent label key must equal value */
    size_t n_labels;
    const char *prefer_agent;       /* agent_id; NULL = none */
    int prefer_strict;              /* -1 = config default, 0 fall back, 1 wait */
    const char *session;            /* affinity key (user / metadata.user_id /
                                       x_pool_options.session); NULL = none */
    const char *exclude_agent;      /* agent_id not to use (failover retry); NULL */
    bool needs_tools;               /* carries tools: only agents whose facts say
                                       supports_tools for model may take it */
    bool needs_embeddings;          /* an embeddings job: only agents whose facts say
                                       supports_embeddings for model (checked per
                                       candidate; no ring of its own) */
    bool needs_generation;          /* chat or completion: never an agent that serves
                                       the model as an encoder (embeddings_only) */
    bool front;                     /* queue at the head of its priority (failover) */
    const gp_prefix_chain *prefix;  /* the job's prompt chain (gp_prefix_chain_of_job
                                       over its wire JSON), borrowed; NULL = none */

    /* set by the scheduler */
    uint64_t enqueue_ms;            /* when sched_submit queued it */
    registry_agent *agent;          /* agent it was assigned to, or NULL */
    long prefix_units;              /* > 0: routed to a slot holding that many of
                                       its prompt units (sched_submit) */

    /* private to sched.c */
    struct sched_job *qprev, *qnext;
    struct sched_queue *queue;      /* non-NULL while queued */
    int64_t qseq;                   /* order across queues (front jobs < 0) */
} sched_job;

typedef enum sched_result {
    SCHED_ASSIGNED = 0,   /* *agent_out set, job->agent set, a slot used */
    SCHED_QUEUED,         /* waiting in its model's queue */
    SCHED_QUEUE_FULL,     /* max_queue reached: 429 */
    SCHED_NO_AGENT,       /* no live agent serves the model (or a strict
                             prefer_agent is unknown/not live, or the job
                             needs_tools and no live agent takes tools for
                             the model): 503 / 404 */
    SCHED_ERROR           /* ENOMEM or a bad job (NULL model): 500 / 400 */
} sched_result;

const char *sched_result_name(sched_result r);

typedef struct sched sched;

/* New scheduler over reg (borrowed; must outlive it). NULL on ENOMEM. */
sched *sched_create(registry *reg, const sched_config *cfg);
/* Frees the scheduler's per-agent state and queues. Queued jobs are simply
 * dropped (the core owns them). */
void sched_destroy(sched *s);

/* ------------------------------------------------------------------ jobs */

/* Try to place job now; otherwise queue it. See sched_result. O(1) for
 * round_robin without constraints; see docs/scheduling.md for the rest. */
sched_result sched_submit(sched *s, sched_job *job, uint64_t now_ms, registry_agent **agent_out);

/* Take a queued job out of its queue (cancel, client gone, timeout). O(1).
 * Returns true if it was queued. Safe on a job that is not queued. */
bool sched_remove(sched *s, sched_job *job);

/* True while the job sits in a queue. */
bool sched_job_queued(const sched_job *job);

/* A walk over the jobs queued for model (the name as requested) at
 * priority p, oldest first: the first, then the one after job in its
 * queue; NULL at the end. O(1) each. The caller takes the next job before
 * it removes one from the queue. */
sched_job *sched_queue_first(const sched *s, const char *model, sched_priority p);
sched_job *sched_queue_next(const sched_job *job);

/* ---------------------------------------------------------------- agents */

/* The agent parked a long-poll with free_slots (> 0) free: it joins the
 * ready sets if HEALTHY. Calling it again replaces the free count. Returns
 * 0, or -1 on ENOMEM. */
int sched_agent_ready(sched *s, registry_agent *a, int free_slots);

/* The long-poll was answered or closed: leaves all ready sets. */
void sched_agent_unready(sched *s, registry_agent *a);

/* Re-evaluate after a registry transition or a heartbeat (state, models,
 * labels). Cheap when nothing changed. Returns 0 or -1 (ENOMEM). */
int sched_agent_update(sched *s, registry_agent *a);

/* Drop all state kept for a (before registry_remove). */
void sched_agent_forget(sched *s, registry_agent *a);

/* Pull up to max queued jobs for agent a (at most its free slots) from the
 * queues of the names it serves: interactive before batch, oldest first,
 * skipping jobs whose constraints a does not meet (or that strictly prefer
 * another agent). Each job is removed from its queue, job->agent set, a slot
 * used. Writes them to out and returns how many. Cost: O(names served +
 * jobs skipped), bounded by max_queue per name. */
size_t sched_dispatch(sched *s, registry_agent *a, sched_job **out, size_t max, uint64_t now_ms);

/* Free slots the scheduler still counts for a (0 when not ready). */
int sched_agent_free_slots(const sched *s, const registry_agent *a);
/* True when a is currently in the ready sets. */
bool sched_agent_is_ready(const sched *s, const registry_agent *a);
/* Could a take job (HEALTHY, serves job->model, meets its constraints:
 * labels, a strict prefer_agent, exclude_agent, tools, embeddings,
 * generation)? Readiness and free slots are not looked at. */
bool sched_agent_fits(const sched *s, const registry_agent *a, const sched_job *job);

/* ----------------------------------------------------------- inspection */

/* Weighted score of agent a for a decision (exposed for tests and the
 * admin API). best_tps: best tokens_per_sec among the candidates (<= 0 ->
 * speed term 0); affinity: a is the session's agent. */
double sched_agent_score(const sched *s, const registry_agent *a, double best_tps,
                         bool affinity, uint64_t now_ms);

/* Slot checkpoints in the prefix index (0: no agent advertises a prefix,
 * so a job's chain need not be computed). */
size_t sched_prefix_entries(const sched *s);

/* Agent id remembered for session (NULL when none or expired). */
const char *sched_affinity_get(sched *s, const char *session, uint64_t now_ms);

/* Drop expired affinity entries; amortised O(expired). Call from a timer. */
void sched_tick(sched *s, uint64_t now_ms);

/* Queue depth of model name (as requested) and priority. */
size_t sched_queue_depth(const sched *s, const char *model, sched_priority p);
/* Total queued jobs over all models. */
size_t sched_queued_total(const sched *s);

/* Call fn for each model queue that exists (depth may be 0). */
void sched_foreach_queue(const sched *s,
                         void (*fn)(void *ud, const char *model, size_t interactive,
                                    size_t batch),
                         void *ud);

/* Estimated queue wait for model (as requested): EWMA (alpha 0.2) of the
 * waits of jobs of that name recently taken from its queue; 0 when unknown.
 * A hint for Retry-After, not a promise. */
uint64_t sched_estimated_wait_ms(const sched *s, const char *model);

#endif
