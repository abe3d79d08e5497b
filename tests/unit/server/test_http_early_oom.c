/* POST /agents/poll with the allocation failure armed from the start of
 * the request (fixture_oom.h arm_beneath: the N-th of the project's malloc,
 * calloc or realloc fails, jansson's among them through gp_json's counting
 * allocator; N = 1, 2, ... until a run ends without reaching it), so that
 * the failure lands early: in the HTTP layer's gate (src/server/http/), its
 * connection set-up, the head's parse, then the route. Every run must end
 * with a reply, 200 or 500 INTERNAL in the native dialect (the server's
 * out-of-memory reply everywhere: the gate's was a 503 OUT_OF_MEMORY), or
 * with the connection closed, well within the server's timeouts (never a
 * connection left open without a reply, never a loop that spins), and the
 * server then serves the next poll on a new connection.
 *
 * Only the project's allocations fail here, not libevent's (evhttp's own
 * parse): libevent 2.1.12 crashes on some of its own allocation failures
 * (evhttp_connection_base_bufferevent_new frees a half-made connection).
 *
 * Real agents_api on a real gps_http bound to loopback, real registry,
 * scheduler and jobs (fixture_fleet.h); the client is a plain socket. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
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
} server;

/* Every key allowed; nothing armed here (the sweep arms before the
 * request's bytes reach the server). */
