/*
 * Unit tests for src/ctl/ctl_fmt.c: durations (units, bounds, junk),
 * relative and ISO times, and table alignment (UTF-8 widths, no trailing
 * spaces, NULL cells).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "ctl/ctl_fmt.h"

static void test_duration(void **state)
{
    (void)state;
    assert_int_equal(ctl_duration_parse("3600s"), 3600);
    assert_int_equal(ctl_duration_parse("3600"), 3600);
    assert_int_equal(ctl_duration_parse("15m"), 900);
    assert_int_equal(ctl_duration_parse("12h"), 43200);
    assert_int_equal(ctl_duration_parse("30d"), 30 * 86400);
    assert_int_equal(ctl_duration_parse("2w"), 14 * 86400);
    assert_int_equal(ctl_duration_parse("0"), 0);
    const char *bad[] = {"", "d", "-5s", "5x", "5dd", "5 d", " 5", "1.5h", "99999999999d",
                         "999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(ctl_duration_parse(bad[i]), -1);
    assert_int_equal(ctl_duration_parse(NULL), -1);
}

static void test_ago(void **state)
{
    (void)state;
    char b[32];
    int64_t now = 1700000000000LL;
    assert_string_equal(ctl_fmt_ago(0, now, b, sizeof b), "never");
    assert_string_equal(ctl_fmt_ago(now - 5000, now, b, sizeof b), "5s ago");
    assert_string_equal(ctl_fmt_ago(now - 3 * 60000 - 10, now, b, sizeof b), "3m ago");
    assert_string_equal(ctl_fmt_ago(now - 2 * 3600000LL, now, b, sizeof b), "2h ago");
    assert_string_equal(ctl_fmt_ago(now - 4 * 86400000LL, now, b, sizeof b), "4d ago");
    assert_string_equal(ctl_fmt_ago(now + 30 * 86400000LL, now, b, sizeof b), "in 30d");
    assert_string_equal(ctl_fmt_ago(now, now, b, sizeof b), "0s ago");
}

static void test_iso(void **state)
{
    (void)state;
    char b[32];
    assert_string_equal(ctl_fmt_iso(0, b, sizeof b), "-");
    assert_string_equal(ctl_fmt_iso(1700000000123LL, b, sizeof b), "2023-11-14T22:13:20Z");
}

static void test_table(void **state)
{
    (void)state;
    const char *h[] = {"ID", "NAME", "STATE"};
    ctl_table *t = ctl_table_new(3, h);
    assert_non_null(t);
    const char *r1[] = {"key_1", "ünïcode", "active"};
    const char *r2[] = {"key_22222", NULL, "revoked"};
    assert_int_equal(ctl_table_add(t, r1), 0);
    assert_int_equal(ctl_table_add(t, r2), 0);
    assert_int_equal(ctl_table_rows(t), 2);
    char *s = ctl_table_render(t);
    assert_non_null(s);
    assert_string_equal(s, "ID         NAME     STATE\n"
                           "key_1      ünïcode  active\n"
                           "key_22222  -        revoked\n");
    free(s);
    ctl_table_free(t);
}

static void test_table_empty(void **state)
{
    (void)state;
    const char *h[] = {"A", "LONGER"};
    ctl_table *t = ctl_table_new(2, h);
    char *s = ctl_table_render(t);
    assert_string_equal(s, "A  LONGER\n");
    free(s);
    ctl_table_free(t);
    assert_null(ctl_table_new(0, h));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_duration), cmocka_unit_test(test_ago),
        cmocka_unit_test(test_iso),      cmocka_unit_test(test_table),
        cmocka_unit_test(test_table_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
