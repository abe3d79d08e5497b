/* OpenAI dialect: request validation (every field) and the JSON of chunks
 * and responses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/dialects/api_openai.h"

/* Parse text; expect success. Caller clears out->spec. */
static void ok(const char *text, bool chat, gps_openai_req *out)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    assert_non_null(j);
    char msg[256];
    const char *param = NULL;
    int rc = gps_openai_parse(j, chat, out, msg, sizeof msg, &param);
    if (rc != 0)
        fail_msg("unexpected error for %s: %s (param %s)", text, msg, param ? param : "-");
    json_decref(j);
}

/* Parse text; expect a 400 naming param. */
static void bad(const char *text, bool chat, const char *want_param)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j)
        fail_msg("test JSON does not parse: %s", text);
    gps_openai_req out;
    char msg[256] = "";
    const char *param = "unset";
    int rc = gps_openai_parse(j, chat, &out, msg, sizeof msg, &param);
    json_decref(j);
    if (rc != -1)
        fail_msg("accepted: %s", text);
    if (want_param == NULL ? param != NULL : (param == NULL || strcmp(param, want_param) != 0))
        fail_msg("%s: param %s, want %s (msg %s)", text, param ? param : "NULL",
                 want_param ? want_param : "NULL", msg);
    assert_true(msg[0] != '\0');
    /* nothing left to free */
    assert_null(out.spec.model);
    assert_null(out.spec.messages);
}

#define M "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static void test_chat_ok(void **st)
{
    (void)st;
    gps_openai_req r;
    ok("{\"model\":\"m\"," M "}", true, &r);
    assert_string_equal(r.spec.model, "m");
    assert_int_equal(r.spec.kind, GPS_JOB_CHAT);
    assert_int_equal(r.spec.max_tokens, 1024);
    assert_true(r.spec.temperature == 1.0 && r.spec.top_p == 1.0);
    assert_false(r.stream);
    assert_null(r.spec.stop);
    assert_false(r.spec.has_seed);
    gps_job_spec_clear(&r.spec);

    ok("{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
       "\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":\"c\",\"name\":\"x\"}],"
       "\"max_tokens\":5,\"temperature\":0,\"top_p\":0.5,\"stop\":\"END\",\"seed\":-3,"
       "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"user\":\"u\",\"n\":1,"
       "\"presence_penalty\":0.5,\"top_k\":40,"
       "\"x_pool_options\":{\"priority\":\"batch\",\"prefer_agent\":\"box1\","
       "\"session\":\"s1\",\"labels\":{\"region\":\"eu\"}}}",
       true, &r);
    assert_int_equal(json_array_size(r.spec.messages), 3);
    json_t *m0 = json_array_get(r.spec.messages, 0);
    assert_string_equal(json_string_value(json_object_get(m0, "role")), "system");
    json_t *m1 = json_array_get(r.spec.messages, 1);
    assert_string_equal(json_string_value(json_object_get(m1, "content")), "ab");
    assert_int_equal(r.spec.max_tokens, 5);
    assert_true(r.spec.temperature == 0 && r.spec.top_p == 0.5);
    assert_int_equal(json_array_size(r.spec.stop), 1);
    assert_string_equal(json_string_value(json_array_get(r.spec.stop, 0)), "END");
    assert_true(r.spec.has_seed);
    assert_int_equal(r.spec.seed, -3);
    assert_true(r.stream && r.include_usage);
    assert_string_equal(r.spec.user, "u");
    assert_int_equal(r.spec.top_k, 40);
    assert_int_equal(r.spec.priority, GPS_PRIO_BATCH);
    assert_string_equal(r.spec.prefer_agent, "box1");
    assert_string_equal(r.spec.session, "s1");
    assert_int_equal(r.spec.n_labels, 1);
    assert_string_equal(r.spec.labels[0].key, "region");
    assert_string_equal(r.spec.labels[0].value, "eu");
    gps_job_spec_clear(&r.spec);

    /* max_completion_tokens, nulls everywhere, 4 stops */
    ok("{\"model\":\"m\"," M ",\"max_completion_tokens\":9,\"temperature\":null,\"stop\":"
       "[\"a\",\"b\",\"c\",\"d\"],\"seed\":null,\"stream\":null,\"n\":null,\"user\":null}",
       true, &r);
    assert_int_equal(r.spec.max_tokens, 9);
    assert_int_equal(json_array_size(r.spec.stop), 4);
    gps_job_spec_clear(&r.spec);
}

