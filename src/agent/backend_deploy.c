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
 * Several models at once, up to --deploy-capacity (default 1): each is
 * its own gguf backend (engine contexts, slots, queue) that this one
 * forwards a job to by the job's model; the agent's slots are theirs
 * together. The worker loads one model at a time while the others serve.
 *
 * Threads: the agent's main thread calls the ops (backend.h); the worker
 * creates and destroys the inner backends. mu guards the desired set, the
 * held entries and their inner pointers: a forwarded call holds mu, so the
 * worker can only take an inner backend away between calls (it then
 * destroys it outside mu: its jobs end with CANCELLED and fail over).
 */
#include <errno.h>
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
#include "agent/backend_deploy.h"
#include "agent/model_fetch.h"
#include "common/gp_log.h"
#include "common/gp_util.h"

/* One deployment as the server gives it. */
typedef struct dep_spec {
    char name[129];
    char source[2049];
    char sha256[65];           /* "" not checked */
} dep_spec;

#define DEPLOY_MAX_MODELS 16

typedef struct deploy_backend deploy_backend;

/* One model this agent holds or works on (a download, a load, a failure
 * to report). The worker writes it under mu; the main thread reads the
 * used ones under mu. */
typedef struct held {
    deploy_backend *b;
    bool used;
    dep_spec spec;
    const char *state;         /* downloading, loading, ready, failed */
    char reason[256];
    long long bytes, total, rate;
    uint64_t retry_at_ms;      /* a transient download or load failure: try again then (0: none) */
    unsigned retries;          /* transient failures in a row (until the model is ready) */
    agent_backend *inner;      /* the loaded model, or NULL */
    agent_options inner_o;     /* its options (outlive it) */
    char path[4096 + 256];     /* its file */
} held;

struct deploy_backend {
    agent_backend base;
    const agent_options *o;
    char models_dir[4096];
    int capacity;              /* models held at most (--deploy-capacity) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_cond_t idle_cv;    /* the worker went idle (agent_backend_deploy_wait_idle) */
    pthread_t worker;
    bool worker_started, quit;
    bool idle;                 /* the worker waits with nothing to do before a retry is due */
    bool clock_held;           /* agent_backend_deploy_hold_clock: now_ms is clock_ms */
    uint64_t clock_ms;         /* the held clock, moved by agent_backend_deploy_advance */
    dep_spec want[DEPLOY_MAX_MODELS]; /* desired (main thread writes, worker reads) */
    int nwant;
    held h[DEPLOY_MAX_MODELS];
    int fetching;              /* the entry whose file is downloading, -1 none */
};

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

static bool wanted(const deploy_backend *b, const dep_spec *s)
{
    for (int i = 0; i < b->nwant; i++)
        if (spec_eq(&b->want[i], s))
            return true;
    return false;
}

/* The worker's clock (mu held): the monotonic one, or one a test holds
 * and moves on to see a retry's backoff end without waiting it out. */
static uint64_t now_ms(const deploy_backend *b)
{
    return b->clock_held ? b->clock_ms : gp_now_mono_ms();
}

/* Give the worker something to look at (mu held). */
static void wake_worker_locked(deploy_backend *b)
{
    b->idle = false;
    pthread_cond_signal(&b->cv);
}

