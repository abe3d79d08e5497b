/* The start-up restore of the unfinished jobs (gps_tasks_restore_unfinished,
 * what the server's main runs before its loop) under memory pressure, on a
 * real SQLite store: an allocation-failure sweep (fixture_oom.h
 * arm_beneath: the N-th of the project's malloc, calloc, realloc, strdup
 * and strndup fails, jansson's among them through gp_json's counting
 * allocator, as in the server; N = 1, 2, ... until a run does not reach
 * it) over the read of four rows (a native task with a log, a queued one,
 * a native row that is damaged, a relayed request). Every run either
 * restores both native tasks whole (and fails the two others with
 * SERVER_RESTART), or refuses, saying out of memory (the server does not
 * start); in neither case is a native task's row marked failed. The code
 * before took a restore that ran out of memory for a row that cannot be
 * restored and failed the task with SERVER_RESTART, for good. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <sqlite3.h>

#include "common/gp_json.h"
#include "common/gp_util.h"
#include "server/dialects/api_tasks.h"
#include "server/dialects/api_tasks_priv.h"
#include "server/metrics.h"
#include "server/store/store.h"

#include "../db_fixture.h"
#include "../fixture_oom.h"

#define DIGEST "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define ID_RUN "00000000-0000-4000-8000-0000000000a1"    /* native, tokens so far */
#define ID_QUEUED "00000000-0000-4000-8000-0000000000a2" /* native, no event yet */
#define ID_DAMAGED "00000000-0000-4000-8000-0000000000a3" /* native, no model */
#define ID_RELAY "00000000-0000-4000-8000-0000000000a4"  /* openai: its client is gone */

static const char *const STORED =
    "[{\"seq\":1,\"type\":\"queued\",\"data\":{\"position\":0,\"estimated_wait_ms\":0}},"
    "{\"seq\":2,\"type\":\"started\",\"data\":{\"agent_id\":\"a1\",\"attempt\":1},"
    "\"digest\":\"" DIGEST "\"},"
    "{\"seq\":3,\"type\":\"token\",\"data\":{\"text\":\"Once\"},\"ids\":[11,12]},"
    "{\"seq\":4,\"type\":\"token\",\"data\":{\"text\":\" upon\"},\"ids\":[13]}]";

static void insert(gps_store *s, const char *id, const char *api, const char *status,
                   const char *request, long long seed)
{
    json_t *req = request ? J(request) : NULL;
    gps_store_job_row r = {.id = id, .api = api, .kind = "completion", .model = "m1",
                           .status = status, .correlation_id = "corr", .has_seed = true,
                           .seed = seed, .created_at = gp_now_wall_ms(), .request = req};
    assert_int_equal(gps_store_job_insert(s, r), 0);
    json_decref(req);
}

static void fill(gps_store *s)
{
    insert(s, ID_RUN, "native", "running", "{\"model\":\"m1\",\"prompt\":\"p\",\"max_tokens\":8}",
           77);
    json_t *events = J(STORED);
    assert_int_equal(gps_store_job_events(s, ID_RUN, events), 0);
    json_decref(events);
    insert(s, ID_QUEUED, "native", "queued", "{\"model\":\"m1\",\"prompt\":\"q\"}", 5);
    insert(s, ID_DAMAGED, "native", "queued", "{\"prompt\":\"no model\"}", 6);
    insert(s, ID_RELAY, "openai", "running", NULL, 7);
    assert_int_equal(gps_store_flush(s), 0);
}

/* A row as the file holds it. */
typedef struct row_state {
    char status[16];
    char code[32];
    bool finished;
} row_state;

static row_state row_read(sqlite3 *db, const char *id)
{
    row_state r = {0};
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db,
                                        "SELECT status, error_code, finished_at FROM jobs "
                                        "WHERE id = ?1",
                                        -1, &st, NULL),
                     SQLITE_OK);
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    const unsigned char *v = sqlite3_column_text(st, 0);
    snprintf(r.status, sizeof r.status, "%s", v ? (const char *)v : "");
    v = sqlite3_column_text(st, 1);
    snprintf(r.code, sizeof r.code, "%s", v ? (const char *)v : "");
    r.finished = sqlite3_column_type(st, 2) != SQLITE_NULL;
    sqlite3_finalize(st);
    return r;
}

/* The rows back as fill left them, for the next run. */
static void rows_reset(sqlite3 *db)
{
    static const char *const sql =
        "UPDATE jobs SET status = CASE id WHEN '" ID_RUN "' THEN 'running' WHEN '" ID_RELAY
        "' THEN 'running' ELSE 'queued' END, error_code = NULL, finished_at = NULL";
    char *e = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &e) != SQLITE_OK)
        fail_msg("reset: %s", e ? e : "?");
}

