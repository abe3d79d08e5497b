/* job wire: gps_job_wire_append writes the job's wire object as text
 * (issue 24, fourth round). It must be the bytes that gp_json_dump_append
 * writes for gps_job_wire's jansson object, byte for byte, for every part
 * of the wire a job can have, over strings that need escapes (quotes,
 * backslashes, control characters, non-ASCII) and over the cases where
 * jansson refuses a string or a number (the jansson path decides then). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/jobs/jobs_internal.h"

static const char *ODD = "a\"b\\c\n\r\t\x01\x1f/\x7f caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";

static json_t *J(const char *s)
{
    json_t *j = json_loads(s, 0, NULL);
    assert_non_null(j);
    return j;
}

/* A job with only the fields the wire reads. */
static gps_job *job_new(void)
{
    gps_job *job = calloc(1, sizeof *job);
    assert_non_null(job);
    snprintf(job->id, sizeof job->id, "job_0123456789abcdef01234567");
    snprintf(job->correlation_id, sizeof job->correlation_id, "corr-\"1\"");
    gp_buf_init(&job->text);
    job->spec.kind = GPS_JOB_CHAT;
    job->spec.model = strdup("m1");
    job->spec.max_tokens = 64;
    job->spec.temperature = 0.7;
    job->spec.top_p = 1;
    job->spec.top_k = 40;
    job->attempts = 1;
    job->created_us = 1000000;
    job->sampler_seed = 0x123456789abcdefLL;
    return job;
}

static void job_free(gps_job *job)
{
    gps_job_spec_clear(&job->spec);
    free(job->gen_ids);
    gp_buf_free(&job->text);
    free(job);
}

/* The text is what the jansson object dumps, appended after what out
 * held; returns the append's result. */
static int assert_same(const gps_job *job, uint64_t now_us)
{
    gp_buf want, got;
    gp_buf_init(&want);
    gp_buf_init(&got);
    gp_buf_append(&got, "[x,", 3);
    json_t *w = gps_job_wire(job, now_us, 600);
    if (w)
        assert_int_equal(gp_json_dump_append(&want, w), 0);
    int rc = gps_job_wire_append(&got, job, now_us, 600);
    assert_int_equal(rc, w ? 0 : 1);
    if (got.len != 3 + want.len || memcmp(got.data + 3, want.data ? want.data : "", want.len))
        fprintf(stderr, "got:  %s\nwant: %s\n", got.data + 3, want.data ? want.data : "");
    assert_int_equal(got.len, 3 + want.len);
    assert_memory_equal(got.data, "[x,", 3);
    assert_memory_equal(got.data + 3, want.data ? want.data : "", want.len);
    json_decref(w);
    gp_buf_free(&want);
    gp_buf_free(&got);
    return rc;
}

static void test_plain_job(void **st)
{
    (void)st;
    gps_job *job = job_new();
    assert_same(job, 5000000);       /* prompt and messages null, no seed, no stop */
    job->spec.kind = GPS_JOB_COMPLETION;
    job->spec.prompt = strdup(ODD);
    job->spec.has_seed = true;
    job->spec.seed = -42;
    job->spec.stop = J("[\"\\n\\n\",\"END\\u00e9\"]");
    assert_same(job, 700000000);    /* past the deadline: 0 */
    job_free(job);
}

static void test_every_part(void **st)
{
    (void)st;
    static const double reals[][2] = {{0, 1}, {0.1 + 0.2, 0.95}, {1e-5, 1e-7}, {2, 0.5},
                                      {1.5e300, 123456789.125}};
    gps_job *job = job_new();
    gps_job_spec *s = &job->spec;
    free(s->model);
    s->model = strdup("m\xc3\xa9\"/\\");
    s->messages = J("[{\"role\":\"system\",\"content\":\"be \\\"brief\\\"\\u0001\"},"
                    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"h\\u00e9\"}]},"
                    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]},"
                    "{\"role\":\"tool\",\"content\":\"1.5\",\"x\":1.25,\"y\":-3}]");
    s->tools = J("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                 "{\"type\":\"object\",\"properties\":{}}}}]");
    s->tool_choice = J("{\"type\":\"function\",\"function\":{\"name\":\"f\"}}");
    s->response_format = J("{\"type\":\"json_object\"}");
    s->input = J("[\"x\",[1,2,3]]");
    s->user = strdup(ODD);
    s->priority = GPS_PRIO_BATCH;
    snprintf(s->pool_via, sizeof s->pool_via, "pool-a,pool-\"b\"");
    snprintf(job->tenant, sizeof job->tenant, "0123456789abcdef0123456789abcdef");
    s->prompt_tokens_first = true;
    s->stop = J("[]");
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) {
        s->temperature = reals[i][0];
        s->top_p = reals[i][1];
        assert_same(job, 2000000);
    }
    /* A session of its own; then the text of a continuation. */
    s->session = strdup("sess\t1");
    job->continued_tokens = 3;
    gp_buf_append(&job->text, ODD, strlen(ODD));
    job->attempts = 2;
    assert_same(job, 2000000);
    /* Token-exact continuation: the ids, the digest, n_sampled. */
    job->continuation_mode = "tokens";
    job->n_gen_ids = 4;
    job->gen_ids = calloc(4, sizeof *job->gen_ids);
    job->gen_ids[0] = 0;
    job->gen_ids[1] = 7;
    job->gen_ids[2] = 2147483647;
    job->gen_ids[3] = -1;
    snprintf(job->ids_digest, sizeof job->ids_digest, "%064d", 5);
    s->max_tokens = 3; /* fewer left than generated: 1 */
    assert_same(job, 2000000);
    job->continuation_mode = "text";
    assert_same(job, 2000000);
    job_free(job);
}

/* Strings jansson refuses and numbers it cannot hold: whatever the jansson
 * path made of them (a key left out, or no wire at all). */
static void test_what_jansson_refuses(void **st)
{
    (void)st;
    gps_job *job = job_new();
    job->spec.prompt = strdup("bad \xff utf-8");  /* json_string: the key left out */
    assert_int_equal(assert_same(job, 0), 0);
    free(job->spec.prompt);
    job->spec.prompt = NULL;
    job->spec.user = strdup("\xc3(");
    assert_int_equal(assert_same(job, 0), 0);
    free(job->spec.user);
    job->spec.user = NULL;
    job->spec.temperature = NAN;                  /* json_pack: no wire */
    assert_int_equal(assert_same(job, 0), 1);
    job->spec.temperature = 1;
    free(job->spec.model);
    job->spec.model = strdup("\xe2\x82");         /* json_pack "s": no wire */
    assert_int_equal(assert_same(job, 0), 1);
    free(job->spec.model);
    job->spec.model = strdup("m");
    job->continued_tokens = 1;                    /* the continuation's text */
    gp_buf_append(&job->text, "\xf0\x9f", 2);
    assert_int_equal(assert_same(job, 0), 1);
    job_free(job);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_job),
        cmocka_unit_test(test_every_part),
        cmocka_unit_test(test_what_jansson_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
