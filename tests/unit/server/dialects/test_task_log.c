/* task_log: a native task's event log. Coalesced token runs give every
 * event back exactly as recorded (id, text, hidden ids); other events keep
 * their hidden members; a stored log read back is the same log. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/dialects/task_log.h"

#include "../fixture_oom.h"

static char *dump(const json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    assert_non_null(s);
    return s;
}

static void expect_event(const gps_tlog *l, size_t i, const char *want)
{
    json_t *ev = gps_tlog_get(l, i);
    assert_non_null(ev);
    char *got = dump(ev);
    assert_string_equal(got, want);
    free(got);
    json_decref(ev);
}

/* queued, started (hidden digest), 3 tokens, metrics, 2 tokens, end. */
static gps_tlog *sample(void)
{
    gps_tlog *l = gps_tlog_new();
    assert_non_null(l);
    assert_int_equal(gps_tlog_append(l, "queued", json_pack("{s:i}", "position", 0), NULL), 0);
    assert_int_equal(gps_tlog_append(l, "started", json_pack("{s:s}", "agent_id", "a1"),
                                     json_pack("{s:s}", "digest", "d0")),
                     0);
    int32_t two[2] = {5, 6}, one = 7;
    assert_int_equal(gps_tlog_append_token(l, "He", 2, two, 2), 0);
    assert_int_equal(gps_tlog_append_token(l, "llo", 3, &one, 1), 0);
    assert_int_equal(gps_tlog_append_token(l, "", 0, NULL, 0), 0);
    assert_int_equal(gps_tlog_append(l, "metrics", json_pack("{s:i}", "prompt_tokens", 3),
                                     NULL),
                     0);
    assert_int_equal(gps_tlog_append_token(l, " w\xc3\xa9", 4, &one, 1), 0);
    assert_int_equal(gps_tlog_append_token(l, "\"q\"\n", 4, NULL, 0), 0);
    assert_int_equal(gps_tlog_append(l, "end", json_pack("{s:s}", "text", "x"), NULL), 0);
    return l;
}

static const char *const WANT[] = {
    "{\"data\":{\"position\":0},\"seq\":1,\"type\":\"queued\"}",
    "{\"data\":{\"agent_id\":\"a1\"},\"digest\":\"d0\",\"seq\":2,\"type\":\"started\"}",
    "{\"data\":{\"text\":\"He\"},\"ids\":[5,6],\"seq\":3,\"type\":\"token\"}",
    "{\"data\":{\"text\":\"llo\"},\"ids\":[7],\"seq\":4,\"type\":\"token\"}",
    "{\"data\":{\"text\":\"\"},\"seq\":5,\"type\":\"token\"}",
    "{\"data\":{\"prompt_tokens\":3},\"seq\":6,\"type\":\"metrics\"}",
    "{\"data\":{\"text\":\" w\xc3\xa9\"},\"ids\":[7],\"seq\":7,\"type\":\"token\"}",
    "{\"data\":{\"text\":\"\\\"q\\\"\\n\"},\"seq\":8,\"type\":\"token\"}",
    "{\"data\":{\"text\":\"x\"},\"seq\":9,\"type\":\"end\"}",
};

static void check(const gps_tlog *l)
{
    assert_int_equal(gps_tlog_count(l), 9);
    for (size_t i = 0; i < 9; i++)
        expect_event(l, i, WANT[i]);
    assert_null(gps_tlog_get(l, 9));
    assert_string_equal(gps_tlog_type(l, 3), "token");
    assert_string_equal(gps_tlog_type(l, 5), "metrics");
    assert_null(gps_tlog_type(l, 9));
}

static void test_events_come_back_as_recorded(void **state)
{
    (void)state;
    gps_tlog *l = sample();
    check(l);
    gps_tlog_free(l);
}

static void test_stored_log_reads_back_the_same(void **state)
{
    (void)state;
    gps_tlog *l = sample();
    gps_tlog *r = gps_tlog_new();
    for (size_t i = 0; i < gps_tlog_count(l); i++) {
        json_t *ev = gps_tlog_get(l, i);
        /* through text, as the store keeps it */
        char *s = dump(ev);
        json_t *back = json_loads(s, 0, NULL);
        assert_int_equal(gps_tlog_append_stored(r, back), 0);
        json_decref(back);
        free(s);
        json_decref(ev);
    }
    check(r);
    gps_tlog_free(r);
    gps_tlog_free(l);
}

static void test_a_run_costs_bytes_not_objects(void **state)
{
    (void)state;
    gps_tlog *l = gps_tlog_new();
    assert_int_equal(gps_tlog_append(l, "started", NULL, NULL), 0);
    size_t before = gps_tlog_bytes(l);
    for (int i = 0; i < 100000; i++) {
        int32_t id = i;
        assert_int_equal(gps_tlog_append_token(l, "x", 1, &id, 1), 0);
    }
    /* text 1 B + offsets 8 B + id 4 B per token, doubled at most */
    assert_true(gps_tlog_bytes(l) - before < 100000 * 13 * 2);
    expect_event(l, 54321, "{\"data\":{\"text\":\"x\"},\"ids\":[54320],\"seq\":54322,"
                           "\"type\":\"token\"}");
    gps_tlog_free(l);
}

/* How far a stream is behind, in bytes of text (stream.h): token texts
 * across runs and partial runs, and an end event's text. */
