/* Unit tests for gp_json.h's reader: whatever the text and the load flags,
 * gp_json_load_checked accepts exactly what jansson 2.14's json_loadb
 * accepts, and builds the same tree (dumps equal byte for byte: types,
 * values, the sign of a zero, key order, a duplicate key's place); where
 * it refuses, its error is its own and says where (line, column,
 * position) and jansson's code for the kind of fault. json_loadb runs
 * here only to compare with, never under failing allocations. */
#include <locale.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <jansson.h>

#include "common/gp_json.h"
#include "mutate.h"

/* Every load flag jansson has: each subset is a value in 0..ALL_FLAGS. */
#define ALL_FLAGS                                                                                \
    (JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY |                       \
     JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL)

/* Refusals whose code is jansson's too (and all of them), for the report. */
static long codes_same, codes_all;

/* p[0..n) printable, for a failure's message. */
static const char *shown(const char *p, size_t n)
{
    static char out[600];
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < sizeof out; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c >= 0x20 && c < 0x7F)
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, sizeof out - o, "\\x%02x", c);
    }
    out[o] = '\0';
    return out;
}

static bool same_tree(const json_t *a, const json_t *b)
{
    size_t flags = JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17);
    char *x = json_dumps(a, flags), *y = json_dumps(b, flags);
    assert_non_null(x);
    assert_non_null(y);
    bool same = strcmp(x, y) == 0 && json_equal(a, b);
    if (!same)
        print_message("  jansson: %.300s\n  gp_json: %.300s\n", x, y);
    free(x);
    free(y);
    return same;
}

/* The error of a refusal: a code jansson has for text that is not JSON,
 * its place inside the text, a text that says where. */
static void check_refusal(const json_error_t *e, const char *p, size_t n)
{
    enum json_error_code c = json_error_code(e);
    if (c != json_error_invalid_syntax && c != json_error_invalid_utf8 &&
        c != json_error_premature_end_of_input && c != json_error_end_of_input_expected &&
        c != json_error_duplicate_key && c != json_error_numeric_overflow &&
        c != json_error_null_character && c != json_error_null_byte_in_key &&
        c != json_error_stack_overflow)
        fail_msg("code %d (%s) for %s", (int)c, e->text, shown(p, n));
    if (e->line < 1 || e->column < 0 || e->position < 0 || (size_t)e->position > n)
        fail_msg("place line %d column %d position %d for %s (%zu bytes)", e->line, e->column,
                 e->position, shown(p, n), n);
    char where[64];
    snprintf(where, sizeof where, " at line %d, column %d", e->line, e->column);
    if (!strstr(e->text, where))
        fail_msg("text \"%s\" does not say%s", e->text, where);
    assert_string_equal(e->source, "<buffer>");
}

/* Both readers over p[0..n) with flags: the same answer. Returns whether
 * the text was read. */
static bool agree_flags(const char *p, size_t n, size_t flags)
{
    json_error_t je, ge;
    json_t *want = json_loadb(p, n, flags, &je);
    json_t *got = gp_json_load_checked(p, n, flags, &ge);
    if (!want != !got)
        fail_msg("flags 0x%zx: %s %s (jansson: %s)", flags, got ? "read" : "refused",
                 shown(p, n), want ? "reads it" : je.text);
    if (!want) {
        check_refusal(&ge, p, n);
        codes_all++;
        codes_same += json_error_code(&ge) == json_error_code(&je);
        if (getenv("GP_JSON_CODES") && json_error_code(&ge) != json_error_code(&je))
            print_message("code %d vs jansson's %d (%s / %s): %s\n", (int)json_error_code(&ge),
                          (int)json_error_code(&je), ge.text, je.text, shown(p, n));
        return false;
    }
    if (!same_tree(want, got))
        fail_msg("flags 0x%zx: another tree for %s", flags, shown(p, n));
    /* on success err is as jansson leaves it: the bytes it read */
    if (ge.position != je.position || ge.text[0])
        fail_msg("flags 0x%zx: position %d, jansson's %d, for %s", flags, ge.position,
                 je.position, shown(p, n));
    json_decref(want);
    json_decref(got);
    return true;
}

