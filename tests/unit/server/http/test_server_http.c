/* Routing table (404/405, params); the error shapes are in test_errors.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/http/http.h"

static void h(gps_req *r, void *arg) { (void)r; (void)arg; }

static const gps_route routes[] = {
    {EVHTTP_REQ_POST, "/v1/chat/completions", GPS_DIALECT_OPENAI, GPS_ROLE_CLIENT, h, NULL},
    {EVHTTP_REQ_GET, "/v1/models", GPS_DIALECT_OPENAI, GPS_ROLE_CLIENT, h, NULL},
    {EVHTTP_REQ_POST, "/agents/jobs/{id}/events", GPS_DIALECT_NATIVE, GPS_ROLE_AGENT, h, NULL},
    {EVHTTP_REQ_GET, "/v2/tasks/{id}", GPS_DIALECT_NATIVE, GPS_ROLE_CLIENT, h, NULL},
    {EVHTTP_REQ_DELETE, "/v2/tasks/{id}", GPS_DIALECT_NATIVE, GPS_ROLE_CLIENT, h, NULL},
};
#define N (sizeof routes / sizeof routes[0])

static void test_lookup_found(void **st)
{
    (void)st;
    const gps_route *r = NULL;
    char p[GPS_ROUTE_MAX_PARAMS][GPS_ROUTE_PARAM_MAX];
    int np = -1;
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_POST, "/v1/chat/completions", &r, p, &np), 0);
    assert_ptr_equal(r, &routes[0]);
    assert_int_equal(np, 0);
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_GET, "/v1/models/", &r, p, &np), 0);
    assert_ptr_equal(r, &routes[1]);
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_POST, "/agents/jobs/job_abc/events", &r, p, &np), 0);
    assert_ptr_equal(r, &routes[2]);
    assert_int_equal(np, 1);
    assert_string_equal(p[0], "job_abc");
    /* same pattern, two methods */
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_DELETE, "/v2/tasks/t1", &r, p, &np), 0);
    assert_ptr_equal(r, &routes[4]);
    assert_string_equal(p[0], "t1");
}

static void test_lookup_404_405(void **st)
{
    (void)st;
    const gps_route *r = NULL;
    char p[GPS_ROUTE_MAX_PARAMS][GPS_ROUTE_PARAM_MAX];
    int np;
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_GET, "/v1/nothing", &r, p, &np), 404);
    assert_null(r);
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_GET, "/v1/chat/completionsX", &r, p, &np), 404);
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_GET, "/v1/chat", &r, p, &np), 404);
    /* an empty parameter segment does not match */
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_POST, "/agents/jobs//events", &r, p, &np), 404);
    /* a parameter never spans segments */
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_POST, "/agents/jobs/a/b/events", &r, p, &np), 404);
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_GET, "/v1/chat/completions", &r, p, &np), 405);
    assert_ptr_equal(r, &routes[0]);
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_PUT, "/v2/tasks/x", &r, p, &np), 405);
    assert_int_equal(r->dialect, GPS_DIALECT_NATIVE);
    /* a parameter longer than the buffer does not match (no truncation) */
    char longp[400] = "/v2/tasks/";
    memset(longp + 10, 'a', 300);
    longp[310] = '\0';
    assert_int_equal(gps_route_lookup(routes, N, EVHTTP_REQ_GET, longp, &r, p, &np), 404);
}

static void test_dialect_for_path(void **st)
{
    (void)st;
    assert_int_equal(gps_dialect_for_path("/v1/whatever"), GPS_DIALECT_OPENAI);
    assert_int_equal(gps_dialect_for_path("/v1/messages"), GPS_DIALECT_ANTHROPIC);
    assert_int_equal(gps_dialect_for_path("/agents/x"), GPS_DIALECT_NATIVE);
    assert_int_equal(gps_dialect_for_path("/"), GPS_DIALECT_NATIVE);
    assert_int_equal(gps_dialect_for_path("/v10/x"), GPS_DIALECT_NATIVE);
}

