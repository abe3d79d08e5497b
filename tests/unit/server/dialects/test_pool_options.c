/* x_pool_options.failover and fallback_models: the shared parser, each
 * dialect's parse rejecting bad values with the parameter named (the
 * handlers turn that into a 400 in the dialect's shape); the wire form of a
 * continuation attempt (gps_job_wire). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/dialects/api_anthropic.h"
#include "server/dialects/api_openai.h"
#include "server/dialects/api_tasks.h"
/* Builds a job by hand (struct gps_job's fields) to test the task JSON. */
#include "server/jobs/jobs_internal.h"

/* Parse xo text into s; returns rc, param in *param. */
static int parse(const char *text, gps_job_spec *s, const char **param)
{
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &je);
    if (!j)
        fail_msg("test JSON does not parse: %s", text);
    memset(s, 0, sizeof *s);
    char msg[256] = "";
    int rc = gps_pool_options_parse(j, s, msg, sizeof msg, param);
    if (rc < 0)
        assert_true(msg[0] != '\0');
    json_decref(j);
    return rc;
}

static void test_failover_modes(void **st)
{
    (void)st;
    gps_job_spec s;
    const char *p;
    assert_int_equal(parse("{}", &s, &p), 0);
    assert_int_equal(s.failover, GPS_FAILOVER_CONTINUE); /* default */
    gps_job_spec_clear(&s);
    assert_int_equal(parse("{\"failover\":\"continue\"}", &s, &p), 0);
    assert_int_equal(s.failover, GPS_FAILOVER_CONTINUE);
    gps_job_spec_clear(&s);
    assert_int_equal(parse("{\"failover\":\"restart\"}", &s, &p), 0);
    assert_int_equal(s.failover, GPS_FAILOVER_RESTART);
    gps_job_spec_clear(&s);
    assert_int_equal(parse("{\"failover\":\"error\"}", &s, &p), 0);
    assert_int_equal(s.failover, GPS_FAILOVER_ERROR);
    gps_job_spec_clear(&s);
    assert_int_equal(parse("{\"failover\":null}", &s, &p), 0);
    assert_int_equal(s.failover, GPS_FAILOVER_CONTINUE);
    gps_job_spec_clear(&s);
    static const char *const badv[] = {"{\"failover\":\"retry\"}", "{\"failover\":\"\"}",
                                       "{\"failover\":1}", "{\"failover\":true}",
                                       "{\"failover\":[\"continue\"]}",
                                       "{\"failover\":\"CONTINUE\"}"};
    for (size_t i = 0; i < sizeof badv / sizeof badv[0]; i++) {
        p = NULL;
        if (parse(badv[i], &s, &p) != -1)
            fail_msg("accepted %s", badv[i]);
        assert_non_null(p);
        assert_string_equal(p, "x_pool_options.failover");
        gps_job_spec_clear(&s);
    }
}

static void test_fallback_models(void **st)
{
    (void)st;
    gps_job_spec s;
    const char *p;
    assert_int_equal(parse("{\"fallback_models\":[\"b\",\"c\"]}", &s, &p), 0);
    assert_int_equal(s.n_fallback, 2);
    assert_string_equal(s.fallback_models[0], "b");
    assert_string_equal(s.fallback_models[1], "c");
    gps_job_spec_clear(&s);
    assert_int_equal(s.n_fallback, 0);
    assert_int_equal(parse("{\"fallback_models\":[]}", &s, &p), 0);
    assert_int_equal(s.n_fallback, 0);
    gps_job_spec_clear(&s);
    assert_int_equal(parse("{\"fallback_models\":[\"a\",\"b\",\"c\",\"d\"]}", &s, &p), 0);
    assert_int_equal(s.n_fallback, 4);
    assert_string_equal(s.fallback_models[3], "d");
    gps_job_spec_clear(&s);
    char longname[400];
    memset(longname, 'x', 300);
    longname[300] = '\0';
    char toolong[512];
    snprintf(toolong, sizeof toolong, "{\"fallback_models\":[\"%s\"]}", longname);
    const char *badv[] = {"{\"fallback_models\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}",
                          "{\"fallback_models\":\"b\"}",
                          "{\"fallback_models\":{\"b\":1}}",
                          "{\"fallback_models\":[\"b\",2]}",
                          "{\"fallback_models\":[null]}",
                          "{\"fallback_models\":[\"\"]}",
                          "{\"fallback_models\":[[\"b\"]]}",
                          toolong};
    for (size_t i = 0; i < sizeof badv / sizeof badv[0]; i++) {
        p = NULL;
        if (parse(badv[i], &s, &p) != -1)
            fail_msg("accepted %s", badv[i]);
        assert_non_null(p);
        assert_string_equal(p, "x_pool_options.fallback_models");
        gps_job_spec_clear(&s); /* what was filled so far is freed (ASan) */
    }
}

