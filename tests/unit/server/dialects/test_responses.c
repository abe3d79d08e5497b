/* responses: the Responses API request into a chat job spec (input string
 * and items, instructions, function calls and their outputs, tools and
 * tool_choice, refusals naming the field) and the response object and
 * stream events out of what a job produced (the event sequence the SDK's
 * ResponseStream accumulates, sequence numbers, incomplete on length). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/dialects/responses.h"

static json_t *J(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    if (!j)
        fprintf(stderr, "bad test JSON: %s\n", e.text);
    assert_non_null(j);
    return j;
}

static int parse(const char *body, gps_resp_req *r, char *msg, const char **param)
{
    json_t *b = J(body);
    int rc = gps_resp_parse(b, r, msg, 512, param);
    json_decref(b);
    return rc;
}

static void test_input_string_and_instructions(void **st)
{
    (void)st;
    gps_resp_req r;
    char msg[512];
    const char *param;
    assert_int_equal(parse("{\"model\":\"m\",\"input\":\"Hi\",\"instructions\":\"Be brief.\","
                           "\"max_output_tokens\":7,\"temperature\":0.5,\"stream\":true,"
                           "\"metadata\":{\"k\":\"v\"}}",
                           &r, msg, &param),
                     0);
    assert_string_equal(r.spec.model, "m");
    assert_int_equal(r.spec.kind, GPS_JOB_CHAT);
    assert_int_equal(r.spec.max_tokens, 7);
    assert_true(r.stream);
    json_t *m = r.spec.messages;
    assert_int_equal(json_array_size(m), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(m, 0), "role")),
                        "system");
    assert_string_equal(json_string_value(json_object_get(json_array_get(m, 1), "content")),
                        "Hi");
    assert_string_equal(json_string_value(json_object_get(r.echo, "instructions")), "Be brief.");
    assert_int_equal(json_integer_value(json_object_get(r.echo, "max_output_tokens")), 7);
    assert_true(json_is_true(json_object_get(r.echo, "store"))); /* store defaults on */
    assert_true(r.store);
    assert_int_equal(r.n_instr, 1);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(r.echo, "metadata"), "k")), "v");
    gps_resp_req_clear(&r);
}

/* text.format json_schema reaches the job spec in the chat form; the
 * response object repeats the format as given. */
static void test_text_format_json_schema(void **st)
{
    (void)st;
    gps_resp_req r;
    char msg[512];
    const char *param;
    assert_int_equal(parse("{\"model\":\"m\",\"input\":\"Hi\",\"text\":{\"format\":{\"type\":"
                           "\"json_schema\",\"name\":\"p\",\"strict\":true,\"schema\":{\"type\":"
                           "\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}}}}",
                           &r, msg, &param),
                     0);
    json_t *rf = r.spec.response_format;
    assert_string_equal(json_string_value(json_object_get(rf, "type")), "json_schema");
    json_t *js = json_object_get(rf, "json_schema");
    assert_string_equal(json_string_value(json_object_get(js, "name")), "p");
    assert_true(json_is_true(json_object_get(js, "strict")));
    json_t *echo = json_object_get(json_object_get(r.echo, "text"), "format");
    assert_string_equal(json_string_value(json_object_get(echo, "name")), "p");
    gps_resp_req_clear(&r);
    assert_int_equal(parse("{\"model\":\"m\",\"input\":\"Hi\",\"text\":{\"format\":{\"type\":"
                           "\"json_object\"}}}", &r, msg, &param), 0);
    assert_string_equal(json_string_value(json_object_get(r.spec.response_format, "type")),
                        "json_object");
    gps_resp_req_clear(&r);
}

static void test_items_with_function_calls(void **st)
{
    (void)st;
    gps_resp_req r;
    char msg[512];
    const char *param;
    assert_int_equal(
        parse("{\"model\":\"m\",\"input\":["
              "{\"role\":\"developer\",\"content\":\"sys\"},"
              "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\","
              "\"text\":\"weather \"},{\"type\":\"input_text\",\"text\":\"in Paris?\"}]},"
              "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[]},"
              "{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"get_weather\","
              "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"},"
              "{\"type\":\"function_call\",\"call_id\":\"call_2\",\"name\":\"get_time\","
              "\"arguments\":\"{}\"},"
              "{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"sunny\"},"
              "{\"type\":\"function_call_output\",\"call_id\":\"call_2\",\"output\":\"noon\"},"
              "{\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"ok\"}]}],"
              "\"tools\":[{\"type\":\"function\",\"name\":\"get_weather\",\"description\":\"d\","
              "\"parameters\":{\"type\":\"object\"}}],"
              "\"tool_choice\":{\"type\":\"function\",\"name\":\"get_weather\"}}",
              &r, msg, &param),
        0);
    json_t *m = r.spec.messages;
    assert_int_equal(json_array_size(m), 6);
    const char *roles[] = {"system", "user", "assistant", "tool", "tool", "assistant"};
    for (size_t i = 0; i < 6; i++)
        assert_string_equal(json_string_value(json_object_get(json_array_get(m, i), "role")),
                            roles[i]);
    assert_string_equal(json_string_value(json_object_get(json_array_get(m, 1), "content")),
                        "weather in Paris?");
    json_t *calls = json_object_get(json_array_get(m, 2), "tool_calls");
    assert_int_equal(json_array_size(calls), 2);
    assert_true(json_is_null(json_object_get(json_array_get(m, 2), "content")));
    assert_string_equal(json_string_value(json_object_get(json_array_get(calls, 1), "id")),
                        "call_2");
    assert_string_equal(
        json_string_value(json_object_get(
            json_object_get(json_array_get(calls, 0), "function"), "arguments")),
        "{\"city\":\"Paris\"}");
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(m, 3), "tool_call_id")), "call_1");
    /* Tools in chat shape for the agent, as given for the echo. */
    json_t *fn = json_object_get(json_array_get(r.spec.tools, 0), "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
    assert_string_equal(json_string_value(json_object_get(fn, "description")), "d");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(r.spec.tool_choice, "function"),
                                          "name")),
        "get_weather");
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(json_object_get(r.echo, "tools"), 0),
                                          "name")),
        "get_weather");
    gps_resp_req_clear(&r);
}

