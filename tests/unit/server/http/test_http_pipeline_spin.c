/* A client that pipelines many bytes behind a request whose reply is still
 * pending (a parked long-poll, a stream that has started) must not make the
 * server's loop spin. libevent 2.1 re-runs the read callback of a
 * bufferevent whose input sits at its read high watermark
 * (bufferevent_inbuf_wm_check), and http_conn_detach sets such a watermark
 * (max_header_bytes) until the reply is done: the suspicion was that the
 * pipelined bytes fill the input up to it and the loop spins for as long as
 * the reply is pending.
 *
 * Real gps_http on loopback with two routes of this test (one parks its
 * request, one starts an SSE stream and parks it), a plain socket client.
 * Over a one-second window the loop's passes (a timer wakes it every 100
 * ms) and this process's CPU time are measured: a spin is tens of
 * thousands of passes and ~100 % CPU, or a pass that never returns (an
 * alarm ends the test); an idle loop is ~10 passes and almost no CPU. Afterwards the reply is finished and the connection must
 * still work (the pipelined bytes are the next request's). */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <event2/event.h>
#include <event2/http.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/http/http.h"
#include "server/http/sse.h"

#define MAX_HEAD (16u << 10)
/* Pipelined bytes: several times the watermark, so that the input reaches
 * it whatever the kernel's buffers take. */
#define PIPELINED (8u * MAX_HEAD)

static struct evhttp_request *parked; /* the pending reply */

static void h_park(gps_req *r, void *arg)
{
    (void)arg;
    parked = r->req;
}

static void h_stream(gps_req *r, void *arg)
{
    (void)arg;
    gps_sse_start(r->req);
    parked = r->req;
}

static void wake_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
}

static double cpu_sec(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
           ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
}

static double now_sec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct window {
    unsigned long passes;
    double cpu, wall;
} window;

/* The libevent 2.1 spin does not even end its loop pass (the read
 * callback is re-deferred inside it, seen at 5 minutes of CPU in a pass):
 * an alarm catches a pass that does not return. */
static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "the event loop did not return: a callback spins\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
}

/* Run the loop one pass at a time for `sec` seconds. */
static window run_for(struct event_base *base, double sec)
{
    window w = {0};
    double t0 = now_sec(), c0 = cpu_sec();
    signal(SIGALRM, on_alarm);
    while (now_sec() - t0 < sec) {
        alarm(10);
        event_base_loop(base, EVLOOP_ONCE);
        alarm(0);
        w.passes++;
    }
    w.wall = now_sec() - t0;
    w.cpu = cpu_sec() - c0;
    return w;
}

typedef struct server {
    struct event_base *base;
    gps_http *h;
    struct event *wake;
    int port;
} server;

static void server_start(server *s)
{
    memset(s, 0, sizeof *s);
    s->base = event_base_new();
    assert_non_null(s->base);
    gps_http_opts o = {.max_body_bytes = 1 << 20, .max_header_bytes = MAX_HEAD,
                       .idle_timeout_sec = 30, .max_inflight_body_bytes = 1 << 24,
                       .header_timeout_sec = 30, .body_timeout_sec = 30};
    s->h = gps_http_new(s->base, &o);
    assert_non_null(s->h);
    assert_int_equal(gps_http_add_route(s->h, EVHTTP_REQ_GET, "/park", GPS_DIALECT_NATIVE,
                                        GPS_ROLE_NONE, h_park, NULL), 0);
    assert_int_equal(gps_http_add_route(s->h, EVHTTP_REQ_GET, "/stream", GPS_DIALECT_NATIVE,
                                        GPS_ROLE_NONE, h_stream, NULL), 0);
    char err[128];
    assert_int_equal(gps_http_bind(s->h, "127.0.0.1", 0, &s->port, err, sizeof err), 0);
    s->wake = event_new(s->base, -1, EV_PERSIST, wake_cb, NULL);
    struct timeval tv = {0, 100000};
    assert_int_equal(event_add(s->wake, &tv), 0);
    parked = NULL;
}

static void server_stop(server *s)
{
    event_free(s->wake);
    gps_http_free(s->h);
    event_base_free(s->base);
}

static int connect_loopback(int port)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(c, (struct sockaddr *)&a, sizeof a), 0);
    return c;
}

