/* upload_read: the hot shape is read to the same values jansson reads, and
 * everything else is declined (the caller then parses it with jansson). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/upload_read.h"

#define AID "91fc6fca-796a-4bf3-9c3b-dfb4553702a9"

static bool rd(const char *s, gps_upload *u)
{
    return gps_upload_read(s, strlen(s), 1024, u);
}

static void test_tokens_and_other_events(void **st)
{
    (void)st;
    gps_upload u;
    assert_true(rd("{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"job_1\",\"seq\":12,"
                   "\"events\":[{\"type\":\"token\",\"text\":\"a\\\"\\\\\\/\\n\\u00e9\"},"
                   "{\"text\":\" b\",\"token_id\":42,\"type\":\"token\"},{\"type\":\"started\"},"
                   "{\"type\":\"end\",\"finish_reason\":\"stop\"}]},"
                   "{\"job_id\":\"job_2\",\"seq\":0,\"events\":[]}],\"instance\":\"i1\"}",
                   &u));
    assert_string_equal(u.agent_id, AID);
    assert_string_equal(u.instance, "i1");
    assert_int_equal(u.n_jobs, 2);
    assert_string_equal(u.jobs[0].job_id, "job_1");
    assert_int_equal(u.jobs[0].seq, 12);
    assert_int_equal(u.jobs[0].n, 4);
    assert_int_equal(u.jobs[1].n, 0);
    /* a \u escape: that event went to jansson whole */
    assert_non_null(u.evs[0].ev);
    assert_string_equal(json_string_value(json_object_get(u.evs[0].ev, "text")),
                        "a\"\\/\n\xc3\xa9");
    assert_null(u.evs[1].ev);
    assert_int_equal(u.evs[1].len, 2);
    assert_memory_equal(u.evs[1].text, " b", 2);
    assert_int_equal(u.evs[1].token_id, 42);
    /* {"type":"token","text":" b","token_id":42} */
    assert_int_equal(u.evs[1].bytes, strlen("{\"type\":\"token\",\"text\":\" b\",\"token_id\":42}"));
    /* started and end of the agent's shape: plain, without a tree */
    assert_null(u.evs[2].ev);
    assert_true(u.evs[2].plain);
    assert_int_equal(u.evs[2].type, GPS_EV_STARTED);
    assert_int_equal(u.evs[2].bytes, strlen("{\"type\":\"started\"}"));
    assert_null(u.evs[3].ev);
    assert_true(u.evs[3].plain);
    assert_int_equal(u.evs[3].type, GPS_EV_END);
    assert_string_equal(u.evs[3].finish_reason, "stop");
    assert_null(u.evs[3].stop_sequence);
    assert_int_equal(u.evs[3].prompt_tokens, -1);
    gps_upload_free(&u);

    assert_true(rd("{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"j\",\"seq\":0,\"events\":"
                   "[{\"type\":\"token\",\"text\":\"x\\ty\"}]}]}", &u));
    assert_null(u.evs[0].ev);
    assert_memory_equal(u.evs[0].text, "x\ty", 3);
    assert_int_equal(u.evs[0].token_id, -1);
    assert_int_equal(u.evs[0].bytes, strlen("{\"type\":\"token\",\"text\":\"x\\ty\"}"));
    gps_upload_free(&u);
}

static void test_declined(void **st)
{
    (void)st;
    static const char *bad[] = {
        "",
        "[]",
        "{\"agent_id\":\"" AID "\",\"jobs\":[]}",                     /* empty batch */
        "{\"agent_id\":\"not-a-uuid\",\"jobs\":[{\"job_id\":\"j\",\"seq\":0,\"events\":[]}]}",
        "{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"j\",\"seq\":0,\"events\":[]}],"
        "\"running_jobs\":[]}",                                         /* liveness: jansson's */
        "{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"j\",\"seq\":01,\"events\":[]}]}",
        "{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"j\",\"seq\":1.0,\"events\":[]}]}",
        "{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"j\",\"seq\":-1,\"events\":[]}]}",
        "{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"\",\"seq\":0,\"events\":[]}]}",
        "{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"j\",\"events\":[]}]}", /* no seq */
        "{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"j\",\"seq\":0,\"seq\":0,\"events\":[]}]}",
        "{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"j\",\"seq\":0,\"events\":"
        "[{\"type\":\"token\",\"text\":\"a\",\"text\":\"b\"}]}]}",      /* duplicate key */
        "{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"j\",\"seq\":0,\"events\":"
        "[{\"type\":\"token\",\"text\":\"\xc3\"}]}]}",                  /* bad UTF-8 */
        "{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"j\",\"seq\":0,\"events\":"
        "[{\"type\":\"token\",\"text\":\"a\nb\"}]}]}",                  /* raw control byte */
        "{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"j\",\"seq\":0,\"events\":"
        "[{\"type\":\"token\",\"text\":\"a\",\"token_id\":2147483648}]}]}",
        "{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"j\",\"seq\":0,\"events\":"
        "[{\"type\":\"bogus\\u001b\"}]}]}",                             /* check refuses */
        "{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"j\",\"seq\":0,\"events\":[]}]} x",
        "{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"j\",\"seq\":0,\"events\":[]}]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gps_upload u;
        if (rd(bad[i], &u))
            fail_msg("accepted #%zu: %s", i, bad[i]);
        assert_null(u.jobs);
        assert_null(u.evs);
    }
}

