/*
 * The agent's deploy backend (src/agent/backend_deploy.c) with the real
 * gguf backend and engine on stories260K: a deployment goes loading ->
 * ready and serves a job; a load that runs out of memory (the N-th of the
 * agent's, the engine's and jansson's allocations fails: ld --wrap,
 * part-agent-deploy.cmake, through tests/unit/server/fixture_oom.h
 * arm_libc) or of threads (pthread_create's EAGAIN, through --wrap too)
 * stays "loading" and is retried on the backoff (5 s doubling to 160 s,
 * ten tries), never failed for good, and is ready once the allocations
 * succeed; a damaged file is failed for good; the count of tries starts
 * again after a ready model. And the backend's start when memory or
 * threads run out: NULL with *nomem (gpupool-agent exits 1, restarted),
 * not a configuration error (exit 2, which systemd does not restart).
 *
 * The model "downloads" from the cache: model_fetch uses a file already
 * at the URL's cache path without a request. The test waits on the
 * worker's idle event (agent_backend_deploy_wait_idle) and holds its
 * retry clock, moving it on (agent_backend_deploy_advance) instead of
 * sleeping.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "agent/backend.h"
#include "agent/backend_deploy.h"
#include "agent/model_fetch.h"
#include "common/gp_json.h"
#include "gpupool/engine.h"

#define GPS_FIXTURE_OOM_LIBC
#define GPS_FIXTURE_OOM_STRDUP
#include "../server/fixture_oom.h"

#define STORIES GP_SOURCE_DIR "/models/stories260K.gguf"
#define URL_OK "https://models.invalid/org/stories260K.gguf"
#define URL_CUT "https://models.invalid/org/cut.gguf"
#define WAIT_MS 60000u

/* ------------------------------------------- pthread_create through --wrap */

/* While g_fail_threads is set every pthread_create of the project fails
 * with EAGAIN (a box short of threads for now). A gate, when armed, holds
 * the first one until the test opens it: the worker is then inside the
 * model's load. */
static atomic_bool g_fail_threads;
static atomic_int g_fail_rc = EAGAIN; /* what a failing pthread_create returns */
static pthread_mutex_t g_gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_gate_cv = PTHREAD_COND_INITIALIZER;
static bool g_gate_armed, g_gate_reached;

int __real_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg);

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg)
{
    pthread_mutex_lock(&g_gate_mu);
    if (g_gate_armed && !g_gate_reached) {
        g_gate_reached = true;
        pthread_cond_broadcast(&g_gate_cv);
        while (g_gate_armed)
            pthread_cond_wait(&g_gate_cv, &g_gate_mu);
    }
    pthread_mutex_unlock(&g_gate_mu);
    if (atomic_load(&g_fail_threads))
        return atomic_load(&g_fail_rc);
    return __real_pthread_create(t, a, fn, arg);
}

static void gate_arm(void)
{
    pthread_mutex_lock(&g_gate_mu);
    g_gate_armed = true;
    g_gate_reached = false;
    pthread_mutex_unlock(&g_gate_mu);
}

static void gate_wait_reached(void)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += WAIT_MS / 1000;
    pthread_mutex_lock(&g_gate_mu);
    int rc = 0;
    while (!g_gate_reached && rc == 0)
        rc = pthread_cond_timedwait(&g_gate_cv, &g_gate_mu, &dl);
    bool reached = g_gate_reached;
    pthread_mutex_unlock(&g_gate_mu);
    assert_true(reached);
}

static void gate_open(void)
{
    pthread_mutex_lock(&g_gate_mu);
    g_gate_armed = false;
    pthread_cond_broadcast(&g_gate_cv);
    pthread_mutex_unlock(&g_gate_mu);
}

/* ---------------------------------------------------------------- fixture */

typedef struct fixture {
    char dir[64];        /* the agent's state directory */
    char cache[128];     /* its model cache */
    char cut_path[4096]; /* URL_CUT's cache file */
    agent_options o;
    agent_backend *b;
} fixture;

/* The cache file of url under f->cache, its directory made. */
static void cache_path(const fixture *f, const char *url, char *out, size_t n)
{
    char err[256];
    assert_int_equal(model_fetch_cache_path(url, f->cache, out, n, err, sizeof err), 0);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", out);
    *strrchr(dir, '/') = '\0';
    mkdir(f->cache, 0750);
    assert_int_equal(mkdir(dir, 0750), 0);
}

