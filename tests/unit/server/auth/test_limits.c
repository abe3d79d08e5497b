/*
 * Unit tests for src/server/auth/limits.c: the rpm token bucket, the daily token
 * budget and its UTC rollover, max_concurrent counting, limits changed on
 * a live key, and today's usage surviving a restart through a real SQLite
 * store (key_usage, migration 0003), and one budget shared by two servers
 * on one database (gps_limits_refresh). Times are explicit wall-clock values,
 * so nothing here depends on how fast the machine is.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <sqlite3.h>

#include "server/auth/auth.h"
#include "server/auth/limits.h"
#include "server/store/store.h"

#define DAY_MS 86400000LL
/* 2026-11-23 10:00:00 UTC: a fixed "now" well inside a day. */
#define T0 (20780LL * DAY_MS + 10LL * 3600 * 1000)

#include "db_fixture.h"

/* A memory-only auth with one client key of the given limits. */
static gps_auth *auth_with_key(gps_store *store, gps_key_limits lim, char id[GPS_AUTH_ID_LEN + 1])
{
    gps_auth *a = gps_auth_new(store);
    assert_non_null(a);
    char key[GPS_AUTH_KEY_LEN + 1];
    gps_key_spec spec = {.role = GPS_KEY_CLIENT, .name = "t", .limits = lim};
    assert_int_equal(gps_auth_key_create_spec(a, &spec, key, id), 0);
    return a;
}

static void test_rpm_bucket(void **state)
{
    (void)state;
    char id[GPS_AUTH_ID_LEN + 1];
    gps_auth *a = auth_with_key(NULL, (gps_key_limits){.rpm = 3}, id);
    gps_limits *l = gps_limits_new(a, NULL);
    int retry = -1;
    /* A fresh key has its whole minute at once. */
    for (int i = 0; i < 3; i++)
        assert_int_equal(gps_limits_admit(l, id, T0, 0, &retry), GPS_LIMIT_OK);
    assert_int_equal(gps_limits_admit(l, id, T0, 0, &retry), GPS_LIMIT_RPM);
    /* One request comes back every 20 s. */
    assert_true(retry >= 1 && retry <= 21);
    assert_int_equal(gps_limits_admit(l, id, T0 + 10000, 0, &retry), GPS_LIMIT_RPM);
    assert_true(retry >= 1 && retry <= 11);
    assert_int_equal(gps_limits_admit(l, id, T0 + 20000, 0, &retry), GPS_LIMIT_OK);
    assert_int_equal(gps_limits_admit(l, id, T0 + 20000, 0, &retry), GPS_LIMIT_RPM);
    /* Idle for long: the bucket holds at most rpm. */
    for (int i = 0; i < 3; i++)
        assert_int_equal(gps_limits_admit(l, id, T0 + 3600000, 0, &retry), GPS_LIMIT_OK);
    assert_int_equal(gps_limits_admit(l, id, T0 + 3600000, 0, &retry), GPS_LIMIT_RPM);

    gps_key_usage u;
    gps_limits_get_usage(l, id, T0 + 3600000, &u);
    assert_int_equal(u.requests, 7);
    assert_int_equal(u.rate_limited, 4);
    gps_limits_free(l);
    gps_auth_free(a);
}

static void test_no_key_and_unlimited(void **state)
{
    (void)state;
    char id[GPS_AUTH_ID_LEN + 1];
    gps_auth *a = auth_with_key(NULL, (gps_key_limits){0}, id);
    gps_limits *l = gps_limits_new(a, NULL);
    int retry = -1;
    for (int i = 0; i < 1000; i++) {
        assert_int_equal(gps_limits_admit(l, id, T0, 0, &retry), GPS_LIMIT_OK);
        assert_int_equal(gps_limits_admit(l, "", T0, 0, &retry), GPS_LIMIT_OK);
        assert_int_equal(gps_limits_admit(l, NULL, T0, 0, &retry), GPS_LIMIT_OK);
        /* A key id the auth cache does not know: counted, never limited. */
        assert_int_equal(gps_limits_admit(l, "key_unknown", T0, 0, &retry), GPS_LIMIT_OK);
    }
    assert_int_equal(retry, 0);
    assert_true(gps_limits_may_start(l, id));
    assert_true(gps_limits_may_start(l, NULL));
    gps_limits_free(l);
    gps_auth_free(a);
}

