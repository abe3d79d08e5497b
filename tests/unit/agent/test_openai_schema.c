/* openai_schema: which parts of an openai-backend reply are held to which
 * schema (issue 26): the text to response_format (after a failed-over
 * job's continuation), the arguments of strict tools' calls only, nothing
 * when the job asks for nothing; schemas that cannot be checked refused;
 * and the reply parser's verdict only for a reply that ran its course (not
 * one cut by max_tokens or a stop string). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "agent/openai_schema.h"
#include "agent/openai_stream.h"

static oai_schema *from(const char *job_json, int want_rc, char *err, size_t errlen)
{
    json_t *job = json_loads(job_json, 0, NULL);
    assert_non_null(job);
    oai_schema *c = NULL;
    err[0] = '\0';
    assert_int_equal(oai_schema_new(job, &c, err, errlen), want_rc);
    json_decref(job);
    return c;
}

#define RF "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"r\",\"schema\":" \
           "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}}," \
           "\"required\":[\"n\"]}}}"

static void test_nothing_to_check(void **state)
{
    (void)state;
    char err[300];
    assert_null(from("{\"kind\":\"chat\"}", 0, err, sizeof err));
    assert_null(from("{\"response_format\":{\"type\":\"text\"},\"tools\":[{\"type\":"
                     "\"function\",\"function\":{\"name\":\"f\"}}]}", 0, err, sizeof err));
    assert_int_equal(oai_schema_verdict(NULL, err, sizeof err), 0);
}

static void test_text_with_continuation(void **state)
{
    (void)state;
    char err[300], msg[600];
    oai_schema *c = from("{\"response_format\":" RF ",\"continuation\":\"{\\\"n\\\"\"}", 0,
                         err, sizeof err);
    assert_non_null(c);
    oai_schema_text(c, ":4", 2);
    oai_schema_text(c, "}", 1);
    assert_int_equal(oai_schema_verdict(c, msg, sizeof msg), 0);
    oai_schema_free(c);
    c = from("{\"response_format\":" RF "}", 0, err, sizeof err);
    oai_schema_text(c, "{\"n\":\"4\"}", 9);
    assert_int_equal(oai_schema_verdict(c, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "response_format schema: at /n: a string"));
    oai_schema_free(c);
    /* json_object: any object */
    c = from("{\"response_format\":{\"type\":\"json_object\"}}", 0, err, sizeof err);
    oai_schema_text(c, " {\"x\":[]} ", 10);
    assert_int_equal(oai_schema_verdict(c, msg, sizeof msg), 0);
    oai_schema_free(c);
}

static void test_strict_tools_only(void **state)
{
    (void)state;
    char err[300], msg[600];
    oai_schema *c = from(
        "{\"response_format\":" RF ",\"tools\":["
        "{\"type\":\"function\",\"function\":{\"name\":\"loose\",\"parameters\":{\"type\":"
        "\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"tight\",\"strict\":true,"
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
        "\"required\":[\"a\"],\"additionalProperties\":false}}}]}",
        0, err, sizeof err);
    assert_non_null(c);
    /* a call of the loose tool with bad arguments, then a good strict call
     * in two pieces: the reply's text (none) is not held to the format */
    oai_schema_tool(c, 0, "loose", "{\"a\":\"x\"}", 9);
    oai_schema_tool(c, 1, "tight", "{\"a\"", 4);
    oai_schema_tool(c, 1, NULL, ":1}", 3);
    assert_int_equal(oai_schema_verdict(c, msg, sizeof msg), 0);
    oai_schema_tool(c, 2, "tight", "{}", 2);
    assert_int_equal(oai_schema_verdict(c, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "tool call 2 (tight)"));
    assert_non_null(strstr(msg, "required property 'a' is missing"));
    oai_schema_free(c);
}

static void test_unsupported_refused(void **state)
{
    (void)state;
    char err[300];
    assert_null(from("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                     "\"strict\":true,\"parameters\":{\"type\":\"object\",\"properties\":"
                     "{\"a\":{\"not\":{}}}}}}]}",
                     -1, err, sizeof err));
    assert_non_null(strstr(err, "tool 'f' is strict"));
    assert_non_null(strstr(err, "'not' at #/properties/a"));
}

