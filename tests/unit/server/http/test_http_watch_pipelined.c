/* The peer-close watch of a held request (gps_held_start with watch) must
 * still see the client go away after the client sent more bytes behind its
 * request (a pipelined request, a stray byte): the old watch stopped for
 * good at the first byte, so a client that pipelined and then hung up was
 * noticed only when the held reply was finally written, its job running
 * for nobody meanwhile.
 *
 * Real gps_http on loopback with a route that holds its request the way
 * the server's queued jobs and long-polls do (gps_held_start, watch on,
 * a gone callback), a plain socket client:
 * - bytes pipelined, then the client closes (FIN), resets (RST), or
 *   half-closes (shutdown SHUT_WR, treated as gone like the EOF the plain
 *   peek has always seen): gone runs while the loop waits for it;
 * - control: the pipelined request on a connection that stays open is
 *   answered after the held reply (keep-alive pipelining), gone never
 *   runs, and the loop does not spin while the bytes wait (loop passes
 *   counted over a window with a 100 ms wake timer, as in
 *   test_http_pipeline_spin);
 * - over TLS: application data pipelined, then the client closes the TCP
 *   connection (no close_notify): gone runs too. */
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
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "server/http/held.h"
#include "server/http/http.h"
#include "server/http/tls.h"

typedef struct server {
    struct event_base *base;
    gps_http *h;
    struct event *wake;
    int port;
    gps_held held;
    bool holding; /* a /hold request is held */
    int gone;     /* times the held request's gone callback ran */
} server;

static void held_gone(void *arg)
{
    server *s = arg;
    s->holding = false;
    s->gone++;
}

static void h_hold(gps_req *r, void *arg)
{
    server *s = arg;
    memset(&s->held, 0, sizeof s->held);
    assert_true(gps_held_start(&s->held, r->req, true, 0, held_gone, s));
    assert_non_null(s->held.watch);
    s->holding = true;
}

static void h_quick(gps_req *r, void *arg)
{
    (void)arg;
    gps_http_send_reply(r->req, 200, "quick", NULL);
}

static void wake_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
}

static double now_sec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu_sec(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
           ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
}

/* A pass that never returns is a spin too. */
static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "the event loop did not return: a callback spins\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
}

static void loop_once(server *s)
{
    alarm(10);
    event_base_loop(s->base, EVLOOP_ONCE);
    alarm(0);
}

static void server_start(server *s)
{
    memset(s, 0, sizeof *s);
    signal(SIGALRM, on_alarm);
    s->base = event_base_new();
    assert_non_null(s->base);
    gps_http_opts o = {.max_body_bytes = 1 << 20, .max_header_bytes = 16 << 10,
                       .idle_timeout_sec = 30, .max_inflight_body_bytes = 1 << 24,
                       .header_timeout_sec = 30, .body_timeout_sec = 30};
    s->h = gps_http_new(s->base, &o);
    assert_non_null(s->h);
    assert_int_equal(gps_http_add_route(s->h, EVHTTP_REQ_GET, "/hold", GPS_DIALECT_NATIVE,
                                        GPS_ROLE_NONE, h_hold, s), 0);
    assert_int_equal(gps_http_add_route(s->h, EVHTTP_REQ_GET, "/quick", GPS_DIALECT_NATIVE,
                                        GPS_ROLE_NONE, h_quick, s), 0);
    char err[128];
    assert_int_equal(gps_http_bind(s->h, "127.0.0.1", 0, &s->port, err, sizeof err), 0);
    s->wake = event_new(s->base, -1, EV_PERSIST, wake_cb, NULL);
    struct timeval tv = {0, 100000};
    assert_int_equal(event_add(s->wake, &tv), 0);
}

static void server_stop(server *s)
{
    if (s->holding)
        gps_held_release(&s->held);
    event_free(s->wake);
    gps_http_free(s->h);
    event_base_free(s->base);
}

static int connect_loopback(int port)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(c >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(c, (struct sockaddr *)&a, sizeof a), 0);
    return c;
}