/* strict is carried as the request gives it, and only then (OpenAI's
 * default true is not assumed: docs/api.md "Tools"). */
static void test_tool_strict_is_carried_when_given(void **st)
{
    (void)st;
    gps_resp_req r;
    char msg[512];
    const char *param;
    assert_int_equal(parse("{\"model\":\"m\",\"input\":\"x\",\"tools\":["
                           "{\"type\":\"function\",\"name\":\"a\",\"strict\":true,"
                           "\"parameters\":{\"type\":\"object\"}},"
                           "{\"type\":\"function\",\"name\":\"b\",\"strict\":false},"
                           "{\"type\":\"function\",\"name\":\"c\"}]}",
                           &r, msg, &param),
                     0);
    json_t *fa = json_object_get(json_array_get(r.spec.tools, 0), "function");
    json_t *fb = json_object_get(json_array_get(r.spec.tools, 1), "function");
    json_t *fc = json_object_get(json_array_get(r.spec.tools, 2), "function");
    assert_true(json_is_true(json_object_get(fa, "strict")));
    assert_true(json_is_false(json_object_get(fb, "strict")));
    assert_null(json_object_get(fc, "strict"));
    gps_resp_req_clear(&r);

    assert_int_equal(parse("{\"model\":\"m\",\"input\":\"x\",\"tools\":["
                           "{\"type\":\"function\",\"name\":\"a\",\"strict\":\"yes\"}]}",
                           &r, msg, &param),
                     -1);
    assert_non_null(strstr(msg, "tools[0].strict must be a boolean"));
    assert_string_equal(param, "tools");
    gps_resp_req_clear(&r);
}

static void test_hosted_tools_are_dropped_with_a_warning(void **st)
{
    (void)st;
    gps_resp_req r;
    char msg[512];
    const char *param;
    assert_int_equal(parse("{\"model\":\"m\",\"input\":\"x\",\"tools\":["
                           "{\"type\":\"web_search\",\"external_web_access\":false},"
                           "{\"type\":\"function\",\"name\":\"f\"},"
                           "{\"type\":\"namespace\",\"name\":\"n\",\"tools\":[]}]}",
                           &r, msg, &param),
                     0);
    assert_int_equal(json_array_size(r.spec.tools), 1);
    assert_int_equal(json_array_size(r.warnings), 2);
    assert_non_null(strstr(json_string_value(json_array_get(r.warnings, 0)), "'web_search'"));
    gps_resp_req_clear(&r);
    /* Only hosted tools: the job carries none. */
    assert_int_equal(parse("{\"model\":\"m\",\"input\":\"x\",\"tools\":["
                           "{\"type\":\"web_search\"}]}",
                           &r, msg, &param),
                     0);
    assert_null(r.spec.tools);
    gps_resp_req_clear(&r);
}

static void test_refusals_name_the_field(void **st)
{
    (void)st;
    struct {
        const char *body, *param, *words;
    } cases[] = {
        {"{\"input\":\"x\"}", "model", "'model'"},
        {"{\"model\":\"m\"}", "input", "'input' is required"},
        {"{\"model\":\"m\",\"input\":[]}", "input", "non-empty"},
        {"{\"model\":\"m\",\"input\":\"x\",\"previous_response_id\":7}",
         "previous_response_id", "a response id"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"item_reference\"}]}", "input",
         "needs a string id"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"input_image\"}]}", "input", "input_image"},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":"
         "\"input_image\",\"image_url\":\"x\"}]}]}",
         "input", "only text parts"},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "input",
         "not supported"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"function_call\",\"name\":\"f\"}]}", "input",
         "call_id"},
        {"{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens",
         "between 1"},
        {"{\"model\":\"m\",\"input\":\"x\",\"temperature\":3}", "temperature", "temperature"},
        {"{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":"
         "\"f\"}],\"tool_choice\":{\"type\":\"function\",\"name\":\"g\"}}",
         "tool_choice", "not a function in"},
        {"{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}", "tools",
         "\"name\":string"},
        {"{\"model\":\"m\",\"input\":\"x\",\"tool_choice\":\"required\"}", "tool_choice",
         "needs 'tools'"},
        {"{\"model\":\"m\",\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\"}}}",
         "text.format", "text.format.name"},
        {"{\"model\":\"m\",\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\","
         "\"name\":\"n\",\"schema\":{\"type\":\"array\",\"uniqueItems\":true}}}}",
         "text.format", "'uniqueItems'"},
        {"{\"model\":\"m\",\"input\":\"x\",\"text\":{\"format\":{\"type\":\"yaml\"}}}",
         "text.format", "json_schema"},
        {"{\"model\":\"m\",\"input\":\"x\",\"background\":true}", "background", "background"},
        {"{\"model\":\"m\",\"input\":\"x\",\"stream\":\"yes\"}", "stream", "boolean"},
        {"{\"model\":\"m\",\"input\":\"x\",\"stop\":[\"a\"]}", "stop", "not a Responses"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gps_resp_req r;
        char msg[512] = "";
        const char *param = NULL;
        assert_int_equal(parse(cases[i].body, &r, msg, &param), -1);
        if (!param || strcmp(param, cases[i].param) != 0 || !strstr(msg, cases[i].words)) {
            fprintf(stderr, "case %zu: param %s msg %s\n", i, param ? param : "(null)", msg);
            fail();
        }
        assert_null(r.echo);
        assert_null(r.warnings);
        assert_null(r.spec.messages);
    }
}