/* Issue 25, finding 4: concurrent requests each reserve their most at
 * admission, so the budget overshoots by one request at most; what a job
 * did not use comes back when it ends. */
static void test_tokens_per_day_reserved_at_admission(void **state)
{
    (void)state;
    char id[GPS_AUTH_ID_LEN + 1];
    gps_auth *a = auth_with_key(NULL, (gps_key_limits){.tokens_per_day = 100}, id);
    gps_limits *l = gps_limits_new(a, NULL);
    int retry = -1;
    int admitted = 0;
    for (int i = 0; i < 30; i++)
        if (gps_limits_admit(l, id, T0, 55, &retry) == GPS_LIMIT_OK)
            admitted++;
    assert_int_equal(admitted, 2); /* 0 + 55 < 100, 55 + 55 >= 100 */
    gps_key_usage u;
    gps_limits_get_usage(l, id, T0, &u);
    assert_int_equal(u.reserved_tokens, 110);
    /* One ends having used 10 of its 55: 45 come back. */
    gps_limits_release(l, id, 55);
    gps_limits_account(l, id, 4, 6, T0);
    assert_int_equal(gps_limits_admit(l, id, T0, 55, &retry), GPS_LIMIT_OK); /* 10 + 55 < 100 */
    assert_int_equal(gps_limits_admit(l, id, T0, 55, &retry), GPS_LIMIT_TOKENS); /* 10 + 110 */
    gps_limits_release(l, id, 110);
    gps_limits_account(l, id, 8, 12, T0);
    gps_limits_get_usage(l, id, T0, &u);
    assert_int_equal(u.reserved_tokens, 0);
    assert_int_equal(u.prompt_tokens + u.completion_tokens, 30);
    assert_int_equal(gps_limits_admit(l, id, T0, 55, &retry), GPS_LIMIT_OK); /* 30 spent */
    /* Releasing more than is held never goes below zero. */
    gps_limits_release(l, id, 1000);
    gps_limits_get_usage(l, id, T0, &u);
    assert_int_equal(u.reserved_tokens, 0);
    gps_limits_free(l);
    gps_auth_free(a);
}

static void test_tokens_per_day_and_rollover(void **state)
{
    (void)state;
    char id[GPS_AUTH_ID_LEN + 1];
    gps_auth *a = auth_with_key(NULL, (gps_key_limits){.tokens_per_day = 100}, id);
    gps_limits *l = gps_limits_new(a, NULL);
    int retry = -1;
    assert_int_equal(gps_limits_admit(l, id, T0, 0, &retry), GPS_LIMIT_OK);
    gps_limits_account(l, id, 60, 39, T0);
    /* 99 of 100 spent: one more request may start (and may overshoot). */
    assert_int_equal(gps_limits_admit(l, id, T0, 0, &retry), GPS_LIMIT_OK);
    gps_limits_account(l, id, 5, 20, T0);
    assert_int_equal(gps_limits_admit(l, id, T0, 0, &retry), GPS_LIMIT_TOKENS);
    /* Until the next UTC midnight: 14 h from 10:00. */
    assert_int_equal(retry, 14 * 3600);
    gps_key_usage u;
    gps_limits_get_usage(l, id, T0, &u);
    assert_int_equal(u.prompt_tokens, 65);
    assert_int_equal(u.completion_tokens, 59);
    assert_int_equal(u.requests, 2);
    assert_int_equal(u.rate_limited, 1);
    /* A new day, a new budget. */
    assert_int_equal(gps_limits_admit(l, id, T0 + 14LL * 3600 * 1000, 0, &retry), GPS_LIMIT_OK);
    gps_limits_get_usage(l, id, T0 + 14LL * 3600 * 1000, &u);
    assert_int_equal(u.prompt_tokens + u.completion_tokens, 0);
    assert_int_equal(u.requests, 1);
    gps_limits_free(l);
    gps_auth_free(a);
}

