/* http: see http.h. */
#include "server/http.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <errno.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/keyvalq_struct.h>

#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#define MAX_ROUTES 64

struct gps_http {
    struct event_base *base;
    struct evhttp *evh;
    struct evhttp_bound_socket *bound;
    /* HTTPS: a second evhttp with the same limits and dispatcher whose
     * connections are TLS bufferevents (evhttp's bufferevent hook is per
     * evhttp in libevent 2.1, not per listener). NULL when not used. */
    struct evhttp *evh_tls;
    struct evhttp_bound_socket *bound_tls;
    gps_tls *tls; /* borrowed */
    gps_http_opts opts;
    gps_route routes[MAX_ROUTES];
    size_t nroutes;
    gps_auth_fn auth;
    void *auth_arg;
    bool shutting_down;
};

/* ------------------------------------------------------------------ */
/* Routing                                                             */
/* ------------------------------------------------------------------ */

/* Match one pattern against a path. Segments are compared literally except
 * "{name}", which takes one non-empty segment into params. */
static bool pattern_match(const char *pat, const char *path, char params[][GPS_ROUTE_PARAM_MAX],
                          int *nparams)
{
    int np = 0;
    while (*pat && *path) {
        if (*pat == '{') {
            const char *pe = strchr(pat, '}');
            if (!pe)
                return false;
            size_t sl = strcspn(path, "/");
            if (sl == 0 || sl >= GPS_ROUTE_PARAM_MAX || np >= GPS_ROUTE_MAX_PARAMS)
                return false;
            if (params) {
                memcpy(params[np], path, sl);
                params[np][sl] = '\0';
            }
            np++;
            pat = pe + 1;
            path += sl;
            continue;
        }
        if (*pat != *path)
            return false;
        pat++;
        path++;
    }
    /* Tolerate one trailing slash on the path ("/v1/models/"). */
    if (*pat == '\0' && path[0] == '/' && path[1] == '\0')
        path++;
    if (*pat || *path)
        return false;
    if (nparams)
        *nparams = np;
    return true;
}

int gps_route_lookup(const gps_route *routes, size_t n, unsigned method, const char *path,
                     const gps_route **out, char params[][GPS_ROUTE_PARAM_MAX], int *nparams)
{
    const gps_route *wrong_method = NULL;
    for (size_t i = 0; i < n; i++) {
        int np = 0;
        if (!pattern_match(routes[i].pattern, path, params, &np))
            continue;
        if (routes[i].methods & method) {
            *out = &routes[i];
            if (nparams)
                *nparams = np;
            return 0;
        }
        if (!wrong_method)
            wrong_method = &routes[i];
    }
    *out = wrong_method;
    return wrong_method ? 405 : 404;
}

gps_dialect gps_dialect_for_path(const char *path)
{
    if (strncmp(path, "/v1/messages", 12) == 0)
        return GPS_DIALECT_ANTHROPIC;
    if (strncmp(path, "/v1/", 4) == 0 || strcmp(path, "/v1") == 0)
        return GPS_DIALECT_OPENAI;
    return GPS_DIALECT_NATIVE;
}

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
    case 529: return "Overloaded";
    }
    return NULL;
}

void gps_http_send_json(struct evhttp_request *req, int status, json_t *body)
{
    struct evbuffer *buf = evbuffer_new();
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_remove_header(h, "Content-Type");
    evhttp_add_header(h, "Content-Type", "application/json");
    if (buf && text)
        evbuffer_add(buf, text, strlen(text));
    else if (buf)
        evbuffer_add(buf, "{}", 2);
    evhttp_send_reply(req, status, extra_reason(status), buf);
    if (buf)
        evbuffer_free(buf);
    free(text);
}

const char *gps_openai_error_type(int status)
{
    switch (status) {
    case 400: case 404: case 405: case 409: case 413: case 422:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 429:
        return "rate_limit_error";
    case 503:
        return "service_unavailable";
    case 504:
        return "timeout";
    default:
        return "server_error";
    }
}

static const char *anthropic_error_type(int status)
{
    switch (status) {
    case 400: case 405: case 409: case 422:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 503: case 529:
        return "overloaded_error";
    case 504:
        return "timeout_error";
    default:
        return "api_error";
    }
}

