/*
 * Unit tests for src/server/fleet/agent_check.c: every number and name an agent
 * sends is bounded (issue 9, findings 1, 4, 10). Each case names the field
 * the 400 must name.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/fleet/agent_check.h"

#define AID "8d3f1c2e-7b4a-4c1d-9e2f-0a1b2c3d4e5f"

/* Check an upload whose events array is the JSON text evs; returns the
 * result and leaves the field in field. */
static int check(const char *evs, char *field, size_t fl)
{
    char buf[8192];
    snprintf(buf, sizeof buf, "{\"agent_id\":\"%s\",\"seq\":0,\"events\":%s}", AID, evs);
    json_error_t je;
    json_t *b = json_loads(buf, 0, &je);
    assert_non_null(b);
    char msg[256] = "";
    field[0] = '\0';
    int rc = gps_agent_events_check(b, field, fl, msg, sizeof msg);
    if (rc < 0) {
        assert_non_null(strstr(msg, field)); /* the message names the field */
    }
    json_decref(b);
    return rc;
}

/* check() for texts larger than its buffer. */
static int check_big(const char *evs, char *field, size_t fl)
{
    size_t n = strlen(evs) + 128;
    char *buf = malloc(n);
    assert_non_null(buf);
    snprintf(buf, n, "{\"agent_id\":\"%s\",\"seq\":0,\"events\":%s}", AID, evs);
    json_error_t je;
    json_t *b = json_loads(buf, 0, &je);
    free(buf);
    assert_non_null(b);
    char msg[256] = "";
    field[0] = '\0';
    int rc = gps_agent_events_check(b, field, fl, msg, sizeof msg);
    json_decref(b);
    return rc;
}

static void expect_bad(const char *evs, const char *want_field)
{
    char field[96];
    assert_int_equal(check(evs, field, sizeof field), -1);
    assert_string_equal(field, want_field);
}

static void expect_ok(const char *evs)
{
    char field[96];
    assert_int_equal(check(evs, field, sizeof field), 0);
}

static void test_the_repro_is_refused(void **state)
{
    (void)state;
    expect_bad("[{\"type\":\"end\",\"finish_reason\":\"stop\",\"usage\":{\"prompt_tokens\":"
               "9223372036854775807,\"completion_tokens\":1}}]",
               "events[0].usage.prompt_tokens");
    expect_bad("[{\"type\":\"started\"},{\"type\":\"end\",\"usage\":{\"prompt_tokens\":1,"
               "\"completion_tokens\":9223372036854775807}}]",
               "events[1].usage.completion_tokens");
    expect_bad("[{\"type\":\"end\",\"usage\":{\"prompt_tokens\":-1}}]",
               "events[0].usage.prompt_tokens");
    expect_bad("[{\"type\":\"end\",\"usage\":{\"prompt_tokens\":1.5}}]",
               "events[0].usage.prompt_tokens");
    expect_bad("[{\"type\":\"end\",\"usage\":{\"prompt_tokens\":1000000001}}]",
               "events[0].usage.prompt_tokens");
    expect_ok("[{\"type\":\"end\",\"finish_reason\":\"stop\",\"usage\":{\"prompt_tokens\":"
              "1000000000,\"completion_tokens\":0}}]");
    expect_ok("[{\"type\":\"end\"}]");
}

/* end.upstream_meta (an upstream pool's x_pool_meta): an object, bounded. */
static void test_upstream_meta(void **state)
{
    (void)state;
    expect_ok("[{\"type\":\"end\",\"upstream_meta\":{\"agent_id\":\"x\",\"attempts\":2}}]");
    expect_ok("[{\"type\":\"end\",\"upstream_meta\":null}]");
    expect_bad("[{\"type\":\"end\",\"upstream_meta\":\"x\"}]", "events[0].upstream_meta");
    expect_bad("[{\"type\":\"end\",\"upstream_meta\":[1]}]", "events[0].upstream_meta");
    char evs[GPS_AGENT_MAX_UPSTREAM_META + 128];
    /* {"w":"aaa..."} of exactly the limit passes; one byte more does not. */
    size_t pad = GPS_AGENT_MAX_UPSTREAM_META - strlen("{\"w\":\"\"}");
    for (int extra = 0; extra <= 1; extra++) {
        int n = snprintf(evs, sizeof evs, "[{\"type\":\"end\",\"upstream_meta\":{\"w\":\"");
        memset(evs + n, 'a', pad + (size_t)extra);
        snprintf(evs + n + pad + (size_t)extra, sizeof evs - (n + pad + (size_t)extra), "\"}}]");
        char field[96];
        assert_int_equal(check_big(evs, field, sizeof field), extra ? -1 : 0);
    }
}

