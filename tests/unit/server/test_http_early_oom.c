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
 * parse): those go through the server's allocator with its reserve
 * (evmem.h), swept in test_http_evmem_oom.c.
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

/* A run that has not ended in this long is a connection left hanging:
 * far below the server's header, body and idle timeouts (30 s). */
#define RUN_WAIT_MS 3000

/* How a poll ended: its reply's status, CLOSED (the server closed the
 * connection without a whole reply) or HUNG (neither within RUN_WAIT_MS). */
enum { CLOSED = AGENTS_HTTP_CLOSED, HUNG = AGENTS_HTTP_NONE };

/* One POST /agents/poll on the agent's connection: the reply's status (or
 * CLOSED / HUNG), its body into body (fixed storage: nothing allocated
 * here while the sweep is armed). */
static int poll_once(agents_http *s, char *out, size_t cap, const char **body)
{
    return agents_http_poll(s, out, cap, body, RUN_WAIT_MS);
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
    size_t n, bad = 0, failed = 0, closed = 0;
    for (n = 1;; n++) {
        agents_http_run = n;
        agents_http s;
        agents_http_start(&s, NULL);
        char out[8192];
        const char *body;
        agents_http_reconnect(&s);
        arm_beneath(n);
        int st = poll_once(&s, out, sizeof out, &body);
        bool hit = disarm();
        if (st == 500 && !native_error(body, "INTERNAL")) {
            print_message("run %zu: %d with an unexpected body: %s\n", n, st, body);
            bad++;
        }
        bad += agents_http_poll_then_next(&s, n, st, out, sizeof out, RUN_WAIT_MS, &failed,
                                          &closed);
        agents_http_stop(&s);
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
 * (CMakeLists.txt: --wrap=http_gate_run,--wrap=http_input_cb), through a
 * plain allocator without the server's reserve: the gate handles their
 * failures itself. libevent's elsewhere (evhttp's, a connection's set-up)
 * need the reserve (evmem.h): test_http_evmem_oom.c. */
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
    size_t n, bad = 0, failed = 0, closed = 0;
    for (n = 1;; n++) {
        agents_http_run = n;
        agents_http s;
        agents_http_start(&s, NULL);
        char out[8192];
        const char *body;
        agents_http_reconnect(&s);
        for (int i = 0; i < 5; i++) /* accepted and gated */
            agents_http_turn(&s);
        countdown = n; /* libevent's allocations in the gate alone */
        injected = false;
        ev_armed = true;
        int st = poll_once(&s, out, sizeof out, &body);
        ev_armed = false;
        bool hit = disarm();
        bad += agents_http_poll_then_next(&s, n, st, out, sizeof out, RUN_WAIT_MS, &failed,
                                          &closed);
        agents_http_stop(&s);
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
    size_t n, bad = 0, openai_500 = 0;
    for (n = 1;; n++) {
        agents_http_run = n;
        agents_http s;
        agents_http_start(&s, NULL);
        assert_int_equal(gps_http_add_route(s.h, EVHTTP_REQ_POST, "/v1/chat/completions",
                                            GPS_DIALECT_OPENAI, GPS_ROLE_CLIENT, openai_ok, NULL),
                         0);
        char out[8192];
        agents_http_reconnect(&s);
        static const char req[] = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                  "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
        agents_http_send(s.c, req, sizeof req - 1);
        arm_beneath(n);
        const char *body;
        int st = agents_http_reply(&s, s.c, out, sizeof out, &body, RUN_WAIT_MS);
        bool hit = disarm();
        if (st == 500) {
            json_t *b = json_loads(body, 0, NULL);
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
        agents_http_stop(&s);
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