json_t *gps_error_body(gps_dialect d, int status, const char *code, const char *message,
                       const char *param, const char *correlation_id, json_t *extra)
{
    json_t *err = json_object();
    json_t *top = json_object();
    if (!err || !top) {
        json_decref(err);
        json_decref(top);
        json_decref(extra);
        return NULL;
    }
    switch (d) {
    case GPS_DIALECT_OPENAI: {
        /* OpenAI codes are lower snake case ("model_not_found"). */
        char lc[64];
        size_t i = 0;
        for (; code && code[i] && i + 1 < sizeof lc; i++)
            lc[i] = (char)tolower((unsigned char)code[i]);
        lc[i] = '\0';
        json_object_set_new(err, "message", json_string(message));
        json_object_set_new(err, "type", json_string(gps_openai_error_type(status)));
        json_object_set_new(err, "param", param ? json_string(param) : json_null());
        json_object_set_new(err, "code", code ? json_string(lc) : json_null());
        json_object_set_new(top, "error", err);
        break;
    }
    case GPS_DIALECT_ANTHROPIC:
        json_object_set_new(top, "type", json_string("error"));
        json_object_set_new(err, "type", json_string(anthropic_error_type(status)));
        json_object_set_new(err, "message", json_string(message));
        json_object_set_new(top, "error", err);
        break;
    case GPS_DIALECT_NATIVE:
    default:
        json_object_set_new(err, "code", json_string(code ? code : "ERROR"));
        json_object_set_new(err, "message", json_string(message));
        if (param)
            json_object_set_new(err, "details", json_pack("{s:s}", "param", param));
        if (correlation_id)
            json_object_set_new(err, "correlation_id", json_string(correlation_id));
        json_object_set_new(top, "error", err);
        break;
    }
    if (extra)
        json_object_update(err, extra);
    json_decref(extra);
    return top;
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
    if (!body) {
        gps_req_error(r, 400, "INVALID_REQUEST", "request body must be a JSON object", NULL);
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    free(body);
    if (!j) {
        char msg[256];
        snprintf(msg, sizeof msg, "invalid JSON body: %s (line %d, column %d)", je.text,
                 je.line, je.column);
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
};

/* TLS: raw bytes from the peer may be a close_notify alert (TLS 1.3
 * encrypts alerts, so the record header cannot tell), a pipelined request
 * or handshake messages. SSL_peek decrypts what arrived without consuming
 * application data: > 0 means a request is coming (stop watching; the data
 * waits inside the session), a clean or unclean end of the session means
 * the peer is gone. Returns 1 gone, 0 keep watching, -1 stop watching.
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

static void watch_cb(evutil_socket_t fd, short what, void *arg)
{
    gps_conn_watch *w = arg;
    if (w->ssl) {
        int g = watch_tls_peek(w->ssl);
        if (g == 0)
            event_add(w->ev, NULL);
        if (g <= 0)
            return;
        evhttp_connection_free(w->evcon); /* frees w (see below) */
        return;
    }
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        event_add(w->ev, NULL);
        return;
    }
    if (n > 0)
        return; /* the peer sent more: leave it to evhttp, stop watching */
    /* EOF or error: the peer is gone. Freeing the connection runs its close
     * callback, which frees this watch: touch nothing after this call. */
    evhttp_connection_free(w->evcon);
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
    free(w);
}

/* ------------------------------------------------------------------ */
/* Dispatch                                                            */
/* ------------------------------------------------------------------ */

static bool corr_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("-_.:", s[i]))
            return false;
    return true;
}

static const char *method_name(unsigned m)
{
    switch (m) {
    case EVHTTP_REQ_GET: return "GET";
    case EVHTTP_REQ_POST: return "POST";
    case EVHTTP_REQ_HEAD: return "HEAD";
    case EVHTTP_REQ_PUT: return "PUT";
    case EVHTTP_REQ_DELETE: return "DELETE";
    case EVHTTP_REQ_OPTIONS: return "OPTIONS";
    case EVHTTP_REQ_PATCH: return "PATCH";
    default: return "OTHER";
    }
}

static void add_allow_header(gps_http *h, gps_req *r)
{
    unsigned m = 0;
    for (size_t i = 0; i < h->nroutes; i++)
        if (pattern_match(h->routes[i].pattern, r->path, NULL, NULL))
            m |= h->routes[i].methods;
    char allow[128] = "";
    static const unsigned all[] = {EVHTTP_REQ_GET, EVHTTP_REQ_POST, EVHTTP_REQ_PUT,
                                   EVHTTP_REQ_DELETE, EVHTTP_REQ_PATCH};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (!(m & all[i]))
            continue;
        if (allow[0])
            strncat(allow, ", ", sizeof allow - strlen(allow) - 1);
        strncat(allow, method_name(all[i]), sizeof allow - strlen(allow) - 1);
    }
    gps_req_add_header(r, "Allow", allow);
}

