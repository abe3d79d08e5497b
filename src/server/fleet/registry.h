/*
 * registry: the server's in-memory table of agents, their models, slots and
 * labels, the per-agent health state machine, and the model index.
 *
 * Pure data structure: no I/O, no libevent, no SQLite. Time is always passed
 * in (`now_ms`, monotonic milliseconds, e.g. gp_now_mono_ms()) so tests drive
 * a fake clock; the core calls registry_tick() from a timer (every second, or
 * at registry_next_deadline()). Not thread-safe: the event-loop thread owns it.
 *
 * Health state machine (docs/scheduling.md has the diagram):
 *
 *   (new) --poll--> REGISTERING --same poll--> HEALTHY
 *   HEALTHY/DRAINING --no poll for > poll_interval + grace--> SUSPECT
 *   any live state --registry_mark_suspect (parked long-poll closed)--> SUSPECT
 *   SUSPECT --no poll for >= agent_timeout (since last_seen)--> DEAD
 *   SUSPECT/DEAD/OFFLINE --poll--> HEALTHY (or DRAINING if draining);
 *                                  the weight then ramps 0 -> 1 over ramp_ms
 *   HEALTHY <--> DRAINING  admin (registry_set_drain) or agent status "draining"
 *   any --registry_deregister--> OFFLINE
 *
 * Only HEALTHY agents get new jobs. When an agent becomes DEAD the core fails
 * its in-flight jobs over. Every transition is reported once, synchronously,
 * to the listener given at creation (old and new state, a reason string):
 * that is where the core logs, persists, calls sched_agent_update() and, on
 * DEAD, fails jobs over. The listener must not call registry_remove() or
 * registry_destroy() (the agent is still being worked on).
 *
 * Expiry is O(1) per heartbeat and O(transitions) per tick: live agents sit
 * in a list ordered by last_seen (a heartbeat moves one to the tail), suspect
 * agents in a second list; tick only looks at the overdue heads.
 *
 * Model index: every name an agent serves (model id and each alias) maps to
 * the set of agents listing it, with a count of the agents that are "live"
 * (REGISTERING, HEALTHY, SUSPECT: may take work soon) and of those that take
 * tools for it (supports_tools). It is updated when a heartbeat's model list
 * differs from the previous one and on transitions.
 */
#ifndef GPS_REGISTRY_H
#define GPS_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/gp_prefix.h"
#include "server/fleet/hw_facts.h"

typedef enum registry_state {
    REGISTRY_REGISTERING = 0, /* first poll being processed (transient) */
    REGISTRY_HEALTHY,         /* takes new jobs */
    REGISTRY_SUSPECT,         /* missed a heartbeat or its long-poll dropped: no new jobs */
    REGISTRY_DEAD,            /* silent for agent_timeout: in-flight jobs fail over */
    REGISTRY_DRAINING,        /* alive, no new jobs, in-flight ones finish */
    REGISTRY_OFFLINE,         /* deregistered gracefully */
    REGISTRY_STATE_COUNT
} registry_state;

/* "registering", "healthy", ... (static string). */
const char *registry_state_name(registry_state s);

typedef struct registry_label {
    char *key;   /* owned by the containing struct */
    char *value;
} registry_label;

typedef struct registry_model_info {
    char *id;               /* public name clients use */
    char **aliases;         /* more names for it */
    size_t n_aliases;
    char *quantization;     /* may be NULL */
    char *architecture;     /* may be NULL */
    long long context_length;
    long long vram_bytes;
    long long bytes;
    bool loaded;
    bool supports_tools;    /* the agent takes OpenAI tools for it (fact, default false) */
    bool supports_embeddings; /* the agent computes embeddings for it (fact, default false) */
    bool embeddings_only;   /* an encoder (bert...): embeddings, no text generation (fact,
                               default false) */
    char *digest;           /* sha256 of the model file (64 lowercase hex), or NULL: agents
                               with equal digests continue each other's jobs from token ids */
} registry_model_info;

