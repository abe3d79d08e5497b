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

/* Finding 10: names from outside are printed escaped, never raw. */
static void test_escape(void **state)
{
    (void)state;
    const struct {
        const char *in;
        size_t n;
        const char *want;
    } cases[] = {
        {"plain name", 10, "plain name"},
        {"\x1b[2J\x1b[31mred", 12, "\\x1B[2J\\x1B[31mred"},
        {"a\nb\tc\x07", 6, "a\\x0Ab\\x09c\\x07"},
        {"del\x7f", 4, "del\\x7F"},
        {"c1\xc2\x9b" "1m", 6, "c1\\xC2\\x9B1m"},        /* U+009B CSI */
        {"bad\xff\xc3", 5, "bad\\xFF\\xC3"},           /* invalid, truncated */
        {"\xc0\xaf", 2, "\\xC0\\xAF"},                  /* overlong "/" */
        {"\xed\xa0\x80", 3, "\\xED\\xA0\\x80"},        /* surrogate */
        {"caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x99\x82", 14, "caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x99\x82"},
        {"nul\0x", 5, "nul\\x00x"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *e = ctl_fmt_escape(cases[i].in, cases[i].n);
        assert_non_null(e);
        assert_string_equal(e, cases[i].want);
        free(e);
    }
    json_t *j = json_pack("{s:[s,{s:s}],s:i}", "agents", "m\x1b]0;t\x07", "name", "ok",
                          "n\x1bk", 3);
    assert_int_equal(ctl_fmt_sanitize_json(j), 0);
    char *d = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(d, "{\"agents\":[\"m\\\\x1B]0;t\\\\x07\",{\"name\":\"ok\"}],"
                           "\"n\\\\x1Bk\":3}");
    free(d);
    json_decref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_duration), cmocka_unit_test(test_ago),
        cmocka_unit_test(test_iso),      cmocka_unit_test(test_table),
        cmocka_unit_test(test_table_empty), cmocka_unit_test(test_escape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
