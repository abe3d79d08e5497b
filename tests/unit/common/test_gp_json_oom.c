/* gp_json's checked load under allocation failure: for N = 1, 2, ... the
 * N-th allocation fails (libc's malloc, calloc and realloc, beneath the
 * counting allocator that gp_json_init gives jansson: fixture_oom.h's
 * arm_beneath, through the linker's --wrap; or jansson's allocator alone,
 * swapped past the counter: arm), and every load either gives exactly the
 * tree of the unhurt load or says out of memory (json_error_out_of_memory).
 * Never a tree with another value, never a syntax error for a valid text,
 * never a NULL without a reason, never a crash (the suite runs under ASan
 * too).
 *
 * jansson 2.14's json_loadb alone breaks that rule: it words most of its
 * allocation failures as "invalid token", and where a long string's token
 * buffer cannot grow it drops a byte and succeeds ("home_address_for_mail"
 * read as "home_address_fr_mail"), or, where the byte dropped is a
 * string's closing quote or an escape's letter, reads and writes past its
 * buffer or aborts (test_crash_text: its text kills json_loadb at the 13th
 * allocation). The checked load no longer runs it.
 * test_plain_json_loadb_breaks_the_rule runs the sweep on json_loadb, over
 * a text where it survives, to show that the sweep sees what it is for.
 *
 * The checked dump (gp_json_dumps_checked) the same way: every run gives
 * NULL or exactly the unhurt text, for each of the flags it is for. Plain
 * json_dumps does not: jansson 2.14 ignores a failed append of an object's
 * key, leaves the key out (its opening quote stays, or its closing one goes)
 * and succeeds; test_plain_json_dumps_drops_a_key shows it on the same
 * object. */
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
 * \u escape, numbers, nesting, every literal. */
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

static json_t *load_loadb(const char *p, size_t n, json_error_t *err)
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