static void test_together(void **st)
{
    (void)st;
    gps_job_spec s;
    const char *p;
    assert_int_equal(parse("{\"priority\":\"batch\",\"failover\":\"restart\","
                           "\"fallback_models\":[\"small\"],\"session\":\"s1\","
                           "\"labels\":{\"gpu\":\"a100\"},\"prefer_agent\":\"ag\"}",
                           &s, &p),
                     0);
    assert_int_equal(s.priority, GPS_PRIO_BATCH);
    assert_int_equal(s.failover, GPS_FAILOVER_RESTART);
    assert_int_equal(s.n_fallback, 1);
    assert_string_equal(s.fallback_models[0], "small");
    assert_string_equal(s.session, "s1");
    assert_int_equal(s.n_labels, 1);
    gps_job_spec_clear(&s);
}

static json_t *load(const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j)
        fail_msg("test JSON does not parse: %s", text);
    return j;
}

/* Every dialect goes through the shared parser. */
static void test_dialects(void **st)
{
    (void)st;
    char msg[256];
    const char *p;
    /* OpenAI */
    json_t *j = load("{\"model\":\"m\",\"prompt\":\"x\",\"x_pool_options\":"
                     "{\"failover\":\"error\",\"fallback_models\":[\"m2\"]}}");
    gps_openai_req o;
    assert_int_equal(gps_openai_parse(j, false, &o, msg, sizeof msg, &p), 0);
    assert_int_equal(o.spec.failover, GPS_FAILOVER_ERROR);
    assert_int_equal(o.spec.n_fallback, 1);
    gps_job_spec_clear(&o.spec);
    json_decref(j);
    j = load("{\"model\":\"m\",\"prompt\":\"x\",\"x_pool_options\":{\"failover\":\"never\"}}");
    assert_int_equal(gps_openai_parse(j, false, &o, msg, sizeof msg, &p), -1);
    assert_string_equal(p, "x_pool_options.failover");
    json_decref(j);
    /* Anthropic */
    j = load("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
             "\"hi\"}],\"x_pool_options\":{\"failover\":\"restart\",\"fallback_models\":"
             "[\"m2\",\"m3\"]}}");
    gps_anthropic_req a;
    assert_int_equal(gps_anthropic_parse(j, false, &a, msg, sizeof msg), 0);
    assert_int_equal(a.spec.failover, GPS_FAILOVER_RESTART);
    assert_int_equal(a.spec.n_fallback, 2);
    assert_string_equal(a.spec.fallback_models[1], "m3");
    gps_anthropic_req_clear(&a);
    json_decref(j);
    j = load("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
             "\"hi\"}],\"x_pool_options\":{\"fallback_models\":[1]}}");
    assert_int_equal(gps_anthropic_parse(j, false, &a, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "fallback_models"));
    json_decref(j);
    /* native */
    j = load("{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":4,\"x_pool_options\":"
             "{\"failover\":\"continue\",\"fallback_models\":[\"m2\"]}}");
    gps_job_spec s;
    assert_int_equal(gps_tasks_parse(j, &s, msg, sizeof msg, &p), 0);
    assert_int_equal(s.failover, GPS_FAILOVER_CONTINUE);
    assert_int_equal(s.n_fallback, 1);
    gps_job_spec_clear(&s);
    json_decref(j);
    j = load("{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":4,"
             "\"x_pool_options\":{\"failover\":2}}");
    assert_int_equal(gps_tasks_parse(j, &s, msg, sizeof msg, &p), -1);
    assert_string_equal(p, "x_pool_options.failover");
    json_decref(j);
}

/* The wire form of a continuation attempt: the text so far as
 * continuation, and only what is left of max_tokens. */
static void test_wire_continuation(void **st)
{
    (void)st;
    gps_job *job = calloc(1, sizeof *job);
    assert_non_null(job);
    job->spec.kind = GPS_JOB_COMPLETION;
    job->spec.model = strdup("m1");
    job->spec.prompt = strdup("hello ::");
    job->spec.max_tokens = 10;
    job->attempts = 1;
    gp_buf_init(&job->text);
    json_t *w = gps_job_wire(job, 0, 60);
    assert_string_equal(json_string_value(json_object_get(w, "continuation")), "");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(w, "params"),
                                                        "max_tokens")),
                     10);
    json_decref(w);
    /* After a failover with 3 tokens sent. */
    gp_buf_append(&job->text, " a0 b1 c2", 9);
    job->completion_tokens = job->continued_tokens = 3;
    job->attempts = 2;
    w = gps_job_wire(job, 0, 60);
    assert_string_equal(json_string_value(json_object_get(w, "continuation")), " a0 b1 c2");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(w, "params"),
                                                        "max_tokens")),
                     7);
    assert_int_equal(json_integer_value(json_object_get(w, "attempt")), 2);
    assert_string_equal(json_string_value(json_object_get(w, "prompt")), "hello ::");
    json_decref(w);
    /* The budget is spent (stop-string slack): still at least 1. */
    job->continued_tokens = 12;
    w = gps_job_wire(job, 0, 60);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(w, "params"),
                                                        "max_tokens")),
                     1);
    json_decref(w);
    gp_buf_free(&job->text);
    gps_job_spec_clear(&job->spec);
    free(job);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failover_modes),
        cmocka_unit_test(test_fallback_models),
        cmocka_unit_test(test_together),
        cmocka_unit_test(test_dialects),
        cmocka_unit_test(test_wire_continuation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
