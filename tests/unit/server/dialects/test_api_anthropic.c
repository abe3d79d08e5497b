/* Anthropic dialect: request validation and mapping (system merge, blocks,
 * consecutive turns, tools, warnings), context clamp, stop-sequence scan
 * and the message body. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/gp_stop.h"
#include "server/dialects/api_anthropic.h"

static int parse(const char *text, bool count_only, gps_anthropic_req *out, char *msg,
                 size_t msglen)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j)
        fail_msg("test JSON does not parse: %s (%s)", text, je.text);
    int rc = gps_anthropic_parse(j, count_only, out, msg, msglen);
    json_decref(j);
    return rc;
}

static void ok(const char *text, gps_anthropic_req *out)
{
    char msg[512] = "";
    if (parse(text, false, out, msg, sizeof msg) != 0)
        fail_msg("unexpected error for %s: %s", text, msg);
}

/* Expect a 400 whose message contains want. */
static void bad(const char *text, const char *want)
{
    gps_anthropic_req out;
    char msg[512] = "";
    if (parse(text, false, &out, msg, sizeof msg) != -1)
        fail_msg("expected an error for %s", text);
    if (!strstr(msg, want))
        fail_msg("error for %s is '%s', expected it to mention '%s'", text, msg, want);
}

static const char *role_of(const gps_anthropic_req *r, size_t i)
{
    return json_string_value(json_object_get(json_array_get(r->spec.messages, i), "role"));
}

static const char *content_of(const gps_anthropic_req *r, size_t i)
{
    return json_string_value(json_object_get(json_array_get(r->spec.messages, i), "content"));
}

static bool has_warning(const gps_anthropic_req *r, const char *part)
{
    size_t i;
    json_t *w;
    json_array_foreach(r->warnings, i, w) if (strstr(json_string_value(w), part)) return true;
    return false;
}

static void test_basic(void **state)
{
    (void)state;
    gps_anthropic_req r;
    ok("{\"model\":\"m\",\"max_tokens\":100,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
       "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"stop_sequences\":[\"\\n\\nHuman:\"],"
       "\"metadata\":{\"user_id\":\"{\\\"session\\\":\\\"s1\\\"}\"},\"stream\":true}",
       &r);
    assert_string_equal(r.spec.model, "m");
    assert_int_equal(r.spec.kind, GPS_JOB_CHAT);
    assert_string_equal(r.spec.api, "anthropic");
    assert_int_equal(r.spec.max_tokens, 100);
    assert_true(r.spec.temperature == 0.5);
    assert_int_equal(r.spec.top_k, 40);
    assert_true(r.stream);
    assert_string_equal(r.spec.user, "{\"session\":\"s1\"}");
    assert_int_equal(json_array_size(r.stop_sequences), 1);
    /* Matched by the relay and given to the agent too (it stops before the
     * string and reports its usage and which string it was). */
    assert_true(json_equal(r.spec.stop, r.stop_sequences));
    assert_int_equal(json_array_size(r.warnings), 0);
    char msg[256];
    assert_int_equal(gps_anthropic_assemble(&r, 0, false, msg, sizeof msg), 0);
    assert_int_equal(json_array_size(r.spec.messages), 1);
    assert_string_equal(role_of(&r, 0), "user");
    assert_string_equal(content_of(&r, 0), "hi");
    gps_anthropic_req_clear(&r);
}