/* Split an SSE buffer into its data JSON objects, checking that each
 * event's name is its type and that sequence numbers count up from 0. */
static json_t *events(const gp_buf *b)
{
    json_t *out = json_array();
    const char *p = b->data, *end = b->data + b->len;
    long long seq = 0;
    while (p && p < end) {
        const char *e = strstr(p, "\n\n");
        assert_non_null(e);
        char name[80] = "";
        const char *ev = strstr(p, "event: ");
        assert_true(ev == p);
        sscanf(ev + 7, "%79[^\n]", name);
        const char *d = strstr(p, "data: ");
        assert_non_null(d);
        json_t *j = json_loadb(d + 6, (size_t)(e - d - 6), 0, NULL);
        assert_non_null(j);
        assert_string_equal(json_string_value(json_object_get(j, "type")), name);
        assert_int_equal(json_integer_value(json_object_get(j, "sequence_number")), seq++);
        json_array_append_new(out, j);
        p = e + 2;
    }
    return out;
}

static const char *type_at(json_t *evs, size_t i)
{
    return json_string_value(json_object_get(json_array_get(evs, i), "type"));
}

static void test_stream_text_then_call(void **st)
{
    (void)st;
    json_t *echo = J("{\"store\":false,\"tools\":[],\"tool_choice\":\"auto\"}");
    gps_resp_out o;
    gps_resp_out_init(&o, "m", echo);
    gp_buf sse;
    gp_buf_init(&sse);
    gps_tool_calls calls = {0};
    gps_resp_open(&o, &sse);
    gps_resp_text(&o, &sse, "Hel", 3);
    gps_resp_text(&o, &sse, "lo", 2);
    json_t *ev = J("{\"type\":\"tool_call\",\"index\":0,\"id\":\"call_9\",\"name\":\"f\","
                   "\"arguments\":\"{\\\"a\\\":\"}");
    bool started = false;
    assert_int_equal(gps_tool_calls_add(&calls, ev, &started), 0);
    gps_resp_call(&o, &sse, &calls, 0, started, "{\"a\":");
    json_decref(ev);
    ev = J("{\"type\":\"tool_call\",\"index\":0,\"arguments\":\"1}\"}");
    assert_int_equal(gps_tool_calls_add(&calls, ev, &started), 0);
    gps_resp_call(&o, &sse, &calls, 0, started, "1}");
    json_decref(ev);
    gps_resp_close(&o, &sse, &calls, "tool_calls", 5, 7, json_pack("{s:s}", "agent_id", "a"));

    json_t *evs = events(&sse);
    const char *want[] = {"response.created", "response.in_progress",
                          "response.output_item.added", "response.content_part.added",
                          "response.output_text.delta", "response.output_text.delta",
                          "response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.output_item.added",
                          "response.function_call_arguments.delta",
                          "response.function_call_arguments.delta",
                          "response.function_call_arguments.done",
                          "response.output_item.done", "response.completed"};
    assert_int_equal(json_array_size(evs), sizeof want / sizeof want[0]);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        assert_string_equal(type_at(evs, i), want[i]);
    assert_string_equal(json_string_value(json_object_get(json_array_get(evs, 6), "text")),
                        "Hello");
    json_t *call_added = json_object_get(json_array_get(evs, 9), "item");
    assert_int_equal(json_integer_value(json_object_get(json_array_get(evs, 9), "output_index")),
                     1);
    assert_string_equal(json_string_value(json_object_get(call_added, "call_id")), "call_9");
    assert_string_equal(json_string_value(json_object_get(call_added, "arguments")), "");
    json_t *resp = json_object_get(json_array_get(evs, 14), "response");
    assert_string_equal(json_string_value(json_object_get(resp, "status")), "completed");
    assert_string_equal(json_string_value(json_object_get(resp, "id")), o.id);
    json_t *out = json_object_get(resp, "output");
    assert_int_equal(json_array_size(out), 2);
    assert_string_equal(
        json_string_value(json_object_get(
            json_array_get(json_object_get(json_array_get(out, 0), "content"), 0), "text")),
        "Hello");
    assert_string_equal(json_string_value(json_object_get(json_array_get(out, 1), "arguments")),
                        "{\"a\":1}");
    json_t *u = json_object_get(resp, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "input_tokens")), 5);
    assert_int_equal(json_integer_value(json_object_get(u, "output_tokens")), 7);
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), 12);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(resp, "x_pool_meta"), "agent_id")),
        "a");
    assert_true(json_is_false(json_object_get(resp, "store")));
    json_decref(evs);
    gp_buf_free(&sse);
    gps_tool_calls_free(&calls);
    gps_resp_out_clear(&o);
    json_decref(echo);
}