/* URL_OK's file is stories260K; URL_CUT's is its first 8 KiB. */
static void fill_cache(fixture *f)
{
    char path[4096];
    cache_path(f, URL_OK, path, sizeof path);
    assert_int_equal(symlink(STORIES, path), 0);
    cache_path(f, URL_CUT, f->cut_path, sizeof f->cut_path);
    static char buf[8192];
    FILE *in = fopen(STORIES, "rb");
    assert_non_null(in);
    assert_int_equal(fread(buf, 1, sizeof buf, in), sizeof buf);
    fclose(in);
    FILE *out = fopen(f->cut_path, "wb");
    assert_non_null(out);
    assert_int_equal(fwrite(buf, 1, sizeof buf, out), sizeof buf);
    fclose(out);
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    snprintf(f->dir, sizeof f->dir, "/tmp/gp_agent_deploy_XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->cache, sizeof f->cache, "%s/models", f->dir);
    fill_cache(f);
    f->o.backend = "cpu";
    f->o.slots = 1;
    f->o.threads = 1;
    f->o.ctx_size = 128;
    f->o.state_dir = f->dir;
    f->o.model_cache = f->cache;
    f->o.model_download_attempts = 1;
    f->o.deploy_capacity = 1;
    atomic_store(&g_fail_threads, false);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    atomic_store(&g_fail_threads, false);
    if (f->b)
        f->b->ops->destroy(f->b);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    assert_int_equal(system(cmd), 0);
    free(f);
    return 0;
}

static agent_backend *create(fixture *f)
{
    char err[512] = "";
    bool nomem = true;
    agent_backend *b = agent_backend_deploy_create(&f->o, &nomem, err, sizeof err);
    if (!b)
        fail_msg("deploy backend: %s", err);
    assert_false(nomem);
    agent_backend_deploy_hold_clock(b);
    return b;
}

/* The server's desired set: the one deployment `tiny` from url, or none. */
static json_t *want(const char *url)
{
    json_t *d = url ? json_pack("[{s:s,s:s}]", "name", "tiny", "source", url) : json_array();
    assert_non_null(d);
    return d;
}

static void deploy(agent_backend *b, const char *url)
{
    json_t *d = want(url);
    b->ops->deploy(b, d);
    json_decref(d);
}

static void wait_idle(agent_backend *b)
{
    assert_true(agent_backend_deploy_wait_idle(b, WAIT_MS));
}

/* What the poll says of deployment `tiny`: its state ("" when it has no
 * entry) and reason ("" without one). */
typedef struct dep_state {
    char state[32];
    char reason[256];
} dep_state;

static dep_state state_of(agent_backend *b)
{
    dep_state s = {"", ""};
    json_t *body = json_object();
    assert_non_null(body);
    b->ops->poll_facts(b, body);
    json_t *models = json_object_get(json_object_get(body, "deploy"), "models");
    assert_true(json_is_array(models));
    size_t i;
    json_t *m;
    json_array_foreach(models, i, m)
    {
        if (strcmp(json_string_value(json_object_get(m, "name")), "tiny") != 0)
            continue;
        snprintf(s.state, sizeof s.state, "%s", json_string_value(json_object_get(m, "state")));
        const char *r = json_string_value(json_object_get(m, "reason"));
        snprintf(s.reason, sizeof s.reason, "%s", r ? r : "");
    }
    json_decref(body);
    return s;
}

/* The reason of a retry: "retrying in <delay_s>s (try <n> of 10): ..." */
static void assert_retrying(const dep_state *s, unsigned delay_s, unsigned n)
{
    char want_prefix[64];
    snprintf(want_prefix, sizeof want_prefix, "retrying in %us (try %u of %d): ", delay_s, n,
             DEPLOY_RETRY_TRIES);
    if (strncmp(s->reason, want_prefix, strlen(want_prefix)) != 0)
        fail_msg("state %s, reason \"%s\": want \"%s...\"", s->state, s->reason, want_prefix);
}

static void assert_state(agent_backend *b, const char *state)
{
    dep_state s = state_of(b);
    if (strcmp(s.state, state) != 0)
        fail_msg("deployment tiny is \"%s\" (%s), want \"%s\"", s.state, s.reason, state);
}

/* The backoff of try n (1-based), in seconds. */
static unsigned delay_of(unsigned n)
{
    unsigned d = DEPLOY_RETRY_FIRST_S << (n - 1 < 5 ? n - 1 : 5);
    return d > DEPLOY_RETRY_MAX_S ? DEPLOY_RETRY_MAX_S : d;
}

/* One job's terminal event, collected by the sink (thread-safe). */
typedef struct rec {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_tokens, n_terminal;
    char reason[32], code[64];
} rec;

static void on_token(void *c, const char *t, size_t n, int32_t id)
{
    (void)t;
    (void)n;
    (void)id;
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    r->n_tokens++;
    pthread_mutex_unlock(&r->mu);
}

static void on_end(void *c, const char *reason, long long pt, long long ct)
{
    (void)pt;
    (void)ct;
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    snprintf(r->reason, sizeof r->reason, "%s", reason);
    r->n_terminal++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void on_error(void *c, const char *code, const char *msg)
{
    (void)msg;
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    snprintf(r->code, sizeof r->code, "%s", code);
    r->n_terminal++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* A greedy completion job for `tiny` runs to its end. */
static void assert_serves(agent_backend *b)
{
    rec r = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    agent_job_sink s = {.ctx = &r, .token = on_token, .end = on_end, .error = on_error};
    json_t *job = json_pack("{s:s,s:s,s:s,s:s,s:{s:i,s:f}}", "job_id", "job-1", "kind",
                            "completion", "model", "tiny", "prompt", "Once upon a time",
                            "params", "max_tokens", 8, "temperature", 0.0);
    assert_non_null(job);
    char err[256] = "";
    int rc = b->ops->job_start(b, job, &s, err, sizeof err);
    json_decref(job);
    if (rc != 0)
        fail_msg("job_start: %d %s", rc, err);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += WAIT_MS / 1000;
    pthread_mutex_lock(&r.mu);
    while (r.n_terminal == 0 && pthread_cond_timedwait(&r.cv, &r.mu, &dl) == 0)
        ;
    pthread_mutex_unlock(&r.mu);
    assert_int_equal(r.n_terminal, 1);
    if (r.code[0])
        fail_msg("the job ended with %s", r.code);
    assert_string_equal(r.reason, "length");
    assert_int_equal(r.n_tokens, 8);
}

/* ------------------------------------------------------------------ tests */

/* loading (held inside the load, at its first thread) -> ready, serving
 * a job under the deployment's name with one slot. */
static void test_loading_ready_serves(void **state)
{
    fixture *f = *state;
    agent_backend *b = f->b = create(f);
    gate_arm();
    deploy(b, URL_OK);
    gate_wait_reached();
    dep_state s = state_of(b);
    gate_open();
    assert_string_equal(s.state, "loading");
    assert_string_equal(s.reason, "");
    wait_idle(b);
    assert_state(b, "ready");
    assert_string_equal(state_of(b).reason, "");
    json_t *m = b->ops->models(b);
    assert_int_equal(json_array_size(m), 1);
    json_decref(m);
    int total = 0, usable = 0;
    b->ops->slots(b, &total, &usable);
    assert_int_equal(total, 1);
    assert_int_equal(usable, 1);
    assert_serves(b);
}

/* The N-th allocation of a deployment's fetch and load fails, N = 1, 2,
 * ... until a run ends without reaching it: the deployment is never failed
 * for it. It is ready (the failure got over), or waits for its first
 * retry (still "loading", or "downloading" where the fetch ran out), and
 * is ready and serving once the backoff is over. */
static void test_load_oom_retried(void **state)
{
    fixture *f = *state;
    json_t *d = want(URL_OK);
    int n_retried = 0;
    for (size_t n = 1;; n++) {
        agent_backend *b = f->b = create(f);
        arm_libc(n);
        b->ops->deploy(b, d);
        bool idle = agent_backend_deploy_wait_idle(b, WAIT_MS);
        const bool hit = disarm();
        assert_true(idle);
        dep_state s = state_of(b);
        if (strcmp(s.state, "ready") != 0) {
            if (!hit)
                fail_msg("run %zu without a failure: %s (%s)", n, s.state, s.reason);
            if (strcmp(s.state, "loading") != 0 && strcmp(s.state, "downloading") != 0)
                fail_msg("allocation %zu failed: the deployment is \"%s\" (%s), want it "
                         "retried", n, s.state, s.reason);
            assert_retrying(&s, DEPLOY_RETRY_FIRST_S, 1);
            n_retried++;
            agent_backend_deploy_advance(b, DEPLOY_RETRY_FIRST_S * 1000u);
            wait_idle(b);
            assert_state(b, "ready");
        }
        if (n % 16 == 1 || !hit)
            assert_serves(b); /* a sample: a job takes a while */
        b->ops->destroy(b);
        f->b = NULL;
        if (!hit)
            break;
    }
    json_decref(d);
    assert_true(n_retried > 5);
}

/* Every load runs out of threads (pthread_create EAGAIN): "loading",
 * retried after 5, 10, 20, 40, 80, 160, 160, ... seconds (not a
 * millisecond before), and failed after the tenth try, for good. */
static void test_backoff_then_failed(void **state)
{
    fixture *f = *state;
    agent_backend *b = f->b = create(f);
    atomic_store(&g_fail_threads, true);
    deploy(b, URL_OK);
    wait_idle(b);
    for (unsigned n = 1; n <= (unsigned)DEPLOY_RETRY_TRIES; n++) {
        dep_state s = state_of(b);
        assert_string_equal(s.state, "loading");
        assert_retrying(&s, delay_of(n), n);
        assert_non_null(strstr(s.reason, "cannot start a decode thread"));
        agent_backend_deploy_advance(b, delay_of(n) * 1000u - 1);
        wait_idle(b);
        s = state_of(b);
        assert_string_equal(s.state, "loading");
        assert_retrying(&s, delay_of(n), n); /* not tried yet */
        agent_backend_deploy_advance(b, 1);
        wait_idle(b);
    }
    dep_state s = state_of(b);
    assert_string_equal(s.state, "failed");
    assert_non_null(strstr(s.reason, "cannot start a decode thread"));
    assert_null(strstr(s.reason, "retrying"));
    atomic_store(&g_fail_threads, false);
    agent_backend_deploy_advance(b, 3600u * 1000u);
    wait_idle(b);
    assert_state(b, "failed");
}

/* A damaged file (cut inside its header) is failed at once, the reason
 * saying so, and not tried again however long the agent waits. */
static void test_damaged_failed(void **state)
{
    fixture *f = *state;
    agent_backend *b = f->b = create(f);
    deploy(b, URL_CUT);
    wait_idle(b);
    dep_state s = state_of(b);
    assert_string_equal(s.state, "failed");
    assert_non_null(strstr(s.reason, "FORMAT"));
    assert_null(strstr(s.reason, "retrying"));
    agent_backend_deploy_advance(b, 3600u * 1000u);
    wait_idle(b);
    s = state_of(b);
    assert_string_equal(s.state, "failed");
    assert_null(strstr(s.reason, "retrying"));
}

/* Three loads out of threads, then one that succeeds: ready, its reason
 * gone. Unloaded and deployed again, a load out of threads is the first
 * try again, not the fourth. */
static void test_tries_reset_when_ready(void **state)
{
    fixture *f = *state;
    agent_backend *b = f->b = create(f);
    atomic_store(&g_fail_threads, true);
    deploy(b, URL_OK);
    wait_idle(b);
    for (unsigned n = 1; n <= 3; n++) {
        dep_state s = state_of(b);
        assert_retrying(&s, delay_of(n), n);
        if (n == 3)
            atomic_store(&g_fail_threads, false);
        agent_backend_deploy_advance(b, delay_of(n) * 1000u);
        wait_idle(b);
    }
    assert_state(b, "ready");
    assert_string_equal(state_of(b).reason, "");
    assert_serves(b);
    deploy(b, NULL);
    wait_idle(b);
    assert_state(b, "");
    atomic_store(&g_fail_threads, true);
    deploy(b, URL_OK);
    wait_idle(b);
    dep_state s = state_of(b);
    assert_string_equal(s.state, "loading");
    assert_retrying(&s, DEPLOY_RETRY_FIRST_S, 1);
    atomic_store(&g_fail_threads, false);
    agent_backend_deploy_advance(b, DEPLOY_RETRY_FIRST_S * 1000u);
    wait_idle(b);
    assert_state(b, "ready");
}

/* The backend's start out of memory (every allocation N = 1, 2, ... until
 * one run reaches none) or of threads: NULL with *nomem (exit 1,
 * restarted), never a failure a restart cannot fix (exit 2). And the gguf
 * backend (--model) out of threads for its decode thread or the engine's
 * compute threads: the same; pthread_create's EPERM is not a shortage. */
static void test_start_nomem(void **state)
{
    fixture *f = *state;
    char err[512];
    for (size_t n = 1;; n++) {
        bool nomem = false;
        err[0] = '\0';
        arm_libc(n);
        agent_backend *b = agent_backend_deploy_create(&f->o, &nomem, err, sizeof err);
        const bool hit = disarm();
        if (b) {
            assert_false(nomem);
            b->ops->destroy(b);
            if (!hit)
                break;
            continue;
        }
        if (!nomem)
            fail_msg("allocation %zu failed: \"%s\" taken for what a restart cannot fix", n,
                     err);
    }
    atomic_store(&g_fail_threads, true);
    bool nomem = false;
    assert_null(agent_backend_deploy_create(&f->o, &nomem, err, sizeof err));
    assert_true(nomem);
    assert_non_null(strstr(err, "deployment thread"));

    agent_options o = f->o;
    o.model = STORIES;
    nomem = false;
    assert_null(agent_backend_gguf_create_status(&o, &nomem, err, sizeof err));
    assert_true(nomem);
    assert_non_null(strstr(err, "decode thread"));

    /* The engine's compute threads (--threads 2: one beside the caller)
     * out of threads: retried too, the error named; another error of
     * pthread_create is no shortage (exit 2). */
    o.threads = 2;
    nomem = false;
    assert_null(agent_backend_gguf_create_status(&o, &nomem, err, sizeof err));
    if (!nomem)
        fail_msg("compute thread EAGAIN: \"%s\" taken for what a restart cannot fix", err);
    assert_non_null(strstr(err, "compute thread"));
    assert_non_null(strstr(err, strerror(EAGAIN)));
    atomic_store(&g_fail_rc, EPERM);
    nomem = true;
    assert_null(agent_backend_gguf_create_status(&o, &nomem, err, sizeof err));
    assert_false(nomem);
    assert_non_null(strstr(err, strerror(EPERM)));
    atomic_store(&g_fail_rc, EAGAIN);
    atomic_store(&g_fail_threads, false);
}

/* The same shape: objects with the same keys, arrays of the same length,
 * all the way down (values may differ: free memory, idle times). */
static bool same_shape(const json_t *a, const json_t *b)
{
    if (json_typeof(a) != json_typeof(b))
        return false;
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b))
            return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!same_shape(json_array_get(a, i), json_array_get(b, i)))
                return false;
    } else if (json_is_object(a)) {
        if (json_object_size(a) != json_object_size(b))
            return false;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)a, k, v)
        {
            const json_t *w = json_object_get(b, k);
            if (!w || !same_shape(v, w))
                return false;
        }
    }
    return true;
}

