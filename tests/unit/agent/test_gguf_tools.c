/* Unit tests for the gguf backend's tool_choice schemas (src/agent/gguf_tools.c):
 * a forced call's shape per family, the name fixed or one of the tools,
 * the tool's parameters when they can be enforced, and the refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "agent/gguf_tools.h"

static json_t *tools_of(const char *text)
{
    json_t *t = json_loads(text, 0, NULL);
    assert_non_null(t);
    return t;
}

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"c\":{\"type\":\"string\"}},\"required\":[\"c\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"ls\"}}]";

static void test_named_chatml(void **state)
{
    (void)state;
    json_t *tools = tools_of(TOOLS);
    char err[256] = "";
    bool oom;
    json_t *s = gguf_tools_call_schema("chatml", tools, "w", &oom, err, sizeof err);
    assert_non_null(s);
    json_t *props = json_object_get(s, "properties");
    assert_string_equal(json_string_value(json_object_get(json_object_get(props, "name"),
                                                          "const")), "w");
    /* the tool's own parameters */
    assert_true(json_equal(json_object_get(props, "arguments"),
                           json_object_get(json_object_get(json_array_get(tools, 0), "function"),
                                           "parameters")));
    assert_true(json_is_false(json_object_get(s, "additionalProperties")));
    json_decref(s);
    json_decref(tools);
}

static void test_required_any_and_families(void **state)
{
    (void)state;
    json_t *tools = tools_of(TOOLS);
    char err[256] = "";
    bool oom;
    /* several candidates: one call object per tool, told apart by the name */
    json_t *s = gguf_tools_call_schema("llama-3", tools, NULL, &oom, err, sizeof err);
    assert_non_null(s);
    json_t *alts = json_object_get(s, "anyOf");
    assert_int_equal(json_array_size(alts), 2);
    json_t *p0 = json_object_get(json_array_get(alts, 0), "properties");
    json_t *p1 = json_object_get(json_array_get(alts, 1), "properties");
    assert_string_equal(json_string_value(json_object_get(json_object_get(p0, "name"), "const")),
                        "w");
    assert_true(json_equal(json_object_get(p0, "parameters"),
                           json_object_get(json_object_get(json_array_get(tools, 0), "function"),
                                           "parameters")));
    /* a tool without parameters: any object */
    assert_string_equal(json_string_value(json_object_get(json_object_get(p1, "parameters"),
                                                          "type")), "object");
    json_decref(s);
    s = gguf_tools_call_schema("mistral", tools, "ls", &oom, err, sizeof err);
    assert_non_null(s);
    assert_string_equal(json_string_value(json_object_get(s, "type")), "array");
    assert_int_equal(json_integer_value(json_object_get(s, "minItems")), 1);
    json_decref(s);
    json_decref(tools);
}

static void test_refusals(void **state)
{
    (void)state;
    json_t *tools = tools_of(TOOLS);
    char err[256] = "";
    bool oom;
    assert_null(gguf_tools_call_schema("chatml", tools, "nope", &oom, err, sizeof err));
    assert_false(oom);
    assert_non_null(strstr(err, "'nope'"));
    json_decref(tools);
    tools = tools_of("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,"
                     "\"parameters\":{\"type\":\"object\",\"properties\":{\"n\":{\"type\":"
                     "\"integer\",\"multipleOf\":3}}}}}]");
    err[0] = '\0';
    assert_null(gguf_tools_call_schema("chatml", tools, "f", &oom, err, sizeof err));
    assert_false(oom);
    assert_non_null(strstr(err, "multipleOf"));
    /* not strict: the arguments are held to an object only */
    json_object_del(json_object_get(json_array_get(tools, 0), "function"), "strict");
    json_t *s = gguf_tools_call_schema("chatml", tools, "f", &oom, err, sizeof err);
    assert_non_null(s);
    json_decref(s);
    json_decref(tools);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_named_chatml),
        cmocka_unit_test(test_required_any_and_families),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
