/* flush: replies written at the end of the loop turn that made them, one
 * write a connection; a backlog left to the write event; a connection
 * freed before the turn ends skipped. A real evhttp on loopback and a raw
 * client socket. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>

#include "server/http/flush.h"

typedef struct {
    struct event_base *base;
    struct evhttp *evh;
    gps_flush *flush; /* NULL: the at-once fallback */
    int client;
    int handled;
    size_t body_len;    /* the reply's body ("x" repeated) */
    bool drop;          /* the handler frees the connection after its reply */
    bool free_flusher;  /* the handler frees the flusher after its reply */
    struct bufferevent *bev; /* the client's connection, while open */
    struct evhttp_connection *evcon;
    struct event *drop_ev;
    int alive_calls;
} fx;

/* Frees the connection later in the turn of its reply, before the flush
 * (made active first), outside evhttp's callbacks. */
static void drop_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    fx *f = arg;
    evhttp_connection_free(f->evcon);
}

static void closed_cb(struct evhttp_connection *evcon, void *arg)
{
    (void)evcon;
    ((fx *)arg)->bev = NULL;
}

/* What http.c answers from its table of connections. */
static bool alive(void *arg, int fd, struct bufferevent *bev)
{
    fx *f = arg;
    f->alive_calls++;
    return f->bev && bev == f->bev && fd == bufferevent_getfd(f->bev);
}

/* A chunked reply in four pieces, each marked: head, two chunks, end. */
static void handler(struct evhttp_request *req, void *arg)
{
    fx *f = arg;
    f->handled++;
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    f->bev = evhttp_connection_get_bufferevent(evcon);
    f->evcon = evcon;
    evhttp_connection_set_closecb(evcon, closed_cb, f);
    if (f->drop) {
        f->drop_ev = event_new(f->base, -1, 0, drop_cb, f);
        assert_non_null(f->drop_ev);
        event_active(f->drop_ev, EV_TIMEOUT, 0);
    }
    evhttp_send_reply_start(req, 200, "OK");
    gps_flush_conn(evcon);
    struct evbuffer *eb = evbuffer_new();
    char *body = malloc(f->body_len);
    assert_non_null(body);
    memset(body, 'x', f->body_len);
    size_t half = f->body_len / 2;
    evbuffer_add(eb, body, half);
    evhttp_send_reply_chunk(req, eb);
    gps_flush_conn(evcon);
    evbuffer_add(eb, body + half, f->body_len - half);
    evhttp_send_reply_chunk(req, eb);
    gps_flush_conn(evcon);
    evbuffer_free(eb);
    free(body);
    evhttp_send_reply_end(req);
    gps_flush_conn(evcon);
    if (f->free_flusher) {
        gps_flush_free(f->flush);
        f->flush = NULL;
    }
}

static void setup(fx *f, bool with_flusher, size_t body_len)
{
    memset(f, 0, sizeof *f);
    f->body_len = body_len;
    f->base = event_base_new();
    assert_non_null(f->base);
    f->evh = evhttp_new(f->base);
    assert_non_null(f->evh);
    evhttp_set_gencb(f->evh, handler, f);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(f->evh, "127.0.0.1", 0);
    assert_non_null(bs);
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    assert_int_equal(getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&sa, &sl), 0);
    if (with_flusher) {
        f->flush = gps_flush_new(f->base, alive, f);
        assert_non_null(f->flush);
    }
    f->client = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(f->client >= 0);
    assert_int_equal(connect(f->client, (struct sockaddr *)&sa, sizeof sa), 0);
}

static void teardown(fx *f)
{
    if (f->drop_ev)
        event_free(f->drop_ev);
    close(f->client);
    gps_flush_free(f->flush);
    evhttp_free(f->evh);
    event_base_free(f->base);
}

static void send_request(fx *f)
{
    const char *rq = "GET /x HTTP/1.1\r\nHost: t\r\n\r\n";
    assert_int_equal(send(f->client, rq, strlen(rq), 0), (ssize_t)strlen(rq));
}

/* Loop passes until the handler ran n times. */
static void run_until_handled(fx *f, int n)
{
    for (int i = 0; i < 1000 && f->handled < n; i++)
        event_base_loop(f->base, EVLOOP_ONCE);
    assert_int_equal(f->handled, n);
}

