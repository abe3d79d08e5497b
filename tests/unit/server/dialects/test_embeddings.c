/*
 * embeddings.h: /v1/embeddings request parsing (the four input forms,
 * encoding_format, dimensions, user, bounds, the param each error names)
 * and the response (float and base64, dimensions checked, usage), plus
 * gp_util's base64 round trip.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/gp_util.h"
#include "server/dialects/embeddings.h"

static json_t *parse_ok(const char *text, gps_embed_req *r)
{
    char msg[256];
    const char *param = "x";
    json_t *b = json_loads(text, 0, NULL);
    assert_non_null(b);
    if (gps_embed_parse(b, 100, r, msg, sizeof msg, &param) != 0)
        fail_msg("%s: %s", text, msg);
    json_decref(b);
    return r->input;
}

static void parse_fail(const char *text, const char *want_param)
{
    char msg[256];
    const char *param = NULL;
    gps_embed_req r;
    json_t *b = json_loads(text, 0, NULL);
    assert_non_null(b);
    assert_int_equal(gps_embed_parse(b, 100, &r, msg, sizeof msg, &param), -1);
    if (!param || strcmp(param, want_param) != 0)
        fail_msg("%s: param %s, want %s (%s)", text, param ? param : "NULL", want_param, msg);
    json_decref(b);
}

static void test_parse_forms(void **state)
{
    (void)state;
    gps_embed_req r;
    json_t *in = parse_ok("{\"model\":\"m\",\"input\":\"hello\"}", &r);
    assert_int_equal(json_array_size(in), 1);
    assert_string_equal(json_string_value(json_array_get(in, 0)), "hello");
    assert_false(r.base64);
    assert_int_equal(r.dimensions, 0);
    gps_embed_req_clear(&r);

    in = parse_ok("{\"model\":\"m\",\"input\":[\"a\",\"b\"],\"encoding_format\":\"base64\","
                  "\"dimensions\":64,\"user\":\"u\"}", &r);
    assert_int_equal(json_array_size(in), 2);
    assert_true(r.base64);
    assert_int_equal(r.dimensions, 64);
    assert_string_equal(r.user, "u");
    gps_embed_req_clear(&r);

    in = parse_ok("{\"model\":\"m\",\"input\":[1,2,3]}", &r);
    assert_int_equal(json_array_size(in), 1);
    assert_int_equal(json_array_size(json_array_get(in, 0)), 3);
    gps_embed_req_clear(&r);

    in = parse_ok("{\"model\":\"m\",\"input\":[[1,2],[3]],\"encoding_format\":\"float\"}", &r);
    assert_int_equal(json_array_size(in), 2);
    gps_embed_req_clear(&r);
}

static void test_parse_errors(void **state)
{
    (void)state;
    parse_fail("{\"input\":\"a\"}", "model");
    parse_fail("{\"model\":\"m\"}", "input");
    parse_fail("{\"model\":\"m\",\"input\":\"\"}", "input");
    parse_fail("{\"model\":\"m\",\"input\":[]}", "input");
    parse_fail("{\"model\":\"m\",\"input\":[\"a\",\"\"]}", "input");
    parse_fail("{\"model\":\"m\",\"input\":[\"a\",1]}", "input");
    parse_fail("{\"model\":\"m\",\"input\":[[1],[-1]]}", "input");
    parse_fail("{\"model\":\"m\",\"input\":[[]]}", "input");
    parse_fail("{\"model\":\"m\",\"input\":{}}", "input");
    parse_fail("{\"model\":\"m\",\"input\":\"a\",\"encoding_format\":\"int8\"}",
               "encoding_format");
    parse_fail("{\"model\":\"m\",\"input\":\"a\",\"dimensions\":0}", "dimensions");
    parse_fail("{\"model\":\"m\",\"input\":\"a\",\"dimensions\":\"8\"}", "dimensions");
    parse_fail("{\"model\":\"m\",\"input\":\"a\",\"user\":5}", "user");

    /* 2048 inputs pass, 2049 do not; token arrays bounded by the context. */
    json_t *b = json_pack("{s:s,s:[]}", "model", "m", "input");
    for (int i = 0; i < GPS_EMBED_MAX_INPUTS; i++)
        json_array_append_new(json_object_get(b, "input"), json_string("x"));
    gps_embed_req r;
    char msg[256];
    const char *param;
    assert_int_equal(gps_embed_parse(b, 100, &r, msg, sizeof msg, &param), 0);
    gps_embed_req_clear(&r);
    json_array_append_new(json_object_get(b, "input"), json_string("x"));
    assert_int_equal(gps_embed_parse(b, 100, &r, msg, sizeof msg, &param), -1);
    assert_string_equal(param, "input");
    json_decref(b);

    b = json_pack("{s:s,s:[[i],[]]}", "model", "m", "input", 1);
    json_t *long_in = json_array_get(json_object_get(b, "input"), 1);
    for (int i = 0; i < 101; i++)
        json_array_append_new(long_in, json_integer(1));
    assert_int_equal(gps_embed_parse(b, 100, &r, msg, sizeof msg, &param), -1);
    assert_string_equal(param, "input");
    assert_non_null(strstr(msg, "input[1]"));
    assert_int_equal(gps_embed_parse(b, 0, &r, msg, sizeof msg, &param), 0); /* ctx unknown */
    gps_embed_req_clear(&r);
    json_decref(b);
}