static void test_max_concurrent(void **state)
{
    (void)state;
    char id[GPS_AUTH_ID_LEN + 1];
    gps_auth *a = auth_with_key(NULL, (gps_key_limits){.max_concurrent = 2}, id);
    gps_limits *l = gps_limits_new(a, NULL);
    assert_true(gps_limits_may_start(l, id));
    gps_limits_started(l, id);
    assert_true(gps_limits_may_start(l, id));
    gps_limits_started(l, id);
    assert_false(gps_limits_may_start(l, id));
    gps_limits_waiting_add(l, id, 1);
    gps_key_usage u;
    gps_limits_get_usage(l, id, T0, &u);
    assert_int_equal(u.running, 2);
    assert_int_equal(u.waiting, 1);
    gps_limits_ended(l, id);
    assert_true(gps_limits_may_start(l, id));
    /* Never below zero, whatever the caller does. */
    gps_limits_ended(l, id);
    gps_limits_ended(l, id);
    gps_limits_waiting_add(l, id, -5);
    gps_limits_get_usage(l, id, T0, &u);
    assert_int_equal(u.running, 0);
    assert_int_equal(u.waiting, 0);
    gps_limits_free(l);
    gps_auth_free(a);
}

static void test_limits_change_on_a_live_key(void **state)
{
    (void)state;
    char id[GPS_AUTH_ID_LEN + 1];
    gps_auth *a = auth_with_key(NULL, (gps_key_limits){0}, id);
    gps_limits *l = gps_limits_new(a, NULL);
    int retry;
    assert_int_equal(gps_limits_admit(l, id, T0, 0, &retry), GPS_LIMIT_OK);
    gps_key_limits lim = {.rpm = 1, .max_concurrent = 1};
    assert_int_equal(gps_auth_key_set_limits(a, id, &lim), 0);
    assert_int_equal(gps_auth_key_find(a, id)->limits.rpm, 1);
    assert_int_equal(gps_limits_admit(l, id, T0 + 1, 0, &retry), GPS_LIMIT_OK);
    assert_int_equal(gps_limits_admit(l, id, T0 + 2, 0, &retry), GPS_LIMIT_RPM);
    gps_limits_started(l, id);
    assert_false(gps_limits_may_start(l, id));
    lim.max_concurrent = 0;
    assert_int_equal(gps_auth_key_set_limits(a, id, &lim), 0);
    assert_true(gps_limits_may_start(l, id));
    assert_int_equal(gps_auth_key_set_limits(a, "key_nope", &lim), 1);
    lim.rpm = -1;
    assert_int_equal(gps_auth_key_set_limits(a, id, &lim), -1);
    gps_limits_free(l);
    gps_auth_free(a);
}

static void test_usage_survives_restart(void **state)
{
    tctx *t = *state;
    char err[512] = "";
    char id[GPS_AUTH_ID_LEN + 1];
    gps_store *s = gps_store_open(t->db, NULL, NULL, err, sizeof err);
    assert_non_null(s);
    gps_auth *a = auth_with_key(s, (gps_key_limits){.rpm = 100, .tokens_per_day = 50}, id);
    gps_limits *l = gps_limits_new(a, s);
    int retry;
    assert_int_equal(gps_limits_admit(l, id, T0 - DAY_MS, 0, &retry), GPS_LIMIT_OK);
    gps_limits_account(l, id, 1000, 1000, T0 - DAY_MS); /* yesterday: not today's budget */
    assert_int_equal(gps_limits_admit(l, id, T0, 0, &retry), GPS_LIMIT_OK);
    assert_int_equal(gps_limits_admit(l, id, T0, 0, &retry), GPS_LIMIT_OK);
    gps_limits_account(l, id, 30, 25, T0);
    assert_int_equal(gps_limits_admit(l, id, T0, 0, &retry), GPS_LIMIT_TOKENS);
    gps_limits_free(l);
    gps_auth_free(a);
    gps_store_close(s); /* flushes the queued writes */

    s = gps_store_open(t->db, NULL, NULL, err, sizeof err);
    assert_non_null(s);
    a = gps_auth_new(s);
    assert_int_equal(gps_auth_load(a, err, sizeof err), 0);
    const gps_auth_key *k = gps_auth_key_find(a, id);
    assert_non_null(k);
    assert_int_equal(k->limits.rpm, 100);
    assert_int_equal(k->limits.tokens_per_day, 50);
    l = gps_limits_new(a, s);
    assert_int_equal(gps_limits_load(l, T0, err, sizeof err), 0);
    gps_key_usage u;
    gps_limits_get_usage(l, id, T0, &u);
    assert_int_equal(u.requests, 2);
    assert_int_equal(u.prompt_tokens, 30);
    assert_int_equal(u.completion_tokens, 25);
    assert_int_equal(u.rate_limited, 1);
    /* The budget stays spent across the restart. */
    assert_int_equal(gps_limits_admit(l, id, T0, 0, &retry), GPS_LIMIT_TOKENS);
    gps_limits_free(l);
    gps_auth_free(a);
    gps_store_close(s);
}

