/* Unit tests for gp_json.h (issue 24, fourth round): whatever text it
 * is given, gp_json_loadb returns what json_loadb(p, n, 0, NULL)
 * returns: both NULL, or trees whose dumps agree byte for byte (types,
 * values, key order, a duplicate key's place). */
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

/* Both readers over p[0..n): they agree, and so does the reader alone
 * when it reads the text. Returns whether the reader alone read it. */
static bool agree(const char *p, size_t n)
{
    json_t *want = json_loadb(p, n, 0, NULL);
    json_t *own = gp_json_read(p, n);
    if (own && !want)
        fail_msg("read what jansson refuses: %.*s", (int)n, p);
    json_t *got = own ? own : gp_json_loadb(p, n, NULL);
    if (!want) {
        if (got)
            fail_msg("read what jansson refuses: %.*s", (int)n, p);
        return false;
    }
    if (!got)
        fail_msg("refused what jansson reads: %.*s", (int)n, p);
    size_t flags = JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17);
    char *a = json_dumps(want, flags), *b = json_dumps(got, flags);
    assert_non_null(a);
    assert_non_null(b);
    if (strcmp(a, b) != 0)
        fail_msg("differs: %s\n  jansson: %s\n  agent:   %s", p, a, b);
    assert_true(json_equal(want, got));
    free(a);
    free(b);
    json_decref(want);
    json_decref(got);
    return own != NULL;
}

static bool agree_s(const char *s)
{
    return agree(s, strlen(s));
}

/* What the server sends: a work reply with jobs, an upload's reply. */
static const char *const texts[] = {
    "{\"jobs\":[{\"job_id\":\"j-0001\",\"kind\":\"completion\",\"model\":\"fake-i0\","
    "\"params\":{\"max_tokens\":64,\"temperature\":0.69999999999999996,\"top_p\":1.0,"
    "\"top_k\":0,\"stop\":[\"\\n\\n\",\"END\"],\"seed\":null},\"continuation\":\"\","
    "\"attempt\":1,\"correlation_id\":\"c-1\",\"deadline_ms\":29999,\"prompt\":\"hi\","
    "\"messages\":null,\"pool_via\":\"159071e10a2480cd\",\"sampler\":{\"seed\":2540975514737763238}}],"
    "\"delivery\":\"b73be407480defa4.1\"}",
    "{\"jobs\":[{\"job_id\":\"a\",\"status\":200,\"cancel\":false},"
    "{\"job_id\":\"b\",\"status\":200,\"cancel\":true}]}",
    /* escapes, UTF-8, a \u escape (jansson's), surrogate pairs */
    "{\"s\":\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\",\"u\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\"}",
    "{\"u\":\"\\u00e9\\ud83d\\ude00\"}",
    "{\"k\\n\\\"\":1,\"caf\xc3\xa9\":[true,false,null]}",
    /* whitespace everywhere, empty containers */
    " \t\r\n{ \"a\" : [ ] , \"b\" : { } , \"c\" : [ 1 , 2 ] } \n",
    "[]", "{}", "[[[[[]]]]]", "[{}, [], \"\", 0, -0, 0.0, -0.0]",
    /* numbers: integer edges, reals, exponents, jansson's refusals */
    "[999999999999999999,-999999999999999999,1000000000000000000,"
    "9223372036854775807,-9223372036854775808]",
    "[9223372036854775808]", "[-9223372036854775809]", "[18446744073709551615]",
    "[99999999999999999999]", "[-0000]", "[1000000000000000000000]",
    "[1.5e300,-2.5E-300,1e400,1e-400,3.141592653589793,1E+2,1e-2]",
    "[01]", "[-]", "[1.]", "[.5]", "[1e]", "[1e+]", "[+1]", "[1.5.5]", "[--1]", "[0x10]",
    /* duplicates: the later value where the first stood */
    "{\"a\":1,\"b\":2,\"a\":3}",
    /* refused: scalars at the top, trailing bytes, broken strings */
    "\"top\"", "42", "null", "{\"a\":1} x", "{\"a\":1}}", "{\"a\":\"\x01\"}", "{\"a\":\"\xc3\"}",
    "{\"a\":\"\xed\xa0\x80\"}", "{\"a\":\"\\x\"}", "{\"a\":\"\\u0000\"}", "{\"a\" 1}", "{a:1}",
    "{\"a\":1,}", "[1,]", "[1 2]", "{\"a\":tru}", "{\"a\":nul}", "", " ", "{", "[",
    "{\"a\":\"unterminated", "{\"a\":1}\x00",
    NULL,
};

