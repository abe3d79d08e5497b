/* Native task API: POST /v2/tasks validation (fields, seed generation,
 * priority, session_id), the Last-Event-ID parser, and a stored task's
 * status body whole or nothing under out of memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/dialects/api_tasks.h"
#include "server/dialects/api_tasks_priv.h"
#include "server/store/store.h"

#include "../fixture_oom.h"

static int parse(const char *text, gps_job_spec *s, const char **param, char *msg, size_t n)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j)
        fail_msg("test JSON does not parse: %s", text);
    int rc = gps_tasks_parse(j, s, msg, n, param);
    json_decref(j);
    return rc;
}

static void bad(const char *text, const char *want_param)
{
    gps_job_spec s;
    const char *param = "unset";
    char msg[256];
    if (parse(text, &s, &param, msg, sizeof msg) != -1)
        fail_msg("expected an error for %s", text);
    if (want_param == NULL ? param != NULL : (param == NULL || strcmp(param, want_param) != 0))
        fail_msg("%s: param %s, expected %s (%s)", text, param ? param : "NULL",
                 want_param ? want_param : "NULL", msg);
}

static void test_ok(void **state)
{
    (void)state;
    gps_job_spec s;
    const char *param;
    char msg[256];
    assert_int_equal(parse("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":5,\"seed\":42,"
                           "\"priority\":\"batch\",\"session_id\":\"s\",\"stop\":\"\\n\","
                           "\"temperature\":0,\"top_k\":3}",
                           &s, &param, msg, sizeof msg),
                     0);
    assert_int_equal(s.kind, GPS_JOB_COMPLETION);
    assert_string_equal(s.api, "native");
    assert_string_equal(s.prompt, "p");
    assert_int_equal(s.max_tokens, 5);
    assert_true(s.has_seed);
    assert_int_equal(s.seed, 42);
    assert_int_equal(s.priority, GPS_PRIO_BATCH);
    assert_string_equal(s.session, "s");
    assert_int_equal(json_array_size(s.stop), 1);
    assert_int_equal(s.top_k, 3);
    gps_job_spec_clear(&s);

    /* no seed: one is generated and recorded */
    assert_int_equal(parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                           "\"max_tokens\":1}",
                           &s, &param, msg, sizeof msg),
                     0);
    assert_int_equal(s.kind, GPS_JOB_CHAT);
    assert_true(s.has_seed);
    assert_int_equal(s.priority, GPS_PRIO_INTERACTIVE);
    assert_int_equal(json_array_size(s.messages), 1);
    gps_job_spec_clear(&s);
}

/* A generated seed is random and fits 31 bits (what the agents' sampler
 * and every JSON reader take). Over 64 draws: each in [0, 2^31), and not
 * all the same (a constant, e.g. an unused random source, fails). A seed
 * of 32 random bits fails the range with probability 1 - 2^-64. */
/* session_id and x_pool_options.session both given: the pool option wins
 * and the first copy is freed (a fuzz run found it leaked; ASan says so). */
static void test_session_twice(void **state)
{
    (void)state;
    gps_job_spec s;
    char msg[256];
    const char *param = NULL;
    json_t *body = json_loads("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1,"
                              "\"session_id\":\"abc\",\"x_pool_options\":{\"session\":\"xyz\"}}",
                              0, NULL);
    assert_non_null(body);
    assert_int_equal(gps_tasks_parse(body, &s, msg, sizeof msg, &param), 0);
    assert_string_equal(s.session, "xyz");
    gps_job_spec_clear(&s);
    json_decref(body);
}

static void test_generated_seed(void **state)
{
    (void)state;
    long long first = -1;
    bool varied = false;
    for (int i = 0; i < 64; i++) {
        gps_job_spec s;
        const char *param;
        char msg[256];
        assert_int_equal(parse("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1}", &s, &param,
                               msg, sizeof msg),
                         0);
        assert_true(s.has_seed);
        assert_in_range(s.seed, 0, 0x7fffffff);
        if (i == 0)
            first = s.seed;
        else if (s.seed != first)
            varied = true;
        gps_job_spec_clear(&s);
    }
    assert_true(varied);
}

