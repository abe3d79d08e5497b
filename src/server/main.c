/*
 * gpupool-server: the control plane and the relay.
 *
 *   gpupool-server [--listen HOST:PORT] [--db PATH] [--config FILE] [options]
 *   gpupool-server keys create --role client|agent|admin|enrollment --db PATH [...]
 *   gpupool-server keys revoke ID --db PATH
 *
 * One thread runs the libevent loop (HTTP, timers, signals); the store's
 * DB thread owns SQLite writes. Start-up: config -> store (migrations) ->
 * keys -> registry/scheduler/jobs -> routes -> listen. SIGTERM: stop
 * accepting, refuse new client requests, let running jobs finish for up to
 * shutdown_grace_sec, flush the DB, exit 0. SIGHUP reloads keys and the
 * TLS certificate/key.
 *
 * Listeners: `listen` (HTTP, may be "none") and `listen_tls` (HTTPS with
 * tls_cert/tls_key); both serve the same routes. Auth is forced on when
 * either is not loopback. --port-file receives the HTTP port (the HTTPS
 * port when there is no HTTP listener); --tls-port-file the HTTPS port.
 * metrics_listen adds a third listener that serves only /metrics and
 * /health (--metrics-port-file); /metrics then leaves the other two.
 */
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/event.h>
#include <event2/http.h>
#include <event2/buffer.h>
#include <event2/keyvalq_struct.h>
#include <sqlite3.h>

#include <gpupool/engine.h>

#include "common/gp_config.h"
#include "common/gp_json.h"
#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/fleet/pins.h"
#include "server/fleet/deploy.h"
#include "server/admin_api.h"
#include "server/cluster.h"
#include "server/handoff.h"
#include "server/dashboard/dashboard.h"
#include "server/agents_api.h"
#include "server/dialects/api_anthropic.h"
#include "server/dialects/api_embeddings.h"
#include "server/dialects/api_tasks.h"
#include "server/dialects/api_responses.h"
#include "server/dialects/api_openai.h"
#include "server/auth/auth.h"
#include "server/http/evmem.h"
#include "server/http/http.h"
#include "server/jobs/jobs.h"
#include "server/auth/limits.h"
#include "server/memstat.h"
#include "server/metrics.h"
#include "server/dialects/resp_state.h"
#include "server/http/sse.h"
#include "server/fleet/registry.h"
#include "server/dialects/relay.h"
#include "server/fleet/sched.h"
#include "server/server_config.h"
#include "server/store/store.h"
#include "server/stream/stream.h"
#include "server/http/tls.h"

#define SERVER_VERSION "0.1.0"
#define TRIM_INTERVAL_SEC 10 /* heap_trim_bytes is checked this often */

typedef struct server {
    gps_config cfg;
    struct event_base *base;
    gps_store *store;
    char db_label[512];          /* cfg.db for logs: a URI without its password */
    gps_auth *auth;
    gps_limits *limits;         /* per-key rate, tokens and concurrency */
    gps_metrics *metrics;
    registry *reg;
    sched *sched;
    gps_jobs *jobs;
    gps_agents *agents;
    gps_pins *pins;             /* model attestation (operator pins) */
    gps_deploy *deploy;         /* models deployed from the server */
    gps_relay_ctx *relay;         /* the OpenAI and Anthropic handlers' context */
    gps_tasks *tasks;
    gps_admin *admin;
    gps_dashboard *dashboard;
    gps_http *http;
    gps_http *metrics_http;     /* metrics_listen: /metrics and /health only */
    gps_resp_state *resp_state; /* stored Responses */
    gps_responses *responses;   /* the Responses routes' context */
    gps_tls *tls;               /* NULL without listen_tls */
    gps_cluster *cluster;       /* this server in the servers table, its lease */
    gps_handoff *handoff;       /* jobs handed to other servers (shared DB only) */
    struct event *sig_term, *sig_int, *sig_hup, *shutdown_timer, *purge_timer, *trim_timer;
    bool shutting_down;
    uint64_t shutdown_deadline_ms;
    char *host, *tls_host;      /* listen and listen_tls (NULL when not set) */
    int port, tls_port;         /* as configured (0: any) */
    int bound, tls_bound;       /* as bound */
    gps_http_opts hopts;        /* the main listener's, also the metrics listener's */
} server;

/* ------------------------------------------------------------------ */
/* keys subcommand                                                     */
/* ------------------------------------------------------------------ */

static const char keys_usage[] =
    "usage: gpupool-server keys create --role client|agent|admin|enrollment --db PATH|URI\n"
    "           [--name NAME] [--expires-in-sec N] [--rpm N] [--tokens-per-day N]\n"
    "           [--max-concurrent N] [--max-uses N]\n"
    "       gpupool-server keys revoke ID --db PATH|URI\n"
    "(PATH: a SQLite file; URI: postgresql://USER[:PASS]@HOST[:PORT]/DB; default $GPUPOOL_DB)\n"
    "(on a running server prefer gpupoolctl; a running server sees CLI changes after SIGHUP)\n";

/* A non-negative integer option value; -1 when it is not one. */
static long long keys_num(const char *opt, const char *v)
{
    char *end = NULL;
    errno = 0;
    long long n = v ? strtoll(v, &end, 10) : -1;
    if (!v || !*v || *end || errno || n < 0) {
        fprintf(stderr, "gpupool-server keys: invalid value '%s' for '%s' (expected a "
                        "non-negative integer)\n", v ? v : "", opt);
        return -1;
    }
    return n;
}