static void test_texts_agree(void **state)
{
    (void)state;
    int parsed = 0;
    for (int i = 0; texts[i]; i++)
        parsed += agree_s(texts[i]);
    assert_true(parsed >= 10);
    /* The server's replies are read without jansson's decoder. */
    assert_true(agree_s(texts[0]));
    assert_true(agree_s(texts[1]));
    /* A NUL inside the text (not at its end). */
    agree("{\"a\":1}\0", 8);
    agree("{\"a\":\"x\0y\"}", 11);
}

/* A duplicate key is left to json_loadb, so that a caller's
 * JSON_REJECT_DUPLICATES (the server's request bodies) still refuses it. */
static void test_duplicate_declined(void **state)
{
    (void)state;
    const char *t = "{\"model\":\"a\",\"n\":{\"x\":1,\"x\":2},\"model\":\"b\"}";
    assert_null(gp_json_read(t, strlen(t)));
    assert_false(agree_s(t)); /* the last one wins, as jansson's */
    assert_null(json_loadb(t, strlen(t), JSON_REJECT_DUPLICATES, NULL));
    const char *u = "{\"a\":1,\"b\":{\"a\":2}}"; /* the same key at two levels */
    json_t *j = gp_json_read(u, strlen(u));
    assert_non_null(j);
    json_decref(j);
}

/* Deep nesting, past this reader's depth and past jansson's. */
static void test_deep(void **state)
{
    (void)state;
    static char buf[2 * 3000 + 1];
    for (int depth = 60; depth <= 3000; depth = depth < 70 ? depth + 1 : depth * 2) {
        memset(buf, '[', (size_t)depth);
        memset(buf + depth, ']', (size_t)depth);
        agree(buf, 2 * (size_t)depth);
    }
}

/* The texts above with bytes changed, inserted and dropped at random. */
static void test_mutations_agree(void **state)
{
    (void)state;
    static const char alphabet[] = "{}[]:,\"\\ -+0123456789.eEnulltrfabu/\x01\x80\xc3\xa9\xed\xf4";
    unsigned seed = 24;
    int count = 0;
    while (texts[count])
        count++;
    char buf[1024];
    long parsed = 0;
    for (int round = 0; round < 20000; round++) {
        const char *src = texts[(unsigned)rand_r(&seed) % (unsigned)count];
        size_t n = strlen(src);
        memcpy(buf, src, n);
        mutate(buf, &n, sizeof buf, &seed, alphabet, sizeof alphabet - 1);
        parsed += agree(buf, n);
    }
    assert_true(parsed > 1000); /* the mutations did reach the reader */
}

/* Every byte value at every position of a string value and of a key. */
static void test_every_byte_in_strings(void **state)
{
    (void)state;
    char buf[64];
    for (int where = 0; where < 2; where++)
        for (int at = 0; at < 3; at++)
            for (int byte = 0; byte < 256; byte++) {
                char s[4] = "abc";
                s[at] = (char)byte;
                int n = where ? snprintf(buf, sizeof buf, "{\"k\":\"%.3s\"}", "xxx")
                              : snprintf(buf, sizeof buf, "{\"%.3s\":1}", "xxx");
                char *x = strstr(buf, "xxx");
                memcpy(x, s, 3);
                agree(buf, (size_t)n);
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_texts_agree),
        cmocka_unit_test(test_deep),
        cmocka_unit_test(test_duplicate_declined),
        cmocka_unit_test(test_mutations_agree),
        cmocka_unit_test(test_every_byte_in_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
