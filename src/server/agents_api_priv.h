/*
 * agents_api_priv.h: what the files of the agents' protocol share
 * (agents_api.c lists them). Private to those files: the rest of the server
 * sees agents_api.h only.
 */
#ifndef GPS_AGENTS_API_PRIV_H
#define GPS_AGENTS_API_PRIV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/http.h>

#include "server/agents_api.h"
#include "server/fleet/deploy.h"
#include "server/fleet/pins.h"
#include "server/http/held.h"
#include "server/metrics.h"
#include "server/fleet/gps_strmap.h"
#include "server/http/http.h"

/* Per-agent state of this module (not the registry's): the parked
 * long-poll and what was last persisted. */
typedef struct agent_ext {
    gps_agents *g;
    char id[37];
    struct evhttp_request *parked;      /* NULL when none */
    gps_held held;                /* the parked request (held.h) */
    struct event *timer;
    int free_slots;
    char park_cid[65];                  /* correlation id of the parked request */
    char key_id[65];                    /* key of the agent's last poll/work ("" = auth off) */
    uint32_t persisted_models_gen;
    bool persisted_once;
    struct event *grace;                /* parked long-poll closed with jobs assigned:
                                           ends their attempts unless the agent re-parks */
    bool lost_pending;                  /* deferred failover queued */
    bool kick_pending;                  /* deferred dispatch queued */
    bool leave_pending;                 /* deferred move of its models' queued jobs
                                           to their fallbacks (it drains) */
} agent_ext;

struct gps_agents {
    struct event_base *base;
    gps_agents_opts opts;
    struct gps_store *store;
    gps_metrics *metrics;
    gps_metrics *collect_m;        /* during gps_agents_collect only */
    registry *reg;
    sched *sched;
    gps_jobs *jobs;
    struct gps_auth *auth;
    gps_pins *pins;                     /* model attestation; NULL: none */
    gps_deploy *deploy;                 /* deployments; NULL: none */
    uint64_t deploy_next_ms;            /* next reconcile from the tick */
    smap ext;                           /* agent id -> agent_ext */
    struct event *tick;
    struct event *deferred;             /* runs failovers/kicks outside callbacks */
    size_t nparked;                     /* parked long-polls asking for work */
    size_t nliveness;                   /* parked free_slots 0 long-polls (busy agents) */
    char epoch[17];                     /* this process's random id: delivery tokens */
    uint64_t deliveries;                /* work replies with jobs sent so far */
};
typedef struct liveness {
    const char *instance;    /* NULL: an older agent */
    const json_t *running;   /* running_jobs, NULL when absent */
    uint64_t seen;           /* delivery_seen of this server process, 0 = none */
} liveness;

/* long-polls, handlers (agents_api.c) */
agent_ext *agents_ext_get(gps_agents *g, const char *id, bool create);
void agents_unpark(agent_ext *e);
/* 0: the reply went out with the jobs; -1: answered 500 instead (jobs
 * NULL, or out of memory): the agent polls again, the jobs never reached it. */
int agents_reply_jobs(gps_agents *g, agent_ext *e, struct evhttp_request *req,
                      const gp_buf *jobs, uint64_t n);
void agents_reply_204(struct evhttp_request *req);
bool agents_key_allows(gps_agents *g, gps_req *r, const char *agent_id);

/* liveness, transitions, persistence (agents_api_live.c) */
void agents_await_repark(gps_agents *g, agent_ext *e);
bool agents_instance_ok(const char *s, size_t n);
bool agents_liveness_parse(gps_agents *g, gps_req *r, const json_t *body, liveness *out);
void agents_liveness_apply(gps_agents *g, registry_agent *a, const liveness *lv);
void agents_park_gone(void *arg);
long long agents_deliver_cb(registry_agent *a, const gp_buf *jobs, void *arg);
void agents_dispatch_parked(gps_agents *g, agent_ext *e);
void agents_deferred_cb(evutil_socket_t fd, short what, void *arg);
void agents_tick_cb(evutil_socket_t fd, short what, void *arg);
void agents_persist_agent(gps_agents *g, registry_agent *a, agent_ext *e, const char *key_id);

/* event uploads (agents_api_events.c) */
void agents_h_events(gps_req *r, void *arg);
void agents_h_events_batch(gps_req *r, void *arg);

/* enrollment (agents_api_enroll.c) */
void agents_h_check(gps_req *r, void *arg);
void agents_h_enroll(gps_req *r, void *arg);

#endif
