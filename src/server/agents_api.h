/*
 * agents_api: the agent protocol endpoints (docs/protocol.md).
 *
 *   POST /agents/enroll              enrollment token -> the agent's own key
 *   POST /agents/poll                register + heartbeat (idempotent)
 *   POST /agents/work                long-poll for jobs (held work_wait_sec)
 *   POST /agents/jobs/{id}/events    event upload; reply {"cancel": bool}
 *   POST /agents/deregister          a clean stop: the agent goes offline
 *   POST /agents/check               is this agent key / enrollment token good?
 *
 * It also owns the agents' side of the loop: the parked long-polls (one per
 * agent), the registry expiry timer, the reaction to registry transitions
 * (log, persist, scheduler update, failover of a dead agent's jobs) and the
 * delivery of jobs the scheduler assigns to a parked agent.
 *
 * Revoked agent keys: gps_agents_set_auth installs the auth module's
 * revocation listener. When a key is revoked (admin API, CLI + SIGHUP
 * reload), every parked long-poll authenticated by it is answered at once
 * with 401 KEY_REVOKED, and each agent whose last request used that key is
 * deregistered (OFFLINE): it gets no new work and its running jobs fail over
 * like those of an agent that left (it could not upload their events any
 * more anyway).
 */
#ifndef GPS_AGENTS_API_H
#define GPS_AGENTS_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <jansson.h>

#include "server/http/http.h"
#include "server/jobs/jobs.h"
#include "server/fleet/registry.h"
#include "server/fleet/sched.h"

struct gps_store;
struct gps_metrics;

typedef struct gps_agents gps_agents;

typedef struct gps_agents_opts {
    int poll_interval_sec;
    int work_wait_sec;
    int agent_timeout_sec;
    /* An agent that sends an `instance` and whose parked long-poll closes
     * while jobs are assigned to it loses those attempts after this many
     * ms, unless a new long-poll from it arrives first (docs/protocol.md
     * "Liveness"). 0 = the default, 1000. */
    int disconnect_grace_ms;
    /* Agents the registry holds at most (any state): a poll from a new
     * agent_id beyond it is refused (503 AGENT_LIMIT) until an admin
     * removes some. 0 = the default, 1024. */
    int max_agents;
} gps_agents_opts;

/* Create the agents side. reg/sched/jobs are attached afterwards with
 * gps_agents_attach because the registry needs the listener (below) at
 * creation. store and metrics may be NULL. */
gps_agents *gps_agents_new(struct event_base *base, const gps_agents_opts *opts,
                           struct gps_store *store, struct gps_metrics *metrics);
/* Attach the registry, scheduler and jobs; installs the jobs' deliver
 * callback and starts the expiry timer. 0 or -1. */
int gps_agents_attach(gps_agents *g, registry *reg, sched *s, gps_jobs *jobs);
struct gps_auth;
/* Agent keys get bound to the first agent_id they poll with (may be NULL:
 * no binding, e.g. auth off). Also enables POST /agents/enroll and installs
 * the revocation listener (the auth object, borrowed, must outlive g). */
void gps_agents_set_auth(gps_agents *g, struct gps_auth *auth);
/* Answer every parked long-poll with 204 (shutdown). */
void gps_agents_release_all(gps_agents *g);
/* Model pins applied to every poll's facts (fleet/pins.h); borrowed, may
 * be NULL (no attestation). */
struct gps_pins;
void gps_agents_set_pins(gps_agents *g, struct gps_pins *pins);
/* Deployments (fleet/deploy.h): polls report to it and their replies carry
 * the agent's desired models; the tick reconciles. May be NULL (none). */
struct gps_deploy;
void gps_agents_set_deploy(gps_agents *g, struct gps_deploy *deploy);
void gps_agents_free(gps_agents *g);

/* Registry listener (pass with g as ud to registry_create). */
void gps_agents_on_transition(void *ud, registry_agent *a, registry_state old_state,
                              registry_state new_state, const char *reason, uint64_t now_ms);

/* Routes on h. */
int gps_agents_register(gps_http *h, gps_agents *g);
/* Metrics collector part: agents per state, slots. */
void gps_agents_collect(gps_agents *g, struct gps_metrics *m);
/* Validate a POST /agents/enroll body: "agent_id" (required) a UUID string
 * (what /agents/poll accepts), "name" (optional) a string of at most 256
 * bytes without control characters. 0 with borrowed pointers into body
 * (*name is "" when absent), or -1 with a message in err and the offending
 * field in *param. */
int gps_agents_enroll_parse(const json_t *body, const char **agent_id, const char **name,
                            const char **param, char *err, size_t errlen);

/* Number of parked long-polls (tests, status). */
size_t gps_agents_parked(const gps_agents *g);

/* The parked long-poll of agent_id closed under it (the peer went away):
 * the agent becomes suspect and, when it sent an `instance` and has jobs
 * assigned, their attempts end disconnect_grace_ms later unless
 * gps_agents_poll_reopened (a new /agents/work from it) comes first. The
 * HTTP layer calls these; they are public for the unit tests. */
void gps_agents_poll_closed(gps_agents *g, const char *agent_id);
void gps_agents_poll_reopened(gps_agents *g, const char *agent_id);

#endif
