/* agent_config: the option table of gpupool-agent. See agent_config.h. */
#include "agent/agent_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent_util.h"

#define O(f) offsetof(agent_options, f)

/* One row per option; flags are --NAME, environment GPUPOOL_NAME (upper
 * case, '-' -> '_'), config file keys NAME (either '-' or '_'). */
const gp_opt agent_config_table[] = {
    {"server", GP_OPT_STR, O(server), "http://127.0.0.1:8080", 0, 0, NULL,
     "base URL of gpupool-server, or a comma list URL1,URL2,... of servers of one fleet: "
     "the agent stays with the one that answers and moves to the next when it fails"},
    {"token", GP_OPT_STR, O(token), NULL, 0, 0, NULL,
     "enrollment token (traded once for the agent's own key, kept in state-dir/agent.key) "
     "or an agent key; omit while the server runs with auth off"},
    {"state-dir", GP_OPT_STR, O(state_dir), "/var/lib/gpupool-agent", 0, 0, NULL,
     "directory for the persistent agent_id and agent.key (created 0700)"},
    {"slots", GP_OPT_STR, O(slots_opt), "auto", 0, 0, NULL,
     "concurrent jobs (1..1024), or auto: 1 for the openai backend and a model on the CPU; "
     "on GPUs as many as fit in free VRAM (logged at start)"},
    {"name", GP_OPT_STR, O(name), NULL, 0, 0, NULL, "display name (default: host name)"},
    {"labels", GP_OPT_STR, O(labels), "", 0, 0, NULL, "labels for scheduling, k=v,k2=v2"},
    {"log-level", GP_OPT_STR, O(log_level), "info", 0, 0, "debug|info|warn|error",
     "minimum log level"},
    {"config", GP_OPT_STR, O(config), "/etc/gpupool/agent.conf", 0, 0, NULL,
     "config file (key = value lines); a missing default file is ignored"},
    {"drain-timeout-sec", GP_OPT_INT, O(drain_timeout_sec), "60", 0, 86400, NULL,
     "SIGTERM: how long running jobs may finish before they are stopped"},
    {"request-timeout-sec", GP_OPT_INT, O(request_timeout_sec), "30", 1, 3600, NULL,
     "bound on one /agents/poll or events request"},
    {"ca-file", GP_OPT_STR, O(ca_file), NULL, 0, 0, NULL,
     "PEM CA bundle that verifies https:// server and upstream certificates (default: the "
     "system's)"},
    {"insecure", GP_OPT_BOOL, O(insecure), "false", 0, 0, NULL,
     "do NOT verify the server's TLS certificate (testing only; needs "
     "--i-understand-insecure)"},
    {"i-understand-insecure", GP_OPT_BOOL, O(insecure_confirmed), "false", 0, 0, NULL,
     "confirm --insecure: anyone on the path can impersonate the server and read jobs"},
    {"upstream", GP_OPT_STR, O(upstream), NULL, 0, 0, NULL,
     "openai backend: base URL of an OpenAI-compatible server (http://host:port[/v1])"},
    {"upstream-model", GP_OPT_STR, O(upstream_model), NULL, 0, 0, NULL,
     "openai backend: model name sent upstream"},
    {"upstream-key", GP_OPT_STR, O(upstream_key), NULL, 0, 0, NULL,
     "openai backend: Bearer key for the upstream, if it wants one"},
    {"upstream-timeout-sec", GP_OPT_INT, O(upstream_timeout_sec), "60", 1, 86400, NULL,
     "openai backend: no byte from the upstream this long -> UPSTREAM_TIMEOUT"},
    {"upstream-connect-timeout-sec", GP_OPT_INT, O(upstream_connect_timeout_sec), "10", 1, 600,
     NULL, "openai backend: connect timeout"},
    {"model", GP_OPT_STR, O(model), NULL, 0, 0, NULL,
     "gguf backend: a .gguf file, or a URL to download it from (http://, https://, "
     "hf:OWNER/REPO/FILE.gguf[@REVISION]) into --model-cache before registering"},
    {"model-sha256", GP_OPT_STR, O(model_sha256), NULL, 0, 0, NULL,
     "gguf backend: the model file's sha256 (64 hex): a download or a cached file that "
     "differs is refused"},
    {"model-cache", GP_OPT_STR, O(model_cache), NULL, 0, 0, NULL,
     "gguf backend: where downloaded models go (default: STATE_DIR/models)"},
    {"hf-endpoint", GP_OPT_STR, O(hf_endpoint), "https://huggingface.co", 0, 0, NULL,
     "gguf backend: base URL of hf: model specs (a mirror)"},
    {"model-token", GP_OPT_STR, O(model_token), NULL, 0, 0, NULL,
     "gguf backend: Bearer token for the model download (gated repositories; prefer "
     "GPUPOOL_MODEL_TOKEN in the environment)"},
    {"model-download-attempts", GP_OPT_INT, O(model_download_attempts), "8", 1, 1000, NULL,
     "gguf backend: download attempts in a row without progress before giving up"},
    {"model-max-bytes", GP_OPT_INT, O(model_max_bytes), "1099511627776", 1024,
     1125899906842624LL, NULL,
     "gguf backend: largest model file a download accepts (larger: refused, the partial "
     "file removed)"},
    {"deploy-capacity", GP_OPT_INT, O(deploy_capacity), "1", 1, 16, NULL,
     "neither --model nor --upstream: how many of the server's deployed models this agent "
     "holds at once (each its own engine context and slots; the server also checks memory "
     "and VRAM)"},
    {"threads", GP_OPT_INT, O(threads), "0", 0, 1024, NULL,
     "gguf backend: CPU threads (0 = all cores)"},
    {"ctx", GP_OPT_INT, O(ctx_size), "0", 0, 1048576, NULL,
     "gguf backend: context length per slot (0 = the model's; on GPUs with --slots auto the "
     "model's capped at 8192)"},
    {"backend", GP_OPT_STR, O(backend), "auto", 0, 0, "auto|cuda|cpu",
     "gguf backend: where the model runs: auto (CUDA when a GPU is visible and the model "
     "fits, else the CPU; the choice is logged), cuda (refuse to start without a usable GPU), "
     "cpu"},
    {"devices", GP_OPT_STR, O(devices), "all", 0, 0, NULL,
     "gguf backend: CUDA devices to use, all or a list such as 0,2 (a model that fits one GPU "
     "runs on each of them; a larger one is split by layers over them)"},
    {"kv-f16", GP_OPT_STR, O(kv_f16), "auto", 0, 0, "auto|on|off",
     "gguf backend: F16 KV cache (half the memory of F32); auto: on with CUDA, off on the "
     "CPU"},
    {"events-batch", GP_OPT_BOOL, O(events_batch), "true", 0, 0, NULL,
     "upload the events of all running jobs in one request when the server takes it"},
    {"events-batch-ms", GP_OPT_INT, O(events_batch_ms), "2", 0, 1000, NULL,
     "with two or more jobs running, how long the first pending event waits for others "
     "to share its upload; a job's first token or tool call and its end never wait "
     "(0: no wait; what accumulates during the upload in flight goes in the next one "
     "anyway)"},
    {"prefix-cache", GP_OPT_BOOL, O(prefix_cache), "true", 0, 0, NULL,
     "gguf backend: keep each slot's K/V after a job and reuse the longest common token "
     "prefix of the next prompt (--no-prefix-cache: recompute every prompt)"},
    {"alias", GP_OPT_STR, O(alias), NULL, 0, 0, NULL,
     "public model id (default: the upstream model, or the model file's name)"},
};
const size_t agent_config_table_len = sizeof agent_config_table / sizeof agent_config_table[0];