/* Issue 9, finding 1: a key_usage row holding INT64_MAX (saved by a
 * server that trusted an agent's usage) or a negative count is clamped on
 * load, the key's next request is handled without overflow (UBSan), the
 * daily budget still refuses, and further accounting saturates. Before the
 * fix, admit summed prompt + completion = INT64_MAX + 5 (signed overflow). */
static void test_bad_usage_rows_are_clamped(void **state)
{
    tctx *t = *state;
    char err[512] = "";
    char lim_id[GPS_AUTH_ID_LEN + 1], free_id[GPS_AUTH_ID_LEN + 1];
    gps_store *s = gps_store_open(t->db, NULL, NULL, err, sizeof err);
    assert_non_null(s);
    gps_auth *a = auth_with_key(s, (gps_key_limits){.tokens_per_day = 50}, lim_id);
    char key[GPS_AUTH_KEY_LEN + 1];
    gps_key_spec spec = {.role = GPS_KEY_CLIENT, .name = "free"};
    assert_int_equal(gps_auth_key_create_spec(a, &spec, key, free_id), 0);
    gps_auth_free(a);
    gps_store_close(s);

    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(t->db, &db), SQLITE_OK);
    char sql[512];
    snprintf(sql, sizeof sql,
             "INSERT INTO key_usage (key_id, day, requests, prompt_tokens, completion_tokens, "
             "rate_limited) VALUES ('%s', %lld, 1, 9223372036854775807, 5, -3), "
             "('%s', %lld, -1, 9223372036854775807, 9223372036854775807, 0)",
             lim_id, T0 / DAY_MS, free_id, T0 / DAY_MS);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);

    s = gps_store_open(t->db, NULL, NULL, err, sizeof err);
    assert_non_null(s);
    a = gps_auth_new(s);
    assert_int_equal(gps_auth_load(a, err, sizeof err), 0);
    gps_limits *l = gps_limits_new(a, s);
    assert_int_equal(gps_limits_load(l, T0, err, sizeof err), 0);
    gps_key_usage u;
    gps_limits_get_usage(l, lim_id, T0, &u);
    assert_true(u.prompt_tokens > 0 && u.prompt_tokens <= INT64_MAX / 4);
    assert_int_equal(u.completion_tokens, 5);
    assert_int_equal(u.rate_limited, 0);
    int retry;
    assert_int_equal(gps_limits_admit(l, lim_id, T0, 0, &retry), GPS_LIMIT_TOKENS);
    /* The unlimited key is admitted; accounting more saturates. */
    assert_int_equal(gps_limits_admit(l, free_id, T0, 0, &retry), GPS_LIMIT_OK);
    gps_limits_account(l, free_id, INT64_MAX, INT64_MAX, T0);
    gps_limits_get_usage(l, free_id, T0, &u);
    assert_true(u.prompt_tokens > 0 && u.completion_tokens > 0);
    assert_true(u.prompt_tokens <= INT64_MAX / 4 && u.completion_tokens <= INT64_MAX / 4);
    assert_int_equal(u.requests, 1); /* -1 read back as 0, then this request */
    gps_limits_free(l);
    gps_auth_free(a);
    gps_store_close(s); /* flushes the saturating upserts */

    /* What was written back reloads as sane numbers. */
    s = gps_store_open(t->db, NULL, NULL, err, sizeof err);
    assert_non_null(s);
    a = gps_auth_new(s);
    assert_int_equal(gps_auth_load(a, err, sizeof err), 0);
    l = gps_limits_new(a, s);
    assert_int_equal(gps_limits_load(l, T0, err, sizeof err), 0);
    gps_limits_get_usage(l, free_id, T0, &u);
    assert_true(u.prompt_tokens > 0 && u.prompt_tokens <= INT64_MAX / 4);
    assert_int_equal(gps_limits_admit(l, lim_id, T0, 0, &retry), GPS_LIMIT_TOKENS);
    gps_limits_free(l);
    gps_auth_free(a);
    gps_store_close(s);
}