static void test_token_fields(void **state)
{
    (void)state;
    expect_ok("[{\"type\":\"token\",\"text\":\"a\\n\",\"token_id\":403,\"logprob\":-0.5}]");
    expect_bad("[{\"type\":\"token\",\"text\":\"a\",\"token_id\":-1}]", "events[0].token_id");
    expect_bad("[{\"type\":\"token\",\"text\":\"a\",\"token_id\":2147483648}]",
               "events[0].token_id");
    expect_bad("[{\"type\":\"token\",\"text\":\"a\",\"logprob\":0.5}]", "events[0].logprob");
    expect_bad("[{\"type\":\"token\",\"text\":\"a\",\"logprob\":-1e300}]", "events[0].logprob");
    expect_bad("[{\"type\":\"token\",\"text\":\"a\",\"logprob\":\"x\"}]", "events[0].logprob");
    expect_bad("[{\"type\":\"token\"}]", "events[0].text");
}

static void test_metrics_fields(void **state)
{
    (void)state;
    expect_ok("[{\"type\":\"metrics\",\"prompt_tokens\":5,\"completion_tokens\":2,"
              "\"tokens_per_sec\":410.5,\"time_to_first_token_ms\":12.5,\"total_ms\":30}]");
    expect_bad("[{\"type\":\"metrics\",\"prompt_tokens\":9223372036854775807}]",
               "events[0].prompt_tokens");
    expect_bad("[{\"type\":\"metrics\",\"tokens_per_sec\":-1}]", "events[0].tokens_per_sec");
    expect_bad("[{\"type\":\"metrics\",\"x\":\"a long string\"}]", "events[0].x");
    expect_bad("[{\"type\":\"metrics\",\"x\":{\"nested\":1}}]", "events[0].x");
    expect_bad("[{\"type\":\"metrics\",\"x\":1e16}]", "events[0].x");
    /* 33 fields and a type. */
    char evs[2048] = "[{\"type\":\"metrics\"";
    for (int i = 0; i < 33; i++) {
        size_t n = strlen(evs);
        snprintf(evs + n, sizeof evs - n, ",\"f%d\":1", i);
    }
    strcat(evs, "}]");
    expect_bad(evs, "events[0]");
}

static void test_sizes_and_seq(void **state)
{
    (void)state;
    /* One event above 64 KiB: refused whatever its type. */
    size_t big = GPS_AGENT_MAX_EVENT_BYTES;
    json_t *ev = json_object();
    char *pad = malloc(big + 1);
    assert_non_null(pad);
    memset(pad, 'a', big);
    pad[big] = '\0';
    json_object_set_new(ev, "type", json_string("future_thing"));
    json_object_set_new(ev, "blob", json_string(pad));
    free(pad);
    json_t *b = json_pack("{s:s,s:i,s:[o]}", "agent_id", AID, "seq", 0, "events", ev);
    char field[96], msg[256];
    assert_int_equal(gps_agent_events_check(b, field, sizeof field, msg, sizeof msg), -1);
    assert_string_equal(field, "events[0]");
    json_decref(b);
    /* Unknown types of a sane size pass (jobs.c drops and counts them). */
    expect_ok("[{\"type\":\"future_thing\",\"x\":1}]");
    expect_bad("[{\"type\":\"bad\\u001b[31m\"}]", "events[0].type");
    expect_bad("[{\"text\":\"a\"}]", "events[0].type");
    expect_bad("[7]", "events[0]");
    /* Too many events in one upload. */
    b = json_pack("{s:s,s:i,s:[]}", "agent_id", AID, "seq", 0, "events");
    for (int i = 0; i <= GPS_AGENT_MAX_EVENTS; i++)
        json_array_append_new(json_object_get(b, "events"), json_pack("{s:s}", "type", "started"));
    assert_int_equal(gps_agent_events_check(b, field, sizeof field, msg, sizeof msg), -1);
    assert_string_equal(field, "events");
    json_decref(b);
    /* seq and agent_id. */
    const char *bodies[][2] = {
        {"{\"agent_id\":\"" AID "\",\"seq\":-1,\"events\":[]}", "seq"},
        {"{\"agent_id\":\"" AID "\",\"seq\":9223372036854775807,\"events\":[]}", "seq"},
        {"{\"agent_id\":\"" AID "\",\"seq\":\"0\",\"events\":[]}", "seq"},
        {"{\"agent_id\":\"nope\",\"seq\":0,\"events\":[]}", "agent_id"},
        {"{\"agent_id\":\"" AID "\",\"seq\":0,\"events\":{}}", "events"},
        {"[]", "body"},
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        b = json_loads(bodies[i][0], 0, NULL);
        assert_non_null(b);
        assert_int_equal(gps_agent_events_check(b, field, sizeof field, msg, sizeof msg), -1);
        assert_string_equal(field, bodies[i][1]);
        json_decref(b);
    }
}