static int keys_main(int argc, char **argv)
{
    bool create = argc >= 3 && strcmp(argv[2], "create") == 0;
    bool revoke = argc >= 3 && strcmp(argv[2], "revoke") == 0;
    if (!create && !revoke) {
        fputs(keys_usage, stderr);
        return 2;
    }
    const char *role = NULL, *db = NULL, *name = "", *mig = NULL, *revoke_id = NULL;
    const char *nums[6] = {NULL};
    static const char *const num_opts[6] = {"--expires-in-sec", "--rpm", "--tokens-per-day",
                                            "--max-concurrent", "--max-uses", NULL};
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i];
        if (revoke && a[0] != '-' && !revoke_id) {
            revoke_id = a;
            continue;
        }
        const char **dst = strcmp(a, "--db") == 0               ? &db
                           : strcmp(a, "--migrations_dir") == 0 ? &mig
                           : !create                            ? NULL
                           : strcmp(a, "--role") == 0           ? &role
                           : strcmp(a, "--name") == 0           ? &name
                                                                : NULL;
        for (int k = 0; create && !dst && num_opts[k]; k++)
            if (strcmp(a, num_opts[k]) == 0)
                dst = &nums[k];
        if (!dst) {
            fprintf(stderr, "gpupool-server keys %s: unknown option '%s'\n", argv[2], a);
            fputs(keys_usage, stderr);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "gpupool-server keys %s: option '%s' needs a value\n", argv[2], a);
            return 2;
        }
        *dst = argv[++i];
    }
    if (!db)
        db = getenv("GPUPOOL_DB");
    char err[512];
    if (revoke) {
        if (!revoke_id || !db) {
            fprintf(stderr, "gpupool-server keys revoke: an ID and --db are required\n");
            return 2;
        }
        int rc = gps_auth_key_revoke_db(db, mig, revoke_id, err, sizeof err);
        if (rc < 0) {
            fprintf(stderr, "gpupool-server keys revoke: %s\n", err);
            return 1;
        }
        if (rc == 1) {
            fprintf(stderr, "gpupool-server keys revoke: no active key '%s'\n", revoke_id);
            return 1;
        }
        fprintf(stderr, "revoked %s\n", revoke_id);
        return 0;
    }
    if (!role || !db) {
        fprintf(stderr, "gpupool-server keys create: --role and --db are required\n");
        return 2;
    }
    int r = gps_key_role_parse(role);
    if (r < 0) {
        fprintf(stderr, "gpupool-server keys create: invalid value '%s' for 'role' "
                        "(expected client, agent, admin or enrollment)\n", role);
        return 2;
    }
    long long v[5] = {0};
    for (int k = 0; k < 5; k++)
        if (nums[k] && (v[k] = keys_num(num_opts[k], nums[k])) < 0)
            return 2;
    gps_key_spec spec = {
        .role = (gps_key_role)r,
        .name = name,
        .expires_at = v[0] ? gp_now_wall_ms() + v[0] * 1000 : 0,
        .limits = {.rpm = v[1], .tokens_per_day = v[2], .max_concurrent = v[3]},
        .max_uses = v[4],
    };
    if (!nums[4] && spec.role == GPS_KEY_ENROLLMENT)
        spec.max_uses = GPS_ENROLL_DEFAULT_MAX_USES;
    char key[GPS_AUTH_KEY_LEN + 1], id[GPS_AUTH_ID_LEN + 1];
    if (gps_auth_key_create_spec_db(db, mig, &spec, key, id, err, sizeof err) < 0) {
        fprintf(stderr, "gpupool-server keys create: %s\n", err);
        return 1;
    }
    /* The raw key goes to stdout alone (scripts capture it); it is shown
     * this once and never stored. */
    printf("%s\n", key);
    fprintf(stderr, "created %s key %s (name '%s'); store it now, it will not be shown again\n",
            role, id, name);
    return 0;
}

/* ------------------------------------------------------------------ */
/* The generated admin key                                             */
/* ------------------------------------------------------------------ */

static void admin_key_usable(void *arg, const gps_auth_key *k)
{
    int64_t now = gp_now_wall_ms();
    if (k->role == GPS_KEY_ADMIN && !k->revoked_at && !(k->expires_at && now >= k->expires_at))
        *(bool *)arg = true;
}

/* With auth on and no usable admin key, nobody could ever manage the
 * server over the API: make one and leave it, 0600, in the state dir for
 * gpupoolctl and the operator. With auth off (loopback, no keys) nothing
 * is made: an admin key would itself turn auth on. */
static int ensure_admin_key_at(server *s, const char *why, char *path, size_t pathlen)
{
    if (!gps_auth_enabled(s->auth))
        return -1;
    bool have = false;
    gps_auth_key_foreach(s->auth, admin_key_usable, &have);
    if (have)
        return -1;
    char dir[1024];
    int rc = -1;
    if (s->cfg.state_dir && *s->cfg.state_dir) {
        snprintf(dir, sizeof dir, "%s", s->cfg.state_dir);
    } else if (!gps_store_db_is_file(s->cfg.db)) {
        /* A database URI has no directory: systemd's state directory (the
         * first of STATE_DIRECTORY's), else the working directory. */
        const char *sd = getenv("STATE_DIRECTORY");
        if (sd && *sd)
            snprintf(dir, sizeof dir, "%.*s", (int)strcspn(sd, ":"), sd);
        else
            snprintf(dir, sizeof dir, ".");
    } else {
        /* The db's directory. */
        snprintf(dir, sizeof dir, "%s", s->cfg.db);
        char *slash = strrchr(dir, '/');
        if (slash)
            *(slash == dir ? slash + 1 : slash) = '\0';
        else
            snprintf(dir, sizeof dir, ".");
    }
    snprintf(path, pathlen, "%s/admin.key", dir);
    char key[GPS_AUTH_KEY_LEN + 1], id[GPS_AUTH_ID_LEN + 1], line[GPS_AUTH_KEY_LEN + 2];
    gps_key_spec spec = {.role = GPS_KEY_ADMIN, .name = why};
    if (gps_auth_key_create_spec(s->auth, &spec, key, id) != 0) {
        gp_log_error("admin_key_failed", "could not create the admin key (out of memory)");
        return -1;
    }
    int n = snprintf(line, sizeof line, "%s\n", key);
    if (gp_mkdirs(dir, 0700) < 0 || gp_write_file_atomic(path, line, (size_t)n, 0600) < 0) {
        int e = errno;
        gps_auth_key_revoke(s->auth, id);
        gp_log_write(GP_LOG_ERROR, "admin_key_failed", NULL,
                     json_pack("{s:s}", "path", path),
                     "cannot write the admin key to %s: %s; create one with "
                     "`gpupool-server keys create --role admin --db %s`",
                     path, strerror(e), s->db_label);
    } else {
        gp_log_write(GP_LOG_WARN, "admin_key_generated", NULL,
                     json_pack("{s:s,s:s}", "path", path, "key_id", id),
                     "auth is on and no admin key existed: created %s, written to %s (mode "
                     "0600); gpupoolctl reads it from /var/lib/gpupool/admin.key, from "
                     "$GPUPOOL_STATE_DIR/admin.key or with --key-file",
                     id, path);
        rc = 0;
    }
    memset(key, 0, sizeof key);
    memset(line, 0, sizeof line);
    return rc;
}

static void ensure_admin_key(server *s)
{
    char path[1100];
    (void)ensure_admin_key_at(s, "generated at first start", path, sizeof path);
}

/* gps_admin's hook: POST /admin/keys turned auth on. */
static int admin_auth_on(void *arg, char *path, size_t pathlen)
{
    return ensure_admin_key_at(arg, "generated when the first key turned auth on", path,
                               pathlen);
}

/* ------------------------------------------------------------------ */
/* Auth hook, health, metrics                                          */
/* ------------------------------------------------------------------ */

static int auth_hook(void *arg, const char *cred, gps_role role, char key_id[65],
                     const char *client)
{
    server *s = arg;
    key_id[0] = '\0';
    gps_key_role want = role == GPS_ROLE_AGENT   ? GPS_KEY_AGENT
                        : role == GPS_ROLE_ADMIN ? GPS_KEY_ADMIN
                                                 : GPS_KEY_CLIENT;
    const gps_auth_key *k = NULL;
    gps_auth_result r = gps_auth_check(s->auth, cred, want, &k);
    if (r == GPS_AUTH_OK) {
        if (k)
            snprintf(key_id, 65, "%s", k->id);
        return 0;
    }
    char l[64];
    gps_metrics_label(l, sizeof l, "reason", gps_auth_result_name(r), (char *)NULL);
    gps_metrics_add(s->metrics, "auth_failures_total", l, 1);
    gp_log_write(GP_LOG_WARN, "auth_failed", NULL,
                 json_pack("{s:s,s:s,s:s}", "reason", gps_auth_result_name(r), "key_id",
                           k ? k->id : "", "client", client ? client : "?"),
                 "request refused (client %s)", client ? client : "?");
    return gps_auth_result_status(r);
}

