/* store: the event log of native tasks (job_events, migration 0002) and
 * the stored request, as api_tasks uses them: batches written async, read
 * back concatenated by gps_store_job_get_async and by the start-up load;
 * a DB without the table (custom migrations dir) still opens. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "common/gp_util.h"
#include "server/store/store.h"

#include "db_fixture.h"

static gps_store *open_ok(const char *path, struct event_base *base, const gps_store_opts *o)
{
    char err[512] = "";
    gps_store *s = gps_store_open(path, base, o, err, sizeof(err));
    if (!s)
        fprintf(stderr, "open failed: %s\n", err);
    assert_non_null(s);
    return s;
}

static void add_job(gps_store *s, const char *id)
{
    json_t *req = json_pack("{s:s,s:s,s:i,s:i,s:f}", "model", "m1", "prompt", "hi", "max_tokens",
                            4, "seed", 7, "temperature", 0.5);
    gps_store_job_row r = {.id = id, .api = "native", .kind = "completion", .model = "m1",
                           .status = "queued", .has_seed = true, .seed = 7,
                           .created_at = gp_now_wall_ms(), .request = req};
    assert_int_equal(gps_store_job_insert(s, r), 0);
    json_decref(req);
}

/* Events first..last as {seq, type:"token", data:{text:"tN"}}. */
static json_t *batch(int first, int last)
{
    json_t *a = json_array();
    for (int i = first; i <= last; i++) {
        char tx[16];
        snprintf(tx, sizeof tx, "t%d", i);
        json_array_append_new(a, json_pack("{s:i,s:s,s:{s:s}}", "seq", i, "type", "token",
                                           "data", "text", tx));
    }
    return a;
}

typedef struct got {
    int calls;
    int status;
    json_t *events;   /* copy */
    json_t *request;  /* copy */
} got;

static void got_cb(void *arg, int status, const gps_store_job_info *j)
{
    got *g = arg;
    g->calls++;
    g->status = status;
    if (j && j->events)
        g->events = json_deep_copy(j->events);
    if (j && j->request)
        g->request = json_deep_copy(j->request);
}