static void test_incomplete_and_whole_body(void **st)
{
    (void)st;
    gps_resp_out o;
    gps_resp_out_init(&o, "m", NULL);
    gp_buf sse;
    gp_buf_init(&sse);
    gps_resp_open(&o, &sse);
    gps_resp_text(&o, &sse, "abc", 3);
    gps_resp_close(&o, &sse, &(gps_tool_calls){0}, "length", 1, 3, NULL);
    json_t *evs = events(&sse);
    size_t n = json_array_size(evs);
    assert_string_equal(type_at(evs, n - 1), "response.incomplete");
    json_t *resp = json_object_get(json_array_get(evs, n - 1), "response");
    assert_string_equal(json_string_value(json_object_get(resp, "status")), "incomplete");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(resp, "incomplete_details"), "reason")),
                        "max_output_tokens");
    json_decref(evs);
    gp_buf_free(&sse);
    gps_resp_out_clear(&o);

    gps_resp_out_init(&o, "m", NULL);
    json_t *body = gps_resp_object(&o, &(gps_tool_calls){0}, "whole", 5, "stop", 2, 1, NULL);
    assert_string_equal(json_string_value(json_object_get(body, "object")), "response");
    assert_string_equal(json_string_value(json_object_get(body, "status")), "completed");
    json_t *item = json_array_get(json_object_get(body, "output"), 0);
    assert_string_equal(json_string_value(json_object_get(item, "type")), "message");
    assert_string_equal(json_string_value(json_object_get(item, "role")), "assistant");
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(json_object_get(item, "content"), 0),
                                          "text")),
        "whole");
    json_decref(body);
    gps_resp_out_clear(&o);
}

/* previous_response_id and item_reference: marked at parse, spliced from
 * what the store gave back. */
static void test_stored_state_splice(void **st)
{
    (void)st;
    gps_resp_req r;
    char msg[512];
    const char *param;
    assert_int_equal(parse("{\"model\":\"m\",\"instructions\":\"I\",\"store\":false,"
                           "\"previous_response_id\":\"resp_p\",\"input\":["
                           "{\"type\":\"item_reference\",\"id\":\"fc_1\"},"
                           "{\"type\":\"function_call_output\",\"call_id\":\"c1\","
                           "\"output\":\"42\"},"
                           "{\"type\":\"item_reference\",\"id\":\"msg_9\"}]}",
                           &r, msg, &param),
                     0);
    assert_false(r.store);
    assert_string_equal(r.prev_id, "resp_p");
    assert_int_equal(json_array_size(r.refs), 2);
    assert_true(json_is_false(json_object_get(r.echo, "store")));
    assert_string_equal(json_string_value(json_object_get(r.echo, "previous_response_id")),
                        "resp_p");
    json_t *prev = json_loads("[{\"role\":\"user\",\"content\":\"q\"},"
                              "{\"role\":\"assistant\",\"content\":\"a\"}]",
                              0, NULL);
    json_t *items = json_loads(
        "{\"fc_1\":{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"
        "\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}}",
        0, NULL);
    /* msg_9 is not there: named in the error, the request untouched. */
    assert_int_equal(gps_resp_splice(&r, prev, items, msg, sizeof msg, &param), -1);
    assert_string_equal(param, "input");
    assert_non_null(strstr(msg, "msg_9"));
    assert_non_null(strstr(msg, "input[2]"));
    json_object_set_new(items, "msg_9", json_pack("{s:s,s:s}", "role", "assistant", "content",
                                                  "done"));
    assert_int_equal(gps_resp_splice(&r, prev, items, msg, sizeof msg, &param), 0);
    json_t *want = json_loads(
        "[{\"role\":\"system\",\"content\":\"I\"},{\"role\":\"user\",\"content\":\"q\"},"
        "{\"role\":\"assistant\",\"content\":\"a\",\"tool_calls\":[{\"id\":\"c1\",\"type\":"
        "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"},"
        "{\"role\":\"assistant\",\"content\":\"done\"}]",
        0, NULL);
    if (!json_equal(r.spec.messages, want)) {
        char *got = json_dumps(r.spec.messages, JSON_COMPACT);
        fprintf(stderr, "spliced: %s\n", got);
        free(got);
        fail();
    }
    json_decref(want);
    json_decref(prev);
    json_decref(items);
    gps_resp_req_clear(&r);
}

/* What a stored response keeps: the conversation through it, and each
 * output item as a chat fragment. */
static void test_stored_context_and_items(void **st)
{
    (void)st;
    gps_resp_out o;
    gps_tool_calls calls;
    memset(&calls, 0, sizeof calls);
    gps_resp_out_init(&o, "m", NULL);
    json_t *ev = json_pack("{s:i,s:s,s:s,s:s}", "index", 0, "id", "c1", "name", "f",
                           "arguments", "{}");
    bool started;
    int ci = gps_tool_calls_add(&calls, ev, &started);
    json_decref(ev);
    assert_int_equal(ci, 0);
    json_decref(gps_resp_object(&o, &calls, "hi", 2, "tool_calls", 3, 4, NULL));
    (void)ci;
    json_t *msgs = json_loads("[{\"role\":\"system\",\"content\":\"I\"},"
                              "{\"role\":\"user\",\"content\":\"q\"}]",
                              0, NULL);
    json_t *items = NULL;
    json_t *ctx = gps_resp_context(&o, &calls, msgs, 1, &items);
    assert_non_null(ctx);
    assert_int_equal(json_array_size(ctx), 2); /* instructions left out */
    json_t *reply = json_array_get(ctx, 1);
    assert_string_equal(json_string_value(json_object_get(reply, "content")), "hi");
    assert_int_equal(json_array_size(json_object_get(reply, "tool_calls")), 1);
    assert_int_equal(json_array_size(items), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(items, 0), "id")),
                        o.items[0].item_id);
    json_t *fc = json_object_get(json_array_get(items, 1), "message");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_array_get(json_object_get(fc, "tool_calls"), 0),
                                            "function"),
                            "name")),
                        "f");
    json_t *fin = gps_resp_final(&o, &calls, "tool_calls", 3, 4);
    assert_null(json_object_get(fin, "x_pool_meta"));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(fin, "usage"),
                                                        "total_tokens")),
                     7);
    json_decref(fin);
    json_decref(ctx);
    json_decref(items);
    json_decref(msgs);
    gps_resp_out_clear(&o);
    gps_tool_calls_free(&calls);
}

