/*
 * backend_deploy: the backend of an agent started with neither --model nor
 * --upstream. It offers the box to the server's deployments (issue 27,
 * docs/agent.md "Deployed models") and holds what the server says it must:
 * the poll reply's "deployments" list (backend.h, the deploy op) is the
 * desired state; a worker thread converges to it: download the file with
 * model_fetch (resume, sha256, bounds) into the models directory, load it
 * with the gguf backend under the deployment's name, and unload it when
 * the server no longer lists it. Each poll reports the state (downloading
 * with bytes / total / rate, loading, ready, failed with the reason).
 *
 * First slice: one deployed model at a time (capacity 1). The model is
 * served by an inner gguf backend this one forwards jobs to; several
 * inner backends (one per model) is where this goes next.
 *
 * Threads: the agent's main thread calls the ops (backend.h); the worker
 * creates and destroys the inner backend. mu guards the desired and
 * current state and the inner pointer: a forwarded call holds mu, so the
 * worker can only take the inner backend away between calls (it then
 * destroys it outside mu: its jobs end with CANCELLED and fail over).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>

#include "agent/agent_facts.h"
#include "agent/backend.h"
#include "agent/model_fetch.h"
#include "common/gp_log.h"
#include "common/gp_util.h"

/* One deployment as the server gives it. */
typedef struct dep_spec {
    char name[129];
    char source[2049];
    char sha256[65];           /* "" not checked */
} dep_spec;

typedef struct deploy_backend {
    agent_backend base;
    const agent_options *o;
    char models_dir[4096];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t worker;
    bool worker_started, quit;
    uint64_t retry_at_ms;      /* a transient download failure: try again then (0: none) */
    unsigned retries;          /* transient failures in a row */
    /* desired (main thread writes, worker reads) */
    dep_spec want;
    bool want_any;
    uint64_t want_gen;
    /* current (worker writes, main thread reads for the poll) */
    dep_spec cur;
    bool cur_any;
    const char *state;         /* downloading, loading, ready, failed */
    char reason[256];
    long long bytes, total, rate;
    agent_backend *inner;      /* the loaded model, or NULL */
    agent_options inner_o;     /* its options (outlive it) */
    char path[4096 + 256];     /* its file */
} deploy_backend;

/* model_fetch's stop callback has no context: one deploy backend per
 * process, so a file-level flag. Set when the download in progress is no
 * longer wanted (or the agent stops). */
static atomic_bool g_stop_fetch;

static bool fetch_should_stop(void)
{
    return atomic_load(&g_stop_fetch);
}

static bool spec_eq(const dep_spec *a, const dep_spec *b)
{
    return strcmp(a->name, b->name) == 0 && strcmp(a->source, b->source) == 0 &&
           strcmp(a->sha256, b->sha256) == 0;
}

/* ------------------------------------------------------------------ */
/* Worker                                                              */
/* ------------------------------------------------------------------ */

static void on_progress(void *ud, long long have, long long total, double rate)
{
    deploy_backend *b = ud;
    pthread_mutex_lock(&b->mu);
    b->bytes = have;
    b->total = total > 0 ? total : 0;
    b->rate = (long long)rate;
    pthread_mutex_unlock(&b->mu);
}

static void set_failed(deploy_backend *b, const char *reason)
{
    b->state = "failed";
    snprintf(b->reason, sizeof b->reason, "%s", reason);
    gp_log_error("deploy_failed", "deployment %s: %s", b->cur.name, reason);
}

