/*
 * http_reply.c: replies (JSON, errors in the caller's dialect), request
 * body and header helpers, and the watch that sees a held reply's peer
 * close.
 */
#include "server/http/http_priv.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/keyvalq_struct.h>
#include <event2/util.h>
#include <openssl/ssl.h>
#include <openssl/err.h>

#include "common/gp_json.h"
#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/http/errors.h"

/* ------------------------------------------------------------------ */
/* Replies                                                             */
/* ------------------------------------------------------------------ */

/* Reason phrases libevent 2.1's table lacks (it says "Client Error" for
 * 429); NULL lets libevent pick. */
static const char *extra_reason(int status)
{
    switch (status) {
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 499: return "Client Closed Request";
    case 508: return "Loop Detected";
    case 529: return "Overloaded";
    }
    return NULL;
}

void gps_http_add_date(struct evhttp_request *req)
{
    /* Per thread: replies are sent on the loop's thread, but nothing here
     * needs it to stay that way. */
    static _Thread_local time_t at = (time_t)-1;
    static _Thread_local char date[64];
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    if (evhttp_find_header(h, "Date"))
        return;
    time_t now = time(NULL);
    if (now != at) {
        struct tm tm;
        if (!gmtime_r(&now, &tm) || evutil_date_rfc1123(date, sizeof date, &tm) <= 0)
            return; /* evhttp adds its own */
        at = now;
    }
    evhttp_add_header(h, "Date", date);
}

void gps_http_send_reply(struct evhttp_request *req, int status, const char *reason,
                         struct evbuffer *body)
{
    /* Always a Content-Length: evhttp 2.1 adds none to a HEAD reply (and
     * would send the body after it) nor to an HTTP/1.0 one. */
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    char cl[32];
    snprintf(cl, sizeof cl, "%zu", body ? evbuffer_get_length(body) : (size_t)0);
    evhttp_remove_header(h, "Content-Length");
    evhttp_add_header(h, "Content-Length", cl);
    gps_http_add_date(req);
    bool head = evhttp_request_get_command(req) == EVHTTP_REQ_HEAD;
    evhttp_send_reply(req, status, reason ? reason : extra_reason(status), head ? NULL : body);
}

/* What a reply whose body could not be built or copied (out of memory) is
 * answered with: 500, never the caller's status with an empty body (a 200
 * "{}" is a success the client cannot tell from a real one). One text that
 * every dialect's clients read as an error: error.code and error.message
 * (native, OpenAI), type "error" and error.type (Anthropic). */
const char gps_http_oom_body[] = "{\"type\":\"error\",\"error\":{\"type\":\"api_error\","
                                "\"code\":\"INTERNAL\",\"message\":\"out of memory\"}}";

static void set_json_type(struct evhttp_request *req)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_remove_header(h, "Content-Type");
    evhttp_add_header(h, "Content-Type", "application/json");
}

static void send_oom(struct evhttp_request *req, int status)
{
    gp_log_error("reply_out_of_memory", "a %d reply's body could not be built: answered 500",
                 status);
    struct evbuffer *buf = evbuffer_new();
    if (buf && evbuffer_add_reference(buf, gps_http_oom_body, sizeof gps_http_oom_body - 1, NULL,
                                          NULL) < 0) {
        evbuffer_free(buf);
        buf = NULL; /* then an empty 500: still not the caller's status */
    }
    set_json_type(req);
    gps_http_send_reply(req, 500, NULL, buf);
    if (buf)
        evbuffer_free(buf);
}

int gps_http_send_json(struct evhttp_request *req, int status, json_t *body)
{
    char *text = body ? gp_json_dumps(body) : NULL;
    json_decref(body);
    if (!text) {
        send_oom(req, status);
        return -1;
    }
    int rc = gps_http_send_json_text(req, status, text, strlen(text));
    free(text);
    return rc;
}

int gps_http_send_json_text(struct evhttp_request *req, int status, const char *text, size_t n)
{
    struct evbuffer *buf = evbuffer_new();
    if (!buf || evbuffer_add(buf, text, n) < 0) {
        if (buf)
            evbuffer_free(buf);
        send_oom(req, status);
        return -1;
    }
    set_json_type(req);
    gps_http_send_reply(req, status, NULL, buf);
    evbuffer_free(buf);
    return 0;
}