/* The long-poll body: what jansson reads for the agent's usual body;
 * declined (NULL) for any other shape. */
static void test_work_body(void **st)
{
    (void)st;
    static const char *good[] = {
        "{\"agent_id\":\"" AID "\",\"free_slots\":3,\"instance\":\"abc-123_x\","
        "\"running_jobs\":[\"job_1\",\"job_2\"],\"delivery_seen\":\"e1.7\"}",
        " { \"agent_id\" : \"" AID "\" , \"free_slots\" : 0 , \"running_jobs\" : [ ] } \n",
        "{}",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        json_t *w = gps_work_read(good[i], strlen(good[i]));
        json_t *j = json_loads(good[i], JSON_REJECT_DUPLICATES, NULL);
        assert_non_null(w);
        assert_non_null(j);
        assert_true(json_equal(w, j));
        json_decref(w);
        json_decref(j);
    }
    static const char *bad[] = {
        "", "[]", "{\"a\":1} x", "{\"a\":1", "{\"a\":1,\"a\":1}", "{\"a\":-1}", "{\"a\":1.5}",
        "{\"a\":01}", "{\"a\":\"x\\\"y\"}", "{\"a\":\"caf\xc3\xa9\"}", "{\"a\":[1]}",
        "{\"prefix_cache\":{\"enabled\":true}}", "{\"a\":true}", "{\"a\":null}", "{\"A\":1}",
        "{\"a\":[\"x\",]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (gps_work_read(bad[i], strlen(bad[i])))
            fail_msg("accepted #%zu: %s", i, bad[i]);
}

/* A read token's size is json_dumps' compact size of the event, taken from
 * the string's bytes as they came (less one per "\/") instead of a second
 * pass over its text (issue 24): compared with jansson's own dump over
 * every escape the reader takes, in both shapes it reads. */
static void test_token_size_as_jansson_dumps(void **st)
{
    (void)st;
    static const char *const texts[] = {
        "plain", "", "a\\\"b", "\\\\", "\\/", "a\\/b\\/c", "\\b\\f\\n\\r\\t",
        "\\\"\\\\\\/\\b\\f\\n\\r\\t", "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", "x\\/\xc3\xa9\\n",
        "</script>", "\x7f",
    };
    static const char *const shapes[] = {
        "{\"type\":\"token\",\"text\":\"%s\"}",
        "{\"type\":\"token\",\"text\":\"%s\",\"token_id\":7}",
        "{\"text\":\"%s\",\"type\":\"token\"}",
        "{\"token_id\":123456,\"text\":\"%s\",\"type\":\"token\"}",
    };
    for (size_t t = 0; t < sizeof texts / sizeof *texts; t++) {
        for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
            char ev[256], body[512];
            snprintf(ev, sizeof ev, shapes[k], texts[t]);
            snprintf(body, sizeof body,
                     "{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"j\",\"seq\":0,"
                     "\"events\":[%s]}]}", ev);
            gps_upload u;
            assert_true(rd(body, &u));
            assert_null(u.evs[0].ev); /* read by upload_read, not jansson */
            json_t *jev = json_loads(ev, 0, NULL);
            assert_non_null(jev);
            char *dump = json_dumps(jev, JSON_COMPACT);
            assert_non_null(dump);
            if (u.evs[0].bytes != strlen(dump))
                fail_msg("%s: %zu, jansson's dump %s is %zu", ev, (size_t)u.evs[0].bytes, dump,
                         strlen(dump));
            free(dump);
            json_decref(jev);
            gps_upload_free(&u);
        }
    }
}

static json_t *one_event(const char *ev, gps_upload *u, bool *read)
{
    char body[2048];
    snprintf(body, sizeof body,
             "{\"agent_id\":\"" AID "\",\"jobs\":[{\"job_id\":\"j\",\"seq\":0,"
             "\"events\":[%s]}]}", ev);
    *read = rd(body, u);
    return json_loads(ev, JSON_REJECT_DUPLICATES, NULL);
}

/* The started, metrics and end events agents send are read into fields
 * (plain), with jansson's compact size and the fields jobs.c reads from a
 * tree; their raw text is the event's. */