/* MemAvailable from /proc/meminfo in bytes, -1 when unknown. */
static long long mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* Any GPU in the facts (entries of vendor "cpu" are the host's CPU). */
static bool have_gpu(void)
{
    json_t *g = agent_facts_gpus();
    size_t i;
    json_t *x;
    bool any = false;
    json_array_foreach(g, i, x)
    {
        const char *v = json_string_value(json_object_get(x, "vendor"));
        any |= !v || strcmp(v, "cpu") != 0;
    }
    json_decref(g);
    return any;
}

/* Download (or find in the cache) b->cur; called without mu. 0, or with
 * err model_fetch's -1 (will not succeed as is) or MODEL_FETCH_TRANSIENT. */
static int fetch_current(deploy_backend *b, const dep_spec *s, char *err, size_t errlen)
{
    model_fetch_opts fo = {
        .spec = s->source,
        .sha256 = s->sha256[0] ? s->sha256 : NULL,
        .cache_dir = b->models_dir,
        .state_dir = b->o->state_dir,
        .hf_endpoint = b->o->hf_endpoint,
        .token = b->o->model_token,
        .ca_file = b->o->ca_file,
        .max_attempts = (int)b->o->model_download_attempts,
        .max_bytes = b->o->model_max_bytes,
        .on_progress = on_progress,
        .progress_ud = b,
    };
    char path[sizeof b->path];
    int rc = model_fetch(&fo, fetch_should_stop, path, sizeof path, err, errlen);
    if (rc < 0)
        return rc;
    struct stat st;
    pthread_mutex_lock(&b->mu);
    snprintf(b->path, sizeof b->path, "%s", path);
    if (stat(path, &st) == 0)
        b->bytes = b->total = (long long)st.st_size;
    b->rate = 0;
    pthread_mutex_unlock(&b->mu);
    return 0;
}

/* Load b->path as the gguf backend named s->name; called without mu.
 * The inner backend, or NULL with err. */
static agent_backend *load_current(deploy_backend *b, const dep_spec *s, char *err,
                                   size_t errlen)
{
    /* On the CPU the weights live in memory: refuse what cannot fit
     * rather than let the kernel's OOM killer decide (a tenth over the
     * file for the KV cache and scratch). CUDA has its own preflight. */
    long long avail = mem_available();
    bool cpu = b->o->backend && strcmp(b->o->backend, "cpu") == 0;
    if ((cpu || !have_gpu()) && avail >= 0 && b->total > 0 &&
        avail < b->total + b->total / 10) {
        snprintf(err, errlen, "does not fit: needs about %lld MiB of memory, %lld MiB available",
                 (b->total + b->total / 10) >> 20, avail >> 20);
        return NULL;
    }
    b->inner_o = *b->o;
    b->inner_o.model = b->path;
    b->inner_o.alias = b->cur.name; /* s is the worker's copy of it */
    agent_backend *in = agent_backend_gguf_create(&b->inner_o, err, errlen);
    if (!in)
        return NULL;
    json_t *m = in->ops->models(in);
    size_t n = json_array_size(m);
    json_decref(m);
    if (n == 0) { /* the gguf backend refused it (MODEL_DOES_NOT_FIT): its facts say why */
        json_t *facts = json_object();
        if (in->ops->poll_facts)
            in->ops->poll_facts(in, facts);
        const char *msg = json_string_value(json_object_get(json_object_get(facts, "error"),
                                                            "message"));
        snprintf(err, errlen, "does not fit: %s", msg ? msg : "the engine refused the model");
        json_decref(facts);
        in->ops->destroy(in);
        return NULL;
    }
    return in;
}

/* Drop what is held (mu held on entry and exit; released around the
 * destroy, which waits for the model's jobs to end). */
static void unload_locked(deploy_backend *b)
{
    agent_backend *old = b->inner;
    b->inner = NULL;
    if (old)
        gp_log_info("deploy_unload", "deployment %s: unloading", b->cur.name);
    b->cur_any = false;
    b->state = NULL;
    b->reason[0] = '\0';
    b->bytes = b->total = b->rate = 0;
    if (old) {
        pthread_mutex_unlock(&b->mu);
        old->ops->destroy(old);
        pthread_mutex_lock(&b->mu);
    }
}

/* Make b->cur what b->want says (mu held on entry and exit). */
static void converge_locked(deploy_backend *b)
{
    char err[512] = "";
    unload_locked(b);
    if (!b->want_any)
        return;
    dep_spec s = b->want;
    uint64_t gen = b->want_gen;
    b->cur = s;
    b->cur_any = true;
    b->state = "downloading";
    atomic_store(&g_stop_fetch, false);
    pthread_mutex_unlock(&b->mu);
    gp_log_info("deploy_fetch", "deployment %s: fetching %s", s.name, s.source);
    int rc = fetch_current(b, &s, err, sizeof err);
    pthread_mutex_lock(&b->mu);
    if (b->quit || b->want_gen != gen)
        return; /* changed meanwhile: the loop converges again */
    if (rc == MODEL_FETCH_TRANSIENT && b->retries < 10) {
        /* The network or the source's 5xx: this agent tries again (the
         * .part resumes), still "downloading", the reason saying why. A
         * failure a retry cannot fix is reported and the server moves the
         * replica. */
        unsigned delay_s = 5u << (b->retries < 5 ? b->retries : 5);
        b->retries++;
        b->retry_at_ms = gp_now_mono_ms() + delay_s * 1000u;
        snprintf(b->reason, sizeof b->reason, "retrying in %us (try %u of 10): %s", delay_s,
                 b->retries, err);
        gp_log_warn("deploy_fetch_retry", "deployment %s: %s", s.name, b->reason);
        return;
    }
    if (rc < 0) {
        set_failed(b, err);
        return;
    }
    b->retries = 0;
    b->reason[0] = '\0';
    b->state = "loading";
    pthread_mutex_unlock(&b->mu);
    agent_backend *in = load_current(b, &s, err, sizeof err);
    pthread_mutex_lock(&b->mu);
    if (!in) {
        set_failed(b, err);
        return;
    }
    b->inner = in;
    b->state = "ready";
    gp_log_info("deploy_ready", "deployment %s: serving %s", s.name, b->path);
}

static void *worker_main(void *arg)
{
    deploy_backend *b = arg;
    pthread_mutex_lock(&b->mu);
    while (!b->quit) {
        bool differs = b->want_any != b->cur_any ||
                       (b->want_any && !spec_eq(&b->want, &b->cur));
        uint64_t now = gp_now_mono_ms();
        if (differs) {
            b->retry_at_ms = 0;
            b->retries = 0;
            converge_locked(b);
            continue;
        }
        if (b->retry_at_ms && now >= b->retry_at_ms) {
            b->retry_at_ms = 0;
            converge_locked(b); /* the same spec again: a resume */
            continue;
        }
        if (!b->retry_at_ms) {
            pthread_cond_wait(&b->cv, &b->mu);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ms = b->retry_at_ms - now;
        ts.tv_sec += (time_t)(ms / 1000);
        ts.tv_nsec += (long)(ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    }
    unload_locked(b);
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Ops                                                                 */
/* ------------------------------------------------------------------ */

static void dp_destroy(agent_backend *base)
{
    deploy_backend *b = (deploy_backend *)base;
    pthread_mutex_lock(&b->mu);
    b->quit = true;
    atomic_store(&g_stop_fetch, true);
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    if (b->worker_started)
        pthread_join(b->worker, NULL);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b);
}

static json_t *dp_models(agent_backend *base)
{
    deploy_backend *b = (deploy_backend *)base;
    pthread_mutex_lock(&b->mu);
    json_t *m = b->inner ? b->inner->ops->models(b->inner) : json_array();
    pthread_mutex_unlock(&b->mu);
    return m;
}

static void dp_poll_facts(agent_backend *base, json_t *body)
{
    deploy_backend *b = (deploy_backend *)base;
    struct statvfs vfs;
    /* model_fetch creates the directory at the first download. */
    bool ok = statvfs(b->models_dir, &vfs) == 0 || statvfs(b->o->state_dir, &vfs) == 0;
    long long disk = ok ? (long long)vfs.f_bavail * (long long)vfs.f_frsize : 0;
    long long mem = mem_available();
    pthread_mutex_lock(&b->mu);
    if (b->inner && b->inner->ops->poll_facts)
        b->inner->ops->poll_facts(b->inner, body);
    else
        json_object_set_new(body, "backend", json_string("cpu"));
    json_t *models = json_array();
    if (b->cur_any && b->state)
        json_array_append_new(models, json_pack("{s:s,s:s,s:I,s:I,s:I,s:s?}", "name",
                                                b->cur.name, "state", b->state, "bytes",
                                                (json_int_t)b->bytes, "total",
                                                (json_int_t)b->total, "rate",
                                                (json_int_t)b->rate, "reason",
                                                b->reason[0] ? b->reason : NULL));
    pthread_mutex_unlock(&b->mu);
    json_object_set_new(body, "deploy",
                        json_pack("{s:i,s:I,s:I,s:o}", "capacity", 1, "memory_free",
                                  (json_int_t)(mem > 0 ? mem : 0), "disk_free",
                                  (json_int_t)disk, "models", models));
}

static int dp_job_start(agent_backend *base, json_t *job, const agent_job_sink *sink, char *err,
                        size_t errlen)
{
    deploy_backend *b = (deploy_backend *)base;
    int rc = -1;
    pthread_mutex_lock(&b->mu);
    if (b->inner)
        rc = b->inner->ops->job_start(b->inner, job, sink, err, errlen);
    else
        snprintf(err, errlen, "no model loaded (it was unloaded)");
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static void dp_job_cancel(agent_backend *base, const char *job_id)
{
    deploy_backend *b = (deploy_backend *)base;
    pthread_mutex_lock(&b->mu);
    if (b->inner)
        b->inner->ops->job_cancel(b->inner, job_id);
    pthread_mutex_unlock(&b->mu);
}

static void dp_slots(agent_backend *base, int *total, int *usable)
{
    deploy_backend *b = (deploy_backend *)base;
    pthread_mutex_lock(&b->mu);
    if (b->inner && b->inner->ops->slots) {
        b->inner->ops->slots(b->inner, total, usable);
    } else {
        *total = 1; /* the protocol wants one; none usable without a model */
        *usable = 0;
    }
    pthread_mutex_unlock(&b->mu);
}

static void copy_str(char *dst, size_t n, const json_t *v)
{
    const char *s = json_string_value(v);
    snprintf(dst, n, "%s", s && strlen(s) < n ? s : "");
}

/* The server's desired set (backend.h). One model at a time: the first
 * entry; the server places no more than the capacity we report. */
static void dp_deploy(agent_backend *base, const json_t *deployments)
{
    deploy_backend *b = (deploy_backend *)base;
    dep_spec s;
    memset(&s, 0, sizeof s);
    const json_t *d = json_array_get(deployments, 0);
    bool any = json_is_object(d);
    if (any) {
        copy_str(s.name, sizeof s.name, json_object_get(d, "name"));
        copy_str(s.source, sizeof s.source, json_object_get(d, "source"));
        copy_str(s.sha256, sizeof s.sha256, json_object_get(d, "sha256"));
        any = s.name[0] && s.source[0];
    }
    pthread_mutex_lock(&b->mu);
    if (any != b->want_any || (any && !spec_eq(&s, &b->want))) {
        b->want = s;
        b->want_any = any;
        b->want_gen++;
        /* A download of what is no longer wanted stops (its .part stays
         * for a later resume). */
        if (b->cur_any && (!any || !spec_eq(&s, &b->cur)))
            atomic_store(&g_stop_fetch, true);
        pthread_cond_signal(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
}

static const agent_backend_ops deploy_ops = {
    .name = "gguf",
    .destroy = dp_destroy,
    .models = dp_models,
    .poll_facts = dp_poll_facts,
    .job_start = dp_job_start,
    .job_cancel = dp_job_cancel,
    .slots = dp_slots,
    .deploy = dp_deploy,
    .structured_output = true,
};

agent_backend *agent_backend_deploy_create(const agent_options *o, char *err, size_t errlen)
{
    deploy_backend *b = calloc(1, sizeof *b);
    if (!b) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    b->base.ops = &deploy_ops;
    b->o = o;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    int n = o->model_cache && *o->model_cache
                ? snprintf(b->models_dir, sizeof b->models_dir, "%s", o->model_cache)
                : snprintf(b->models_dir, sizeof b->models_dir, "%s/models", o->state_dir);
    if (n < 0 || n >= (int)sizeof b->models_dir) {
        snprintf(err, errlen, "model-cache: path too long");
        goto fail;
    }
    if (pthread_create(&b->worker, NULL, worker_main, b) != 0) {
        snprintf(err, errlen, "cannot start the deployment thread");
        goto fail;
    }
    b->worker_started = true;
    gp_log_info("deploy_mode", "no --model or --upstream: offering this agent to the server's "
                "deployments (models in %s)", b->models_dir);
    return &b->base;
fail:
    dp_destroy(&b->base);
    return NULL;
}