/* Issue 9, finding 9: only normalised origin-form paths route. */
static void test_issue9_target_ok(void **st)
{
    (void)st;
    assert_true(gps_http_target_ok("/"));
    assert_true(gps_http_target_ok("/v1/models/"));
    assert_true(gps_http_target_ok("/admin/jobs?model=a/../b"));
    assert_true(gps_http_target_ok("/v2/tasks/a.b"));
    assert_true(gps_http_target_ok("/v2/tasks/...")); /* not a dot segment */
    assert_false(gps_http_target_ok("http://h/v1/models"));
    assert_false(gps_http_target_ok("*"));
    assert_false(gps_http_target_ok("//x/admin/keys"));
    assert_false(gps_http_target_ok("/v1//models"));
    assert_false(gps_http_target_ok("/v1/../admin/keys"));
    assert_false(gps_http_target_ok("/v1/%2e%2E/admin/keys"));
    assert_false(gps_http_target_ok("/./"));
    assert_false(gps_http_target_ok("/."));
    assert_false(gps_http_target_ok("/a/.."));
    assert_false(gps_http_target_ok("/a b"));
    assert_false(gps_http_target_ok("/a\x01"));
    assert_false(gps_http_target_ok("/caf\xc3\xa9"));
}

static int parse(const char *head, gps_head *hd)
{
    static char canon[4096];
    char msg[200];
    return gps_http_head_parse(head, strlen(head), hd, canon, sizeof canon, msg, sizeof msg);
}

/* Issue 9, findings 3 and 9: what the gate takes from a head. */
static void test_issue9_head_parse(void **st)
{
    (void)st;
    static gps_head hd;
    assert_int_equal(parse("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                           "Content-Length:  42 \r\nAuthorization: Bearer k\r\n"
                           "X-Correlation-Id: abc\r\n", &hd), 0);
    assert_int_equal(hd.method, EVHTTP_REQ_POST);
    assert_int_equal(hd.content_length, 42);
    assert_false(hd.chunked);
    assert_string_equal(hd.auth, "Bearer k");
    assert_string_equal(hd.corr, "abc");
    assert_string_equal(hd.canon, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                  "Content-Length: 42\r\nAuthorization: Bearer k\r\n"
                                  "X-Correlation-Id: abc\r\n\r\n");
    assert_int_equal(parse("POST /v2/tasks HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n", &hd), 0);
    assert_true(hd.chunked);
    assert_int_equal(hd.content_length, -1);
    /* blank credentials are present but empty (the caller treats them as missing) */
    assert_int_equal(parse("GET /v1/models HTTP/1.1\r\nAuthorization:   \r\n", &hd), 0);
    assert_true(hd.has_auth);
    assert_string_equal(hd.auth, "");
    /* what home mode and pool loops look at (issue 25) */
    assert_int_equal(parse("POST /admin/keys HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
                           "Origin: http://127.0.0.1:8080\r\nContent-Type: text/plain\r\n"
                           "X-Pool-Via: 0123456789abcdef\r\n", &hd), 0);
    assert_string_equal(hd.host, "127.0.0.1:8080");
    assert_string_equal(hd.origin, "http://127.0.0.1:8080");
    assert_string_equal(hd.ctype, "text/plain");
    assert_string_equal(hd.via, "0123456789abcdef");
    assert_int_equal(parse("POST / HTTP/1.1\r\nContent-Type: application/json\r\n"
                           "Content-Type: text/plain\r\n", &hd), 0);
    assert_true(hd.has_ctype);
    assert_string_equal(hd.ctype, ""); /* two types: none that matches */

    static const struct {
        const char *head;
        int status;
    } bad[] = {
        {"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n", 400},
        {"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n", 400},
        {"POST / HTTP/1.1\r\nContent-Length: +5\r\n", 400},
        {"POST / HTTP/1.1\r\nContent-Length: 5x\r\n", 400},
        {"POST / HTTP/1.1\r\nContent-Length: 5 5\r\n", 400},
        {"POST / HTTP/1.1\r\nContent-Length: \x0b" "5\r\n", 400},
        {"POST / HTTP/1.1\r\nContent-Length: -1\r\n", 400},
        {"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n", 400},
        {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n", 400},
        {"POST / HTTP/1.1\r\nAuthorization: Bearer a\r\nAuthorization: Bearer b\r\n", 400},
        {"POST / HTTP/1.1\r\nx-api-key: a\r\nX-Api-Key: a\r\n", 400},
        {"POST http://h/v1/completions HTTP/1.1\r\n", 400},
        {"GET //x/admin/keys HTTP/1.1\r\n", 400},
        {"GET / HTTP/2.0\r\n", 400},
        {"GET / HTTP/1.1\r\nHost : x\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n", 400},
        {"GET / HTTP/1.1\nHost: x\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: x\n", 400},
        {"HEAD / HTTP/1.1\r\nContent-Length: 3\r\n", 400},
        /* issue 25: GET bodies, two Host, Origin or X-Pool-Via */
        {"GET /health HTTP/1.1\r\nContent-Length: 3\r\n", 400},
        {"GET /health HTTP/1.1\r\nTransfer-Encoding: chunked\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n", 400},
        {"GET / HTTP/1.1\r\nOrigin: a\r\nOrigin: a\r\n", 400},
        {"GET / HTTP/1.1\r\nX-Pool-Via: a\r\nX-Pool-Via: b\r\n", 400},
        {"CONNECT h:443 HTTP/1.1\r\n", 501},
        {"TRACE / HTTP/1.1\r\n", 501},
        {"BREW / HTTP/1.1\r\n", 501},
    };
    /* a canonical head never outgrows 2 * len + 64 (one space per header) */
    char many[2048] = "GET / HTTP/1.1\r\n";
    for (int i = 0; i < 100; i++)
        strcat(many, "a:b\r\n");
    char big[2 * sizeof many + 64], msg[100];
    assert_int_equal(gps_http_head_parse(many, strlen(many), &hd, big, 2 * strlen(many) + 64,
                                         msg, sizeof msg), 0);
    assert_int_equal(hd.canon_len, strlen(many) + 100 + 2);
    /* a long target is no reason for 431 */
    char longt[1800] = "GET /admin/jobs?model=";
    memset(longt + strlen(longt), 'm', 1500);
    strcat(longt, " HTTP/1.1\r\n");
    assert_int_equal(gps_http_head_parse(longt, strlen(longt), &hd, big, sizeof big, msg,
                                         sizeof msg), 0);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int got = parse(bad[i].head, &hd);
        if (got != bad[i].status)
            fail_msg("case %zu (%s): %d, want %d", i, bad[i].head, got, bad[i].status);
    }
}

