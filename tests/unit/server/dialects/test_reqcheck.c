/* The validation helpers every dialect shares (reqcheck.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/dialects/reqcheck.h"

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

static void test_stop_and_sampling(void **st)
{
    (void)st;
    char msg[160];
    json_t *out = NULL;
    json_t *one = json_string("END"), *empty = json_string(""),
           *arr = json_pack("[s,s]", "a", "b"), *bad = json_pack("[s,i]", "a", 3),
           *many = json_pack("[s,s,s]", "a", "b", "c");
    assert_int_equal(gps_stop_parse(NULL, 4, &out, msg, sizeof msg), 0);
    assert_null(out);
    assert_int_equal(gps_stop_parse(one, 4, &out, msg, sizeof msg), 0);
    assert_int_equal(json_array_size(out), 1);
    json_decref(out);
    assert_int_equal(gps_stop_parse(arr, 2, &out, msg, sizeof msg), 0);
    assert_string_equal(json_string_value(json_array_get(out, 1)), "b");
    json_decref(out);
    /* An empty sequence would end every reply at once: refused. */
    assert_int_equal(gps_stop_parse(empty, 4, &out, msg, sizeof msg), -1);
    assert_string_equal(msg, "'stop' must be a string of 1 to 1024 bytes");
    assert_int_equal(gps_stop_parse(bad, 4, &out, msg, sizeof msg), -1);
    assert_string_equal(msg, "stop[1] must be a string of 1 to 1024 bytes");
    assert_int_equal(gps_stop_parse(many, 2, &out, msg, sizeof msg), -1);
    assert_null(out);

    gps_job_spec s;
    memset(&s, 0, sizeof s);
    const char *param = NULL;
    json_t *b = json_pack("{s:f,s:i,s:[s]}", "temperature", 1.5, "top_k", 40, "stop", "x");
    assert_int_equal(gps_sampling_parse(b, &s, 2, 4, msg, sizeof msg, &param), 0);
    assert_true(s.temperature == 1.5);
    assert_int_equal(s.top_k, 40);
    assert_int_equal(json_array_size(s.stop), 1);
    json_decref(s.stop);
    json_decref(b);
    memset(&s, 0, sizeof s);
    b = json_pack("{s:f}", "top_p", 1.5);
    assert_int_equal(gps_sampling_parse(b, &s, 2, 4, msg, sizeof msg, &param), -1);
    assert_string_equal(param, "top_p");
    json_decref(b);
    b = json_pack("{s:[s]}", "stop", "");
    assert_int_equal(gps_sampling_parse(b, &s, 2, 4, msg, sizeof msg, &param), -1);
    assert_string_equal(param, "stop");
    json_decref(b);

    json_t *seed = json_integer(7), *str = json_string("7");
    memset(&s, 0, sizeof s);
    assert_int_equal(gps_seed_parse(NULL, &s), 0);
    assert_false(s.has_seed);
    assert_int_equal(gps_seed_parse(str, &s), -1);
    assert_int_equal(gps_seed_parse(seed, &s), 0);
    assert_true(s.has_seed);
    assert_int_equal(s.seed, 7);
    json_decref(seed);
    json_decref(str);
    json_decref(one);
    json_decref(empty);
    json_decref(arr);
    json_decref(bad);
    json_decref(many);
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

/* X-Pool-Options: its keys join the body's x_pool_options, the body's win. */
/* x_pool_options.tenant (a downstream pool's tag): 1 to 64 bytes. */
static void test_pool_options_tenant(void **st)
{
    (void)st;
    char msg[256], big[80];
    const char *param = NULL;
    gps_job_spec s;
    memset(&s, 0, sizeof s);
    json_t *xo = json_pack("{s:s}", "tenant", "0123456789abcdef0123456789abcdef");
    assert_int_equal(gps_pool_options_parse(xo, &s, msg, sizeof msg, &param), 0);
    assert_string_equal(s.tenant_sub, "0123456789abcdef0123456789abcdef");
    json_decref(xo);
    memset(big, 'a', 65);
    big[65] = '\0';
    const json_t *bad[] = {json_string(""), json_string(big), json_integer(7)};
    for (size_t i = 0; i < 3; i++) {
        xo = json_pack("{s:O}", "tenant", bad[i]);
        assert_int_equal(gps_pool_options_parse(xo, &s, msg, sizeof msg, &param), -1);
        assert_string_equal(param, "x_pool_options.tenant");
        json_decref(xo);
        json_decref((json_t *)bad[i]);
    }
    gps_job_spec_clear(&s);
}

