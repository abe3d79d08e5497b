/* openai_render: an OpenAI completions or chat reply rendered from values
 * alone (no job, no socket): the exact bytes of every frame a stream sends
 * (the wire the SDKs read), the text template against the built chunk, and
 * the whole body with tool calls. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/dialects/openai_render.h"

#define HEAD(obj) "data: {\"id\":\"chatcmpl-1\",\"object\":\"" obj "\",\"created\":1700000000," \
                  "\"model\":\"m1\",\"system_fingerprint\":\"gpupool\","

static void test_chat_stream_bytes(void **state)
{
    (void)state;
    gps_oa_out o;
    gps_oa_out_init(&o, true, false, "chatcmpl-1", 1700000000, "m0");
    gps_oa_out_set_model(&o, "m1"); /* a fallback serves */
    gp_buf sse;
    gp_buf_init(&sse);
    gps_oa_open(&o, &sse);
    gps_oa_text(&o, &sse, "He said \"hi\"\n", 13);
    gps_oa_close(&o, &sse, "stop", 3, 2, json_pack("{s:s}", "agent_id", "a1"));
    assert_string_equal(
        sse.data,
        HEAD("chat.completion.chunk")
        "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
        "\"logprobs\":null,\"finish_reason\":null}]}\n\n"
        HEAD("chat.completion.chunk")
        "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"He said \\\"hi\\\"\\n\"},"
        "\"logprobs\":null,\"finish_reason\":null}]}\n\n"
        HEAD("chat.completion.chunk")
        "\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],"
        "\"x_pool_meta\":{\"agent_id\":\"a1\"}}\n\n"
        "data: [DONE]\n\n");
    gp_buf_free(&sse);
    gps_oa_out_clear(&o);
}

/* include_usage: "usage": null on every chunk, then the usage chunk; the
 * template and the built chunk agree byte for byte. */
static void test_completion_stream_with_usage(void **state)
{
    (void)state;
    gps_oa_out o;
    gps_oa_out_init(&o, false, true, "cmpl-1", 5, "m");
    gp_buf sse;
    gp_buf_init(&sse);
    gps_oa_open(&o, &sse);
    assert_int_equal(sse.len, 0); /* completions: no role chunk */
    gps_oa_text(&o, &sse, "a\tb", 3);
    gps_oa_close(&o, &sse, "length", 1, 4, NULL);
    const char *head = "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":5,"
                       "\"model\":\"m\",\"system_fingerprint\":\"gpupool\",";
    char want[2048];
    snprintf(want, sizeof want,
             "%s\"choices\":[{\"index\":0,\"text\":\"a\\tb\",\"logprobs\":null,"
             "\"finish_reason\":null}],\"usage\":null}\n\n"
             "%s\"choices\":[{\"index\":0,\"text\":\"\",\"logprobs\":null,"
             "\"finish_reason\":\"length\"}],\"usage\":null}\n\n"
             "%s\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":4,"
             "\"total_tokens\":5}}\n\n"
             "data: [DONE]\n\n",
             head, head, head);
    assert_string_equal(sse.data, want);
    gp_buf_free(&sse);
    gps_oa_out_clear(&o);

    /* A model named like the template's marker takes the built path: the
     * same bytes either way. */
    gp_buf a, b;
    gp_buf_init(&a);
    gp_buf_init(&b);
    gps_oa_out_init(&o, true, true, "chatcmpl-2", 7, "plain");
    gps_oa_text(&o, &a, "caf\xc3\xa9 \\ \x01", 9);
    assert_non_null(o.text_tpl.pre);
    gps_oa_out_clear(&o);
    gps_oa_out_init(&o, true, true, "chatcmpl-2", 7, "@@gpupool-text@@");
    gps_oa_text(&o, &b, "caf\xc3\xa9 \\ \x01", 9);
    assert_null(o.text_tpl.pre);
    gps_oa_out_clear(&o);
    /* (the model names differ: compare from the choices on) */
    const char *ta = strstr(a.data, "\"choices\""), *tb = strstr(b.data, "\"choices\"");
    assert_string_equal(ta, tb);
    assert_non_null(strstr(ta, "\"content\":\"caf\xc3\xa9 \\\\ \\u0001\""));
    gp_buf_free(&a);
    gp_buf_free(&b);
}

static void test_tool_call_pieces(void **state)
{
    (void)state;
    gps_oa_out o;
    gps_oa_out_init(&o, true, false, "chatcmpl-1", 1700000000, "m1");
    gps_tool_calls calls;
    memset(&calls, 0, sizeof calls);
    json_t *ev = json_pack("{s:i,s:s,s:s,s:s}", "index", 0, "id", "call_abc", "name", "get",
                           "arguments", "{\"a\":");
    bool started = false;
    int i = gps_tool_calls_add(&calls, ev, &started);
    assert_int_equal(i, 0);
    gp_buf sse;
    gp_buf_init(&sse);
    gps_oa_call(&o, &sse, &calls, i, started, "{\"a\":");
    gps_oa_call(&o, &sse, &calls, i, false, NULL);
    assert_string_equal(
        sse.data,
        HEAD("chat.completion.chunk")
        "\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_abc\","
        "\"type\":\"function\",\"function\":{\"arguments\":\"{\\\"a\\\":\",\"name\":\"get\"}}]},"
        "\"logprobs\":null,\"finish_reason\":null}]}\n\n"
        HEAD("chat.completion.chunk")
        "\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":"
        "{\"arguments\":\"\"}}]},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    assert_string_equal(gps_oa_finish_reason("stop", calls.n), "tool_calls");
    assert_string_equal(gps_oa_finish_reason("length", calls.n), "length");
    assert_string_equal(gps_oa_finish_reason("", 0), "stop");

    /* The whole body: tool calls, content null without text. */
    json_t *body = gps_oa_body(&o, &calls, "", 0, "tool_calls", 2, 1, NULL);
    char *s = json_dumps(body, JSON_COMPACT);
    assert_string_equal(s, "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":"
                           "1700000000,\"model\":\"m1\",\"system_fingerprint\":\"gpupool\","
                           "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                           "\"content\":null,\"refusal\":null,\"tool_calls\":[{\"id\":"
                           "\"call_abc\",\"type\":\"function\",\"function\":{\"name\":\"get\","
                           "\"arguments\":\"{\\\"a\\\":\"}}]},\"logprobs\":null,"
                           "\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":2,"
                           "\"completion_tokens\":1,\"total_tokens\":3}}");
    free(s);
    json_decref(body);
    body = gps_oa_body(&o, &calls, "hi", 2, "tool_calls", 2, 1, NULL);
    json_t *m = json_object_get(json_array_get(json_object_get(body, "choices"), 0), "message");
    assert_string_equal(json_string_value(json_object_get(m, "content")), "hi");
    json_decref(body);
    json_decref(ev);
    gps_tool_calls_free(&calls);
    gp_buf_free(&sse);
    gps_oa_out_clear(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_stream_bytes),
        cmocka_unit_test(test_completion_stream_with_usage),
        cmocka_unit_test(test_tool_call_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
