/*
 * gpupool-agent: runs on each GPU host, pulls jobs from gpupool-server and
 * runs them on a backend (openai: an existing OpenAI-compatible server;
 * gguf: the embedded engine). See docs/agent.md.
 *
 *   gpupool-agent --server URL[,URL2,...] [--token KEY] --state-dir DIR [--slots N]
 *                 [--name NAME] [--labels k=v,...]
 *                 [--upstream URL --upstream-model NAME | --model FILE.gguf]
 *                 (neither: the server's deployments choose the model)
 *                 [--alias NAME] [--config FILE] [--print-config]
 *
 * Signals: SIGTERM/SIGINT drain (announce "draining", finish running jobs up
 * to drain-timeout-sec, deregister, exit 0); a second one stops at once
 * (exit 1). A model download: 0 stopped, 1 may succeed later, 2 will not.
 * Signals are taken by a dedicated thread (sigwait) so that the loop is
 * woken through agent_stop, never interrupted.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>
#include <gpupool/engine.h>
#include <jansson.h>

#include "agent/agent.h"
#include "agent/agent_config.h"
#include "agent/backend.h"
#include "agent/agent_util.h"
#include "agent/model_fetch.h"
#include "common/gp_json.h"
#include "common/gp_log.h"

typedef struct {
    agent *a;
    sigset_t set;
} sig_ctx;

static void *signal_main(void *arg)
{
    sig_ctx *c = arg;
    int n = 0;
    for (;;) {
        int sig = 0;
        if (sigwait(&c->set, &sig) != 0)
            continue;
        if (sig == SIGUSR2)
            return NULL; /* our own wake-up at exit */
        n++;
        gp_log_info("signal", "received signal %d%s", sig, n > 1 ? ": stopping now" : "");
        agent_stop(c->a, n > 1);
    }
}

static void usage(FILE *out)
{
    fprintf(out, "usage: gpupool-agent --server URL[,URL2,...] [--token KEY] --state-dir DIR\n"
                 "                     [--name NAME] [--labels k=v,...]\n"
                 "                     [--upstream URL --upstream-model NAME | --model FILE.gguf]\n"
                 "                     [--backend auto|cuda|cpu] [--devices all|0,1,...]\n"
                 "                     [--slots auto|N] [--ctx N] [--kv-f16 auto|on|off]\n"
                 "                     neither --upstream nor --model: the server's deployments\n"
                 "                     choose the model (downloaded into --model-cache)\n"
                 "                     [--alias NAME]\n\noptions:\n");
    gp_config_usage(agent_config_table, agent_config_table_len, out);
}

/* The stop signals are blocked (sigwait takes them once the agent runs):
 * while a model downloads, before that, look for one pending. */
static bool stop_pending(void)
{
    sigset_t p;
    return sigpending(&p) == 0 && (sigismember(&p, SIGTERM) == 1 || sigismember(&p, SIGINT) == 1);
}

typedef struct check_body {
    char data[2048];
    size_t len;
} check_body;

static size_t check_write(char *p, size_t sz, size_t n, void *ud)
{
    check_body *b = ud;
    size_t take = sz * n;
    size_t room = sizeof b->data - 1 - b->len;
    memcpy(b->data + b->len, p, take < room ? take : room);
    b->len += take < room ? take : room;
    b->data[b->len] = '\0';
    return sz * n;
}

/* What to tell the operator when the server refused the agent's credential
 * (HTTP status, its error reply in b): the server's code and message, read
 * with the checked load (jansson 2.14's own can drop a byte of the message
 * or call a valid reply invalid when memory runs out), or, when the agent
 * had no memory to read them, that. key: the credential is the key file's;
 * cred: whether there is one at all. */
static void refusal_message(const check_body *b, long status, bool key, bool cred, char *err,
                            size_t errlen)
{
    json_error_t je;
    json_t *j = gp_json_load_checked(b->data, b->len, 0, &je);
    bool oom = !j && json_error_code(&je) == json_error_out_of_memory;
    const json_t *e = json_object_get(j, "error");
    const char *code = json_string_value(json_object_get(e, "code"));
    const char *msg = json_string_value(json_object_get(e, "message"));
    snprintf(err, errlen, "the server refuses this agent's %s (HTTP %ld %s: %s); not "
             "downloading the model. %s", key ? "key (" AGENT_KEY_FILE ")" : cred ? "--token"
             : "missing credential", status, oom ? "?" : code ? code : "?",
             oom ? "its reply unread: the agent is out of memory" : msg ? msg : "",
             key ? "Delete the key file and start with --token NEW_ENROLLMENT_TOKEN"
                 : "Start with --token and a valid enrollment token (gpupoolctl tokens create)");
    json_decref(j);
}

