/* openai_schema: which parts of an openai-backend reply are held to which
 * schema (issue 26): the text to response_format (after a failed-over
 * job's continuation), the arguments of strict tools' calls only, nothing
 * when the job asks for nothing; schemas that cannot be checked refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "agent/openai_schema.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nothing_to_check),
        cmocka_unit_test(test_text_with_continuation),
        cmocka_unit_test(test_strict_tools_only),
        cmocka_unit_test(test_unsupported_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