/* The bytes json_dumps writes for item it's text delta t at seq. */
static void assert_delta(const gp_buf *sse, const gps_resp_out *o, int it, const char *t,
                         long long seq)
{
    json_t *j = json_pack("{s:s,s:i,s:i,s:s,s:[],s:s,s:I}", "item_id", o->items[it].item_id,
                          "output_index", it, "content_index", 0, "delta", t, "logprobs",
                          "type", "response.output_text.delta", "sequence_number",
                          (json_int_t)seq);
    char *d = json_dumps(j, JSON_COMPACT);
    gp_buf want;
    gp_buf_init(&want);
    gp_buf_appendf(&want, "event: response.output_text.delta\ndata: %s\n\n", d);
    assert_int_equal(sse->len, want.len);
    assert_memory_equal(sse->data, want.data, want.len);
    gp_buf_free(&want);
    free(d);
    json_decref(j);
}

/* A text delta is rendered as text, not dumped by jansson: it must be the
 * bytes json_dumps writes for the same object, whatever the text holds,
 * for every message item (its frame up to the text is made once per item). */
static void test_delta_is_what_jansson_writes(void **st)
{
    (void)st;
    static const char *texts[] = {"tok", "a\"b\\c\n\r\t\x01\x1f/", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"};
    gps_resp_out o;
    gps_resp_out_init(&o, "m", NULL);
    gp_buf sse;
    gp_buf_init(&sse);
    gps_resp_text(&o, &sse, "x", 1); /* opens the message item */
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        sse.len = 0;
        long long seq = o.seq;
        gps_resp_text(&o, &sse, texts[i], strlen(texts[i]));
        assert_delta(&sse, &o, 0, texts[i], seq);
    }
    /* A call closes the message; text after it is a new item (index 2). */
    gps_tool_calls calls = {0};
    json_t *ev = J("{\"type\":\"tool_call\",\"index\":0,\"id\":\"call_9\",\"name\":\"f\","
                   "\"arguments\":\"{}\"}");
    bool started = false;
    assert_int_equal(gps_tool_calls_add(&calls, ev, &started), 0);
    gps_resp_call(&o, &sse, &calls, 0, started, "{}");
    json_decref(ev);
    o.seq = 1234567; /* (a sequence number of several digits) */
    gps_resp_text(&o, &sse, "y", 1); /* opens the second message item */
    assert_int_equal(o.n_items, 3);
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        sse.len = 0;
        long long seq = o.seq;
        gps_resp_text(&o, &sse, texts[i], strlen(texts[i]));
        assert_delta(&sse, &o, 2, texts[i], seq);
    }
    gp_buf_free(&sse);
    gps_resp_out_clear(&o);
    gps_tool_calls_free(&calls);
}

/* Append `event: TYPE` and the compact dump of ev (stolen) with "type" and
 * "sequence_number" added last, as responses.c's emit() wrote every event
 * before the fourth round of issue 24. */
static void want_event(gp_buf *w, const char *type, json_t *ev, long long seq)
{
    assert_non_null(ev);
    json_object_set_new(ev, "type", json_string(type));
    json_object_set_new(ev, "sequence_number", json_integer(seq));
    char *d = json_dumps(ev, JSON_COMPACT);
    assert_non_null(d);
    gp_buf_appendf(w, "event: %s\ndata: %s\n\n", type, d);
    free(d);
    json_decref(ev);
}

/* The "response" of the event of this type in sse (a new reference). */
static json_t *response_in(const gp_buf *sse, const char *type)
{
    char head[96];
    snprintf(head, sizeof head, "event: %s\ndata: ", type);
    const char *at = strstr(sse->data, head);
    assert_non_null(at);
    at += strlen(head);
    json_error_t e;
    json_t *ev = json_loadb(at, (size_t)(strchr(at, '\n') - at), JSON_ALLOW_NUL, &e);
    assert_non_null(ev);
    json_t *r = json_incref(json_object_get(ev, "response"));
    json_decref(ev);
    assert_non_null(r);
    return r;
}

static void assert_buf_equal(const gp_buf *got, const gp_buf *want)
{
    if (got->len != want->len || memcmp(got->data, want->data, want->len) != 0)
        fprintf(stderr, "got:\n%.*s\nwant:\n%.*s\n", (int)got->len, got->data, (int)want->len,
                want->data);
    assert_int_equal(got->len, want->len);
    assert_memory_equal(got->data, want->data, want->len);
}

/* Issue 24, fourth round: the open and close events and a message's
 * added/done events are written as text. They must be the bytes that
 * jansson's objects dumped, whatever the text holds (quotes, backslashes,
 * control characters, non-ASCII, a NUL, bytes that are not UTF-8, which
 * jansson's json_stringn refused: written as ""), for either ending. */
