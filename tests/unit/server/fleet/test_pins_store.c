/* pins: what the store holds of the operator's pins (pins.h gps_pins_put,
 * gps_pins_remove, gps_pins_load) on a real SQLite file (db_fixture.h). An
 * admin change the database refuses (a trigger that raises) changes
 * nothing, in memory or in the database; under a failing allocator
 * (fixture_oom.h arm_beneath: linked with --wrap=malloc,calloc,realloc) an
 * accepted change has its row and a refused one has neither row nor pin;
 * a start-up load that fails leaves no pin (the server refuses to start). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/event.h>
#include <sqlite3.h>

#include "common/gp_json.h"
#include "server/fleet/pins.h"
#include "server/store/store.h"
#include "db_fixture.h"
#include "fixture_oom.h"

#define SHA_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define SHA_B "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
/* A creator long enough that copying it allocates on its own. */
#define BY "an-admin-key-id-long-enough-to-be-copied-on-its-own-allocation"

/* The store with an event base: an admin change is answered from the
 * store's callback, which runs on the loop (wait_done). */
static struct event_base *base;

static gps_store *pins_store(const tctx *t)
{
    char err[256] = "";
    gps_store_opts o = {.commit_interval_ms = 2};
    if (!base)
        base = event_base_new();
    assert_non_null(base);
    gps_store *s = gps_store_open(t->db, base, &o, err, sizeof err);
    if (!s)
        fail_msg("open %s: %s", t->db, err);
    return s;
}

/* How an admin change ended (gps_pins_done_fn). */
typedef struct outcome {
    int called, rc;
    gps_pins *p;
} outcome;

static void on_done(void *arg, gps_pins *p, int rc)
{
    outcome *o = arg;
    o->called++;
    o->rc = rc;
    o->p = p;
}

/* rc of the call; when accepted (0), the change's outcome once the store
 * answered. */
static int wait_done(int rc, outcome *o)
{
    if (rc != 0) {
        assert_int_equal(o->called, 0); /* not accepted: done never runs */
        return rc;
    }
    while (!o->called)
        assert_int_equal(event_base_loop(base, EVLOOP_ONCE), 0);
    assert_int_equal(o->called, 1);
    return o->rc;
}

static int put_wait(gps_pins *p, gps_store *s, const char *name, const char *sha)
{
    outcome o = {0};
    return wait_done(gps_pins_put(p, s, name, sha, 7, BY, on_done, &o), &o);
}

static int remove_wait(gps_pins *p, gps_store *s, const char *name)
{
    outcome o = {0};
    return wait_done(gps_pins_remove(p, s, name, on_done, &o), &o);
}

/* What the store holds of one pin (gps_store_load_pins). */
typedef struct row_seen {
    const char *name;
    int found;
    char sha256[65];
    char by[80];
} row_seen;

static int row_of(void *arg, const char *name, const char *sha256, int64_t created_at,
                  const char *created_by)
{
    row_seen *r = arg;
    (void)created_at;
    if (strcmp(name, r->name) != 0)
        return 0;
    r->found++;
    snprintf(r->sha256, sizeof r->sha256, "%s", sha256);
    snprintf(r->by, sizeof r->by, "%s", created_by ? created_by : "");
    return 0;
}

static row_seen stored(gps_store *s, const char *name)
{
    row_seen r = {.name = name};
    char err[256] = "";
    assert_int_equal(gps_store_flush(s), 0);
    assert_int_equal(gps_store_load_pins(s, row_of, &r, err, sizeof err), 0);
    return r;
}

/* The digest name is pinned to in the table and in its list ("" none);
 * the two must agree. */
static const char *in_memory(gps_pins *p, const char *name)
{
    const char *sha = gps_pins_get(p, name);
    json_t *l = gps_pins_list(p);
    assert_non_null(l);
    bool listed = false;
    for (size_t i = 0; i < json_array_size(l); i++)
        if (strcmp(json_string_value(json_object_get(json_array_get(l, i), "name")), name) == 0)
            listed = true;
    assert_int_equal(json_array_size(l), gps_pins_count(p));
    json_decref(l);
    if (listed != (sha != NULL))
        fail_msg("pin %s: in the table %d, listed %d", name, sha != NULL, listed);
    return sha ? sha : "";
}

static void raw_exec(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    char *msg = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000); /* the store's DB thread may hold the write lock */
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK)
        fail_msg("%s: %s", sql, msg);
    sqlite3_close(db);
}

/* A write the database refuses (a trigger that raises, as a constraint, a
 * full disk or a read-only file would): a new pin, a replacement and a
 * removal each answer -1 (the admin API's 500) and nothing changed, in
 * memory or in the DB; the code before answered 0 (200) with the table
 * changed and the DB not (a pin gone at the next restart, a removed one
 * back, a replaced digest reverted). A change the DB took stays, and a
 * second change of a name waits for the first (-4). */
