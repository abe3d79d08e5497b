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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_json_and_comment),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
