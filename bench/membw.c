/*
 * membw: this machine's memory read bandwidth, for the engine benchmark
 * (bench/engine-bench.sh). Generation on CPU is bound by reading every
 * weight once per token, so tokens/s x bytes per token / this figure says
 * how close the engine gets to the hardware.
 *
 *   membw [--mib 1024] [--passes 6] [--threads 1,2] [--json]
 *
 * Method: one buffer of --mib MiB (far larger than the caches), touched
 * first so that page faults are not timed; then each thread sums its own
 * contiguous share of 64-bit words, with 8 independent accumulators so that
 * the loop is limited by loads, not by the add chain. Best of --passes (the
 * host is shared and noisy; the best pass is the least disturbed). Printed,
 * never asserted.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct job {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
    pthread_barrier_t *bar;
} job;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *reader(void *arg)
{
    job *j = arg;
    pthread_barrier_wait(j->bar);
    uint64_t s[8] = { 0 };
    size_t i = 0;
    for (; i + 8 <= j->n; i += 8)
        for (int k = 0; k < 8; k++)
            s[k] += j->p[i + k];
    for (; i < j->n; i++)
        s[0] += j->p[i];
    j->sum = s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
    return NULL;
}

/* One pass with nt threads; returns GB/s (1e9 bytes). */
static double pass(const uint64_t *buf, size_t words, int nt, uint64_t *sink)
{
    pthread_t th[64];
    job jobs[64];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)nt + 1);
    for (int t = 0; t < nt; t++) {
        size_t lo = words * (size_t)t / (size_t)nt, hi = words * (size_t)(t + 1) / (size_t)nt;
        jobs[t] = (job){ buf + lo, hi - lo, 0, &bar };
        pthread_create(&th[t], NULL, reader, &jobs[t]);
    }
    double t0 = now();
    pthread_barrier_wait(&bar);
    for (int t = 0; t < nt; t++) {
        pthread_join(th[t], NULL);
        *sink += jobs[t].sum;
    }
    double dt = now() - t0;
    pthread_barrier_destroy(&bar);
    return (double)words * 8.0 / dt / 1e9;
}

static long num(const char *opt, const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "membw: %s: '%s' must be an integer in [%ld, %ld]\n", opt, s, lo, hi);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    long mib = 1024, passes = 6;
    int threads[16] = { 1, 2 }, n_threads = 2;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc) {
            mib = num("--mib", argv[++i], 16, 1 << 20);
        } else if (strcmp(argv[i], "--passes") == 0 && i + 1 < argc) {
            passes = num("--passes", argv[++i], 1, 1000);
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            char *list = argv[++i], *save = NULL;
            n_threads = 0;
            for (char *t = strtok_r(list, ",", &save); t && n_threads < 16;
                 t = strtok_r(NULL, ",", &save))
                threads[n_threads++] = (int)num("--threads", t, 1, 64);
        } else if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else {
            fprintf(stderr, "usage: membw [--mib N] [--passes N] [--threads 1,2] [--json]\n");
            return strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    size_t words = (size_t)mib * 1024 * 1024 / 8;
    uint64_t *buf = malloc(words * 8);
    if (!buf) {
        fprintf(stderr, "membw: cannot allocate %ld MiB\n", mib);
        return 1;
    }
    for (size_t i = 0; i < words; i++)   /* touch every page, non-zero data */
        buf[i] = i * 0x9E3779B97F4A7C15ull;
    uint64_t sink = 0;
    for (int k = 0; k < n_threads; k++) {
        double best = 0;
        for (long p = 0; p < passes; p++) {
            double g = pass(buf, words, threads[k], &sink);
            if (g > best)
                best = g;
        }
        if (json)
            printf("{\"threads\":%d,\"read_GBps\":%.2f,\"mib\":%ld,\"passes\":%ld}\n", threads[k],
                   best, mib, passes);
        else
            printf("read bandwidth, %d thread%s: %.2f GB/s (best of %ld passes over %ld MiB)\n",
                   threads[k], threads[k] > 1 ? "s" : "", best, passes, mib);
    }
    free(buf);
    return sink == 42 ? 3 : 0;   /* use the sums so the reads are not optimised away */
}
