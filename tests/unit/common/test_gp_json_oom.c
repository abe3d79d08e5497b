/* gp_json's checked load under allocation failure: for N = 1, 2, ... the
 * N-th allocation fails (libc's malloc, calloc and realloc, beneath the
 * counting allocator that gp_json_init gives jansson: fixture_oom.h's
 * arm_beneath, through the linker's --wrap), and every load either gives
 * exactly the tree of the unhurt load or says out of memory
 * (json_error_out_of_memory). Never a tree with another value, never a
 * syntax error for a valid text, never a NULL without a reason.
 *
 * jansson 2.14's json_loadb alone breaks that rule: it words most of its
 * allocation failures as "invalid token", and where a long string's token
 * buffer cannot grow it drops a byte and succeeds ("home_address_for_mail"
 * read as "home_address_fr_mail"). test_plain_json_loadb_breaks_the_rule
 * runs the same sweep on it, to show that the sweep sees what it is for. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/gp_json.h"

#define GPS_FIXTURE_OOM_LIBC
#include "../server/fixture_oom.h"

/* Strings and keys longer than jansson's first 16-byte token buffer (it
 * grows them while reading: where the byte went missing), escapes and a
 * \u escape (gp_json_read declines it: gp_json_loadb's fallback runs),
 * numbers, nesting, every literal. */
static const char TEXT[] =
    "{\"name\":\"home_address_for_mail\","
    "\"a_key_longer_than_sixteen_bytes\":\"Once upon a time there was a string that "
    "went on and on, well past any small buffer a lexer starts with.\","
    "\"escaped\":\"tab\\there, quote \\\" and a backslash \\\\ in a long string\","
    "\"unicode\":\"caf\\u00e9 au lait, and then some more text\","
    "\"nested\":{\"list\":[1,-2,3.5,1e10,true,false,null,\"seventeen bytes!!\"],"
    "\"deeper\":{\"another_quite_long_key\":[\"x\",\"yy\",\"a string of thirty-two bytes..\"]}},"
    "\"n\":12345678901234}";

/* A load as the sweep calls it. */
typedef json_t *(*loader)(const char *p, size_t n, json_error_t *err);

static json_t *load_checked(const char *p, size_t n, json_error_t *err)
{
    return gp_json_load_checked(p, n, JSON_REJECT_DUPLICATES, err);
}

static json_t *load_fast_then_checked(const char *p, size_t n, json_error_t *err)
{
    return gp_json_loadb(p, n, err);
}

static json_t *load_plain(const char *p, size_t n, json_error_t *err)
{
    return json_loadb(p, n, JSON_REJECT_DUPLICATES, err);
}

static bool same_dump(const json_t *a, const json_t *b)
{
    size_t flags = JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17);
    char *x = json_dumps(a, flags), *y = json_dumps(b, flags);
    bool same = x && y && strcmp(x, y) == 0;
    free(x);
    free(y);
    return same;
}

/* Runs load over text for N = 1, 2, ... until a run ends without reaching
 * the failure. valid: the text is JSON (ref its unhurt tree), else the
 * unhurt error is ref_err. Returns the runs that broke the rule (each
 * printed); *runs: how many were swept. */
static int sweep(const char *what, loader load, const char *text, size_t *runs)
{
    size_t len = strlen(text);
    json_error_t ref_err;
    json_t *ref = load(text, len, &ref_err);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        json_error_t err;
        memset(&err, 0, sizeof err);
        arm_beneath(n);
        json_t *got = load(text, len, &err);
        bool hit = disarm();
        bool oom = !got && json_error_code(&err) == json_error_out_of_memory &&
                   strcmp(err.text, "out of memory") == 0;
        if (got && !(ref && json_equal(got, ref) && same_dump(got, ref))) {
            char *d = json_dumps(got, JSON_COMPACT | JSON_ENCODE_ANY);
            print_message("%s: allocation %zu failed, the load gave another tree: %.200s\n",
                          what, n, d ? d : "(not dumped)");
            free(d);
            bad++;
        } else if (!got && !oom && (ref || strcmp(err.text, ref_err.text) != 0)) {
            print_message("%s: allocation %zu failed, the load said \"%s\" (code %d), not "
                          "out of memory\n",
                          what, n, err.text, (int)json_error_code(&err));
            bad++;
        }
        json_decref(got);
        if (!hit)
            break;
    }
    json_decref(ref);
    *runs = n - 1;
    print_message("%s: %zu allocations swept, %d broke the rule\n", what, n - 1, bad);
    return bad;
}

static void test_checked_load(void **st)
{
    (void)st;
    size_t runs;
    assert_int_equal(sweep("checked load", load_checked, TEXT, &runs), 0);
    assert_true(runs > 10); /* the failures did reach jansson */
}

static void test_loadb_fallback(void **st)
{
    (void)st;
    size_t runs;
    assert_int_equal(sweep("gp_json_loadb", load_fast_then_checked, TEXT, &runs), 0);
    assert_true(runs > 10);
}

/* Text that is not JSON: the unhurt load's own syntax error, or out of
 * memory; never a tree. */
static void test_invalid_text(void **st)
{
    (void)st;
    static const char BAD[] = "{\"a_key_longer_than_sixteen_bytes\":\"a long string value\","
                              "\"b\":[1,2,}";
    size_t runs;
    assert_int_equal(sweep("invalid text", load_checked, BAD, &runs), 0);
    json_error_t err;
    assert_null(gp_json_load_checked(BAD, strlen(BAD), 0, &err));
    assert_int_not_equal(json_error_code(&err), json_error_out_of_memory);
    /* err may be NULL */
    assert_null(gp_json_load_checked(BAD, strlen(BAD), 0, NULL));
    json_t *j = gp_json_load_checked(TEXT, strlen(TEXT), 0, NULL);
    assert_non_null(j);
    json_decref(j);
}

/* The same sweep over jansson's json_loadb alone finds runs that break
 * the rule (jansson 2.14: the syntax errors and the dropped byte above),
 * so a clean sweep of the checked load is the wrapper's doing. */
static void test_plain_json_loadb_breaks_the_rule(void **st)
{
    (void)st;
    size_t runs;
    int bad = sweep("plain json_loadb", load_plain, TEXT, &runs);
#if JANSSON_VERSION_HEX <= 0x020e00
    assert_true(bad > 0);
#else
    print_message("jansson %s: plain json_loadb broke the rule %d times\n", JANSSON_VERSION,
                  bad);
#endif
}

int main(void)
{
    /* Before any load: the counting allocator, which arm_beneath fails
     * beneath. */
    gp_json_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checked_load),
        cmocka_unit_test(test_loadb_fallback),
        cmocka_unit_test(test_invalid_text),
        cmocka_unit_test(test_plain_json_loadb_breaks_the_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