static void send_str(int c, const char *p)
{
    size_t n = strlen(p);
    assert_int_equal(send(c, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Run the loop (the 100 ms timer wakes it) until *flag is set or `sec`
 * pass: whether it was. */
static bool wait_flag(server *s, const bool *flag, double sec)
{
    double t0 = now_sec();
    while (!*flag && now_sec() - t0 < sec)
        loop_once(s);
    return *flag;
}

static bool wait_gone(server *s, int want, double sec)
{
    double t0 = now_sec();
    while (s->gone < want && now_sec() - t0 < sec)
        loop_once(s);
    return s->gone >= want;
}

/* Over `sec` seconds the loop must look idle: ~10 passes (the timer) and
 * little CPU; a level-triggered event on the unread bytes would make
 * thousands of passes. Wide margins for a loaded machine. */
static void assert_idle(server *s, const char *what, double sec)
{
    unsigned long passes = 0;
    double t0 = now_sec(), c0 = cpu_sec();
    while (now_sec() - t0 < sec) {
        loop_once(s);
        passes++;
    }
    double cpu = cpu_sec() - c0, wall = now_sec() - t0;
    print_message("%s: %lu loop passes, %.3f s CPU in %.3f s\n", what, passes, cpu, wall);
    if (passes > 200 || cpu > 0.3 * wall)
        fail_msg("%s: the loop spun (%lu passes, %.3f s CPU in %.3f s)", what, passes, cpu, wall);
}

/* A held /hold request on a new connection, then pipelined bytes in two
 * sends (the second after the watch has seen the first): the client. */
static int held_then_pipelined(server *s)
{
    int c = connect_loopback(s->port);
    send_str(c, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_true(wait_flag(s, &s->holding, 5.0));
    send_str(c, "GET /quick HTTP/1.1\r\n");
    assert_idle(s, "first pipelined bytes waiting", 0.5);
    send_str(c, "Host: x\r\n\r\n");
    assert_idle(s, "whole pipelined request waiting", 0.5);
    assert_int_equal(s->gone, 0);
    assert_true(s->holding);
    return c;
}

enum hangup { HANG_CLOSE, HANG_RESET, HANG_HALF_CLOSE };

static void pipelined_then_hangup(enum hangup how)
{
    server s;
    server_start(&s);
    int c = held_then_pipelined(&s);
    if (how == HANG_RESET) {
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        assert_int_equal(setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
    }
    if (how == HANG_HALF_CLOSE)
        assert_int_equal(shutdown(c, SHUT_WR), 0);
    else
        close(c);
    /* The wait ends at the event; 5 s only bounds a watch that misses it
     * (the old one: gone ran only when the reply was written). */
    if (!wait_gone(&s, 1, 5.0))
        fail_msg("the held request's client hung up after pipelining, not noticed");
    assert_false(s.holding);
    assert_idle(&s, "after the hang-up", 0.3);
    if (how == HANG_HALF_CLOSE)
        close(c);
    server_stop(&s);
}

static void test_pipelined_then_close(void **st)
{
    (void)st;
    pipelined_then_hangup(HANG_CLOSE);
}

static void test_pipelined_then_reset(void **st)
{
    (void)st;
    pipelined_then_hangup(HANG_RESET);
}

static void test_pipelined_then_half_close(void **st)
{
    (void)st;
    pipelined_then_hangup(HANG_HALF_CLOSE);
}

/* Read from c until both replies are in or 5 s pass. */
static bool read_replies(server *s, int c, char *buf, size_t cap)
{
    size_t got = 0;
    double t0 = now_sec();
    buf[0] = '\0';
    while (now_sec() - t0 < 5.0) {
        event_base_loop(s->base, EVLOOP_NONBLOCK);
        ssize_t k = recv(c, buf + got, cap - 1 - got, MSG_DONTWAIT);
        if (k > 0) {
            got += (size_t)k;
            buf[got] = '\0';
            const char *first = strstr(buf, "held done");
            if (first && strstr(first, "quick"))
                return true;
        } else if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
            return false;
        } else {
            usleep(1000);
        }
    }
    return false;
}

static void test_pipelined_kept_open_answered(void **st)
{
    (void)st;
    server s;
    server_start(&s);
    int c = held_then_pipelined(&s);
    /* The held reply, then evhttp reads the pipelined request it left. */
    gps_held_release(&s.held);
    s.holding = false;
    gps_http_send_reply(s.held.req, 200, "held done", NULL);
    char buf[8192];
    if (!read_replies(&s, c, buf, sizeof buf))
        fail_msg("both replies expected on the kept-alive connection, got: %s", buf);
    assert_int_equal(s.gone, 0);
    close(c);
    server_stop(&s);
}

/* ---- TLS: the same hang-up behind pipelined application data ---- */

/* A self-signed P-256 certificate for CN=localhost and its key, as PEM
 * files under dir. */
static void make_pair(const char *crt, const char *key)
{
    EVP_PKEY *k = EVP_EC_gen("P-256");
    assert_non_null(k);
    X509 *x = X509_new();
    assert_non_null(x);
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), 0);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, k);
    X509_NAME *n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)"localhost", -1,
                               -1, 0);
    X509_set_issuer_name(x, n);
    assert_true(X509_sign(x, k, EVP_sha256()) > 0);
    FILE *f = fopen(crt, "w");
    assert_non_null(f);
    PEM_write_X509(f, x);
    fclose(f);
    f = fopen(key, "w");
    assert_non_null(f);
    PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL);
    fclose(f);
    X509_free(x);
    EVP_PKEY_free(k);
}

