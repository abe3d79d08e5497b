/* libevent's own allocations failing while a real request goes through
 * (evmem.h): POST /agents/poll on a real gps_http bound to loopback, real
 * agents_api, registry, scheduler and jobs (fixture_agents_http.h), with
 * libevent's allocator the server's (gps_evmem_init, as main.c installs
 * it) over a libc malloc that fails the N-th allocation libevent makes,
 * N = 1, 2, ... until a run ends without reaching it: the accept, the
 * connection's bufferevent and evhttp connection, the gate's evbuffers,
 * evhttp's parse, the watermarks, the reply.
 *
 * libevent 2.1.12 crashed on some of these (bufferevent_setwatermark with
 * the NULL of its callback entry, evhttp freeing a half-made connection)
 * or answered a bare HTML 400 (its parser). Now every run must end with a
 * reply (200, or the server's 500) or a closed connection within the
 * test's turns of the loop, and the next poll, on a new connection, is
 * served once the reserve is back. The second test holds the reserve
 * back: new connections wait unaccepted meanwhile, then are served. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/gp_json.h"
#include "common/gp_log.h"
#include "fixture_agents_http.h"
#include "fixture_oom.h"
#include "server/http/evmem.h"

/* Turns of the loop (about a millisecond each) a run may take: far below
 * the server's header, body and idle timeouts (30 s), far above the
 * reserve's retry (100 ms). */
#define RUN_WAIT_MS 3000

enum { CLOSED = AGENTS_HTTP_CLOSED, HUNG = AGENTS_HTTP_NONE };

/* The linker sends gps_evmem_init's event_set_mem_functions here
 * (CMakeLists.txt: --wrap=event_set_mem_functions): libevent gets the
 * module's functions wrapped in ones that mark the allocations as
 * libevent's, so that the libc malloc beneath fails only those. */
static void *(*evmem_m)(size_t);
static void *(*evmem_r)(void *, size_t);
static int in_ev;     /* inside libevent's allocator */
static bool ev_armed; /* libevent's allocations count (fixture_oom.h fail_now) */
static bool hold_low; /* the reserve cannot be allocated again */

void __real_event_set_mem_functions(void *(*m)(size_t), void *(*r)(void *, size_t),
                                    void (*f)(void *));
void __wrap_event_set_mem_functions(void *(*m)(size_t), void *(*r)(void *, size_t),
                                    void (*f)(void *));
void *__real_malloc(size_t n);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_realloc(void *p, size_t n);

static void *ev_malloc(size_t n)
{
    in_ev++;
    void *p = evmem_m(n);
    in_ev--;
    return p;
}

static void *ev_realloc(void *p, size_t n)
{
    in_ev++;
    void *q = evmem_r(p, n);
    in_ev--;
    return q;
}

void __wrap_event_set_mem_functions(void *(*m)(size_t), void *(*r)(void *, size_t),
                                    void (*f)(void *))
{
    evmem_m = m;
    evmem_r = r;
    __real_event_set_mem_functions(ev_malloc, ev_realloc, f);
}

/* The malloc of libevent's allocator (evmem.c) fails where the sweep says;
 * the reserve's own malloc (gps_evmem_restore, outside libevent's
 * allocator) fails while hold_low is set. */
void *__wrap_malloc(size_t n)
{
    if (in_ev && ev_armed && fail_now())
        return NULL;
    if (!in_ev && hold_low && n == gps_evmem_reserve_bytes())
        return NULL;
    return __real_malloc(n);
}

void *__wrap_realloc(void *p, size_t n)
{
    return in_ev && ev_armed && fail_now() ? NULL : __real_realloc(p, n);
}

/* A swept poll that ended with st: 200, a 500 or a closed connection
 * counted (both in *closed); anything else (a bare 400 from evhttp's
 * parser, no reply on an open connection) a problem. Then the next poll,
 * on a new connection, is served (agents_http_poll_then_next) and the
 * reserve is back. Returns the problems. */
static size_t poll_then_next(agents_http *s, size_t n, int st, char *out, size_t cap,
                             size_t *closed)
{
    size_t bad = agents_http_poll_then_next(s, n, st, out, cap, RUN_WAIT_MS, closed, closed);
    if (gps_evmem_low()) {
        print_message("run %zu: the reserve is not back after the next poll\n", n);
        bad++;
    }
    return bad;
}

static void test_poll_libevent_oom(void **state)
{
    (void)state;
    size_t n, bad = 0, closed = 0;
    for (n = 1;; n++) {
        agents_http_run = n;
        agents_http s;
        agents_http_start(&s, NULL);
        char out[8192];
        const char *body;
        agents_http_reconnect(&s); /* not accepted yet: the accept is swept too */
        countdown = n;
        injected = false;
        ev_armed = true;
        int st = agents_http_poll(&s, out, sizeof out, &body, RUN_WAIT_MS);
        ev_armed = false;
        bool hit = disarm();
        bad += poll_then_next(&s, n, st, out, sizeof out, &closed);
        agents_http_stop(&s);
        if (!hit)
            break;
    }
    print_message("libevent sweep: %zu runs, %zu closed or 500\n", n, closed);
    assert_true(n > 10); /* libevent's allocations were reached */
    assert_int_equal(bad, 0);
}

/* The reserve spent and not to be had: a new connection is not served
 * (it waits in the listener's backlog, or is closed when it was accepted
 * before the pause), and once memory allows the reserve again it is. */
static void test_accept_paused_while_low(void **state)
{
    (void)state;
    agents_http_run = 0;
    agents_http s;
    agents_http_start(&s, NULL);
    char out[8192];
    const char *body;
    agents_http_reconnect(&s);
    assert_int_equal(agents_http_poll(&s, out, sizeof out, &body, RUN_WAIT_MS), 200);

    hold_low = true;
    countdown = 1; /* the first of libevent's allocations on the next poll */
    injected = false;
    ev_armed = true;
    int st = agents_http_poll(&s, out, sizeof out, &body, RUN_WAIT_MS);
    ev_armed = false;
    assert_true(disarm());
    assert_true(st == 200 || st == CLOSED);
    assert_true(gps_evmem_low());

    agents_http_reconnect(&s);
    st = agents_http_poll(&s, out, sizeof out, &body, 500);
    assert_int_equal(st, HUNG); /* in the backlog: neither served nor closed */
    assert_true(gps_evmem_low());

    hold_low = false;
    st = agents_http_reply(&s, s.c, out, sizeof out, &body, RUN_WAIT_MS);
    assert_int_equal(st, 200);
    assert_false(gps_evmem_low());
    agents_http_stop(&s);
}

int main(void)
{
    gp_json_init(); /* as the server's main */
    assert_int_equal(gps_evmem_init(GPS_EVMEM_RESERVE_BYTES), 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_poll_libevent_oom),
        cmocka_unit_test(test_accept_paused_while_low),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