static void test_response(void **state)
{
    (void)state;
    const float v0[3] = {1.0f, -0.5f, 0.25f}, v1[3] = {0.0f, 2.0f, -3.0f};
    char *b0 = gp_base64_encode(v0, sizeof v0), *b1 = gp_base64_encode(v1, sizeof v1);
    json_t *vecs = json_pack("[s,s]", b0, b1);
    gps_embed_req r;
    json_t *in = parse_ok("{\"model\":\"m\",\"input\":[\"a\",\"b\"]}", &r);
    (void)in;
    char msg[256];
    const char *param;
    json_t *out;
    assert_int_equal(gps_embed_response(&r, "served", vecs, 7, &out, msg, sizeof msg, &param), 0);
    assert_non_null(out);
    assert_string_equal(json_string_value(json_object_get(out, "object")), "list");
    assert_string_equal(json_string_value(json_object_get(out, "model")), "served");
    json_t *d1 = json_array_get(json_object_get(out, "data"), 1);
    assert_int_equal(json_integer_value(json_object_get(d1, "index")), 1);
    json_t *e = json_object_get(d1, "embedding");
    assert_int_equal(json_array_size(e), 3);
    assert_true(json_real_value(json_array_get(e, 2)) == -3.0);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(out, "usage"),
                                                        "total_tokens")), 7);
    json_decref(out);

    r.base64 = true;
    assert_int_equal(gps_embed_response(&r, "m", vecs, 7, &out, msg, sizeof msg, &param), 0);
    d1 = json_array_get(json_object_get(out, "data"), 0);
    assert_string_equal(json_string_value(json_object_get(d1, "embedding")), b0);
    json_decref(out);

    r.dimensions = 2;
    assert_int_equal(gps_embed_response(&r, "m", vecs, 7, &out, msg, sizeof msg, &param), -1);
    assert_null(out);
    assert_string_equal(param, "dimensions");
    r.dimensions = 3;
    json_array_set_new(vecs, 1, json_null());
    assert_int_equal(gps_embed_response(&r, "m", vecs, 7, &out, msg, sizeof msg, &param), -1);
    assert_null(out);
    assert_null(param);
    gps_embed_req_clear(&r);
    json_decref(vecs);
    free(b0);
    free(b1);
}

static void test_base64(void **state)
{
    (void)state;
    static const char *const plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *const enc[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=",
                                      "Zm9vYmFy"};
    for (size_t i = 0; i < 7; i++) {
        char *e = gp_base64_encode(plain[i], strlen(plain[i]));
        assert_string_equal(e, enc[i]);
        size_t n = 99;
        unsigned char *d = gp_base64_decode(e, strlen(e), &n);
        assert_non_null(d);
        assert_int_equal(n, strlen(plain[i]));
        assert_memory_equal(d, plain[i], n);
        free(d);
        free(e);
    }
    size_t n;
    assert_null(gp_base64_decode("Zm9", 3, &n));
    assert_null(gp_base64_decode("Zm!v", 4, &n));
    assert_null(gp_base64_decode("Z===", 4, &n));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_forms),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_response),
        cmocka_unit_test(test_base64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