static void test_plain_events(void **st)
{
    (void)st;
    static const char *const good[] = {
        "{\"type\":\"started\"}",
        " { \"type\" : \"started\" } ",
        "{\"ttft_ms\":1.25,\"tokens_per_sec\":31.0e1,\"count_estimated\":1,"
        "\"prompt_tokens\":7,\"type\":\"metrics\"}",
        "{\"type\":\"metrics\",\"tokens_per_sec\":12,\"other_thing\":-3.5}",
        "{\"type\":\"end\",\"finish_reason\":\"length\",\"usage\":{\"prompt_tokens\":5,"
        "\"completion_tokens\":-0},\"stop_sequence\":\"</END>\"}",
        "{\"type\":\"end\",\"usage\":{}}",
        "{\"type\":\"progress\",\"prompt_tokens_done\":0,\"prompt_tokens_total\":4}",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        gps_upload u;
        bool read;
        json_t *jev = one_event(good[i], &u, &read);
        assert_non_null(jev);
        if (!read || !u.evs[0].plain || u.evs[0].ev)
            fail_msg("not read plain: %s", good[i]);
        const gps_event_in *e = &u.evs[0];
        assert_int_equal(e->bytes, gp_json_compact_size(jev));
        json_t *raw = json_loadb(e->raw, e->raw_len, 0, NULL);
        assert_true(json_equal(raw, jev));
        json_decref(raw);
        json_t *usage = json_object_get(jev, "usage");
        json_t *pt = json_object_get(e->type == GPS_EV_END ? usage : jev, "prompt_tokens");
        assert_int_equal(e->prompt_tokens, pt ? json_integer_value(pt) : -1);
        if (e->type == GPS_EV_METRICS) {
            json_t *tps = json_object_get(jev, "tokens_per_sec");
            assert_true(e->has_tps);
            assert_true(e->tokens_per_sec == json_number_value(tps));
        }
        json_decref(jev);
        gps_upload_free(&u);
    }
    gps_upload u;
    bool read;
    json_t *jev = one_event(good[4], &u, &read);
    assert_string_equal(u.evs[0].finish_reason, "length");
    assert_string_equal(u.evs[0].stop_sequence, "</END>");
    assert_int_equal(u.evs[0].completion_tokens, 0);
    json_decref(jev);
    gps_upload_free(&u);
    jev = one_event(good[2], &u, &read);
    assert_true(u.evs[0].count_estimated);
    json_decref(jev);
    gps_upload_free(&u);
    jev = one_event(good[6], &u, &read);
    assert_true(u.evs[0].progress);
    assert_int_equal(u.evs[0].progress_done, 0);
    assert_int_equal(u.evs[0].progress_total, 4);
    json_decref(jev);
    gps_upload_free(&u);

    /* Valid, but not the plain shape: read as a tree, as before. */
    static const char *const tree[] = {
        "{\"type\":\"started\",\"model\":\"m\"}",
        "{\"type\":\"end\",\"finish_reason\":\"stop\",\"upstream_meta\":{\"id\":\"x\"}}",
        "{\"type\":\"end\",\"stop_sequence\":\"a\\nb\"}",
        "{\"type\":\"end\",\"finish_reason\":null}",
        "{\"type\":\"end\",\"usage\":{\"prompt_tokens\":1,\"cached\":2}}",
        "{\"type\":\"progress\",\"prompt_tokens_done\":null}",
        "{\"type\":\"error\",\"code\":\"X\",\"message\":\"m\"}",
    };
    for (size_t i = 0; i < sizeof tree / sizeof *tree; i++) {
        json_t *j = one_event(tree[i], &u, &read);
        if (!read || u.evs[0].plain || !u.evs[0].ev)
            fail_msg("not read as a tree: %s", tree[i]);
        assert_true(json_equal(u.evs[0].ev, j));
        json_decref(j);
        gps_upload_free(&u);
    }

    /* Refused by the check: never taken plain, so the upload is declined
     * and the jansson path refuses it with the check's words. */
    static const char *const bad[] = {
        "{\"type\":\"metrics\",\"prompt_tokens\":1.5}",
        "{\"type\":\"metrics\",\"tokens_per_sec\":-1}",
        "{\"type\":\"metrics\",\"x\":1e16}",
        "{\"type\":\"metrics\",\"x\":\"str\"}",
        "{\"type\":\"end\",\"finish_reason\":\"\"}",
        "{\"type\":\"end\",\"finish_reason\":\"a-reason-that-is-longer-than-32-bytes\"}",
        "{\"type\":\"end\",\"usage\":{\"prompt_tokens\":-1}}",
        "{\"type\":\"end\",\"usage\":{\"completion_tokens\":1000000001}}",
        "{\"type\":\"end\",\"usage\":5}",
        "{\"type\":\"end\",\"stop_sequence\":\"\"}",
        "{\"type\":\"started\",\"type\":\"started\"}",
        "{\"type\":\"progress\",\"prompt_tokens_total\":-1}",
        "{\"type\":\"progress\",\"prompt_tokens_done\":1.5}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *j = one_event(bad[i], &u, &read);
        json_decref(j);
        if (read)
            fail_msg("accepted: %s", bad[i]);
    }
    /* A metrics event of 33 members (the check allows 32). */
    char big[1024] = "{\"type\":\"metrics\"";
    for (int k = 0; k < 32; k++)
        snprintf(big + strlen(big), sizeof big - strlen(big), ",\"m%d\":%d", k, k);
    strcat(big, "}");
    json_decref(one_event(big, &u, &read));
    assert_false(read);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokens_and_other_events),
        cmocka_unit_test(test_token_size_as_jansson_dumps),
        cmocka_unit_test(test_plain_events),
        cmocka_unit_test(test_declined),
        cmocka_unit_test(test_work_body),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