static void test_loadb(void **st)
{
    (void)st;
    size_t runs;
    assert_int_equal(sweep("gp_json_loadb", load_loadb, TEXT, &runs), 0);
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

/* ------------------------------------------------------------------ */
/* The reader under failure, text by text, flag by flag                */
/* ------------------------------------------------------------------ */

/* How a sweep fails allocations: beneath the counting allocator (every
 * allocation: jansson's through the counter, the reader's own), or
 * jansson's alone with the counter bypassed (the reader must see each
 * failed constructor itself). */
typedef void (*armer)(size_t n);

static void arm_jansson_only(size_t n)
{
    arm(n);
}

/* gp_json_load_checked(text[0..len), flags) for N = 1, 2, ... until a run
 * ends without reaching the failure: each run the unhurt answer (the same
 * tree; for a text that is not JSON the same refusal) or NULL with out of
 * memory. Returns the runs that broke the rule; *runs: how many. */
static int sweep_text(const char *text, size_t len, size_t flags, armer arm_fn, size_t *runs)
{
    json_error_t ref_err;
    json_t *ref = gp_json_load_checked(text, len, flags, &ref_err);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        json_error_t err;
        memset(&err, 0x55, sizeof err);
        arm_fn(n);
        json_t *got = gp_json_load_checked(text, len, flags, &err);
        bool hit = disarm();
        bool oom = !got && json_error_code(&err) == json_error_out_of_memory &&
                   strcmp(err.text, "out of memory") == 0;
        bool same_refusal = !got && !ref && strcmp(err.text, ref_err.text) == 0 &&
                            json_error_code(&err) == json_error_code(&ref_err) &&
                            err.position == ref_err.position;
        if (got ? !(ref && json_equal(got, ref) && same_dump(got, ref)) : !(oom || same_refusal)) {
            char *d = got ? json_dumps(got, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
            print_message("flags 0x%zx, allocation %zu failed: %s \"%.200s\" for %.120s\n", flags,
                          n, got ? "another tree" : "a refusal", got ? (d ? d : "?") : err.text,
                          text);
            free(d);
            bad++;
        }
        if (!hit && !got && ref)
            fail_msg("no failure, no tree: %s", err.text);
        json_decref(got);
        if (!hit)
            break;
    }
    json_decref(ref);
    *runs = n - 1;
    return bad;
}

/* Both ways of failing, each flag set the pool uses and the rest. */
static int sweep_all(const char *text, size_t len, size_t *total)
{
    static const size_t flag_sets[] = {
        0, JSON_REJECT_DUPLICATES, JSON_DECODE_ANY,
        JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL,
        JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY | JSON_REJECT_DUPLICATES,
    };
    static const armer armers[] = {arm_beneath, arm_jansson_only};
    int bad = 0;
    for (size_t a = 0; a < 2; a++)
        for (size_t f = 0; f < sizeof flag_sets / sizeof flag_sets[0]; f++) {
            size_t runs;
            bad += sweep_text(text, len, flag_sets[f], armers[a], &runs);
            *total += runs;
        }
    return bad;
}

/* The text that kills json_loadb (jansson 2.14, SIGSEGV where its 13th
 * allocation fails: a string token's closing quote lost when the token
 * buffer could not grow): the checked load reads it whole or says out of
 * memory. On the old checked load (json_loadb inside) this test crashes. */
static void test_crash_text(void **st)
{
    (void)st;
    static const char CRASH[] =
        "{\"input_tokens\":1234,\"x_pool_meta\":{\"estimated\":false,\"model\":\"an-inner-model\"}}";
    size_t total = 0;
    assert_int_equal(sweep_all(CRASH, strlen(CRASH), &total), 0);
    assert_true(total > 40);
    assert_int_equal(sweep_all(TEXT, strlen(TEXT), &total), 0);
    print_message("crash text and TEXT: %zu runs swept\n", total);
}

/* Strings and keys whose escapes sit at jansson's token buffer's growth
 * points (16, 32, 64 bytes: where its lexer lost a byte), every kind of
 * escape, a surrogate pair, \u0000 (a value with JSON_ALLOW_NUL), a real
 * longer than the reader's stack copy, duplicate keys with escapes (the
 * key stack), a scalar at the top, and texts that are not JSON. */
static void test_escapes_and_long_tokens(void **st)
{
    (void)st;
    static const char *const escapes[] = {"\\\"", "\\\\", "\\n", "\\u00e9", "\\ud83d\\ude00",
                                          "\\/", "\\u0000"};
    static const size_t lengths[] = {1, 14, 15, 16, 17, 30, 31, 32, 33, 62, 63, 64, 65, 200};
    char text[1024], pad[256];
    size_t total = 0;
    int bad = 0;
    memset(pad, 'x', sizeof pad);
    for (size_t e = 0; e < sizeof escapes / sizeof escapes[0]; e++)
        for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
            int n = snprintf(text, sizeof text,
                             "{\"%.*s%s\":[\"%.*s%s\",\"%s%.*s\"],\"k%s\":1,\"k%s\":{\"%s\":2}}",
                             (int)lengths[l], pad, e == 6 ? "\\n" : escapes[e], (int)lengths[l],
                             pad, escapes[e], escapes[e], (int)lengths[l], pad, escapes[e],
                             escapes[e], e == 6 ? "z" : escapes[e]);
            bad += sweep_all(text, (size_t)n, &total);
            n = snprintf(text, sizeof text, "\"%.*s%s%.*s\"", (int)lengths[l], pad, escapes[e],
                         (int)lengths[l], pad);
            bad += sweep_all(text, (size_t)n, &total);
        }
    static const char *const others[] = {
        "[1.00000000000000000000000000000000000000000000000000000000000000000000000000000001,"
        "-0,1e-400,123456789012345678,\"caf\\u00e9\"]",
        "{\"a\":1,\"a\":{\"b\":[true,false,null],\"b\":\"long enough to be copied twice\"}}",
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"deep\"]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
        "{\"a_key_longer_than_sixteen_bytes\":\"a long string value\",\"b\":[1,2,}",
        "{\"a_key_longer_than_sixteen_bytes\":\"\\ud800 lone\"}",
        "{\"a_key_longer_than_sixteen_bytes\":\"value\",\"a_key_longer_than_sixteen_bytes\":1}",
        "[9223372036854775808,\"a string long enough to need a copy\"]",
        "{\"x\":\"a string long enough to need a copy\", \"y\": 1e400}",
    };
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
        bad += sweep_all(others[i], strlen(others[i]), &total);
    print_message("escapes and long tokens: %zu runs swept, %d broke the rule\n", total, bad);
    assert_int_equal(bad, 0);
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

/* ------------------------------------------------------------------ */
/* Checked dumps                                                       */
/* ------------------------------------------------------------------ */

/* Keys longer than the room left in jansson's output buffer (it starts at
 * 16 bytes and doubles): appending one makes the buffer grow, and jansson
 * 2.14's dump ignores the failure of a key's append (dump.c: dump_string's
 * result unchecked for keys), leaves the key out and goes on. Nested
 * objects, an array, a non-ASCII string (JSON_ENSURE_ASCII's escapes). */
static const char DUMP_TEXT[] =
    "{\"first_key_of_some_length\":1,"
    "\"second_key_somewhat_longer_than_that\":\"value\","
    "\"third_key_that_is_longer_still_than_both\":{\"nested_key_of_some_length_too\":[1,2,3],"
    "\"another_nested_key_with_many_bytes_in_it\":\"caf\\u00e9\"},"
    "\"fourth_key_and_the_last_one_of_the_object\":true}";

static const char *const DUMP_KEYS[] = {
    "first_key_of_some_length", "second_key_somewhat_longer_than_that",
    "third_key_that_is_longer_still_than_both", "nested_key_of_some_length_too",
    "another_nested_key_with_many_bytes_in_it", "fourth_key_and_the_last_one_of_the_object",
};

/* The flags the checked dump is for (gp_json_dumps writes JSON_COMPACT). */
static const size_t DUMP_FLAGS[] = {
    JSON_COMPACT | JSON_ENSURE_ASCII, JSON_INDENT(1), JSON_INDENT(2) | JSON_SORT_KEYS,
    JSON_COMPACT | JSON_SORT_KEYS, 0,
};

typedef char *(*dumper)(const json_t *v, size_t flags);

static char *dump_plain(const json_t *v, size_t flags)
{
    return json_dumps(v, flags);
}

/* Runs dump over v with flags for N = 1, 2, ... until a run ends without
 * reaching the failure; every run must give NULL or exactly the unhurt
 * text. Returns the runs that gave another text (each printed); *missing:
 * how many of those left a key out. */
static int dump_sweep(const char *what, dumper dump, const json_t *v, size_t flags,
                      int *missing)
{
    char *ref = json_dumps(v, flags);
    assert_non_null(ref);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        arm_beneath(n);
        char *got = dump(v, flags);
        bool hit = disarm();
        if (got && strcmp(got, ref) != 0) {
            bool lost = false;
            for (size_t k = 0; k < sizeof DUMP_KEYS / sizeof DUMP_KEYS[0]; k++)
                lost |= strstr(got, DUMP_KEYS[k]) == NULL;
            *missing += lost;
            print_message("%s, flags 0x%zx: allocation %zu failed, the dump gave %s: %.300s\n",
                          what, flags, n, lost ? "a text missing a key" : "another text", got);
            bad++;
        } else if (!got && !hit) {
            print_message("%s, flags 0x%zx: no failure, no text\n", what, flags);
            bad++;
        }
        free(got);
        if (!hit)
            break;
    }
    free(ref);
    print_message("%s, flags 0x%zx: %zu allocations swept, %d gave another text\n", what, flags,
                  n - 1, bad);
    return bad;
}