static void test_write_refused_changes_nothing(void **st)
{
    tctx *t = *st;
    fixture_needs_file(t);
    gps_store *s = pins_store(t);
    gps_pins *p = gps_pins_new();
    assert_non_null(p);
    assert_int_equal(put_wait(p, s, "kept", SHA_A), 0);
    raw_exec(t->db, "CREATE TRIGGER no_insert BEFORE INSERT ON model_pins "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;"
                    "CREATE TRIGGER no_update BEFORE UPDATE ON model_pins "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;"
                    "CREATE TRIGGER no_delete BEFORE DELETE ON model_pins "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;");

    assert_int_equal(put_wait(p, s, "lost", SHA_A), -1);
    assert_string_equal(in_memory(p, "lost"), "");
    assert_int_equal(stored(s, "lost").found, 0);

    assert_int_equal(put_wait(p, s, "kept", SHA_B), -1);
    assert_string_equal(in_memory(p, "kept"), SHA_A);
    assert_string_equal(stored(s, "kept").sha256, SHA_A);

    assert_int_equal(remove_wait(p, s, "kept"), -1);
    assert_string_equal(in_memory(p, "kept"), SHA_A);
    assert_int_equal(stored(s, "kept").found, 1);
    assert_int_equal(gps_pins_count(p), 1);

    /* One change of a name at a time; a waiting creation is not a pin. */
    outcome o1 = {0}, o2 = {0}, o3 = {0};
    assert_int_equal(gps_pins_put(p, s, "kept", SHA_B, 8, NULL, on_done, &o1), 0);
    assert_int_equal(gps_pins_remove(p, s, "kept", on_done, &o2), -4);
    assert_int_equal(gps_pins_put(p, s, "new", SHA_B, 8, NULL, on_done, &o3), 0);
    assert_string_equal(in_memory(p, "new"), "");
    assert_int_equal(gps_pins_remove(p, s, "new", on_done, &o2), -4);
    assert_int_equal(wait_done(0, &o1), -1);
    assert_int_equal(wait_done(0, &o3), -1);
    assert_int_equal(o2.called, 0);
    assert_string_equal(in_memory(p, "new"), "");
    assert_int_equal(gps_pins_count(p), 1);

    raw_exec(t->db, "DROP TRIGGER no_insert; DROP TRIGGER no_update; DROP TRIGGER no_delete;");
    assert_int_equal(put_wait(p, s, "kept", SHA_B), 0);
    assert_string_equal(in_memory(p, "kept"), SHA_B);
    assert_int_equal(put_wait(p, s, "made", SHA_A), 0);
    assert_int_equal(put_wait(p, s, "gone", SHA_A), 0);
    assert_int_equal(remove_wait(p, s, "gone"), 0);
    assert_string_equal(in_memory(p, "gone"), "");
    assert_int_equal(remove_wait(p, s, "gone"), 1);
    /* What a restart reads: the changes the DB took, and only those. */
    gps_pins *again = gps_pins_new();
    assert_non_null(again);
    char err[256];
    assert_int_equal(gps_pins_load(again, s, err, sizeof err), 0);
    assert_int_equal(gps_pins_count(again), 2);
    assert_string_equal(in_memory(again, "kept"), SHA_B);
    assert_string_equal(in_memory(again, "made"), SHA_A);
    gps_pins_free(again);

    /* Freed with changes waiting (the server stopping): done still runs
     * once each, at the store's close, and finds the table gone. */
    outcome o4 = {0}, o5 = {0}, o6 = {0};
    assert_int_equal(gps_pins_put(p, s, "kept", SHA_A, 9, NULL, on_done, &o4), 0);
    assert_int_equal(gps_pins_put(p, s, "late", SHA_A, 9, NULL, on_done, &o5), 0);
    assert_int_equal(gps_pins_remove(p, s, "made", on_done, &o6), 0);
    gps_pins_free(p);
    gps_store_close(s);
    outcome *all[] = {&o4, &o5, &o6};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(all[i]->called, 1);
        assert_null(all[i]->p);
        assert_int_equal(all[i]->rc, -1);
    }
}

/* A new pin, a replacement and a removal on a failing allocator: 0 with
 * the row and the table both changed, or a refusal with neither; the code
 * before changed the table and answered 200 when the row's write could not
 * be queued (only logged): a pin gone at the next restart. */