static void test_open_close_are_what_jansson_writes(void **st)
{
    (void)st;
    static const struct {
        const char *t;
        size_t n;
    } texts[] = {
#define T(s) {s, sizeof(s) - 1}
        T("tok"),
        T("a\"b\\c\n\r\t\x01\x1f/\x7f"),
        T("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
        T("a\0b"),
        T("bad \xff\xfe utf-8"),
#undef T
    };
    const char *frs[] = {"stop", "length"};
    json_t *echo = J("{\"instructions\":\"\\u00e9\\\"q\\n\",\"store\":true,\"tools\":[],"
                     "\"tool_choice\":\"auto\",\"metadata\":{\"k\":\"\\u0001\"}}");
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        for (int k = 0; k < 2; k++) {
            gps_resp_out o;
            gps_resp_out_init(&o, "m\xc3\xa9\"", echo);
            gp_buf sse, want;
            gp_buf_init(&sse);
            gp_buf_init(&want);
            /* Open: the same response in both events. */
            gps_resp_open(&o, &sse);
            json_t *r = response_in(&sse, "response.created");
            want_event(&want, "response.created", json_pack("{s:O}", "response", r), 0);
            want_event(&want, "response.in_progress", json_pack("{s:O}", "response", r), 1);
            json_decref(r);
            assert_buf_equal(&sse, &want);
            /* The message item opened by its first text. */
            sse.len = want.len = 0;
            gps_resp_text(&o, &sse, "x", 1);
            const char *id = o.items[0].item_id;
            want_event(&want, "response.output_item.added",
                       json_pack("{s:i,s:{s:s,s:s,s:s,s:s,s:[]}}", "output_index", 0, "item",
                                 "type", "message", "id", id, "status", "in_progress", "role",
                                 "assistant", "content"),
                       2);
            want_event(&want, "response.content_part.added",
                       json_pack("{s:s,s:i,s:i,s:{s:s,s:s,s:[]}}", "item_id", id,
                                 "output_index", 0, "content_index", 0, "part", "type",
                                 "output_text", "text", "", "annotations"),
                       3);
            assert_true(sse.len > want.len); /* then the delta, tested above */
            sse.len = want.len;
            assert_buf_equal(&sse, &want);
            gps_resp_text(&o, &sse, texts[i].t, texts[i].n);
            /* Close: the whole text three times, then the final response. */
            sse.len = want.len = 0;
            gp_buf all;
            gp_buf_init(&all);
            gp_buf_append(&all, "x", 1);
            gp_buf_append(&all, texts[i].t, texts[i].n);
            json_t *text = json_stringn(all.data, all.len);
            if (!text)
                text = json_string("");
            long long seq = o.seq;
            json_t *fin = gps_resp_close_final(&o, &sse, &(gps_tool_calls){0}, frs[k], 5, 7,
                                               json_pack("{s:s}", "agent_id", "a"));
            want_event(&want, "response.output_text.done",
                       json_pack("{s:s,s:i,s:i,s:O}", "item_id", id, "output_index", 0,
                                 "content_index", 0, "text", text),
                       seq);
            want_event(&want, "response.content_part.done",
                       json_pack("{s:s,s:i,s:i,s:{s:s,s:O,s:[]}}", "item_id", id,
                                 "output_index", 0, "content_index", 0, "part", "type",
                                 "output_text", "text", text, "annotations"),
                       seq + 1);
            want_event(&want, "response.output_item.done",
                       json_pack("{s:i,s:{s:s,s:s,s:s,s:s,s:[{s:s,s:O,s:[]}]}}", "output_index",
                                 0, "item", "type", "message", "id", id, "status", "completed",
                                 "role", "assistant", "content", "type", "output_text", "text",
                                 text, "annotations"),
                       seq + 2);
            const char *end = k ? "response.incomplete" : "response.completed";
            r = response_in(&sse, end);
            /* (the final response's output holds the same text) */
            json_t *out = json_object_get(json_array_get(json_object_get(r, "output"), 0),
                                          "content");
            assert_true(json_equal(json_object_get(json_array_get(out, 0), "text"), text));
            want_event(&want, end, json_pack("{s:O}", "response", r), seq + 3);
            json_decref(r);
            assert_buf_equal(&sse, &want);
            assert_int_equal(o.seq, seq + 4);
            json_decref(text);
            json_decref(fin);
            gp_buf_free(&all);
            gp_buf_free(&sse);
            gp_buf_free(&want);
            gps_resp_out_clear(&o);
        }
    }
    json_decref(echo);
}

/* The final response that gps_resp_close_final hands back (for the store)
 * is gps_resp_final's, byte for byte, while the stream's last event still
 * carries x_pool_meta. */
static void test_close_final_is_final(void **st)
{
    (void)st;
    json_t *echo = J("{\"store\":true,\"tools\":[],\"tool_choice\":\"auto\"}");
    const char *frs[] = {"stop", "length"};
    for (int k = 0; k < 2; k++) {
        gps_resp_out o;
        gps_resp_out_init(&o, "m", echo);
        gp_buf sse;
        gp_buf_init(&sse);
        gps_resp_open(&o, &sse);
        gps_resp_text(&o, &sse, "Hel", 3);
        gps_resp_text(&o, &sse, "lo", 2);
        json_t *fin = gps_resp_close_final(&o, &sse, &(gps_tool_calls){0}, frs[k], 5, 7,
                                           json_pack("{s:s}", "agent_id", "a"));
        json_t *want = gps_resp_final(&o, &(gps_tool_calls){0}, frs[k], 5, 7);
        char *a = json_dumps(fin, JSON_COMPACT), *b = json_dumps(want, JSON_COMPACT);
        assert_string_equal(a, b);
        assert_null(json_object_get(fin, "x_pool_meta"));
        assert_non_null(strstr(sse.data, "\"x_pool_meta\":{\"agent_id\":\"a\"}"));
        free(a);
        free(b);
        json_decref(fin);
        json_decref(want);
        gp_buf_free(&sse);
        gps_resp_out_clear(&o);
    }
    json_decref(echo);
}