/* Home mode: auth off (loopback listeners, no key). */
static bool home_hook(void *arg)
{
    server *s = arg;
    return !gps_auth_enabled(s->auth);
}

static void h_health(gps_req *r, void *arg)
{
    server *s = arg;
    char msg[300] = "";
    bool db_ok = gps_store_healthy(s->store, msg, sizeof msg);
    /* A server that lost its lease on the database refuses new work: a
     * balancer's health check should send clients elsewhere. */
    bool lease_ok = db_ok && gps_cluster_admit(s->cluster, msg, sizeof msg) == 0;
    db_ok = db_ok && lease_ok;
    json_t *body = json_pack(
        "{s:s,s:s,s:s,s:I,s:I,s:b,s:b}", "status", db_ok ? "ok" : "degraded", "db",
        db_ok ? "ok" : "error", "version", SERVER_VERSION, "agents",
        (json_int_t)registry_count_state(s->reg, REGISTRY_HEALTHY), "jobs_active",
        (json_int_t)gps_jobs_active(s->jobs), "auth", gps_auth_enabled(s->auth),
        "shutting_down", s->shutting_down);
    if (!db_ok)
        json_object_set_new(body, "db_error", json_string(msg));
    gps_http_send_json(r->req, db_ok ? 200 : 503, body);
}

/* Deployments at scrape time, from the admin view (small: one entry per
 * deployment and replica). Families are reset so that an undeployed
 * model's series go away. */
static void collect_deployments(server *s, gps_metrics *m)
{
    static const char *const states[] = {"assigned", "downloading", "loading", "ready",
                                         "failed"};
    gps_metrics_reset(m, "deployment_replicas_wanted");
    gps_metrics_reset(m, "deployment_replicas");
    gps_metrics_reset(m, "deployment_replicas_unplaced");
    json_t *all = s->deploy ? gps_deploy_list(s->deploy) : NULL;
    size_t i;
    json_t *d;
    json_array_foreach(json_object_get(all, "deployments"), i, d)
    {
        const char *name = json_string_value(json_object_get(d, "name"));
        char l[400];
        gps_metrics_label(l, sizeof l, "deployment", name, (char *)NULL);
        gps_metrics_set(m, "deployment_replicas_wanted", l,
                        (double)json_integer_value(json_object_get(d, "replicas")));
        gps_metrics_set(m, "deployment_replicas_unplaced", l,
                        (double)json_integer_value(json_object_get(d, "unplaced")));
        for (size_t k = 0; k < sizeof states / sizeof states[0]; k++) {
            size_t n = 0, j;
            json_t *r;
            json_array_foreach(json_object_get(d, "placed"), j, r)
            {
                const char *st = json_string_value(json_object_get(r, "state"));
                n += st && strcmp(st, states[k]) == 0;
            }
            gps_metrics_label(l, sizeof l, "deployment", name, "state", states[k], (char *)NULL);
            gps_metrics_set(m, "deployment_replicas", l, (double)n);
        }
    }
    json_decref(all);
}

static void collect(gps_metrics *m, void *arg)
{
    server *s = arg;
    collect_deployments(s, m);
    gps_jobs_collect(s->jobs, m);
    gps_agents_collect(s->agents, m);
    gps_store_stats st;
    gps_store_get_stats(s->store, &st);
    gps_metrics_set(m, "db_ops_committed_total", NULL, (double)st.ops_committed);
    gps_metrics_set(m, "db_ops_failed_total", NULL, (double)st.ops_failed);
    gps_metrics_set(m, "db_drops_total", NULL, (double)st.drops);
    gps_metrics_set(m, "db_commits_total", NULL, (double)st.batches);
    gps_metrics_set(m, "db_statements_total", NULL, (double)st.statements);
    gps_metrics_set(m, "db_queue_depth", NULL, (double)st.queue_depth);
    gps_metrics_set(m, "http_body_bytes_inflight", NULL,
                    (double)gps_http_inflight_bytes(s->http));
    size_t ntasks = 0, nevents = 0;
    gps_tasks_memory(s->tasks, &ntasks, &nevents);
    gps_metrics_set(m, "tasks_in_memory", NULL, (double)ntasks);
    gps_metrics_set(m, "task_events_in_memory", NULL, (double)nevents);
    gps_memstat ms;
    gps_memstat_read(&ms);
    gps_metrics_set(m, "process_resident_bytes", NULL, (double)ms.rss_bytes);
    gps_metrics_set(m, "heap_inuse_bytes", NULL, (double)ms.heap_inuse_bytes);
    gps_metrics_set(m, "heap_free_bytes", NULL, (double)ms.heap_free_bytes);
    gps_metrics_set(m, "db_memory_bytes", NULL, (double)sqlite3_memory_used());
}

/* metrics_key set: the scraper must send it as a Bearer token. Compared
 * in constant time (no timing oracle on a public route). */