/* Every flag set; then the other entry points, whose flags are fixed. */
static bool agree(const char *p, size_t n)
{
    bool read = false;
    for (size_t f = 0; f <= ALL_FLAGS; f++)
        read |= agree_flags(p, n, f);
    json_t *want = json_loadb(p, n, 0, NULL), *got = gp_json_loadb(p, n, NULL);
    assert_true(!want == !got);
    if (want)
        assert_true(same_tree(want, got));
    json_decref(got);
    json_decref(want);
    want = json_loadb(p, n, JSON_REJECT_DUPLICATES, NULL);
    got = gp_json_read(p, n);
    assert_true(!want == !got);
    if (want)
        assert_true(same_tree(want, got));
    json_decref(got);
    json_decref(want);
    return read;
}

static bool agree_s(const char *s)
{
    return agree(s, strlen(s));
}

/* What the pool reads: a work reply with jobs, a chat request, then every
 * corner of the grammar. */
static const char *const texts[] = {
    "{\"jobs\":[{\"job_id\":\"j-0001\",\"kind\":\"completion\",\"model\":\"fake-i0\","
    "\"params\":{\"max_tokens\":64,\"temperature\":0.69999999999999996,\"top_p\":1.0,"
    "\"top_k\":0,\"stop\":[\"\\n\\n\",\"END\"],\"seed\":null},\"continuation\":\"\","
    "\"attempt\":1,\"correlation_id\":\"c-1\",\"deadline_ms\":29999,\"prompt\":\"hi\","
    "\"messages\":null,\"pool_via\":\"159071e10a2480cd\",\"sampler\":{\"seed\":2540975514737763238}}],"
    "\"delivery\":\"b73be407480defa4.1\"}",
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi!\\nWhat is 2+2?\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}}}}}],"
    "\"temperature\":0.7,\"max_tokens\":16,\"stream\":true}",
    "{\"input_tokens\":1234,\"x_pool_meta\":{\"estimated\":false,\"model\":\"an-inner-model\"}}",
    /* escapes, UTF-8, \u escapes, surrogate pairs */
    "{\"s\":\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\",\"u\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\"}",
    "{\"u\":\"\\u00e9\\ud83d\\ude00\\uD834\\uDD1E\\u0041\\u007f\\u0080\\u07FF\\u0800\\uFFFF\"}",
    "{\"k\\n\\\"\":1,\"caf\xc3\xa9\":[true,false,null],\"\\u006b\":2}",
    "[\"\\ud800\"]", "[\"\\udc00\"]", "[\"\\ud800x\"]", "[\"\\ud800\\ud800\"]",
    "[\"\\ud800\\u0041\"]", "[\"\\ud800\\n\"]", "[\"\\udbff\\udfff\"]", "[\"\\uDBFF\\uDFFF\"]",
    "[\"\\u12\"]", "[\"\\u12G4\"]", "[\"\\u\"]", "[\"\\", "[\"\\u00", "[\"\\ud800\\u",
    "[\"\\x\"]", "[\"\\'\"]", "[\"\\U0041\"]", "[\"\\a\"]", "[\"\\0\"]",
    /* \u0000: a value with JSON_ALLOW_NUL, never a key */
    "[\"\\u0000\"]", "[\"a\\u0000b\"]", "{\"k\":\"\\u0000\"}", "{\"\\u0000\":1}",
    "{\"a\\u0000\":1}",
    /* UTF-8: overlong, surrogates, past U+10FFFF, cut short, stray bytes */
    "[\"\xc0\x80\"]", "[\"\xc1\xbf\"]", "[\"\xe0\x80\x80\"]", "[\"\xe0\x9f\xbf\"]",
    "[\"\xed\xa0\x80\"]", "[\"\xed\xbf\xbf\"]", "[\"\xf0\x8f\xbf\xbf\"]", "[\"\xf4\x90\x80\x80\"]",
    "[\"\xf5\x80\x80\x80\"]", "[\"\xff\"]", "[\"\x80\"]", "[\"\xc3\"]", "[\"\xe2\x82\"]",
    "[\"\xf0\x9f\x98\"]", "[\"\xc3", "[\"\xef\xbf\xbf\xf4\x8f\xbf\xbf\xc2\x80\"]",
    "[\xc3\xa9]", "[1]\xff", "[1] \xc3\xa9", "\xef\xbb\xbf[1]", "{\"\xff\":1}",
    /* control characters in strings; DEL is not one */
    "[\"a\x01\"]", "[\"a\x1f\"]", "[\"a\nb\"]", "[\"a\tb\"]", "[\"a\x7f\"]",
    /* whitespace: JSON's four only */
    " \t\r\n{ \"a\" : [ ] , \"b\" : { } , \"c\" : [ 1 , 2 ] } \n", "[1,\f2]", "[1,\v2]",
    "[1,\xc2\xa0" "2]", "\n\n  [1,\n  x]",
    "[]", "{}", "[[[[[]]]]]", "[{}, [], \"\", 0, -0, 0.0, -0.0]",
    /* integers: long long's edges, past them, many digits */
    "[999999999999999999,-999999999999999999,1000000000000000000,"
    "9223372036854775807,-9223372036854775808]",
    "[9223372036854775808]", "[-9223372036854775809]", "[18446744073709551615]",
    "[18446744073709551616]", "[99999999999999999999]", "[-99999999999999999999]",
    "[1000000000000000000000]", "[9999999999999999999]", "[-9999999999999999999]",
    "[123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890]",
    /* reals: the double's edges, overflow (refused), underflow (0 or a
     * subnormal, taken), exponents, zeros and their signs */
    "[1.5e300,-2.5E-300,1e400,1e-400,3.141592653589793,1E+2,1e-2]",
    "[1.7976931348623157e308]", "[1.7976931348623158e308]", "[1.7976931348623159e308]",
    "[-1.7976931348623159e308]", "[1e308]", "[1e309]", "[-1e309]", "[1E400]", "[-1E400]",
    "[1e-400]", "[-1e-400]", "[4.9e-324]", "[2.4e-324]", "[2.5e-324]", "[1e-320]",
    "[2.2250738585072014e-308]", "[2.2250738585072011e-308]", "[0e0]", "[-0e-0]", "[0E+0]",
    "[-0]", "[-0.0]", "[0.0]", "[-0e5]", "[1e0001]", "[1e-0001]", "[0.1e1]",
    "[1e99999999999999999999]", "[1e-99999999999999999999]",
    "[0.00000000000000000000000000000000000000000000000000000000000000000000000000000000001]",
    "[12345678901234567890123456789012345678901234567890123456789012345678901234567890.5]",
    "[0.30000000000000004,0.1,0.2,100,1e2,1.0e2]",
    /* not numbers */
    "[01]", "[-01]", "[00]", "[-00]", "[-0000]", "[0x10]", "[-]", "[1.]", "[.5]", "[1e]",
    "[1e+]", "[1e-]", "[+1]", "[1.5.5]", "[--1]", "[1.e5]", "[-.5]", "[- 1]", "[1 .5]",
    "[Infinity]", "[-Infinity]", "[NaN]", "[1_000]", "[0.]", "[1e5.5]", "[\xef\xbc\x91]",
    /* duplicates: the later value where the first stood; refused with
     * JSON_REJECT_DUPLICATES; an escaped spelling of the same key */
    "{\"a\":1,\"b\":2,\"a\":3}", "{\"a\":1,\"\\u0061\":2}", "{\"a\":{\"x\":1},\"a\":[2]}",
    "{\"a\":1,\"b\":{\"a\":2}}",
    /* scalars at the top (JSON_DECODE_ANY), trailing bytes
     * (JSON_DISABLE_EOF_CHECK) and what its reader reads ahead */
    "\"top\"", "42", "-1.5e3", "null", "true", "false", "  7  ", "\"\\u0000\"",
    "{\"a\":1} x", "{\"a\":1}}", "{\"a\":1}{}", "[1][2]", "1x", "1 x", "1.5.3", "1e5e5", "01",
    "1.", "-", "truex", "true1", "true x", "nullnull", "\"a\"junk", "[1]\x00junk", "0\x00",
    "1\xff", "true\xff", "12\xc3", "1e\xff", "-\xff",
    /* broken containers and words */
    "{\"a\":\"\x01\"}", "{\"a\":\"\xc3\"}", "{\"a\":\"\\x\"}", "{\"a\" 1}", "{a:1}", "{'a':1}",
    "{\"a\":1,}", "[1,]", "[,1]", "[1,,2]", "[1 2]", "{\"a\":tru}", "{\"a\":nul}", "{\"a\"}",
    "{\"a\":}", "{:1}", "{1:1}", "{\"a\":1 \"b\":2}", "[1:2]", "{\"a\",1}", "[}", "{]",
    "[True]", "[NULL]", "[nul]", "[tru]", "[fals]", "[truee]", "[t]", "", " ", "{", "[",
    "{\"", "{\"a", "{\"a\"", "{\"a\":", "{\"a\":1", "{\"a\":1,", "[1", "[1,", "[\"",
    "{\"a\":\"unterminated", "{\"a\":1}\x00", "\x00", "[\x00]", "]", "}", ",", ":",
    NULL,
};