/* Issue 24, fifth round: the response object is written as text
 * (gps_resp_render, gps_resp_render_meta, gps_resp_close_text). It must be
 * the bytes json_dumps writes for jansson's tree (gps_resp_final, with
 * x_pool_meta set last), over echoes made by gps_resp_parse (instructions,
 * user, metadata, tools, a tool_choice object, a text format and
 * previous_response_id that replace the defaults in place), texts, call
 * names and arguments that need escapes or are not UTF-8 (jansson writes
 * "" for such text and leaves out an item whose name it refuses), models
 * that need escapes or that jansson refuses (no object at all). */
static void add_call(gps_tool_calls *c, const char *id, const char *name, const char *args)
{
    c->v = realloc(c->v, (c->n + 1) * sizeof *c->v);
    assert_non_null(c->v);
    gps_tool_call *t = &c->v[c->n++];
    t->id = strdup(id);
    t->name = strdup(name);
    gp_buf_init(&t->args);
    gp_buf_append(&t->args, args, strlen(args));
}

static void check_render(gps_resp_out *o, const gps_tool_calls *calls, const char *fr,
                         long long in, long long outn, const json_t *meta)
{
    json_t *want = gps_resp_final(o, calls, fr, in, outn);
    gp_buf got;
    gp_buf_init(&got);
    int rc = gps_resp_render(&got, o, calls, fr, in, outn);
    if (!want) {
        assert_int_equal(rc, -1);
        assert_int_equal(got.len, 0);
        gp_buf_free(&got);
        return;
    }
    assert_int_equal(rc, 0);
    char *d = json_dumps(want, JSON_COMPACT);
    gp_buf w = {.data = d, .len = strlen(d)};
    assert_buf_equal(&got, &w);
    free(d);
    /* With x_pool_meta: json_object_set_new(r, "x_pool_meta", meta). */
    json_object_set(want, "x_pool_meta", (json_t *)meta);
    d = json_dumps(want, JSON_COMPACT);
    w = (gp_buf){.data = d, .len = strlen(d)};
    assert_int_equal(gps_resp_render_meta(&got, 0, meta), 0);
    assert_buf_equal(&got, &w);
    free(d);
    json_decref(want);
    gp_buf_free(&got);
}

/* gps_resp_context_text: the bytes json_dumps writes for gps_resp_context's
 * conversation and items, or -1 where it gives none. */
static void check_context(const gps_resp_out *o, const gps_tool_calls *calls)
{
    json_t *msgs = J("[{\"role\":\"system\",\"content\":\"i\"},"
                     "{\"role\":\"user\",\"content\":\"q\\\"\\n\\u00e9\\u0001\"},"
                     "{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\"\"}]");
    for (size_t n_instr = 0; n_instr < 2; n_instr++) {
        json_t *its = NULL;
        json_t *c = gps_resp_context(o, calls, msgs, n_instr, &its);
        gp_buf a, b;
        gp_buf_init(&a);
        gp_buf_init(&b);
        int rc = gps_resp_context_text(o, calls, msgs, n_instr, &a, &b);
        if (!c) {
            assert_int_equal(rc, -1);
            assert_int_equal(a.len + b.len, 0);
        } else {
            assert_int_equal(rc, 0);
            char *d = json_dumps(c, JSON_COMPACT), *e = json_dumps(its, JSON_COMPACT);
            assert_buf_equal(&a, &(gp_buf){.data = d, .len = strlen(d)});
            assert_buf_equal(&b, &(gp_buf){.data = e, .len = strlen(e)});
            free(d);
            free(e);
        }
        json_decref(c);
        json_decref(its);
        gp_buf_free(&a);
        gp_buf_free(&b);
    }
    json_decref(msgs);
}

