/* Unit tests for src/engine/threadpool.c: every index visited exactly once,
 * across many runs and pool sizes; run_n; split arithmetic; idle destroy.
 * And a pool whose k-th thread cannot start (pthread_create fails through
 * the linker's --wrap, part-30-threadpool.cmake): NULL with the system's
 * error, every thread it started joined; the engine's context over it
 * (gpe_ctx_init on stories260K) says GPE_ERR_NOMEM for EAGAIN (threads
 * short for now, a later try may work), naming the error, and
 * GPE_ERR_BACKEND for what a retry does not fix. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdatomic.h>

#include <cmocka.h>

#include "engine/threadpool.h"
#include "gpupool/engine.h"

#define MODEL GP_SOURCE_DIR "/models/stories260K.gguf"

/* ------------------------------------ pthread_create / _join through --wrap */

/* g_fail_at > 0: the g_fail_at-th pthread_create from now fails with
 * g_fail_rc (and none after it is tried: the pool stops at the first).
 * g_live counts threads started and not yet joined. */
static atomic_int g_fail_at, g_fail_rc, g_creates, g_live;

int __real_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg);
int __real_pthread_join(pthread_t t, void **ret);
int __wrap_pthread_join(pthread_t t, void **ret);

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg)
{
    int k = atomic_fetch_add(&g_creates, 1) + 1;
    int at = atomic_load(&g_fail_at);
    if (at > 0 && k >= at)
        return atomic_load(&g_fail_rc);
    int rc = __real_pthread_create(t, a, fn, arg);
    if (rc == 0)
        atomic_fetch_add(&g_live, 1);
    return rc;
}

int __wrap_pthread_join(pthread_t t, void **ret)
{
    int rc = __real_pthread_join(t, ret);
    if (rc == 0)
        atomic_fetch_sub(&g_live, 1);
    return rc;
}

static void fail_threads(int at, int rc)
{
    atomic_store(&g_creates, 0);
    atomic_store(&g_fail_rc, rc);
    atomic_store(&g_fail_at, at);
}


struct visit_job {
    int64_t n;
    atomic_int *hits;      /* n counters */
    atomic_int calls;      /* fn invocations */
    atomic_int seen_nth;   /* nth observed by any worker (must all agree) */
    atomic_int ith_mask;   /* bit per ith (for nth <= 31) */
};

static void visit(void *arg, int ith, int nth)
{
    struct visit_job *j = arg;
    int64_t lo, hi;
    gpe_pool_split(j->n, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++)
        atomic_fetch_add_explicit(&j->hits[i], 1, memory_order_relaxed);
    atomic_fetch_add(&j->calls, 1);
    int prev = atomic_exchange(&j->seen_nth, nth);
    assert_true(prev == 0 || prev == nth);
    if (ith < 31)
        atomic_fetch_or(&j->ith_mask, 1 << ith);
}

static void check_pool(int n_threads, int runs)
{
    gpe_pool *p = gpe_pool_create(n_threads);
    assert_non_null(p);
    assert_int_equal(gpe_pool_size(p), n_threads);
    for (int r = 0; r < runs; r++) {
        int64_t n = (r * 7919) % 1000;   /* includes 0 and sizes smaller than nth */
        struct visit_job j = {.n = n};
        j.hits = calloc((size_t)(n ? n : 1), sizeof *j.hits);
        assert_non_null(j.hits);
        gpe_pool_run(p, visit, &j);
        for (int64_t i = 0; i < n; i++)
            assert_int_equal(atomic_load(&j.hits[i]), 1);
        assert_int_equal(atomic_load(&j.calls), n_threads);
        assert_int_equal(atomic_load(&j.seen_nth), n_threads);
        assert_int_equal(atomic_load(&j.ith_mask), (int)((1u << n_threads) - 1));
        free(j.hits);
    }
    gpe_pool_destroy(p);
}

static void test_pool_1(void **state) { (void)state; check_pool(1, 200); }
static void test_pool_2(void **state) { (void)state; check_pool(2, 2000); }
static void test_pool_8(void **state) { (void)state; check_pool(8, 500); }