static void test_texts_agree(void **state)
{
    (void)state;
    int read = 0;
    for (int i = 0; texts[i]; i++)
        read += agree_s(texts[i]);
    assert_true(read >= 60);
    /* NUL bytes inside the text, not at its end */
    agree("{\"a\":1}\0", 8);
    agree("{\"a\":\"x\0y\"}", 11);
    agree("[1,\0 2]", 7);
    agree("\0[1]", 4);
    agree("[1]\0", 4);
    agree("\"a\"\0", 4);
    agree("1\0", 2);
    print_message("refusals with jansson's own code: %ld of %ld\n", codes_same, codes_all);
}

/* A text refused with the code and at the place given (line, column:
 * the character at fault; position: bytes up to and with it). */
static void refused_at(const char *text, size_t flags, enum json_error_code code, int line,
                       int column, int position, const char *says)
{
    json_error_t e;
    json_t *j = gp_json_load_checked(text, strlen(text), flags, &e);
    if (j)
        fail_msg("read %s", text);
    if (json_error_code(&e) != code || e.line != line || e.column != column ||
        e.position != position || !strstr(e.text, says))
        fail_msg("%s: code %d line %d column %d position %d \"%s\"; wanted code %d line %d "
                 "column %d position %d \"%s\"",
                 shown(text, strlen(text)), (int)json_error_code(&e), e.line, e.column,
                 e.position, e.text, (int)code, line, column, position, says);
    check_refusal(&e, text, strlen(text));
}