static void test_error_and_tool_call(void **state)
{
    (void)state;
    expect_ok("[{\"type\":\"error\",\"code\":\"UPSTREAM_ERROR\",\"message\":\"x\"}]");
    expect_bad("[{\"type\":\"error\",\"code\":\"A\\u0007\"}]", "events[0].code");
    expect_ok("[{\"type\":\"tool_call\",\"index\":0,\"id\":\"call_1\",\"name\":\"f\","
              "\"arguments\":\"{}\"}]");
    expect_bad("[{\"type\":\"tool_call\",\"arguments\":\"{}\"}]", "events[0]");
    expect_bad("[{\"type\":\"tool_call\",\"index\":1025}]", "events[0]");
    expect_bad("[{\"type\":\"tool_call\",\"index\":0,\"name\":\"\\u001b]0;x\\u0007\"}]",
               "events[0]");    /* embeddings jobs: a base64 vector per input index */
    expect_ok("[{\"type\":\"embedding\",\"index\":3,\"embedding\":\"AACAPw==\"}]");
    expect_bad("[{\"type\":\"embedding\",\"embedding\":\"AACAPw==\"}]", "events[0].index");
    expect_bad("[{\"type\":\"embedding\",\"index\":2048,\"embedding\":\"\"}]",
               "events[0].index");
    expect_bad("[{\"type\":\"embedding\",\"index\":0,\"embedding\":[1.0]}]",
               "events[0].embedding");
}

static void test_text_ok(void **state)
{
    (void)state;
    assert_true(gps_agent_text_ok("gpu-box-1", 9, 256));
    assert_true(gps_agent_text_ok("Grafikkarte \xc3\xa4 \xe6\x97\xa5", 17, 256));
    assert_false(gps_agent_text_ok("", 0, 256));
    assert_false(gps_agent_text_ok("a\x1b[31m", 6, 256));
    assert_false(gps_agent_text_ok("a\x7f", 2, 256));
    assert_false(gps_agent_text_ok("a\xc2\x9b" "31m", 6, 256)); /* C1 CSI */
    assert_false(gps_agent_text_ok("a\xe2\x80\xae" "b", 5, 256)); /* RLO */
    assert_false(gps_agent_text_ok("a\xe2\x81\xa6" "b", 5, 256)); /* LRI */
    assert_false(gps_agent_text_ok("a\0b", 3, 256));
    assert_false(gps_agent_text_ok("abcd", 4, 3));
}

static void test_hw(void **state)
{
    (void)state;
    char msg[256];
    json_t *b = json_loads("{\"gpus\":[{\"vendor\":\"nvidia\",\"name\":\"RTX 4090\","
                           "\"vram_total\":25757220864,\"vram_used\":1,\"utilization\":0.3,"
                           "\"temperature\":54,\"index\":0,\"driver\":\"550.54\"}],"
                           "\"cpu\":{\"vendor\":\"cpu\",\"name\":\"x\",\"cores\":8}}",
                           0, NULL);
    assert_int_equal(gps_agent_hw_check(b, msg, sizeof msg), 0);
    json_decref(b);
    const char *bad[][2] = {
        {"{\"gpus\":[{\"name\":\"\\u001b[2J\"}]}", "gpus[0].name"},
        {"{\"gpus\":[{\"vram_total\":-1}]}", "gpus[0].vram_total"},
        {"{\"gpus\":[{\"vram_total\":9223372036854775807}]}", "gpus[0].vram_total"},
        {"{\"gpus\":[{\"utilization\":2}]}", "gpus[0].utilization"},
        {"{\"gpus\":[{\"x\":[1]}]}", "gpus[0].x"},
        {"{\"gpus\":{}}", "gpus"},
        {"{\"cpu\":{\"cores\":1e300}}", "cpu.cores"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        b = json_loads(bad[i][0], 0, NULL);
        assert_non_null(b);
        msg[0] = '\0';
        assert_int_equal(gps_agent_hw_check(b, msg, sizeof msg), -1);
        assert_non_null(strstr(msg, bad[i][1]));
        json_decref(b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_repro_is_refused),
        cmocka_unit_test(test_upstream_meta), cmocka_unit_test(test_token_fields),
        cmocka_unit_test(test_metrics_fields),       cmocka_unit_test(test_sizes_and_seq),
        cmocka_unit_test(test_error_and_tool_call),  cmocka_unit_test(test_text_ok),
        cmocka_unit_test(test_hw),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
