/* Unit tests for src/engine/threadpool.c: every index visited exactly once,
 * across many runs and pool sizes; run_n; split arithmetic; idle destroy. */
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
