/* The one error-body builder (errors.h): every dialect's shape, and the
 * same facts (param, retry_after_sec) in the same place in each. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "server/http/errors.h"
#include "fixture_oom.h"

static void test_error_shapes(void **st)
{
    (void)st;
    json_t *o = gps_error_body(GPS_DIALECT_OPENAI, 400, "INVALID_REQUEST", "bad top_p", "top_p",
                               "c1", NULL);
    json_t *e = json_object_get(o, "error");
    assert_string_equal(json_string_value(json_object_get(e, "message")), "bad top_p");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(e, "param")), "top_p");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "invalid_request");
    json_decref(o);

    o = gps_error_body(GPS_DIALECT_OPENAI, 503, "NO_AGENT", "none", NULL, NULL,
                       json_pack("{s:i}", "retry_after_sec", 15));
    e = json_object_get(o, "error");
    assert_true(json_is_null(json_object_get(e, "param")));
    assert_int_equal(json_integer_value(json_object_get(e, "retry_after_sec")), 15);
    assert_string_equal(json_string_value(json_object_get(e, "type")), "service_unavailable");
    json_decref(o);

    o = gps_error_body(GPS_DIALECT_NATIVE, 409, "SEQ_GAP", "gap", NULL, "corr", NULL);
    e = json_object_get(o, "error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "SEQ_GAP");
    assert_string_equal(json_string_value(json_object_get(e, "correlation_id")), "corr");
    json_decref(o);

    o = gps_error_body(GPS_DIALECT_ANTHROPIC, 404, "NOT_FOUND", "nope", NULL, NULL, NULL);
    assert_string_equal(json_string_value(json_object_get(o, "type")), "error");
    e = json_object_get(o, "error");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "not_found_error");
    json_decref(o);

    assert_string_equal(gps_openai_error_type(401), "authentication_error");
    assert_string_equal(gps_openai_error_type(429), "rate_limit_error");
    assert_string_equal(gps_openai_error_type(500), "server_error");
}

/* retry_after_sec sits in the error object beside the message in every
 * dialect (it was flat in OpenAI, missing in Anthropic and nested under
 * details in native); param names the field everywhere. */
static void test_error_same_fields_every_dialect(void **st)
{
    (void)st;
    const gps_dialect ds[] = {GPS_DIALECT_OPENAI, GPS_DIALECT_ANTHROPIC, GPS_DIALECT_NATIVE};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
        json_t *o = gps_error_body_retry(ds[i], 429, "QUEUE_FULL", "full", NULL, "c", 7);
        json_t *e = json_object_get(o, "error");
        assert_int_equal(json_integer_value(json_object_get(e, "retry_after_sec")), 7);
        assert_string_equal(json_string_value(json_object_get(e, "message")), "full");
        assert_null(json_object_get(e, "details"));
        json_decref(o);

        o = gps_error_body_retry(ds[i], 404, "MODEL_NOT_FOUND", "no such model", "model", "c",
                                 0);
        e = json_object_get(o, "error");
        assert_null(json_object_get(e, "retry_after_sec"));
        const json_t *param = ds[i] == GPS_DIALECT_NATIVE
                                  ? json_object_get(json_object_get(e, "details"), "param")
                                  : json_object_get(e, "param");
        assert_string_equal(json_string_value(param), "model");
        json_decref(o);
    }
    /* Anthropic without a param: no param field (its own shape has none). */
    json_t *o = gps_error_body_retry(GPS_DIALECT_ANTHROPIC, 500, "INTERNAL", "x", NULL, NULL, 0);
    assert_null(json_object_get(json_object_get(o, "error"), "param"));
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "error"), "type")),
                        "api_error");
    json_decref(o);
}

/* One error body under a failing allocator: every run gives the whole
 * body (json_equal to the one built with memory) or NULL, which
 * gps_http_send_json answers with its fixed 500; never one without its
 * message, code, type, param or retry_after_sec. extra_json (may be NULL)
 * is parsed afresh for each run, before the allocator is armed. */
static void sweep(gps_dialect d, int status, const char *code, const char *message,
                  const char *param, const char *corr, const char *extra_json, int retry)
{
    json_t *want = retry ? gps_error_body_retry(d, status, code, message, param, corr, retry)
                         : gps_error_body(d, status, code, message, param, corr,
                                          extra_json ? J(extra_json) : NULL);
    assert_non_null(want);
    size_t bad = 0, refused = 0, n;
    for (n = 1;; n++) {
        json_t *extra = extra_json ? J(extra_json) : NULL;
        arm(n);
        json_t *got = retry ? gps_error_body_retry(d, status, code, message, param, corr, retry)
                            : gps_error_body(d, status, code, message, param, corr, extra);
        bool hit = disarm();
        if (got && !json_equal(got, want)) {
            print_message("dialect %d, run %zu: an error with a part missing\n", (int)d, n);
            print_diff("body", got, want);
            bad++;
        }
        refused += !got;
        json_decref(got);
        if (!hit)
            break;
    }
    assert_true(n > 3); /* the sweep reached the builder's allocations */
    assert_true(refused > 0);
    assert_int_equal(bad, 0);
    json_decref(want);
}

static void test_error_body_oom(void **st)
{
    (void)st;
    const gps_dialect ds[] = {GPS_DIALECT_OPENAI, GPS_DIALECT_ANTHROPIC, GPS_DIALECT_NATIVE};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
        sweep(ds[i], 400, "INVALID_REQUEST", "bad top_p", "top_p", "corr-1", NULL, 0);
        sweep(ds[i], 404, "MODEL_NOT_FOUND", "no such model", NULL, NULL, NULL, 0);
        sweep(ds[i], 429, "QUEUE_FULL", "full", "model", "corr-2", NULL, 7);
        sweep(ds[i], 409, "SEQ_GAP", "gap", NULL, "corr-3",
              "{\"expected_seq\":4,\"details\":{\"have\":[1,2]}}", 0);
    }
}

/* A message cut in the middle of a character ("%.256s" of a client's
 * text): the bytes that are not UTF-8 become U+FFFD, the rest stays, and
 * the error is still whole (jansson refuses the string as it is). */
static void test_error_message_not_utf8(void **st)
{
    (void)st;
    const gps_dialect ds[] = {GPS_DIALECT_OPENAI, GPS_DIALECT_ANTHROPIC, GPS_DIALECT_NATIVE};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
        json_t *o = gps_error_body(ds[i], 404, "MODEL_NOT_FOUND", "model 'caf\xc3' not found",
                                   "mod\xff" "el", NULL, NULL);
        assert_non_null(o);
        json_t *e = json_object_get(o, "error");
        assert_string_equal(json_string_value(json_object_get(e, "message")),
                            "model 'caf\xef\xbf\xbd' not found");
        const json_t *param = ds[i] == GPS_DIALECT_NATIVE
                                  ? json_object_get(json_object_get(e, "details"), "param")
                                  : json_object_get(e, "param");
        assert_string_equal(json_string_value(param), "mod\xef\xbf\xbd" "el");
        json_decref(o);
    }
    sweep(GPS_DIALECT_NATIVE, 404, "MODEL_NOT_FOUND", "model 'caf\xc3' not found", NULL, "c",
          NULL, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_shapes),
        cmocka_unit_test(test_error_same_fields_every_dialect),
        cmocka_unit_test(test_error_body_oom),
        cmocka_unit_test(test_error_message_not_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
