/* anthropic_sse: a streamed Messages reply rendered from values alone (no
 * job, no socket): the event grammar, block indexes across text and tool
 * calls, the text template's escaping, and the end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/dialects/anthropic_sse.h"

/* The event names of sse, in order, joined by ','. */
static void names(const gp_buf *sse, char *out, size_t n)
{
    out[0] = '\0';
    const char *p = sse->data ? sse->data : "";
    while ((p = strstr(p, "event: ")) != NULL) {
        p += 7;
        size_t l = strcspn(p, "\n");
        if (out[0])
            strncat(out, ",", n - strlen(out) - 1);
        strncat(out, p, l < n - strlen(out) - 1 ? l : n - strlen(out) - 1);
        p += l;
    }
}

static void test_text_then_tool_call_then_end(void **state)
{
    (void)state;
    gps_an_out o;
    gps_an_out_init(&o, "msg_1", "m1");
    gp_buf sse;
    gp_buf_init(&sse);
    json_t *w = json_pack("[s]", "a warning");
    gps_an_open(&o, &sse, 7, w, true);
    gps_an_text(&o, &sse, "He said \"hi\"\n", 13);
    gps_an_text(&o, &sse, "!", 1);
    gps_tool_calls calls;
    memset(&calls, 0, sizeof calls);
    json_t *ev = json_pack("{s:i,s:s,s:s,s:s}", "index", 0, "id", "call_abc", "name", "get",
                           "arguments",
                           "{\"a\":");
    bool started = false;
    int i = gps_tool_calls_add(&calls, ev, &started);
    assert_int_equal(i, 0);
    assert_true(started);
    gps_an_call(&o, &sse, &calls, i, started, "{\"a\":");
    gps_an_text(&o, &sse, "x", 1); /* text after a call: a new block */
    gps_an_close(&o, &sse, "tool_use", NULL, 7, 4, json_pack("{s:s}", "agent", "a1"));
    char got[1024];
    names(&sse, got, sizeof got);
    assert_string_equal(got, "message_start,content_block_start,ping,content_block_delta,"
                             "content_block_delta,content_block_stop,content_block_start,"
                             "content_block_delta,content_block_stop,content_block_start,"
                             "content_block_delta,content_block_stop,message_delta,"
                             "message_stop");
    const char *s = sse.data;
    assert_non_null(strstr(s, "\"id\":\"msg_1\""));
    assert_non_null(strstr(s, "\"x_pool_meta\":{\"warnings\":[\"a warning\"]}"));
    assert_non_null(strstr(s, "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
                              "\"text_delta\",\"text\":\"He said \\\"hi\\\"\\n\"}}"));
    assert_non_null(strstr(s, "\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_abc\","
                              "\"name\":\"get\",\"input\":{}}"));
    assert_non_null(strstr(s, "\"index\":1,\"delta\":{\"type\":\"input_json_delta\","
                              "\"partial_json\":\"{\\\"a\\\":\"}"));
    assert_non_null(strstr(s, "\"index\":2,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}"));
    assert_non_null(strstr(s, "\"stop_reason\":\"tool_use\",\"stop_sequence\":null},"
                              "\"usage\":{\"input_tokens\":7,\"output_tokens\":4}"));
    assert_non_null(strstr(s, "\"x_pool_meta\":{\"agent\":\"a1\"}"));
    json_decref(w);
    json_decref(ev);
    gps_tool_calls_free(&calls);
    gp_buf_free(&sse);
    gps_an_out_clear(&o);
}

/* A call first (no text block opened), and a piece of text cut inside a
 * UTF-8 character goes as an empty delta. */
static void test_call_first_and_cut_text(void **state)
{
    (void)state;
    gps_an_out o;
    gps_an_out_init(&o, "msg_2", "m1");
    gp_buf sse;
    gp_buf_init(&sse);
    gps_an_open(&o, &sse, 0, NULL, false);
    assert_null(strstr(sse.data, "x_pool_meta"));
    gps_an_text(&o, &sse, "\xc3", 1);
    assert_non_null(strstr(sse.data, "\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\"}"));
    gps_an_close(&o, &sse, "end_turn", "STOP", 0, 1, NULL);
    assert_non_null(strstr(sse.data, "\"stop_sequence\":\"STOP\""));
    char got[512];
    names(&sse, got, sizeof got);
    assert_string_equal(got, "message_start,ping,content_block_start,content_block_delta,"
                             "content_block_stop,message_delta,message_stop");
    gp_buf_free(&sse);
    gps_an_out_clear(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_then_tool_call_then_end),
        cmocka_unit_test(test_call_first_and_cut_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
