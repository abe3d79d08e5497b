/*
 * threadpool: persistent workers that spin, then sleep, between jobs.
 * Interface and contract in threadpool.h.
 *
 * Protocol. The owner publishes a job (fn, arg, nth) in plain fields, then
 * bumps `gen` (seq_cst). Each worker remembers the last generation it ran;
 * when `gen` differs it runs the job (or nothing, if its index is >= nth)
 * and increments `n_done`. The owner runs index 0 itself and then waits for
 * n_done == size-1. Every worker acknowledges every job, so no worker can
 * miss or run a generation twice, and the job fields are never rewritten
 * while a worker might still read them.
 *
 * Sleeping. A worker that saw no new generation for SPIN_NS goes to sleep:
 * under the mutex it increments n_sleeping, re-checks gen and waits on the
 * condition variable. The owner, after bumping gen, takes the mutex and
 * broadcasts only when n_sleeping > 0. Both sides use seq_cst on gen and
 * n_sleeping, so either the owner sees the sleeper (and wakes it) or the
 * sleeper sees the new gen (and does not wait): no lost wake-ups. While the
 * workers spin, dispatch costs no system call at all.
 */
#include "engine/threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define POOL_MAX_THREADS 512
/* How long an idle worker keeps spinning before it sleeps. Between the
 * gpe_pool_run calls of one decode the gap is a few microseconds; between
 * tokens (sampling, streaming) it can be a few hundred. 200 µs covers the
 * former with a wide margin without burning a core between requests. */
#define SPIN_NS 200000L
/* The owner waits for the workers by spinning too, yielding the CPU after
 * this many polls so that an oversubscribed machine still makes progress. */
#define OWNER_SPINS_BEFORE_YIELD 4096

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

struct worker {
    gpe_pool *pool;
    int ith;
    pthread_t tid;
};

struct gpe_pool {
    int n;                     /* workers including the owner */
    struct worker *workers;    /* n entries; [0] is the owner (no thread) */
    int n_started;             /* OS threads actually started */

    /* The current job; written by the owner only while all workers are idle. */
    gpe_pool_fn fn;
    void *arg;
    int nth;

    /* Separate cache lines: gen is read by every spinning worker, n_done is
     * written by every worker at the end of each job. */
    _Alignas(64) atomic_uint gen;
    _Alignas(64) atomic_int n_done;
    _Alignas(64) atomic_int n_sleeping;
    atomic_bool stop;

    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Wait until gen differs from `seen`; returns the new generation. */
static unsigned wait_for_job(gpe_pool *p, unsigned seen)
{
    unsigned g;
    int64_t deadline = 0;
    for (unsigned i = 0;; i++) {
        g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen)
            return g;
        cpu_relax();
        /* Read the clock only now and then: it costs ~20 ns via the vDSO. */
        if ((i & 63) == 63) {
            int64_t t = now_ns();
            if (deadline == 0)
                deadline = t + SPIN_NS;
            else if (t >= deadline)
                break;
        }
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->n_sleeping, 1);
    while ((g = atomic_load(&p->gen)) == seen)
        pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub(&p->n_sleeping, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *argp)
{
    struct worker *w = argp;
    gpe_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        seen = wait_for_job(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            break;
        if (w->ith < p->nth)
            p->fn(p->arg, w->ith, p->nth);
        atomic_fetch_add_explicit(&p->n_done, 1, memory_order_release);
    }
    return NULL;
}

/* Publish a new generation and wake sleepers if there are any. */
static void publish(gpe_pool *p)
{
    atomic_fetch_add(&p->gen, 1); /* seq_cst: pairs with the sleeper's n_sleeping++ */
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

static void join_all(gpe_pool *p)
{
    if (p->n_started > 0) {
        atomic_store(&p->stop, true);
        pthread_mutex_lock(&p->mu);
        atomic_fetch_add(&p->gen, 1);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        for (int i = 1; i <= p->n_started; i++)
            pthread_join(p->workers[i].tid, NULL);
    }
    p->n_started = 0;
}

gpe_pool *gpe_pool_create(int n_threads)
{
    return gpe_pool_create_status(n_threads, NULL);
}

gpe_pool *gpe_pool_create_status(int n_threads, int *why)
{
    gpe_pool *p = NULL;
    int rc = ENOMEM;
    if (why)
        *why = 0;
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)(c < POOL_MAX_THREADS ? c : POOL_MAX_THREADS) : 1;
    }
    if (n_threads > POOL_MAX_THREADS)
        n_threads = POOL_MAX_THREADS;

    p = aligned_alloc(64, (sizeof *p + 63) / 64 * 64);
    if (!p)
        goto fail;
    *p = (gpe_pool){.n = n_threads, .nth = n_threads};
    atomic_init(&p->gen, 0);
    atomic_init(&p->n_done, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->stop, false);
    if ((rc = pthread_mutex_init(&p->mu, NULL)) != 0) {
        free(p);
        p = NULL;
        goto fail;
    }
    if ((rc = pthread_cond_init(&p->cv, NULL)) != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        p = NULL;
        goto fail;
    }
    rc = ENOMEM;
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->workers)
        goto fail;
    for (int i = 0; i < n_threads; i++) {
        p->workers[i].pool = p;
        p->workers[i].ith = i;
    }

    /* Workers inherit the creator's signal mask: block everything so that
     * process signals (SIGINT, SIGTERM, SIGPIPE) keep going to the
     * application's own threads, never to a compute worker. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = 0;
    for (int i = 1; i < n_threads; i++) {
        if ((rc = pthread_create(&p->workers[i].tid, NULL, worker_main, &p->workers[i])) != 0)
            break;
        p->n_started = i;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        goto fail;
    return p;

fail:
    /* The caller tells a shortage (ENOMEM, EAGAIN: a later try may work)
     * from anything else by this. */
    if (why)
        *why = rc;
    gpe_pool_destroy(p);
    return NULL;
}

void gpe_pool_destroy(gpe_pool *p)
{
    if (!p)
        return;
    join_all(p);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p);
}

int gpe_pool_size(const gpe_pool *p)
{
    return p ? p->n : 1;
}

void gpe_pool_run_n(gpe_pool *p, int nth, gpe_pool_fn fn, void *arg)
{
    if (nth < 1)
        nth = 1;
    if (!p || p->n == 1 || nth == 1) {
        /* Nothing to hand out: run inline and skip the handshake. */
        fn(arg, 0, 1);
        return;
    }
    if (nth > p->n)
        nth = p->n;
    p->fn = fn;
    p->arg = arg;
    p->nth = nth;
    atomic_store_explicit(&p->n_done, 0, memory_order_relaxed);
    publish(p);

    fn(arg, 0, nth);

    int want = p->n - 1;
    for (unsigned i = 1; atomic_load_explicit(&p->n_done, memory_order_acquire) != want; i++) {
        if (i % OWNER_SPINS_BEFORE_YIELD == 0)
            sched_yield();
        else
            cpu_relax();
    }
}

void gpe_pool_run(gpe_pool *p, gpe_pool_fn fn, void *arg)
{
    gpe_pool_run_n(p, p ? p->n : 1, fn, arg);
}
