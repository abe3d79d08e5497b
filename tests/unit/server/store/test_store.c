/*
 * Unit tests for src/server/store/store.c: migrations, the DB thread's group
 * commit, overload drops, start-up loads, async reads back on the loop.
 * Every test uses a real SQLite file in its own temporary directory and
 * checks the results through a separate raw sqlite3 connection. The
 * out-of-memory sweeps fail the N-th of the project's allocations
 * (fixture_oom.h arm_beneath: linked with --wrap=malloc,calloc,realloc).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <sqlite3.h>

#include "common/gp_json.h"
#include "common/gp_util.h"
#include "server/store/store.h"

#include "db_fixture.h"
#include "fixture_oom.h"

/* ---- raw access for checks ---- */

static sqlite3 *raw_open(const char *path)
{
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    return db;
}

static long long raw_int(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    long long v = sqlite3_column_type(st, 0) == SQLITE_NULL ? -999 : sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

/* First column of the first row as a malloc'd string ("<null>" for NULL). */
static char *raw_text(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    const char *s = (const char *)sqlite3_column_text(st, 0);
    char *r = strdup(s ? s : "<null>");
    sqlite3_finalize(st);
    return r;
}

static void raw_exec(sqlite3 *db, const char *sql)
{
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK)
        fprintf(stderr, "raw_exec: %s\n", msg);
    sqlite3_free(msg);
    assert_int_equal(rc, SQLITE_OK);
}

static void assert_text(sqlite3 *db, const char *sql, const char *want)
{
    char *got = raw_text(db, sql);
    assert_string_equal(got, want);
    free(got);
}

static gps_store *open_ok(const char *path, struct event_base *base, const gps_store_opts *o)
{
    char err[512] = "";
    gps_store *s = gps_store_open(path, base, o, err, sizeof(err));
    if (!s)
        fprintf(stderr, "open failed: %s\n", err);
    assert_non_null(s);
    return s;
}

/* ---- migrations ---- */

static void test_migrations_once(void **state)
{
    tctx *t = *state;
    assert_true(gps_store_schema_version() >= 1);
    gps_store *s = open_ok(t->db, NULL, NULL);
    gps_store_close(s);

    sqlite3 *db = raw_open(t->db);
    /* MAX, not count: branches number their migrations ahead of one
     * another (0010 may land before 0009). */
    assert_int_equal(raw_int(db, "SELECT max(version) FROM schema_migrations"),
                     gps_store_schema_version());
    assert_text(db, "SELECT name FROM schema_migrations WHERE version = 1", "init");
    assert_true(raw_int(db, "SELECT applied_at FROM schema_migrations WHERE version = 1") >
                1600000000000LL);
    assert_text(db, "PRAGMA journal_mode", "wal");
    const char *tables[] = {"agents", "agent_models", "api_keys", "jobs", "job_checkpoints",
                            "job_events", "key_usage"};
    for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]); i++) {
        char q[160];
        snprintf(q, sizeof(q), "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='%s'",
                 tables[i]);
        assert_int_equal(raw_int(db, q), 1);
    }
    /* The admin listing walks this index newest first (migration 0004). */
    assert_int_equal(raw_int(db, "SELECT count(*) FROM sqlite_master WHERE type='index' AND "
                                 "name='jobs_created' AND tbl_name='jobs'"),
                     1);
    long long applied = raw_int(db, "SELECT applied_at FROM schema_migrations WHERE version = 1");
    long long n_applied = raw_int(db, "SELECT count(*) FROM schema_migrations");
    sqlite3_close(db);

    /* Re-open: nothing applied again, the record is untouched. */
    s = open_ok(t->db, NULL, NULL);
    gps_store_close(s);
    db = raw_open(t->db);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM schema_migrations"), n_applied);
    assert_int_equal(raw_int(db, "SELECT applied_at FROM schema_migrations WHERE version = 1"),
                     applied);
    sqlite3_close(db);
}

static void test_newer_schema_refused(void **state)
{
    tctx *t = *state;
    gps_store_close(open_ok(t->db, NULL, NULL));
    sqlite3 *db = raw_open(t->db);
    raw_exec(db, "INSERT INTO schema_migrations VALUES (999, 'future', 0)");
    sqlite3_close(db);
    char err[512] = "";
    gps_store *s = gps_store_open(t->db, NULL, NULL, err, sizeof(err));
    assert_null(s);
    assert_non_null(strstr(err, "newer"));
    assert_non_null(strstr(err, "999"));
}

static void test_not_sqlite(void **state)
{
    tctx *t = *state;
    FILE *f = fopen(t->db, "wb");
    assert_non_null(f);
    for (int i = 0; i < 400; i++)
        fputs("this is not a database file at all. ", f);
    fclose(f);
    char err[512] = "";
    assert_null(gps_store_open(t->db, NULL, NULL, err, sizeof(err)));
    assert_non_null(strstr(err, "not a SQLite database"));

    /* An unopenable path is a clear error as well. */
    char bad[256];
    snprintf(bad, sizeof(bad), "%s/no/such/dir/x.db", t->dir);
    err[0] = '\0';
    assert_null(gps_store_open(bad, NULL, NULL, err, sizeof(err)));
    assert_non_null(strstr(err, "cannot open"));
}

static void write_file(const char *path, const char *data)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(data, f);
    fclose(f);
}

static void test_migrations_dir(void **state)
{
    tctx *t = *state;
    char mdir[128], p[256];
    snprintf(mdir, sizeof(mdir), "%s/mig", t->dir);
    assert_int_equal(mkdir(mdir, 0755), 0);
    size_t len;
    char *init = gp_read_file(GP_SOURCE_DIR "/migrations/0001_init.sql", &len, 1 << 20);
    assert_non_null(init);
    snprintf(p, sizeof(p), "%s/0001_init.sql", mdir);
    write_file(p, init);
    free(init);
    snprintf(p, sizeof(p), "%s/0002_extra.sql", mdir);
    write_file(p, "CREATE TABLE extra (x INTEGER);");
    snprintf(p, sizeof(p), "%s/README", mdir);
    write_file(p, "not a migration, ignored");

    gps_store_opts o = {.migrations_dir = mdir};
    gps_store_close(open_ok(t->db, NULL, &o));
    sqlite3 *db = raw_open(t->db);
    assert_int_equal(raw_int(db, "SELECT max(version) FROM schema_migrations"), 2);
    assert_text(db, "SELECT name FROM schema_migrations WHERE version = 2", "extra");
    assert_int_equal(raw_int(db, "SELECT count(*) FROM extra"), 0);
    sqlite3_close(db);

    /* The embedded set stops at 1 (as long as the repo has one migration):
     * this DB is now newer than the binary. */
    if (gps_store_schema_version() < 2) {
        char err[512] = "";
        assert_null(gps_store_open(t->db, NULL, NULL, err, sizeof(err)));
        assert_non_null(strstr(err, "newer"));
    }

    /* A broken migration rolls back and names itself. */
    snprintf(p, sizeof(p), "%s/0003_broken.sql", mdir);
    write_file(p, "CREATE TABLE ok3 (x); THIS IS NOT SQL;");
    char err[512] = "";
    assert_null(gps_store_open(t->db, NULL, &o, err, sizeof(err)));
    assert_non_null(strstr(err, "0003_broken"));
    db = raw_open(t->db);
    assert_int_equal(raw_int(db, "SELECT max(version) FROM schema_migrations"), 2);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM sqlite_master WHERE name='ok3'"), 0);
    sqlite3_close(db);

    /* A badly named .sql file is refused. */
    unlink(p);
    snprintf(p, sizeof(p), "%s/3_bad.sql", mdir);
    write_file(p, "SELECT 1;");
    err[0] = '\0';
    assert_null(gps_store_open(t->db, NULL, &o, err, sizeof(err)));
    assert_non_null(strstr(err, "NNNN_name.sql"));
}

/* ---- async writes ---- */

typedef struct got_job {
    int calls;
    int status;
    char model[64], status_s[32], agent[64], checkpoint[64], req_prompt[64];
    long long completion_tokens, seq, attempts, ttft;
    bool has_seed;
    long long seed;
} got_job;

static void on_job(void *arg, int status, const gps_store_job_info *j)
{
    got_job *g = arg;
    g->calls++;
    g->status = status;
    if (!j)
        return;
    snprintf(g->model, sizeof(g->model), "%s", j->model);
    snprintf(g->status_s, sizeof(g->status_s), "%s", j->status);
    snprintf(g->agent, sizeof(g->agent), "%s", j->agent_id ? j->agent_id : "<null>");
    snprintf(g->checkpoint, sizeof(g->checkpoint), "%.*s", (int)j->checkpoint_len,
             j->checkpoint_text ? j->checkpoint_text : "");
    json_t *p = j->request ? json_object_get(j->request, "prompt") : NULL;
    snprintf(g->req_prompt, sizeof(g->req_prompt), "%s", p ? json_string_value(p) : "<none>");
    g->completion_tokens = j->completion_tokens;
    g->seq = j->checkpoint_seq;
    g->attempts = j->attempts;
    g->ttft = j->ttft_ms;
    g->has_seed = j->has_seed;
    g->seed = j->seed;
}

