/* server_config: see server_config.h. */
#include "server/server_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_log.h"
#include "common/gp_util.h"

extern char **environ;

#define O(f) offsetof(gps_config, f)

/* One row per option. Bounds keep values sane (a 0 s agent timeout or a
 * 0-byte body limit would make the server useless rather than strict). */
const gp_opt gps_config_table[] = {
    {"listen", GP_OPT_STR, O(listen), "127.0.0.1:8080", 0, 0, NULL,
     "address to listen on (host:port; port 0 picks a free port; \"none\" = HTTPS only)"},
    {"listen_tls", GP_OPT_STR, O(listen_tls), NULL, 0, 0, NULL,
     "HTTPS address (host:port; needs tls_cert and tls_key)"},
    {"tls_cert", GP_OPT_STR, O(tls_cert), NULL, 0, 0, NULL,
     "PEM certificate (chain) served on listen_tls; re-read on SIGHUP"},
    {"tls_key", GP_OPT_STR, O(tls_key), NULL, 0, 0, NULL,
     "PEM private key of tls_cert; re-read on SIGHUP"},
    {"tls-port-file", GP_OPT_STR, O(tls_port_file), NULL, 0, 0, NULL,
     "write the bound HTTPS port number to this file once listening"},
    {"db", GP_OPT_STR, O(db), "./gpupool.db", 0, 0, NULL,
     "SQLite database file ($STATE_DIRECTORY/gpupool.db under systemd), or a PostgreSQL "
     "database: postgresql://USER[:PASS]@HOST[:PORT]/DB"},
    {"auth", GP_OPT_STR, O(auth), "auto", 0, 0, "auto|on",
     "auto: keys required unless every listener is loopback and no key exists; on: always "
     "(e.g. behind a local reverse proxy)"},
    {"state_dir", GP_OPT_STR, O(state_dir), "", 0, 0, NULL,
     "where the server writes its generated admin key, admin.key (default: the db's directory)"},
    {"config", GP_OPT_STR, O(config), "/etc/gpupool/server.conf", 0, 0, NULL,
     "config file (key = value lines)"},
    {"log_level", GP_OPT_STR, O(log_level), "info", 0, 0, "debug|info|warn|error",
     "minimum log level"},
    {"log_file", GP_OPT_STR, O(log_file), "", 0, 0, NULL,
     "append log lines to this file instead of stderr; SIGHUP reopens it (logrotate)"},
    {"port-file", GP_OPT_STR, O(port_file), NULL, 0, 0, NULL,
     "write the bound port number to this file once listening"},
    {"migrations_dir", GP_OPT_STR, O(migrations_dir), NULL, 0, 0, NULL,
     "directory holding the SQL migrations (default: search next to the binary)"},
    {"max_body_bytes", GP_OPT_INT, O(max_body_bytes), "4194304", 1024, 1073741824, NULL,
     "largest accepted request body (413 above)"},
    {"max_header_bytes", GP_OPT_INT, O(max_header_bytes), "65536", 1024, 16777216, NULL,
     "largest accepted request header block"},
    {"idle_timeout_sec", GP_OPT_INT, O(idle_timeout_sec), "60", 1, 86400, NULL,
     "close connections idle this long"},
    {"header_timeout_sec", GP_OPT_INT, O(header_timeout_sec), "10", 1, 3600, NULL,
     "a request head must arrive whole within this long of its first byte (else closed)"},
    {"body_timeout_sec", GP_OPT_INT, O(body_timeout_sec), "60", 1, 86400, NULL,
     "a request body must arrive whole within this long of its head (else closed)"},
    {"max_inflight_body_bytes", GP_OPT_INT, O(max_inflight_body_bytes), "67108864", 1024,
     68719476736LL, NULL,
     "request body bytes being received at once, all connections (503 above)"},
    {"max_unauth_body_bytes", GP_OPT_INT, O(max_unauth_body_bytes), "65536", 1024, 16777216,
     NULL,
     "largest body of a request without credentials (enrollment; 413 above); such bodies "
     "together get at most a quarter of max_inflight_body_bytes"},
    {"poll_interval_sec", GP_OPT_INT, O(poll_interval_sec), "15", 1, 3600, NULL,
     "agent heartbeat interval"},
    {"agent_timeout_sec", GP_OPT_INT, O(agent_timeout_sec), "90", 1, 86400, NULL,
     "an agent silent this long is dead"},
    {"deploy_grace_sec", GP_OPT_INT, O(deploy_grace_sec), "300", 0, 86400, NULL,
     "a deployed model's replica moves to another agent when its agent has been dead or "
     "offline this long (after agent_timeout_sec)"},
    {"max_agents", GP_OPT_INT, O(max_agents), "1024", 1, 1000000, NULL,
     "agents the server knows at most, dead ones included (a new agent beyond: 503)"},
    {"work_wait_sec", GP_OPT_INT, O(work_wait_sec), "25", 1, 600, NULL,
     "how long /agents/work is held before a 204"},
    {"agent_disconnect_grace_ms", GP_OPT_INT, O(agent_disconnect_grace_ms), "1000", 1, 600000,
     NULL, "a busy agent's closed long-poll ends its jobs' attempts after this, unless it "
     "parks again"},
    {"max_queue", GP_OPT_INT, O(max_queue), "1000", 1, 1000000, NULL,
     "queued jobs per model before 429"},
    {"queue_timeout_sec", GP_OPT_INT, O(queue_timeout_sec), "60", 1, 86400, NULL,
     "a job queued longer than this fails with 503"},
    {"request_timeout_sec", GP_OPT_INT, O(request_timeout_sec), "600", 1, 86400, NULL,
     "a request running longer than this fails with 504"},
    {"stall_timeout_sec", GP_OPT_INT, O(stall_timeout_sec), "60", 1, 86400, NULL,
     "a running job without any event this long counts as lost"},
    {"max_attempts", GP_OPT_INT, O(max_attempts), "3", 1, 100, NULL,
     "agents tried per job (failover)"},
    {"failover_backoff_ms", GP_OPT_INT, O(failover_backoff_ms), "50", 0, 60000, NULL,
     "a job's second and later failovers wait a jittered backoff starting here, doubling "
     "per attempt (the first retry is immediate; 0 = never wait)"},
    {"failover_backoff_max_ms", GP_OPT_INT, O(failover_backoff_max_ms), "2000", 0, 600000,
     NULL, "cap of the failover backoff"},
    {"max_job_event_bytes", GP_OPT_INT, O(max_job_event_bytes), "67108864", 65536,
     1073741824, NULL,
     "bytes of events one agent may send for one job (also bounded by the job's max_tokens "
     "times 512); past it the job fails with 502 AGENT_OUTPUT_TOO_LARGE"},
    {"task_hot_sec", GP_OPT_INT, O(task_hot_sec), "300", 1, 86400, NULL,
     "a finished native task replays from memory this long, then from the DB"},
    {"task_hot_max_events", GP_OPT_INT, O(task_hot_max_events), "20000", 1, 100000000, NULL,
     "events finished native tasks keep in memory, all together (about 1 KiB each); past it "
     "the oldest finished tasks replay from the DB before task_hot_sec"},
    {"task_lease_sec", GP_OPT_INT, O(task_lease_sec), "10", 1, 3600, NULL,
     "on a PostgreSQL store shared by several servers: a native task whose server stopped "
     "renewing its lease this long is taken over by another server"},
    {"heap_trim_bytes", GP_OPT_INT, O(heap_trim_bytes), "4194304", 0, 1073741824, NULL,
     "every 10 s, free heap above this goes back to the kernel (malloc_trim; 0 = never)"},
    {"client_buffer_bytes", GP_OPT_INT, O(client_buffer_bytes), "1048576", 4096, 1073741824,
     NULL, "a stream stops writing to a client whose unsent output is above this"},
    {"slow_client_timeout_sec", GP_OPT_INT, O(slow_client_timeout_sec), "60", 1, 86400, NULL,
     "a streaming client above client_buffer_bytes this long is dropped"},
    {"scheduler", GP_OPT_STR, O(scheduler), "round_robin", 0, 0, "round_robin|weighted",
     "scheduling policy"},
    {"prefix_routing", GP_OPT_BOOL, O(prefix_routing), "true", 0, 0, NULL,
     "send a request to the agent whose slot holds its longest prompt prefix"},
    {"prefix_cache_scope", GP_OPT_STR, O(prefix_cache_scope), "key", 0, 0, "key|pool",
     "key: a request reuses (and is routed by) only prompt prefixes its own API key left in "
     "an agent's cache; pool: all keys share the cache (single-tenant pools; the cached "
     "token count and the time to first token then tell one key about another's prompts)"},
    {"shutdown_grace_sec", GP_OPT_INT, O(shutdown_grace_sec), "30", 0, 3600, NULL,
     "SIGTERM: how long running streams may finish"},
    {"retention_days", GP_OPT_INT, O(retention_days), "30", 0, 36500, NULL,
     "purge finished jobs older than this (0 = keep)"},
    {"server_name", GP_OPT_STR, O(server_name), "", 0, 0, NULL,
     "this server's name in the servers table and /admin/status (default: host:port of "
     "the listener)"},
    {"advertise_url", GP_OPT_STR, O(advertise_url), "", 0, 0, NULL,
     "how agents and peers reach this server (listed in the servers table; informational)"},
    {"heartbeat_sec", GP_OPT_INT, O(heartbeat_sec), "2", 1, 3600, NULL,
     "renew this server's row in the servers table (its lease) this often"},
    {"lease_sec", GP_OPT_INT, O(lease_sec), "10", 0, 86400, NULL,
     "on PostgreSQL: a server that could not renew its lease for this long answers new "
     "requests 503 until it can again (0 = never refuse); must exceed heartbeat_sec"},
    {"task_follow_poll_ms", GP_OPT_INT, O(task_follow_poll_ms), "100", 10, 3600000, NULL,
     "on PostgreSQL: a native task followed from another server (and a DELETE waiting for "
     "its owner) is woken by LISTEN/NOTIFY; this poll catches a notification lost"},
    {"handoff_poll_ms", GP_OPT_INT, O(handoff_poll_ms), "1000", 10, 3600000, NULL,
     "on PostgreSQL: hand-offs to other servers are woken by LISTEN/NOTIFY; this poll "
     "only catches a notification lost (the listener reconnecting)"},
    {"shared_refresh_sec", GP_OPT_INT, O(shared_refresh_sec), "5", 1, 3600, NULL,
     "on PostgreSQL: re-read keys and today's usage this often, so that what other "
     "servers changed takes effect here"},
    {"db_queue_max", GP_OPT_INT, O(db_queue_max), "100000", 16, 100000000, NULL,
     "database writes queued (the database slow or away) before new ones are dropped; from "
     "three quarters of it new requests are answered 503 until it is back under half"},
    {"log_prompts", GP_OPT_BOOL, O(log_prompts), "false", 0, 0, NULL,
     "store prompts and outputs in the job log (native tasks keep theirs regardless: "
     "that makes them durable)"},
    {"trusted_proxies", GP_OPT_STR, O(trusted_proxies), "", 0, 0, NULL,
     "comma-separated IP addresses of reverse proxies whose X-Forwarded-For gives the "
     "client address in auth-failure logs (exact addresses; default none)"},
    {"metrics_key", GP_OPT_STR, O(metrics_key), "", 0, 0, NULL,
     "when set, GET /metrics needs 'Authorization: Bearer <this>' (16+ characters; "
     "better GPUPOOL_METRICS_KEY in the environment)"},
    {"responses_ttl_sec", GP_OPT_INT, O(responses_ttl_sec), "2592000", 60, 31536000, NULL,
     "stored Responses (store: true) expire after this (default 30 days)"},
    {"responses_per_key", GP_OPT_INT, O(responses_per_key), "1000", 1, 1000000, NULL,
     "stored Responses a key keeps (its oldest go first)"},
    {"metrics_listen", GP_OPT_STR, O(metrics_listen), "", 0, 0, NULL,
     "serve /metrics (and /health) on this host:port only, e.g. a private address for "
     "the scraper; the API listeners then answer 404 for /metrics (\"\" = on the API "
     "listeners)"},
    {"metrics-port-file", GP_OPT_STR, O(metrics_port_file), NULL, 0, 0, NULL,
     "write the bound metrics_listen port number to this file once listening"},
};
const size_t gps_config_table_len = sizeof gps_config_table / sizeof gps_config_table[0];

