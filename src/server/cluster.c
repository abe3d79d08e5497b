/* cluster: see cluster.h. */
#include "server/cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/timer.h"

/* Rows of servers whose lease ended this long ago go (every PURGE_EVERY
 * renewals): a restart leaves one row behind, the list must not grow. */
#define PURGE_AFTER_MS (24LL * 3600 * 1000)
#define PURGE_EVERY 100
/* Orphaned jobs are looked for every ORPHANS_EVERY renewals; a server is
 * gone ORPHAN_LEASES leases after its last renewal (a stalled one gets
 * that long to come back before its clients' rows are failed). */
#define ORPHANS_EVERY 5
#define ORPHAN_LEASES 2

struct gps_cluster {
    struct event_base *base;
    gps_store *store;
    gps_auth *auth;              /* may be NULL */
    gps_limits *limits;          /* may be NULL */
    char id[32];
    char *name, *url, *version;
    int64_t pid, started_at;
    int heartbeat_ms, lease_ms, refresh_ms;
    struct event *beat_timer, *refresh_timer;
    bool beat_in_flight, list_in_flight, orphans_in_flight;
    bool fail_orphans;
    uint64_t beat_sent_mono;     /* when the renewal in flight was queued */
    uint64_t lease_until_mono;   /* admit new work until then (lease_ms > 0) */
    bool lease_lost;             /* a renewal failed (logged once per loss) */
    bool refusing;               /* the lease expired: refusing (logged once) */
    bool stopped;
    unsigned beats;
    json_t *servers;             /* last list read: array of row objects */
};

static void list_done(void *arg, int status, const gps_store_server_row *rows, size_t n)
{
    gps_cluster *c = arg;
    c->list_in_flight = false;
    if (status != 0)
        return;
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        const gps_store_server_row *r = &rows[i];
        if (!r->id)
            continue;
        json_t *o = json_pack("{s:s,s:s?,s:s?,s:I,s:s?,s:I,s:I,s:I}", "id", r->id, "name",
                              r->name, "url", r->url, "pid", (json_int_t)r->pid, "version",
                              r->version, "started_at", (json_int_t)r->started_at,
                              "heartbeat_at", (json_int_t)r->heartbeat_at, "lease_until",
                              (json_int_t)r->lease_until);
        if (o)
            json_object_set_new(o, "stopped_at",
                                r->stopped_at ? json_integer(r->stopped_at) : json_null());
        if (!o || json_array_append_new(arr, o) != 0) {
            json_decref(arr);
            return;
        }
    }
    if (arr) {
        json_decref(c->servers);
        c->servers = arr;
    }
}

static void beat_done(void *arg, int status)
{
    gps_cluster *c = arg;
    c->beat_in_flight = false;
    if (status != 0) {
        if (!c->lease_lost)
            gp_log_write(GP_LOG_WARN, "server_heartbeat_failed", NULL,
                         json_pack("{s:s}", "server_id", c->id),
                         "cannot renew this server's lease in the database");
        c->lease_lost = true;
        return;
    }
    c->lease_until_mono = c->beat_sent_mono + (uint64_t)c->lease_ms;
    if (c->lease_lost)
        gp_log_write(GP_LOG_INFO, "server_lease_renewed", NULL,
                     json_pack("{s:s,s:b}", "server_id", c->id, "was_refusing", c->refusing),
                     "the database answers again: lease renewed%s",
                     c->refusing ? ", admitting new work again" : "");
    c->lease_lost = c->refusing = false;
    if (!c->list_in_flight && gps_store_servers_async(c->store, list_done, c) == 0)
        c->list_in_flight = true;
}

static void orphans_done(void *arg, int status, const gps_store_cells *res)
{
    gps_cluster *c = arg;
    c->orphans_in_flight = false;
    if (status == 0 && res && res->changes > 0)
        gp_log_write(GP_LOG_INFO, "jobs_orphaned", NULL,
                     json_pack("{s:s,s:I}", "server_id", c->id, "jobs", (json_int_t)res->changes),
                     "%lld unfinished requests of servers that are gone marked failed "
                     "(SERVER_RESTART)", (long long)res->changes);
}

/* Queue one renewal (none while one is in flight: a database that does
 * not answer must not pile them up). */
static int beat(gps_cluster *c)
{
    if (c->beat_in_flight || c->stopped)
        return 0;
    int64_t now = gp_now_wall_ms();
    /* lease_ms 0 (never refuse): still tell the others when to give up
     * on this row. */
    int64_t lease = c->lease_ms > 0 ? c->lease_ms : 5LL * c->heartbeat_ms;
    gps_store_server_row r = {.id = c->id, .name = c->name, .url = c->url,
                              .version = c->version, .pid = c->pid,
                              .started_at = c->started_at, .heartbeat_at = now,
                              .lease_until = now + lease};
    c->beat_sent_mono = gp_now_mono_ms();
    if (gps_store_server_beat_async(c->store, &r, beat_done, c) != 0)
        return -1;
    c->beat_in_flight = true;
    if (++c->beats % PURGE_EVERY == 1)
        gps_store_server_purge(c->store, now - PURGE_AFTER_MS);
    if (c->fail_orphans && !c->orphans_in_flight && c->beats % ORPHANS_EVERY == 0 &&
        gps_store_jobs_fail_orphans_async(c->store, now, now - ORPHAN_LEASES * lease,
                                          orphans_done, c) == 0)
        c->orphans_in_flight = true;
    return 0;
}

static void beat_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    beat(arg);
}

static void refresh_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gps_cluster *c = arg;
    if (c->auth)
        gps_auth_refresh(c->auth);
    if (c->limits)
        gps_limits_refresh(c->limits, gp_now_wall_ms());
}