static void test_completion_ok(void **st)
{
    (void)st;
    gps_openai_req r;
    ok("{\"model\":\"m\",\"prompt\":\"Once\"}", false, &r);
    assert_int_equal(r.spec.kind, GPS_JOB_COMPLETION);
    assert_string_equal(r.spec.prompt, "Once");
    assert_int_equal(r.spec.max_tokens, 16);
    gps_job_spec_clear(&r.spec);
    ok("{\"model\":\"m\",\"prompt\":[\"x\"],\"echo\":false,\"best_of\":1,\"logprobs\":null}",
       false, &r);
    assert_string_equal(r.spec.prompt, "x");
    gps_job_spec_clear(&r.spec);
    ok("{\"model\":\"m\",\"prompt\":\"\"}", false, &r);
    gps_job_spec_clear(&r.spec);
}

static void test_bad_fields(void **st)
{
    (void)st;
    bad("[]", true, NULL);
    bad("{" M "}", true, "model");
    bad("{\"model\":null," M "}", true, "model");
    bad("{\"model\":1," M "}", true, "model");
    bad("{\"model\":\"\"," M "}", true, "model");
    bad("{\"model\":\"m\"}", true, "messages");
    bad("{\"model\":\"m\",\"messages\":{}}", true, "messages");
    bad("{\"model\":\"m\",\"messages\":[]}", true, "messages");
    bad("{\"model\":\"m\",\"messages\":[1]}", true, "messages");
    bad("{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}", true, "messages");
    bad("{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", true, "messages");
    bad("{\"model\":\"m\",\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}", true, "messages");
    bad("{\"model\":\"m\",\"messages\":[{\"role\":3,\"content\":\"x\"}]}", true, "messages");
    bad("{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}", true, "messages");
    bad("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", true, "messages");
    bad("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
        true, "messages");
    bad("{\"model\":\"m\"," M ",\"max_tokens\":0}", true, "max_tokens");
    bad("{\"model\":\"m\"," M ",\"max_tokens\":-1}", true, "max_tokens");
    bad("{\"model\":\"m\"," M ",\"max_tokens\":2.5}", true, "max_tokens");
    bad("{\"model\":\"m\"," M ",\"max_tokens\":\"5\"}", true, "max_tokens");
    bad("{\"model\":\"m\"," M ",\"max_tokens\":100000000}", true, "max_tokens");
    bad("{\"model\":\"m\"," M ",\"max_completion_tokens\":0}", true, "max_completion_tokens");
    bad("{\"model\":\"m\"," M ",\"temperature\":-0.1}", true, "temperature");
    bad("{\"model\":\"m\"," M ",\"temperature\":2.01}", true, "temperature");
    bad("{\"model\":\"m\"," M ",\"temperature\":\"1\"}", true, "temperature");
    bad("{\"model\":\"m\"," M ",\"top_p\":1.01}", true, "top_p");
    bad("{\"model\":\"m\"," M ",\"top_p\":-1}", true, "top_p");
    bad("{\"model\":\"m\"," M ",\"top_p\":true}", true, "top_p");
    bad("{\"model\":\"m\"," M ",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", true, "stop");
    bad("{\"model\":\"m\"," M ",\"stop\":[\"a\",1]}", true, "stop");
    bad("{\"model\":\"m\"," M ",\"stop\":{}}", true, "stop");
    bad("{\"model\":\"m\"," M ",\"seed\":1.5}", true, "seed");
    bad("{\"model\":\"m\"," M ",\"seed\":\"1\"}", true, "seed");
    bad("{\"model\":\"m\"," M ",\"stream\":1}", true, "stream");
    bad("{\"model\":\"m\"," M ",\"stream\":true,\"stream_options\":[]}", true, "stream_options");
    bad("{\"model\":\"m\"," M ",\"stream_options\":{\"include_usage\":true}}", true,
        "stream_options");
    bad("{\"model\":\"m\"," M ",\"stream\":true,\"stream_options\":{\"include_usage\":1}}", true,
        "stream_options");
    bad("{\"model\":\"m\"," M ",\"user\":5}", true, "user");
    bad("{\"model\":\"m\"," M ",\"n\":2}", true, "n");
    bad("{\"model\":\"m\"," M ",\"n\":\"1\"}", true, "n");
    bad("{\"model\":\"m\"," M ",\"presence_penalty\":3}", true, "presence_penalty");
    bad("{\"model\":\"m\"," M ",\"frequency_penalty\":-3}", true, "frequency_penalty");
    bad("{\"model\":\"m\"," M ",\"top_k\":-1}", true, "top_k");
    bad("{\"model\":\"m\"," M ",\"tools\":[{\"type\":\"function\"}]}", true, "tools");
    bad("{\"model\":\"m\"," M ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
        "{\"name\":\"x\",\"schema\":{\"type\":\"integer\",\"multipleOf\":2}}}}", true,
        "response_format");
    bad("{\"model\":\"m\"," M ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
        "{\"schema\":{}}}}", true, "response_format");
    bad("{\"model\":\"m\"," M ",\"response_format\":{\"type\":\"xml\"}}", true,
        "response_format");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"response_format\":{\"type\":\"json_object\"}}",
        false, "response_format");
    bad("{\"model\":\"m\"," M ",\"x_pool_options\":[]}", true, "x_pool_options");
    bad("{\"model\":\"m\"," M ",\"x_pool_options\":{\"labels\":{\"region\":1}}}", true,
        "x_pool_options.labels");
    bad("{\"model\":\"m\"," M ",\"x_pool_options\":{\"labels\":[]}}", true,
        "x_pool_options.labels");
    bad("{\"model\":\"m\"," M ",\"x_pool_options\":{\"session\":\"\"}}", true,
        "x_pool_options.session");
    bad("{\"model\":\"m\"," M ",\"x_pool_options\":{\"priority\":\"urgent\"}}", true,
        "x_pool_options.priority");
    /* completions */
    bad("{\"model\":\"m\"}", false, "prompt");
    bad("{\"model\":\"m\",\"prompt\":5}", false, "prompt");
    bad("{\"model\":\"m\",\"prompt\":[1,2]}", false, "prompt");
    bad("{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", false, "prompt");
    bad("{\"model\":\"m\",\"prompt\":\"x\",\"echo\":true}", false, "echo");
    bad("{\"model\":\"m\",\"prompt\":\"x\",\"best_of\":2}", false, "best_of");
    bad("{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":5}", false, "logprobs");
    bad("{\"model\":\"m\",\"prompt\":\"x\",\"suffix\":\"s\"}", false, "suffix");
}