/* One slot's prompt-prefix cache, as an agent reports it (docs/protocol.md
 * "Prompt-prefix cache"). */
typedef struct registry_prefix_slot {
    int slot;
    bool busy;                  /* running a job now */
    long long tokens;           /* positions its KV sequence holds */
    gp_prefix_desc desc;        /* the prompt units held; kind "" = none advertised */
} registry_prefix_slot;

/* An agent's prompt-prefix cache facts: counters since the agent started,
 * and per slot what it holds. reported is false for agents without one
 * (openai backend, older agents). slots is owned by the struct. */
typedef struct registry_prefix {
    bool reported, enabled;
    long long lookups, hits, tokens_saved, tokens_computed;
    registry_prefix_slot *slots;
    size_t n_slots;
} registry_prefix;

/* What one POST /agents/poll reports (docs/protocol.md). All strings and
 * arrays are owned by the struct; registry_facts_free releases them. */
typedef struct registry_facts {
    char agent_id[37];
    char *name, *version, *platform;   /* NULL when absent */
    registry_model_info *models;
    size_t n_models;
    registry_label *labels;
    size_t n_labels;
    int slots_total;                   /* >= 1 */
    int slots_busy;
    int queue_depth;
    double kv_cache_utilization;
    bool draining;                     /* status == "draining" */
    registry_prefix prefix;            /* "prefix_cache" */
    hw_facts hw;                       /* backend, agent error, GPUs (hw_facts.h) */
    json_t *raw;                       /* the known fields kept (gps_agent_facts_kept) */
} registry_facts;

/* Validate and convert a /agents/poll body. body is borrowed (a reference
 * is taken for out->raw). Returns 0, or -1 with a message naming the field
 * in err (for a 400 INVALID_REQUEST). out must be freed with
 * registry_facts_free in both cases. Limits: at most 256 models, 64 aliases
 * per model, 64 labels; strings at most 256 bytes (4096 for labels' total). */
int registry_facts_parse(const json_t *body, registry_facts *out, char *err, size_t errlen);
void registry_facts_free(registry_facts *f);
/* Remove f->models[i] (freed; the ones after it move down). For a model
 * the server refuses before the heartbeat applies the facts (pins.h). */
void registry_facts_drop_model(registry_facts *f, size_t i);

/*
 * One agent. Fields are READ-ONLY outside registry.c (change them only
 * through the functions below). The pointer stays valid until
 * registry_remove() or registry_destroy(); transitions never free agents.
 */
typedef struct registry_agent {
    char id[37];
    char *name, *version, *platform;
    registry_model_info *models;
    size_t n_models;
    registry_label *labels;
    size_t n_labels;
    int slots_total;            /* reported */
    int slots_busy;             /* reported */
    int queue_depth;            /* reported */
    double kv_cache_utilization;/* reported */
    registry_prefix prefix;     /* reported prompt-prefix cache */
    hw_facts hw;                /* reported backend, agent error and GPUs */
    json_t *facts;              /* known fields of the last poll (gps_agent_facts_kept);
                                   NULL once dead or offline (until it polls again) */

    registry_state state;
    uint64_t last_seen_ms;      /* last heartbeat (or registry_touch) */
    uint64_t state_since_ms;    /* when state last changed */
    uint64_t registered_ms;     /* first poll */
    uint64_t ramp_start_ms;     /* recovery time; 0 = no ramp in progress */
    bool admin_drain;           /* set by registry_set_drain */
    bool agent_drain;           /* agent reported status "draining" */

    int active;                 /* jobs in flight (registry_job_begin/end) */
    uint64_t jobs_done;         /* ended ok */
    uint64_t jobs_failed;       /* ended with an error or lost */
    double tokens_per_sec;      /* EWMA of reported speed, 0 = unknown */
    uint32_t models_gen;        /* bumps whenever models or labels change */
    registry_model_info *models_before; /* the list a heartbeat replaced, kept until
                                   registry_models_dropped looks at it; NULL: none */
    size_t n_models_before;
    uint32_t prefix_gen;        /* bumps whenever a prefix_cache report arrives */

    void *sched_priv;           /* owned by the scheduler (sched.c) */
    char instance[65];          /* the agent process's instance id ("" = none sent:
                                   an older agent); see registry_note_instance */

    /* private to registry.c */
    struct registry_agent *lprev, *lnext;  /* live or suspect expiry list */
    int list_id;                           /* 0 none, 1 live, 2 suspect */
    bool in_index;                         /* counted as live in the model index */
} registry_agent;