static void loop_until(struct event_base *base, const int *flag)
{
    struct timeval tv = {0, 10000};
    for (int i = 0; i < 2000 && !*flag; i++) {
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
}

static int count_unfinished(void *arg, const gps_store_job_info *j)
{
    got *g = arg;
    g->calls++;
    if (strcmp(j->id, "job_a") != 0)
        return 0; /* job_b: no log */
    g->events = j->events ? json_deep_copy(j->events) : NULL;
    g->request = j->request ? json_deep_copy(j->request) : NULL;
    return 0;
}

static void test_batches_read_back_in_order(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    gps_store *s = open_ok(t->db, base, NULL);
    assert_true(gps_store_schema_version() >= 2);
    add_job(s, "job_a");
    json_t *b1 = batch(1, 3), *b2 = batch(4, 4), *b3 = batch(5, 9);
    assert_int_equal(gps_store_job_events(s, "job_a", b1), 0);
    assert_int_equal(gps_store_job_events(s, "job_a", b2), 0);
    assert_int_equal(gps_store_job_events(s, "job_a", b3), 0);
    json_t *empty = json_array();
    assert_int_equal(gps_store_job_events(s, "job_a", empty), -1); /* nothing to store */
    /* The request as add_job inserted it. */
    json_t *req = json_pack("{s:s,s:s,s:i,s:i,s:f}", "model", "m1", "prompt", "hi", "max_tokens",
                            4, "seed", 7, "temperature", 0.5);

    got g = {0};
    assert_int_equal(gps_store_job_get_async(s, "job_a", got_cb, &g), 0);
    loop_until(base, &g.calls);
    assert_int_equal(g.status, 0);
    assert_non_null(g.events);
    assert_int_equal(json_array_size(g.events), 9);
    for (size_t i = 0; i < 9; i++)
        assert_int_equal(json_integer_value(json_object_get(json_array_get(g.events, i), "seq")),
                         (json_int_t)i + 1);
    json_t *want = json_array();
    json_array_extend(want, b1);
    json_array_extend(want, b2);
    json_array_extend(want, b3);
    assert_true(json_equal(g.events, want));
    assert_true(json_equal(g.request, req));

    /* A job without events: NULL, not an empty array. */
    add_job(s, "job_b");
    got g2 = {0};
    assert_int_equal(gps_store_job_get_async(s, "job_b", got_cb, &g2), 0);
    loop_until(base, &g2.calls);
    assert_int_equal(g2.status, 0);
    assert_null(g2.events);
    gps_store_close(s);

    /* The start-up load hands the same log over. */
    s = open_ok(t->db, NULL, NULL);
    got g3 = {0};
    char err[256] = "";
    assert_int_equal(gps_store_load_unfinished_jobs(s, count_unfinished, &g3, err, sizeof err), 0);
    assert_int_equal(g3.calls, 2);
    assert_true(json_equal(g3.events, want));
    gps_store_close(s);

    json_decref(want);
    json_decref(b1);
    json_decref(b2);
    json_decref(b3);
    json_decref(empty);
    json_decref(req);
    json_decref(g.events);
    json_decref(g.request);
    json_decref(g2.request);
    json_decref(g3.events);
    json_decref(g3.request);
    event_base_free(base);
}

/* A corrupt batch ends the log there: replay must never skip a seq. */
static void test_corrupt_batch_ends_the_log(void **state)
{
    tctx *t = *state;
    fixture_needs_file(t); /* corrupts a row through sqlite3 */
    struct event_base *base = event_base_new();
    gps_store *s = open_ok(t->db, base, NULL);
    add_job(s, "job_c");
    json_t *b1 = batch(1, 2), *b3 = batch(4, 5);
    assert_int_equal(gps_store_job_events(s, "job_c", b1), 0);
    assert_int_equal(gps_store_flush(s), 0);
    gps_store_close(s);
    bool cli = false;
    {
        /* Out of band: a row that is not a JSON array, between two good ones. */
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "sqlite3 '%s' \"INSERT INTO job_events VALUES ('job_c', 3, 3, 'not json', 0)\" "
                 ">/dev/null 2>&1",
                 t->db);
        cli = system(cmd) == 0;
        if (!cli) {
            /* No sqlite3 CLI: write it through the store's own op with a
             * non-array value instead. */
            s = open_ok(t->db, base, NULL);
            json_t *bad = json_pack("[{s:i}]", "seq", 3);
            assert_int_equal(gps_store_job_events(s, "job_c", bad), 0);
            json_decref(bad);
            gps_store_close(s);
        }
    }
    s = open_ok(t->db, base, NULL);
    assert_int_equal(gps_store_job_events(s, "job_c", b3), 0);
    got g = {0};
    assert_int_equal(gps_store_job_get_async(s, "job_c", got_cb, &g), 0);
    loop_until(base, &g.calls);
    assert_int_equal(g.status, 0);
    /* Batches 1-2 always; the bad row either stops the log (not JSON) or
     * comes through as stored (the fallback): never batch 4-5 past it
     * without it. */
    assert_int_equal(json_array_size(g.events), cli ? 2 : 5);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(g.events, 1), "seq")), 2);
    gps_store_close(s);
    json_decref(b1);
    json_decref(b3);
    json_decref(g.events);
    json_decref(g.request);
    event_base_free(base);
}

/* Durability notification (issue 10 item 6): after a job_events write is
 * committed, the listener runs on the loop with done_seq >= the write's
 * seq and failed false; a write that fails (no table) says failed. */
typedef struct commits {
    int calls;
    uint64_t done;
    bool failed;
} commits;

static void commit_cb(void *arg, uint64_t done_seq, bool failed)
{
    commits *c = arg;
    c->calls++;
    assert_true(done_seq >= c->done); /* only grows */
    c->done = done_seq;
    c->failed |= failed;
}