static int auth_any(void *arg, const char *credential, gps_role role, char key_id[65],
                    const char *client)
{
    (void)arg, (void)credential, (void)role, (void)client;
    key_id[0] = '\0';
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
    gps_http_set_auth(s->h, auth_any, NULL);
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

/* A run that has not ended in this long is a connection left hanging:
 * far below the server's header, body and idle timeouts (30 s). */
#define RUN_WAIT_MS 3000

/* How a poll ended: its reply's status, CLOSED (the server closed the
 * connection without a whole reply) or HUNG (neither within RUN_WAIT_MS). */
enum { CLOSED = -1, HUNG = -2 };

/* Set around each event_base_loop pass: a pass that does not return (a
 * callback that spins) is caught by the alarm, which names the run. */
static volatile sig_atomic_t in_loop;
static size_t run_n;

static void on_alarm(int sig)
{
    (void)sig;
    char msg[128];
    int n = snprintf(msg, sizeof msg, "run %zu: the event loop did not return (%s)\n", run_n,
                     in_loop ? "spinning in a callback" : "in the test");
    if (n > 0)
        (void)!write(2, msg, (size_t)n);
    _exit(1);
}

/* One POST /agents/poll on the agent's connection: the reply's status (or
 * CLOSED / HUNG), its body into body (fixed storage: nothing allocated
 * here while the sweep is armed). */
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
    *body = out;
    for (int ms = 0; ms < RUN_WAIT_MS; ms++) {
        alarm(10);
        in_loop = 1;
        event_base_loop(s->base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        in_loop = 0;
        alarm(0);
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
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
            return CLOSED;
        if (k < 0)
            usleep(1000);
    }
    return HUNG;
}

/* A refusal's body in the native dialect: {"error":{"code":...}}. */
static bool native_error(const char *body, const char *code)
{
    json_t *r = json_loads(body, 0, NULL);
    const char *got = json_string_value(json_object_get(json_object_get(r, "error"), "code"));
    bool ok = got && strcmp(got, code) == 0;
    json_decref(r);
    return ok;
}

static void test_poll_early_oom(void **state)
{
    (void)state;
    signal(SIGALRM, on_alarm);
    size_t n, bad = 0, failed = 0, closed = 0;
    for (n = 1;; n++) {
        run_n = n;
        server s;
        server_start(&s);
        char out[8192];
        const char *body;
        reconnect(&s);
        arm_beneath(n);
        int st = poll_once(&s, out, sizeof out, &body);
        bool hit = disarm();
        if (st == 500) {
            failed++;
            if (!native_error(body, "INTERNAL")) {
                print_message("run %zu: %d with an unexpected body: %s\n", n, st, body);
                bad++;
            }
        } else if (st == CLOSED) {
            closed++;
        } else if (st != 200) {
            print_message("run %zu: the poll %s%d: %.300s\n", n,
                          st == HUNG ? "got no reply and was not closed " : "answered ", st, out);
            bad++;
        }
        /* The server goes on: the next poll, on a new connection, is served. */
        reconnect(&s);
        st = poll_once(&s, out, sizeof out, &body);
        if (st != 200) {
            print_message("run %zu: the next poll answered %d: %.300s\n", n, st, out);
            bad++;
        }
        server_stop(&s);
        if (!hit)
            break;
    }
    print_message("early poll sweep: %zu runs, %zu answered 500, %zu closed\n", n, failed,
                  closed);
    assert_true(failed + closed > 0);
    assert_int_equal(bad, 0);
}

/* The second sweep fails libevent's allocations made while the request
 * gate runs (its evbuffers: the bytes held back, the request passed on to
 * evhttp), none else: the linker sends the gate's entry points here
 * (CMakeLists.txt: --wrap=http_gate_run,--wrap=http_input_cb). evhttp's own
 * allocations are left alone: libevent 2.1.12 answers a bare 400 for some
 * of them, and crashes on others (bufferevent_setwatermark, a connection's
 * set-up), which no code of ours can change. */
static bool ev_armed, in_gate;

struct evbuffer_cb_info;
void __real_http_gate_run(void *c);
void __wrap_http_gate_run(void *c);
void __real_http_input_cb(struct evbuffer *b, const struct evbuffer_cb_info *i, void *arg);
void __wrap_http_input_cb(struct evbuffer *b, const struct evbuffer_cb_info *i, void *arg);

void __wrap_http_gate_run(void *c)
{
    bool was = in_gate;
    in_gate = true;
    __real_http_gate_run(c);
    in_gate = was;
}

void __wrap_http_input_cb(struct evbuffer *b, const struct evbuffer_cb_info *i, void *arg)
{
    bool was = in_gate;
    in_gate = true;
    __real_http_input_cb(b, i, arg);
    in_gate = was;
}

static void *ev_malloc(size_t n)
{
    return ev_armed && in_gate && fail_now() ? NULL : __real_malloc(n);
}

static void *ev_realloc(void *p, size_t n)
{
    return ev_armed && in_gate && fail_now() ? NULL : __real_realloc(p, n);
}

static void test_poll_gate_buffers_oom(void **state)
{
    (void)state;
    signal(SIGALRM, on_alarm);
    size_t n, bad = 0, failed = 0, closed = 0;
    for (n = 1;; n++) {
        run_n = n;
        server s;
        server_start(&s);
        char out[8192];
        const char *body;
        reconnect(&s);
        for (int i = 0; i < 5; i++) /* accepted and gated */
            event_base_loop(s.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        countdown = n; /* libevent's allocations in the gate alone */
        injected = false;
        ev_armed = true;
        int st = poll_once(&s, out, sizeof out, &body);
        ev_armed = false;
        bool hit = disarm();
        if (st == 500) {
            failed++;
        } else if (st == CLOSED) {
            closed++;
        } else if (st != 200) {
            print_message("run %zu: the poll %s%d: %.300s\n", n,
                          st == HUNG ? "got no reply and was not closed " : "answered ", st, out);
            bad++;
        }
        reconnect(&s);
        st = poll_once(&s, out, sizeof out, &body);
        if (st != 200) {
            print_message("run %zu: the next poll answered %d: %.300s\n", n, st, out);
            bad++;
        }
        server_stop(&s);
        if (!hit)
            break;
    }
    print_message("gate sweep: %zu runs, %zu answered 500, %zu closed\n", n, failed, closed);
    assert_int_equal(bad, 0);
}

/* A route in the OpenAI dialect: answers 204, nothing allocated. */
static void openai_ok(gps_req *r, void *arg)
{
    (void)arg;
    gps_http_send_reply(r->req, 204, NULL, NULL);
}

/* The gate's out-of-memory reply comes in the route's dialect: a head it
 * has no memory to parse, for an OpenAI path, is answered 500 with
 * OpenAI's error shape (error.type, error.code "internal"), not the native
 * one. */
static void test_openai_path_early_oom(void **state)
{
    (void)state;
    signal(SIGALRM, on_alarm);
    size_t n, bad = 0, openai_500 = 0;
    for (n = 1;; n++) {
        run_n = n;
        server s;
        server_start(&s);
        assert_int_equal(gps_http_add_route(s.h, EVHTTP_REQ_POST, "/v1/chat/completions",
                                            GPS_DIALECT_OPENAI, GPS_ROLE_CLIENT, openai_ok, NULL),
                         0);
        char out[8192];
        reconnect(&s);
        static const char req[] = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                  "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
        assert_int_equal(send(s.c, req, sizeof req - 1, 0), (ssize_t)(sizeof req - 1));
        arm_beneath(n);
        int st = HUNG;
        size_t got = 0;
        out[0] = '\0';
        for (int ms = 0; ms < RUN_WAIT_MS && st == HUNG; ms++) {
            alarm(10);
            in_loop = 1;
            event_base_loop(s.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
            in_loop = 0;
            alarm(0);
            ssize_t k = recv(s.c, out + got, sizeof out - 1 - got, MSG_DONTWAIT);
            if (k > 0) {
                got += (size_t)k;
                out[got] = '\0';
            }
            const char *end = strstr(out, "\r\n\r\n"), *cl = strstr(out, "Content-Length: ");
            if (end && (!cl || got >= (size_t)(end + 4 - out) + strtoul(cl + 16, NULL, 10)))
                st = (int)strtol(out + 9, NULL, 10);
            else if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
                st = CLOSED;
            else if (k < 0)
                usleep(1000);
        }
        bool hit = disarm();
        if (st == 500) {
            json_t *b = json_loads(strstr(out, "\r\n\r\n") + 4, 0, NULL);
            json_t *e = json_object_get(b, "error");
            const char *code = json_string_value(json_object_get(e, "code"));
            if (json_is_string(json_object_get(e, "type")) && code && strcmp(code, "internal") == 0) {
                openai_500++;
            } else {
                print_message("run %zu: 500 not in OpenAI's shape: %.300s\n", n, out);
                bad++;
            }
            json_decref(b);
        } else if (st != 204 && st != CLOSED) {
            print_message("run %zu: answered %d: %.300s\n", n, st, out);
            bad++;
        }
        server_stop(&s);
        if (!hit)
            break;
    }
    print_message("openai path sweep: %zu runs, %zu answered OpenAI's 500\n", n, openai_500);
    assert_true(openai_500 > 0);
    assert_int_equal(bad, 0);
}

int main(void)
{
    gp_json_init(); /* as the server's main: jansson's allocations counted (gp_json.h) */
    event_set_mem_functions(ev_malloc, ev_realloc, free);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_poll_early_oom),
        cmocka_unit_test(test_poll_gate_buffers_oom),
        cmocka_unit_test(test_openai_path_early_oom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