/* What the client can read now, without waiting; appended to *got. */
static size_t read_ready(fx *f, char **got, size_t *len)
{
    size_t before = *len;
    for (;;) {
        char tmp[65536];
        ssize_t n = recv(f->client, tmp, sizeof tmp, MSG_DONTWAIT);
        if (n <= 0)
            break;
        *got = realloc(*got, *len + (size_t)n + 1);
        assert_non_null(*got);
        memcpy(*got + *len, tmp, (size_t)n);
        *len += (size_t)n;
        (*got)[*len] = '\0';
    }
    return *len - before;
}

/* A whole chunked reply of body_len bytes ends the text read so far. */
static bool reply_complete(const char *got, size_t len)
{
    return len >= 5 && memcmp(got + len - 5, "0\r\n\r\n", 5) == 0 && strstr(got, "HTTP/1.1 200");
}

/* The pass that runs the handler writes the reply, head, chunks and end;
 * with evhttp alone it waits for the write event's next pass. */
static void test_written_in_the_turn(void **st)
{
    (void)st;
    fx f;
    setup(&f, true, 1000);
    send_request(&f);
    run_until_handled(&f, 1);
    char *got = NULL;
    size_t len = 0;
    read_ready(&f, &got, &len);
    assert_true(reply_complete(got, len));
    assert_true(f.alive_calls > 0);
    /* The write completed evhttp's request: the kept-alive connection
     * takes the next one. */
    send_request(&f);
    run_until_handled(&f, 2);
    len = 0;
    read_ready(&f, &got, &len);
    assert_true(reply_complete(got, len));
    free(got);
    teardown(&f);
}

static void test_without_flusher_evhttp_writes(void **st)
{
    (void)st;
    fx f;
    setup(&f, false, 1000);
    send_request(&f);
    run_until_handled(&f, 1);
    char *got = NULL;
    size_t len = 0;
    read_ready(&f, &got, &len);
    assert_int_equal(len, 0);
    for (int i = 0; i < 1000 && !reply_complete(got, len); i++) {
        event_base_loop(f.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        read_ready(&f, &got, &len);
    }
    assert_true(reply_complete(got, len));
    free(got);
    teardown(&f);
}

/* A reply larger than the socket takes: the rest goes with the write
 * event as the client reads, and the request still completes. */
static void test_backlog_left_to_write_event(void **st)
{
    (void)st;
    fx f;
    setup(&f, true, 16 * 1024 * 1024);
    send_request(&f);
    run_until_handled(&f, 1);
    char *got = NULL;
    size_t len = 0;
    read_ready(&f, &got, &len);
    assert_true(len > 0);
    assert_false(reply_complete(got, len));
    for (int i = 0; i < 100000 && !reply_complete(got, len); i++) {
        event_base_loop(f.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        read_ready(&f, &got, &len);
    }
    assert_true(reply_complete(got, len));
    assert_true(len > f.body_len);
    send_request(&f);
    run_until_handled(&f, 2);
    free(got);
    teardown(&f);
}

/* The connection is freed after its reply was marked, in the same turn:
 * the flush asks, and skips it (ASan: nothing freed is touched). */
static void test_connection_freed_before_flush(void **st)
{
    (void)st;
    fx f;
    setup(&f, true, 1000);
    f.drop = true;
    send_request(&f);
    run_until_handled(&f, 1);
    event_base_loop(f.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    /* Closed without the reply: freeing discards the connection's output. */
    char *got = NULL;
    size_t len = 0;
    for (;;) {
        char tmp[4096];
        ssize_t n = recv(f.client, tmp, sizeof tmp, 0);
        if (n <= 0)
            break;
        got = realloc(got, len + (size_t)n + 1);
        assert_non_null(got);
        memcpy(got + len, tmp, (size_t)n);
        len += (size_t)n;
        got[len] = '\0';
    }
    assert_false(got && reply_complete(got, len));
    assert_true(f.alive_calls > 0);
    free(got);
    teardown(&f);
}

/* Freed with marks pending (the loop stopped): what was marked is
 * written, no callback runs, no reference is left. */
static void test_free_writes_pending(void **st)
{
    (void)st;
    fx f;
    setup(&f, true, 1000);
    f.free_flusher = true;
    send_request(&f);
    run_until_handled(&f, 1);
    assert_null(f.flush);
    char *got = NULL;
    size_t len = 0;
    read_ready(&f, &got, &len);
    assert_true(reply_complete(got, len));
    free(got);
    teardown(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_written_in_the_turn),
        cmocka_unit_test(test_without_flusher_evhttp_writes),
        cmocka_unit_test(test_backlog_left_to_write_event),
        cmocka_unit_test(test_connection_freed_before_flush),
        cmocka_unit_test(test_free_writes_pending),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