static bool metrics_allowed(server *s, gps_req *r)
{
    const char *want = s->cfg.metrics_key;
    if (!want || !*want)
        return true;
    const char *h = gps_req_header(r, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return false;
    const char *got = h + 7;
    size_t wl = strlen(want), gl = strlen(got);
    unsigned char diff = wl != gl;
    for (size_t i = 0; i < wl; i++)
        diff |= (unsigned char)(want[i] ^ (i < gl ? got[i] : 0));
    return diff == 0;
}

static void h_metrics(gps_req *r, void *arg)
{
    server *s = arg;
    if (!metrics_allowed(s, r)) {
        char l[64];
        gps_metrics_label(l, sizeof l, "reason", "metrics_key", (char *)NULL);
        gps_metrics_add(s->metrics, "auth_failures_total", l, 1);
        gps_req_add_header(r, "WWW-Authenticate", "Bearer realm=\"gpupool metrics\"");
        gps_req_error(r, 401, "INVALID_API_KEY",
                      "GET /metrics needs the metrics key (metrics_key) as a Bearer token",
                      NULL);
        return;
    }
    gp_buf b;
    gp_buf_init(&b);
    struct evbuffer *eb = evbuffer_new();
    if (gps_metrics_render(s->metrics, &b) < 0 || !eb) {
        gp_buf_free(&b);
        if (eb)
            evbuffer_free(eb);
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
        return;
    }
    evbuffer_add(eb, b.data ? b.data : "", b.len);
    struct evkeyvalq *h = evhttp_request_get_output_headers(r->req);
    evhttp_remove_header(h, "Content-Type");
    evhttp_add_header(h, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    gps_http_send_reply(r->req, 200, "OK", eb);
    evbuffer_free(eb);
    gp_buf_free(&b);
}

/* ------------------------------------------------------------------ */
/* Signals and shutdown                                                */
/* ------------------------------------------------------------------ */

static void shutdown_check(evutil_socket_t fd, short what, void *arg)
{
    server *s = arg;
    size_t active = gps_jobs_active(s->jobs);
    bool late = gp_now_mono_ms() >= s->shutdown_deadline_ms;
    if (active > 0 && !late)
        return;
    if (active > 0)
        gp_log_write(GP_LOG_WARN, "shutdown_grace_expired", NULL,
                     json_pack("{s:I}", "jobs_active", (json_int_t)active),
                     "grace period over; exiting with jobs still running");
    event_del(s->shutdown_timer);
    gps_http_stop_accepting(s->http);
    if (s->metrics_http)
        gps_http_stop_accepting(s->metrics_http);
    gps_agents_release_all(s->agents);
    /* Let the 204s and final chunks reach their sockets before the loop
     * stops and evhttp_free closes every connection. */
    struct timeval tv = {0, 200000};
    event_base_loopexit(s->base, &tv);
}

static void on_term(evutil_socket_t sig, short what, void *arg)
{
    server *s = arg;
    if (s->shutting_down) {
        if (sig == SIGINT) {
            gp_log_warn("shutdown_forced", "second interrupt: exiting now");
            event_base_loopexit(s->base, NULL);
        }
        return;
    }
    s->shutting_down = true;
    gp_log_write(GP_LOG_INFO, "shutdown_begin", NULL,
                 json_pack("{s:i,s:I}", "signal", (int)sig, "jobs_active",
                           (json_int_t)gps_jobs_active(s->jobs)),
                 "stopping: no new connections, waiting for running jobs");
    /* The listener stays open until the end: agents may need a new
     * connection to upload the last events of a running stream. Client
     * routes answer 503 SHUTTING_DOWN from now on. */
    gps_http_set_shutting_down(s->http, true);
    gps_dashboard_close_streams(s->dashboard);
    s->shutdown_deadline_ms = gp_now_mono_ms() + (uint64_t)s->cfg.shutdown_grace_sec * 1000;
    s->shutdown_timer = event_new(s->base, -1, EV_PERSIST, shutdown_check, s);
    struct timeval tv = {0, 100000};
    if (s->shutdown_timer)
        event_add(s->shutdown_timer, &tv);
    shutdown_check(-1, 0, s);
}

static void on_hup(evutil_socket_t sig, short what, void *arg)
{
    server *s = arg;
    char err[256];
    /* First, so the lines below land in the new file after a rotation. */
    if (s->cfg.log_file && *s->cfg.log_file && gp_log_open(s->cfg.log_file) < 0)
        gp_log_error("log_reopen_failed", "cannot reopen %s: %s (logging to the old file)",
                     s->cfg.log_file, strerror(errno));
    if (gps_auth_load(s->auth, err, sizeof err) < 0) {
        gp_log_error("keys_reload_failed", "%s", err);
    } else {
        gp_log_info("keys_reloaded", "%zu keys", gps_auth_key_count(s->auth));
        /* Keys added to the DB offline may have turned auth on. */
        ensure_admin_key(s);
    }
    gps_store_sync_close(s->store); /* the reload's connection: not kept idle */
    if (s->tls) {
        if (gps_tls_reload(s->tls, err, sizeof err) < 0)
            gp_log_error("tls_reload_failed", "%s (keeping the previous certificate)", err);
        else
            gp_log_info("tls_reloaded", "certificate %s, valid until %s",
                        gps_tls_subject(s->tls), gps_tls_not_after(s->tls));
    }
}

/* ------------------------------------------------------------------ */
/* Several servers on one database                                     */
/* ------------------------------------------------------------------ */

/* New work is refused (503) while the lease is out (the database away for
 * lease_sec), and before that while the store's queue is backed up: what
 * is admitted then would only make it longer. */
static int cluster_admit(void *arg, char *msg, size_t msglen)
{
    server *s = arg;
    int sec = gps_cluster_admit(s->cluster, msg, msglen);
    return sec ? sec : gps_store_backlog(s->store, msg, msglen);
}

static json_t *cluster_servers(void *arg)
{
    server *s = arg;
    return gps_cluster_json(s->cluster, gp_now_wall_ms());
}

/* Announce this server (servers table) and start its heartbeat. On
 * PostgreSQL, where other servers may share the database, the lease is
 * enforced and keys and usage are re-read; a SQLite file has one server:
 * its row only. */
static int cluster_start(server *s, const char *host, int port)
{
    char name[300];
    if (s->cfg.server_name && *s->cfg.server_name)
        snprintf(name, sizeof name, "%s", s->cfg.server_name);
    else
        snprintf(name, sizeof name, "%s:%d", host ? host : "", port);
    bool shared = !gps_store_db_is_file(s->cfg.db);
    gps_cluster_opts copts = {
        .name = name,
        .url = s->cfg.advertise_url,
        .version = SERVER_VERSION,
        .heartbeat_ms = (int)s->cfg.heartbeat_sec * 1000,
        .lease_ms = shared ? (int)s->cfg.lease_sec * 1000 : 0,
        .refresh_ms = shared ? (int)s->cfg.shared_refresh_sec * 1000 : 0,
        .fail_orphans = shared,
    };
    if (copts.lease_ms && copts.lease_ms <= copts.heartbeat_ms)
        gp_log_warn("lease_too_short", "lease_sec (%lld) should exceed heartbeat_sec (%lld)",
                    s->cfg.lease_sec, s->cfg.heartbeat_sec);
    s->cluster = gps_cluster_start(s->base, s->store, s->auth, s->limits, &copts);
    if (!s->cluster)
        return -1;
    if (shared && gps_store_has_job_owners(s->store))
        gps_jobs_set_owner_server(s->jobs, gps_cluster_id(s->cluster));
    if (shared && gps_store_has_handoffs(s->store)) {
        /* docs/scaling.md 3e: a job no agent here serves goes to a server
         * whose agents do. */
        gps_handoff_opts ho = {.server_id = gps_cluster_id(s->cluster),
                               .period_ms = (int)s->cfg.handoff_poll_ms,
                               .models_ms = copts.heartbeat_ms,
                               .queue_timeout_sec = (int)s->cfg.queue_timeout_sec,
                               .request_timeout_sec = (int)s->cfg.request_timeout_sec};
        if (!(s->handoff = gps_handoff_start(s->base, s->store, s->jobs, &ho)))
            return -1;
    }
    gps_http_set_admit(s->http, cluster_admit, s);
    gps_admin_set_servers_hook(s->admin, cluster_servers, s);
    return 0;
}

static void purge_cb(evutil_socket_t fd, short what, void *arg)
{
    server *s = arg;
    if (s->cfg.retention_days > 0)
        gps_store_purge_jobs(s->store,
                             gp_now_wall_ms() - s->cfg.retention_days * 86400LL * 1000LL);
    gps_resp_state_purge(s->resp_state);
}

/* Free heap back to the kernel (memstat.h says why). On the loop thread
 * so that it never runs in the middle of a burst of our own allocations;
 * the DB thread only waits for its arena's lock for the trim's duration. */
static void trim_cb(evutil_socket_t fd, short what, void *arg)
{
    server *s = arg;
    size_t released = 0;
    if (!gps_memstat_trim((size_t)s->cfg.heap_trim_bytes, &released))
        return;
    gps_metrics_add(s->metrics, "heap_trims_total", NULL, 1);
    gp_log_write(GP_LOG_DEBUG, "heap_trimmed", NULL,
                 json_pack("{s:I}", "released_bytes", (json_int_t)released),
                 "gave %zu bytes of free heap back to the kernel", released);
}

/* ------------------------------------------------------------------ */
/* Start-up recovery                                                   */
/* ------------------------------------------------------------------ */

static int restore_agent(void *arg, const gps_store_agent_info *a)
{
    server *s = arg;
    for (size_t i = 0; i < a->n_models; i++) {
        registry_model_note(s->reg, a->models[i].model, a->first_seen);
        for (size_t k = 0; k < a->models[i].n_aliases; k++)
            registry_model_note(s->reg, a->models[i].aliases[k], a->first_seen);
    }
    return 0;
}

/* After the cluster (its id is this process's id in the servers table) and
 * before the loop runs: on a database several servers may share, native
 * tasks are leased under the cluster's id, so that the servers list, the
 * tasks' owner_server and the sweep of dead servers speak of one id
 * (docs/scaling.md "Native tasks across servers"); then the unfinished
 * jobs of the previous run are restored or failed: requests whose clients
 * were connected to the previous process cannot be resumed, native tasks
 * are (their whole request, seed and event log are stored). On a database
 * several servers share, an unfinished request may be another live
 * server's: the cluster's orphan sweep fails those whose server is gone
 * (this process's previous run included) instead. Returns 0, or 1 (main's
 * exit code): the unfinished jobs could not all be read or restored (out
 * of memory, the database away), and the server does not start rather than
 * fail tasks a restart would resume or leave them unfinished (the reasons:
 * gps_tasks_restore_unfinished). */
static int tasks_start(server *s)
{
    char err[768];
    if (!gps_store_db_is_file(s->cfg.db)) {
        const char *sid = gps_cluster_id(s->cluster);
        gps_tasks_set_follow_ms(s->tasks, (int)s->cfg.task_follow_poll_ms);
        if (gps_tasks_set_shared(s->tasks, sid, (int)s->cfg.task_lease_sec) == 0)
            gp_log_info("tasks_shared", "native tasks leased as server %s (lease %llds)", sid,
                        s->cfg.task_lease_sec);
    }
    bool swept = !gps_store_db_is_file(s->cfg.db) && gps_store_has_job_owners(s->store);
    if (gps_tasks_restore_unfinished(s->tasks, swept, err, sizeof err) < 0) {
        gp_log_error("db_load_jobs_failed", "%s; not starting", err);
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* main                                                                */
/* ------------------------------------------------------------------ */

/* Every connection costs a descriptor: take the soft limit up to the hard
 * one (systemd's default soft limit is 1024, the hard one far higher).
 * When even that runs out the listener pauses (see http.c). */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return;
    rlim_t before = rl.rlim_cur;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
            rl.rlim_cur = before;
    }
    gp_log_write(GP_LOG_INFO, "fd_limit", NULL,
                 json_pack("{s:I,s:I}", "soft", (json_int_t)rl.rlim_cur, "hard",
                           (json_int_t)rl.rlim_max),
                 "open files limit %llu (hard %llu)", (unsigned long long)rl.rlim_cur,
                 (unsigned long long)rl.rlim_max);
}

static int write_port_file(const char *path, int port)
{
    char buf[16];
    int n = snprintf(buf, sizeof buf, "%d\n", port);
    return gp_write_file_atomic(path, buf, (size_t)n, 0644);
}

/* metrics_listen: a listener of its own that serves only /metrics and
 * /health, so a scraper on a private address needs no route to the API
 * and the API listeners (maybe public) stop answering /metrics at all.
 * Same header/body limits; no auth hook: both routes are keyless (the
 * metrics key, when set, still applies). */
static int metrics_listener_start(server *s, const gps_http_opts *hopts)
{
    char *mhost = NULL, err[256];
    int mport = 0, bound = 0, rc = -1;
    if (gp_parse_hostport(s->cfg.metrics_listen, &mhost, &mport, true) < 0)
        goto out;
    s->metrics_http = gps_http_new(s->base, hopts);
    if (!s->metrics_http ||
        gps_http_add_route(s->metrics_http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD, "/health",
                           GPS_DIALECT_NATIVE, GPS_ROLE_NONE, h_health, s) < 0 ||
        gps_http_add_route(s->metrics_http, EVHTTP_REQ_GET, "/metrics", GPS_DIALECT_NATIVE,
                           GPS_ROLE_NONE, h_metrics, s) < 0) {
        gp_log_error("startup_failed", "out of memory during start-up");
        goto out;
    }
    if (gps_http_bind(s->metrics_http, mhost, mport, &bound, err, sizeof err) < 0) {
        gp_log_write(GP_LOG_ERROR, "listen_failed", NULL,
                     json_pack("{s:s,s:i,s:b}", "host", mhost, "port", mport, "metrics", 1),
                     "%s: %s", err, strerror(errno));
        goto out;
    }
    if (s->cfg.metrics_port_file && write_port_file(s->cfg.metrics_port_file, bound) < 0) {
        gp_log_error("port_file_failed", "cannot write %s: %s", s->cfg.metrics_port_file,
                     strerror(errno));
        goto out;
    }
    gp_log_write(GP_LOG_INFO, "listening_metrics", NULL,
                 json_pack("{s:s,s:i,s:b}", "host", mhost, "port", bound, "metrics_key",
                           s->cfg.metrics_key && *s->cfg.metrics_key),
                 "metrics on %s:%d (and no longer on the API listeners)", mhost, bound);
    rc = 0;
out:
    free(mhost);
    return rc;
}

/* metrics_listen set: /metrics on a listener of its own, not the main one. */
static bool own_metrics(const server *s)
{
    return s->cfg.metrics_listen && *s->cfg.metrics_listen;
}

/* main's phases. Each returns 0, or main's exit code: 2 for a
 * configuration error, 1 for anything else (already logged). */

/* Start-up ran out of memory: logged once, exit code 1. */
static int start_oom(void)
{
    gp_log_error("startup_failed", "out of memory during start-up");
    return 1;
}

/* The options, --help, --print-config and the log. -1: go on; else main's
 * exit code (main frees cfg either way). */
static int load_options(server *s, gp_config *cfg, int argc, char **argv)
{
    char err[512];
    if (gps_config_load(&s->cfg, cfg, argc, argv, NULL, err, sizeof err) < 0) {
        fprintf(stderr, "gpupool-server: %s\n", err);
        return 2;
    }
    if (cfg->help) {
        printf("usage: gpupool-server [options]\n"
               "       gpupool-server keys create|revoke ... (see gpupool-server keys)\n"
               "       gpupool-server --version\n"
               "\noptions:\n");
        gp_config_usage(gps_config_table, gps_config_table_len, stdout);
        return 0;
    }
    if (cfg->print_config) {
        gp_config_print(cfg, stdout);
        return 0;
    }
    if (cfg->npositional > 0) {
        fprintf(stderr, "gpupool-server: unexpected argument '%s' (see --help)\n",
                cfg->positional[0]);
        return 2;
    }
    gp_log_init("server", (gp_log_level)gp_log_level_parse(s->cfg.log_level));
    if (s->cfg.log_file && *s->cfg.log_file && gp_log_open(s->cfg.log_file) < 0) {
        fprintf(stderr, "gpupool-server: cannot open log_file '%s': %s\n", s->cfg.log_file,
                strerror(errno));
        return 2;
    }
    return -1;
}

/* listen and listen_tls, and the certificate. */
static int parse_listeners(server *s)
{
    char err[512];
    if (s->cfg.listen && gp_parse_hostport(s->cfg.listen, &s->host, &s->port, true) < 0) {
        fprintf(stderr, "gpupool-server: invalid value '%s' for 'listen'\n", s->cfg.listen);
        return 2;
    }
    if (s->cfg.listen_tls &&
        gp_parse_hostport(s->cfg.listen_tls, &s->tls_host, &s->tls_port, true) < 0) {
        fprintf(stderr, "gpupool-server: invalid value '%s' for 'listen_tls'\n",
                s->cfg.listen_tls);
        return 2;
    }
    if (s->cfg.listen_tls) {
        /* Before the DB: a bad certificate is a configuration error. */
        s->tls = gps_tls_new(s->cfg.tls_cert, s->cfg.tls_key, err, sizeof err);
        if (!s->tls) {
            fprintf(stderr, "gpupool-server: %s\n", err);
            gp_log_error("tls_config_failed", "%s", err);
            return 2;
        }
    }
    return 0;
}

/* The DB's own metrics (the store counts them; collect reports them). */
static void define_db_metrics(gps_metrics *m)
{
    gps_metrics_define(m, "db_ops_committed_total", GPS_METRIC_COUNTER, "DB writes committed.",
                       NULL, 0);
    gps_metrics_define(m, "db_ops_failed_total", GPS_METRIC_COUNTER,
                       "DB writes SQLite rejected.", NULL, 0);
    gps_metrics_define(m, "db_drops_total", GPS_METRIC_COUNTER,
                       "DB writes dropped because the queue was full.", NULL, 0);
    gps_metrics_define(m, "db_commits_total", GPS_METRIC_COUNTER,
                       "DB transactions committed (group commits).", NULL, 0);
    gps_metrics_define(m, "db_statements_total", GPS_METRIC_COUNTER,
                       "DB statements committed (writes folded into one row write count once).",
                       NULL, 0);
    gps_metrics_define(m, "db_queue_depth", GPS_METRIC_GAUGE,
                       "DB operations waiting: queued, or row writes held for their row's end.",
                       NULL, 0);
    gps_metrics_define(m, "http_body_bytes_inflight", GPS_METRIC_GAUGE,
                       "Request body bytes being received (max_inflight_body_bytes bounds it).",
                       NULL, 0);
}

/* The event loop, the store, the keys, the limits and the metrics. */
static int open_core(server *s)
{
    char err[512];
    raise_fd_limit();
    /* No evthread_use_pthreads: only this thread touches libevent objects
     * (docs/architecture.md "Threads"), so libevent runs without locks.
     * Nor EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST (4.5 -> 1.1 epoll_ctl a
     * request at 64 clients, no measurable gain): the lingering close
     * (http_conn.c) keeps a dup() of a connection's socket in this epoll set,
     * and a change list would take the closed descriptor out only at the
     * next wait, after evhttp closed it: the DEL fails and its registration
     * stays in the set while the duplicate keeps the socket open. */
    if (!(s->base = event_base_new())) {
        gp_log_error("startup_failed", "cannot create the event loop");
        return 1;
    }

    gps_store_db_label(s->cfg.db, s->db_label, sizeof s->db_label);
    gps_store_opts sopts = {.migrations_dir = s->cfg.migrations_dir,
                            .queue_max = (size_t)s->cfg.db_queue_max};
    s->store = gps_store_open(s->cfg.db, s->base, &sopts, err, sizeof err);
    if (!s->store) {
        gp_log_error("db_open_failed", "%s: %s", s->db_label, err);
        return 1;
    }
    s->auth = gps_auth_new(s->store);
    if (!s->auth || gps_auth_load(s->auth, err, sizeof err) < 0) {
        gp_log_error("keys_load_failed", "%s", s->auth ? err : "out of memory");
        return 1;
    }
    /* "Loopback only" means every listener: one public listener turns auth on. */
    /* auth = on treats the server as public whatever it listens on: a
     * loopback listener behind a reverse proxy is reached from anywhere. */
    gps_auth_set_loopback_only(s->auth, strcmp(s->cfg.auth, "on") != 0 &&
                                            (!s->host || gp_host_is_loopback(s->host)) &&
                                            (!s->tls_host || gp_host_is_loopback(s->tls_host)));
    ensure_admin_key(s);
    s->limits = gps_limits_new(s->auth, s->store);
    if (!s->limits)
        return start_oom();
    if (gps_limits_load(s->limits, gp_now_wall_ms(), err, sizeof err) < 0)
        gp_log_warn("usage_load_failed", "%s (today's usage starts at zero)", err);

    s->metrics = gps_metrics_new();
    if (!s->metrics || gps_metrics_define_server(s->metrics) < 0)
        return start_oom();
    define_db_metrics(s->metrics);
    return 0;
}

/* The agents, the registry and the scheduler, the jobs, what the DB holds
 * of them, and the deployments. */
static int build_scheduling(server *s)
{
    char err[512];
    gps_agents_opts aopts = {
        .poll_interval_sec = (int)s->cfg.poll_interval_sec,
        .work_wait_sec = (int)s->cfg.work_wait_sec,
        .agent_timeout_sec = (int)s->cfg.agent_timeout_sec,
        .disconnect_grace_ms = (int)s->cfg.agent_disconnect_grace_ms,
        .max_agents = (int)s->cfg.max_agents,
    };
    s->agents = gps_agents_new(s->base, &aopts, s->store, s->metrics);
    if (!s->agents)
        return start_oom();
    gps_agents_set_auth(s->agents, s->auth);
    s->pins = gps_pins_new();
    if (!s->pins)
        return start_oom();
    /* A schema without model_pins (a custom migrations_dir) holds none:
     * pins are refused there (their writes fail). A load that failed must
     * not start the server with part of them: an agent would serve a model
     * whose pin was not read. */
    if (!gps_store_has_pins(s->store)) {
        gp_log_warn("db_no_pins", "the database has no model_pins table (migration 0005): "
                    "models cannot be pinned on this server");
    } else if (gps_pins_load(s->pins, s->store, err, sizeof err) < 0) {
        gp_log_error("db_load_pins_failed", "%s: cannot read the model pins (%s); not starting "
                     "with part of them", s->db_label, err);
        return 1;
    }
    gps_agents_set_pins(s->agents, s->pins);

    registry_config rcfg;
    registry_config_default(&rcfg);
    rcfg.poll_interval_ms = (uint64_t)s->cfg.poll_interval_sec * 1000;
    rcfg.agent_timeout_ms = (uint64_t)s->cfg.agent_timeout_sec * 1000;
    /* Grace: a third of the interval, at most the default 5 s, so that small
     * test intervals still tolerate scheduling jitter. */
    rcfg.grace_ms = rcfg.poll_interval_ms / 3 < 5000 ? rcfg.poll_interval_ms / 3 : 5000;
    rcfg.listener = gps_agents_on_transition;
    rcfg.listener_ud = s->agents;
    s->reg = registry_create(&rcfg);
    sched_config scfg;
    sched_config_default(&scfg);
    scfg.max_queue = (size_t)s->cfg.max_queue;
    scfg.prefix_routing = s->cfg.prefix_routing;
    if (sched_policy_parse(s->cfg.scheduler, &scfg.policy) < 0) {
        fprintf(stderr, "gpupool-server: invalid value '%s' for 'scheduler'\n",
                s->cfg.scheduler);
        return 2;
    }
    s->sched = s->reg ? sched_create(s->reg, &scfg) : NULL;
    if (!s->sched)
        return start_oom();
    gps_jobs_opts jopts = {
        .max_queue = (int)s->cfg.max_queue,
        .queue_timeout_sec = (int)s->cfg.queue_timeout_sec,
        .request_timeout_sec = (int)s->cfg.request_timeout_sec,
        .stall_timeout_sec = (int)s->cfg.stall_timeout_sec,
        .max_attempts = (int)s->cfg.max_attempts,
        .backoff_base_ms = (int)s->cfg.failover_backoff_ms,
        .backoff_cap_ms = (int)s->cfg.failover_backoff_max_ms,
        .poll_interval_sec = (int)s->cfg.poll_interval_sec,
        .log_prompts = s->cfg.log_prompts,
        .prefix_cache_pool = strcmp(s->cfg.prefix_cache_scope, "pool") == 0,
        .max_job_event_bytes = s->cfg.max_job_event_bytes,
    };
    s->jobs = gps_jobs_new(s->base, &jopts, s->reg, s->sched, s->store, s->metrics);
    if (!s->jobs || gps_agents_attach(s->agents, s->reg, s->sched, s->jobs) < 0)
        return start_oom();
    gps_jobs_set_limits(s->jobs, s->limits);
    gps_metrics_set_collector(s->metrics, collect, s);

    if (gps_store_load_agents(s->store, restore_agent, s, err, sizeof err) < 0)
        gp_log_warn("db_load_agents_failed", "%s", err);
    s->deploy = gps_deploy_new(s->reg, s->store, (uint64_t)s->cfg.deploy_grace_sec * 1000,
                               gp_now_mono_ms());
    if (!s->deploy)
        return start_oom();
    /* A schema without the deployments tables (a custom migrations_dir)
     * holds none: deployments are refused there (their writes fail). A
     * load that failed must not start the server with part of them (or
     * none): their agents would be told to unload the rest. */
    if (!gps_store_has_deployments(s->store)) {
        gp_log_warn("db_no_deployments", "the database has no deployments tables (migration "
                    "0007): models cannot be deployed from this server");
    } else if (gps_deploy_load(s->deploy, s->store, err, sizeof err) < 0) {
        gp_log_error("db_load_deployments_failed", "%s: cannot read the deployments (%s); "
                     "not starting with part of them", s->db_label, err);
        return 1;
    }
    gps_agents_set_deploy(s->agents, s->deploy);
    return 0;
}

/* Every route's module on the http server (s->hopts is kept for the
 * metrics listener). */
static int build_api(server *s)
{
    s->hopts = (gps_http_opts){
        .max_body_bytes = (size_t)s->cfg.max_body_bytes,
        .max_header_bytes = (size_t)s->cfg.max_header_bytes,
        .idle_timeout_sec = (int)s->cfg.idle_timeout_sec,
        .max_inflight_body_bytes = (size_t)s->cfg.max_inflight_body_bytes,
        .max_unauth_body_bytes = (size_t)s->cfg.max_unauth_body_bytes,
        .header_timeout_sec = (int)s->cfg.header_timeout_sec,
        .trusted_proxies = s->cfg.trusted_proxies,
        .body_timeout_sec = (int)s->cfg.body_timeout_sec,
    };
    s->http = gps_http_new(s->base, &s->hopts);
    if (!s->http)
        return start_oom();
    gps_http_set_auth(s->http, auth_hook, s);
    gps_http_set_home_check(s->http, home_hook, s);
    s->relay = gps_relay_ctx_new(s->jobs, s->metrics, (int)s->cfg.request_timeout_sec);
    if (!s->relay)
        return start_oom();
    s->resp_state = gps_resp_state_new(s->store, (int)s->cfg.responses_ttl_sec,
                                       (int)s->cfg.responses_per_key);
    s->responses = s->resp_state ? gps_responses_new(s->relay, s->resp_state) : NULL;
    if (!s->responses)
        return start_oom();
    s->tasks = gps_tasks_new(s->base, s->jobs, s->store, s->metrics,
                             (int)s->cfg.request_timeout_sec);
    if (!s->tasks)
        return start_oom();
    gps_tasks_set_hot_sec(s->tasks, (int)s->cfg.task_hot_sec);
    gps_tasks_set_hot_max_events(s->tasks, (size_t)s->cfg.task_hot_max_events);
    gps_tasks_set_auth(s->tasks, s->auth);
    gps_sse_pace_configure((size_t)s->cfg.client_buffer_bytes, (int)s->cfg.slow_client_timeout_sec);
    s->admin = gps_admin_new(s->base, s->auth, s->limits, s->reg, s->jobs, s->store,
                             SERVER_VERSION);
    if (!s->admin)
        return start_oom();
    gps_admin_set_pins(s->admin, s->pins);
    gps_admin_set_deploy(s->admin, s->deploy);
    gps_admin_set_auth_on_hook(s->admin, admin_auth_on, s);
    s->dashboard = gps_dashboard_new(s->base, s->admin);
    if (!s->dashboard)
        return start_oom();
    if (gps_http_add_route(s->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD, "/health",
                           GPS_DIALECT_NATIVE, GPS_ROLE_NONE, h_health, s) < 0 ||
        (!own_metrics(s) && gps_http_add_route(s->http, EVHTTP_REQ_GET, "/metrics",
                                            GPS_DIALECT_NATIVE, GPS_ROLE_NONE, h_metrics,
                                            s) < 0) ||
        gps_openai_register(s->http, s->relay) < 0 ||
        gps_anthropic_register(s->http, s->relay) < 0 ||
        gps_embeddings_register(s->http, s->relay) < 0 ||
        gps_responses_register(s->http, s->responses) < 0 ||
        gps_tasks_register(s->http, s->tasks) < 0 ||
        gps_agents_register(s->http, s->agents) < 0 ||
        gps_admin_register(s->http, s->admin) < 0 ||
        gps_dashboard_register(s->http, s->dashboard) < 0)
        return start_oom();
    return 0;
}

/* The listeners (and the metrics listener), and the port files. */
static int bind_listeners(server *s)
{
    char err[512];
    if (s->host && gps_http_bind(s->http, s->host, s->port, &s->bound, err, sizeof err) < 0) {
        gp_log_write(GP_LOG_ERROR, "listen_failed", NULL,
                     json_pack("{s:s,s:i}", "host", s->host, "port", s->port), "%s: %s", err,
                     strerror(errno));
        return 1;
    }
    if (s->tls_host && gps_http_bind_tls(s->http, s->tls_host, s->tls_port, s->tls,
                                         &s->tls_bound, err, sizeof err) < 0) {
        gp_log_write(GP_LOG_ERROR, "listen_failed", NULL,
                     json_pack("{s:s,s:i,s:b}", "host", s->tls_host, "port", s->tls_port, "tls",
                               1),
                     "%s: %s", err, strerror(errno));
        return 1;
    }
    if (own_metrics(s) && metrics_listener_start(s, &s->hopts) < 0)
        return 1;
    if (s->cfg.port_file &&
        write_port_file(s->cfg.port_file, s->host ? s->bound : s->tls_bound) < 0) {
        gp_log_error("port_file_failed", "cannot write %s: %s", s->cfg.port_file,
                     strerror(errno));
        return 1;
    }
    if (s->cfg.tls_port_file && s->tls_host &&
        write_port_file(s->cfg.tls_port_file, s->tls_bound) < 0) {
        gp_log_error("port_file_failed", "cannot write %s: %s", s->cfg.tls_port_file,
                     strerror(errno));
        return 1;
    }
    return 0;
}

/* Signals, the periodic timers, this server in the servers table, the
 * native tasks left running, and the "listening" lines. */
static int start_serving(server *s)
{
    s->sig_term = evsignal_new(s->base, SIGTERM, on_term, s);
    s->sig_int = evsignal_new(s->base, SIGINT, on_term, s);
    s->sig_hup = evsignal_new(s->base, SIGHUP, on_hup, s);
    s->purge_timer = event_new(s->base, -1, EV_PERSIST, purge_cb, s);
    s->trim_timer = event_new(s->base, -1, EV_PERSIST, trim_cb, s);
    struct timeval hour = {3600, 0}, trim_every = {TRIM_INTERVAL_SEC, 0};
    if (!s->sig_term || !s->sig_int || !s->sig_hup || !s->purge_timer || !s->trim_timer ||
        event_add(s->sig_term, NULL) < 0 || event_add(s->sig_int, NULL) < 0 ||
        event_add(s->sig_hup, NULL) < 0 || event_add(s->purge_timer, &hour) < 0 ||
        (s->cfg.heap_trim_bytes > 0 && event_add(s->trim_timer, &trim_every) < 0))
        return start_oom();
    purge_cb(-1, 0, s);
    if (cluster_start(s, s->host ? s->host : s->tls_host, s->host ? s->bound : s->tls_bound) < 0)
        return start_oom();
    if (tasks_start(s) != 0)
        return 1;

    if (s->host)
        gp_log_write(GP_LOG_INFO, "listening", NULL,
                     json_pack("{s:s,s:i,s:s,s:b,s:s}", "host", s->host, "port", s->bound, "db",
                               s->db_label, "auth", gps_auth_enabled(s->auth), "scheduler",
                               s->cfg.scheduler),
                     "gpupool-server %s listening on %s:%d", SERVER_VERSION, s->host, s->bound);
    if (s->tls_host)
        gp_log_write(GP_LOG_INFO, "listening_tls", NULL,
                     json_pack("{s:s,s:i,s:s,s:s,s:b}", "host", s->tls_host, "port",
                               s->tls_bound, "cert_subject", gps_tls_subject(s->tls),
                               "cert_not_after", gps_tls_not_after(s->tls), "auth",
                               gps_auth_enabled(s->auth)),
                     "gpupool-server %s listening (HTTPS) on %s:%d", SERVER_VERSION,
                     s->tls_host, s->tls_bound);
    if (!gps_auth_enabled(s->auth))
        gp_log_warn("auth_disabled",
                    "no API key exists and the server listens on loopback only: auth is off");
    return 0;
}

/* The loop until shutdown, then the last commit. */
static int serve(server *s)
{
    /* The start-up loads are done: keep no idle connection for them. */
    gps_store_sync_close(s->store);
    event_base_dispatch(s->base);

    gps_cluster_stop(s->cluster);
    gp_log_info("shutdown_flush", "flushing the database");
    if (gps_store_flush(s->store) < 0)
        gp_log_error("db_flush_failed", "the last commit failed");
    gp_log_info("shutdown_done", "bye");
    return 0;
}

/* Everything main made, in the order that their borrowing asks for. */
static void server_free(server *s)
{
    gps_dashboard_free(s->dashboard); /* its streams end while the http server is there */
    if (s->http)
        gps_http_free(s->http);
    if (s->metrics_http)
        gps_http_free(s->metrics_http);
    /* Streams whose clients the http server's end closed wait for a loop
     * turn that will not come (stream.h's deferred free). */
    gps_stream_reap_all();
    gps_tls_free(s->tls); /* after the listeners (open SSLs hold their own reference) */
    gps_responses_free(s->responses);
    gps_resp_state_free(s->resp_state);
    gps_relay_ctx_free(s->relay);
    gps_tasks_free(s->tasks); /* before the jobs: tasks hold job subscriptions */
    gps_handoff_stop(s->handoff); /* before the jobs too: its proxies are subscribed */
    gps_admin_free(s->admin);
    if (s->jobs)
        gps_jobs_free(s->jobs);
    if (s->sched)
        sched_destroy(s->sched);
    if (s->reg)
        registry_destroy(s->reg);
    if (s->agents)
        gps_agents_free(s->agents);
    gps_deploy_free(s->deploy); /* after the agents and the admin API, which borrow it */
    gps_pins_free(s->pins); /* after the agents and the admin API, which borrow it */
    /* Before the limits, the auth and the cluster: reads still pending
     * (their re-reads, a heartbeat) are delivered to them here. */
    if (s->store)
        gps_store_close(s->store);
    gps_cluster_free(s->cluster);
    gps_handoff_free(s->handoff);
    gps_limits_free(s->limits); /* after the jobs, which report to it */
    if (s->auth)
        gps_auth_free(s->auth);
    gps_metrics_free(s->metrics);
    struct event *evs[] = {s->sig_term, s->sig_int, s->sig_hup, s->shutdown_timer,
                           s->purge_timer, s->trim_timer};
    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
        if (evs[i])
            event_free(evs[i]);
    if (s->base)
        event_base_free(s->base);
    free(s->host);
    free(s->tls_host);
}

int main(int argc, char **argv)
{
    /* jansson's counting allocator (gp_json.h), set before any thread
     * can be inside jansson; the engine's schema code (linked for
     * response_format and tool schemas) judges its dumps by the same count
     * and reads its JSON with gp_json's reader, not jansson's, which can
     * crash short of memory (engine.h gpe_set_json_alloc_failures,
     * gpe_set_json_loader). */
    gp_json_init();
    /* libevent's allocator with its emergency reserve (evmem.h): before
     * any libevent call, as event_set_mem_functions requires. libevent
     * 2.1.12 crashes on some of its own allocation failures; with the
     * reserve those get their memory and the server stops accepting until
     * it is back. */
    if (gps_evmem_init(GPS_EVMEM_RESERVE_BYTES) < 0) {
        fputs("gpupool-server: out of memory at start-up\n", stderr);
        return 1;
    }
    gpe_set_json_alloc_failures(gp_json_alloc_failures);
    gpe_set_json_loader(gp_json_load_checked);
    if (argc >= 2 && strcmp(argv[1], "keys") == 0)
        return keys_main(argc, argv);
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        printf("gpupool-server %s\n", SERVER_VERSION);
        return 0;
    }

    server S;
    memset(&S, 0, sizeof S);
    server *s = &S;
    gp_config cfg;
    int rc = load_options(s, &cfg, argc, argv);
    if (rc >= 0) {
        gp_config_free(&cfg);
        return rc;
    }
    signal(SIGPIPE, SIG_IGN);
    if ((rc = parse_listeners(s)) == 0 && (rc = open_core(s)) == 0 &&
        (rc = build_scheduling(s)) == 0 && (rc = build_api(s)) == 0 &&
        (rc = bind_listeners(s)) == 0 && (rc = start_serving(s)) == 0)
        rc = serve(s);
    server_free(s);
    gp_config_free(&cfg);
    return rc;
}