static void dispatch(struct evhttp_request *req, void *arg)
{
    gps_http *h = arg;
    gps_req r;
    memset(&r, 0, sizeof r);
    r.req = req;
    r.http = h;
    r.start_us = gp_now_mono_us();
    r.method = (unsigned)evhttp_request_get_command(req);
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    r.path = path && *path ? path : "/";

    const char *corr = evhttp_find_header(evhttp_request_get_input_headers(req),
                                          "X-Correlation-Id");
    if (corr && corr_ok(corr))
        snprintf(r.correlation_id, sizeof r.correlation_id, "%s", corr);
    else
        gp_random_hex(r.correlation_id, 16);
    struct evkeyvalq *oh = evhttp_request_get_output_headers(req);
    evhttp_add_header(oh, "X-Correlation-Id", r.correlation_id);
    evhttp_add_header(oh, "X-Content-Type-Options", "nosniff");
    if (gps_dialect_for_path(r.path) == GPS_DIALECT_ANTHROPIC) {
        /* The Anthropic SDKs surface `request-id` in errors and logs. */
        char rid[72];
        snprintf(rid, sizeof rid, "req_%s", r.correlation_id);
        evhttp_add_header(oh, "request-id", rid);
    }

    const gps_route *route = NULL;
    int rc = gps_route_lookup(h->routes, h->nroutes, r.method, r.path, &route, r.params,
                              &r.nparams);
    if (rc == 404) {
        char msg[200];
        snprintf(msg, sizeof msg, "no route for %s %.120s", method_name(r.method), r.path);
        gps_req_error(&r, 404, "NOT_FOUND", msg, NULL);
        return;
    }
    r.route = route;
    if (rc == 405) {
        char msg[200];
        snprintf(msg, sizeof msg, "method %s is not allowed on %.120s", method_name(r.method),
                 r.path);
        add_allow_header(h, &r);
        gps_req_error(&r, 405, "METHOD_NOT_ALLOWED", msg, NULL);
        return;
    }

    /* evhttp's own limit is set above ours (see gps_http_new) so that a
     * body just over the limit gets a JSON 413 in the right dialect. */
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    if (in && evbuffer_get_length(in) > h->opts.max_body_bytes) {
        char msg[128];
        snprintf(msg, sizeof msg, "request body exceeds %zu bytes", h->opts.max_body_bytes);
        gps_req_error(&r, 413, "BODY_TOO_LARGE", msg, NULL);
        return;
    }

    if (route->role != GPS_ROLE_NONE && h->auth) {
        struct evkeyvalq *ih = evhttp_request_get_input_headers(req);
        const char *cred = evhttp_find_header(ih, "Authorization");
        if (!cred && route->dialect == GPS_DIALECT_ANTHROPIC)
            cred = evhttp_find_header(ih, "x-api-key");
        int st = h->auth(h->auth_arg, cred, route->role, r.key_id);
        if (st != 0) {
            if (st == 401 && route->dialect != GPS_DIALECT_NATIVE)
                evhttp_add_header(oh, "WWW-Authenticate", "Bearer");
            /* The Stainless SDKs honour this header before their own rules;
             * without it Claude Code retries a 401 ten times with backoff
             * (minutes) before telling the user the key is wrong. */
            evhttp_add_header(oh, "x-should-retry", "false");
            if (st == 403)
                gps_req_error(&r, 403, "FORBIDDEN", "this key's role may not use this endpoint",
                              NULL);
            else
                gps_req_error(&r, 401, cred ? "INVALID_API_KEY" : "UNAUTHORIZED",
                              cred ? "invalid API key"
                                   : "missing API key (Authorization: Bearer <key>)",
                              NULL);
            return;
        }
    }
    if (h->shutting_down && (route->role == GPS_ROLE_CLIENT || route->role == GPS_ROLE_ADMIN)) {
        gps_req_add_header(&r, "Retry-After", "1");
        gps_req_add_header(&r, "Connection", "close");
        gps_req_error(&r, 503, "SHUTTING_DOWN", "the server is shutting down", NULL);
        return;
    }
    route->fn(&r, route->arg);
}

void gps_http_set_shutting_down(gps_http *h, bool on)
{
    h->shutting_down = on;
}

/* ------------------------------------------------------------------ */
/* Lifecycle                                                           */
/* ------------------------------------------------------------------ */

