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
 * scheduler and jobs (fixture_fleet.h); the client is a plain socket. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include <arpa/inet.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/gp_json.h"
#include "fixture_fleet.h"
#include "fixture_oom.h"
#include "server/agents_api.h"
#include "server/http/http.h"

#define AGENT "00000000-0000-4000-8000-000000000001"
#define POLL_BODY                                                                              \
    "{\"agent_id\":\"" AGENT "\",\"name\":\"a1\",\"models\":[{\"id\":\"m1\"}],"               \
    "\"slots\":{\"total\":2}}"

typedef struct server {
    struct event_base *base;
    fleet f;
    gps_agents *g;
    gps_http *h;
    int port;
    int c; /* the agent's connection for the next poll (poll_once's) */
    char job_id[40];
} server;

/* The auth hook (every key allowed) arms the sweep: its failures start at
 * the request's handling, past the HTTP gate's own (which refuses 503
 * OUT_OF_MEMORY, out of this test's scope). */
static size_t arm_at; /* 0: nothing to arm */

static int auth_arming(void *arg, const char *credential, gps_role role, char key_id[65],
                       const char *client)
{
    (void)arg, (void)credential, (void)role, (void)client;
    key_id[0] = '\0';
    if (arm_at)
        arm_beneath(arm_at);
    arm_at = 0;
    return 0;
}

static void server_start(server *s)
{
    memset(s, 0, sizeof *s);
    s->base = event_base_new();
    assert_non_null(s->base);
    gps_agents_opts ao = {.poll_interval_sec = 15, .work_wait_sec = 25,
                          .agent_timeout_sec = 90, .disconnect_grace_ms = 1000};
    s->g = gps_agents_new(s->base, &ao, NULL, NULL);
    assert_non_null(s->g);
    registry_config rc;
    registry_config_default(&rc);
    rc.listener = gps_agents_on_transition;
    rc.listener_ud = s->g;
    fleet_init_on(&s->f, s->base, NULL, &rc, NULL);
    assert_int_equal(gps_agents_attach(s->g, s->f.reg, s->f.s, s->f.jobs), 0);
    gps_http_opts o = {.max_body_bytes = 1 << 20, .max_header_bytes = 1 << 16,
                       .idle_timeout_sec = 30, .max_inflight_body_bytes = 1 << 24,
                       .header_timeout_sec = 30, .body_timeout_sec = 30};
    s->h = gps_http_new(s->base, &o);
    assert_non_null(s->h);
    assert_int_equal(gps_agents_register(s->h, s->g), 0);
    gps_http_set_auth(s->h, auth_arming, NULL);
    char err[128];
    assert_int_equal(gps_http_bind(s->h, "127.0.0.1", 0, &s->port, err, sizeof err), 0);
    s->c = -1;
}

/* A new connection for each poll (made before the sweep is armed). */
static void reconnect(server *s)
{
    if (s->c >= 0)
        close(s->c);
    s->c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(s->c, (struct sockaddr *)&a, sizeof a), 0);
}

static void server_stop(server *s)
{
    if (s->c >= 0)
        close(s->c);
    gps_http_free(s->h);
    gps_agents_free(s->g);
    fleet_free(&s->f);
    event_base_free(s->base);
}

/* One POST /agents/poll on the agent's connection: the reply's status,
 * its body into body (fixed storage: nothing allocated here while the
 * sweep is armed). */
static int poll_once(server *s, char *out, size_t cap, const char **body)
{
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /agents/poll HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     strlen(POLL_BODY), POLL_BODY);
    assert_int_equal(send(s->c, req, (size_t)n, 0), n);
    size_t got = 0;
    out[0] = '\0';
    for (int round = 0; round < 5000; round++) {
        event_base_loop(s->base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        ssize_t k = recv(s->c, out + got, cap - 1 - got, MSG_DONTWAIT);
        if (k > 0) {
            got += (size_t)k;
            out[got] = '\0';
        }
        const char *end = strstr(out, "\r\n\r\n"), *cl = strstr(out, "Content-Length: ");
        if (end && cl && got >= (size_t)(end + 4 - out) + strtoul(cl + 16, NULL, 10)) {
            *body = end + 4;
            return (int)strtol(out + 9, NULL, 10);
        }
        if (k <= 0)
            usleep(1000);
    }
    fail_msg("no whole reply to the poll: %s", out);
    return -1;
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
        server s;
        server_start(&s);
        char out[8192];
        const char *body;
        reconnect(&s);
        assert_int_equal(poll_once(&s, out, sizeof out, &body), 200); /* registered */
        registry_agent *a = registry_get(s.f.reg, AGENT);
        assert_non_null(a);
        gps_job_spec sp = fleet_spec("m1", 64);
        gps_job *job = fleet_submit(&s.f, &sp);
        json_decref(fleet_take(&s.f, a));
        snprintf(s.job_id, sizeof s.job_id, "%s", gps_job_id(job));
        gps_jobs_cancel(s.f.jobs, job, "client left"); /* its agent is to stop it */
        reconnect(&s);
        arm_at = n;
        int st = poll_once(&s, out, sizeof out, &body);
        bool hit = disarm();
        int first = st == 200 ? cancels_in(body, s.job_id) : 0;
        failed += st != 200;
        if (st != 200 && st != 500) {
            print_message("run %zu: the poll answered %d: %s\n", n, st, body);
            bad++;
        }
        /* The next poll carries it when this one did not: once in all. */
        reconnect(&s);
        assert_int_equal(poll_once(&s, out, sizeof out, &body), 200);
        int second = cancels_in(body, s.job_id);
        if (first + second != 1) {
            print_message("run %zu: the cancel went %d time(s) in the poll (%d) and %d in the "
                          "next\n",
                          n, first, st, second);
            bad++;
        }
        server_stop(&s);
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