static void test_response_text_is_what_jansson_writes(void **st)
{
    (void)st;
    static const char *bodies[] = {
        "{\"model\":\"m\",\"input\":\"hi\"}",
        "{\"model\":\"m\",\"input\":\"hi\",\"instructions\":\"\\u00e9\\\"q\\n\\u0001\\\\\","
        "\"user\":\"u\\\"\\u20ac\",\"metadata\":{\"k\\n\":\"\\u0001\",\"\\u00e9\":\"v\"},"
        "\"temperature\":0.3,\"top_p\":0.9,\"max_output_tokens\":77,\"store\":false,"
        "\"previous_response_id\":\"resp_\\\"x\","
        "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"description\":\"d\\\"\\n\","
        "\"parameters\":{\"type\":\"object\"}}],"
        "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},"
        "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"s\",\"schema\":"
        "{\"type\":\"object\",\"properties\":{\"a\\\"\":{\"type\":\"string\"}}}}}}",
    };
    static const struct {
        const char *t;
        size_t n;
    } texts[] = {
#define T(s) {s, sizeof(s) - 1}
        T(""),
        T("plain"),
        T("a\"b\\c\n\r\t\x01\x1f/\x7f"),
        T("caf\xc3\xa9 \xf0\x9f\x98\x80"),
        T("a\0b"),
        T("bad \xff utf-8"),
#undef T
    };
    const char *models[] = {"m", "m\xc3\xa9\"\\\n", "bad\xff"};
    json_t *meta = J("{\"agent_id\":\"a\\\"\",\"queue_ms\":3,\"warnings\":[\"w\\n\"]}");
    for (size_t b = 0; b < sizeof bodies / sizeof bodies[0] + 1; b++) {
        gps_resp_req r;
        char msg[512];
        const char *param;
        json_t *echo = NULL;
        if (b < sizeof bodies / sizeof bodies[0]) {
            assert_int_equal(parse(bodies[b], &r, msg, &param), 0);
            echo = json_incref(r.echo);
            gps_resp_req_clear(&r);
        }
        for (size_t m = 0; m < 3; m++)
            for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
                for (int c = 0; c < 4; c++) {
                    gps_tool_calls calls = {0};
                    if (c >= 1)
                        add_call(&calls, "call_1", "f\"\\", "{\"a\":\"\\n\"}");
                    if (c >= 2)
                        add_call(&calls, "call_2", "g", "bad \xff");
                    if (c >= 3)
                        add_call(&calls, "call_3", "n\xff", "{}");
                    gps_resp_out o;
                    gps_resp_out_init(&o, models[m], echo);
                    gps_resp_whole(&o, &calls, texts[i].t, texts[i].n);
                    check_render(&o, &calls, "stop", 5, 7, meta);
                    check_render(&o, &calls, "length", -1, 3, meta);
                    check_context(&o, &calls);
                    gps_resp_out_clear(&o);
                    gps_tool_calls_free(&calls);
                }
        json_decref(echo);
    }
    json_decref(meta);
}

/* The streamed close: gps_resp_close_text writes the bytes that
 * gps_resp_close_final (jansson) wrote, on the same state, and hands the
 * store gps_resp_final's object as text. */
static void test_close_text_is_close_final(void **st)
{
    (void)st;
    gps_resp_req r;
    char msg[512];
    const char *param;
    assert_int_equal(parse("{\"model\":\"m\",\"input\":\"hi\",\"user\":\"\\u0001\","
                           "\"metadata\":{\"k\":\"\\\"\"}}",
                           &r, msg, &param),
                     0);
    json_t *meta = J("{\"agent_id\":\"a\",\"warnings\":[\"\\u00e9\"]}");
    const char *frs[] = {"stop", "length"};
    for (int k = 0; k < 2; k++)
        for (int c = 0; c < 3; c++) {
            gps_tool_calls calls = {0};
            gps_resp_out o;
            gps_resp_out_init(&o, "m\"", r.echo);
            gp_buf sse;
            gp_buf_init(&sse);
            gps_resp_open(&o, &sse);
            gps_resp_text(&o, &sse, "He\"l\n", 5);
            if (c >= 1) {
                add_call(&calls, "call_1", "f\\", "{\"a\":");
                gps_resp_call(&o, &sse, &calls, 0, true, "{\"a\":");
                gp_buf_append(&calls.v[0].args, "1}", 2);
            }
            if (c >= 2)
                gps_resp_text(&o, &sse, "after \xff", 7);
            /* The same state twice (item ids included). */
            gps_resp_out o2 = o;
            gp_buf_init(&o2.text);
            gp_buf_append(&o2.text, o.text.data, o.text.len);
            gp_buf_init(&o2.echo_text);
            gp_buf_append(&o2.echo_text, o.echo_text.data, o.echo_text.len);
            o2.items = malloc((size_t)o.cap_items * sizeof *o.items);
            assert_non_null(o2.items);
            memcpy(o2.items, o.items, (size_t)o.n_items * sizeof *o.items);
            gp_buf got, want, fin;
            gp_buf_init(&got);
            gp_buf_init(&want);
            gp_buf_init(&fin);
            gps_resp_close_text(&o, &got, &calls, frs[k], 5, 7, meta, &fin);
            json_t *f = gps_resp_close_final(&o2, &want, &calls, frs[k], 5, 7,
                                             json_incref(meta));
            assert_buf_equal(&got, &want);
            assert_int_equal(o.seq, o2.seq);
            char *d = json_dumps(f, JSON_COMPACT);
            gp_buf w = {.data = d, .len = strlen(d)};
            assert_buf_equal(&fin, &w);
            free(d);
            json_decref(f);
            check_context(&o, &calls);
            gp_buf_free(&got);
            gp_buf_free(&want);
            gp_buf_free(&fin);
            gp_buf_free(&sse);
            gps_resp_out_clear(&o);
            gps_resp_out_clear(&o2);
            gps_tool_calls_free(&calls);
        }
    json_decref(meta);
    gps_resp_req_clear(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_input_string_and_instructions),
        cmocka_unit_test(test_items_with_function_calls),
        cmocka_unit_test(test_tool_strict_is_carried_when_given),
        cmocka_unit_test(test_text_format_json_schema),
        cmocka_unit_test(test_hosted_tools_are_dropped_with_a_warning),
        cmocka_unit_test(test_refusals_name_the_field),
        cmocka_unit_test(test_stored_state_splice),
        cmocka_unit_test(test_stored_context_and_items),
        cmocka_unit_test(test_stream_text_then_call),
        cmocka_unit_test(test_delta_is_what_jansson_writes),
        cmocka_unit_test(test_close_final_is_final),
        cmocka_unit_test(test_open_close_are_what_jansson_writes),
        cmocka_unit_test(test_incomplete_and_whole_body),
        cmocka_unit_test(test_response_text_is_what_jansson_writes),
        cmocka_unit_test(test_close_text_is_close_final),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
