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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render),
        cmocka_unit_test(test_label_escape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