/* Run the loop until *flag becomes non-zero (bounded: 2000 turns of at most 10 ms). */
static void loop_until(struct event_base *base, const int *flag)
{
    struct timeval tv = {0, 10000};
    for (int i = 0; i < 2000 && !*flag; i++) {
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
}

static void add_job(gps_store *s, const char *id, const json_t *req)
{
    gps_store_job_row r = {.id = id, .api = "native", .kind = "completion", .model = "tiny",
                           .key_id = "key_x", .status = "queued", .priority = 1,
                           .correlation_id = "corr-1", .has_seed = true, .seed = 42,
                           .created_at = gp_now_wall_ms(), .request = req};
    assert_int_equal(gps_store_job_insert(s, r), 0);
}

static void test_async_writes_and_reads(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    assert_non_null(base);
    gps_store *s = open_ok(t->db, base, NULL);

    json_t *labels = json_pack("{s:s}", "region", "eu");
    json_t *facts = json_pack("{s:[{s:s}]}", "gpus", "name", "RTX 4090");
    gps_store_agent_row ar = {.id = "11111111-2222-4333-8444-555555555555", .name = "box1",
                              .version = "0.1.0", .platform = "linux", .state = "healthy",
                              .labels = labels, .facts = facts, .key_id = "key_a",
                              .last_seen = 1000};
    assert_int_equal(gps_store_agent_upsert(s, ar), 0);
    const char *al[] = {"tiny-alias", "t2"};
    gps_store_model_row models[] = {
        {.model = "tiny", .aliases = al, .n_aliases = 2, .quantization = "Q8_0",
         .context_length = 2048, .vram_bytes = 123, .loaded = true},
        {.model = "other"},
    };
    assert_int_equal(gps_store_agent_models(s, ar.id, models, 2), 0);
    assert_int_equal(gps_store_agent_models(s, ar.id, models, 1), 0);   /* replace: 1 left */
    assert_int_equal(gps_store_agent_state(s, ar.id, "suspect", 2000), 0);

    json_t *req = json_pack("{s:s}", "prompt", "Once upon a time");
    add_job(s, "job_1", req);
    json_decref(req);
    gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT("job_1");
    u.status = "running";
    u.agent_id = ar.id;
    u.attempts = 1;
    assert_int_equal(gps_store_job_update_async(s, u), 0);
    u = GPS_STORE_JOB_UPDATE_INIT("job_1");   /* only tokens: agent/status kept */
    u.completion_tokens = 7;
    u.ttft_ms = 12;
    assert_int_equal(gps_store_job_update_async(s, u), 0);
    assert_int_equal(gps_store_checkpoint(s, "job_1", "Once upon a time there", 22, 5), 0);
    assert_int_equal(gps_store_checkpoint(s, "job_1", "Once upon a time there was", 26, 6), 0);

    /* Read-your-writes through the queue, callback on the loop thread. */
    got_job g = {0};
    assert_int_equal(gps_store_job_get_async(s, "job_1", on_job, &g), 0);
    loop_until(base, &g.calls);
    assert_int_equal(g.calls, 1);
    assert_int_equal(g.status, 0);
    assert_string_equal(g.model, "tiny");
    assert_string_equal(g.status_s, "running");
    assert_string_equal(g.agent, ar.id);
    assert_string_equal(g.checkpoint, "Once upon a time there was");
    assert_string_equal(g.req_prompt, "Once upon a time");
    assert_int_equal(g.completion_tokens, 7);
    assert_int_equal(g.ttft, 12);
    assert_int_equal(g.attempts, 1);
    assert_int_equal(g.seq, 6);
    assert_true(g.has_seed);
    assert_int_equal(g.seed, 42);

    got_job none = {0};
    assert_int_equal(gps_store_job_get_async(s, "job_nope", on_job, &none), 0);
    loop_until(base, &none.calls);
    assert_int_equal(none.calls, 1);
    assert_int_equal(none.status, 1);

    assert_int_equal(gps_store_flush(s), 0);
    char msg[128] = "";
    assert_true(gps_store_healthy(s, msg, sizeof(msg)));

    sqlite3 *db = raw_open(t->db);
    assert_text(db, "SELECT state FROM agents", "suspect");
    assert_int_equal(raw_int(db, "SELECT last_seen FROM agents"), 2000);
    assert_int_equal(raw_int(db, "SELECT first_seen FROM agents"), 1000);
    assert_text(db, "SELECT labels FROM agents", "{\"region\":\"eu\"}");
    assert_int_equal(raw_int(db, "SELECT count(*) FROM agent_models"), 1);
    assert_text(db, "SELECT aliases FROM agent_models", "[\"tiny-alias\",\"t2\"]");
    assert_text(db, "SELECT status FROM jobs WHERE id='job_1'", "running");
    assert_int_equal(raw_int(db, "SELECT completion_tokens FROM jobs"), 7);
    assert_int_equal(raw_int(db, "SELECT prompt_tokens FROM jobs"), -999);   /* NULL */
    assert_int_equal(raw_int(db, "SELECT last_seq FROM job_checkpoints"), 6);
    sqlite3_close(db);

    /* A write SQLite rejects (checkpoint of an unknown job: foreign key)
     * is counted; its neighbours in the batch still commit. */
    gps_store_stats before, after;
    gps_store_get_stats(s, &before);
    assert_int_equal(gps_store_checkpoint(s, "job_missing", "x", 1, 1), 0);
    add_job(s, "job_2", NULL);
    assert_int_equal(gps_store_flush(s), 0);
    gps_store_get_stats(s, &after);
    assert_int_equal(after.ops_failed, before.ops_failed + 1);
    assert_int_equal(after.ops_committed, before.ops_committed + 1);
    db = raw_open(t->db);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM jobs"), 2);
    assert_text(db, "SELECT COALESCE(request, 'none') FROM jobs WHERE id='job_2'", "none");
    sqlite3_close(db);

    json_decref(labels);
    json_decref(facts);
    gps_store_close(s);
    event_base_free(base);
}

static void on_ping(void *arg, bool ok, const char *msg)
{
    *(int *)arg = ok ? 1 : -1;
}

static void test_ping_and_no_base(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    gps_store *s = open_ok(t->db, base, NULL);
    int pinged = 0;
    assert_int_equal(gps_store_ping_async(s, on_ping, &pinged), 0);
    loop_until(base, &pinged);
    assert_int_equal(pinged, 1);
    gps_store_close(s);
    event_base_free(base);

    /* Without a base (CLI), async reads are refused; writes still work. */
    s = open_ok(t->db, NULL, NULL);
    got_job g = {0};
    assert_int_equal(gps_store_job_get_async(s, "x", on_job, &g), -1);
    add_job(s, "job_cli", NULL);
    assert_int_equal(gps_store_flush(s), 0);
    gps_store_close(s);
    sqlite3 *db = raw_open(t->db);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM jobs"), 1);
    sqlite3_close(db);
}

/* Reads pending when the store closes are still delivered (on close). */
static void test_close_delivers_reads(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    gps_store *s = open_ok(t->db, base, NULL);
    got_job g = {0};
    assert_int_equal(gps_store_job_get_async(s, "none", on_job, &g), 0);
    gps_store_close(s);   /* loop never ran */
    assert_int_equal(g.calls, 1);
    assert_int_equal(g.status, 1);
    event_base_free(base);
}

static void test_group_commit(void **state)
{
    tctx *t = *state;
    /* A long interval makes batch boundaries deterministic: a batch ends
     * at batch_max ops, or when the queue is empty and flush waits. */
    gps_store_opts o = {.commit_interval_ms = 60000, .batch_max = 64};
    gps_store *s = open_ok(t->db, NULL, &o);
    enum { N = 1000 };
    for (int i = 0; i < N; i++) {
        char id[32];
        snprintf(id, sizeof(id), "job_%d", i);
        add_job(s, id, NULL);
    }
    assert_int_equal(gps_store_flush(s), 0);
    gps_store_stats st;
    gps_store_get_stats(s, &st);
    assert_int_equal(st.ops_committed, N);
    assert_int_equal(st.ops_failed, 0);
    assert_int_equal(st.drops, 0);
    assert_int_equal(st.queue_depth, 0);
    assert_int_equal(st.batches, (N + 63) / 64);
    assert_int_equal(st.last_batch_ops, N % 64);
    assert_true(st.last_commit_wall_ms > 0);
    gps_store_close(s);
    sqlite3 *db = raw_open(t->db);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM jobs"), N);
    sqlite3_close(db);
}

/* A request-log row's writes fold into its first write still waiting in
 * the queue (issue 24): one statement instead of three, the row ending as
 * if all had run. The queue is held still by a raw connection holding the
 * write lock, so the DB thread's BEGIN waits while the writes queue. Native
 * rows (no coalesce) are written op by op, and a write without coalesce
 * is never folded across. */
static void job_update(gps_store *s, const char *id, const char *status, const char *agent,
                       bool last, bool coalesce)
{
    gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT(id);
    u.status = status;
    u.agent_id = agent;
    u.attempts = 1;
    u.queue_ms = 3;
    if (last) {
        u.prompt_tokens = 5;
        u.completion_tokens = 7;
        u.ttft_ms = 4;
        u.total_ms = 9;
        u.finish_reason = "stop";
        u.finished_at = 1234;
    }
    u.coalesce = coalesce;
    assert_int_equal(gps_store_job_update_async(s, u), 0);
}

static void test_row_writes_fold(void **state)
{
    tctx *t = *state;
    gps_store_opts o = {.commit_interval_ms = 60000, .batch_max = 64, .busy_timeout_ms = 20000};
    gps_store *s = open_ok(t->db, NULL, &o);
    sqlite3 *db = raw_open(t->db);
    raw_exec(db, "BEGIN IMMEDIATE");
    gps_store_job_row r = {.id = "jA", .api = "openai", .kind = "chat", .model = "tiny",
                           .key_id = "key_x", .status = "queued", .priority = 1,
                           .correlation_id = "corr-1", .has_seed = true, .seed = 42,
                           .created_at = 1000, .coalesce = true};
    assert_int_equal(gps_store_job_insert(s, r), 0);
    job_update(s, "jA", "assigned", "agent-1", false, true);
    job_update(s, "jA", "done", NULL, true, true);
    r.id = "jB";
    r.api = "native";
    r.coalesce = false;
    assert_int_equal(gps_store_job_insert(s, r), 0);
    job_update(s, "jB", "done", "agent-2", true, false);
    r.id = "jC";
    r.api = "openai";
    r.coalesce = true;
    assert_int_equal(gps_store_job_insert(s, r), 0);
    job_update(s, "jC", "running", "agent-3", false, false); /* never folded across */
    job_update(s, "jC", "failed", NULL, true, true);
    raw_exec(db, "COMMIT");
    assert_int_equal(gps_store_flush(s), 0);
    gps_store_stats st;
    gps_store_get_stats(s, &st);
    assert_int_equal(st.ops_committed, 8);
    assert_int_equal(st.ops_failed, 0);
    assert_int_equal(st.batches, 1);
    assert_int_equal(st.last_batch_ops, 1 + 2 + 3); /* statements run */
    assert_int_equal(st.statements, 1 + 2 + 3);
    gps_store_close(s);

    assert_text(db, "SELECT api || kind || model || key_id || status || priority || "
                    "correlation_id || seed || created_at || agent_id || attempts || "
                    "prompt_tokens || completion_tokens || queue_ms || ttft_ms || total_ms || "
                    "finish_reason || finished_at FROM jobs WHERE id = 'jA'",
                "openaichattinykey_xdone1corr-1421000agent-1157349stop1234");
    assert_int_equal(raw_int(db, "SELECT count(*) FROM jobs WHERE id = 'jA' AND request IS NULL "
                                 "AND error_code IS NULL AND owner_server IS NULL"), 1);
    assert_text(db, "SELECT status || agent_id || total_ms FROM jobs WHERE id = 'jB'",
                "doneagent-29");
    assert_text(db, "SELECT status || agent_id || total_ms FROM jobs WHERE id = 'jC'",
                "failedagent-39");
    sqlite3_close(db);
}

/* Until the store's counter at offset off reaches want (20 s at most). */
static void wait_stat_(gps_store *s, size_t off, uint64_t want)
{
    uint64_t give_up = gp_now_mono_us() + 20 * 1000 * 1000;
    for (;;) {
        gps_store_stats st;
        gps_store_get_stats(s, &st);
        uint64_t v;
        memcpy(&v, (const char *)&st + off, sizeof v);
        if (v >= want)
            return;
        assert_true(gp_now_mono_us() < give_up);
        struct timespec ms = {0, 1000 * 1000};
        nanosleep(&ms, NULL);
    }
}
#define wait_stat(s, field, want) wait_stat_((s), offsetof(gps_store_stats, field), (want))

/* A request-log row's first write, alone in the queue, waits in the open
 * group for the commit deadline instead of running at once, so that its
 * updates fold into it (issue 24: at low load the insert ran at once and
 * only the updates folded). A read queued behind it does not wait for the
 * deadline (a minute here; loop_until gives up after 20 s): it runs the
 * queue, in order, and sees the row as every write left it. */
static void test_first_write_waits_reads_do_not(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    assert_non_null(base);
    gps_store_opts o = {.commit_interval_ms = 60000, .batch_max = 64};
    gps_store *s = open_ok(t->db, base, &o);
    sqlite3 *db = raw_open(t->db);
    gps_store_job_row r = {.id = "jH", .api = "openai", .kind = "chat", .model = "tiny",
                           .status = "queued", .created_at = 1000, .coalesce = true};
    assert_int_equal(gps_store_job_insert(s, r), 0);
    wait_stat(s, deadline_waits, 1); /* the DB thread saw the insert and left it */
    job_update(s, "jH", "assigned", "agent-1", false, true);
    job_update(s, "jH", "done", NULL, true, true);
    got_job g = {0};
    assert_int_equal(gps_store_job_get_async(s, "jH", on_job, &g), 0);
    loop_until(base, &g.calls);
    assert_int_equal(g.calls, 1);
    assert_int_equal(g.status, 0);
    assert_string_equal(g.status_s, "done");
    assert_string_equal(g.agent, "agent-1");
    assert_int_equal(gps_store_flush(s), 0);
    gps_store_stats st;
    gps_store_get_stats(s, &st);
    assert_int_equal(st.ops_committed, 3);
    assert_int_equal(st.batches, 1);
    assert_int_equal(st.last_batch_ops, 2); /* the folded row and the read */
    gps_store_close(s);
    assert_text(db, "SELECT status || agent_id || total_ms FROM jobs WHERE id = 'jH'",
                "doneagent-19");
    sqlite3_close(db);
    event_base_free(base);
}


/* A request-log row's write that the DB thread takes while the row is
 * still open is held back for the row's end (row_hold_ms; a minute here,
 * against groups of a millisecond): its group commits without it, the
 * row's later writes fold into it, and it runs once the end folds in (the
 * DB thread idle: woken), before a read or a write of the row that cannot
 * fold, at a flush, and at close. Without the hold each row below would
 * be two statements or more. */
static void test_open_rows_held(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    assert_non_null(base);
    gps_store_opts o = {.commit_interval_ms = 1, .batch_max = 64, .row_hold_ms = 60000};
    gps_store *s = open_ok(t->db, base, &o);
    sqlite3 *db = raw_open(t->db);
    gps_store_job_row r = {.id = "jR", .api = "openai", .kind = "chat", .model = "tiny",
                           .status = "queued", .created_at = 1000, .coalesce = true};

    /* Held, then ended: one statement, committed without a flush. */
    assert_int_equal(gps_store_job_insert(s, r), 0);
    wait_stat(s, rows_held, 1);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM jobs WHERE id = 'jR'"), 0);
    job_update(s, "jR", "assigned", "agent-1", false, true);
    job_update(s, "jR", "done", NULL, true, true);
    wait_stat(s, statements, 1);
    assert_text(db, "SELECT status || agent_id || total_ms FROM jobs WHERE id = 'jR'",
                "doneagent-19");

    /* A read runs the held write first and sees the row. */
    r.id = "jS";
    assert_int_equal(gps_store_job_insert(s, r), 0);
    wait_stat(s, rows_held, 2);
    job_update(s, "jS", "assigned", "agent-2", false, true);
    got_job g = {0};
    assert_int_equal(gps_store_job_get_async(s, "jS", on_job, &g), 0);
    loop_until(base, &g.calls);
    assert_int_equal(g.status, 0);
    assert_string_equal(g.status_s, "assigned");
    assert_string_equal(g.agent, "agent-2");

    /* A write of the row that may not fold runs after the held one. */
    r.id = "jT";
    assert_int_equal(gps_store_job_insert(s, r), 0);
    wait_stat(s, rows_held, 3);
    job_update(s, "jT", "running", "agent-3", false, false);
    wait_stat(s, statements, 5); /* jR; jS and the read; then jT's insert, its update */
    assert_text(db, "SELECT status || agent_id FROM jobs WHERE id = 'jT'", "runningagent-3");

    /* A flush writes what is held; so does the close. */
    r.id = "jU";
    assert_int_equal(gps_store_job_insert(s, r), 0);
    wait_stat(s, rows_held, 4);
    assert_int_equal(gps_store_flush(s), 0);
    assert_text(db, "SELECT status FROM jobs WHERE id = 'jU'", "queued");
    r.id = "jV";
    assert_int_equal(gps_store_job_insert(s, r), 0);
    wait_stat(s, rows_held, 5);
    gps_store_stats st;
    gps_store_get_stats(s, &st);
    assert_int_equal(st.statements, 6);
    assert_int_equal(st.ops_committed, 3 + 2 + 2 + 1);
    gps_store_close(s);
    assert_text(db, "SELECT status FROM jobs WHERE id = 'jV'", "queued");
    sqlite3_close(db);
    event_base_free(base);
}

/* What does not concern jobs runs beside the held row writes: a key's
 * usage (queued at each admission with API keys) and the heartbeat (queued
 * ahead) leave them held; the renewal of the native tasks' leases, queued
 * ahead too, updates jobs rows and runs them first. A held write is still
 * waiting: queue_depth (the backlog) counts it. */
static void on_status(void *arg, int status)
{
    *(int *)arg = status == 0 ? 1 : -1;
}

static void test_held_rows_beside_others(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    assert_non_null(base);
    gps_store_opts o = {.commit_interval_ms = 1, .batch_max = 64, .row_hold_ms = 60000};
    gps_store *s = open_ok(t->db, base, &o);
    sqlite3 *db = raw_open(t->db);
    gps_store_job_row r = {.id = "jA", .api = "openai", .kind = "chat", .model = "tiny",
                           .status = "queued", .created_at = 1000, .coalesce = true};
    assert_int_equal(gps_store_job_insert(s, r), 0);
    wait_stat(s, rows_held, 1);
    gps_store_stats st;
    gps_store_get_stats(s, &st);
    assert_int_equal(st.queue_depth, 1);
    assert_int_equal(st.rows_waiting, 1);

    assert_int_equal(gps_store_usage_add(s, "key_u", 3, 1, 2, 3, 0), 0);
    wait_stat(s, statements, 1);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM key_usage WHERE key_id = 'key_u'"), 1);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM jobs"), 0);

    gps_store_server_row srv = {.id = "srv-1", .name = "one", .pid = 1, .version = "t",
                                .started_at = 1, .heartbeat_at = 2, .lease_until = 3};
    int beat = 0;
    assert_int_equal(gps_store_server_beat_async(s, &srv, on_status, &beat), 0);
    loop_until(base, &beat);
    assert_int_equal(beat, 1);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM jobs"), 0);
    gps_store_get_stats(s, &st);
    assert_int_equal(st.statements, 2);
    assert_int_equal(st.rows_waiting, 1);

    assert_int_equal(gps_store_task_renew(s, "srv-1", 99), 0);
    wait_stat(s, statements, 4); /* the held insert, then the renewal */
    assert_text(db, "SELECT status FROM jobs WHERE id = 'jA'", "queued");
    gps_store_get_stats(s, &st);
    assert_int_equal(st.queue_depth, 0);
    assert_int_equal(st.rows_waiting, 0);
    gps_store_close(s);
    sqlite3_close(db);
    event_base_free(base);
}