/* Send what fits without blocking, the loop run in between so that the
 * server reads what it will: the bytes sent. */
static size_t send_all(server *s, int c, const char *p, size_t n)
{
    size_t sent = 0;
    for (int tries = 0; sent < n && tries < 200; tries++) {
        ssize_t k = send(c, p + sent, n - sent, MSG_DONTWAIT);
        if (k > 0)
            sent += (size_t)k;
        else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            break;
        event_base_loop(s->base, EVLOOP_NONBLOCK);
    }
    return sent;
}

/* The window must look idle: a spin makes thousands of passes and uses the
 * CPU for the whole window. Wide margins for a loaded machine: only this
 * process's own CPU time counts. */
static void assert_idle(const char *what, window w)
{
    print_message("%s: %lu loop passes, %.3f s CPU in %.3f s\n", what, w.passes, w.cpu, w.wall);
    if (w.passes > 200 || w.cpu > 0.3 * w.wall)
        fail_msg("%s: the loop spun (%lu passes, %.3f s CPU in %.3f s)", what, w.passes, w.cpu,
                 w.wall);
}

/* The reply on c: read until `want` appears or the peer closes; returns
 * whether it did. */
static bool read_until(server *s, int c, const char *want)
{
    static char buf[1 << 16];
    size_t got = 0;
    for (int ms = 0; ms < 3000; ms++) {
        event_base_loop(s->base, EVLOOP_NONBLOCK);
        ssize_t k = recv(c, buf + got, sizeof buf - 1 - got, MSG_DONTWAIT);
        if (k > 0) {
            got += (size_t)k;
            buf[got] = '\0';
            if (strstr(buf, want))
                return true;
            if (got > sizeof buf / 2) {
                memmove(buf, buf + got - 1024, 1024);
                got = 1024;
                buf[got] = '\0';
            }
        } else if (k == 0) {
            return false;
        } else {
            usleep(1000);
        }
    }
    return false;
}

static void pending_then_pipeline(const char *path, bool stream)
{
    server s;
    server_start(&s);

    /* The baseline: one idle keep-alive connection. */
    int idle = connect_loopback(s.port);
    assert_idle("idle connection", run_for(s.base, 1.0));

    int c = connect_loopback(s.port);
    char req[128];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path);
    assert_int_equal(send_all(&s, c, req, (size_t)n), (size_t)n);
    for (int i = 0; i < 1000 && !parked; i++)
        event_base_loop(s.base, EVLOOP_NONBLOCK);
    assert_non_null(parked);
    if (stream)
        assert_true(read_until(&s, c, "text/event-stream"));

    /* The pipelined bytes: a next request whose head is far too long (a
     * header line of PIPELINED bytes), without its end. */
    static char pipe_bytes[PIPELINED];
    static const char next[] = "GET /park HTTP/1.1\r\nX-Pad: ";
    memcpy(pipe_bytes, next, sizeof next - 1);
    memset(pipe_bytes + sizeof next - 1, 'a', sizeof pipe_bytes - (sizeof next - 1));
    size_t sent = send_all(&s, c, pipe_bytes, sizeof pipe_bytes);
    print_message("%s: %zu pipelined bytes sent (watermark %u)\n", path, sent, MAX_HEAD);
    assert_true(sent >= MAX_HEAD);

    char what[64];
    snprintf(what, sizeof what, "%s pending, %zu bytes pipelined", path, sent);
    assert_idle(what, run_for(s.base, 1.0));

    /* The reply ends: the pipelined head is the next request's, refused as
     * too large (431), and the connection closed after it. */
    if (stream) {
        gps_sse_end(parked);
    } else {
        gps_http_send_reply(parked, 200, "OK", NULL);
    }
    parked = NULL;
    assert_true(read_until(&s, c, "431"));

    close(c);
    close(idle);
    server_stop(&s);
}

static void test_parked_reply_pipelined(void **st)
{
    (void)st;
    pending_then_pipeline("/park", false);
}

static void test_stream_pipelined(void **st)
{
    (void)st;
    pending_then_pipeline("/stream", true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parked_reply_pipelined),
        cmocka_unit_test(test_stream_pipelined),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