static void test_errors_say_where(void **state)
{
    (void)state;
    refused_at("{\"a\":1 \"b\":2}", 0, json_error_invalid_syntax, 1, 8, 8,
               "expected ',' or '}' after an object member, not '\"'");
    refused_at("{\n  \"a\": tru\n}", 0, json_error_invalid_syntax, 2, 8, 10,
               "invalid word 'tru'");
    refused_at("[\"\xc3\xa9\xc3\xa9\", x]", 0, json_error_invalid_syntax, 1, 8, 10,
               "invalid word 'x'");
    refused_at("[\"\xc3\xa9\xc3\xa9\", @]", 0, json_error_invalid_syntax, 1, 8, 10,
               "expected a value, not '@'");
    refused_at("[1,", 0, json_error_premature_end_of_input, 1, 3, 3,
               "the text ends where a value was expected");
    refused_at("", 0, json_error_premature_end_of_input, 1, 0, 0, "the text ends");
    refused_at("{\"a\":\"abc", 0, json_error_premature_end_of_input, 1, 9, 9,
               "the text ends inside a string");
    refused_at("\"x\"", 0, json_error_invalid_syntax, 1, 1, 1, "expected '{' or '['");
    refused_at("[1] [2]", 0, json_error_end_of_input_expected, 1, 5, 5,
               "expected the end of the text after the value, not '['");
    refused_at("[1]\n\xff", 0, json_error_invalid_utf8, 2, 1, 5, "invalid UTF-8 (byte 0xff)");
    refused_at("[\"a\xe2\x82\"]", 0, json_error_invalid_utf8, 1, 4, 4, "invalid UTF-8");
    refused_at("{\"k\":1,\"k\":2}", JSON_REJECT_DUPLICATES, json_error_duplicate_key, 1, 8, 8,
               "duplicate object key \"k\"");
    refused_at("[9223372036854775808]", 0, json_error_numeric_overflow, 1, 2, 2,
               "integer out of range (9223372036854775808)");
    refused_at("[1e400]", 0, json_error_numeric_overflow, 1, 2, 2, "number out of range (1e400)");
    refused_at("[\"\\u0000\"]", 0, json_error_null_character, 1, 2, 2, "\\u0000");
    refused_at("{\"\\u0000\":1}", JSON_ALLOW_NUL, json_error_null_byte_in_key, 1, 2, 2,
               "\\u0000 in an object key");
    refused_at("[\"ab\\ud800\"]", 0, json_error_invalid_syntax, 1, 5, 5,
               "lone UTF-16 surrogate \\uD800");
    refused_at("[\"a\nb\"]", 0, json_error_invalid_syntax, 1, 3, 3, "control character 0x0a");
    refused_at("[01]", 0, json_error_invalid_syntax, 1, 2, 2, "leading zero");
    refused_at("[1.]", 0, json_error_invalid_syntax, 1, 4, 4, "a digit after '.'");
    refused_at("[\"\\q\"]", 0, json_error_invalid_syntax, 1, 3, 3, "invalid escape '\\q'");
    /* NULL is not a text (json_loadb: "wrong arguments") */
    json_error_t e;
    assert_null(gp_json_load_checked(NULL, 0, 0, &e));
    assert_int_equal(json_error_code(&e), json_error_invalid_argument);
    assert_null(gp_json_load_checked(NULL, 0, 0, NULL));
    assert_null(json_loadb(NULL, 0, 0, NULL));
    /* a refusal's text keeps the code's byte: a long key cut, not spilled */
    char key[301], dup[1024];
    memset(key, 'k', 300);
    key[300] = '\0';
    int n = snprintf(dup, sizeof dup, "{\"%s\":1,\"%s\":2}", key, key);
    assert_null(gp_json_load_checked(dup, (size_t)n, JSON_REJECT_DUPLICATES, &e));
    assert_int_equal(json_error_code(&e), json_error_duplicate_key);
    assert_true(strlen(e.text) < JSON_ERROR_TEXT_LENGTH - 1);
}