static void test_pool_run_n(void **state)
{
    (void)state;
    gpe_pool *p = gpe_pool_create(4);
    assert_non_null(p);
    for (int nth = 1; nth <= 6; nth++) {
        struct visit_job j = {.n = 37};
        j.hits = calloc(37, sizeof *j.hits);
        gpe_pool_run_n(p, nth, visit, &j);
        int eff = nth > 4 ? 4 : nth;
        for (int i = 0; i < 37; i++)
            assert_int_equal(atomic_load(&j.hits[i]), 1);
        assert_int_equal(atomic_load(&j.calls), eff);
        assert_int_equal(atomic_load(&j.seen_nth), eff);
        assert_int_equal(atomic_load(&j.ith_mask), (1 << eff) - 1);
        free(j.hits);
    }
    gpe_pool_destroy(p);
}

/* Results written by workers are visible to the caller after run returns
 * (no atomics on the data itself). */
struct sum_job {
    const int32_t *v;
    int64_t n;
    int64_t partial[8];
};

static void sum_fn(void *arg, int ith, int nth)
{
    struct sum_job *j = arg;
    int64_t lo, hi, s = 0;
    gpe_pool_split(j->n, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++)
        s += j->v[i];
    j->partial[ith] = s;
}

static void test_pool_sum_visibility(void **state)
{
    (void)state;
    enum { N = 100003 };
    int32_t *v = malloc(N * sizeof *v);
    assert_non_null(v);
    gpe_pool *p = gpe_pool_create(3);
    assert_non_null(p);
    for (int r = 0; r < 300; r++) {
        int64_t want = 0;
        for (int i = 0; i < N; i++) {
            v[i] = (i * 31 + r) % 1009 - 500;
            want += v[i];
        }
        struct sum_job j = {.v = v, .n = N};
        gpe_pool_run(p, sum_fn, &j);
        int64_t got = 0;
        for (int t = 0; t < 3; t++)
            got += j.partial[t];
        assert_int_equal(got, want);
    }
    gpe_pool_destroy(p);
    free(v);
}

static void test_split(void **state)
{
    (void)state;
    for (int64_t n = 0; n < 50; n++) {
        for (int nth = 1; nth <= 9; nth++) {
            int64_t next = 0;
            for (int ith = 0; ith < nth; ith++) {
                int64_t lo, hi;
                gpe_pool_split(n, ith, nth, &lo, &hi);
                assert_int_equal(lo, next);
                assert_true(hi >= lo);
                assert_true(hi - lo <= n / nth + 1);
                assert_true(hi - lo >= n / nth);
                next = hi;
            }
            assert_int_equal(next, n);
        }
    }
}

static void nop(void *arg, int ith, int nth) { (void)arg; (void)ith; (void)nth; }

/* Create and destroy while idle, with and without jobs run, including after
 * the workers have gone to sleep (destroy must wake them). */
static void test_destroy_idle(void **state)
{
    (void)state;
    for (int i = 0; i < 20; i++) {
        gpe_pool *p = gpe_pool_create(1 + i % 5);
        assert_non_null(p);
        if (i % 2)
            gpe_pool_run(p, nop, NULL);
        gpe_pool_destroy(p);
    }
    gpe_pool_destroy(NULL);
    gpe_pool *p = gpe_pool_create(0);  /* online CPUs */
    assert_non_null(p);
    assert_true(gpe_pool_size(p) >= 1);
    gpe_pool_destroy(p);
}

/* Jobs after the workers slept: a run must wake them (no lost wake-up). The
 * sleep is not an assertion, it only makes the sleeping path likely. */
static void test_wake_after_sleep(void **state)
{
    (void)state;
    gpe_pool *p = gpe_pool_create(2);
    assert_non_null(p);
    for (int r = 0; r < 5; r++) {
        struct timespec ts = {0, 2 * 1000 * 1000};   /* > spin window */
        nanosleep(&ts, NULL);
        struct visit_job j = {.n = 10};
        j.hits = calloc(10, sizeof *j.hits);
        gpe_pool_run(p, visit, &j);
        for (int i = 0; i < 10; i++)
            assert_int_equal(atomic_load(&j.hits[i]), 1);
        free(j.hits);
    }
    gpe_pool_destroy(p);
}

