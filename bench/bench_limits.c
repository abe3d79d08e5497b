/*
 * bench_limits: what per-key limits cost a request on the loop thread
 * (printed, never asserted). For a cache of K keys (1, 100, 1000, 10000),
 * times gps_limits_admit + gps_limits_may_start + started/ended, the calls
 * jobs.c makes per submitted job, on a key with rpm and max_concurrent set,
 * against the same calls for a request with no key. Memory-only (no store),
 * so the figure is the loop's own cost, not the DB thread's.
 *
 *   bench_limits [N]     (default 200000 requests per size)
 */
#include <stdio.h>
#include <stdlib.h>

#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/auth/auth.h"
#include "server/auth/limits.h"

static double per_call_ns(gps_limits *l, const char *id, int n)
{
    int retry;
    int64_t now = gp_now_wall_ms();
    uint64_t t0 = gp_now_mono_us();
    for (int i = 0; i < n; i++) {
        /* Step the clock so the rpm bucket keeps refilling: every call
         * takes the admit path, not the refusal. */
        gps_limits_admit(l, id, now + i, 0, &retry);
        if (gps_limits_may_start(l, id)) {
            gps_limits_started(l, id);
            gps_limits_ended(l, id);
        }
    }
    return (double)(gp_now_mono_us() - t0) * 1000.0 / n;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 200000;
    if (n <= 0)
        n = 200000;
    gp_log_init("bench", GP_LOG_ERROR);
    static const int sizes[] = {1, 100, 1000, 10000};
    printf("%-8s %14s %14s\n", "keys", "limited ns/req", "no key ns/req");
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        gps_auth *a = gps_auth_new(NULL);
        gps_limits *l = gps_limits_new(a, NULL);
        char key[GPS_AUTH_KEY_LEN + 1], id[GPS_AUTH_ID_LEN + 1], last[GPS_AUTH_ID_LEN + 1] = "";
        for (int k = 0; k < sizes[s]; k++) {
            gps_key_spec spec = {.role = GPS_KEY_CLIENT,
                                 .limits = {.rpm = 60000000, .max_concurrent = 8}};
            if (gps_auth_key_create_spec(a, &spec, key, id) != 0) {
                fprintf(stderr, "bench_limits: out of memory\n");
                return 1;
            }
            snprintf(last, sizeof last, "%s", id);
        }
        double limited = per_call_ns(l, last, n);
        double none = per_call_ns(l, "", n);
        printf("%-8d %14.1f %14.1f\n", sizes[s], limited, none);
        gps_limits_free(l);
        gps_auth_free(a);
    }
    return 0;
}