/* Limits and dispatcher shared by the HTTP and the HTTPS evhttp. */
static void evhttp_setup(gps_http *h, struct evhttp *evh)
{
    /* Twice our limit: bodies between the two get our JSON 413; only a body
     * more than twice too large meets evhttp's bare 413 (still a 413). */
    size_t evmax = h->opts.max_body_bytes * 2 + 65536;
    evhttp_set_max_body_size(evh, (ev_ssize_t)evmax);
    evhttp_set_max_headers_size(evh, (ev_ssize_t)h->opts.max_header_bytes);
    evhttp_set_timeout(evh, h->opts.idle_timeout_sec);
    /* Let every common method reach the dispatcher so that 405 comes in
     * the endpoint's dialect. */
    evhttp_set_allowed_methods(evh, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                        EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                        EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
    evhttp_set_default_content_type(evh, "application/json");
    evhttp_set_gencb(evh, dispatch, h);
}

gps_http *gps_http_new(struct event_base *base, const gps_http_opts *opts)
{
    gps_http *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->base = base;
    h->opts = *opts;
    h->evh = evhttp_new(base);
    if (!h->evh) {
        free(h);
        return NULL;
    }
    evhttp_setup(h, h->evh);
    return h;
}

void gps_http_free(gps_http *h)
{
    if (!h)
        return;
    if (h->evh)
        evhttp_free(h->evh);
    if (h->evh_tls)
        evhttp_free(h->evh_tls);
    free(h);
}

int gps_http_add_route(gps_http *h, unsigned methods, const char *pattern, gps_dialect d,
                       gps_role role, gps_handler_fn fn, void *arg)
{
    if (h->nroutes >= MAX_ROUTES)
        return -1;
    h->routes[h->nroutes++] = (gps_route){methods, pattern, d, role, fn, arg};
    return 0;
}

void gps_http_set_auth(gps_http *h, gps_auth_fn fn, void *arg)
{
    h->auth = fn;
    h->auth_arg = arg;
}

/* The port a bound socket really got (port 0 asks for an ephemeral one). */
static int bound_port_of(struct evhttp_bound_socket *b, int port, int *bound_port, char *err,
                         size_t errlen)
{
    evutil_socket_t fd = evhttp_bound_socket_get_fd(b);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        snprintf(err, errlen, "getsockname failed");
        return -1;
    }
    if (ss.ss_family == AF_INET)
        *bound_port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    else if (ss.ss_family == AF_INET6)
        *bound_port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    else
        *bound_port = port;
    return 0;
}

int gps_http_bind(gps_http *h, const char *host, int port, int *bound_port, char *err,
                  size_t errlen)
{
    h->bound = evhttp_bind_socket_with_handle(h->evh, host, (ev_uint16_t)port);
    if (!h->bound) {
        snprintf(err, errlen, "cannot listen on %s:%d", host, port);
        return -1;
    }
    return bound_port_of(h->bound, port, bound_port, err, errlen);
}

/* evhttp's bufferevent hook for the HTTPS listener: every accepted
 * connection gets a server-side TLS bufferevent (evhttp sets the fd
 * afterwards). If this returns NULL, libevent 2.1 falls back to a plain
 * socket bufferevent: only on allocation failure, and the client's
 * ClientHello then fails to parse as HTTP (a 400, nothing decrypted). */
static struct bufferevent *tls_bevcb(struct event_base *base, void *arg)
{
    gps_http *h = arg;
    SSL *ssl = SSL_new(gps_tls_ctx(h->tls));
    if (!ssl)
        return NULL;
    struct bufferevent *bev = bufferevent_openssl_socket_new(
        base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        SSL_free(ssl);
        return NULL;
    }
    /* Many clients close without close_notify; treat that as a plain EOF
     * rather than an error (HTTP framing already delimits every message). */
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}

int gps_http_bind_tls(gps_http *h, const char *host, int port, gps_tls *tls, int *bound_port,
                      char *err, size_t errlen)
{
    if (!h->evh_tls) {
        h->evh_tls = evhttp_new(h->base);
        if (!h->evh_tls) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        evhttp_setup(h, h->evh_tls);
        evhttp_set_bevcb(h->evh_tls, tls_bevcb, h);
    }
    h->tls = tls;
    h->bound_tls = evhttp_bind_socket_with_handle(h->evh_tls, host, (ev_uint16_t)port);
    if (!h->bound_tls) {
        snprintf(err, errlen, "cannot listen (TLS) on %s:%d", host, port);
        return -1;
    }
    /* TLS sends a reply as several records (one per write of the
     * bufferevent), i.e. several small segments: with Nagle on, the second
     * waits for the client's delayed ACK (~40 ms per request). Accepted
     * sockets inherit TCP_NODELAY from the listener on Linux. */
    int one = 1;
    setsockopt(evhttp_bound_socket_get_fd(h->bound_tls), IPPROTO_TCP, TCP_NODELAY, &one,
               sizeof one);
    return bound_port_of(h->bound_tls, port, bound_port, err, errlen);
}

void gps_http_stop_accepting(gps_http *h)
{
    if (h->bound) {
        evhttp_del_accept_socket(h->evh, h->bound);
        h->bound = NULL;
    }
    if (h->bound_tls) {
        evhttp_del_accept_socket(h->evh_tls, h->bound_tls);
        h->bound_tls = NULL;
    }
}

struct evhttp *gps_http_evhttp(gps_http *h)
{
    return h->evh;
}

size_t gps_http_max_body(const gps_http *h)
{
    return h->opts.max_body_bytes;
}

int gps_http_idle_timeout(const gps_http *h)
{
    return h->opts.idle_timeout_sec;
}