/* Before a download that may take hours, ask the server whether it will
 * take our credential (POST /agents/check): a revoked key or a spent token
 * then fails in a second. -1 (err set) only when the server says no; an
 * unreachable or older server (404) is no reason not to download. */
static int check_credentials(const agent_options *o, char *err, size_t errlen)
{
    char *key = NULL, lerr[256], url[4200], auth[256];
    int rc = 0;
    if (agent_state_load_key(o->state_dir, &key, lerr, sizeof lerr) < 0)
        return 0; /* agent_create reports it */
    const char *cred = key ? key : (o->token && *o->token) ? o->token : NULL;
    /* The first server of a list: the one the agent will try first. */
    char **servers = NULL;
    int ns = agent_servers_parse(o->server, &servers, lerr, sizeof lerr);
    if (ns < 0)
        goto done_key; /* agent_config_load checked it already */
    snprintf(url, sizeof url, "%s/agents/check", servers[0]);
    agent_servers_free(servers, ns);
    CURL *c = curl_easy_init();
    struct curl_slist *h = NULL;
    check_body b = {.len = 0};
    if (!c)
        goto done;
    if (cred) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", cred);
        h = curl_slist_append(h, auth);
        explicit_bzero(auth, sizeof auth);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, "{}");
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 15L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, check_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    if (o->ca_file && *o->ca_file)
        curl_easy_setopt(c, CURLOPT_CAINFO, o->ca_file);
    if (o->insecure && o->insecure_confirmed) {
        curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    CURLcode cc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (cc != CURLE_OK || (status != 401 && status != 403)) {
        if (cc != CURLE_OK || status != 200)
            gp_log_warn("credentials_unchecked", "could not check the agent's credentials "
                        "with %s before the model download (%s, HTTP %ld); downloading anyway",
                        url, cc != CURLE_OK ? curl_easy_strerror(cc) : "ok", status);
        goto done;
    }
    refusal_message(&b, status, key != NULL, cred != NULL, err, errlen);
    rc = -1;
done:
    curl_slist_free_all(h);
    if (c)
        curl_easy_cleanup(c);
done_key:
    if (key) {
        explicit_bzero(key, strlen(key));
        free(key);
    }
    return rc;
}

/* --model URL: download (or find in the cache) before anything registers,
 * then point o->model at the local file (a copy: gp_config_free frees the
 * option strings). 0, or model_fetch's -1 / MODEL_FETCH_TRANSIENT. */
static int fetch_model(agent_options *o, char *err, size_t errlen)
{
    char path[4096 + 256];
    char cache[4096];
    if (o->model_cache && *o->model_cache)
        snprintf(cache, sizeof cache, "%s", o->model_cache);
    else if (snprintf(cache, sizeof cache, "%s/models", o->state_dir) >= (int)sizeof cache) {
        snprintf(err, errlen, "state-dir: path too long");
        return -1;
    }
    model_fetch_opts fo = {
        .spec = o->model,
        .sha256 = o->model_sha256,
        .cache_dir = cache,
        .state_dir = o->state_dir,
        .hf_endpoint = o->hf_endpoint,
        .token = o->model_token,
        .ca_file = o->ca_file,
        .max_attempts = (int)o->model_download_attempts,
        .max_bytes = o->model_max_bytes,
        .progress_bar = isatty(STDERR_FILENO) == 1,
    };
    int fr = model_fetch(&fo, stop_pending, path, sizeof path, err, errlen);
    if (fr < 0)
        return fr;
    char *local = strdup(path);
    if (!local) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    free(o->model);
    o->model = local;
    return 0;
}