void gps_http_send_error(struct evhttp_request *req, gps_dialect d, int status,
                         const char *code, const char *message, const char *param,
                         const char *correlation_id, json_t *extra)
{
    gps_http_send_json(req, status,
                       gps_error_body(d, status, code, message, param, correlation_id, extra));
}

void gps_req_error(gps_req *r, int status, const char *code, const char *message,
                   const char *param)
{
    gps_dialect d = r->route ? r->route->dialect : gps_dialect_for_path(r->path);
    gps_http_send_error(r->req, d, status, code, message, param, r->correlation_id, NULL);
}

char *gps_req_body(struct evhttp_request *req, size_t *len)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t n = in ? evbuffer_get_length(in) : 0;
    *len = n;
    if (n == 0)
        return NULL;
    char *s = malloc(n + 1);
    if (!s)
        return NULL;
    evbuffer_copyout(in, s, n);
    s[n] = '\0';
    return s;
}

json_t *gps_req_json(gps_req *r)
{
    size_t len = 0;
    char *body = gps_req_body(r->req, &len);
    if (!body && len > 0) { /* a body that could not be copied: our failure */
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
        return NULL;
    }
    if (!body) {
        gps_req_error(r, 400, "INVALID_REQUEST", "request body must be a JSON object", NULL);
        return NULL;
    }
    json_error_t je;
    /* gp_json's reader, not jansson's (which can crash when memory runs
     * out): out of memory is a 500 (as the dialects' GPS_PARSE_OOM), never
     * a 400 blaming valid JSON, nor a body with a string changed. */
    json_t *j = gp_json_load_checked(body, len, JSON_REJECT_DUPLICATES, &je);
    free(body);
    if (!j && json_error_code(&je) == json_error_out_of_memory) {
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
        return NULL;
    }
    if (!j) {
        char msg[256];
        snprintf(msg, sizeof msg, "invalid JSON body: %s", je.text); /* (it says where) */
        gps_req_error(r, 400, "INVALID_REQUEST", msg, NULL);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        gps_req_error(r, 400, "INVALID_REQUEST", "request body must be a JSON object", NULL);
        return NULL;
    }
    return j;
}

const char *gps_req_header(gps_req *r, const char *name)
{
    return evhttp_find_header(evhttp_request_get_input_headers(r->req), name);
}

void gps_req_add_header(gps_req *r, const char *name, const char *value)
{
    evhttp_add_header(evhttp_request_get_output_headers(r->req), name, value);
}

/* ------------------------------------------------------------------ */
/* Peer-close watch                                                    */
/* ------------------------------------------------------------------ */

struct gps_conn_watch {
    struct event *ev;
    struct evhttp_connection *evcon;
    SSL *ssl; /* TLS connection: peek through the session, not the socket */
    int dupfd; /* -1, or the duplicate of the socket the pipelined watch is on */
};

/* TLS: raw bytes from the peer may be a close_notify alert (TLS 1.3
 * encrypts alerts, so the record header cannot tell), a pipelined request
 * or handshake messages. SSL_peek decrypts what arrived without consuming
 * application data: > 0 means a request is coming (watch for the TCP-level
 * close from then on: watch_pipelined; the data waits inside the session),
 * a clean or unclean end of the session means the peer is gone. Returns 1
 * gone, 0 keep watching, -1 data is waiting.
 * Known limit: such pipelined data is only noticed by the TLS bufferevent
 * when more bytes arrive (no client of ours pipelines behind a held
 * request). */
static int watch_tls_peek(SSL *ssl)
{
    char c;
    ERR_clear_error();
    int n = SSL_peek(ssl, &c, 1);
    int e = n > 0 ? SSL_ERROR_NONE : SSL_get_error(ssl, n);
    ERR_clear_error(); /* the bufferevent reads the error queue too */
    if (n > 0)
        return -1;
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        return 0;
    return 1; /* ZERO_RETURN (close_notify), SYSCALL (EOF/reset), SSL (bad data) */
}

