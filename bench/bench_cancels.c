/*
 * bench_cancels: what one agent's poll pays for the cancel records
 * (docs/scheduling.md "Cancel records"): with A agents and R outstanding
 * records spread over them (one agent, the polling one, holding 4), per
 * poll, in microseconds, p50 and p99 of:
 *   - add: a new record for the polling agent (jobs_cancel_add, which
 *     first looks for the same (agent, job): cancels are idempotent),
 *   - pending: the poll's command list (gps_jobs_pending_cancels),
 *   - sent: the written reply drops what it carried (gps_jobs_cancels_sent).
 * The records are made by the jobs module's own private add (a job's end,
 * a failover), the one thing here that is not the public API: making
 * 10,000 agents and jobs through the fleet to get them would measure the
 * fleet. No event base: the sweep is not run. Printed, never asserted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/jobs/jobs.h"
/* jobs_cancel_add: the module's private record maker (see above). */
#include "server/jobs/jobs_priv.h"

#define POLLS 2000
#define OWN 4 /* the polling agent's records per poll */

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void agent_id(int i, char *out, size_t cap)
{
    snprintf(out, cap, "00000000-0000-4000-8000-%012x", i);
}

static void job_id(int i, char *out, size_t cap)
{
    snprintf(out, cap, "job-%08x", i);
}

static void pct(const char *what, double *t, size_t n)
{
    qsort(t, n, sizeof *t, cmp_d);
    printf(" %s %7.2f/%7.2f", what, t[n / 2], t[n * 99 / 100]);
}

static int run(int agents, int records)
{
    gps_jobs_opts o = {.max_queue = 10, .queue_timeout_sec = 60, .request_timeout_sec = 60,
                       .stall_timeout_sec = 60, .max_attempts = 3, .poll_interval_sec = 1};
    gps_jobs *j = gps_jobs_new(NULL, &o, NULL, NULL, NULL, NULL);
    double *t = malloc(3 * POLLS * sizeof *t);
    if (!j || !t) {
        fprintf(stderr, "bench_cancels: out of memory\n");
        return 1;
    }
    char a[64], id[40];
    for (int i = 0; i < records; i++) {
        agent_id(1 + i % agents, a, sizeof a);
        job_id(i, id, sizeof id);
        jobs_cancel_add(j, a, id);
    }
    char me[64];
    agent_id(agents + 1, me, sizeof me); /* the polling agent */
    int next = records;
    for (int p = 0; p < POLLS; p++) {
        double t0 = now_us();
        for (int k = 0; k < OWN; k++) {
            job_id(next++, id, sizeof id);
            jobs_cancel_add(j, me, id);
        }
        double t1 = now_us();
        json_t *cmds = gps_jobs_pending_cancels(j, me);
        double t2 = now_us();
        if (json_array_size(cmds) != OWN) {
            fprintf(stderr, "bench_cancels: %zu commands, not %d\n", json_array_size(cmds), OWN);
            return 1;
        }
        gps_jobs_cancels_sent(j, me, cmds);
        double t3 = now_us();
        json_decref(cmds);
        t[p] = (t1 - t0) / OWN;
        t[POLLS + p] = t2 - t1;
        t[2 * POLLS + p] = t3 - t2;
    }
    printf("%-7d %-8d", agents, records);
    pct("add", t, POLLS);
    pct("pending", t + POLLS, POLLS);
    pct("sent", t + 2 * POLLS, POLLS);
    printf("\n");
    free(t);
    gps_jobs_free(j);
    return 0;
}

int main(void)
{
    static const int sizes[][2] = {{100, 100}, {1000, 1000}, {10000, 10000}, {10000, 100000}};
    printf("agents  records   (per poll of one agent holding %d, us p50/p99)\n", OWN);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        if (run(sizes[s][0], sizes[s][1]) != 0)
            return 1;
    return 0;
}