/* One SSL call on the non-blocking client, the server's loop run between
 * tries: its result (> 0 done). */
static int ssl_drive(server *s, SSL *ssl, int (*op)(SSL *, const void *, int), const char *p)
{
    for (int i = 0; i < 5000; i++) {
        ERR_clear_error();
        int r = op ? op(ssl, p, (int)strlen(p)) : SSL_connect(ssl);
        if (r > 0)
            return r;
        int e = SSL_get_error(ssl, r);
        if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
            return r;
        event_base_loop(s->base, EVLOOP_NONBLOCK);
        usleep(1000);
    }
    return -1;
}

static void test_tls_pipelined_then_close(void **st)
{
    (void)st;
    char dir[] = "/tmp/gps-watch-tls-XXXXXX", crt[64], key[64], err[256];
    assert_non_null(mkdtemp(dir));
    snprintf(crt, sizeof crt, "%s/c.crt", dir);
    snprintf(key, sizeof key, "%s/c.key", dir);
    make_pair(crt, key);
    gps_tls *tls = gps_tls_new(crt, key, err, sizeof err);
    assert_non_null(tls);

    server s;
    server_start(&s);
    int port = 0;
    assert_int_equal(gps_http_bind_tls(s.h, "127.0.0.1", 0, tls, &port, err, sizeof err), 0);
    int c = connect_loopback(port);
    assert_int_equal(fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK), 0);
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    assert_non_null(ctx);
    SSL *ssl = SSL_new(ctx);
    assert_non_null(ssl);
    SSL_set_fd(ssl, c);
    assert_true(ssl_drive(&s, ssl, NULL, NULL) > 0);
    assert_true(ssl_drive(&s, ssl, SSL_write,
                          "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n") > 0);
    assert_true(wait_flag(&s, &s.holding, 5.0));
    assert_true(ssl_drive(&s, ssl, SSL_write,
                          "GET /quick HTTP/1.1\r\nHost: x\r\n\r\n") > 0);
    assert_idle(&s, "TLS: pipelined request waiting", 0.5);
    assert_int_equal(s.gone, 0);

    close(c); /* no close_notify: the TCP connection just ends */
    if (!wait_gone(&s, 1, 5.0))
        fail_msg("the held TLS request's client hung up after pipelining, not noticed");
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    server_stop(&s);
    gps_tls_free(tls);
    unlink(crt);
    unlink(key);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipelined_then_close),
        cmocka_unit_test(test_pipelined_then_reset),
        cmocka_unit_test(test_pipelined_then_half_close),
        cmocka_unit_test(test_pipelined_kept_open_answered),
        cmocka_unit_test(test_tls_pipelined_then_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