/* A held write whose row never ends runs when its hold is over, without a
 * flush; a group that only held writes opens no transaction, and a row
 * that ends while a group waits for its deadline is written in that
 * group (before: a group whose writes were all held committed an empty
 * transaction, one a request at low load). */
static void test_held_rows_expire_no_empty_groups(void **state)
{
    tctx *t = *state;
    gps_store_opts o = {.commit_interval_ms = 1, .batch_max = 64, .row_hold_ms = 30};
    gps_store *s = open_ok(t->db, NULL, &o);
    sqlite3 *db = raw_open(t->db);
    gps_store_job_row r = {.id = "jE", .api = "openai", .kind = "chat", .model = "tiny",
                           .status = "queued", .created_at = 1000, .coalesce = true};
    assert_int_equal(gps_store_job_insert(s, r), 0);
    wait_stat(s, statements, 1);
    assert_text(db, "SELECT status FROM jobs WHERE id = 'jE'", "queued");
    gps_store_stats st;
    gps_store_get_stats(s, &st);
    assert_int_equal(st.rows_held, 1);
    assert_int_equal(st.batches, 1);
    assert_int_equal(st.rows_waiting, 0);
    assert_int_equal(st.queue_depth, 0);
    gps_store_close(s);

    /* Groups of half a second, holds of a minute. */
    o.commit_interval_ms = 500;
    o.row_hold_ms = 60000;
    s = open_ok(t->db, NULL, &o);
    r.id = "jY";
    assert_int_equal(gps_store_job_insert(s, r), 0);
    wait_stat(s, rows_held, 1); /* jY's group ran nothing */
    r.id = "jX";
    assert_int_equal(gps_store_job_insert(s, r), 0);
    wait_stat(s, deadline_waits, 2); /* jX's group waits for its deadline */
    job_update(s, "jY", "done", "agent-1", true, true);
    wait_stat(s, statements, 1);
    assert_text(db, "SELECT status || agent_id FROM jobs WHERE id = 'jY'", "doneagent-1");
    wait_stat(s, rows_held, 2);
    job_update(s, "jX", "done", "agent-2", true, true);
    wait_stat(s, statements, 2);
    assert_text(db, "SELECT status || agent_id FROM jobs WHERE id = 'jX'", "doneagent-2");
    gps_store_get_stats(s, &st);
    assert_int_equal(st.batches, 2);
    assert_int_equal(st.ops_committed, 4);
    gps_store_close(s);
    sqlite3_close(db);
}

