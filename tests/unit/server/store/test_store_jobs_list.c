/* store: gps_store_jobs_list_async, the admin API's request-log read:
 * exact filters (NULL = any), newest first, limit, the `before` cursor,
 * and no request/checkpoint payload in the rows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "common/gp_util.h"
#include "server/store/store.h"

#include "db_fixture.h"

typedef struct got {
    int calls;
    int status;
    char ids[16][40];
    size_t n;
    bool payload;      /* a row came with request or checkpoint */
} got;

static void list_cb(void *arg, int status, const gps_store_job_info *jobs, size_t n)
{
    got *g = arg;
    g->calls++;
    g->status = status;
    g->n = n;
    for (size_t i = 0; i < n && i < 16; i++) {
        snprintf(g->ids[i], sizeof g->ids[i], "%s", jobs[i].id);
        if (jobs[i].request || jobs[i].checkpoint_text || jobs[i].events)
            g->payload = true;
    }
}

static void loop_until(struct event_base *base, const int *flag)
{
    struct timeval tv = {0, 10000};
    for (int i = 0; i < 2000 && !*flag; i++) {
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
}

static void add(gps_store *s, const char *id, const char *model, const char *key, int64_t at,
                const char *status, const char *agent)
{
    json_t *req = json_pack("{s:s}", "prompt", "secret");
    gps_store_job_row r = {.id = id, .api = "openai", .kind = "chat", .model = model,
                           .key_id = key, .status = "queued", .created_at = at, .request = req};
    assert_int_equal(gps_store_job_insert(s, r), 0);
    json_decref(req);
    gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT(id);
    u.status = status;
    u.agent_id = agent;
    assert_int_equal(gps_store_job_update_async(s, u), 0);
    assert_int_equal(gps_store_checkpoint(s, id, "text", 4, 1), 0);
}

static got list(struct event_base *base, gps_store *s, gps_store_job_filter f)
{
    got g;
    memset(&g, 0, sizeof g);
    assert_int_equal(gps_store_jobs_list_async(s, &f, list_cb, &g), 0);
    loop_until(base, &g.calls);
    assert_int_equal(g.calls, 1);
    assert_int_equal(g.status, 0);
    assert_false(g.payload);
    return g;
}

static void test_filters_order_cursor(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    char err[256];
    gps_store *s = gps_store_open(t->db, base, NULL, err, sizeof err);
    assert_non_null(s);
    add(s, "job_1", "m1", "key_a", 1000, "done", "ag1");
    add(s, "job_2", "m2", "key_a", 2000, "failed", "ag2");
    add(s, "job_3", "m1", NULL, 3000, "done", "ag2");
    add(s, "job_4", "m1", "key_b", 4000, "running", "ag1");

    got g = list(base, s, (gps_store_job_filter){.limit = 10});
    assert_int_equal(g.n, 4);
    assert_string_equal(g.ids[0], "job_4"); /* newest first */
    assert_string_equal(g.ids[3], "job_1");

    g = list(base, s, (gps_store_job_filter){.status = "done", .model = "m1", .limit = 10});
    assert_int_equal(g.n, 2);
    assert_string_equal(g.ids[0], "job_3");
    assert_string_equal(g.ids[1], "job_1");

    g = list(base, s, (gps_store_job_filter){.agent_id = "ag2", .key_id = "key_a", .limit = 10});
    assert_int_equal(g.n, 1);
    assert_string_equal(g.ids[0], "job_2");

    g = list(base, s, (gps_store_job_filter){.limit = 2});
    assert_int_equal(g.n, 2);
    assert_string_equal(g.ids[1], "job_3");
    g = list(base, s, (gps_store_job_filter){.limit = 2, .before = 3000});
    assert_int_equal(g.n, 2);
    assert_string_equal(g.ids[0], "job_2");
    assert_string_equal(g.ids[1], "job_1");

    g = list(base, s, (gps_store_job_filter){.model = "nope", .limit = 10});
    assert_int_equal(g.n, 0);

    gps_store_job_filter bad = {.limit = 0};
    got none = {0};
    assert_int_equal(gps_store_jobs_list_async(s, &bad, list_cb, &none), -1);
    gps_store_close(s);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_filters_order_cursor, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
