/*
 * cluster: this server among the servers that share one database
 * (docs/scaling.md section 3, migration 0009).
 *
 *   announce   at start, a row in the servers table: a fresh id per
 *              process, name, advertised URL, pid, version, started_at;
 *   heartbeat  every heartbeat_ms the row's lease is renewed (one upsert
 *              through the store's queue, committed at once); after each
 *              renewal the servers list is re-read for /admin/status;
 *   lease      a server that has not renewed for lease_ms (the database is
 *              unreachable, or this process is cut off from it) stops
 *              admitting new work: gps_cluster_admit says no until a
 *              renewal commits again. Streams in flight go on; nothing
 *              needs a restart;
 *   refresh    every refresh_ms, keys (gps_auth_refresh) and today's usage
 *              (gps_limits_refresh) are re-read, so that what other
 *              servers changed takes effect here;
 *   stop       a clean shutdown marks the row stopped (queued write, in
 *              the final flush);
 *   orphans    with fail_orphans, every ORPHANS_EVERY renewals the
 *              unfinished OpenAI/Anthropic jobs of servers whose lease
 *              ended more than two leases ago are marked failed
 *              (SERVER_RESTART): their clients were on a server that is
 *              gone. A starting server no longer fails every unfinished
 *              job of a shared database (others may be running them).
 *
 * With SQLite there is one server: the row is kept (the status lists it),
 * lease_ms and refresh_ms are 0 (main decides) and nothing is refused.
 *
 * Threading: the loop thread. The store's callbacks come back on it.
 */
#ifndef GPS_CLUSTER_H
#define GPS_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>

#include <event2/event.h>
#include <jansson.h>

#include "server/auth/auth.h"
#include "server/auth/limits.h"
#include "server/store/store.h"

typedef struct gps_cluster gps_cluster;

typedef struct gps_cluster_opts {
    const char *name;      /* this server's name (copied); required */
    const char *url;       /* advertised URL (copied); NULL or "" = none */
    const char *version;   /* copied */
    int heartbeat_ms;      /* >= 100 */
    int lease_ms;          /* 0: never refuse new work */
    int refresh_ms;        /* 0: keys and usage are not re-read */
    bool fail_orphans;     /* fail the jobs of servers that are gone (shared DB) */
} gps_cluster_opts;

/* Announce this server and start the timers. store, auth and limits are
 * borrowed (auth, limits may be NULL) and must outlive the cluster, which
 * must also outlive the store's close (its callbacks run until then): free
 * it after gps_store_close. NULL on ENOMEM or when the first write cannot
 * be queued. */
gps_cluster *gps_cluster_start(struct event_base *base, gps_store *store, gps_auth *auth,
                               gps_limits *limits, const gps_cluster_opts *opts);
/* Clean shutdown: stop the timers and queue the "stopped" mark. */
void gps_cluster_stop(gps_cluster *c);
void gps_cluster_free(gps_cluster *c);

/* May this server admit new work now? 0: yes. Otherwise the seconds a
 * client should wait before trying again (>= 1), with the reason in msg. */
int gps_cluster_admit(gps_cluster *c, char *msg, size_t msglen);

/* This process's id in the servers table ("srv_" + 24 hex). */
const char *gps_cluster_id(const gps_cluster *c);

/* The servers as last read (new reference): {"self": id, "lease_ok": bool,
 * "servers": [{id, name, url, pid, version, started_at, heartbeat_at,
 * lease_until, stopped_at|null, state: alive|lease_expired|stopped,
 * self: bool}]}, states judged at the wall time now_ms. Whole or NULL
 * (out of memory): a server left out would read as gone. */
json_t *gps_cluster_json(gps_cluster *c, int64_t now_ms);

#endif
