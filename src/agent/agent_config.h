/*
 * agent_config: the option table of gpupool-agent and its effective values.
 *
 * Precedence (gp_config.h): default < config file < flag < GPUPOOL_* env.
 * agent_config_load parses and validates the cross-field rules a table row
 * cannot express (exactly one backend chosen, labels well formed, server URLs
 * are http(s)://). Strings in agent_options are owned by the gp_config passed
 * in: call gp_config_free(cfg) when done.
 */
#ifndef AGENT_CONFIG_H
#define AGENT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "common/gp_config.h"

typedef struct agent_options {
    /* --- connection to the server --- */
    char *server;              /* base URL, "http://127.0.0.1:8080", or a comma list of
                                  them (agent_servers_parse) */
    char *token;               /* enrollment token or agent key; NULL with auth off */
    char *state_dir;           /* holds agent_id (0600); created 0700 */
    long long slots;           /* concurrent jobs (>= 1); 0 = auto (from --slots auto) */
    char *slots_opt;           /* --slots as given: "auto" or a number */
    char *name;                /* display name; default: host name */
    char *labels;              /* "k=v,k2=v2" (parse with agent_labels_parse) */
    char *log_level;           /* debug|info|warn|error */
    char *config;              /* config file path */
    long long drain_timeout_sec;   /* SIGTERM: how long running jobs may finish */
    long long request_timeout_sec; /* bound on one poll/events request */
    char *ca_file;             /* PEM bundle to verify https:// servers (default: system CAs) */
    bool insecure;             /* skip verifying the server's certificate (needs the next) */
    bool insecure_confirmed;   /* --i-understand-insecure: required with insecure */
    /* --- backend openai --- */
    char *upstream;            /* base URL of an OpenAI-compatible server */
    char *upstream_model;      /* model name sent upstream */
    char *upstream_key;        /* optional Bearer key for the upstream */
    long long upstream_timeout_sec; /* no byte from upstream this long -> UPSTREAM_TIMEOUT */
    long long upstream_connect_timeout_sec;
    /* --- backend gguf (src/agent/backend_gguf.c) --- */
    char *model;               /* path to a .gguf file, or a URL / hf: spec (model_fetch.h) */
    char *model_sha256;        /* expected sha256 of the model file (downloads and cache) */
    char *model_cache;         /* download cache (default: STATE_DIR/models) */
    char *hf_endpoint;         /* base URL that hf: specs resolve against */
    char *model_token;         /* Bearer token for the model download, or NULL */
    long long model_download_attempts; /* attempts in a row without progress */
    long long model_max_bytes;   /* largest model file a download accepts */
    long long threads;         /* CPU threads for the engine (0 = auto) */
    long long ctx_size;        /* context length per slot (0 = model's; auto on a GPU) */
    long long deploy_capacity; /* neither --model nor --upstream: models held at most */
    char *backend;             /* auto|cuda|cpu: where the engine runs the model (NULL, in
                                  options filled by hand: cpu) */
    char *devices;             /* "all" or "0,2": CUDA devices the engine may use */
    char *kv_f16;              /* auto|on|off: F16 KV cache (auto: on with CUDA) */
    bool prefix_cache;         /* reuse each slot's cached prompt prefix (default on) */
    bool events_batch;         /* one upload for the events of all jobs (default on) */
    long long events_batch_ms; /* with 2+ jobs running, wait this long to fill a batch */
    /* --- both --- */
    char *alias;               /* public model id (default: upstream model / file stem) */
} agent_options;

#define AGENT_MAX_DEVICES 16   /* as the engine's GPE_MAX_DEVICES */

/* --devices: "all" (or NULL) -> 0; else the listed device numbers into
 * out[] and their count (>= 1); -1 with err when malformed. */
int agent_devices_parse(const char *spec, int out[AGENT_MAX_DEVICES], char *err, size_t errlen);

/* --server holds one URL or a list: at most this many. */
#define AGENT_MAX_SERVERS 16

/* --server: "URL" or "URL1,URL2,...": distinct http:// or https:// URLs,
 * spaces around the commas ignored, trailing '/' dropped. Returns the count
 * (1..AGENT_MAX_SERVERS) with *out a new array of new strings (free with
 * agent_servers_free), or -1 with err naming the bad item (*out NULL). */
int agent_servers_parse(const char *spec, char ***out, char *err, size_t errlen);
void agent_servers_free(char **list, int n);

extern const gp_opt agent_config_table[];
extern const size_t agent_config_table_len;

/* Parse argv (and envp; NULL = process environment) into out.
 * Returns 0, or -1 with err naming the key. cfg must be freed with
 * gp_config_free (it owns the strings in out) even on error. */
int agent_config_load(agent_options *out, gp_config *cfg, int argc, char **argv, char **envp,
                      char *err, size_t errlen);

#endif