typedef struct registry registry;

/* Called for each state change. reason: short stable token such as
 * "registered", "heartbeat", "missed_heartbeat", "poll_disconnected",
 * "timeout", "drain", "undrain", "deregistered", "reregistered". */
typedef void (*registry_listener_fn)(void *ud, registry_agent *a, registry_state old_state,
                                     registry_state new_state, const char *reason,
                                     uint64_t now_ms);

typedef struct registry_config {
    uint64_t poll_interval_ms;  /* heartbeat interval told to agents, default 15000 */
    uint64_t grace_ms;          /* lateness tolerated before SUSPECT, default 5000:
                                   agents poll interval after their last reply, so
                                   arrivals are spaced interval + RTT; without a grace
                                   every agent would flap. Tests use 0. */
    uint64_t agent_timeout_ms;  /* silence (since last_seen) before DEAD, default 90000 */
    uint64_t ramp_ms;           /* weight ramp after recovery, default 60000 */
    registry_listener_fn listener;  /* may be NULL */
    void *listener_ud;
} registry_config;

void registry_config_default(registry_config *c);

/* New registry (NULL on ENOMEM). cfg is copied. */
registry *registry_create(const registry_config *cfg);
/* Frees every agent. Destroy the scheduler first (it points at agents). */
void registry_destroy(registry *reg);

/* ---------------------------------------------------------------- agents */

/* Register (unknown id) or heartbeat an agent from a parsed poll. Takes
 * ownership of f's contents (f is left empty; registry_facts_free(f) stays
 * safe). wall_ms is the wall clock, used only as the `created` time of models
 * seen for the first time. Updates models, labels, slots, state (REGISTERING
 * -> HEALTHY for a new agent; SUSPECT/DEAD/OFFLINE -> HEALTHY with a ramp;
 * HEALTHY <-> DRAINING from status) and the model index.
 * Returns the agent, or NULL on ENOMEM. */
registry_agent *registry_heartbeat(registry *reg, registry_facts *f, uint64_t now_ms,
                                   int64_t wall_ms);

/* The names (ids and aliases) of the list a heartbeat replaced
 * (models_before, set when a heartbeat changed the list and the one it
 * replaced had models; the oldest not yet looked at is kept) that a's
 * list lacks now (tools_only false), or that a took tools for then and
 * lists now without tools (tools_only true: supports_tools dropped, only
 * jobs with tools lost an agent): fn is called once for each (a name
 * listed twice in the old list: once per listing), then the kept list is
 * freed. O(names of both lists); nothing when no heartbeat changed a's
 * list. fn must not call this again nor change a's models (no heartbeat
 * of a). */
typedef void (*registry_name_fn)(void *ud, registry_agent *a, const char *name,
                                 bool tools_only);
void registry_models_dropped(registry *reg, registry_agent *a, registry_name_fn fn, void *ud);

/* Refresh last_seen without new facts (e.g. on POST /agents/work). A SUSPECT
 * or DEAD agent is NOT revived by this: only a poll carries the facts needed. */
void registry_touch(registry *reg, registry_agent *a, uint64_t now_ms);

/* The agent's parked long-poll closed: HEALTHY/DRAINING/REGISTERING ->
 * SUSPECT at once (its last_seen is kept, so DEAD still comes agent_timeout
 * after the last poll). Returns true when the state changed. */