static void test_pool_options_header(void **st)
{
    (void)st;
    char msg[256];
    json_t *b = json_pack("{s:s}", "model", "m");
    assert_int_equal(gps_pool_options_merge_header(b, NULL, msg, sizeof msg), 0);
    assert_null(json_object_get(b, "x_pool_options"));
    assert_int_equal(gps_pool_options_merge_header(b, "{\"session\":\"s1\"}", msg, sizeof msg), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(b, "x_pool_options"),
                                                          "session")),
                        "s1");
    json_decref(b);

    b = json_pack("{s:{s:s}}", "x_pool_options", "session", "body");
    assert_int_equal(gps_pool_options_merge_header(b, "{\"session\":\"hdr\",\"priority\":\"batch\"}",
                                                   msg, sizeof msg),
                     0);
    json_t *xo = json_object_get(b, "x_pool_options");
    assert_string_equal(json_string_value(json_object_get(xo, "session")), "body");
    assert_string_equal(json_string_value(json_object_get(xo, "priority")), "batch");
    json_decref(b);

    const char *bad[] = {"{session", "[1]", "\"x\"", "", "{\"a\":1,\"a\":2}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        b = json_object();
        assert_int_equal(gps_pool_options_merge_header(b, bad[i], msg, sizeof msg), -1);
        assert_non_null(strstr(msg, "X-Pool-Options"));
        assert_null(json_object_get(b, "x_pool_options"));
        json_decref(b);
    }
    b = json_pack("{s:i}", "x_pool_options", 3);
    assert_int_equal(gps_pool_options_merge_header(b, "{}", msg, sizeof msg), -1);
    assert_string_equal(msg, "'x_pool_options' must be an object");
    json_decref(b);
}

/* A message's content: one string from a string or from text parts of
 * the accepted types; anything else refused, naming the field and the part. */
static void test_content_text(void **st)
{
    (void)st;
    static const char *const types[] = {"input_text", "text", NULL};
    char msg[256], *out = (char *)"unset";
    json_t *c = json_string("plain");
    assert_int_equal(gps_content_text(c, "input[0]", types, &out, msg, sizeof msg), 0);
    assert_string_equal(out, "plain");
    free(out);
    json_decref(c);
    c = json_loads("[{\"type\":\"input_text\",\"text\":\"a \"},{\"type\":\"text\",\"text\":\"b\"}]",
                   0, NULL);
    assert_int_equal(gps_content_text(c, "input[0]", types, &out, msg, sizeof msg), 0);
    assert_string_equal(out, "a b");
    free(out);
    json_decref(c);
    c = json_array(); /* no parts: the empty text */
    assert_int_equal(gps_content_text(c, "input[0]", types, &out, msg, sizeof msg), 0);
    assert_string_equal(out, "");
    free(out);
    json_decref(c);
    c = json_loads("[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"image_url\"}]", 0, NULL);
    assert_int_equal(gps_content_text(c, "messages[2]", types, &out, msg, sizeof msg), -1);
    assert_null(out);
    assert_string_equal(msg, "messages[2].content[1] must be {\"type\":\"input_text\",\"text\":"
                             "string} (only text parts are supported; got image_url)");
    json_decref(c);
    c = json_loads("[\"bare\"]", 0, NULL); /* a part that is not an object */
    assert_int_equal(gps_content_text(c, "messages[0]", types, &out, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "messages[0].content[0] must be"));
    json_decref(c);
    c = json_integer(3);
    assert_int_equal(gps_content_text(c, "input[4]", types, &out, msg, sizeof msg), -1);
    assert_string_equal(msg, "input[4].content must be a string or an array of text parts");
    json_decref(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_absent),
        cmocka_unit_test(test_check_number),
        cmocka_unit_test(test_priority),
        cmocka_unit_test(test_stop_and_sampling),
        cmocka_unit_test(test_fail_macro),
        cmocka_unit_test(test_pool_options_header),
        cmocka_unit_test(test_pool_options_tenant),
        cmocka_unit_test(test_content_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