/* A ready deployment's heartbeat facts when the N-th allocation fails, N
 * = 1, 2, ... until a run reaches none: models() is the whole list
 * (supports_embeddings, digest and all) or NULL, poll_facts the whole
 * body ("deploy.models" naming the deployment) or -1: never less than
 * the truth, which routes wrongly (embeddings to a model that seems to
 * have none, a replica the server moves away). */
static void test_facts_whole_or_failed(void **state)
{
    fixture *f = *state;
    agent_backend *b = f->b = create(f);
    deploy(b, URL_OK);
    wait_idle(b);
    assert_state(b, "ready");
    json_t *want_m = b->ops->models(b), *want_p = json_object();
    assert_non_null(want_m);
    assert_non_null(want_p);
    assert_int_equal(b->ops->poll_facts(b, want_p), 0);
    json_t *m0 = json_array_get(want_m, 0);
    assert_true(json_is_true(json_object_get(m0, "supports_embeddings")));
    assert_true(json_is_string(json_object_get(m0, "digest")));
    json_t *want_dm = json_object_get(json_object_get(want_p, "deploy"), "models");
    assert_int_equal(json_array_size(want_dm), 1);
    int n_failed = 0;
    for (size_t n = 1;; n++) {
        json_t *body = json_object();
        assert_non_null(body);
        arm_libc(n);
        json_t *m = b->ops->models(b);
        int rc = b->ops->poll_facts(b, body);
        const bool hit = disarm();
        if (m && !json_equal(m, want_m)) {
            char *got = json_dumps(m, JSON_COMPACT);
            fail_msg("allocation %zu failed: models() is %s, not whole", n, got);
        }
        if (rc == 0 && (!same_shape(body, want_p) ||
                        !json_equal(json_object_get(json_object_get(body, "deploy"), "models"),
                                    want_dm))) {
            char *got = json_dumps(body, JSON_COMPACT);
            fail_msg("allocation %zu failed: poll_facts gave 0 with %s, not whole", n, got);
        }
        if (!m || rc < 0) {
            if (!hit)
                fail_msg("run %zu without a failure: models %p, poll_facts %d", n, (void *)m, rc);
            n_failed++;
        }
        json_decref(m);
        json_decref(body);
        if (!hit)
            break;
    }
    json_decref(want_m);
    json_decref(want_p);
    assert_true(n_failed > 5);
}

int main(void)
{
    gp_json_init();
    gpe_set_json_alloc_failures(gp_json_alloc_failures);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_loading_ready_serves, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_failed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backoff_then_failed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tries_reset_when_ready, setup, teardown),
        cmocka_unit_test_setup_teardown(test_start_nomem, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_oom_retried, setup, teardown),
        cmocka_unit_test_setup_teardown(test_facts_whole_or_failed, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