/* Nesting at jansson's limit: it counts every value, scalars too, and
 * refuses the 2049th; each shape at 2047 to 2050 values deep. */
static void test_deep(void **state)
{
    (void)state;
    static char buf[8 * 2100 + 16];
    for (int values = 2046; values <= 2050; values++) {
        for (int shape = 0; shape < 5; shape++) {
            size_t n = 0;
            int open = shape == 1 || shape == 3 ? values - 1 : values; /* the last a scalar */
            for (int i = 0; i < open; i++) {
                const char *o = shape >= 2 ? (i % 2 ? "[" : "{\"k\":") : "[";
                if (shape == 4)
                    o = i % 2 ? " [ " : "{\"k\" : ";
                memcpy(buf + n, o, strlen(o));
                n += strlen(o);
            }
            if (shape == 1 || shape == 3)
                buf[n++] = '7';
            for (int i = open - 1; i >= 0; i--) {
                bool obj = shape >= 2 && i % 2 == 0;
                if (shape == 0 && i == open - 1) { /* nothing inside the innermost */
                    buf[n++] = ']';
                    continue;
                }
                if (obj && i == open - 1 && shape != 3) {
                    /* an object with no member: "{}" closes the key's value */
                    n -= strlen(shape == 4 ? "{\"k\" : " : "{\"k\":");
                    buf[n++] = '{';
                }
                buf[n++] = obj ? '}' : ']';
            }
            json_t *want = json_loadb(buf, n, 0, NULL);
            bool read = agree_flags(buf, n, 0);
            agree_flags(buf, n, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES);
            /* jansson's limit is the reason, not the shape */
            assert_int_equal(read, values <= 2048);
            json_decref(want);
        }
    }
    /* far past the limit, and a scalar alone at the top is depth 1 */
    memset(buf, '[', 8000);
    agree(buf, 8000);
    json_error_t e;
    assert_null(gp_json_load_checked(buf, 8000, 0, &e));
    assert_int_equal(json_error_code(&e), json_error_stack_overflow);
    assert_int_equal(e.position, 2049);
}