/* A native task's row as it was stored: not failed, not finished. */
static bool row_untouched(sqlite3 *db, const char *id, const char *status, size_t run)
{
    row_state r = row_read(db, id);
    if (!r.finished && strcmp(r.status, status) == 0 && !r.code[0])
        return true;
    print_message("run %zu: task %s's row is now %s %s%s\n", run, id, r.status, r.code,
                  r.finished ? " (finished)" : "");
    return false;
}

/* A row the restore fails: failed with SERVER_RESTART, or (its write
 * dropped for lack of memory) left to the next start. */
static bool row_failed_or_left(sqlite3 *db, const char *id, const char *status, size_t run,
                               size_t *failed)
{
    row_state r = row_read(db, id);
    if (r.finished && strcmp(r.status, "failed") == 0 && strcmp(r.code, "SERVER_RESTART") == 0) {
        (*failed)++;
        return true;
    }
    if (!r.finished && strcmp(r.status, status) == 0 && !r.code[0])
        return true;
    print_message("run %zu: row %s is now %s %s\n", run, id, r.status, r.code);
    return false;
}

/* Both native tasks in memory, as stored: the log whole, the text so far,
 * the token ids and the seed. */
static bool restored_whole(gps_tasks *g, size_t run)
{
    task *t = tasks_find(g, ID_RUN);
    task *q = tasks_find(g, ID_QUEUED);
    if (!t || !q || tasks_find(g, ID_DAMAGED) || tasks_find(g, ID_RELAY)) {
        print_message("run %zu: restored %s%s\n", run, t ? "the running task " : "",
                      q ? "the queued task" : "");
        return false;
    }
    json_t *want = J(STORED);
    json_t *got = json_array();
    for (size_t i = 0; i < gps_tlog_count(t->log); i++)
        json_array_append_new(got, gps_tlog_get(t->log, i));
    bool ok = json_equal(got, want) && t->resume_text &&
              strcmp(t->resume_text, "Once upon") == 0 && t->n_resume_ids == 3 &&
              json_integer_value(json_object_get(t->resume_body, "seed")) == 77 &&
              gps_tlog_count(q->log) == 0 &&
              json_integer_value(json_object_get(q->resume_body, "seed")) == 5;
    if (!ok)
        print_message("run %zu: a task restored other than stored\n", run);
    json_decref(got);
    json_decref(want);
    return ok;
}

static void test_startup_restore_oom(void **state)
{
    tctx *tc = *state;
    fixture_needs_file(tc);
    char err[512] = "";
    gps_store *s = gps_store_open(tc->db, NULL, NULL, err, sizeof err);
    if (!s)
        fail_msg("open: %s", err);
    fill(s);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(tc->db, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    gps_metrics *m = gps_metrics_new();
    assert_non_null(m);
    size_t bad = 0, refused = 0, whole = 0, failed = 0, n;
    for (n = 1;; n++) {
        gps_tasks *g = gps_tasks_new(NULL, NULL, s, m, 60);
        assert_non_null(g);
        char e[768] = "";
        arm_beneath(n);
        int rc = gps_tasks_restore_unfinished(g, false, e, sizeof e);
        bool hit = disarm();
        assert_int_equal(gps_store_flush(s), 0);
        bool ok = row_untouched(db, ID_RUN, "running", n) &&
                  row_untouched(db, ID_QUEUED, "queued", n);
        if (rc == 0) {
            ok = ok && restored_whole(g, n) &&
                 row_failed_or_left(db, ID_DAMAGED, "queued", n, &failed) &&
                 row_failed_or_left(db, ID_RELAY, "running", n, &failed);
            whole++;
        } else if (rc == -1 && strstr(e, "out of memory")) {
            refused++;
        } else {
            print_message("run %zu: rc %d: %s\n", n, rc, e);
            ok = false;
        }
        if (!ok)
            bad++;
        gps_tasks_free(g);
        rows_reset(db);
        if (!hit)
            break;
    }
    print_message("%zu runs: %zu refused (out of memory), %zu restored\n", n, refused, whole);
    assert_true(n > 20); /* the sweep reached the restore's allocations */
    assert_true(refused > 0);
    assert_true(failed > 0); /* with memory, the damaged row and the relayed one are failed */
    assert_int_equal(bad, 0);
    gps_metrics_free(m);
    sqlite3_close(db);
    gps_store_close(s);
}

int main(void)
{
    gp_json_init(); /* as the server's main: the checked loads count jansson's failures */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_startup_restore_oom, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
