/*
 * threadpool: persistent worker threads for the engine's data-parallel work.
 *
 * A gpe_ctx owns one pool. gpe_decode calls gpe_pool_run dozens of times
 * per token (one per matmul / attention step), so dispatch latency matters
 * more than anything else here: workers spin for a short while after each
 * job, watching a generation counter, and only then sleep on a condition
 * variable. A job that arrives while they still spin starts within well
 * under a microsecond; one that arrives after they slept costs a wake-up.
 *
 * The calling thread takes part as worker 0, so a pool of n threads starts
 * n-1 OS threads (a pool of 1 starts none and runs jobs inline).
 *
 * Usage:
 *
 *   static void job(void *arg, int ith, int nth) {
 *       struct work *w = arg;
 *       int64_t lo, hi;
 *       gpe_pool_split(w->rows, ith, nth, &lo, &hi);
 *       for (int64_t r = lo; r < hi; r++) ...;
 *   }
 *   gpe_pool *p = gpe_pool_create(0);       // 0 = online CPUs
 *   gpe_pool_run(p, job, &w);               // returns when every worker is done
 *   gpe_pool_destroy(p);
 *
 * Contract: a pool is driven by one thread at a time (its owner); fn must
 * not call gpe_pool_run on the same pool. Memory written by workers inside
 * fn is visible to the caller after gpe_pool_run returns, and everything the
 * caller wrote before gpe_pool_run is visible to the workers inside fn.
 * Internal to the engine (libc + pthreads only).
 */
#ifndef GPE_THREADPOOL_H
#define GPE_THREADPOOL_H

#include <stdint.h>

typedef struct gpe_pool gpe_pool;

/* Job body: called once on each worker with ith in [0, nth). */
typedef void (*gpe_pool_fn)(void *arg, int ith, int nth);

/* n_threads <= 0 means the number of online CPUs; values are clamped to
 * [1, 512]. Returns NULL when memory or threads cannot be had (any threads
 * already started are joined first). */
gpe_pool *gpe_pool_create(int n_threads);
/* The same, and on NULL *why says what failed: ENOMEM (an allocation) or
 * the error pthread_create (or the mutex / condition variable's init)
 * returned, e.g. EAGAIN when the system is short of threads for now. 0 on
 * success. why may be NULL. */
gpe_pool *gpe_pool_create_status(int n_threads, int *why);
/* Joins the workers. The pool must be idle (no gpe_pool_run in progress).
 * NULL is a no-op. */
void gpe_pool_destroy(gpe_pool *p);
/* Number of workers, the calling thread included (>= 1). */
int gpe_pool_size(const gpe_pool *p);
/* Run fn(arg, ith, nth) on every worker (nth = gpe_pool_size) and return
 * when all of them have returned. The caller runs ith = 0. */
void gpe_pool_run(gpe_pool *p, gpe_pool_fn fn, void *arg);
/* Same, but only workers 0..nth-1 run fn (1 <= nth <= size; larger values
 * are clamped): for jobs too small to be worth every thread. */
void gpe_pool_run_n(gpe_pool *p, int nth, gpe_pool_fn fn, void *arg);

/* Split [0, n) into nth nearly equal contiguous chunks; worker ith gets
 * [*lo, *hi) (possibly empty). The first n % nth chunks are one longer. */
static inline void gpe_pool_split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi)
{
    int64_t base = n / nth, rem = n % nth;
    int64_t start = ith * base + (ith < rem ? ith : rem);
    *lo = start;
    *hi = start + base + (ith < rem ? 1 : 0);
}

#endif