static void wait_done(struct event_base *base, commits *c, uint64_t seq)
{
    struct timeval tv = {0, 10000};
    for (int i = 0; i < 2000 && c->done < seq; i++) {
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
}

static void test_commit_notification(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    gps_store *s = open_ok(t->db, base, NULL);
    commits c = {0};
    gps_store_set_commit_cb(s, commit_cb, &c);
    add_job(s, "job_n");
    json_t *b1 = batch(1, 2), *b2 = batch(3, 5);
    uint64_t q1 = 0, q2 = 0;
    assert_int_equal(gps_store_job_events_seq(s, "job_n", b1, &q1), 0);
    assert_int_equal(gps_store_job_events_seq(s, "job_n", b2, &q2), 0);
    assert_true(q1 > 0 && q2 > q1);
    wait_done(base, &c, q2);
    assert_true(c.calls >= 1);
    assert_true(c.done >= q2);
    assert_false(c.failed);
    /* Committed when told: a reader sees both batches. */
    got g = {0};
    assert_int_equal(gps_store_job_get_async(s, "job_n", got_cb, &g), 0);
    loop_until(base, &g.calls);
    assert_int_equal(json_array_size(g.events), 5);
    /* Writing a batch again (a retry after a failure) replaces its row. */
    uint64_t q3 = 0;
    assert_int_equal(gps_store_job_events_seq(s, "job_n", b2, &q3), 0);
    wait_done(base, &c, q3);
    got g2 = {0};
    assert_int_equal(gps_store_job_get_async(s, "job_n", got_cb, &g2), 0);
    loop_until(base, &g2.calls);
    assert_true(json_equal(g.events, g2.events));
    /* No listener: nothing is called. */
    gps_store_set_commit_cb(s, NULL, NULL);
    int before = c.calls;
    uint64_t q4 = 0;
    json_t *b3 = batch(6, 6);
    assert_int_equal(gps_store_job_events_seq(s, "job_n", b3, &q4), 0);
    assert_int_equal(gps_store_flush(s), 0);
    struct timeval tv = {0, 50000};
    event_base_loopexit(base, &tv);
    event_base_dispatch(base);
    assert_int_equal(c.calls, before);
    gps_store_close(s);
    json_decref(b1);
    json_decref(b2);
    json_decref(b3);
    json_decref(g.events);
    json_decref(g.request);
    json_decref(g2.events);
    json_decref(g2.request);
    event_base_free(base);
}

/* A DB migrated by a custom set without job_events opens; the event ops
 * fail (logged) and reads have no log. */
static void test_without_the_table(void **state)
{
    tctx *t = *state;
    char mdir[128], p[256];
    snprintf(mdir, sizeof mdir, "%s/mig", t->dir);
    assert_int_equal(mkdir(mdir, 0755), 0);
    size_t len;
    char *init = gp_read_file(GP_SOURCE_DIR "/migrations/0001_init.sql", &len, 1 << 20);
    assert_non_null(init);
    snprintf(p, sizeof p, "%s/0001_init.sql", mdir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(init, f);
    fclose(f);
    free(init);
    struct event_base *base = event_base_new();
    gps_store_opts o = {.migrations_dir = mdir};
    gps_store *s = open_ok(t->db, base, &o);
    commits c = {0};
    gps_store_set_commit_cb(s, commit_cb, &c);
    add_job(s, "job_d");
    json_t *b = batch(1, 2);
    uint64_t q = 0;
    assert_int_equal(gps_store_job_events_seq(s, "job_d", b, &q), 0); /* fails in SQLite */
    wait_done(base, &c, q);
    assert_true(c.failed); /* the listener is told: the rows are missing */
    got g = {0};
    assert_int_equal(gps_store_job_get_async(s, "job_d", got_cb, &g), 0);
    loop_until(base, &g.calls);
    assert_int_equal(g.status, 0);
    assert_null(g.events);
    gps_store_stats st;
    gps_store_get_stats(s, &st);
    assert_true(st.ops_failed >= 1);
    gps_store_close(s);
    json_decref(b);
    json_decref(g.request);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_batches_read_back_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_batch_ends_the_log, setup, teardown),
        cmocka_unit_test_setup_teardown(test_without_the_table, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_notification, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