static bool is_http_url(const char *s)
{
    return s && (strncmp(s, "http://", 7) == 0 || strncmp(s, "https://", 8) == 0) &&
           s[strncmp(s, "https://", 8) == 0 ? 8 : 7] != '\0';
}

void agent_servers_free(char **list, int n)
{
    if (!list)
        return;
    for (int i = 0; i < n; i++)
        free(list[i]);
    free(list);
}

/* One item of a --server list, [p, p+len): trimmed, checked and copied into
 * list[n] unless it repeats one before it. 0 or -1 with err. */
static int server_item_add(char **list, int n, const char *p, size_t len, char *err,
                           size_t errlen)
{
    while (len > 0 && (*p == ' ' || *p == '\t'))
        p++, len--;
    while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
        len--;
    while (len > 0 && p[len - 1] == '/') /* "http://h:1/" and "http://h:1" are one server */
        len--;
    if (len == 0) {
        snprintf(err, errlen, "server: item %d of the list is empty (use URL1,URL2,... with "
                 "no empty items)", n + 1);
        return -1;
    }
    char *item = strndup(p, len);
    if (!item) {
        snprintf(err, errlen, "server: out of memory");
        return -1;
    }
    if (!is_http_url(item)) {
        snprintf(err, errlen, "server: '%s' must be an http:// or https:// URL", item);
        free(item);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (strcmp(list[i], item) == 0) {
            /* A repeat would make the agent try one server twice per turn
             * and is most likely a typo for another server. */
            snprintf(err, errlen, "server: '%s' is listed twice", item);
            free(item);
            return -1;
        }
    list[n] = item;
    return 0;
}

int agent_servers_parse(const char *spec, char ***out, char *err, size_t errlen)
{
    *out = NULL;
    if (!spec || !*spec) {
        snprintf(err, errlen, "server: must be an http:// or https:// URL (or a comma list)");
        return -1;
    }
    char **list = calloc(AGENT_MAX_SERVERS, sizeof *list);
    int n = 0;
    if (!list) {
        snprintf(err, errlen, "server: out of memory");
        return -1;
    }
    for (const char *p = spec;;) {
        size_t len = strcspn(p, ",");
        if (n == AGENT_MAX_SERVERS) {
            snprintf(err, errlen, "server: at most %d servers", AGENT_MAX_SERVERS);
            goto fail;
        }
        if (server_item_add(list, n, p, len, err, errlen) < 0)
            goto fail;
        n++;
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    *out = list;
    return n;
fail:
    agent_servers_free(list, n);
    return -1;
}

/* --slots: "auto" (0) or 1..1024. */
static int agent_slots_parse(agent_options *out, char *err, size_t errlen)
{
    const char *v = out->slots_opt ? out->slots_opt : "auto";
    if (strcmp(v, "auto") == 0) {
        out->slots = 0;
        return 0;
    }
    char *end = NULL;
    long long n = strtoll(v, &end, 10);
    if (!*v || *end || n < 1 || n > 1024) {
        snprintf(err, errlen, "slots: '%s' must be auto or a number from 1 to 1024", v);
        return -1;
    }
    out->slots = n;
    return 0;
}

/* --devices: "all" or a comma list of distinct device numbers. */
static int agent_devices_check(const agent_options *out, char *err, size_t errlen)
{
    int list[AGENT_MAX_DEVICES];
    if (agent_devices_parse(out->devices, list, err, errlen) < 0)
        return -1;
    return 0;
}

int agent_devices_parse(const char *spec, int out[AGENT_MAX_DEVICES], char *err, size_t errlen)
{
    if (!spec || strcmp(spec, "all") == 0)
        return 0;
    int n = 0;
    const char *p = spec;
    for (;;) {
        char *end = NULL;
        long d = strtol(p, &end, 10);
        if (end == p || d < 0 || d > 255 || (*end != ',' && *end != '\0')) {
            snprintf(err, errlen, "devices: '%s' must be all or a list of device numbers such "
                     "as 0,2", spec);
            return -1;
        }
        for (int i = 0; i < n; i++)
            if (out[i] == (int)d) {
                snprintf(err, errlen, "devices: device %ld is listed twice", d);
                return -1;
            }
        if (n == AGENT_MAX_DEVICES) {
            snprintf(err, errlen, "devices: at most %d devices", AGENT_MAX_DEVICES);
            return -1;
        }
        out[n++] = (int)d;
        if (*end == '\0')
            return n;
        p = end + 1;
    }
}

int agent_config_load(agent_options *out, gp_config *cfg, int argc, char **argv, char **envp,
                      char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    int rc = envp ? gp_config_parse_env(cfg, agent_config_table, agent_config_table_len, out,
                                        argc, argv, envp, err, errlen)
                  : gp_config_parse(cfg, agent_config_table, agent_config_table_len, out, argc,
                                    argv, err, errlen);
    if (rc < 0)
        return -1;
    if (cfg->help || cfg->print_config)
        return 0; /* let the caller show what it has, without judging it */
    if (cfg->npositional > 0) {
        snprintf(err, errlen, "unexpected argument '%s' (options start with --)",
                 cfg->positional[0]);
        return -1;
    }
    char **servers = NULL;
    int ns = agent_servers_parse(out->server, &servers, err, errlen);
    if (ns < 0)
        return -1;
    agent_servers_free(servers, ns); /* agent_create parses it again for itself */
    if (out->upstream && out->model) {
        snprintf(err, errlen, "upstream and model: choose one backend (--upstream for openai, "
                              "--model FILE.gguf for gguf)");
        return -1;
    }
    /* Neither --upstream nor --model: the agent offers itself to the
     * server's deployments (backend_deploy.c). */
    if (out->upstream) {
        if (!is_http_url(out->upstream)) {
            snprintf(err, errlen, "upstream: '%s' must be an http:// or https:// URL",
                     out->upstream);
            return -1;
        }
        if (!out->upstream_model || !*out->upstream_model) {
            snprintf(err, errlen, "upstream-model: required with --upstream");
            return -1;
        }
    }
    if (out->token && *out->token && !agent_key_valid(out->token)) {
        snprintf(err, errlen, "token: must be printable characters without spaces (at most "
                              "%d)", AGENT_KEY_MAX);
        return -1;
    }
    if (out->ca_file && access(out->ca_file, R_OK) != 0) {
        snprintf(err, errlen, "ca-file: cannot read '%s'", out->ca_file);
        return -1;
    }
    /* An unverified server can be impersonated by anyone on the path: it
     * would receive the agent key and every prompt. Make that a conscious,
     * spelled-out choice rather than a flag copied from a forum post. */
    if (out->insecure && !out->insecure_confirmed) {
        snprintf(err, errlen, "insecure: refusing to start without certificate verification; "
                              "add --i-understand-insecure to confirm, or better, pass the "
                              "server's CA with --ca-file");
        return -1;
    }
    if (out->model_sha256) {
        /* Accept upper-case hex as people paste it; compare in lower case. */
        size_t n = strlen(out->model_sha256);
        bool ok = n == 64;
        for (size_t i = 0; ok && i < n; i++) {
            char c = out->model_sha256[i];
            if (c >= 'A' && c <= 'F')
                out->model_sha256[i] = (char)(c + 32);
            c = out->model_sha256[i];
            ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
        }
        if (!ok) {
            snprintf(err, errlen, "model-sha256: must be 64 hex digits");
            return -1;
        }
    }
    if (!is_http_url(out->hf_endpoint)) {
        snprintf(err, errlen, "hf-endpoint: '%s' must be an http:// or https:// URL",
                 out->hf_endpoint ? out->hf_endpoint : "");
        return -1;
    }
    if (out->alias && !*out->alias) {
        snprintf(err, errlen, "alias: must not be empty");
        return -1;
    }
    if (agent_slots_parse(out, err, errlen) < 0 || agent_devices_check(out, err, errlen) < 0)
        return -1;
    json_t *labels = agent_labels_parse(out->labels, err, errlen);
    if (!labels)
        return -1;
    json_decref(labels);
    return 0;
}