/* The peer's FIN (POLLRDHUP is reported even with unread bytes ahead of
 * it, which a peek cannot see past), or a reset or socket error. A FIN
 * after a half-close (shutdown(SHUT_WR)) counts too: the plain peek has
 * always treated that EOF as the peer gone. */
static bool peer_hung_up(evutil_socket_t fd)
{
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* Freeing the connection runs its close callback, which frees this watch:
 * touch nothing after this call. */
static void watch_gone(gps_conn_watch *w)
{
    evhttp_connection_free(w->evcon);
}

/* Edge-triggered: runs once per arrival (more bytes, the FIN, a reset),
 * never again for bytes that just sit there. */
static void watch_pipelined_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    if (peer_hung_up(fd))
        watch_gone(arg);
}

/* Bytes from the peer wait unread (a pipelined request) and stay there for
 * evhttp until the reply is done, so the level-triggered read event would
 * fire on them without end. Watch for the peer's close edge-triggered
 * instead (EV_CLOSED asks epoll for EPOLLRDHUP; EV_READ because libevent
 * turns the EPOLLERR of a reset into EV_READ|EV_WRITE, which a bare
 * EV_CLOSED event never sees). On a duplicate of the socket: epoll keeps
 * one trigger mode per descriptor and evhttp's own events on the socket
 * are level-triggered. Replaces w->ev, the event now running (not
 * persistent, so freeing it here is safe). Returns 1 when the peer is
 * already gone, 0 watching, -1 when it cannot (no edge-triggered or
 * early-close support in the backend, out of descriptors or memory): then
 * the watch ends as it did before, the close seen at the next write. */
static int watch_pipelined(gps_conn_watch *w, evutil_socket_t fd)
{
    if (peer_hung_up(fd))
        return 1;
    struct event_base *base = event_get_base(w->ev);
    int need = EV_FEATURE_ET | EV_FEATURE_EARLY_CLOSE;
    if ((event_base_get_features(base) & need) != need)
        return -1;
    int dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dfd < 0)
        return -1;
    struct event *ev =
        event_new(base, dfd, EV_READ | EV_CLOSED | EV_ET | EV_PERSIST, watch_pipelined_cb, w);
    if (!ev || event_add(ev, NULL) < 0) {
        if (ev)
            event_free(ev);
        close(dfd);
        return -1;
    }
    event_free(w->ev);
    w->ev = ev;
    w->dupfd = dfd;
    return 0;
}

static void watch_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    gps_conn_watch *w = arg;
    int g; /* 1 gone, 0 keep watching, -1 data waits */
    if (w->ssl) {
        g = watch_tls_peek(w->ssl);
    } else {
        char c;
        ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            g = 0;
        else
            g = n > 0 ? -1 : 1; /* EOF or error: the peer is gone */
    }
    if (g < 0)
        g = watch_pipelined(w, fd);
    if (g == 0 && w->dupfd < 0)
        event_add(w->ev, NULL);
    if (g == 1)
        watch_gone(w);
}

gps_conn_watch *gps_http_watch_close(struct evhttp_request *req)
{
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    if (!evcon)
        return NULL;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(evcon);
    evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
    if (fd < 0)
        return NULL;
    gps_conn_watch *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->evcon = evcon;
    w->dupfd = -1;
    w->ssl = bufferevent_openssl_get_ssl(bev);
    w->ev = event_new(evhttp_connection_get_base(evcon), fd, EV_READ, watch_cb, w);
    if (!w->ev || event_add(w->ev, NULL) < 0) {
        if (w->ev)
            event_free(w->ev);
        free(w);
        return NULL;
    }
    return w;
}

void gps_http_drop_request(struct evhttp_request *req)
{
    if (req && evhttp_request_get_connection(req) == NULL)
        evhttp_request_free(req);
}

void gps_conn_watch_free(gps_conn_watch *w)
{
    if (!w)
        return;
    event_free(w->ev);
    if (w->dupfd >= 0)
        close(w->dupfd);
    free(w);
}
