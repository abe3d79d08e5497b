/* stream: the deferred free (stream.h). A finished stream's owner is freed
 * from the loop once the callback that finished it has returned, never in
 * that callback; at shutdown every free still waiting runs at once. No
 * socket: the stream's loop is set by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/event.h>

#include "server/stream/stream.h"

typedef struct owner {
    gps_stream s;
    int *freed;
} owner;

static void owner_free(void *arg)
{
    owner *o = arg;
    (*o->freed)++;
    gps_stream_clear(&o->s);
    free(o);
}

static void gone(void *arg)
{
    (void)arg;
    fail_msg("gone after the owner finished");
}

static const gps_stream_ops OPS = {.gone = gone};

static owner *owner_new(struct event_base *base, int *freed)
{
    owner *o = calloc(1, sizeof *o);
    assert_non_null(o);
    o->freed = freed;
    gps_stream_init(&o->s, &OPS, o, NULL, "corr");
    o->s.base = base; /* what init takes from the request's connection */
    return o;
}

/* What a callback deep in a chain does when the reply completes: after it
 * the owner must still be there for the callers up the stack. */
static void finish_in_callback(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    owner *o = arg;
    int before = *o->freed;
    gps_stream_free_later(&o->s, owner_free);
    gps_stream_free_later(&o->s, owner_free); /* idempotent */
    assert_int_equal(*o->freed, before);      /* still ours to read */
    assert_true(o->s.closing);
    assert_null(o->s.req);
}

static void test_freed_after_the_callback(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    assert_non_null(base);
    int freed = 0;
    owner *o = owner_new(base, &freed);
    struct event *ev = event_new(base, -1, 0, finish_in_callback, o);
    event_active(ev, EV_TIMEOUT, 1);
    event_base_loop(base, EVLOOP_NONBLOCK);
    /* The free runs from the loop's queue (this turn or the next). */
    event_base_loop(base, EVLOOP_NONBLOCK);
    assert_int_equal(freed, 1);
    event_free(ev);
    event_base_free(base);
}

/* Without a loop there is no later: the free runs at once. */
static void test_no_loop_frees_now(void **state)
{
    (void)state;
    int freed = 0;
    owner *o = owner_new(NULL, &freed);
    gps_stream_free_later(&o->s, owner_free);
    assert_int_equal(freed, 1);
}

/* Shutdown: the loop will not turn again; reap_all frees what waits, in
 * any order, each once. */
static void test_reap_all(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    int freed = 0;
    owner *a = owner_new(base, &freed), *b = owner_new(base, &freed), *c = owner_new(base, &freed);
    gps_stream_free_later(&a->s, owner_free);
    gps_stream_free_later(&b->s, owner_free);
    gps_stream_free_later(&c->s, owner_free);
    assert_int_equal(freed, 0);
    gps_stream_reap_all();
    assert_int_equal(freed, 3);
    gps_stream_reap_all();
    assert_int_equal(freed, 3);
    event_base_loop(base, EVLOOP_NONBLOCK); /* nothing left active */
    assert_int_equal(freed, 3);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_freed_after_the_callback),
        cmocka_unit_test(test_no_loop_frees_now),
        cmocka_unit_test(test_reap_all),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