static void test_changes_persist_oom(void **st)
{
    tctx *t = *st;
    gps_store *s = pins_store(t);
    gps_pins *p = gps_pins_new();
    assert_non_null(p);
    size_t bad = 0, refused = 0, n;
    char name[32];
    for (n = 1;; n++) {
        snprintf(name, sizeof name, "p%zu", n);
        outcome o = {0};
        arm_beneath(n);
        int rc = gps_pins_put(p, s, name, SHA_A, 7, BY, on_done, &o);
        bool hit = disarm();
        rc = wait_done(rc, &o);
        row_seen r = stored(s, name);
        const char *mem = in_memory(p, name);
        if (rc == 0 && strcmp(mem, SHA_A) == 0 && r.found == 1 &&
            strcmp(r.sha256, SHA_A) == 0 && strcmp(r.by, BY) == 0) {
            /* whole */
        } else if (rc != 0 && !mem[0] && !r.found) {
            refused++;
        } else {
            print_message("run %zu: pin gave %d, in memory '%s', row %d '%s' by '%s'\n", n, rc,
                          mem, r.found, r.sha256, r.by);
            bad++;
        }
        if (!hit)
            break;
    }
    assert_true(n > 3);
    assert_true(refused > 0);
    assert_int_equal(bad, 0);

    /* A replacement: the new digest in memory and in the row, or the old
     * one in both. */
    assert_int_equal(put_wait(p, s, "turns", SHA_A), 0);
    const char *want = SHA_A;
    for (n = 1;; n++) {
        const char *to = strcmp(want, SHA_A) == 0 ? SHA_B : SHA_A;
        outcome o = {0};
        arm_beneath(n);
        int rc = gps_pins_put(p, s, "turns", to, 7, BY, on_done, &o);
        bool hit = disarm();
        rc = wait_done(rc, &o);
        row_seen r = stored(s, "turns");
        const char *mem = in_memory(p, "turns");
        const char *now = rc == 0 ? to : want;
        if (strcmp(mem, now) != 0 || r.found != 1 || strcmp(r.sha256, now) != 0) {
            print_message("run %zu: replace gave %d, in memory '%s', row %d '%s'\n", n, rc,
                          mem, r.found, r.sha256);
            bad++;
        }
        want = strcmp(mem, SHA_A) == 0 ? SHA_A : SHA_B;
        if (!hit)
            break;
    }
    assert_true(n > 3);
    assert_int_equal(bad, 0);

    /* A removal: neither pin nor row, or both as they were. */
    for (n = 1;; n++) {
        outcome o = {0};
        arm_beneath(n);
        int rc = gps_pins_remove(p, s, "turns", on_done, &o);
        bool hit = disarm();
        rc = wait_done(rc, &o);
        row_seen r = stored(s, "turns");
        const char *mem = in_memory(p, "turns");
        if (rc == 0 ? mem[0] || r.found : strcmp(mem, want) != 0 || r.found != 1) {
            print_message("run %zu: removal gave %d, in memory '%s', row %d\n", n, rc, mem,
                          r.found);
            bad++;
        }
        if (rc == 0)
            assert_int_equal(put_wait(p, s, "turns", want), 0);
        if (!hit)
            break;
    }
    assert_true(n > 2);
    assert_int_equal(bad, 0);
    gps_pins_free(p);
    gps_store_close(s);
}

/* The start-up load on a failing allocator: every pin, or -1 saying out of
 * memory with none in the table (the server refuses to start); never a
 * pin skipped as "not a valid pin" for want of memory, or the pins read
 * before the failure kept (the code before, which the server then ran
 * with: an agent served a model whose pin was not read). A row that is not
 * a valid pin is skipped either way. */
static void test_load_oom(void **st)
{
    tctx *t = *st;
    gps_store *s = pins_store(t);
    assert_int_equal(gps_store_pin_set(s, "one", SHA_A, 1, BY), 0);
    assert_int_equal(gps_store_pin_set(s, "two", SHA_B, 2, NULL), 0);
    assert_int_equal(gps_store_pin_set(s, "three", SHA_A, 3, BY), 0);
    assert_int_equal(gps_store_pin_set(s, "bad", "not-a-digest", 4, NULL), 0);
    assert_int_equal(gps_store_flush(s), 0);
    char err[256];
    size_t bad = 0, refused = 0, n;
    for (n = 1;; n++) {
        gps_pins *p = gps_pins_new();
        assert_non_null(p);
        err[0] = '\0';
        arm_beneath(n);
        int rc = gps_pins_load(p, s, err, sizeof err);
        bool hit = disarm();
        if (rc == 0 && gps_pins_count(p) == 3 && strcmp(in_memory(p, "one"), SHA_A) == 0 &&
            strcmp(in_memory(p, "two"), SHA_B) == 0 && strcmp(in_memory(p, "three"), SHA_A) == 0) {
            /* whole */
        } else if (rc == -1 && strstr(err, "out of memory") && gps_pins_count(p) == 0) {
            refused++;
        } else {
            print_message("run %zu: load gave %d (%s) with %zu pin(s)\n", n, rc, err,
                          gps_pins_count(p));
            bad++;
        }
        gps_pins_free(p);
        if (!hit)
            break;
    }
    assert_true(n > 3);
    assert_true(refused > 0);
    assert_int_equal(bad, 0);
    gps_store_close(s);
}

int main(void)
{
    gp_json_init(); /* as the server's main: before arm() swaps jansson's allocator */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_write_refused_changes_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_changes_persist_oom, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_oom, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (base)
        event_base_free(base);
    return rc;
}