static void test_bad(void **state)
{
    (void)state;
    bad("[1]", NULL);
    bad("{\"prompt\":\"p\",\"max_tokens\":5}", "model");
    bad("{\"model\":\"m\",\"max_tokens\":5}", "prompt");
    bad("{\"model\":\"m\",\"prompt\":\"p\"}", "max_tokens");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":0}", "max_tokens");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"messages\":[],\"max_tokens\":1}", "prompt");
    bad("{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}],\"max_tokens\":1}",
        "messages");
    bad("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[]}],\"max_tokens\":1}",
        "messages");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1,\"priority\":\"urgent\"}", "priority");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1,\"priority\":1}", "priority");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1,\"seed\":\"x\"}", "seed");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1,\"temperature\":3}", "temperature");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1,\"stop\":[\"\"]}", "stop");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1,\"session_id\":\"\"}", "session_id");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1,\"x_pool_options\":{\"labels\":[]}}",
        "x_pool_options.labels");
}

static void test_last_event_id(void **state)
{
    (void)state;
    assert_int_equal(gps_tasks_last_event_id(NULL), 0);
    assert_int_equal(gps_tasks_last_event_id(""), 0);
    assert_int_equal(gps_tasks_last_event_id("17"), 17);
    assert_int_equal(gps_tasks_last_event_id("-1"), -1);
    assert_int_equal(gps_tasks_last_event_id("1x"), -1);
    assert_int_equal(gps_tasks_last_event_id("99999999999999999999999"), -1);
}

/* tasks_status_cold under a failing allocator: every run gives the whole
 * status or NULL (the reply is then 500), never one without its result,
 * error, usage or timings. */
static void sweep_cold(const gps_store_job_info *j)
{
    json_t *want = tasks_status_cold(j);
    assert_non_null(want);
    size_t bad = 0, n;
    for (n = 1;; n++) {
        arm(n);
        json_t *got = tasks_status_cold(j);
        bool hit = disarm();
        if (got && !json_equal(got, want)) {
            print_message("run %zu: a status with a part missing\n", n);
            print_diff("status", got, want);
            bad++;
        }
        json_decref(got);
        if (!hit)
            break;
    }
    assert_true(n > 3); /* the sweep reached the builder's allocations */
    assert_int_equal(bad, 0);
    json_decref(want);
}

static void test_status_cold_oom(void **state)
{
    (void)state;
    gps_store_job_info j = {.id = "job_1", .api = "native", .kind = "chat", .model = "m",
                            .agent_id = "a1", .status = "done", .attempts = 1,
                            .prompt_tokens = 5, .completion_tokens = 7, .queue_ms = 3,
                            .ttft_ms = 9, .total_ms = 40, .finish_reason = "length",
                            .has_seed = true, .seed = 42, .checkpoint_text = "Hello there",
                            .checkpoint_len = 11, .checkpoint_seq = -1};
    json_t *o = tasks_status_cold(&j), *want = J(
        "{\"job_id\":\"job_1\",\"status\":\"done\",\"model\":\"m\",\"priority\":"
        "\"interactive\",\"attempts\":1,\"agent_id\":\"a1\",\"seed\":42,\"timings\":"
        "{\"queue_ms\":3,\"ttft_ms\":9,\"total_ms\":40},\"usage\":{\"prompt_tokens\":5,"
        "\"completion_tokens\":7},\"result\":{\"text\":\"Hello there\",\"finish_reason\":"
        "\"length\"}}");
    if (!json_equal(o, want)) {
        print_diff("status", o, want);
        fail();
    }
    json_decref(o);
    json_decref(want);
    sweep_cold(&j);
    j.status = "failed";
    j.error_code = "AGENT_LOST";
    j.has_seed = false;
    j.ttft_ms = -1;
    sweep_cold(&j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ok),
        cmocka_unit_test(test_generated_seed),
        cmocka_unit_test(test_session_twice),
        cmocka_unit_test(test_bad),
        cmocka_unit_test(test_last_event_id),
        cmocka_unit_test(test_status_cold_oom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
