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

/* Append what emit() wrote for ev (stolen): `event: NAME`, its dump. */
static void want(gp_buf *w, const char *name, json_t *ev)
{
    if (!ev)
        return; /* json_pack refused: nothing was written */
    char *d = json_dumps(ev, JSON_COMPACT);
    assert_non_null(d);
    gp_buf_appendf(w, "event: %s\ndata: %s\n\n", name, d);
    free(d);
    json_decref(ev);
}

static void assert_same(const gp_buf *got, const gp_buf *w)
{
    if (got->len != w->len || memcmp(got->data, w->data, w->len) != 0)
        fprintf(stderr, "got:\n%.*s\nwant:\n%.*s\n", (int)got->len, got->data, (int)w->len,
                w->data);
    assert_int_equal(got->len, w->len);
    assert_memory_equal(got->data, w->data, w->len);
}

/* Issue 24, fourth round: message_start, the text block's start and stop,
 * ping, message_delta and message_stop are written as text. They must be
 * the bytes jansson's objects dumped (the objects below are the ones
 * anthropic_sse.c packed before), over ids, models, stop sequences and
 * warnings that need escapes, with and without x_pool_meta, and nothing
 * where json_pack refused a string (not UTF-8, a NULL stop_reason). */
static void test_frames_are_what_jansson_writes(void **state)
{
    (void)state;
    static const char *models[] = {"m1", "m\xc3\xa9\"\\/\n\x01", "bad \xff"};
    static const char *seqs[] = {NULL, "\n\nHuman:", "caf\xc3\xa9\t\"", "\xe2\x82"};
    static const char *reasons[] = {"end_turn", "stop_sequence", NULL};
    json_t *warn = json_pack("[s,s]", "w \"1\"", "caf\xc3\xa9");
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        for (int k = 0; k < 4; k++) {
            gps_an_out o;
            gps_an_out_init(&o, "msg_\"x\"", models[m]);
            gp_buf sse, w;
            gp_buf_init(&sse);
            gp_buf_init(&w);
            const json_t *ws = k & 1 ? warn : NULL;
            long long in = k == 3 ? -5 : 12345678901LL;
            gps_an_open(&o, &sse, in, ws, k != 2);
            json_t *msg = json_pack("{s:s,s:s,s:s,s:[],s:s,s:n,s:n,s:{s:I,s:I}}", "id", o.id,
                                    "type", "message", "role", "assistant", "content", "model",
                                    models[m], "stop_reason", "stop_sequence", "usage",
                                    "input_tokens", (json_int_t)(in > 0 ? in : 0),
                                    "output_tokens", (json_int_t)0);
            if (msg && ws)
                json_object_set_new(msg, "x_pool_meta", json_pack("{s:O}", "warnings", ws));
            want(&w, "message_start",
                 msg ? json_pack("{s:s,s:o}", "type", "message_start", "message", msg) : NULL);
            if (k != 2)
                want(&w, "content_block_start",
                     json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_start", "index", 0,
                               "content_block", "type", "text", "text", ""));
            want(&w, "ping", json_pack("{s:s}", "type", "ping"));
            assert_same(&sse, &w);
            for (size_t q = 0; q < sizeof seqs / sizeof seqs[0]; q++) {
                const char *sr = reasons[q % 3];
                sse.len = w.len = 0;
                json_t *meta = k & 2 ? json_pack("{s:s,s:f}", "agent_id", "a\"1", "t", 0.25)
                                     : NULL;
                json_t *meta_ref = json_incref(meta);
                gps_an_close(&o, &sse, sr, seqs[q], in, 64 + (long long)q, meta);
                if (k != 2 && q == 0)
                    want(&w, "content_block_stop",
                         json_pack("{s:s,s:i}", "type", "content_block_stop", "index", 0));
                json_t *md = json_pack("{s:s,s:{s:s,s:o},s:{s:I,s:I}}", "type", "message_delta",
                                       "delta", "stop_reason", sr, "stop_sequence",
                                       seqs[q] ? json_string(seqs[q]) : json_null(), "usage",
                                       "input_tokens", (json_int_t)(in > 0 ? in : 0),
                                       "output_tokens", (json_int_t)(64 + q));
                if (md && meta_ref)
                    json_object_set(md, "x_pool_meta", meta_ref);
                json_decref(meta_ref);
                want(&w, "message_delta", md);
                want(&w, "message_stop", json_pack("{s:s}", "type", "message_stop"));
                assert_same(&sse, &w);
            }
            gp_buf_free(&sse);
            gp_buf_free(&w);
            gps_an_out_clear(&o);
        }
    }
    json_decref(warn);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_then_tool_call_then_end),
        cmocka_unit_test(test_call_first_and_cut_text),
        cmocka_unit_test(test_frames_are_what_jansson_writes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
