/*
 * bench_store: write throughput of the store's DB thread (printed, never
 * asserted). Enqueues N job inserts plus N updates from this thread (the
 * "loop"), as fast as it can or paced, then flushes, and prints the ops/s
 * committed, the enqueue cost per op, the number of transactions and the
 * average ops per transaction, for a few group-commit settings.
 *
 *   bench_store [N] [DIR|URI]   (default 100000 ops, DIR /tmp)
 *
 * A postgresql:// URI instead of DIR measures the PostgreSQL store on that
 * (existing, preferably empty) database; the rows it writes are left there
 * (docs/persistence.md "PostgreSQL" has figures).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/store/store.h"

static int run(const char *dir, int n, int interval_ms, int batch_max)
{
    static int runs;   /* ids differ per run: a PostgreSQL database is not removed */
    char db[512], err[512];
    bool file = gps_store_db_is_file(dir);
    runs++;
    if (file)
        snprintf(db, sizeof(db), "%s/bench_store_%d.db", dir, (int)getpid());
    else
        snprintf(db, sizeof(db), "%s", dir);
    gps_store_opts o = {.commit_interval_ms = interval_ms, .batch_max = batch_max,
                        .queue_max = (size_t)n * 2 + 16};
    gps_store *s = gps_store_open(db, NULL, &o, err, sizeof(err));
    if (!s) {
        fprintf(stderr, "bench_store: %s\n", err);
        return 1;
    }
    json_t *req = json_pack("{s:s, s:i}", "prompt", "Once upon a time", "max_tokens", 64);
    uint64_t t0 = gp_now_mono_us();
    uint64_t enq_us = 0;
    for (int i = 0; i < n / 2; i++) {
        char id[40];
        snprintf(id, sizeof(id), "job_%d_%d_%08d", (int)getpid(), runs, i);
        uint64_t a = gp_now_mono_us();
        gps_store_job_row r = {.id = id, .api = "openai", .kind = "chat", .model = "tiny",
                               .key_id = "key_0123456789abcdef01234567", .status = "queued",
                               .correlation_id = id, .created_at = gp_now_wall_ms(),
                               .request = req};
        gps_store_job_insert(s, r);
        gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT(id);
        u.status = "done";
        u.agent_id = "11111111-2222-4333-8444-555555555555";
        u.attempts = 1;
        u.prompt_tokens = 12;
        u.completion_tokens = 64;
        u.total_ms = 900;
        u.finish_reason = "length";
        u.finished_at = gp_now_wall_ms();
        gps_store_job_update_async(s, u);
        enq_us += gp_now_mono_us() - a;
    }
    uint64_t t_enq = gp_now_mono_us() - t0;
    gps_store_flush(s);
    uint64_t t_all = gp_now_mono_us() - t0;
    gps_store_stats st;
    gps_store_get_stats(s, &st);
    gps_store_close(s);
    json_decref(req);
    char p[600];
    if (file) {
        unlink(db);
        snprintf(p, sizeof(p), "%s-wal", db);
        unlink(p);
        snprintf(p, sizeof(p), "%s-shm", db);
        unlink(p);
    }
    printf("interval=%2dms batch_max=%5d: %llu ops committed in %.3f s = %.0f ops/s; "
           "enqueue %.2f us/op (burst took %.3f s); %llu transactions, %.1f ops/txn; "
           "max commit %llu us; drops %llu, failed %llu\n",
           interval_ms, batch_max, (unsigned long long)st.ops_committed, t_all / 1e6,
           st.ops_committed / (t_all / 1e6), (double)enq_us / n, t_enq / 1e6,
           (unsigned long long)st.batches, st.batches ? (double)st.ops_committed / st.batches : 0,
           (unsigned long long)st.max_commit_us, (unsigned long long)st.drops,
           (unsigned long long)st.ops_failed);
    return 0;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 100000;
    const char *dir = argc > 2 ? argv[2] : "/tmp";
    if (n < 2)
        n = 2;
    gp_log_init("bench", GP_LOG_WARN);
    int rc = 0;
    rc |= run(dir, n, 5, 64);      /* the default before issue 24's tenth round */
    rc |= run(dir, n, 5, 512);     /* the defaults */
    rc |= run(dir, n, 20, 4096);
    rc |= run(dir, n, 1, 1);       /* one commit per op, for comparison */
    return rc;
}