bool registry_mark_suspect(registry *reg, registry_agent *a, uint64_t now_ms,
                           const char *reason);

/* The agent process named by a request (protocol field `instance`: a
 * random id each agent process makes at start). NULL or "" (an older agent)
 * changes nothing. Returns true when instance replaces a different one seen
 * before: the agent restarted, so whatever was assigned to the old process
 * is gone. No state transition: the caller ends the old attempts. */
bool registry_note_instance(registry_agent *a, const char *instance);

/* Admin drain on/off. Draining: HEALTHY -> DRAINING; undrain: DRAINING ->
 * HEALTHY unless the agent itself reports draining. The flag survives
 * SUSPECT and re-registration. */
void registry_set_drain(registry *reg, registry_agent *a, bool on, uint64_t now_ms);

/* Graceful deregistration: -> OFFLINE, leaves the model index. */
void registry_deregister(registry *reg, registry_agent *a, uint64_t now_ms);

/* Forget an agent entirely (admin remove) and free it. Call
 * sched_agent_forget() first. No transition is reported. */
void registry_remove(registry *reg, registry_agent *a);

/* Lookup by agent_id; NULL when unknown. O(1). */
registry_agent *registry_get(const registry *reg, const char *agent_id);

/* Apply the expiry rules at time now: HEALTHY/DRAINING agents silent for
 * more than poll_interval + grace become SUSPECT, agents silent for at least
 * agent_timeout become DEAD (a HEALTHY agent silent that long goes through
 * SUSPECT first, both transitions reported). Returns the number of
 * transitions reported. */
size_t registry_tick(registry *reg, uint64_t now_ms);

/* Earliest time at which registry_tick could change something; UINT64_MAX
 * when nothing is pending. For arming a one-shot timer. */
uint64_t registry_next_deadline(const registry *reg);

/* Scheduling weight in [0,1]: 1, or during the ramp after a recovery
 * (now - ramp_start) / ramp_ms. */
double registry_agent_weight(const registry *reg, const registry_agent *a, uint64_t now_ms);

/* Laplace-smoothed success rate (done + 1) / (done + failed + 2), in (0,1). */
double registry_agent_reliability(const registry_agent *a);

/* True when the agent serves name (model id or alias). O(models). */
bool registry_agent_serves(const registry_agent *a, const char *name);

/* True when a serves name (id or alias) through a model whose facts say
 * supports_tools. O(models). */
bool registry_agent_takes_tools(const registry_agent *a, const char *name);
/* Does a compute embeddings for model name (id or alias): its facts say
 * supports_embeddings for it (embeddings jobs go only to such agents). */
bool registry_agent_takes_embeddings(const registry_agent *a, const char *name);
/* Does a generate text for model name: it serves it through a model that
 * is not embeddings_only (an encoder serves embeddings jobs only). */
bool registry_agent_generates(const registry_agent *a, const char *name);

/* Digest of the model a serves as name (id or alias), or NULL when a does
 * not serve it or reported no digest (openai backend, old agents). */
const char *registry_agent_model_digest(const registry_agent *a, const char *name);

/* Value of label key, or NULL. */
const char *registry_agent_label(const registry_agent *a, const char *key);

/* A job started on / ended on the agent. job_begin is called by the
 * scheduler for every assignment it makes; the core calls job_end exactly
 * once per assignment (finished, failed, cancelled, or failed over).
 * tokens_per_sec > 0 feeds the speed EWMA (alpha 0.3); ok=false counts a
 * failure (reliability). */
void registry_job_begin(registry *reg, registry_agent *a);
void registry_job_end(registry *reg, registry_agent *a, bool ok, double tokens_per_sec);
/* A job begun on a never reached it (the dispatch was called off: a
 * hand-off's offer is withdrawn first): active back, no outcome counted. */
void registry_job_undo(registry *reg, registry_agent *a);

/* Call fn for every agent (any state), in no particular order. fn must not
 * add or remove agents. */