/* A NUL in the request target (found by fuzz_http_head): the target as a
 * C string ("/v1/models") passed the checks while the bytes after the NUL
 * still went to evhttp. Refused like any other control character. */
static void test_head_nul_in_target(void **st)
{
    (void)st;
    static gps_head hd;
    static const char head[] = "GET /v1/models\0/../admin HTTP/1.1\r\nHost: x\r\n";
    char canon[256], msg[200];
    assert_int_equal(gps_http_head_parse(head, sizeof head - 1, &hd, canon, sizeof canon, msg,
                                         sizeof msg),
                     400);
    assert_non_null(strstr(msg, "request target"));
}

/* A gps_http on base bound to an ephemeral loopback port (*port). */
static gps_http *http_on_loopback(struct event_base *base, int *port)
{
    gps_http_opts o = {.max_body_bytes = 1 << 20, .max_header_bytes = 1 << 16,
                       .idle_timeout_sec = 30, .max_inflight_body_bytes = 1 << 24,
                       .header_timeout_sec = 30, .body_timeout_sec = 30};
    gps_http *h = gps_http_new(base, &o);
    assert_non_null(h);
    char err[128];
    assert_int_equal(gps_http_bind(h, "127.0.0.1", 0, port, err, sizeof err), 0);
    return h;
}

/* A client socket connected to 127.0.0.1:port. */
static int connect_loopback(int port)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(c, (struct sockaddr *)&a, sizeof a), 0);
    return c;
}

/* The server's accepted connections have Nagle off: a stream is many small
 * writes, and with Nagle each waited for the client's delayed ACK (~40 ms
 * per request at one client: 26 req/s instead of 495 in relaybench's
 * i0-c1). Checked on the accepted socket itself, found by its peer port. */
