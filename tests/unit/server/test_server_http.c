/* Routing table (404/405, params) and dialect error shapes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "server/http.h"

static void h(gps_req *r, void *arg) { (void)r; (void)arg; }

static const gps_route routes[] = {
    {EVHTTP_REQ_POST, "/v1/chat/completions", GPS_DIALECT_OPENAI, GPS_ROLE_CLIENT, h, NULL},
    {EVHTTP_REQ_GET, "/v1/models", GPS_DIALECT_OPENAI, GPS_ROLE_CLIENT, h, NULL},
    {EVHTTP_REQ_POST, "/agents/jobs/{id}/events", GPS_DIALECT_NATIVE, GPS_ROLE_AGENT, h, NULL},
    {EVHTTP_REQ_GET, "/v2/tasks/{id}", GPS_DIALECT_NATIVE, GPS_ROLE_CLIENT, h, NULL},
    {EVHTTP_REQ_DELETE, "/v2/tasks/{id}", GPS_DIALECT_NATIVE, GPS_ROLE_CLIENT, h, NULL},
};
#define N (sizeof routes / sizeof routes[0])

static void test_lookup_found(void **st)
{
    (void)st;
    const gps_route *r = NULL;
    char p[GPS_ROUTE_MAX_PARAMS][GPS_ROUTE_PARAM_MAX];
    int np = -1;
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_POST, "/v1/chat/completions", &r, p, &np), 0);
    assert_ptr_equal(r, &routes[0]);
    assert_int_equal(np, 0);
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_GET, "/v1/models/", &r, p, &np), 0);
    assert_ptr_equal(r, &routes[1]);
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_POST, "/agents/jobs/job_abc/events", &r, p, &np), 0);
    assert_ptr_equal(r, &routes[2]);
    assert_int_equal(np, 1);
    assert_string_equal(p[0], "job_abc");
    /* same pattern, two methods */
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_DELETE, "/v2/tasks/t1", &r, p, &np), 0);
    assert_ptr_equal(r, &routes[4]);
    assert_string_equal(p[0], "t1");
}

static void test_lookup_404_405(void **st)
{
    (void)st;
    const gps_route *r = NULL;
    char p[GPS_ROUTE_MAX_PARAMS][GPS_ROUTE_PARAM_MAX];
    int np;
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_GET, "/v1/nothing", &r, p, &np), 404);
    assert_null(r);
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_GET, "/v1/chat/completionsX", &r, p, &np), 404);
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_GET, "/v1/chat", &r, p, &np), 404);
    /* an empty parameter segment does not match */
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_POST, "/agents/jobs//events", &r, p, &np), 404);
    /* a parameter never spans segments */
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_POST, "/agents/jobs/a/b/events", &r, p, &np), 404);
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_GET, "/v1/chat/completions", &r, p, &np), 405);
    assert_ptr_equal(r, &routes[0]);
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_PUT, "/v2/tasks/x", &r, p, &np), 405);
    assert_int_equal(r->dialect, GPS_DIALECT_NATIVE);
    /* a parameter longer than the buffer does not match (no truncation) */
    char longp[400] = "/v2/tasks/";
    memset(longp + 10, 'a', 300);
    longp[310] = '\0';
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_GET, longp, &r, p, &np), 404);
}

static void test_dialect_for_path(void **st)
{
    (void)st;
    assert_int_equal(gps_dialect_for_path("/v1/whatever"), GPS_DIALECT_OPENAI);
    assert_int_equal(gps_dialect_for_path("/v1/messages"), GPS_DIALECT_ANTHROPIC);
    assert_int_equal(gps_dialect_for_path("/agents/x"), GPS_DIALECT_NATIVE);
    assert_int_equal(gps_dialect_for_path("/"), GPS_DIALECT_NATIVE);
    assert_int_equal(gps_dialect_for_path("/v10/x"), GPS_DIALECT_NATIVE);
}

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup_found),
        cmocka_unit_test(test_lookup_404_405),
        cmocka_unit_test(test_dialect_for_path),
        cmocka_unit_test(test_error_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
