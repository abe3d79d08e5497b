/* relay_set: bursts of at most `burst` ready sockets, level-triggered
 * round the set, what a socket is watched for (and only that) reported,
 * unwatch, and a descriptor closed without an unwatch then reused. Real
 * socketpairs on a real event base. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>

#include "agent/relay_set.h"

enum { NPAIRS = 10, BURST = 4 };

typedef struct {
    int calls, max_n, seen[1024], reads;
    short last_what[1024];
    bool drain; /* read what is ready (else leave it: it must come back) */
} rec;

static void on_ready(void *arg, const relay_ready *r, int n)
{
    rec *c = arg;
    c->calls++;
    if (n > c->max_n)
        c->max_n = n;
    for (int i = 0; i < n; i++) {
        assert_true(r[i].fd >= 0 && r[i].fd < 1024);
        c->seen[r[i].fd]++;
        c->last_what[r[i].fd] = r[i].what;
        if (c->drain && (r[i].what & EV_READ)) {
            char b[16];
            if (read(r[i].fd, b, sizeof b) > 0)
                c->reads++;
        }
    }
}

static void turn(struct event_base *base, int times)
{
    for (int i = 0; i < times; i++)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
}

static void test_bursts_go_round(void **st)
{
    (void)st;
    struct event_base *base = event_base_new();
    assert_non_null(base);
    rec c = {0};
    relay_set *rs = relay_set_new(base, 0, BURST, on_ready, &c);
    assert_non_null(rs);
    int sv[NPAIRS][2];
    for (int i = 0; i < NPAIRS; i++) {
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv[i]), 0);
        assert_int_equal(relay_set_watch(rs, sv[i][0], EV_READ), 0);
        assert_int_equal(write(sv[i][1], "x", 1), 1);
    }
    assert_int_equal(relay_set_count(rs), NPAIRS);
    /* Not drained: each look hands on at most BURST, and the kernel's
     * ready list goes round, so every socket comes up within a few. */
    turn(base, 6);
    assert_true(c.calls >= 3);
    assert_int_equal(c.max_n, BURST);
    for (int i = 0; i < NPAIRS; i++)
        assert_true(c.seen[sv[i][0]] >= 1);
    /* Drained: every one is read once, then nothing is ready. */
    c.drain = true;
    turn(base, 6);
    assert_int_equal(c.reads, NPAIRS);
    int calls = c.calls;
    turn(base, 3);
    assert_int_equal(c.calls, calls);
    for (int i = 0; i < NPAIRS; i++) {
        relay_set_unwatch(rs, sv[i][0]);
        close(sv[i][0]);
        close(sv[i][1]);
    }
    assert_int_equal(relay_set_count(rs), 0);
    relay_set_free(rs);
    event_base_free(base);
}

static void test_what_is_watched(void **st)
{
    (void)st;
    struct event_base *base = event_base_new();
    rec c = {.drain = true};
    relay_set *rs = relay_set_new(base, 0, BURST, on_ready, &c);
    assert_non_null(rs);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    /* Writable at once. */
    assert_int_equal(relay_set_watch(rs, sv[0], EV_WRITE), 0);
    turn(base, 1);
    assert_int_equal(c.seen[sv[0]], 1);
    assert_int_equal(c.last_what[sv[0]], EV_WRITE);
    /* Changed to reading: nothing until a byte comes. */
    assert_int_equal(relay_set_watch(rs, sv[0], EV_READ), 0);
    assert_int_equal(relay_set_count(rs), 1);
    turn(base, 2);
    assert_int_equal(c.seen[sv[0]], 1);
    assert_int_equal(write(sv[1], "y", 1), 1);
    turn(base, 1);
    assert_int_equal(c.seen[sv[0]], 2);
    assert_int_equal(c.last_what[sv[0]], EV_READ);
    /* Unwatched: a byte is not reported. */
    relay_set_unwatch(rs, sv[0]);
    relay_set_unwatch(rs, sv[0]); /* twice: nothing */
    assert_false(relay_set_has(rs, sv[0]));
    assert_int_equal(write(sv[1], "z", 1), 1);
    turn(base, 2);
    assert_int_equal(c.seen[sv[0]], 2);
    /* A hang-up reports what the socket is watched for only. */
    char b[4];
    assert_int_equal(read(sv[0], b, sizeof b), 1);
    assert_int_equal(relay_set_watch(rs, sv[0], EV_READ), 0);
    close(sv[1]);
    c.drain = false;
    turn(base, 1);
    assert_int_equal(c.seen[sv[0]], 3);
    assert_int_equal(c.last_what[sv[0]], EV_READ);
    /* Bad arguments. */
    assert_int_equal(relay_set_watch(rs, -1, EV_READ), -1);
    assert_int_equal(relay_set_watch(rs, sv[0], 0), -1);
    relay_set_unwatch(rs, sv[0]);
    close(sv[0]);
    relay_set_free(rs);
    event_base_free(base);
}

/* A socket closed while watched leaves the kernel's set by itself; the
 * same descriptor number, reused, is watched again as a new one. */
static void test_closed_then_reused(void **st)
{
    (void)st;
    struct event_base *base = event_base_new();
    rec c = {.drain = true};
    relay_set *rs = relay_set_new(base, 0, BURST, on_ready, &c);
    int sv[2], sv2[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    assert_int_equal(relay_set_watch(rs, sv[0], EV_READ), 0);
    int fd = sv[0];
    close(sv[0]);
    close(sv[1]);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv2), 0);
    int mine = sv2[0] == fd ? 0 : sv2[1] == fd ? 1 : -1;
    if (mine < 0) { /* the number went elsewhere: make it ours */
        assert_int_equal(dup2(sv2[0], fd), fd);
        close(sv2[0]);
        sv2[0] = fd;
        mine = 0;
    }
    assert_true(relay_set_has(rs, fd)); /* the set still counts it */
    /* The same mask as before: still MOD (ENOENT), then ADD. */
    assert_int_equal(relay_set_watch(rs, fd, EV_READ), 0);
    assert_int_equal(write(sv2[1 - mine], "q", 1), 1);
    turn(base, 1);
    assert_int_equal(c.seen[fd], 1);
    assert_int_equal(c.last_what[fd], EV_READ);
    assert_int_equal(c.reads, 1);
    /* And a changed one. */
    assert_int_equal(relay_set_watch(rs, fd, EV_READ | EV_WRITE), 0);
    turn(base, 1);
    assert_int_equal(c.seen[fd], 2);
    assert_int_equal(c.last_what[fd], EV_WRITE); /* the byte was read */
    relay_set_unwatch(rs, fd);
    assert_int_equal(relay_set_count(rs), 0);
    close(sv2[0]);
    close(sv2[1]);
    relay_set_free(rs);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bursts_go_round),
        cmocka_unit_test(test_what_is_watched),
        cmocka_unit_test(test_closed_then_reused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
