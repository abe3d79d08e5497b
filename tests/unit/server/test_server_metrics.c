/* Prometheus registry and text exposition. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "server/metrics.h"

static void collect(gps_metrics *m, void *arg)
{
    int *calls = arg;
    (*calls)++;
    gps_metrics_reset(m, "queue_depth");
    gps_metrics_set(m, "queue_depth", "model=\"m\",priority=\"batch\"", 4);
}

static void test_render(void **st)
{
    (void)st;
    gps_metrics *m = gps_metrics_new();
    assert_non_null(m);
    assert_int_equal(gps_metrics_define_server(m), 0);
    int calls = 0;
    gps_metrics_set_collector(m, collect, &calls);
    char l[128];
    gps_metrics_label(l, sizeof l, "api", "openai", "outcome", "ok", (char *)NULL);
    assert_string_equal(l, "api=\"openai\",outcome=\"ok\"");
    gps_metrics_add(m, "requests_total", l, 1);
    gps_metrics_add(m, "requests_total", l, 2);
    assert_true(gps_metrics_get(m, "requests_total", l) == 3);
    gps_metrics_observe(m, "request_duration_seconds", "api=\"openai\"", 0.003);
    gps_metrics_observe(m, "request_duration_seconds", "api=\"openai\"", 0.7);
    gps_metrics_observe(m, "request_duration_seconds", "api=\"openai\"", 1000);
    gp_buf b;
    gp_buf_init(&b);
    assert_int_equal(gps_metrics_render(m, &b), 0);
    assert_int_equal(calls, 1);
    const char *t = b.data;
    assert_non_null(strstr(t, "# HELP gpupool_requests_total "));
    assert_non_null(strstr(t, "# TYPE gpupool_requests_total counter\n"));
    assert_non_null(strstr(t, "gpupool_requests_total{api=\"openai\",outcome=\"ok\"} 3\n"));
    assert_non_null(strstr(t, "# TYPE gpupool_request_duration_seconds histogram\n"));
    /* cumulative buckets */
    assert_non_null(strstr(t, "gpupool_request_duration_seconds_bucket{api=\"openai\",le=\"0.005\"} 1\n"));
    assert_non_null(strstr(t, "gpupool_request_duration_seconds_bucket{api=\"openai\",le=\"1\"} 2\n"));
    assert_non_null(strstr(t, "gpupool_request_duration_seconds_bucket{api=\"openai\",le=\"+Inf\"} 3\n"));
    assert_non_null(strstr(t, "gpupool_request_duration_seconds_count{api=\"openai\"} 3\n"));
    assert_non_null(strstr(t, "gpupool_queue_depth{model=\"m\",priority=\"batch\"} 4\n"));
    assert_non_null(strstr(t, "gpupool_tokens_generated_total 0\n"));
    gp_buf_free(&b);
    gps_metrics_free(m);
}

/* The helpers carry the documented label sets; closed label sets start at
 * 0; a histogram's buckets are cumulative and end with +Inf == _count. */
