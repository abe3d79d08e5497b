/* POST /agents/poll under memory pressure (fixture_oom.h arm_beneath: the
 * N-th of the project's malloc, calloc or realloc fails, jansson's among
 * them through gp_json's counting allocator; N = 1, 2, ... until a run
 * ends without reaching it): a cancel the server has for the agent reaches
 * it exactly once, in the reply of this poll or of the next one. Its record
 * goes only once a reply that carries it is written; the code before
 * dropped it while making the list (gps_jobs_pending_cancels), so a list
 * or reply that could not be made lost it: the agent went on generating
 * for a client that had left.
 *
 * Real agents_api on a real gps_http bound to loopback, real registry,
 * scheduler and jobs (fixture_agents_http.h); the client is a plain socket. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/gp_json.h"
#include "fixture_agents_http.h"
#include "fixture_oom.h"

#define AGENT AGENTS_HTTP_AGENT

/* One POST /agents/poll on the agent's connection, which must be answered. */
static int poll_once(agents_http *s, char *out, size_t cap, const char **body)
{
    int st = agents_http_poll(s, out, cap, body, 5000);
    if (st <= 0)
        fail_msg("no whole reply to the poll: %s", out);
    return st;
}

/* How many cancels of job_id a 200 reply's commands carry. */
static int cancels_in(const char *body, const char *job_id)
{
    json_t *r = json_loads(body, 0, NULL);
    assert_non_null(r);
    int k = 0;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(r, "commands"), i, c)
    {
        const char *type = json_string_value(json_object_get(c, "type"));
        const char *id = json_string_value(json_object_get(c, "job_id"));
        k += type && id && strcmp(type, "cancel") == 0 && strcmp(id, job_id) == 0;
    }
    json_decref(r);
    return k;
}

static void test_poll_cancel_oom(void **state)
{
    (void)state;
    size_t n, bad = 0, failed = 0;
    for (n = 1;; n++) {
        agents_http_run = n;
        agents_http s;
        agents_http_start(&s, arm_beneath);
        char out[8192];
        const char *body;
        agents_http_reconnect(&s);
        assert_int_equal(poll_once(&s, out, sizeof out, &body), 200); /* registered */
        registry_agent *a = registry_get(s.f.reg, AGENT);
        assert_non_null(a);
        gps_job_spec sp = fleet_spec("m1", 64);
        gps_job *job = fleet_submit(&s.f, &sp);
        json_decref(fleet_take(&s.f, a));
        char job_id[40];
        snprintf(job_id, sizeof job_id, "%s", gps_job_id(job));
        gps_jobs_cancel(s.f.jobs, job, "client left"); /* its agent is to stop it */
        agents_http_reconnect(&s);
        s.arm_at = n;
        int st = poll_once(&s, out, sizeof out, &body);
        bool hit = disarm();
        int first = st == 200 ? cancels_in(body, job_id) : 0;
        failed += st != 200;
        if (st != 200 && st != 500) {
            print_message("run %zu: the poll answered %d: %s\n", n, st, body);
            bad++;
        }
        /* The next poll carries it when this one did not: once in all. */
        agents_http_reconnect(&s);
        assert_int_equal(poll_once(&s, out, sizeof out, &body), 200);
        int second = cancels_in(body, job_id);
        if (first + second != 1) {
            print_message("run %zu: the cancel went %d time(s) in the poll (%d) and %d in the "
                          "next\n",
                          n, first, st, second);
            bad++;
        }
        agents_http_stop(&s);
        if (!hit)
            break;
    }
    print_message("poll sweep: %zu runs, %zu answered 500\n", n, failed);
    assert_true(failed > 0);
    assert_int_equal(bad, 0);
}

int main(void)
{
    gp_json_init(); /* as the server's main: jansson's allocations counted (gp_json.h) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_poll_cancel_oom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