static void test_accepted_sockets_have_nodelay(void **st)
{
    (void)st;
    struct event_base *base = event_base_new();
    int port = 0;
    gps_http *h = http_on_loopback(base, &port);
    int c = connect_loopback(port);
    struct sockaddr_in mine;
    socklen_t ml = sizeof mine;
    assert_int_equal(getsockname(c, (struct sockaddr *)&mine, &ml), 0);
    int found = -1;
    for (int round = 0; round < 200 && found < 0; round++) {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        for (int fd = 3; fd < 1024 && found < 0; fd++) {
            struct sockaddr_in peer;
            socklen_t pl = sizeof peer;
            if (fd != c && getpeername(fd, (struct sockaddr *)&peer, &pl) == 0 &&
                peer.sin_family == AF_INET && peer.sin_port == mine.sin_port)
                found = fd;
        }
        if (found < 0)
            usleep(1000);
    }
    assert_true(found >= 0);
    int v = 0;
    socklen_t vl = sizeof v;
    assert_int_equal(getsockopt(found, IPPROTO_TCP, TCP_NODELAY, &v, &vl), 0);
    assert_int_not_equal(v, 0);
    close(c);
    gps_http_free(h);
    event_base_free(base);
}

static void h_null_body(gps_req *r, void *arg)
{
    (void)arg;
    gps_http_send_json(r->req, 200, NULL); /* as a builder out of memory gives */
}

static void h_body(gps_req *r, void *arg)
{
    (void)arg;
    gps_http_send_json(r->req, 201, json_pack("{s:i}", "a", 1));
}

/* Send one request on c and run the loop until its whole reply (head and
 * the Content-Length body) came back into out. */
static void roundtrip(struct event_base *base, int c, const char *req, char *out, size_t cap)
{
    assert_int_equal(send(c, req, strlen(req), 0), (ssize_t)strlen(req));
    size_t got = 0;
    out[0] = '\0';
    for (int round = 0; round < 5000; round++) {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        ssize_t n = recv(c, out + got, cap - 1 - got, MSG_DONTWAIT);
        if (n > 0) {
            got += (size_t)n;
            out[got] = '\0';
        }
        const char *end = strstr(out, "\r\n\r\n"), *cl = strstr(out, "Content-Length: ");
        if (end && cl && got >= (size_t)(end + 4 - out) + strtoul(cl + 16, NULL, 10))
            return;
        if (n <= 0)
            usleep(1000);
    }
    fail_msg("no whole reply to %s: %s", req, out);
}

/* A JSON reply whose body is NULL (its builder ran out of memory) is a 500
 * with an error, never the status the handler meant with "{}". */
static void test_json_reply_without_body_is_500(void **st)
{
    (void)st;
    struct event_base *base = event_base_new();
    int port = 0;
    gps_http *h = http_on_loopback(base, &port);
    assert_int_equal(gps_http_add_route(h, EVHTTP_REQ_GET, "/null", GPS_DIALECT_NATIVE,
                                        GPS_ROLE_NONE, h_null_body, NULL), 0);
    assert_int_equal(gps_http_add_route(h, EVHTTP_REQ_GET, "/body", GPS_DIALECT_NATIVE,
                                        GPS_ROLE_NONE, h_body, NULL), 0);
    int c = connect_loopback(port);
    char out[4096];
    roundtrip(base, c, "GET /null HTTP/1.1\r\nHost: x\r\n\r\n", out, sizeof out);
    assert_true(strncmp(out, "HTTP/1.1 500 ", 13) == 0);
    assert_non_null(strstr(out, "Content-Type: application/json"));
    const char *body = strstr(out, "\r\n\r\n") + 4;
    json_t *e = json_loads(body, 0, NULL);
    assert_non_null(e);
    assert_string_equal(json_string_value(json_object_get(json_object_get(e, "error"), "code")),
                        "INTERNAL");
    assert_string_equal(json_string_value(json_object_get(json_object_get(e, "error"), "type")),
                        "api_error");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "error");
    json_decref(e);
    /* The connection lives on, and a body that was built goes out as meant. */
    roundtrip(base, c, "GET /body HTTP/1.1\r\nHost: x\r\n\r\n", out, sizeof out);
    assert_true(strncmp(out, "HTTP/1.1 201 ", 13) == 0);
    assert_string_equal(strstr(out, "\r\n\r\n") + 4, "{\"a\":1}");
    close(c);
    gps_http_free(h);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup_found),
        cmocka_unit_test(test_lookup_404_405),
        cmocka_unit_test(test_dialect_for_path),
        cmocka_unit_test(test_issue9_target_ok),
        cmocka_unit_test(test_issue9_head_parse),
        cmocka_unit_test(test_head_nul_in_target),
        cmocka_unit_test(test_accepted_sockets_have_nodelay),
        cmocka_unit_test(test_json_reply_without_body_is_500),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