static void test_server_families(void **st)
{
    (void)st;
    gps_metrics *m = gps_metrics_new();
    assert_non_null(m);
    assert_int_equal(gps_metrics_define_server(m), 0);
    gps_metrics_request(m, "openai", "ok", 0.2);
    gps_metrics_request(m, "openai", "ok", 3);
    gps_metrics_request(m, "anthropic", "queue_full", 0.001);
    gps_metrics_ttft(m, "openai", "tiny", 0.03);
    gps_metrics_sched_latency(m, "tiny", "batch", 0.0005);
    gps_metrics_sched_latency(m, "tiny", "batch", 1000);
    gps_metrics_rate_limited(m, "rpm");
    assert_true(gps_metrics_get(m, "requests_total", "api=\"openai\",outcome=\"ok\"") == 2);
    assert_true(gps_metrics_get(m, "rate_limited_total", "reason=\"rpm\"") == 1);
    gp_buf b;
    gp_buf_init(&b);
    assert_int_equal(gps_metrics_render(m, &b), 0);
    const char *t = b.data;
    static const char *want[] = {
        "gpupool_request_duration_seconds_bucket{api=\"openai\",outcome=\"ok\",le=\"0.1\"} 0\n",
        "gpupool_request_duration_seconds_bucket{api=\"openai\",outcome=\"ok\",le=\"0.25\"} 1\n",
        "gpupool_request_duration_seconds_bucket{api=\"openai\",outcome=\"ok\",le=\"5\"} 2\n",
        "gpupool_request_duration_seconds_bucket{api=\"openai\",outcome=\"ok\",le=\"+Inf\"} 2\n",
        "gpupool_request_duration_seconds_sum{api=\"openai\",outcome=\"ok\"} 3.2\n",
        "gpupool_request_duration_seconds_count{api=\"openai\",outcome=\"ok\"} 2\n",
        "gpupool_requests_total{api=\"anthropic\",outcome=\"queue_full\"} 1\n",
        "gpupool_time_to_first_token_seconds_count{api=\"openai\",model=\"tiny\"} 1\n",
        "# TYPE gpupool_scheduling_latency_seconds histogram\n",
        "gpupool_scheduling_latency_seconds_bucket{model=\"tiny\",priority=\"batch\",le=\"0.001\"} 1\n",
        "gpupool_scheduling_latency_seconds_bucket{model=\"tiny\",priority=\"batch\",le=\"120\"} 1\n",
        "gpupool_scheduling_latency_seconds_bucket{model=\"tiny\",priority=\"batch\",le=\"+Inf\"} 2\n",
        "gpupool_rate_limited_total{reason=\"rpm\"} 1\n",
        "gpupool_rate_limited_total{reason=\"tokens_per_day\"} 0\n",
        "gpupool_rate_limited_total{reason=\"queue_full\"} 0\n",
        "gpupool_failovers_total{mode=\"exhausted\"} 0\n",
        "# TYPE gpupool_agent_queue_depth gauge\n",
        "# TYPE gpupool_agent_kv_cache_utilization gauge\n",
        "# TYPE gpupool_auth_failures_total counter\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(t, want[i]))
            fail_msg("missing: %s\nin:\n%s", want[i], t);
    /* Every family once, HELP before TYPE. */
    assert_null(strstr(strstr(t, "# TYPE gpupool_tokens_generated_total") + 1,
                       "# TYPE gpupool_tokens_generated_total"));
    gp_buf_free(&b);
    gps_metrics_free(m);
}

static void test_label_escape(void **st)
{
    (void)st;
    char l[128];
    gps_metrics_label(l, sizeof l, "model", "a\"b\\c\nd", (char *)NULL);
    assert_string_equal(l, "model=\"a\\\"b\\\\c\\nd\"");
    char small[12];
    gps_metrics_label(small, sizeof small, "model", "averyveryverylongname", (char *)NULL);
    assert_true(strlen(small) < sizeof small);
}

/* The outcome label is a closed table: an agent's own code is
 * "agent_error", server codes keep their lower-cased name. */
static void test_outcome_table(void **st)
{
    (void)st;
    assert_string_equal(gps_metrics_outcome("ok"), "ok");
    assert_string_equal(gps_metrics_outcome("QUEUE_FULL"), "queue_full");
    assert_string_equal(gps_metrics_outcome("AGENT_LOST"), "agent_lost");
    assert_string_equal(gps_metrics_outcome("X_12345"), "agent_error");
    assert_string_equal(gps_metrics_outcome("UPSTREAM_ERROR"), "agent_error");
    assert_string_equal(gps_metrics_outcome("queue_full_but_much_longer_than_any_name_in_table"),
                        "agent_error");
    assert_string_equal(gps_metrics_outcome(""), "agent_error");
    assert_string_equal(gps_metrics_outcome(NULL), "agent_error");
    gps_metrics *m = gps_metrics_new();
    assert_non_null(m);
    assert_int_equal(gps_metrics_define_server(m), 0);
    gps_metrics_request(m, "openai", "X_random", 0.1);
    assert_true(gps_metrics_get(m, "requests_total", "api=\"openai\",outcome=\"agent_error\"") ==
                1);
    assert_true(gps_metrics_get(m, "requests_total", "api=\"openai\",outcome=\"x_random\"") ==
                0);
    gps_metrics_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render),
        cmocka_unit_test(test_outcome_table),
        cmocka_unit_test(test_server_families),
        cmocka_unit_test(test_label_escape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