/* A row's end folds into its held write even when held writes fill the
 * queue to queue_max: a fold takes no place in it (refused, the row would
 * stay unfinished for good). */
static void test_held_rows_end_at_queue_max(void **state)
{
    tctx *t = *state;
    gps_store_opts o = {.commit_interval_ms = 1, .batch_max = 64, .row_hold_ms = 60000,
                        .queue_max = 4};
    gps_store *s = open_ok(t->db, NULL, &o);
    sqlite3 *db = raw_open(t->db);
    const char *ids[] = {"jQ0", "jQ1", "jQ2", "jQ3"};
    for (int i = 0; i < 4; i++) {
        gps_store_job_row r = {.id = ids[i], .api = "openai", .kind = "chat", .model = "tiny",
                               .status = "queued", .created_at = 1000, .coalesce = true};
        assert_int_equal(gps_store_job_insert(s, r), 0);
        wait_stat(s, rows_held, (uint64_t)i + 1);
    }
    gps_store_job_row r5 = {.id = "jQ4", .api = "openai", .model = "tiny", .status = "queued",
                            .created_at = 1000, .coalesce = true};
    assert_int_equal(gps_store_job_insert(s, r5), -1); /* full: held writes count */
    job_update(s, "jQ0", "done", "agent-1", true, true);
    wait_stat(s, statements, 1);
    assert_text(db, "SELECT status || agent_id FROM jobs WHERE id = 'jQ0'", "doneagent-1");
    gps_store_close(s);
    sqlite3_close(db);
}

typedef struct flood_arg {
    gps_store *s;
    volatile int *stop;
    int who, n;
} flood_arg;

/* Foldable rows, each ended at once (one statement to run), keeping
 * about 2,000 ops queued: three of these outrun the DB thread. */
static void *flood(void *p)
{
    flood_arg *f = p;
    while (!*f->stop) {
        gps_store_stats st;
        gps_store_get_stats(f->s, &st);
        if (st.queue_depth - st.rows_waiting > 2000) {
            struct timespec pause = {0, 100 * 1000}; /* a throttle, not a wait on an event */
            nanosleep(&pause, NULL);
            continue;
        }
        char id[32];
        snprintf(id, sizeof id, "jF%d_%d", f->who, f->n++);
        gps_store_job_row r = {.id = id, .api = "openai", .model = "tiny", .status = "queued",
                               .created_at = 1000, .coalesce = true};
        if (gps_store_job_insert(f->s, r) != 0)
            return (void *)1;
        gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT(id);
        u.status = "done";
        u.finished_at = 2000;
        u.coalesce = true;
        if (gps_store_job_update_async(f->s, u) != 0)
            return (void *)1;
    }
    return NULL;
}

/* Under a queue that never empties (foldable row writes only), a held
 * write whose hold is over (jP: never ended) is still written, and a
 * flush returns: they
 * ran only when the queue was empty or an op concerning jobs came, so
 * both waited as long as the load lasted (tens of seconds in the review's
 * probe; here, for ever). */
static void test_held_rows_under_a_full_queue(void **state)
{
    tctx *t = *state;
    gps_store_opts o = {.commit_interval_ms = 1, .batch_max = 8, .row_hold_ms = 5};
    gps_store *s = open_ok(t->db, NULL, &o);
    sqlite3 *db = raw_open(t->db);
    volatile int stop = 0;
    flood_arg f[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        f[i] = (flood_arg){.s = s, .stop = &stop, .who = i};
        assert_int_equal(pthread_create(&th[i], NULL, flood, &f[i]), 0);
    }
    wait_stat(s, statements, 100); /* the DB thread is in it */
    gps_store_job_row r = {.id = "jP", .api = "openai", .model = "tiny", .status = "queued",
                           .created_at = 1000, .coalesce = true};
    assert_int_equal(gps_store_job_insert(s, r), 0);
    /* Bounded: on a miss the producers stop before the assertion (the
     * close would wait on them). */
    uint64_t give_up = gp_now_mono_us() + 20 * 1000 * 1000;
    bool seen;
    while (!(seen = raw_int(db, "SELECT count(*) FROM jobs WHERE id = 'jP'") == 1) &&
           gp_now_mono_us() < give_up) {
        struct timespec ms = {0, 1000 * 1000};
        nanosleep(&ms, NULL);
    }
    if (seen)
        assert_int_equal(gps_store_flush(s), 0);
    stop = 1;
    int rows = 1;
    for (int i = 0; i < 3; i++) {
        void *rv;
        pthread_join(th[i], &rv);
        assert_null(rv);
        rows += f[i].n;
    }
    assert_true(seen);
    gps_store_close(s);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM jobs"), rows);
    sqlite3_close(db);
}