static void test_system_merge_and_turns(void **state)
{
    (void)state;
    gps_anthropic_req r;
    ok("{\"model\":\"m\",\"max_tokens\":10,"
       "\"system\":[{\"type\":\"text\",\"text\":\"A\",\"cache_control\":{\"type\":\"ephemeral\"}},"
       "{\"type\":\"text\",\"text\":\"B\"}],"
       "\"messages\":[{\"role\":\"user\",\"content\":\"u1\"},{\"role\":\"user\",\"content\":"
       "[{\"type\":\"text\",\"text\":\"u2\"}]},{\"role\":\"system\",\"content\":\"C\"},"
       "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\","
       "\"signature\":\"x\"},{\"type\":\"text\",\"text\":\"a1\"},{\"type\":\"tool_use\",\"id\":"
       "\"tu_1\",\"name\":\"Read\",\"input\":{\"path\":\"/x\"}}]},"
       "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"tu_1\","
       "\"content\":[{\"type\":\"text\",\"text\":\"file body\"}]}]}],"
       "\"thinking\":{\"type\":\"adaptive\"},\"context_management\":{\"edits\":[]}}",
       &r);
    char msg[256];
    assert_int_equal(gps_anthropic_assemble(&r, 0, false, msg, sizeof msg), 0);
    assert_int_equal(json_array_size(r.spec.messages), 4);
    assert_string_equal(role_of(&r, 0), "system");
    assert_string_equal(content_of(&r, 0), "A\n\nB\n\nC");
    assert_string_equal(role_of(&r, 1), "user");
    assert_string_equal(content_of(&r, 1), "u1\n\nu2");
    assert_string_equal(role_of(&r, 2), "assistant");
    assert_string_equal(content_of(&r, 2),
                        "a1\n[tool_use id=tu_1 name=Read] {\"path\":\"/x\"}");
    assert_string_equal(content_of(&r, 3), "[tool_result id=tu_1]\nfile body");
    assert_true(has_warning(&r, "thinking (adaptive)"));
    assert_true(has_warning(&r, "thinking blocks"));
    assert_true(has_warning(&r, "'context_management'"));
    gps_anthropic_req_clear(&r);
}

static void test_tools(void **state)
{
    (void)state;
    const char *body =
        "{\"model\":\"m\",\"max_tokens\":10,\"system\":\"S\",\"messages\":[{\"role\":\"user\","
        "\"content\":\"x\"}],\"tools\":[{\"name\":\"Bash\",\"description\":\"Run a command\","
        "\"input_schema\":{\"type\":\"object\",\"properties\":{\"command\":{\"type\":\"string\"}}}}],"
        "\"tool_choice\":{\"type\":\"auto\"}}";
    gps_anthropic_req r;
    char msg[256];
    ok(body, &r);
    assert_non_null(r.tools_text);
    assert_int_equal(gps_anthropic_assemble(&r, 0, true, msg, sizeof msg), 0);
    /* Taken: OpenAI function tools on the spec, the system prompt as is. */
    assert_string_equal(content_of(&r, 0), "S");
    assert_string_equal(content_of(&r, 1), "x");
    json_t *want = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"Bash\","
                              "\"description\":\"Run a command\",\"parameters\":{\"type\":"
                              "\"object\",\"properties\":{\"command\":{\"type\":\"string\"}}}}}]",
                              0, NULL);
    assert_true(json_equal(r.spec.tools, want));
    json_decref(want);
    assert_string_equal(json_string_value(r.spec.tool_choice), "auto");
    assert_false(has_warning(&r, "tools were ignored"));
    gps_anthropic_req_clear(&r);

    /* The conversation in OpenAI form: tool_use -> tool_calls, tool_result
     * -> role tool (before the user's text), is_error noted. */
    const char *turns =
        "{\"model\":\"m\",\"max_tokens\":10,\"tools\":[{\"name\":\"Bash\"}],"
        "\"tool_choice\":{\"type\":\"any\"},\"messages\":["
        "{\"role\":\"user\",\"content\":\"go\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"ok\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"Bash\",\"input\":{\"c\":1}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
        "\"is_error\":true,\"content\":[{\"type\":\"text\",\"text\":\"boom\"}]},"
        "{\"type\":\"text\",\"text\":\"now?\"}]}]}";
    ok(turns, &r);
    assert_int_equal(gps_anthropic_assemble(&r, 0, true, msg, sizeof msg), 0);
    want = json_loads(
        "[{\"role\":\"user\",\"content\":\"go\"},"
        "{\"role\":\"assistant\",\"content\":\"ok\",\"tool_calls\":[{\"id\":\"toolu_1\","
        "\"type\":\"function\",\"function\":{\"name\":\"Bash\",\"arguments\":\"{\\\"c\\\":1}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\",\"content\":\"Error: boom\"},"
        "{\"role\":\"user\",\"content\":\"now?\"}]",
        0, NULL);
    assert_non_null(want);
    assert_true(json_equal(r.spec.messages, want));
    json_decref(want);
    assert_string_equal(json_string_value(r.spec.tool_choice), "required");
    /* no input_schema: a function taking any object */
    json_t *params =
        json_object_get(json_object_get(json_array_get(r.spec.tools, 0), "function"), "parameters");
    assert_string_equal(json_string_value(json_object_get(params, "type")), "object");
    gps_anthropic_req_clear(&r);

    /* strict (structured outputs' strict tool use) is carried as given */
    ok("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\","
       "\"content\":\"x\"}],\"tools\":[{\"name\":\"a\",\"strict\":true,"
       "\"input_schema\":{\"type\":\"object\"}},{\"name\":\"b\"}]}",
       &r);
    assert_int_equal(gps_anthropic_assemble(&r, 0, true, msg, sizeof msg), 0);
    assert_true(json_is_true(json_object_get(
        json_object_get(json_array_get(r.spec.tools, 0), "function"), "strict")));
    assert_null(json_object_get(json_object_get(json_array_get(r.spec.tools, 1), "function"),
                                "strict"));
    gps_anthropic_req_clear(&r);
    bad("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\","
        "\"content\":\"x\"}],\"tools\":[{\"name\":\"a\",\"strict\":1}]}",
        "tools.0.strict: must be a boolean");

    /* tool_choice mapping, tool_use ids */
    json_t *tc = json_loads("{\"type\":\"tool\",\"name\":\"Bash\"}", 0, NULL);
    json_t *m = gps_anthropic_tool_choice_to_openai(tc);
    want = json_loads("{\"type\":\"function\",\"function\":{\"name\":\"Bash\"}}", 0, NULL);
    assert_true(json_equal(m, want));
    json_decref(tc);
    json_decref(m);
    json_decref(want);
    tc = json_loads("{\"type\":\"none\"}", 0, NULL);
    m = gps_anthropic_tool_choice_to_openai(tc);
    assert_string_equal(json_string_value(m), "none");
    json_decref(tc);
    json_decref(m);
    char id[64];
    gps_anthropic_tool_use_id("call_abc", id, sizeof id);
    assert_string_equal(id, "toolu_abc");
    gps_anthropic_tool_use_id("toolu_x", id, sizeof id);
    assert_string_equal(id, "toolu_x");
    gps_anthropic_tool_use_id("77", id, sizeof id);
    assert_string_equal(id, "toolu_77");

    ok(body, &r);
    assert_int_equal(gps_anthropic_assemble(&r, 0, false, msg, sizeof msg), 0);
    assert_string_equal(content_of(&r, 0), "S");
    assert_true(has_warning(&r, "tools were ignored"));
    gps_anthropic_req_clear(&r);
}