int gps_config_load(gps_config *out, gp_config *cfg, int argc, char **argv, char **envp,
                    char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (gp_config_parse_env(cfg, gps_config_table, gps_config_table_len, out, argc, argv,
                            envp ? envp : environ, err, errlen) < 0)
        return -1;

    char *host = NULL;
    int port = 0;
    /* listen = "" or "none": HTTPS only. Normalised to NULL. */
    if (out->listen && (!*out->listen || strcmp(out->listen, "none") == 0)) {
        free(out->listen);
        out->listen = NULL;
    }
    if (out->listen_tls && (!*out->listen_tls || strcmp(out->listen_tls, "none") == 0)) {
        free(out->listen_tls);
        out->listen_tls = NULL;
    }
    if (out->listen && gp_parse_hostport(out->listen, &host, &port, true) < 0) {
        snprintf(err, errlen, "invalid value '%s' for 'listen' (expected host:port or none)",
                 out->listen);
        return -1;
    }
    free(host);
    host = NULL;
    if (out->listen_tls && gp_parse_hostport(out->listen_tls, &host, &port, true) < 0) {
        snprintf(err, errlen, "invalid value '%s' for 'listen_tls' (expected host:port)",
                 out->listen_tls);
        return -1;
    }
    free(host);
    if (!out->listen && !out->listen_tls) {
        snprintf(err, errlen, "listen: no listener left (listen is none and listen_tls unset)");
        return -1;
    }
    if (out->listen_tls && (!out->tls_cert || !*out->tls_cert)) {
        snprintf(err, errlen, "tls_cert: required with listen_tls");
        return -1;
    }
    if (out->listen_tls && (!out->tls_key || !*out->tls_key)) {
        snprintf(err, errlen, "tls_key: required with listen_tls");
        return -1;
    }
    if (out->metrics_listen && *out->metrics_listen) {
        char *mh = NULL;
        int mp = 0;
        int bad = gp_parse_hostport(out->metrics_listen, &mh, &mp, true);
        free(mh);
        if (bad < 0) {
            snprintf(err, errlen, "invalid value '%s' for 'metrics_listen' (expected host:port)",
                     out->metrics_listen);
            return -1;
        }
    }
    if (out->metrics_key && *out->metrics_key && strlen(out->metrics_key) < 16) {
        snprintf(err, errlen, "metrics_key: at least 16 characters (or empty: /metrics public)");
        return -1;
    }
    if (!out->db || !*out->db) {
        snprintf(err, errlen, "invalid value '' for 'db' (expected a file path or a postgresql:// URI)");
        return -1;
    }
    /* Under systemd (StateDirectory=gpupool) the default DB lives in the
     * state dir, not in the working directory (which is / there). */
    size_t db_row = 0;
    for (size_t i = 0; i < gps_config_table_len; i++)
        if (strcmp(gps_config_table[i].name, "db") == 0)
            db_row = i;
    const char *state = NULL;
    for (char **e = envp ? envp : environ; e && *e; e++)
        if (strncmp(*e, "STATE_DIRECTORY=", 16) == 0)
            state = *e + 16;
    if (cfg->src[db_row] == GP_SRC_DEFAULT && state && *state) {
        /* STATE_DIRECTORY may list several dirs separated by ':'. */
        size_t l = strcspn(state, ":");
        char *p = malloc(l + 16);
        if (!p) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        snprintf(p, l + 16, "%.*s/gpupool.db", (int)l, state);
        free(out->db);
        out->db = p;
    }
    if (gp_log_level_parse(out->log_level) < 0) {
        snprintf(err, errlen, "invalid value '%s' for 'log_level'", out->log_level);
        return -1;
    }
    return 0;
}