static void test_text_bytes_behind(void **state)
{
    (void)state;
    gps_tlog *l = sample();
    assert_int_equal(gps_tlog_text_bytes(l, 0, 9), 14);
    assert_int_equal(gps_tlog_text_bytes(l, 3, 8), 11); /* "llo", "", " w\xc3\xa9", "\"q\"\n" */
    assert_int_equal(gps_tlog_text_bytes(l, 3, 4), 3);
    assert_int_equal(gps_tlog_text_bytes(l, 7, 100), 5);
    assert_int_equal(gps_tlog_text_bytes(l, 9, 9), 0);
    assert_int_equal(gps_tlog_text_bytes(l, 5, 2), 0);
    assert_int_equal(gps_tlog_text_bytes(NULL, 0, 9), 0);
    gps_tlog_free(l);
}

/* An event is recorded whole or not at all: under a failing allocator an
 * append that says 0 has its hidden members (what a restart resumes from)
 * as well as its data. */
static void test_append_whole_or_nothing(void **state)
{
    (void)state;
    json_t *want = J("{\"seq\":1,\"type\":\"started\",\"data\":{\"agent_id\":\"a1\"},"
                     "\"digest\":\"d0\",\"n_sampled\":4}");
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        gps_tlog *l = gps_tlog_new();
        assert_non_null(l);
        json_t *data = J("{\"agent_id\":\"a1\"}"), *hidden = J("{\"digest\":\"d0\",\"n_sampled\":4}");
        arm(n);
        int rc = gps_tlog_append(l, "started", data, hidden);
        bool hit = disarm();
        json_t *got = rc == 0 ? gps_tlog_get(l, 0) : NULL;
        if (rc == 0 && !json_equal(got, want)) {
            print_message("run %zu: an event recorded with a part missing\n", n);
            print_diff("event", got, want);
            bad++;
        }
        if (rc != 0 && gps_tlog_count(l) != 0)
            bad++;
        json_decref(got);
        gps_tlog_free(l);
        if (!hit)
            break;
    }
    json_decref(want);
    assert_true(n > 2);
    assert_int_equal(bad, 0);
}

/* The reserved terminal event (gps_tlog_append_oom) goes in without an
 * allocation, whatever the log holds (its entry slot kept free across
 * the growth of the entries), numbered after the rest, once. */
static void test_reserved_end_allocates_nothing(void **state)
{
    (void)state;
    for (int k = 0; k < 40; k++) {
        gps_tlog *l = gps_tlog_new();
        assert_non_null(l);
        for (int i = 0; i < k; i++) {
            if (i % 3 == 2) /* a run broken by another event: a new entry each time */
                assert_int_equal(gps_tlog_append(l, "metrics", json_pack("{s:i}", "i", i), NULL),
                                 0);
            else
                assert_int_equal(gps_tlog_append_token(l, "ab", 2, NULL, 0), 0);
        }
        arm_libc(1);
        int rc = gps_tlog_append_oom(l);
        bool hit = disarm();
        assert_int_equal(rc, 0);
        assert_false(hit); /* no allocation was made */
        assert_int_equal(gps_tlog_count(l), (size_t)k + 1);
        char want[128];
        snprintf(want, sizeof want,
                 "{\"data\":{\"code\":\"INTERNAL\",\"message\":\"out of memory\"},"
                 "\"seq\":%d,\"type\":\"error\"}",
                 k + 1);
        expect_event(l, (size_t)k, want);
        assert_int_equal(gps_tlog_append_oom(l), -1); /* once */
        gps_tlog_free(l);
    }
}

/* Under a failing allocator a stored event is recorded as it was stored
 * or not at all (never with {} for its data), and a token event is read
 * back whole or not at all (never with an id left out). */
static void test_stored_and_read_whole_or_nothing(void **state)
{
    (void)state;
    json_t *stored = J("{\"seq\":1,\"type\":\"started\",\"data\":{\"agent_id\":\"a1\","
                       "\"attempt\":1},\"digest\":\"d0\"}");
    json_t *tok = J("{\"seq\":2,\"type\":\"token\",\"data\":{\"text\":\"ab\"},"
                    "\"ids\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]}");
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        gps_tlog *l = gps_tlog_new();
        assert_non_null(l);
        arm_libc(n);
        int rc = gps_tlog_append_stored(l, stored);
        bool hit = disarm();
        json_t *got = rc == 0 ? gps_tlog_get(l, 0) : NULL;
        if (rc == 0 ? !json_equal(got, stored) : gps_tlog_count(l) != 0) {
            print_message("run %zu: a stored event recorded other than stored\n", n);
            if (got)
                print_diff("event", got, stored);
            bad++;
        }
        json_decref(got);
        gps_tlog_free(l);
        if (!hit)
            break;
    }
    gps_tlog *l = gps_tlog_new();
    assert_non_null(l);
    assert_int_equal(gps_tlog_append_stored(l, stored), 0);
    assert_int_equal(gps_tlog_append_stored(l, tok), 0);
    size_t m;
    for (m = 1;; m++) {
        arm_libc(m);
        json_t *got = gps_tlog_get(l, 1);
        bool hit = disarm();
        if (got && !json_equal(got, tok)) {
            print_message("run %zu: a token event read with a part missing\n", m);
            print_diff("event", got, tok);
            bad++;
        }
        json_decref(got);
        if (!hit)
            break;
    }
    gps_tlog_free(l);
    json_decref(stored);
    json_decref(tok);
    assert_true(n > 3 && m > 20);
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events_come_back_as_recorded),
        cmocka_unit_test(test_stored_log_reads_back_the_same),
        cmocka_unit_test(test_append_whole_or_nothing),
        cmocka_unit_test(test_a_run_costs_bytes_not_objects),
        cmocka_unit_test(test_text_bytes_behind),
        cmocka_unit_test(test_reserved_end_allocates_nothing),
        cmocka_unit_test(test_stored_and_read_whole_or_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
