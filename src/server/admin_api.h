/*
 * admin_api: the operator's API under /admin/ (gpupoolctl speaks it).
 *
 *   GET    /admin/keys[?role=R]          keys with limits and today's usage (never a hash)
 *   POST   /admin/keys                   create: 201 {id, key (shown once), role, ...}
 *   PATCH  /admin/keys/{id}              change rpm / tokens_per_day / max_concurrent
 *   DELETE /admin/keys/{id}              revoke (idempotent)
 *   GET    /admin/agents                 agents: state, GPUs, models, slots, last seen
 *   POST   /admin/agents/{id}/drain      drain ({"on": false} undrains)
 *   DELETE /admin/agents/{id}[?force=1]  forget an agent (409 AGENT_BUSY while it runs jobs)
 *   GET    /admin/jobs?status&model&agent&key&limit&before   the request log, newest first
 *   GET    /admin/jobs/{id}              one job: live when in memory, else from the store
 *   GET    /admin/status                 agents per state, slots, queues, throughput
 *   GET    /admin/deployments            deployed models, per replica state and progress
 *   POST   /admin/deployments            deploy {name, source, replicas, labels, sha256}
 *   GET    /admin/deployments/{name}     one deployment (refusals when short)
 *   PATCH  /admin/deployments/{name}     scale {"replicas": N}
 *   DELETE /admin/deployments/{name}     undeploy (its agents unload at their next poll)
 *
 * Every route wants an admin key (the http layer answers 401/403 first);
 * errors are native: {"error":{"code","message","correlation_id"}}. Times
 * are wall-clock milliseconds since the epoch, null for "never". The job
 * list reads SQLite on the store's DB thread (gps_store_jobs_list_async):
 * the loop never waits on it. docs/admin.md has examples.
 *
 * Request validation is factored into pure functions (below) so unit tests
 * reach it without a server.
 */
#ifndef GPS_ADMIN_API_H
#define GPS_ADMIN_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <jansson.h>

#include "server/auth/auth.h"
#include "server/http/http.h"
#include "server/jobs/jobs.h"
#include "server/auth/limits.h"
#include "server/fleet/registry.h"
#include "server/store/store.h"

#define GPS_ADMIN_JOBS_DEFAULT 50
#define GPS_ADMIN_JOBS_MAX 1000

/* ---- pure validation (exposed for tests) ----
 * Each returns 0, or -1 with a message in msg and *param naming the field
 * (static string) for a 400 INVALID_REQUEST. */

/* POST /admin/keys body -> spec. spec->name points into body (borrowed:
 * keep body alive while spec is used). expires_in_sec > 0 becomes
 * expires_at = now_wall_ms + 1000 * expires_in_sec. */
int gps_admin_parse_key_create(const json_t *body, int64_t now_wall_ms, gps_key_spec *spec,
                               char *msg, size_t msglen, const char **param);
/* PATCH /admin/keys/{id} body: the limits given replace those in *limits
 * (which holds the key's current ones); at least one must be given. */
int gps_admin_parse_limits(const json_t *body, gps_key_limits *limits, char *msg, size_t msglen,
                           const char **param);
/* GET /admin/jobs query string (may be NULL) -> filter. The filter's
 * strings are copied into buf (bufsize bytes), which must outlive it. */
int gps_admin_parse_job_query(const char *query, gps_store_job_filter *f, char *buf,
                              size_t bufsize, char *msg, size_t msglen, const char **param);

/* ---- throughput over the last 60 s (a ring of one-second samples) ---- */

#define GPS_ADMIN_RATE_SLOTS 61

typedef struct gps_admin_rate {
    uint64_t t_ms[GPS_ADMIN_RATE_SLOTS];   /* monotonic time of each sample */
    double requests[GPS_ADMIN_RATE_SLOTS]; /* cumulative counters at that time */
    double tokens[GPS_ADMIN_RATE_SLOTS];
    size_t head, n;
} gps_admin_rate;

/* Record cumulative counters at now_ms (call about once a second). */
void gps_admin_rate_push(gps_admin_rate *r, uint64_t now_ms, double requests, double tokens);
/* Rates between the oldest sample at most 60 s old and the given current
 * counters: requests per minute and tokens per second (0 when less than a
 * second of history). */
void gps_admin_rate_get(const gps_admin_rate *r, uint64_t now_ms, double requests, double tokens,
                        double *requests_per_min, double *tokens_per_sec);