/* The later value where the first stood, or refused. */
static void test_duplicates(void **state)
{
    (void)state;
    const char *t = "{\"model\":\"a\",\"n\":{\"x\":1,\"x\":2},\"model\":\"b\"}";
    json_t *j = gp_json_loadb(t, strlen(t), NULL);
    char *d = json_dumps(j, JSON_COMPACT);
    assert_string_equal(d, "{\"model\":\"b\",\"n\":{\"x\":2}}");
    free(d);
    json_decref(j);
    assert_null(gp_json_read(t, strlen(t)));
    json_error_t e;
    assert_null(gp_json_load_checked(t, strlen(t), JSON_REJECT_DUPLICATES, &e));
    assert_int_equal(json_error_code(&e), json_error_duplicate_key);
    agree_s(t);
    const char *u = "{\"a\":1,\"b\":{\"a\":2}}"; /* the same key at two levels */
    j = gp_json_read(u, strlen(u));
    assert_non_null(j);
    json_decref(j);
    /* a key with escapes, next to one that nests another escaped key */
    const char *w = "{\"k\\n1\":{\"k\\n1\":{\"k\\t2\":[\"\\u00e9\"]}},\"k\\n1\":0,\"x\\u00e9\":1}";
    assert_true(agree_s(w));
}

/* Reals are read in the C locale, as jansson reads them, whatever the
 * process's LC_NUMERIC: checked where a locale with a decimal comma is
 * installed (else said and skipped). */
static void test_locale(void **state)
{
    (void)state;
    static const char *const names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8",
                                        "fr_FR.utf8",  "de_DE",      "nl_NL.UTF-8"};
    const char *got = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !got; i++)
        got = setlocale(LC_NUMERIC, names[i]);
    if (!got || strcmp(localeconv()->decimal_point, ".") == 0) {
        print_message("no locale with a decimal comma installed: the C locale only\n");
        setlocale(LC_NUMERIC, "C");
        return;
    }
    print_message("LC_NUMERIC %s, decimal point '%s'\n", got, localeconv()->decimal_point);
    const char *t = "[1.5,-0.25,3e2,1.7976931348623157e308,2.5e-324,0.1,12345.678]";
    assert_true(agree_s(t));
    json_t *j = gp_json_loadb(t, strlen(t), NULL);
    assert_true(json_real_value(json_array_get(j, 0)) == 1.5);
    json_decref(j);
    agree_s("[1,5]");
    setlocale(LC_NUMERIC, "C");
}

/* The texts above with bytes changed, inserted and dropped at random,
 * under random flags. */
static void test_mutations_agree(void **state)
{
    (void)state;
    static const char alphabet[] = "{}[]:,\"\\ -+0123456789.eEnulltrfabu/\x01\x80\xc3\xa9\xed\xf4"
                                   "\x00\n\txdD";
    unsigned seed = 24;
    int count = 0;
    while (texts[count])
        count++;
    char buf[1024];
    long read = 0;
    for (int round = 0; round < 60000; round++) {
        const char *src = texts[(unsigned)rand_r(&seed) % (unsigned)count];
        size_t n = strlen(src);
        memcpy(buf, src, n);
        mutate(buf, &n, sizeof buf, &seed, alphabet, sizeof alphabet - 1);
        read += agree_flags(buf, n, (size_t)rand_r(&seed) & ALL_FLAGS);
    }
    assert_true(read > 5000); /* the mutations did reach the reader */
    print_message("mutations read: %ld; refusals with jansson's own code: %ld of %ld\n", read,
                  codes_same, codes_all);
}