/* A pool of 6 whose k-th thread (k = 1..5) cannot start: NULL, *why the
 * error pthread_create gave, the k-1 threads started before it joined
 * (ASan's leak check sees the memory). Then the same pool starts. */
static void test_create_thread_fails(void **state)
{
    (void)state;
    const int rcs[] = {EAGAIN, EPERM};
    for (size_t r = 0; r < sizeof rcs / sizeof rcs[0]; r++)
        for (int k = 1; k <= 5; k++) {
            fail_threads(k, rcs[r]);
            int why = -1;
            gpe_pool *p = gpe_pool_create_status(6, &why);
            fail_threads(0, 0);
            assert_null(p);
            assert_int_equal(why, rcs[r]);
            assert_int_equal(atomic_load(&g_live), 0);
        }
    int why = -1;
    gpe_pool *p = gpe_pool_create_status(6, &why);
    assert_non_null(p);
    assert_int_equal(why, 0);
    assert_int_equal(atomic_load(&g_live), 5);
    gpe_pool_destroy(p);
    assert_int_equal(atomic_load(&g_live), 0);
}

/* gpe_ctx_init on stories260K with 4 threads whose k-th cannot start:
 * EAGAIN is GPE_ERR_NOMEM (not the model's fault: the agent retries) with
 * err naming the error; EPERM is GPE_ERR_BACKEND, not out of memory.
 * Nothing stays running; the model still makes a context afterwards. */
static void test_ctx_threads_short(void **state)
{
    (void)state;
    char err[256];
    gpe_model *m = NULL;
    gpe_model_params mp = gpe_model_default_params();
    if (gpe_model_load(MODEL, &mp, &m, err, sizeof err) != GPE_OK)
        fail_msg("load: %s", err);
    gpe_ctx_params cp = gpe_ctx_default_params();
    cp.n_ctx = 64;
    cp.n_threads = 4;
    for (int k = 1; k <= 3; k++) {
        gpe_ctx *c = NULL;
        err[0] = '\0';
        fail_threads(k, EAGAIN);
        gpe_status st = gpe_ctx_init(m, &cp, &c, err, sizeof err);
        fail_threads(0, 0);
        if (st != GPE_ERR_NOMEM)
            fail_msg("thread %d: EAGAIN gave %s (%s), want NOMEM", k, gpe_status_name(st), err);
        assert_null(c);
        assert_non_null(strstr(err, strerror(EAGAIN)));
        assert_non_null(strstr(err, "out of memory or threads"));
        assert_int_equal(atomic_load(&g_live), 0);

        fail_threads(k, EPERM);
        st = gpe_ctx_init(m, &cp, &c, err, sizeof err);
        fail_threads(0, 0);
        if (st != GPE_ERR_BACKEND)
            fail_msg("thread %d: EPERM gave %s (%s), want BACKEND", k, gpe_status_name(st), err);
        assert_null(c);
        assert_non_null(strstr(err, strerror(EPERM)));
        assert_null(strstr(err, "out of memory"));
        assert_int_equal(atomic_load(&g_live), 0);
    }
    gpe_ctx *c = NULL;
    assert_int_equal(gpe_ctx_init(m, &cp, &c, err, sizeof err), GPE_OK);
    gpe_ctx_free(c);
    assert_int_equal(atomic_load(&g_live), 0);
    gpe_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_pool_1),
        cmocka_unit_test(test_pool_2),
        cmocka_unit_test(test_pool_8),
        cmocka_unit_test(test_pool_run_n),
        cmocka_unit_test(test_pool_sum_visibility),
        cmocka_unit_test(test_destroy_idle),
        cmocka_unit_test(test_wake_after_sleep),
        cmocka_unit_test(test_create_thread_fails),
        cmocka_unit_test(test_ctx_threads_short),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