static void test_bad(void **state)
{
    (void)state;
    bad("[]", "JSON object");
    bad("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "model");
    bad("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "max_tokens");
    bad("{\"model\":\"m\",\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        "max_tokens");
    bad("{\"model\":\"m\",\"max_tokens\":1.5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        "max_tokens");
    bad("{\"model\":\"m\",\"max_tokens\":1,\"messages\":[]}", "at least one");
    bad("{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}",
        "at least one");
    bad("{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}",
        "messages.0.role");
    bad("{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
        "\"image\",\"source\":{}}]}]}",
        "'image'");
    bad("{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
        "\"document\",\"source\":{}}]}]}",
        "'document'");
    bad("{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
        "\"tool_result\",\"tool_use_id\":\"t\",\"content\":[{\"type\":\"image\"}]}]}]}",
        "'image'");
    bad("{\"model\":\"m\",\"max_tokens\":1,\"temperature\":1.5,\"messages\":[{\"role\":\"user\","
        "\"content\":\"x\"}]}",
        "temperature");
    bad("{\"model\":\"m\",\"max_tokens\":1,\"stop_sequences\":[\"\"],\"messages\":[{\"role\":"
        "\"user\",\"content\":\"x\"}]}",
        "stop_sequences.0");
    bad("{\"model\":\"m\",\"max_tokens\":1,\"system\":[{\"type\":\"image\"}],\"messages\":[{"
        "\"role\":\"user\",\"content\":\"x\"}]}",
        "system.0");
    bad("{\"model\":\"m\",\"max_tokens\":1,\"tools\":[{\"description\":\"no name\"}],\"messages\":"
        "[{\"role\":\"user\",\"content\":\"x\"}]}",
        "tools.0");
    bad("{\"model\":\"m\",\"max_tokens\":1,\"x_pool_options\":{\"priority\":\"urgent\"},"
        "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        "priority");
    /* count_tokens needs no max_tokens */
    gps_anthropic_req r;
    char msg[256];
    assert_int_equal(parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                           true, &r, msg, sizeof msg),
                     0);
    assert_true(r.count_only);
    gps_anthropic_req_clear(&r);
}

static void test_context_clamp(void **state)
{
    (void)state;
    gps_anthropic_req r;
    char msg[512];
    /* 80 bytes of prompt: at least 10 tokens. */
    ok("{\"model\":\"m\",\"max_tokens\":32000,\"messages\":[{\"role\":\"user\",\"content\":"
       "\"01234567890123456789012345678901234567890123456789012345678901234567890123456789\"}]}",
       &r);
    assert_int_equal(r.prompt_bytes, 80);
    assert_int_equal(gps_anthropic_tokens_lower_bound(80), 10);
    assert_int_equal(gps_anthropic_assemble(&r, 512, false, msg, sizeof msg), 0);
    assert_int_equal(r.spec.max_tokens, 502);
    assert_true(has_warning(&r, "max_tokens 32000 was clamped to 502"));
    gps_anthropic_req_clear(&r);

    ok("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
       "\"01234567890123456789012345678901234567890123456789012345678901234567890123456789\"}]}",
       &r);
    assert_int_equal(gps_anthropic_assemble(&r, 8, false, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "at least 10 tokens"));
    assert_non_null(strstr(msg, "> 8 tokens"));
    gps_anthropic_req_clear(&r);
}

static void test_stop_scan(void **state)
{
    (void)state;
    json_t *stops = json_pack("[s,s]", "END", "\n\nHuman:");
    size_t safe, at;
    assert_int_equal(gp_stop_scan("hello world", 11, stops, &safe, &at), -1);
    assert_int_equal(safe, 11);
    /* "EN" could start "END": held back */
    assert_int_equal(gp_stop_scan("the EN", 6, stops, &safe, &at), -1);
    assert_int_equal(safe, 4);
    assert_int_equal(gp_stop_scan("the END of", 10, stops, &safe, &at), 0);
    assert_int_equal(at, 4);
    assert_int_equal(safe, 4);
    /* the earliest match wins, whatever the order of the list */
    assert_int_equal(gp_stop_scan("a\n\nHuman: b END", 15, stops, &safe, &at), 1);
    assert_int_equal(at, 1);
    assert_int_equal(gp_stop_scan("x\n\nHu", 5, stops, &safe, &at), -1);
    assert_int_equal(safe, 1);
    assert_int_equal(gp_stop_scan("", 0, stops, &safe, &at), -1);
    assert_int_equal(safe, 0);
    json_decref(stops);
}

static void test_message_body(void **state)
{
    (void)state;
    assert_string_equal(gps_anthropic_stop_reason("stop"), "end_turn");
    assert_string_equal(gps_anthropic_stop_reason("length"), "max_tokens");
    json_t *m = gps_anthropic_message("msg_1", "m", "Hello", "stop_sequence", "END", 5, 2,
                                      json_pack("{s:s}", "agent_id", "a1"));
    assert_string_equal(json_string_value(json_object_get(m, "type")), "message");
    assert_string_equal(json_string_value(json_object_get(m, "role")), "assistant");
    json_t *c0 = json_array_get(json_object_get(m, "content"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "type")), "text");
    assert_string_equal(json_string_value(json_object_get(c0, "text")), "Hello");
    assert_string_equal(json_string_value(json_object_get(m, "stop_sequence")), "END");
    json_t *u = json_object_get(m, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "input_tokens")), 5);
    assert_int_equal(json_integer_value(json_object_get(u, "output_tokens")), 2);
    assert_non_null(json_object_get(m, "x_pool_meta"));
    json_decref(m);
    m = gps_anthropic_message("msg_2", "m", "", "end_turn", NULL, -1, 0, NULL);
    assert_true(json_is_null(json_object_get(m, "stop_sequence")));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(m, "usage"),
                                                        "input_tokens")), 0);
    json_decref(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic),
        cmocka_unit_test(test_system_merge_and_turns),
        cmocka_unit_test(test_tools),
        cmocka_unit_test(test_bad),
        cmocka_unit_test(test_context_clamp),
        cmocka_unit_test(test_stop_scan),
        cmocka_unit_test(test_message_body),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