gps_cluster *gps_cluster_start(struct event_base *base, gps_store *store, gps_auth *auth,
                               gps_limits *limits, const gps_cluster_opts *opts)
{
    gps_cluster *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->base = base;
    c->store = store;
    c->auth = auth;
    c->limits = limits;
    memcpy(c->id, "srv_", 4);
    gp_random_hex(c->id + 4, 12);
    c->name = strdup(opts->name ? opts->name : "");
    c->url = opts->url && *opts->url ? strdup(opts->url) : NULL;
    c->version = strdup(opts->version ? opts->version : "");
    c->pid = (int64_t)getpid();
    c->started_at = gp_now_wall_ms();
    c->heartbeat_ms = opts->heartbeat_ms >= 100 ? opts->heartbeat_ms : 100;
    c->lease_ms = opts->lease_ms > 0 ? opts->lease_ms : 0;
    c->refresh_ms = opts->refresh_ms > 0 ? opts->refresh_ms : 0;
    c->fail_orphans = opts->fail_orphans && gps_store_has_job_owners(store);
    /* The database answered at open (migrations ran): the lease starts
     * now, before the announce commits. */
    c->lease_until_mono = gp_now_mono_ms() + (uint64_t)c->lease_ms;
    c->servers = json_array();
    if (!c->name || !c->version || (opts->url && *opts->url && !c->url) || !c->servers)
        goto fail;
    if (!gps_store_has_servers(store)) {
        /* A schema from a custom migrations_dir: no row, no lease. */
        gp_log_warn("servers_table_missing",
                    "this database has no servers table: this server is not announced and "
                    "its lease is not enforced");
        c->lease_ms = 0;
        c->stopped = true;
        return c;
    }
    if (beat(c) != 0)
        goto fail;
    if (!(c->beat_timer = gps_timer_every(base, c->heartbeat_ms, beat_tick, c)))
        goto fail;
    if (c->refresh_ms && !(c->refresh_timer = gps_timer_every(base, c->refresh_ms, refresh_tick, c)))
        goto fail;
    gp_log_write(GP_LOG_INFO, "server_announced", NULL,
                 json_pack("{s:s,s:s,s:i,s:i}", "server_id", c->id, "name", c->name,
                           "lease_ms", c->lease_ms, "refresh_ms", c->refresh_ms),
                 "this server is %s in the servers table", c->id);
    return c;
fail:
    /* A renewal already queued calls back into c: after ENOMEM on a timer,
     * c is leaked rather than freed under that pending callback. */
    if (c->beat_in_flight)
        return NULL;
    gps_cluster_free(c);
    return NULL;
}

void gps_cluster_stop(gps_cluster *c)
{
    if (!c || c->stopped)
        return;
    c->stopped = true;
    if (c->beat_timer)
        event_del(c->beat_timer);
    if (c->refresh_timer)
        event_del(c->refresh_timer);
    gps_store_server_stop(c->store, c->id, gp_now_wall_ms());
}

void gps_cluster_free(gps_cluster *c)
{
    if (!c)
        return;
    if (c->beat_timer)
        event_free(c->beat_timer);
    if (c->refresh_timer)
        event_free(c->refresh_timer);
    json_decref(c->servers);
    free(c->name);
    free(c->url);
    free(c->version);
    free(c);
}

static bool lease_ok(const gps_cluster *c, uint64_t now_mono)
{
    return c->lease_ms == 0 || now_mono < c->lease_until_mono;
}

int gps_cluster_admit(gps_cluster *c, char *msg, size_t msglen)
{
    uint64_t now = gp_now_mono_ms();
    if (!c || lease_ok(c, now))
        return 0;
    if (!c->refusing)
        gp_log_write(GP_LOG_ERROR, "server_lease_expired", NULL,
                     json_pack("{s:s,s:i}", "server_id", c->id, "lease_ms", c->lease_ms),
                     "no lease renewal for %d ms: refusing new work until the database "
                     "answers again", c->lease_ms);
    c->refusing = true;
    snprintf(msg, msglen,
             "this server cannot reach its database (lease expired %llu ms ago): it admits no "
             "new work until the database answers again; retry, here or on another server",
             (unsigned long long)(now - c->lease_until_mono));
    int sec = (c->heartbeat_ms + 999) / 1000;
    return sec >= 1 ? sec : 1;
}

const char *gps_cluster_id(const gps_cluster *c) { return c ? c->id : ""; }

json_t *gps_cluster_json(gps_cluster *c, int64_t now_ms)
{
    bool ok = lease_ok(c, gp_now_mono_ms());
    json_t *arr = json_array();
    size_t i;
    json_t *row;
    json_array_foreach(c->servers, i, row)
    {
        json_t *o = arr ? json_deep_copy(row) : NULL;
        if (!o)
            goto oom;
        const char *id = json_string_value(json_object_get(o, "id"));
        bool self = id && strcmp(id, c->id) == 0;
        json_int_t lease = json_integer_value(json_object_get(o, "lease_until"));
        const char *state = !json_is_null(json_object_get(o, "stopped_at")) ? "stopped"
                            : self ? (ok ? "alive" : "lease_expired")
                            : lease > now_ms ? "alive"
                                             : "lease_expired";
        /* (each takes its value; the append takes o, added or not) */
        int bad = json_object_set_new(o, "state", json_string(state)) < 0;
        bad += json_object_set_new(o, "self", json_boolean(self)) < 0;
        if (json_array_append_new(arr, o) < 0 || bad)
            goto oom;
    }
    return json_pack("{s:s,s:b,s:o}", "self", c->id, "lease_ok", ok, "servers", arr);
oom:
    json_decref(arr);
    return NULL;
}