int main(int argc, char **argv)
{
    agent_options o;
    gp_config cfg;
    char err[512] = "";
    agent *a = NULL;
    int rc = 2;

    /* jansson's counting allocator (gp_json.h), set before any thread
     * can be inside jansson; the engine judges its dumps by the same count
     * (engine.h gpe_set_json_alloc_failures) and reads its JSON with
     * gp_json's reader, not jansson's, which can crash short of memory
     * (gpe_set_json_loader). */
    gp_json_init();
    gpe_set_json_alloc_failures(gp_json_alloc_failures);
    gpe_set_json_loader(gp_json_load_checked);

    /* Block the stop signals before anything starts a thread (backends
     * start theirs in their constructors; threads inherit the mask), then
     * take them in one thread with sigwait. */
    sig_ctx sc = {0};
    sigemptyset(&sc.set);
    sigaddset(&sc.set, SIGTERM);
    sigaddset(&sc.set, SIGINT);
    sigaddset(&sc.set, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &sc.set, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (agent_config_load(&o, &cfg, argc, argv, NULL, err, sizeof err) < 0) {
        fprintf(stderr, "gpupool-agent: %s\n", err);
        goto done;
    }
    if (cfg.help) {
        usage(stdout);
        rc = 0;
        goto done;
    }
    if (cfg.print_config) {
        gp_config_print(&cfg, stdout);
        rc = 0;
        goto done;
    }
    gp_log_init("agent", (gp_log_level)gp_log_level_parse(o.log_level));
    if (curl_global_init(CURL_GLOBAL_ALL) != CURLE_OK) {
        fprintf(stderr, "gpupool-agent: cannot initialise libcurl\n");
        goto done;
    }

    bool remote = o.model && model_fetch_is_remote(o.model);
    if (remote && check_credentials(&o, err, sizeof err) < 0) {
        fprintf(stderr, "gpupool-agent: %s\n", err);
        gp_log_error("auth_refused", "%s", err);
        goto cleanup_curl; /* exit 2: no restart into the same refusal */
    }
    int fr = remote ? fetch_model(&o, err, sizeof err) : 0;
    if (fr < 0) {
        /* For the unit (RestartPreventExitStatus=2): a stop is clean (0);
         * what a later try may fix (network, the server's 5xx) exits 1 and
         * systemd restarts us into a resume; what it cannot (a wrong
         * sha256, 404/401/403, a bad spec) exits 2 rather than download the
         * same wrong bytes again and again. */
        rc = stop_pending() ? 0 : fr == MODEL_FETCH_TRANSIENT ? 1 : 2;
        fprintf(stderr, "gpupool-agent: model: %s\n", err);
        gp_log_error("model_fetch_failed", "%s (exit %d)", err, rc);
        goto cleanup_curl;
    }
    agent_backend *be = NULL;
    bool nomem = false;
    if (o.upstream) {
        be = agent_backend_openai_create(&o, err, sizeof err);
    } else if (o.model) {
        be = agent_backend_gguf_create_status(&o, &nomem, err, sizeof err);
    } else {
        be = agent_backend_deploy_create(&o, &nomem, err, sizeof err);
    }
    if (!be && nomem) {
        /* Memory (or threads: EAGAIN) ran out starting the backend: not
         * the file's fault, and a later start may have them. Exit 1:
         * systemd restarts us (RestartPreventExitStatus=2 is for what a
         * restart cannot fix). */
        rc = 1;
        fprintf(stderr, "gpupool-agent: %s (out of memory: exit 1, restarted by systemd)\n",
                err);
        gp_log_error("model_load_failed", "%s: out of memory (exit 1, restarted by systemd)",
                     err);
        goto cleanup_curl;
    }
    if (!be) {
        /* One line (journald keeps stderr): "gpupool-agent: backend cuda:
         * no usable GPUs: ..." says what to fix. Exit 2. */
        fprintf(stderr, "gpupool-agent: %s\n", err);
        goto cleanup_curl;
    }
    a = agent_create(&o, be, err, sizeof err); /* owns be from here */
    if (!a) {
        fprintf(stderr, "gpupool-agent: %s\n", err);
        gp_log_error("agent_failed", "%s", err);
        goto cleanup_curl;
    }

    sc.a = a;
    pthread_t sig_th;
    bool have_sig_th = pthread_create(&sig_th, NULL, signal_main, &sc) == 0;

    rc = agent_run(a);

    if (have_sig_th) {
        pthread_kill(sig_th, SIGUSR2);
        pthread_join(sig_th, NULL);
    }
    agent_destroy(a);
cleanup_curl:
    curl_global_cleanup();
done:
    gp_config_free(&cfg);
    return rc;
}