void registry_foreach(const registry *reg, void (*fn)(void *ud, registry_agent *a), void *ud);

size_t registry_count(const registry *reg);
size_t registry_count_state(const registry *reg, registry_state s);

/* Slots as /metrics and /admin/status count them: only an agent that can
 * still run jobs (healthy, draining, suspect) has slots, and its busy count
 * is the larger of what it reported and what the server has assigned since
 * (a report lags an assignment by up to a poll). */
bool registry_agent_has_slots(const registry_agent *a);
int registry_agent_slots_busy(const registry_agent *a);

/* ----------------------------------------------------------- model index */

/* True when name (id or alias) was ever served by an agent since start-up
 * (or noted with registry_model_note): 503 vs 404 for a request. */
bool registry_model_known(const registry *reg, const char *name);
/* True when name is mi's id or one of its aliases. */
bool registry_model_info_named(const registry_model_info *mi, const char *name);

/* Number of live agents (REGISTERING, HEALTHY, SUSPECT) serving name now.
 * 0 -> NO_AGENT (503 or 404). O(1). */
size_t registry_model_live_count(const registry *reg, const char *name);

/* Of those, the live agents whose model facts for name say supports_tools:
 * where a job that carries tools can go. O(1). */
size_t registry_model_tools_count(const registry *reg, const char *name);

/* The smallest context length that the live agents (REGISTERING, HEALTHY,
 * SUSPECT) serving name report for it; 0 when none reports one. What a
 * prompt must fit wherever the job lands. O(agents). */
long long registry_model_min_context(const registry *reg, const char *name);

/* Slots of the HEALTHY agents serving name (an agent that reports none
 * counts one): how many of its jobs can run at once. O(agents). */
long long registry_model_slots(const registry *reg, const char *name);

/* Mark name as known with a creation time (e.g. restored from the store at
 * start-up). Returns 0 or -1 (ENOMEM). */
int registry_model_note(registry *reg, const char *name, int64_t created_wall_ms);

typedef struct registry_model_entry {
    const char *id;           /* borrowed, valid until the next registry call */
    int64_t created_wall_ms;  /* first seen */
    size_t live_agents;       /* HEALTHY/SUSPECT/REGISTERING agents listing it as id */
} registry_model_entry;

/* Distinct public model ids (aliases not included) currently served by at
 * least one live agent, sorted by id, for GET /v1/models: 0 with a malloc'd
 * array in *out (caller frees the array only; strings are borrowed; NULL
 * when none) and its length in *n, or -1 out of memory (an empty list
 * would tell the client the pool serves nothing). */
int registry_models_list(const registry *reg, registry_model_entry **out, size_t *n);

/* Calls fn for every model name (id or alias) known since start-up
 * (registry_model_known), with the live agents serving it now (0: requests
 * for it get 503 NO_AGENT). Unordered. For the per-model gauge of /metrics. */
void registry_models_foreach(const registry *reg,
                             void (*fn)(void *ud, const char *name, size_t live_agents),
                             void *ud);

/* For prefix-aware routing (the scheduler's side is a later issue): of
 * a's free slots, the one whose advertised prefix covers the most units of
 * a request's chain (gp_prefix_chain_of_job over the job the agent would
 * get). Returns the units matched (0: none) and, when > 0, the slot and
 * the positions it holds. O(slots x log units). */
/* A prefix_cache object reported outside a poll (the agent's
 * POST /agents/work body: fresh after each job, where polls come every
 * poll_interval). Validated as in a poll (slots bounded by the agent's
 * slots_total); replaces a->prefix and bumps prefix_gen. NULL/null: no
 * change. 0, or -1 with err (a->prefix unchanged). */
int registry_agent_set_prefix(registry_agent *a, const json_t *prefix_cache, char *err,
                              size_t errlen);

long registry_agent_prefix_match(const registry_agent *a, const gp_prefix_chain *req,
                                 int *slot, long long *tokens);

#endif