/* Structured output: json_object and json_schema reach the job spec in
 * the chat form; an unsupported keyword is refused by name. */
static void test_response_format(void **st)
{
    (void)st;
    gps_openai_req r;
    ok("{\"model\":\"m\"," M ",\"response_format\":{\"type\":\"text\"}}", true, &r);
    assert_null(r.spec.response_format);
    gps_job_spec_clear(&r.spec);
    ok("{\"model\":\"m\"," M ",\"response_format\":{\"type\":\"json_object\"}}", true, &r);
    assert_string_equal(json_string_value(json_object_get(r.spec.response_format, "type")),
                        "json_object");
    gps_job_spec_clear(&r.spec);
    ok("{\"model\":\"m\"," M ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
       "{\"name\":\"person\",\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":"
       "{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"],\"additionalProperties\":false}}}}",
       true, &r);
    json_t *js = json_object_get(r.spec.response_format, "json_schema");
    assert_string_equal(json_string_value(json_object_get(js, "name")), "person");
    assert_true(json_is_true(json_object_get(js, "strict")));
    assert_true(json_is_object(json_object_get(js, "schema")));
    gps_job_spec_clear(&r.spec);

    json_t *j = json_loads("{\"model\":\"m\"," M ",\"response_format\":{\"type\":"
                           "\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":"
                           "\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":"
                           "\"hostname\"}}}}}}", 0, NULL);
    char msg[256] = "";
    const char *param = NULL;
    assert_int_equal(gps_openai_parse(j, true, &r, msg, sizeof msg, &param), -1);
    json_decref(j);
    assert_string_equal(param, "response_format");
    if (!strstr(msg, "'format'") || !strstr(msg, "#/properties/d"))
        fail_msg("message does not name the keyword and where: %s", msg);
}

static void test_chunks(void **st)
{
    (void)st;
    json_t *c = gps_openai_chunk(true, "chatcmpl-1", 1700000000, "m", "", true, NULL, false);
    char *s = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(s, "{\"choices\":[{\"delta\":{\"content\":\"\",\"role\":\"assistant\"},"
                           "\"finish_reason\":null,\"index\":0,\"logprobs\":null}],"
                           "\"created\":1700000000,\"id\":\"chatcmpl-1\",\"model\":\"m\","
                           "\"object\":\"chat.completion.chunk\",\"system_fingerprint\":\"gpupool\"}");
    free(s);
    json_decref(c);

    c = gps_openai_chunk(true, "x", 1, "m", NULL, false, "length", true);
    json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
    assert_int_equal(json_object_size(json_object_get(ch, "delta")), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "length");
    assert_true(json_is_null(json_object_get(c, "usage")));
    json_decref(c);

    c = gps_openai_chunk(false, "cmpl-1", 1, "m", "tok", false, NULL, false);
    assert_string_equal(json_string_value(json_object_get(c, "object")), "text_completion");
    ch = json_array_get(json_object_get(c, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "text")), "tok");
    assert_null(json_object_get(c, "usage"));
    json_decref(c);

    c = gps_openai_usage_chunk(true, "x", 1, "m", 4, 6);
    assert_int_equal(json_array_size(json_object_get(c, "choices")), 0);
    json_t *u = json_object_get(c, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), 4);
    assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 6);
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), 10);
    json_decref(c);
}

