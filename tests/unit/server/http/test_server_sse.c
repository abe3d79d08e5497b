/* SSE framing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "server/http/sse.h"

static void check(const char *event, const char *id, const char *data, const char *want)
{
    gp_buf b;
    gp_buf_init(&b);
    assert_int_equal(gps_sse_format(&b, event, id, data), 0);
    assert_string_equal(b.data, want);
    gp_buf_free(&b);
}

static void test_format(void **st)
{
    (void)st;
    check(NULL, NULL, "[DONE]", "data: [DONE]\n\n");
    check("token", "7", "{\"a\":1}", "event: token\nid: 7\ndata: {\"a\":1}\n\n");
    check(NULL, NULL, "a\nb", "data: a\ndata: b\n\n");
    check(NULL, NULL, "a\r\nb\rc", "data: a\ndata: b\ndata: c\n\n");
    check(NULL, NULL, "", "data: \n\n");
    check(NULL, NULL, "x\n", "data: x\ndata: \n\n");
}

static void test_json_and_comment(void **st)
{
    (void)st;
    gp_buf b;
    gp_buf_init(&b);
    json_t *j = json_pack("{s:s}", "text", "line1\nline2");
    assert_int_equal(gps_sse_format_json(&b, NULL, NULL, j), 0);
    /* compact JSON escapes the newline: one data line */
    assert_string_equal(b.data, "data: {\"text\":\"line1\\nline2\"}\n\n");
    json_decref(j);
    assert_int_equal(gps_sse_format_comment(&b, "ping"), 0);
    assert_non_null(strstr(b.data, "\n\n: ping\n\n"));
    gp_buf_free(&b);
}

/* The escape is what json_dumps writes for a string (the same text once
 * parsed back; byte for byte when no control character is in it). */
static void test_json_escape(void **st)
{
    (void)st;
    const char *cases[] = {"", "plain", "say \"hi\"", "back\\slash", "tab\there\nnew line",
                           "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "\x01\x1f\x7f end",
                           "</script>", "\r\b\f"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gp_buf b;
        gp_buf_init(&b);
        gp_buf_append(&b, "\"", 1);
        assert_int_equal(gps_json_escape_append(&b, cases[i], strlen(cases[i])), 0);
        gp_buf_append(&b, "\"", 1);
        json_t *back = json_loadb(b.data, b.len, JSON_DECODE_ANY, NULL);
        assert_non_null(back);
        assert_string_equal(json_string_value(back), cases[i]);
        json_t *js = json_string(cases[i]);
        char *ref = json_dumps(js, JSON_ENCODE_ANY);
        if (!strpbrk(cases[i], "\x01\x1f\b\f"))
            assert_string_equal(ref, b.data);
        free(ref);
        json_decref(js);
        json_decref(back);
        gp_buf_free(&b);
    }
}

/* A template emits exactly what formatting the whole object would. */
static void test_template(void **st)
{
    (void)st;
    json_t *o = json_pack("{s:s,s:[{s:i,s:{s:s}}]}", "id", "chatcmpl-1", "choices", "index", 0,
                          "delta", "content", "@@m@@");
    gps_sse_tpl t;
    assert_int_equal(gps_sse_tpl_init(&t, NULL, o, "@@m@@"), 0);
    const char *texts[] = {"Hello", " \"quoted\" \\ and\nnewline", ""};
    for (size_t i = 0; i < 3; i++) {
        gp_buf a, b;
        gp_buf_init(&a);
        gp_buf_init(&b);
        assert_int_equal(gps_sse_tpl_emit(&a, &t, texts[i], strlen(texts[i])), 0);
        json_t *d = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "delta");
        json_object_set_new(d, "content", json_string(texts[i]));
        assert_int_equal(gps_sse_format_json(&b, NULL, NULL, o), 0);
        json_object_set_new(d, "content", json_string("@@m@@"));
        assert_int_equal(a.len, b.len);
        assert_memory_equal(a.data, b.data, a.len);
        gp_buf_free(&a);
        gp_buf_free(&b);
    }
    gps_sse_tpl_free(&t);
    /* With an event name. */
    assert_int_equal(gps_sse_tpl_init(&t, "content_block_delta", o, "@@m@@"), 0);
    gp_buf a;
    gp_buf_init(&a);
    gps_sse_tpl_emit(&a, &t, "x", 1);
    assert_non_null(strstr(a.data, "event: content_block_delta\ndata: {"));
    gp_buf_free(&a);
    gps_sse_tpl_free(&t);
    /* The marker must be there once: absent, or also in another field, is refused. */
    assert_int_equal(gps_sse_tpl_init(&t, NULL, o, "@@absent@@"), -1);
    json_object_set_new(o, "id", json_string("@@m@@"));
    assert_int_equal(gps_sse_tpl_init(&t, NULL, o, "@@m@@"), -1);
    assert_null(t.pre);
    json_decref(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_json_and_comment),
        cmocka_unit_test(test_json_escape),
        cmocka_unit_test(test_template),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