/* gp_json_dumps_checked for every flag set: NULL or the unhurt text. */
static void test_checked_dump(void **st)
{
    (void)st;
    json_t *v = J(DUMP_TEXT);
    int missing = 0;
    for (size_t i = 0; i < sizeof DUMP_FLAGS / sizeof DUMP_FLAGS[0]; i++)
        assert_int_equal(dump_sweep("checked dump", gp_json_dumps_checked, v, DUMP_FLAGS[i],
                                    &missing), 0);
    /* what json_dumps refuses, the checked dump refuses too */
    json_t *s = json_string("top");
    assert_null(gp_json_dumps_checked(s, JSON_COMPACT));
    char *t = gp_json_dumps_checked(s, JSON_ENCODE_ANY);
    assert_string_equal(t, "\"top\"");
    free(t);
    json_decref(s);
    json_t *bad = json_pack("{s:o}", "k", json_stringn_nocheck("\xff", 1));
    assert_null(gp_json_dumps_checked(bad, JSON_COMPACT | JSON_ENSURE_ASCII));
    json_decref(bad);
    json_decref(v);
}

/* The same sweep over json_dumps alone gives texts that are not the
 * object's, some with a key left out: what the checked dump is for. */
static void test_plain_json_dumps_drops_a_key(void **st)
{
    (void)st;
    json_t *v = J(DUMP_TEXT);
    int bad = 0, missing = 0;
    for (size_t i = 0; i < sizeof DUMP_FLAGS / sizeof DUMP_FLAGS[0]; i++)
        bad += dump_sweep("plain json_dumps", dump_plain, v, DUMP_FLAGS[i], &missing);
    print_message("plain json_dumps: %d texts not the object's, %d missing a key\n", bad,
                  missing);
#if JANSSON_VERSION_HEX <= 0x020e00
    assert_true(missing > 0);
#endif
    json_decref(v);
}

int main(void)
{
    /* Before any load: the counting allocator, which arm_beneath fails
     * beneath. */
    gp_json_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checked_load),
        cmocka_unit_test(test_loadb),
        cmocka_unit_test(test_invalid_text),
        cmocka_unit_test(test_crash_text),
        cmocka_unit_test(test_escapes_and_long_tokens),
        cmocka_unit_test(test_plain_json_loadb_breaks_the_rule),
        cmocka_unit_test(test_checked_dump),
        cmocka_unit_test(test_plain_json_dumps_drops_a_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
