/*
 * server_config: the option table of gpupool-server and its effective values.
 *
 * Precedence (from gp_config.h): default < config file < flag < GPUPOOL_* env.
 * `gps_config_load` parses, validates the cross-field rules that a table row
 * cannot express (e.g. listen must be host:port, at least one listener,
 * tls_cert and tls_key with listen_tls), and fills a gps_config. When
 * listen is "" or "none" the server has no HTTP listener and out->listen is
 * NULL afterwards; likewise listen_tls is NULL when HTTPS is off.
 * Strings in gps_config are owned by the gp_config passed in; call
 * gps_config_free when done.
 */
#ifndef GPS_SERVER_CONFIG_H
#define GPS_SERVER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "common/gp_config.h"

typedef struct gps_config {
    char *listen;               /* host:port; port 0 = ephemeral; ""/"none" = no HTTP */
    char *listen_tls;           /* HTTPS host:port (NULL/"" = no HTTPS) */
    char *tls_cert;             /* PEM certificate chain for listen_tls */
    char *tls_key;              /* PEM private key for listen_tls */
    char *tls_port_file;        /* write the bound HTTPS port here */
    char *db;                   /* SQLite file */
    char *auth;                 /* auto (on unless loopback-only with no key) | on */
    char *state_dir;            /* generated admin key (admin.key); "" = db's directory */
    char *metrics_key;          /* "" = /metrics is public */
    long long responses_ttl_sec;  /* stored Responses expire after this */
    long long responses_per_key;  /* a key keeps its newest this many */
    char *metrics_listen;       /* host:port of a listener for /metrics and /health only */
    char *metrics_port_file;    /* write the bound metrics port here */
    char *trusted_proxies;      /* comma-separated proxy IPs whose X-Forwarded-For is believed */
    char *config;               /* config file path */
    char *log_level;            /* debug|info|warn|error */
    char *log_file;             /* append JSON lines here ("" = stderr); SIGHUP reopens */
    char *port_file;            /* write the bound port here (tests, supervisors) */
    char *migrations_dir;       /* directory of NNNN_name.sql files (NULL = built-in search) */
    long long max_body_bytes;   /* request body limit (413 above) */
    long long max_header_bytes; /* request header block limit */
    long long idle_timeout_sec; /* idle connection timeout */
    long long header_timeout_sec; /* whole request head deadline */
    long long body_timeout_sec; /* whole request body deadline */
    long long max_inflight_body_bytes; /* body bytes being received, all connections */
    long long max_unauth_body_bytes; /* body of a request without credentials */
    long long poll_interval_sec;/* agents heartbeat interval, told to agents */
    long long deploy_grace_sec; /* deployments: dead this long -> replica moves */
    long long agent_timeout_sec;/* no heartbeat for this long -> dead */
    long long max_agents;       /* agents the registry holds at most (any state) */
    long long work_wait_sec;    /* long-poll hold time of /agents/work */
    long long agent_disconnect_grace_ms; /* closed long-poll -> jobs lost after this */
    long long max_queue;        /* per-model queue bound (429 above) */
    long long queue_timeout_sec;/* queued longer -> 503 */
    long long request_timeout_sec; /* whole request bound -> 504 */
    long long stall_timeout_sec;/* running job without an event this long -> lost */
    long long max_attempts;     /* failover attempts per job */
    long long failover_backoff_ms;     /* first backoff of a repeated failover (0 = none) */
    long long failover_backoff_max_ms; /* its cap */
    long long max_job_event_bytes; /* event bytes one agent attempt may send per job */
    long long task_hot_sec;     /* finished /v2 tasks stay in memory this long */
    long long task_hot_max_events; /* ... unless their events together exceed this */
    long long task_lease_sec;   /* shared store: a native task's lease (takeover after it) */
    long long heap_trim_bytes;  /* malloc_trim when this much heap is free (0 = never) */
    long long client_buffer_bytes;     /* SSE backpressure high-water mark per connection */
    long long slow_client_timeout_sec; /* above it this long: the client is dropped */
    char *scheduler;            /* round_robin|weighted */
    bool prefix_routing;        /* route to the agent holding the prompt's prefix */
    char *prefix_cache_scope;   /* key|pool: whose prompt prefixes a request may reuse */
    long long shutdown_grace_sec; /* SIGTERM: how long streams may finish */
    long long retention_days;   /* finished jobs older than this are purged */
    bool log_prompts;           /* store prompts in the job log */
    char *server_name;          /* servers table: this server's name ("" = host:port) */
    char *advertise_url;        /* servers table: how to reach it ("" = none) */
    long long heartbeat_sec;    /* lease renewal period */
    long long lease_sec;        /* PostgreSQL: no renewal this long -> 503 (0 = never) */
    long long task_follow_poll_ms; /* PostgreSQL: native task follow's slow poll */
    long long handoff_poll_ms;  /* PostgreSQL: hand-offs' slow poll (LISTEN/NOTIFY wakes) */
    long long shared_refresh_sec; /* PostgreSQL: keys and usage re-read this often */
    long long db_queue_max;     /* store ops queued before writes drop (3/4: 503) */
} gps_config;

extern const gp_opt gps_config_table[];
extern const size_t gps_config_table_len;

/* Parse argv (and envp; NULL = process environment) into out.
 * Returns 0, or -1 with err naming the key. cfg must be freed with
 * gp_config_free (it owns the strings in out) even on error. */
int gps_config_load(gps_config *out, gp_config *cfg, int argc, char **argv, char **envp,
                    char *err, size_t errlen);

#endif