/* ---- one budget across servers (gps_limits_refresh) ---- */

static void on_ping(void *arg, bool ok, const char *msg)
{
    (void)msg;
    *(int *)arg = ok ? 1 : -1;
}

static void test_refresh_shares_the_budget(void **state)
{
    tctx *t = *state;
    char err[512] = "";
    char id[GPS_AUTH_ID_LEN + 1];
    struct event_base *base = event_base_new();
    gps_store *sa = gps_store_open(t->db, base, NULL, err, sizeof err);
    gps_store *sb = gps_store_open(t->db, NULL, NULL, err, sizeof err);
    assert_non_null(sa);
    assert_non_null(sb);
    gps_auth *a = auth_with_key(sa, (gps_key_limits){.tokens_per_day = 50}, id);
    gps_auth *b = gps_auth_new(sb);
    gps_limits *la = gps_limits_new(a, sa);
    gps_limits *lb = gps_limits_new(b, sb);
    int retry;
    /* Server b spends 40 tokens of the key; a spends 10 and sees only those. */
    assert_int_equal(gps_limits_admit(lb, id, T0, 0, &retry), GPS_LIMIT_OK);
    gps_limits_account(lb, id, 30, 10, T0);
    assert_int_equal(gps_store_flush(sb), 0);
    assert_int_equal(gps_limits_admit(la, id, T0, 0, &retry), GPS_LIMIT_OK);
    gps_limits_account(la, id, 5, 5, T0);
    assert_int_equal(gps_limits_admit(la, id, T0, 0, &retry), GPS_LIMIT_OK);
    /* a re-reads; what it adds after queueing the read is kept on top. */
    assert_int_equal(gps_limits_refresh(la, T0), 0);
    gps_limits_account(la, id, 1, 1, T0);
    int done = 0;
    assert_int_equal(gps_store_ping_async(sa, on_ping, &done), 0);
    struct timeval tv = {0, 10000};
    for (int i = 0; i < 3000 && !done; i++) {
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
    assert_int_equal(done, 1);
    gps_key_usage u;
    gps_limits_get_usage(la, id, T0, &u);
    assert_int_equal(u.requests, 3);
    assert_int_equal(u.prompt_tokens, 30 + 5 + 1);
    assert_int_equal(u.completion_tokens, 10 + 5 + 1);
    /* 52 of 50 spent across the two servers: refused on a. */
    assert_int_equal(gps_limits_admit(la, id, T0, 0, &retry), GPS_LIMIT_TOKENS);
    gps_store_close(sa);   /* before the limits: pending reads are delivered */
    gps_store_close(sb);
    gps_limits_free(la);
    gps_limits_free(lb);
    gps_auth_free(a);
    gps_auth_free(b);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rpm_bucket),
        cmocka_unit_test(test_no_key_and_unlimited),
        cmocka_unit_test(test_tokens_per_day_and_rollover),
        cmocka_unit_test(test_max_concurrent),
        cmocka_unit_test(test_limits_change_on_a_live_key),
        cmocka_unit_test(test_tokens_per_day_reserved_at_admission),
        cmocka_unit_test_setup_teardown(test_usage_survives_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_usage_rows_are_clamped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refresh_shares_the_budget, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