/* ---- requests and errors per minute over the last hour (the dashboard's
 * sparklines): a ring of finished minutes plus the one in progress ---- */

#define GPS_ADMIN_HISTORY_MINUTES 60

typedef struct gps_admin_history {
    int64_t minute[GPS_ADMIN_HISTORY_MINUTES];     /* wall minute (ms / 60000) */
    double requests[GPS_ADMIN_HISTORY_MINUTES];    /* answered in that minute */
    double errors[GPS_ADMIN_HISTORY_MINUTES];      /* of which not ok */
    size_t head, n;
    int64_t cur_minute;                            /* the minute in progress, 0 = none yet */
    double cur_req0, cur_err0;                     /* cumulative counters at its start */
} gps_admin_history;

/* Feed cumulative counters at wall time now_wall_ms (call about once a
 * second): a new minute closes the previous one into the ring. */
void gps_admin_history_push(gps_admin_history *h, int64_t now_wall_ms, double requests,
                            double errors);
/* New reference: [{"t": wall ms of the minute, "requests", "errors"}...]
 * oldest first, ending with the minute in progress (counted up to the
 * given cumulative counters); minutes without traffic inside the hour are
 * present with zeros. */
json_t *gps_admin_history_json(const gps_admin_history *h, int64_t now_wall_ms,
                               double requests, double errors);


typedef struct gps_admin gps_admin;

/* What /admin/events sends each second (the dashboard): {"status": as GET
 * /admin/status, "agents": as GET /admin/agents' list, "history": as
 * gps_admin_history_json, "requests_total": cumulative}. New reference or
 * NULL (ENOMEM). */
json_t *gps_admin_snapshot(gps_admin *a);

/* ---- the module ---- */

/* Everything is borrowed and must outlive the admin object: auth, limits
 * (NULL: usage reads as zeros), reg, jobs (its scheduler and metrics are
 * used too), store (NULL: the job list answers 503). version is copied.
 * NULL on ENOMEM. */
gps_admin *gps_admin_new(struct event_base *base, gps_auth *auth, gps_limits *limits,
                         registry *reg, gps_jobs *jobs, gps_store *store, const char *version);
/* GET /admin/status (and the dashboard's status) gets "servers": what fn
 * returns (a new reference, whole, or NULL out of memory, which refuses the
 * status with a 500): the servers that share the database
 * (server/cluster.h gps_cluster_json). */
typedef json_t *(*gps_admin_servers_fn)(void *arg);
void gps_admin_set_servers_hook(gps_admin *a, gps_admin_servers_fn fn, void *arg);
/* Free after the HTTP server (a store read still pending finds its request
 * gone and frees itself). NULL is a no-op. */
void gps_admin_free(gps_admin *a);
/* Model pins (fleet/pins.h) for /admin/models/pins and agents' refusals;
 * borrowed, may be NULL (then those routes answer 503). */
struct gps_pins;
void gps_admin_set_pins(gps_admin *a, struct gps_pins *pins);
/* Deployments (fleet/deploy.h) for /admin/deployments; NULL: 503. */
struct gps_deploy;
void gps_admin_set_deploy(gps_admin *a, struct gps_deploy *deploy);
/* Called when POST /admin/keys turns auth on (the first key of a loopback
 * server that had none): it must leave the operator an admin key, writing
 * its path into path (pathlen bytes) and returning 0, or return -1 (then
 * the reply says how to make one). Borrowed; NULL: no hook. */
typedef int (*gps_admin_auth_on_fn)(void *arg, char *path, size_t pathlen);
void gps_admin_set_auth_on_hook(gps_admin *a, gps_admin_auth_on_fn fn, void *arg);
/* POST /admin/keys once its body is parsed (spec): makes the key and its
 * 201 reply (docs/admin.md), serialized. Returns the reply's text (the
 * caller sends it, then zeroes and frees it: it holds the raw key) with the
 * key live, or NULL (out of memory) with no key made: the raw key is shown
 * in this reply only, so a key whose reply failed would be live and held
 * by no one. by: the caller's key id, correlation_id: the request's (both
 * for the log, may be NULL). Where this key turns auth on, the auth-on
 * hook runs after the key is made. */
char *gps_admin_key_create(gps_admin *a, const gps_key_spec *spec, const char *by,
                           const char *correlation_id);
/* Add the admin routes. 0 or -1. */
int gps_admin_register(gps_http *h, gps_admin *a);

#endif
