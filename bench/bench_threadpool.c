/* Thread pool dispatch latency: µs per gpe_pool_run with an empty job, for a
 * back-to-back loop (workers spinning) and with a gap longer than the spin
 * window (workers asleep, so each run pays a wake-up). Printed only.
 *
 *   bench_threadpool [n_threads=2] [iterations=200000]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "engine/threadpool.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void nop(void *arg, int ith, int nth) { (void)arg; (void)ith; (void)nth; }

int main(int argc, char **argv)
{
    int nt = argc > 1 ? atoi(argv[1]) : 2;
    int iters = argc > 2 ? atoi(argv[2]) : 200000;
    if (iters < 1)
        iters = 1;
    gpe_pool *p = gpe_pool_create(nt);
    if (!p) {
        fprintf(stderr, "bench_threadpool: cannot create pool\n");
        return 1;
    }
    for (int i = 0; i < 1000; i++)
        gpe_pool_run(p, nop, NULL);
    double t0 = now_us();
    for (int i = 0; i < iters; i++)
        gpe_pool_run(p, nop, NULL);
    double hot = (now_us() - t0) / iters;

    int cold_iters = 200;
    double cold = 0;
    for (int i = 0; i < cold_iters; i++) {
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
        double t = now_us();
        gpe_pool_run(p, nop, NULL);
        cold += now_us() - t;
    }
    printf("threadpool n_threads=%d: hot %.3f us/run (%d runs), after sleep %.2f us/run (%d runs)\n",
           gpe_pool_size(p), hot, iters, cold / cold_iters, cold_iters);
    gpe_pool_destroy(p);
    return 0;
}