typedef struct got_usage {
    int calls;
    int64_t requests; /* key_a's */
} got_usage;

static void on_usage(void *arg, int status, int64_t day, const gps_store_usage_row *rows,
                     size_t n)
{
    got_usage *g = arg;
    assert_int_equal(status, 0);
    assert_int_equal(day, 3);
    for (size_t i = 0; i < n; i++)
        if (strcmp(rows[i].key_id, "key_a") == 0)
            g->requests = rows[i].requests;
    g->calls++;
}

/* A key's usage adds queued together are one statement (sums: with API
 * keys a request queued two, admission and accounting, issue 24), one per
 * key and day; never across a read of key_usage, which would otherwise
 * return an add queued after it. */
static void test_usage_adds_fold(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    assert_non_null(base);
    gps_store_opts o = {.commit_interval_ms = 60000, .batch_max = 64};
    gps_store *s = open_ok(t->db, base, &o);
    sqlite3 *db = raw_open(t->db);
    for (int i = 0; i < 10; i++)
        assert_int_equal(gps_store_usage_add(s, "key_a", 3, 1, 10, 100, 0), 0);
    for (int i = 0; i < 5; i++)
        assert_int_equal(gps_store_usage_add(s, "key_b", 3, 1, 1, 1, 1), 0);
    assert_int_equal(gps_store_usage_add(s, "key_b", 4, 1, 0, 0, 0), 0); /* another day */
    /* A negative count is refused, not folded (a sum of them could overflow). */
    assert_int_equal(gps_store_usage_add(s, "key_b", 3, -1, 0, 0, 0), -1);
    assert_int_equal(gps_store_usage_add(s, "key_b", 3, 0, 0, INT64_MIN, 0), -1);
    assert_int_equal(gps_store_flush(s), 0);
    gps_store_stats st;
    gps_store_get_stats(s, &st);
    assert_int_equal(st.ops_committed, 16);
    assert_int_equal(st.statements, 3);
    assert_text(db, "SELECT requests || '/' || prompt_tokens || '/' || completion_tokens || '/' "
                    "|| rate_limited FROM key_usage WHERE key_id = 'key_a' AND day = 3",
                "10/100/1000/0");
    assert_text(db, "SELECT requests || '/' || prompt_tokens || '/' || completion_tokens || '/' "
                    "|| rate_limited FROM key_usage WHERE key_id = 'key_b' AND day = 3",
                "5/5/5/5");
    assert_int_equal(raw_int(db, "SELECT requests FROM key_usage WHERE key_id = 'key_b' AND "
                                 "day = 4"), 1);

    /* Not across a read. */
    assert_int_equal(gps_store_usage_add(s, "key_a", 3, 1, 0, 0, 0), 0);
    got_usage g = {0};
    assert_int_equal(gps_store_usage_async(s, 3, on_usage, &g), 0);
    assert_int_equal(gps_store_usage_add(s, "key_a", 3, 1, 0, 0, 0), 0);
    loop_until(base, &g.calls);
    assert_int_equal(g.requests, 11);
    assert_int_equal(gps_store_flush(s), 0);
    gps_store_get_stats(s, &st);
    assert_int_equal(st.statements, 3 + 3);
    assert_int_equal(raw_int(db, "SELECT requests FROM key_usage WHERE key_id = 'key_a' AND "
                                 "day = 3"), 12);
    gps_store_close(s);
    sqlite3_close(db);
    event_base_free(base);
}

typedef struct writer_arg {
    gps_store *s;
    int who;
    int n;
} writer_arg;

static void *writer(void *p)
{
    writer_arg *w = p;
    for (int i = 0; i < w->n; i++) {
        char id[32];
        snprintf(id, sizeof(id), "job_%d_%d", w->who, i);
        gps_store_job_row r = {.id = id, .api = "openai", .model = "m", .status = "queued",
                               .created_at = i};
        if (gps_store_job_insert(w->s, r) != 0)
            return (void *)1;
        if (i % 10 == 0) {
            gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT(id);
            u.status = "done";
            u.finished_at = i + 1;
            if (gps_store_job_update_async(w->s, u) != 0)
                return (void *)1;
        }
    }
    return NULL;
}

static void test_concurrent_enqueue(void **state)
{
    tctx *t = *state;
    gps_store *s = open_ok(t->db, NULL, NULL);
    enum { THREADS = 3, PER = 3000 };
    pthread_t th[THREADS];
    writer_arg wa[THREADS];
    for (int i = 0; i < THREADS; i++) {
        wa[i] = (writer_arg){s, i, PER};
        assert_int_equal(pthread_create(&th[i], NULL, writer, &wa[i]), 0);
    }
    /* Flushes race with the writers: each must return, none may lose ops. */
    for (int i = 0; i < 5; i++)
        assert_int_equal(gps_store_flush(s), 0);
    for (int i = 0; i < THREADS; i++) {
        void *rv;
        pthread_join(th[i], &rv);
        assert_null(rv);
    }
    assert_int_equal(gps_store_flush(s), 0);
    gps_store_stats st;
    gps_store_get_stats(s, &st);
    long long want_ops = THREADS * (PER + PER / 10);
    assert_int_equal(st.ops_committed, want_ops);
    assert_int_equal(st.ops_enqueued, want_ops);
    assert_true(st.batches < (uint64_t)want_ops);
    gps_store_close(s);
    sqlite3 *db = raw_open(t->db);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM jobs"), THREADS * PER);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM jobs WHERE status='done'"),
                     THREADS * (PER / 10));
    sqlite3_close(db);
}

static void test_overload_drops(void **state)
{
    tctx *t = *state;
    gps_store_opts o = {.queue_max = 10, .busy_timeout_ms = 20000};
    gps_store *s = open_ok(t->db, NULL, &o);
    /* Hold the write lock from another connection: the DB thread waits in
     * BEGIN IMMEDIATE and takes nothing off the queue meanwhile. */
    sqlite3 *db = raw_open(t->db);
    raw_exec(db, "BEGIN IMMEDIATE");
    int accepted = 0, refused = 0;
    for (int i = 0; i < 25; i++) {
        char id[32];
        snprintf(id, sizeof(id), "job_%d", i);
        gps_store_job_row r = {.id = id, .api = "openai", .model = "m", .status = "queued"};
        if (gps_store_job_insert(s, r) == 0)
            accepted++;
        else
            refused++;
    }
    assert_int_equal(accepted, 10);
    assert_int_equal(refused, 15);
    gps_store_stats st;
    gps_store_get_stats(s, &st);
    assert_int_equal(st.drops, 15);
    raw_exec(db, "COMMIT");
    assert_int_equal(gps_store_flush(s), 0);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM jobs"), 10);
    sqlite3_close(db);
    gps_store_close(s);
}

/* Backpressure before the drops: from 3/4 of queue_max the store says to
 * refuse new work, until the queue is under half again; a renewal of the
 * same leases waiting in the queue is updated, not queued again. */
static void test_backlog_and_coalesced_renewals(void **state)
{
    tctx *t = *state;
    gps_store_opts o = {.queue_max = 16, .busy_timeout_ms = 20000};
    gps_store *s = open_ok(t->db, NULL, &o);
    sqlite3 *db = raw_open(t->db);
    raw_exec(db, "BEGIN IMMEDIATE"); /* the DB thread waits in BEGIN */
    char msg[256] = "";
    assert_int_equal(gps_store_backlog(s, msg, sizeof msg), 0);
    /* Ten renewals of one server's leases and one of another's: two ops. */
    for (int i = 0; i < 10; i++)
        assert_int_equal(gps_store_task_renew(s, "srvA", 1000 + i), 0);
    assert_int_equal(gps_store_task_renew(s, "srvB", 5000), 0);
    gps_store_stats st;
    gps_store_get_stats(s, &st);
    assert_int_equal(st.queue_depth, 2);
    for (int i = 0; i < 9; i++) {
        char id[32];
        snprintf(id, sizeof(id), "job_%d", i);
        gps_store_job_row r = {.id = id, .api = "openai", .model = "m", .status = "queued"};
        assert_int_equal(gps_store_job_insert(s, r), 0);
    }
    /* 11 queued: under 12 (3/4 of 16). */
    assert_int_equal(gps_store_backlog(s, msg, sizeof msg), 0);
    gps_store_job_row r = {.id = "job_9", .api = "openai", .model = "m", .status = "queued"};
    assert_int_equal(gps_store_job_insert(s, r), 0);
    assert_true(gps_store_backlog(s, msg, sizeof msg) >= 1);
    assert_non_null(strstr(msg, "not keeping up"));
    raw_exec(db, "COMMIT");
    assert_int_equal(gps_store_flush(s), 0);
    assert_int_equal(gps_store_backlog(s, msg, sizeof msg), 0);
    gps_store_get_stats(s, &st);
    assert_int_equal(st.drops, 0);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM jobs"), 10);
    sqlite3_close(db);
    gps_store_close(s);
}

/* ---- restart: loads ---- */

typedef struct agents_seen {
    int n;
    char name[32], state[32], region[32], gpu[32], alias1[32];
    size_t n_models, n_aliases;
    long long ctx;
    bool loaded;
} agents_seen;