static held *held_find(deploy_backend *b, const dep_spec *s)
{
    for (int i = 0; i < DEPLOY_MAX_MODELS; i++)
        if (b->h[i].used && spec_eq(&b->h[i].spec, s))
            return &b->h[i];
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Worker                                                              */
/* ------------------------------------------------------------------ */

static void on_progress(void *ud, long long have, long long total, double rate)
{
    held *h = ud;
    pthread_mutex_lock(&h->b->mu);
    h->bytes = have;
    h->total = total > 0 ? total : 0;
    h->rate = (long long)rate;
    pthread_mutex_unlock(&h->b->mu);
}

static void set_failed(held *h, const char *reason)
{
    h->state = "failed";
    snprintf(h->reason, sizeof h->reason, "%s", reason);
    gp_log_error("deploy_failed", "deployment %s: %s", h->spec.name, reason);
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
/* 1 a GPU, 0 none, -1 out of memory reading them (not "none": a GPU host
 * would get the RAM check and a wrong "does not fit"). */
static int have_gpu(void)
{
    json_t *g = agent_facts_gpus();
    if (!g)
        return -1;
    size_t i;
    json_t *x;
    bool any = false;
    json_array_foreach(g, i, x)
    {
        const char *v = json_string_value(json_object_get(x, "vendor"));
        any |= !v || strcmp(v, "cpu") != 0;
    }
    json_decref(g);
    return any ? 1 : 0;
}

/* Download (or find in the cache) h's file; called without mu (h->spec
 * does not change meanwhile: only this thread writes it). 0, or with err
 * model_fetch's -1 (will not succeed as is) or MODEL_FETCH_TRANSIENT. */
static int fetch_file(deploy_backend *b, held *h, char *err, size_t errlen)
{
    model_fetch_opts fo = {
        .spec = h->spec.source,
        .sha256 = h->spec.sha256[0] ? h->spec.sha256 : NULL,
        .cache_dir = b->models_dir,
        .state_dir = b->o->state_dir,
        .hf_endpoint = b->o->hf_endpoint,
        .token = b->o->model_token,
        .ca_file = b->o->ca_file,
        .max_attempts = (int)b->o->model_download_attempts,
        .max_bytes = b->o->model_max_bytes,
        .on_progress = on_progress,
        .progress_ud = h,
    };
    char path[sizeof h->path];
    int rc = model_fetch(&fo, fetch_should_stop, path, sizeof path, err, errlen);
    if (rc < 0)
        return rc;
    struct stat st;
    pthread_mutex_lock(&b->mu);
    snprintf(h->path, sizeof h->path, "%s", path);
    if (stat(path, &st) == 0)
        h->bytes = h->total = (long long)st.st_size;
    h->rate = 0;
    pthread_mutex_unlock(&b->mu);
    return 0;
}

/* Load h's file as a gguf backend named after the deployment; called
 * without mu. The inner backend, or NULL with err and *nomem true when
 * memory ran out (a later try may load it). */
static agent_backend *load_file(deploy_backend *b, held *h, bool *nomem, char *err,
                                size_t errlen)
{
    *nomem = false;
    /* On the CPU the weights live in memory: refuse what cannot fit
     * rather than let the kernel's OOM killer decide (a tenth over the
     * file for the KV cache and scratch). CUDA has its own preflight. */
    long long avail = mem_available(), need = h->total + h->total / 10;
    bool cpu = b->o->backend && strcmp(b->o->backend, "cpu") == 0;
    int gpu = cpu ? 0 : have_gpu();
    if (gpu < 0) {
        *nomem = true;
        snprintf(err, errlen, "out of memory reading the GPUs");
        return NULL;
    }
    if (!gpu && avail >= 0 && h->total > 0 && avail < need) {
        snprintf(err, errlen, "does not fit: needs about %lld MiB of memory, %lld MiB available",
                 need >> 20, avail >> 20);
        return NULL;
    }
    h->inner_o = *b->o;
    h->inner_o.model = h->path;
    h->inner_o.alias = h->spec.name;
    agent_backend *in = agent_backend_gguf_create_status(&h->inner_o, nomem, err, errlen);
    if (!in)
        return NULL;
    json_t *m = in->ops->models(in);
    if (!m) { /* not a refusal (that is an empty list): a later try may list it */
        *nomem = true;
        snprintf(err, errlen, "out of memory listing the loaded model");
        in->ops->destroy(in);
        return NULL;
    }
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

/* Forget entry h (mu held on entry and exit; released around the
 * destroy, which waits for the model's jobs to end: they end CANCELLED
 * and fail over). */
static void drop_locked(deploy_backend *b, held *h)
{
    agent_backend *old = h->inner;
    h->inner = NULL;
    h->used = false; /* the main thread no longer looks at it */
    if (old) {
        gp_log_info("deploy_unload", "deployment %s: unloading", h->spec.name);
        pthread_mutex_unlock(&b->mu);
        old->ops->destroy(old);
        pthread_mutex_lock(&b->mu);
    }
    memset(h, 0, sizeof *h);
}

/* Try entry h again later with the backoff (mu held; backend_deploy.h):
 * 5 s doubling to 160 s, ten tries in a row. False when the tries are
 * used up. */
static bool retry_later(held *h, const char *what, const char *err)
{
    if (h->retries >= DEPLOY_RETRY_TRIES)
        return false;
    unsigned delay_s = DEPLOY_RETRY_FIRST_S << (h->retries < 5 ? h->retries : 5);
    if (delay_s > DEPLOY_RETRY_MAX_S)
        delay_s = DEPLOY_RETRY_MAX_S;
    h->retries++;
    h->retry_at_ms = now_ms(h->b) + delay_s * 1000u;
    snprintf(h->reason, sizeof h->reason, "retrying in %us (try %u of %d): %.200s", delay_s,
             h->retries, DEPLOY_RETRY_TRIES, err);
    gp_log_warn(what, "deployment %s: %s", h->spec.name, h->reason);
    return true;
}

/* Download and load entry h (mu held on entry and exit). A download
 * trouble a later try may fix (the network, the source's 5xx) is retried
 * by this agent, the entry still "downloading" with the reason saying so;
 * so is a load that ran out of memory (not the file's fault), the entry
 * still "loading" (the next try finds the file in the cache).
 * A failure a retry cannot fix is reported and the server moves the
 * replica. */
static void fetch_load_locked(deploy_backend *b, held *h)
{
    char err[512] = "";
    h->state = "downloading";
    h->bytes = h->total = h->rate = 0;
    b->fetching = (int)(h - b->h);
    atomic_store(&g_stop_fetch, false);
    pthread_mutex_unlock(&b->mu);
    gp_log_info("deploy_fetch", "deployment %s: fetching %s", h->spec.name, h->spec.source);
    int rc = fetch_file(b, h, err, sizeof err);
    pthread_mutex_lock(&b->mu);
    b->fetching = -1;
    if (b->quit || !wanted(b, &h->spec))
        return; /* the next step drops it */
    if (rc == MODEL_FETCH_TRANSIENT && retry_later(h, "deploy_fetch_retry", err))
        return;
    if (rc < 0) {
        set_failed(h, err);
        return;
    }
    h->reason[0] = '\0';
    h->state = "loading";
    pthread_mutex_unlock(&b->mu);
    bool nomem = false;
    agent_backend *in = load_file(b, h, &nomem, err, sizeof err);
    pthread_mutex_lock(&b->mu);
    if (!in && nomem && retry_later(h, "deploy_load_retry", err))
        return; /* still "loading"; the next try finds the file in the cache */
    if (!in) {
        set_failed(h, err);
        return;
    }
    h->retries = 0;
    h->inner = in; /* dropped by the next step if no longer wanted */
    h->state = "ready";
    gp_log_info("deploy_ready", "deployment %s: serving %s", h->spec.name, h->path);
}

/* One step towards the desired set (mu held): drop what is not wanted,
 * retry what is due, start what is wanted and not held. False when there
 * is nothing to do now. */
static bool step_locked(deploy_backend *b)
{
    uint64_t now = now_ms(b);
    for (int i = 0; i < DEPLOY_MAX_MODELS; i++)
        if (b->h[i].used && !wanted(b, &b->h[i].spec)) {
            drop_locked(b, &b->h[i]);
            return true;
        }
    for (int i = 0; i < DEPLOY_MAX_MODELS; i++)
        if (b->h[i].used && b->h[i].retry_at_ms && now >= b->h[i].retry_at_ms) {
            b->h[i].retry_at_ms = 0;
            fetch_load_locked(b, &b->h[i]); /* the same file again: a resume */
            return true;
        }
    for (int w = 0; w < b->nwant; w++) {
        if (held_find(b, &b->want[w]))
            continue;
        for (int i = 0; i < b->capacity && i < DEPLOY_MAX_MODELS; i++)
            if (!b->h[i].used) {
                held *h = &b->h[i];
                memset(h, 0, sizeof *h);
                h->b = b;
                h->used = true;
                h->spec = b->want[w];
                fetch_load_locked(b, h);
                return true;
            }
        break; /* over the capacity: the server places no more than it */
    }
    return false;
}

/* The earliest retry due (monotonic ms), 0 when none. */
static uint64_t next_retry(const deploy_backend *b)
{
    uint64_t t = 0;
    for (int i = 0; i < DEPLOY_MAX_MODELS; i++)
        if (b->h[i].used && b->h[i].retry_at_ms && (!t || b->h[i].retry_at_ms < t))
            t = b->h[i].retry_at_ms;
    return t;
}

static void *worker_main(void *arg)
{
    deploy_backend *b = arg;
    pthread_mutex_lock(&b->mu);
    while (!b->quit) {
        if (step_locked(b))
            continue;
        uint64_t due = next_retry(b), now = now_ms(b);
        b->idle = true;
        pthread_cond_broadcast(&b->idle_cv);
        if (!due) {
            pthread_cond_wait(&b->cv, &b->mu);
            b->idle = false;
            continue;
        }
        uint64_t ms = due > now ? due - now : 0;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += (time_t)(ms / 1000);
        ts.tv_nsec += (long)(ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&b->cv, &b->mu, &ts);
        b->idle = false;
    }
    for (int i = 0; i < DEPLOY_MAX_MODELS; i++)
        if (b->h[i].used)
            drop_locked(b, &b->h[i]);
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
    wake_worker_locked(b);
    pthread_mutex_unlock(&b->mu);
    if (b->worker_started)
        pthread_join(b->worker, NULL);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    pthread_cond_destroy(&b->idle_cv);
    free(b);
}

/* Every loaded model's facts, whole or NULL (out of memory): a model
 * left out would read as unloaded to the server. */
static json_t *dp_models(agent_backend *base)
{
    deploy_backend *b = (deploy_backend *)base;
    json_t *all = json_array();
    pthread_mutex_lock(&b->mu);
    for (int i = 0; all && i < DEPLOY_MAX_MODELS; i++)
        if (b->h[i].used && b->h[i].inner) {
            json_t *m = b->h[i].inner->ops->models(b->h[i].inner);
            if (!m || json_array_extend(all, m) < 0) {
                json_decref(all);
                all = NULL;
            }
            json_decref(m);
        }
    pthread_mutex_unlock(&b->mu);
    return all;
}

/* Facts of every loaded model in one poll body (mu held): the first
 * model's as they are; each other one adds its engines and queue depth.
 * With two or more models the prefix-cache facts are left out: their slot
 * numbers would collide, and the server's prefix routing is a preference,
 * not a need. 0, or -1 when memory ran out (the body is then not sent). */
static int merge_facts_locked(deploy_backend *b, json_t *body)
{
    int n = 0;
    for (int i = 0; i < DEPLOY_MAX_MODELS; i++) {
        agent_backend *in = b->h[i].used ? b->h[i].inner : NULL;
        if (!in || !in->ops->poll_facts)
            continue;
        if (n++ == 0) {
            if (in->ops->poll_facts(in, body) < 0)
                return -1;
            continue;
        }
        json_t *f = json_object();
        int rc = f ? in->ops->poll_facts(in, f) : -1;
        json_t *eng = json_object_get(body, "engines"), *more = json_object_get(f, "engines");
        if (rc == 0 && json_is_array(eng) && more && json_array_extend(eng, more) < 0)
            rc = -1;
        json_int_t q = json_integer_value(json_object_get(body, "queue_depth")) +
                       json_integer_value(json_object_get(f, "queue_depth"));
        if (rc == 0 && json_object_set_new(body, "queue_depth", json_integer(q)) < 0)
            rc = -1;
        json_decref(f);
        if (rc < 0)
            return -1;
    }
    if (n > 1)
        json_object_del(body, "prefix_cache");
    if (n == 0 && json_object_set_new(body, "backend", json_string("cpu")) < 0)
        return -1;
    return 0;
}

/* The deployments' states (mu held), whole or NULL: a deployment left out
 * of "deploy.models" would read to the server as one this agent dropped
 * (its replica moved away). */
static json_t *states_locked(deploy_backend *b)
{
    json_t *models = json_array();
    for (int i = 0; models && i < DEPLOY_MAX_MODELS; i++) {
        const held *h = &b->h[i];
        if (!h->used || !h->state)
            continue;
        json_t *m = json_pack("{s:s,s:s,s:I,s:I,s:I,s:s?}", "name", h->spec.name, "state",
                              h->state, "bytes", (json_int_t)h->bytes, "total",
                              (json_int_t)h->total, "rate", (json_int_t)h->rate, "reason",
                              h->reason[0] ? h->reason : NULL);
        if (json_array_append_new(models, m) < 0) {
            json_decref(models);
            models = NULL;
        }
    }
    return models;
}

static int dp_poll_facts(agent_backend *base, json_t *body)
{
    deploy_backend *b = (deploy_backend *)base;
    struct statvfs vfs;
    /* model_fetch creates the directory at the first download. */
    bool ok = statvfs(b->models_dir, &vfs) == 0 || statvfs(b->o->state_dir, &vfs) == 0;
    long long disk = ok ? (long long)vfs.f_bavail * (long long)vfs.f_frsize : 0;
    long long mem = mem_available();
    pthread_mutex_lock(&b->mu);
    int rc = merge_facts_locked(b, body);
    json_t *models = rc == 0 ? states_locked(b) : NULL;
    pthread_mutex_unlock(&b->mu);
    if (!models)
        return -1;
    /* json_pack takes models, NULL or not; a "deploy" left out would read
     * as an agent that no longer takes deployments. */
    json_t *d = json_pack("{s:i,s:I,s:I,s:o}", "capacity", b->capacity, "memory_free",
                          (json_int_t)(mem > 0 ? mem : 0), "disk_free", (json_int_t)disk,
                          "models", models);
    return json_object_set_new(body, "deploy", d) < 0 ? -1 : 0;
}

/* A job goes to the model it names (each deployment is its own gguf
 * backend, with its own engine contexts and slots). */
static int dp_job_start(agent_backend *base, json_t *job, const agent_job_sink *sink, char *err,
                        size_t errlen)
{
    deploy_backend *b = (deploy_backend *)base;
    const char *model = json_string_value(json_object_get(job, "model"));
    int rc = -1;
    pthread_mutex_lock(&b->mu);
    agent_backend *in = NULL;
    for (int i = 0; model && i < DEPLOY_MAX_MODELS && !in; i++)
        if (b->h[i].used && b->h[i].inner && strcmp(b->h[i].spec.name, model) == 0)
            in = b->h[i].inner;
    if (in)
        rc = in->ops->job_start(in, job, sink, err, errlen);
    else
        snprintf(err, errlen, "model %s is not loaded on this agent (it was unloaded)",
                 model ? model : "?");
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static void dp_job_cancel(agent_backend *base, const char *job_id)
{
    deploy_backend *b = (deploy_backend *)base;
    pthread_mutex_lock(&b->mu);
    for (int i = 0; i < DEPLOY_MAX_MODELS; i++)
        if (b->h[i].used && b->h[i].inner) /* a no-op where the job is unknown */
            b->h[i].inner->ops->job_cancel(b->h[i].inner, job_id);
    pthread_mutex_unlock(&b->mu);
}

/* Slots of every loaded model together. The server counts an agent's free
 * slots, not a model's: a job for a model whose slots are all busy waits
 * in its backend's queue (queue_depth) while another model's slot is free. */
static void dp_slots(agent_backend *base, int *total, int *usable)
{
    deploy_backend *b = (deploy_backend *)base;
    *total = *usable = 0;
    pthread_mutex_lock(&b->mu);
    for (int i = 0; i < DEPLOY_MAX_MODELS; i++) {
        agent_backend *in = b->h[i].used ? b->h[i].inner : NULL;
        int t = 1, u = 1;
        if (!in)
            continue;
        if (in->ops->slots)
            in->ops->slots(in, &t, &u);
        *total += t;
        *usable += u;
    }
    pthread_mutex_unlock(&b->mu);
    if (*total < 1)
        *total = 1; /* the protocol wants one; none usable without a model */
}

static void copy_str(char *dst, size_t n, const json_t *v)
{
    const char *s = json_string_value(v);
    snprintf(dst, n, "%s", s && strlen(s) < n ? s : "");
}

/* The server's desired set (backend.h): at most the capacity we report
 * (the server places no more; extra entries are ignored). */
static void dp_deploy(agent_backend *base, const json_t *deployments)
{
    deploy_backend *b = (deploy_backend *)base;
    dep_spec want[DEPLOY_MAX_MODELS];
    int n = 0;
    memset(want, 0, sizeof want);
    for (size_t i = 0; i < json_array_size(deployments) && n < b->capacity; i++) {
        const json_t *d = json_array_get(deployments, i);
        dep_spec *s = &want[n];
        copy_str(s->name, sizeof s->name, json_object_get(d, "name"));
        copy_str(s->source, sizeof s->source, json_object_get(d, "source"));
        copy_str(s->sha256, sizeof s->sha256, json_object_get(d, "sha256"));
        n += s->name[0] && s->source[0];
    }
    pthread_mutex_lock(&b->mu);
    bool same = n == b->nwant;
    for (int i = 0; same && i < n; i++)
        same = spec_eq(&want[i], &b->want[i]);
    if (!same) {
        memcpy(b->want, want, sizeof want);
        b->nwant = n;
        /* A download of what is no longer wanted stops (its .part stays
         * for a later resume). */
        if (b->fetching >= 0 && !wanted(b, &b->h[b->fetching].spec))
            atomic_store(&g_stop_fetch, true);
        wake_worker_locked(b);
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

agent_backend *agent_backend_deploy_create(const agent_options *o, bool *nomem, char *err,
                                           size_t errlen)
{
    *nomem = false;
    deploy_backend *b = calloc(1, sizeof *b);
    if (!b) {
        *nomem = true;
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    b->base.ops = &deploy_ops;
    b->o = o;
    b->fetching = -1;
    b->capacity = o->deploy_capacity >= 1 && o->deploy_capacity <= DEPLOY_MAX_MODELS
                      ? (int)o->deploy_capacity : 1;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    pthread_cond_init(&b->idle_cv, NULL);
    int n = o->model_cache && *o->model_cache
                ? snprintf(b->models_dir, sizeof b->models_dir, "%s", o->model_cache)
                : snprintf(b->models_dir, sizeof b->models_dir, "%s/models", o->state_dir);
    if (n < 0 || n >= (int)sizeof b->models_dir) {
        snprintf(err, errlen, "model-cache: path too long");
        goto fail;
    }
    int rc = pthread_create(&b->worker, NULL, worker_main, b);
    if (rc != 0) {
        /* EAGAIN: the box is short of threads or memory for now, which a
         * restart may not be (exit 1, not the configuration's exit 2). */
        *nomem = rc == EAGAIN;
        snprintf(err, errlen, "cannot start the deployment thread: %s", strerror(rc));
        goto fail;
    }
    b->worker_started = true;
    gp_log_info("deploy_mode", "no --model or --upstream: offering this agent to the server's "
                "deployments (up to %d model(s), files in %s)", b->capacity, b->models_dir);
    return &b->base;
fail:
    dp_destroy(&b->base);
    return NULL;
}

bool agent_backend_deploy_wait_idle(agent_backend *base, unsigned timeout_ms)
{
    deploy_backend *b = (deploy_backend *)base;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += (time_t)(timeout_ms / 1000);
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&b->mu);
    int rc = 0;
    while (!b->idle && rc == 0)
        rc = pthread_cond_timedwait(&b->idle_cv, &b->mu, &dl);
    bool idle = b->idle;
    pthread_mutex_unlock(&b->mu);
    return idle;
}

void agent_backend_deploy_hold_clock(agent_backend *base)
{
    deploy_backend *b = (deploy_backend *)base;
    pthread_mutex_lock(&b->mu);
    if (!b->clock_held)
        b->clock_ms = gp_now_mono_ms();
    b->clock_held = true;
    pthread_mutex_unlock(&b->mu);
}

void agent_backend_deploy_advance(agent_backend *base, uint64_t ms)
{
    deploy_backend *b = (deploy_backend *)base;
    pthread_mutex_lock(&b->mu);
    if (!b->clock_held)
        b->clock_ms = gp_now_mono_ms();
    b->clock_held = true;
    b->clock_ms += ms;
    wake_worker_locked(b);
    pthread_mutex_unlock(&b->mu);
}
