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

    /* The text chunk written by hand equals the one jansson builds. */
    gp_buf a, b;
    gp_buf_init(&a);
    gp_buf_init(&b);
    gps_oa_out_init(&o, true, true, "chatcmpl-2", 7, "@@gpupool-text@@");
    gps_oa_text(&o, &a, "caf\xc3\xa9 \\ \x01", 9);
    assert_non_null(o.text_tpl.pre);
    gps_oa_out_clear(&o);
    json_t *c = gps_openai_chunk(true, "chatcmpl-2", 7, "@@gpupool-text@@", "caf\xc3\xa9 \\ \x01",
                                 false, NULL, true);
    gps_sse_format_json(&b, NULL, NULL, c);
    json_decref(c);
    assert_string_equal(a.data, b.data);
    assert_non_null(strstr(a.data, "\"content\":\"caf\xc3\xa9 \\\\ \\u0001\""));
    gp_buf_free(&a);
    gp_buf_free(&b);
}

/* A whole stream as the jansson objects above would dump it, frame by
 * frame (the hand path must write the same bytes). */
static void want_stream(gp_buf *w, bool chat, bool usage, const char *id, long long created,
                        const char *model, const char *text, const char *fr, long long pt,
                        long long ct, const json_t *meta)
{
    if (chat) {
        json_t *c = gps_openai_chunk(true, id, created, model, "", true, NULL, usage);
        gps_sse_format_json(w, NULL, NULL, c);
        json_decref(c);
    }
    json_t *c = gps_openai_chunk(chat, id, created, model, text, false, NULL, usage);
    gps_sse_format_json(w, NULL, NULL, c);
    json_decref(c);
    c = gps_openai_chunk(chat, id, created, model, chat ? NULL : "", false, fr, usage);
    if (meta)
        json_object_set(c, "x_pool_meta", (json_t *)meta);
    gps_sse_format_json(w, NULL, NULL, c);
    json_decref(c);
    if (usage) {
        c = gps_openai_usage_chunk(chat, id, created, model, pt, ct);
        gps_sse_format_json(w, NULL, NULL, c);
        json_decref(c);
    }
    gps_sse_format(w, NULL, NULL, "[DONE]");
}

static void test_hand_frames_equal_built(void **state)
{
    (void)state;
    const char *ids[] = {"cmpl-1", "chatcmpl-\"q\"\\/", ""};
    const char *models[] = {"m", "caf\xc3\xa9/\t\x1f", "@@gpupool-text@@", ""};
    const char *texts[] = {"", "a", "\x7f\xe2\x82\xac\n\r\b\f\"</script>"};
    const char *frs[] = {NULL, "stop", "we\"ird\n"};
    long long created[] = {0, -5, 1700000000123LL};
    json_t *meta = json_pack("{s:s,s:i,s:[s]}", "agent_id", "a\"1", "attempts", 2, "w", "x");
    for (int chat = 0; chat < 2; chat++)
        for (int usage = 0; usage < 2; usage++)
            for (size_t i = 0; i < 3; i++)
                for (size_t m = 0; m < 4; m++)
                    for (size_t t = 0; t < 3; t++) {
                        size_t f = (i + m + t) % 3;
                        long long cr = created[(m + t) % 3];
                        bool with_meta = (i + t) % 2 == 0;
                        gp_buf got, want;
                        gp_buf_init(&got);
                        gp_buf_init(&want);
                        gps_oa_out o;
                        gps_oa_out_init(&o, chat, usage, ids[i], cr, models[m]);
                        gps_oa_open(&o, &got);
                        gps_oa_text(&o, &got, texts[t], strlen(texts[t]));
                        gps_oa_close(&o, &got, frs[f], 3 + (long long)t, 9,
                                     with_meta ? json_deep_copy(meta) : NULL);
                        gps_oa_out_clear(&o);
                        want_stream(&want, chat, usage, ids[i], cr, models[m], texts[t],
                                    frs[f], 3 + (long long)t, 9, with_meta ? meta : NULL);
                        assert_string_equal(got.data, want.data);
                        gp_buf_free(&got);
                        gp_buf_free(&want);
                    }
    json_decref(meta);
}

/* An id or model that is not UTF-8 (json_string refuses it): the built
 * path, which writes no chunk, but [DONE]. */
static void test_not_utf8_writes_no_chunk(void **state)
{
    (void)state;
    gps_oa_out o;
    gps_oa_out_init(&o, true, false, "chatcmpl-1", 1, "bad\xff");
    gp_buf sse;
    gp_buf_init(&sse);
    gps_oa_open(&o, &sse);
    gps_oa_text(&o, &sse, "x", 1);
    gps_oa_close(&o, &sse, "stop", 1, 1, NULL);
    assert_string_equal(sse.data, "data: [DONE]\n\n");
    gp_buf_free(&sse);
    gps_oa_out_clear(&o);
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
        cmocka_unit_test(test_hand_frames_equal_built),
        cmocka_unit_test(test_not_utf8_writes_no_chunk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