static int on_agent(void *arg, const gps_store_agent_info *a)
{
    agents_seen *as = arg;
    as->n++;
    snprintf(as->name, sizeof(as->name), "%s", a->name ? a->name : "<null>");
    snprintf(as->state, sizeof(as->state), "%s", a->state);
    json_t *r = json_object_get(a->labels, "region");
    snprintf(as->region, sizeof(as->region), "%s", r ? json_string_value(r) : "<none>");
    json_t *g = a->facts ? json_object_get(json_array_get(json_object_get(a->facts, "gpus"), 0),
                                           "name")
                         : NULL;
    snprintf(as->gpu, sizeof(as->gpu), "%s", g ? json_string_value(g) : "<none>");
    as->n_models = a->n_models;
    if (a->n_models) {
        as->n_aliases = a->models[0].n_aliases;
        snprintf(as->alias1, sizeof(as->alias1), "%s",
                 a->models[0].n_aliases > 1 ? a->models[0].aliases[1] : "<none>");
        as->ctx = a->models[0].context_length;
        as->loaded = a->models[0].loaded;
    }
    return 0;
}

typedef struct keys_seen {
    int n;
    char id[40], hash[65], role[16], name[32];
    int64_t revoked_at, expires_at;
} keys_seen;

static int on_key(void *arg, const gps_store_key_row *k)
{
    keys_seen *ks = arg;
    ks->n++;
    snprintf(ks->id, sizeof(ks->id), "%s", k->id);
    snprintf(ks->hash, sizeof(ks->hash), "%s", k->hash);
    snprintf(ks->role, sizeof(ks->role), "%s", k->role);
    snprintf(ks->name, sizeof(ks->name), "%s", k->name);
    ks->revoked_at = k->revoked_at;
    ks->expires_at = k->expires_at;
    return 0;
}

typedef struct jobs_seen {
    int n;
    char ids[8][32];
    char checkpoint[64];
    char prompt[64];
} jobs_seen;

static int on_unfinished(void *arg, const gps_store_job_info *j)
{
    jobs_seen *js = arg;
    if (js->n < 8)
        snprintf(js->ids[js->n], sizeof(js->ids[0]), "%s", j->id);
    js->n++;
    if (j->checkpoint_text)
        snprintf(js->checkpoint, sizeof(js->checkpoint), "%.*s", (int)j->checkpoint_len,
                 j->checkpoint_text);
    json_t *p = j->request ? json_object_get(j->request, "prompt") : NULL;
    if (p)
        snprintf(js->prompt, sizeof(js->prompt), "%s", json_string_value(p));
    return 0;
}

static void test_restart_loads(void **state)
{
    tctx *t = *state;
    gps_store *s = open_ok(t->db, NULL, NULL);
    json_t *labels = json_pack("{s:s}", "region", "us");
    json_t *facts = json_pack("{s:[{s:s}]}", "gpus", "name", "A100");
    gps_store_agent_row ar = {.id = "aaaaaaaa-2222-4333-8444-555555555555", .name = "rack",
                              .state = "healthy", .labels = labels, .facts = facts,
                              .last_seen = 5};
    assert_int_equal(gps_store_agent_upsert(s, ar), 0);
    json_decref(labels);
    json_decref(facts);
    const char *al[] = {"a", "b", "c"};
    gps_store_model_row m = {.model = "llama", .aliases = al, .n_aliases = 3,
                             .context_length = 4096, .loaded = true};
    assert_int_equal(gps_store_agent_models(s, ar.id, &m, 1), 0);
    gps_store_key_row k = {.id = "key_abc", .hash = "00ff", .role = "client", .name = "ci",
                           .created_at = 10, .expires_at = 99999};
    assert_int_equal(gps_store_key_insert(s, k), 0);
    assert_int_equal(gps_store_key_revoke(s, "key_abc", 77), 0);

    json_t *req = json_pack("{s:s}", "prompt", "hello");
    add_job(s, "job_a", req);              /* unfinished, with checkpoint */
    json_decref(req);
    assert_int_equal(gps_store_checkpoint(s, "job_a", "so far", 6, 3), 0);
    add_job(s, "job_b", NULL);             /* unfinished */
    add_job(s, "job_old", NULL);           /* finished long ago: purged */
    add_job(s, "job_new", NULL);           /* finished recently: kept */
    gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT("job_old");
    u.status = "done";
    u.finished_at = 1000;
    gps_store_job_update_async(s, u);
    assert_int_equal(gps_store_checkpoint(s, "job_old", "old", 3, 1), 0);
    u = GPS_STORE_JOB_UPDATE_INIT("job_new");
    u.status = "failed";
    u.error_code = "AGENT_LOST";
    u.finished_at = gp_now_wall_ms();
    gps_store_job_update_async(s, u);
    assert_int_equal(gps_store_purge_jobs(s, gp_now_wall_ms() - 86400000LL), 0);
    gps_store_close(s);   /* close flushes */

    s = open_ok(t->db, NULL, NULL);
    char err[256] = "";
    agents_seen as = {0};
    assert_int_equal(gps_store_load_agents(s, on_agent, &as, err, sizeof(err)), 0);
    assert_int_equal(as.n, 1);
    assert_string_equal(as.name, "rack");
    assert_string_equal(as.state, "healthy");
    assert_string_equal(as.region, "us");
    assert_string_equal(as.gpu, "A100");
    assert_int_equal(as.n_models, 1);
    assert_int_equal(as.n_aliases, 3);
    assert_string_equal(as.alias1, "b");
    assert_int_equal(as.ctx, 4096);
    assert_true(as.loaded);

    keys_seen ks = {0};
    assert_int_equal(gps_store_load_keys(s, on_key, &ks, err, sizeof(err)), 0);
    assert_int_equal(ks.n, 1);
    assert_string_equal(ks.id, "key_abc");
    assert_string_equal(ks.role, "client");
    assert_string_equal(ks.name, "ci");
    assert_int_equal(ks.revoked_at, 77);
    assert_int_equal(ks.expires_at, 99999);

    jobs_seen js = {0};
    assert_int_equal(gps_store_load_unfinished_jobs(s, on_unfinished, &js, err, sizeof(err)), 0);
    assert_int_equal(js.n, 2);
    assert_string_equal(js.checkpoint, "so far");
    assert_string_equal(js.prompt, "hello");

    /* Sync key insert and revoke (the CLI path). */
    gps_store_key_row k2 = {.id = "key_cli", .hash = "abcd", .role = "admin", .created_at = 20};
    assert_int_equal(gps_store_key_insert_sync(s, &k2, err, sizeof(err)), 0);
    assert_int_equal(gps_store_key_insert_sync(s, &k2, err, sizeof(err)), -1);   /* duplicate */
    assert_non_null(strstr(err, "inserting key"));
    assert_int_equal(gps_store_key_revoke_sync(s, "key_cli", 30, err, sizeof(err)), 0);
    assert_int_equal(gps_store_key_revoke_sync(s, "key_cli", 31, err, sizeof(err)), 1);
    assert_int_equal(gps_store_key_revoke_sync(s, "key_none", 31, err, sizeof(err)), 1);
    gps_store_close(s);

    sqlite3 *db = raw_open(t->db);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM jobs"), 3);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM jobs WHERE id='job_old'"), 0);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM job_checkpoints WHERE job_id='job_old'"), 0);
    assert_text(db, "SELECT error_code FROM jobs WHERE id='job_new'", "AGENT_LOST");
    assert_int_equal(raw_int(db, "SELECT revoked_at FROM api_keys WHERE id='key_cli'"), 30);
    sqlite3_close(db);
}

/* Every start-up load stops at a callback's non-zero value and returns
 * it (issue 11: load_usage used to stop and return 0, so a caller that
 * failed on a row, out of memory, started with partial usage). */
static int stop_agent(void *arg, const gps_store_agent_info *a)
{
    (void)a;
    return ++*(int *)arg == 1 ? 7 : 0;
}
static int stop_key(void *arg, const gps_store_key_row *k)
{
    (void)k;
    return ++*(int *)arg == 1 ? 7 : 0;
}
static int stop_job(void *arg, const gps_store_job_info *j)
{
    (void)j;
    return ++*(int *)arg == 1 ? 7 : 0;
}
static int stop_usage(void *arg, const char *key_id, int64_t day, int64_t requests,
                      int64_t prompt_tokens, int64_t completion_tokens, int64_t rate_limited)
{
    (void)key_id, (void)day, (void)requests, (void)prompt_tokens, (void)completion_tokens,
        (void)rate_limited;
    return ++*(int *)arg == 1 ? -1 : 0;
}

