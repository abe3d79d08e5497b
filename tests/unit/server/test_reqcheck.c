/* The validation helpers every dialect shares (reqcheck.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "server/reqcheck.h"

static void test_absent(void **st)
{
    (void)st;
    json_t *n = json_null(), *z = json_integer(0);
    assert_true(gps_absent(NULL));
    assert_true(gps_absent(n));
    assert_false(gps_absent(z));
    json_decref(n);
    json_decref(z);
}

static void test_check_number(void **st)
{
    (void)st;
    char msg[160];
    json_t *b = json_pack("{s:f,s:s,s:i,s:n}", "t", 0.5, "s", "x", "big", 3, "nul");
    double out = -1;
    assert_int_equal(gps_check_number(b, "t", "'t'", 0, 1, &out, msg, sizeof msg), 0);
    assert_true(out == 0.5);
    out = -1; /* absent and null: untouched */
    assert_int_equal(gps_check_number(b, "missing", "'m'", 0, 1, &out, msg, sizeof msg), 0);
    assert_int_equal(gps_check_number(b, "nul", "'n'", 0, 1, &out, msg, sizeof msg), 0);
    assert_true(out == -1);
    assert_int_equal(gps_check_number(b, "s", "'s'", 0, 1, &out, msg, sizeof msg), -1);
    assert_string_equal(msg, "'s' must be a number between 0 and 1");
    /* The name comes as the dialect writes it (Anthropic: "key:"). */
    assert_int_equal(gps_check_number(b, "big", "big:", -2, 2, &out, msg, sizeof msg), -1);
    assert_string_equal(msg, "big: must be a number between -2 and 2 (got 3)");
    /* Bounds are inclusive. */
    assert_int_equal(gps_check_number(b, "big", "'big'", 0, 3, &out, msg, sizeof msg), 0);
    assert_true(out == 3);
    json_decref(b);
}

static void test_priority(void **st)
{
    (void)st;
    gps_job_priority p = GPS_PRIO_INTERACTIVE;
    json_t *batch = json_string("batch"), *inter = json_string("interactive"),
           *bad = json_string("urgent"), *num = json_integer(1);
    assert_int_equal(gps_priority_parse(NULL, &p), 0);
    assert_int_equal(p, GPS_PRIO_INTERACTIVE);
    assert_int_equal(gps_priority_parse(batch, &p), 0);
    assert_int_equal(p, GPS_PRIO_BATCH);
    assert_int_equal(gps_priority_parse(inter, &p), 0);
    assert_int_equal(p, GPS_PRIO_INTERACTIVE);
    assert_int_equal(gps_priority_parse(bad, &p), -1);
    assert_int_equal(gps_priority_parse(num, &p), -1);
    assert_int_equal(p, GPS_PRIO_INTERACTIVE);
    json_decref(batch);
    json_decref(inter);
    json_decref(bad);
    json_decref(num);
}

/* GPS_FAIL: message, param, jump; one parser shape for every dialect. */
static int parse_one(const json_t *v, char *msg, size_t msglen, const char **param)
{
    *param = NULL;
    if (!json_is_integer(v) || json_integer_value(v) > GPS_MAX_TOKENS_LIMIT)
        GPS_FAIL("max_tokens", "'max_tokens' must be at most %d", GPS_MAX_TOKENS_LIMIT);
    return 0;
fail:
    return -1;
}

static void test_fail_macro(void **st)
{
    (void)st;
    char msg[96];
    const char *param;
    json_t *ok = json_integer(GPS_MAX_TOKENS_LIMIT), *big = json_integer(GPS_MAX_TOKENS_LIMIT + 1);
    assert_int_equal(parse_one(ok, msg, sizeof msg, &param), 0);
    assert_null(param);
    assert_int_equal(parse_one(big, msg, sizeof msg, &param), -1);
    assert_string_equal(param, "max_tokens");
    assert_string_equal(msg, "'max_tokens' must be at most 1000000");
    json_decref(ok);
    json_decref(big);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_absent),
        cmocka_unit_test(test_check_number),
        cmocka_unit_test(test_priority),
        cmocka_unit_test(test_fail_macro),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