/* ---- the reply parser asks for the verdict only when the reply ran its
 * course (openai_stream.c finish_ok) ---- */

typedef struct sinkrec {
    int ends, errors;
    char finish[32], code[64], msg[600];
} sinkrec;

static void s_started(void *c) { (void)c; }
static void s_token(void *c, const char *t, size_t n, int32_t id)
{
    (void)c, (void)t, (void)n, (void)id;
}
static void s_metrics(void *c, json_t *m) { (void)c, (void)m; }
static void s_end(void *c, const char *fr, long long pt, long long ct)
{
    sinkrec *r = c;
    (void)pt, (void)ct;
    r->ends++;
    snprintf(r->finish, sizeof r->finish, "%s", fr);
}
static void s_error(void *c, const char *code, const char *msg)
{
    sinkrec *r = c;
    r->errors++;
    snprintf(r->code, sizeof r->code, "%s", code);
    snprintf(r->msg, sizeof r->msg, "%s", msg);
}

/* An SSE reply of chat deltas texts[] ending with finish, through a stream
 * held to RF (stops: the job's params.stop or NULL). */
static sinkrec run_reply(const char *const *texts, const char *finish, json_t *stops)
{
    sinkrec r = {0};
    agent_job_sink sink = {.ctx = &r, .started = s_started, .token = s_token,
                           .metrics = s_metrics, .end = s_end, .error = s_error};
    char err[300];
    oai_schema *c = from("{\"response_format\":" RF "}", 0, err, sizeof err);
    oai_stream st;
    oai_stream_init(&st, &sink, "job1", true, false, stops, 4096);
    st.check = c;
    const char *hdrs[] = {"HTTP/1.1 200 OK\r\n", "Content-Type: text/event-stream\r\n",
                          "\r\n"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(oai_stream_header(&st, hdrs[i], strlen(hdrs[i])), 0);
    char line[512];
    for (int i = 0; texts[i]; i++) {
        json_t *d = json_pack("{s:[{s:i,s:{s:s},s:n}]}", "choices", "index", 0, "delta",
                              "content", texts[i], "finish_reason");
        char *js = json_dumps(d, JSON_COMPACT);
        snprintf(line, sizeof line, "data: %s\n\n", js);
        free(js);
        json_decref(d);
        oai_stream_body(&st, line, strlen(line));
    }
    snprintf(line, sizeof line, "data: {\"choices\":[{\"index\":0,\"delta\":{},"
             "\"finish_reason\":\"%s\"}]}\n\ndata: [DONE]\n\n", finish);
    oai_stream_body(&st, line, strlen(line));
    oai_stream_finish(&st, NULL, NULL);
    oai_stream_free(&st);
    oai_schema_free(c);
    return r;
}

static void test_verdict_only_when_run_its_course(void **state)
{
    (void)state;
    const char *const bad[] = {"{\"n\":", "\"4\"}", NULL};
    sinkrec r = run_reply(bad, "stop", NULL);
    assert_int_equal(r.errors, 1);
    assert_int_equal(r.ends, 0);
    assert_string_equal(r.code, "UPSTREAM_INVALID_OUTPUT");
    assert_non_null(strstr(r.msg, "at /n: a string"));
    /* cut by max_tokens: the finish says so, no check */
    const char *cut[] = {"{\"n\":", "4", NULL};
    r = run_reply(cut, "length", NULL);
    assert_int_equal(r.errors, 0);
    assert_string_equal(r.finish, "length");
    /* cut by one of the job's stop strings: likewise */
    json_t *stops = json_pack("[s]", "4");
    r = run_reply(cut, "stop", stops);
    json_decref(stops);
    if (r.errors)
        fail_msg("%s: %s", r.code, r.msg);
    assert_int_equal(r.ends, 1);
    const char *good[] = {"{\"n\"", ":4}", NULL};
    r = run_reply(good, "stop", NULL);
    assert_int_equal(r.errors, 0);
    assert_string_equal(r.finish, "stop");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nothing_to_check),
        cmocka_unit_test(test_text_with_continuation),
        cmocka_unit_test(test_strict_tools_only),
        cmocka_unit_test(test_unsupported_refused),
        cmocka_unit_test(test_verdict_only_when_run_its_course),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