static void test_loads_return_the_callbacks_stop(void **state)
{
    tctx *t = *state;
    gps_store *s = open_ok(t->db, NULL, NULL);
    for (int i = 0; i < 2; i++) {
        char id[64];
        snprintf(id, sizeof id, "aaaaaaaa-2222-4333-8444-55555555555%d", i);
        gps_store_agent_row ar = {.id = id, .state = "healthy", .last_seen = 5};
        assert_int_equal(gps_store_agent_upsert(s, ar), 0);
        snprintf(id, sizeof id, "key_%d", i);
        gps_store_key_row k = {.id = id, .hash = id, .role = "client", .created_at = 10 + i};
        assert_int_equal(gps_store_key_insert(s, k), 0);
        assert_int_equal(gps_store_usage_add(s, id, 3, 1, 2, 3, 0), 0);
        snprintf(id, sizeof id, "job_%d", i);
        add_job(s, id, NULL);
    }
    assert_int_equal(gps_store_flush(s), 0);
    char err[256] = "";
    int n = 0;
    assert_int_equal(gps_store_load_agents(s, stop_agent, &n, err, sizeof err), 7);
    assert_int_equal(n, 1);
    n = 0;
    assert_int_equal(gps_store_load_keys(s, stop_key, &n, err, sizeof err), 7);
    assert_int_equal(n, 1);
    n = 0;
    assert_int_equal(gps_store_load_unfinished_jobs(s, stop_job, &n, err, sizeof err), 7);
    assert_int_equal(n, 1);
    n = 0;
    assert_int_equal(gps_store_load_usage(s, 3, stop_usage, &n, err, sizeof err), -1);
    assert_int_equal(n, 1);
    gps_store_close(s);
}

static void test_purge_chunks(void **state)
{
    tctx *t = *state;
    gps_store *s = open_ok(t->db, NULL, NULL);
    enum { N = 2500 };   /* > 2 purge chunks of 1000 */
    for (int i = 0; i < N; i++) {
        char id[32];
        snprintf(id, sizeof(id), "job_%d", i);
        add_job(s, id, NULL);
        gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT(id);
        u.status = "done";
        u.finished_at = 1000 + i;
        assert_int_equal(gps_store_job_update_async(s, u), 0);
    }
    add_job(s, "job_live", NULL);
    assert_int_equal(gps_store_purge_jobs(s, 1000000), 0);
    gps_store_close(s);   /* the re-queued chunks run before the thread stops */
    sqlite3 *db = raw_open(t->db);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM jobs"), 1);
    sqlite3_close(db);
}

/* A key keeps its newest keep_per_key responses, newest by created_at then
 * id; other keys' are untouched. The trim's plan sorts nothing (migration
 * 0008): with the index of 0006 alone it sorted each run of equal
 * created_at in a temporary b-tree, one reset per stored row. */
static void test_response_trim(void **state)
{
    tctx *t = *state;
    gps_store *s = open_ok(t->db, NULL, NULL);
    json_t *obj = json_pack("{s:s}", "object", "response");
    json_t *ctx = json_array();
    for (int i = 0; i < 12; i++) {
        char id[32];
        snprintf(id, sizeof id, "resp_%02d", i);
        /* created_at in pairs: ties are settled by id */
        gps_store_response_row r = {.id = id, .key_id = i == 5 ? "other" : "key_a",
                                    .created_at = 1000 + i / 2, .expires_at = INT64_MAX / 2,
                                    .object = obj, .context = ctx, .keep_per_key = 4};
        assert_int_equal(gps_store_response_put(s, &r), 0);
    }
    assert_int_equal(gps_store_flush(s), 0);
    gps_store_close(s);
    sqlite3 *db = raw_open(t->db);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM responses WHERE key_id = 'key_a'"), 4);
    assert_text(db, "SELECT group_concat(id, ',') FROM (SELECT id FROM responses "
                    "WHERE key_id = 'key_a' ORDER BY id)", "resp_08,resp_09,resp_10,resp_11");
    assert_text(db, "SELECT id FROM responses WHERE key_id = 'other'", "resp_05");
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, "EXPLAIN QUERY PLAN DELETE FROM responses WHERE id IN "
                                            "(SELECT id FROM responses WHERE key_id = ?1 ORDER BY "
                                            "created_at DESC, id DESC LIMIT -1 OFFSET ?2)",
                                        -1, &st, NULL),
                     SQLITE_OK);
    while (sqlite3_step(st) == SQLITE_ROW)
        assert_null(strstr((const char *)sqlite3_column_text(st, 3), "TEMP B-TREE"));
    sqlite3_finalize(st);
    sqlite3_close(db);
    json_decref(obj);
    json_decref(ctx);
}

/* The DB thread wakes a loop that sleeps with nothing else to do: the base
 * is made without libevent's thread support (the server's, docs/
 * architecture.md "Threads"), so only the store's own wake-up (an eventfd
 * the loop reads) can end the wait. The watchdog is a bound on a hang, far
 * beyond any commit, not a measure of speed. */
typedef struct woken {
    struct event_base *base;
    int pings, watchdog;
} woken;

static void woken_ping(void *arg, bool ok, const char *msg)
{
    woken *w = arg;
    (void)msg;
    assert_true(ok);
    w->pings++;
    event_base_loopbreak(w->base);
}

static void woken_watchdog(evutil_socket_t fd, short what, void *arg)
{
    woken *w = arg;
    w->watchdog = 1;
    event_base_loopbreak(w->base);
}

static void test_db_thread_wakes_the_loop(void **state)
{
    tctx *t = *state;
    woken w = {.base = event_base_new()};
    assert_non_null(w.base);
    gps_store *s = open_ok(t->db, w.base, NULL);
    struct event *dog = evtimer_new(w.base, woken_watchdog, &w);
    struct timeval tv = {30, 0};
    assert_int_equal(evtimer_add(dog, &tv), 0);
    for (int i = 1; i <= 3; i++) { /* each a wake-up after the previous was read */
        assert_int_equal(gps_store_ping_async(s, woken_ping, &w), 0);
        event_base_dispatch(w.base); /* until the ping's callback */
        assert_int_equal(w.watchdog, 0);
        assert_int_equal(w.pings, i);
    }
    event_free(dog);
    gps_store_close(s);
    event_base_free(w.base);
}

/* ---- what is read back, under memory pressure ---- */

/* Values long enough that jansson's lexer grows its token buffer for them:
 * a growth that fails drops a byte and the load succeeds (gp_json.h), or
 * reads and writes past the buffer. The store reads such texts with
 * gp_json_read; texts it declines (a \u escape: OOM_BELL) go to the
 * checked load, and hold short strings only here, so that jansson's lexer
 * never grows its buffer under the failing allocator. */
#define OOM_BELL "ding\a"
#define OOM_LONG1 "us-east-1, the rack by the window, third shelf from the top, left side"
#define OOM_LONG2 "NVIDIA A100-SXM4-80GB, the one whose fan was replaced last spring"
#define OOM_ALIAS0 "an-alias-long-enough-to-need-a-grown-token-buffer-0123456789"
#define OOM_ALIAS1 "a-second-alias-long-enough-to-need-a-grown-token-buffer-abcdef"
#define OOM_PROMPT "Once upon a time, in a datacenter far away, a prompt long enough to grow"

/* The values stored, and what the callbacks saw of them. */
typedef struct oom_seen {
    json_t *labels, *facts, *request, *events; /* as stored (borrowed) */
    int calls, status;
    int bad;        /* calls that saw a value other than the one stored */
} oom_seen;

static int oom_on_agent(void *arg, const gps_store_agent_info *a)
{
    oom_seen *o = arg;
    o->calls++;
    bool same = json_equal(a->labels, o->labels) && json_equal(a->facts, o->facts) &&
                a->n_models == 1 && a->models[0].n_aliases == 2 &&
                strcmp(a->models[0].aliases[0], OOM_ALIAS0) == 0 &&
                strcmp(a->models[0].aliases[1], OOM_ALIAS1) == 0;
    if (!same)
        print_diff("agent.labels", a->labels, o->labels);
    o->bad += !same;
    return 0;
}

static bool oom_job_same(const oom_seen *o, const gps_store_job_info *j)
{
    bool same = json_equal(j->request, o->request) && json_equal(j->events, o->events);
    if (!same) {
        print_diff("job.request", j->request, o->request);
        print_diff("job.events", j->events, o->events);
    }
    return same;
}

static int oom_on_job(void *arg, const gps_store_job_info *j)
{
    oom_seen *o = arg;
    o->calls++;
    o->bad += !oom_job_same(o, j);
    return 0;
}

static void oom_on_job_get(void *arg, int status, const gps_store_job_info *j)
{
    oom_seen *o = arg;
    o->calls++;
    o->status = status;
    if (j)
        o->bad += !oom_job_same(o, j);
}

/* An agent with labels, facts and a model's aliases, and an unfinished
 * native task with its request and two batches of its event log, all
 * holding long strings. *want gets the values stored (owned by the
 * caller: oom_seen_free). */