/* Every byte value at every position of a string value, of a key, and
 * after an escape's backslash. */
static void test_every_byte_in_strings(void **state)
{
    (void)state;
    char buf[64];
    for (int where = 0; where < 3; where++)
        for (int at = 0; at < 3; at++)
            for (int byte = 0; byte < 256; byte++) {
                char s[4] = "abc";
                s[at] = (char)byte;
                int n = where == 2 ? snprintf(buf, sizeof buf, "[\"\\xxx\"]")
                        : where    ? snprintf(buf, sizeof buf, "{\"k\":\"%.3s\"}", "xxx")
                                   : snprintf(buf, sizeof buf, "{\"%.3s\":1}", "xxx");
                char *x = strstr(buf, "xxx");
                memcpy(x, s, 3);
                agree(buf, (size_t)n);
            }
}

/* Every byte after each kind of value at the top, with and without the
 * end-of-text check. */
static void test_every_byte_after_a_value(void **state)
{
    (void)state;
    static const char *const values[] = {"1", "-0", "1.5", "1e5", "true", "null", "\"s\"", "[]",
                                         "{}", "0"};
    char buf[16];
    for (size_t v = 0; v < sizeof values / sizeof values[0]; v++)
        for (int byte = 0; byte < 256; byte++) {
            size_t n = strlen(values[v]);
            memcpy(buf, values[v], n);
            buf[n++] = (char)byte;
            for (size_t f = 0; f <= ALL_FLAGS; f++)
                agree_flags(buf, n, f);
            buf[n++] = '7'; /* a byte more: a digit after a possible lead byte */
            agree_flags(buf, n, JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK);
        }
}

/* Strings and numbers longer than any small buffer: the reader's own
 * copies (a real's, a key with escapes kept while its value is read). */
static void test_long_tokens(void **state)
{
    (void)state;
    size_t cap = 200000;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (size_t len = 1; len < 70000; len = len * 3 + 1) {
        size_t n = 0;
        n += (size_t)snprintf(buf + n, cap - n, "{\"");
        for (size_t i = 0; i < len; i++) {
            if (i % 7 == 0)
                buf[n++] = '\\'; /* "\\n": the key has escapes */
            buf[n++] = i % 7 == 0 ? 'n' : 'k';
        }
        n += (size_t)snprintf(buf + n, cap - n, "\":[\"");
        for (size_t i = 0; i < len; i++)
            buf[n++] = (char)('a' + i % 26);
        n += (size_t)snprintf(buf + n, cap - n, "\",1.");
        for (size_t i = 0; i < len; i++)
            buf[n++] = (char)('0' + i % 10);
        n += (size_t)snprintf(buf + n, cap - n, "e-5,0.");
        for (size_t i = 0; i < len; i++)
            buf[n++] = '0';
        n += (size_t)snprintf(buf + n, cap - n, "1,");
        for (size_t i = 0; i < len && i < 400; i++)
            buf[n++] = (char)('1' + i % 9);
        n += (size_t)snprintf(buf + n, cap - n, "]}");
        /* (its last number is an integer past 64 bits from 20 digits on) */
        assert_int_equal(agree_flags(buf, n, 0), len < 20);
        agree_flags(buf, n, JSON_DECODE_INT_AS_REAL);
        agree_flags(buf, n, JSON_REJECT_DUPLICATES);
    }
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_texts_agree),
        cmocka_unit_test(test_errors_say_where),
        cmocka_unit_test(test_deep),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_locale),
        cmocka_unit_test(test_mutations_agree),
        cmocka_unit_test(test_every_byte_in_strings),
        cmocka_unit_test(test_every_byte_after_a_value),
        cmocka_unit_test(test_long_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