static void test_response(void **st)
{
    (void)st;
    json_t *meta = json_pack("{s:s,s:i,s:i,s:i}", "agent_id", "a1", "queue_ms", 3,
                             "inference_ms", 40, "attempts", 1);
    json_t *r = gps_openai_response(true, "chatcmpl-9", 5, "m", "Hello", "stop", 2, 1, meta);
    assert_string_equal(json_string_value(json_object_get(r, "object")), "chat.completion");
    json_t *ch = json_array_get(json_object_get(r, "choices"), 0);
    json_t *msg = json_object_get(ch, "message");
    assert_string_equal(json_string_value(json_object_get(msg, "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "Hello");
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(r, "usage"),
                                                        "total_tokens")), 3);
    assert_string_equal(json_string_value(json_object_get(json_object_get(r, "x_pool_meta"),
                                                          "agent_id")), "a1");
    json_decref(r);
    r = gps_openai_response(false, "cmpl-9", 5, "m", "t", "", 0, 0, NULL);
    ch = json_array_get(json_object_get(r, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "text")), "t");
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    assert_null(json_object_get(r, "x_pool_meta"));
    json_decref(r);
}

static void test_tools(void **st)
{
    (void)st;
    gps_openai_req r;
    ok("{\"model\":\"m\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
       "\"parameters\":{\"type\":\"object\"}}}],\"tool_choice\":{\"type\":\"function\","
       "\"function\":{\"name\":\"f\"}},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
       "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":"
       "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
       "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":[{\"type\":\"text\",\"text\":"
       "\"res\"}]}]}",
       true, &r);
    assert_int_equal(json_array_size(r.spec.tools), 1);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(r.spec.tool_choice, "function"), "name")),
                        "f");
    json_t *want = json_loads(
        "[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":null,"
        "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
        "\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"res\"}]",
        0, NULL);
    assert_true(json_equal(r.spec.messages, want));
    json_decref(want);
    gps_job_spec_clear(&r.spec);

    /* an empty tools array is no tools */
    ok("{\"model\":\"m\"," M ",\"tools\":[],\"tool_choice\":\"none\"}", true, &r);
    assert_null(r.spec.tools);
    assert_null(r.spec.tool_choice);
    gps_job_spec_clear(&r.spec);

    bad("{\"model\":\"m\"," M ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
        "\"tool_choice\":\"sometimes\"}",
        true, "tool_choice");
    bad("{\"model\":\"m\"," M ",\"tool_choice\":\"required\"}", true, "tool_choice");
    bad("{\"model\":\"m\"," M ",\"tools\":{}}", true, "tools");
    bad("{\"model\":\"m\",\"prompt\":\"x\",\"tools\":[{\"type\":\"function\",\"function\":"
        "{\"name\":\"f\"}}]}",
        false, "tools");
    bad("{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", true,
        "messages");
    bad("{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":"
        "[{\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":{}}}]}]}",
        true, "messages");
}

static void test_tool_calls_acc(void **st)
{
    (void)st;
    gps_tool_calls acc = {0};
    bool started = false;
    const char *evs[] = {
        "{\"index\":0,\"id\":\"call_a\",\"name\":\"f\",\"arguments\":\"{\\\"x\\\"\"}",
        "{\"index\":0,\"arguments\":\":1}\"}",
        "{\"index\":1,\"name\":\"g\"}",
    };
    int want_ix[] = {0, 0, 1};
    bool want_started[] = {true, false, true};
    for (size_t i = 0; i < 3; i++) {
        json_t *e = json_loads(evs[i], 0, NULL);
        assert_non_null(e);
        assert_int_equal(gps_tool_calls_add(&acc, e, &started), want_ix[i]);
        assert_int_equal(started, want_started[i]);
        json_decref(e);
    }
    /* skipping an index, a new call without a name: ignored */
    json_t *e = json_loads("{\"index\":5,\"name\":\"h\"}", 0, NULL);
    assert_int_equal(gps_tool_calls_add(&acc, e, &started), -1);
    json_decref(e);
    e = json_loads("{\"index\":2,\"arguments\":\"{}\"}", 0, NULL);
    assert_int_equal(gps_tool_calls_add(&acc, e, &started), -1);
    json_decref(e);
    json_t *got = gps_tool_calls_openai(&acc);
    json_t *want = json_loads(
        "[{\"id\":\"call_a\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
        "\"{\\\"x\\\":1}\"}},{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
        "\"g\",\"arguments\":\"\"}}]",
        0, NULL);
    assert_true(json_equal(got, want));
    json_decref(got);
    json_decref(want);
    gps_tool_calls_free(&acc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_ok),
        cmocka_unit_test(test_tools),
        cmocka_unit_test(test_tool_calls_acc),
        cmocka_unit_test(test_completion_ok),
        cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_response_format),
        cmocka_unit_test(test_chunks),
        cmocka_unit_test(test_response),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