static void oom_store_fill(gps_store *s, oom_seen *want)
{
    want->labels = json_pack("{s:s,s:s}", "region", OOM_BELL, "tier", "gold");
    want->facts = json_pack("{s:[{s:s,s:I}]}", "gpus", "name", OOM_LONG2, "vram",
                            (json_int_t)85899345920LL);
    gps_store_agent_row ar = {.id = "aaaaaaaa-2222-4333-8444-555555555555", .name = "rack",
                              .state = "healthy", .labels = want->labels,
                              .facts = want->facts, .last_seen = 5};
    assert_int_equal(gps_store_agent_upsert(s, ar), 0);
    const char *al[] = {OOM_ALIAS0, OOM_ALIAS1};
    gps_store_model_row m = {.model = "llama", .aliases = al, .n_aliases = 2,
                             .context_length = 4096, .loaded = true};
    assert_int_equal(gps_store_agent_models(s, ar.id, &m, 1), 0);
    want->request = json_pack("{s:s,s:s,s:i}", "model", "tiny", "prompt", OOM_PROMPT,
                              "max_tokens", 16);
    add_job(s, "job_a", want->request);
    json_t *b1 = json_pack("[{s:i,s:s,s:{s:s}},{s:i,s:s,s:{s:s}}]", "seq", 1, "type", "token",
                           "data", "text", OOM_LONG1, "seq", 2, "type", "token", "data", "text",
                           OOM_LONG2);
    json_t *b2 = json_pack("[{s:i,s:s,s:{s:s}}]", "seq", 3, "type", "token", "data", "text",
                           OOM_BELL);
    assert_int_equal(gps_store_job_events(s, "job_a", b1), 0);
    assert_int_equal(gps_store_job_events(s, "job_a", b2), 0);
    want->events = json_deep_copy(b1);
    assert_int_equal(json_array_extend(want->events, b2), 0);
    json_decref(b1);
    json_decref(b2);
    assert_int_equal(gps_store_flush(s), 0);
}

static void oom_seen_free(oom_seen *o)
{
    json_decref(o->labels);
    json_decref(o->facts);
    json_decref(o->request);
    json_decref(o->events);
}

/* One load's outcome in a sweep: whole (every value as stored), or -1
 * saying out of memory; never a value changed or dropped (a byte missing
 * from a long string, labels read as {}, a job without its event log). */
static void oom_judge(const char *what, size_t n, int rc, const oom_seen *o, const char *err,
                      size_t *bad, size_t *refused)
{
    if (rc == 0 && o->calls == 1 && o->bad == 0)
        return;
    if (rc == -1 && o->bad == 0 && strstr(err, "out of memory")) {
        (*refused)++;
        return;
    }
    print_message("run %zu: %s gave %d after %d call(s), %d with another value (%s)\n", n, what,
                  rc, o->calls, o->bad, err);
    (*bad)++;
}

/* The start-up loads (agents with their labels, facts and aliases;
 * unfinished jobs with their request and event log) on a failing
 * allocator: each whole, or failed saying out of memory. The code before
 * read labels lost to out of memory as {}, an alias list as none, a
 * request as none, a batch as the log's end, and kept a string with a
 * byte dropped. */
static void test_restart_loads_oom(void **state)
{
    tctx *t = *state;
    gps_store *s = open_ok(t->db, NULL, NULL);
    oom_seen want = {0};
    oom_store_fill(s, &want);
    char err[256] = "";
    oom_seen a = want, j = want; /* with memory: whole (and the connection opened) */
    assert_int_equal(gps_store_load_agents(s, oom_on_agent, &a, err, sizeof err), 0);
    assert_int_equal(gps_store_load_unfinished_jobs(s, oom_on_job, &j, err, sizeof err), 0);
    assert_int_equal(a.calls + j.calls, 2);
    assert_int_equal(a.bad + j.bad, 0);
    size_t bad = 0, refused = 0, n;
    for (n = 1;; n++) {
        char ea[256] = "", ej[256] = "";
        a = want;
        j = want;
        arm_beneath(n);
        int ra = gps_store_load_agents(s, oom_on_agent, &a, ea, sizeof ea);
        int rj = gps_store_load_unfinished_jobs(s, oom_on_job, &j, ej, sizeof ej);
        bool hit = disarm();
        oom_judge("load_agents", n, ra, &a, ea, &bad, &refused);
        oom_judge("load_unfinished_jobs", n, rj, &j, ej, &bad, &refused);
        if (!hit)
            break;
    }
    assert_true(n > 20); /* the sweep reached the loads' JSON */
    assert_true(refused > 0);
    assert_int_equal(bad, 0);
    gps_store_close(s);
    oom_seen_free(&want);
}

/* A job read on the DB thread and delivered on the loop (GET of a native
 * task, its resume) on a failing allocator: found whole, or status -1 (the
 * callers' 500); never "not found", a request read as none or changed, or
 * an event log cut short (the code before: a batch lost to out of memory
 * ended the log, a request lost read as none). */
static void test_job_get_oom(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    assert_non_null(base);
    gps_store *s = open_ok(t->db, base, NULL);
    oom_seen want = {0};
    oom_store_fill(s, &want);
    oom_seen g = want;
    assert_int_equal(gps_store_job_get_async(s, "job_a", oom_on_job_get, &g), 0);
    loop_until(base, &g.calls);
    assert_int_equal(g.status, 0);
    assert_int_equal(g.bad, 0);
    size_t bad = 0, refused = 0, n;
    for (n = 1;; n++) {
        g = want;
        arm_beneath(n);
        int rc = gps_store_job_get_async(s, "job_a", oom_on_job_get, &g);
        if (rc == 0)
            loop_until(base, &g.calls);
        bool hit = disarm();
        if (rc != 0 || g.status == -1) {
            refused++;
        } else if (g.calls != 1 || g.status != 0 || g.bad) {
            print_message("run %zu: %d call(s), status %d, %d with another value\n", n, g.calls,
                          g.status, g.bad);
            bad++;
        }
        if (!hit)
            break;
    }
    assert_true(n > 20);
    assert_true(refused > 0);
    assert_int_equal(bad, 0);
    gps_store_close(s);
    event_base_free(base);
    oom_seen_free(&want);
}

/* What the read of a damaged row saw (test_damaged_rows_read_as_before). */
typedef struct damaged_seen {
    int calls, status;
    bool request;          /* a request came with the job */
    json_t *events;        /* copy */
} damaged_seen;

static void damaged_on_job(void *arg, int status, const gps_store_job_info *j)
{
    damaged_seen *d = arg;
    d->calls++;
    d->status = status;
    d->request = j && j->request;
    d->events = j && j->events ? json_deep_copy(j->events) : NULL;
}

/* What a damaged row (not JSON: edited by hand) reads as is unchanged by
 * the sweeps' out-of-memory failures: labels {} and facts none, aliases
 * none, a request none, a batch the log's end (replay never skips a seq);
 * the loads and the read succeed. */
static void test_damaged_rows_read_as_before(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    assert_non_null(base);
    gps_store *s = open_ok(t->db, base, NULL);
    oom_seen want = {0};
    oom_store_fill(s, &want);
    sqlite3 *db = raw_open(t->db);
    raw_exec(db, "UPDATE agents SET labels = '{not json', facts = 'nor this'");
    raw_exec(db, "UPDATE agent_models SET aliases = '[\"cut'");
    raw_exec(db, "UPDATE jobs SET request = 'not json'");
    raw_exec(db, "UPDATE job_events SET events = '[{' WHERE first_seq = 3");
    sqlite3_close(db);
    char err[256] = "";
    agents_seen as = {0};
    assert_int_equal(gps_store_load_agents(s, on_agent, &as, err, sizeof err), 0);
    assert_int_equal(as.n, 1);
    assert_string_equal(as.region, "<none>");
    assert_string_equal(as.gpu, "<none>");
    assert_int_equal(as.n_models, 1);
    assert_int_equal(as.n_aliases, 0);
    jobs_seen js = {0};
    assert_int_equal(gps_store_load_unfinished_jobs(s, on_unfinished, &js, err, sizeof err), 0);
    assert_int_equal(js.n, 1);
    assert_string_equal(js.prompt, "");
    damaged_seen d = {0};
    assert_int_equal(gps_store_job_get_async(s, "job_a", damaged_on_job, &d), 0);
    loop_until(base, &d.calls);
    assert_int_equal(d.status, 0);
    assert_false(d.request);
    json_array_remove(want.events, 2); /* the damaged batch's one event */
    assert_true(json_equal(d.events, want.events));
    json_decref(d.events);
    gps_store_close(s);
    event_base_free(base);
    oom_seen_free(&want);
}

int main(void)
{
    gp_json_init(); /* as the server's main: the checked loads count jansson's failures */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_migrations_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_newer_schema_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_sqlite, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migrations_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_async_writes_and_reads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ping_and_no_base, setup, teardown),
        cmocka_unit_test_setup_teardown(test_db_thread_wakes_the_loop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_delivers_reads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_group_commit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_first_write_waits_reads_do_not, setup, teardown),
        cmocka_unit_test_setup_teardown(test_row_writes_fold, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_rows_held, setup, teardown),
        cmocka_unit_test_setup_teardown(test_held_rows_beside_others, setup, teardown),
        cmocka_unit_test_setup_teardown(test_held_rows_expire_no_empty_groups, setup, teardown),
        cmocka_unit_test_setup_teardown(test_held_rows_end_at_queue_max, setup, teardown),
        cmocka_unit_test_setup_teardown(test_held_rows_under_a_full_queue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_usage_adds_fold, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_enqueue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overload_drops, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backlog_and_coalesced_renewals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_loads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_purge_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loads_return_the_callbacks_stop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_response_trim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_loads_oom, setup, teardown),
        cmocka_unit_test_setup_teardown(test_job_get_oom, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_rows_read_as_before, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
