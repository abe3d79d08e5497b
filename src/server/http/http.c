/* http: see http.h. */
#include "server/http/http.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <strings.h>
#include <sys/socket.h>

#include <errno.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <event2/util.h>

#include "common/gp_log.h"
#include "common/gp_json.h"
#include "common/gp_util.h"
#include "server/http/errors.h"
#include "server/http/tls.h"
#include "server/http/ids.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#define MAX_ROUTES 64

typedef struct gps_conn gps_conn; /* the request gate of one connection */
typedef struct lingerer lingerer; /* a refused connection draining before close */

/* Accepting pauses when the process is out of descriptors (issue 9,
 * finding 6): one per listener. */
typedef struct accept_pause {
    gps_http *h;
    struct evconnlistener *lev;
    struct event *resume;
    uint64_t last_log_ms;
    unsigned long suppressed;
} accept_pause;

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
    size_t inflight;            /* body bytes received and not yet dispatched, all gates */
    size_t inflight_unauth;     /* the part of it from requests without credentials */
    bool (*home)(void *);       /* home mode now? (see gps_http_set_home_check) */
    void *home_arg;
    gps_admit_fn admit;         /* may new work come in? (gps_http_set_admit) */
    void *admit_arg;
    char pool_id[17];           /* this pool in X-Pool-Via */
    gps_conn **conn_by_fd;      /* gates by socket, for dispatch */
    size_t nconn_by_fd;
    gps_conn *conns_all;        /* every gate, freed with h */
    lingerer *lingers;            /* refused connections draining, freed with h */
    accept_pause pause[2];      /* [0] HTTP, [1] HTTPS */
};

/* A process-wide list only to map a listener back to its gps_http (the
 * listener's user data belongs to evhttp). Loop thread only. */
static gps_http *pause_owners[8];

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

void gps_http_send_json(struct evhttp_request *req, int status, json_t *body)
{
    struct evbuffer *buf = evbuffer_new();
    char *text = body ? gp_json_dumps(body) : NULL;
    json_decref(body);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_remove_header(h, "Content-Type");
    evhttp_add_header(h, "Content-Type", "application/json");
    if (buf && text)
        evbuffer_add(buf, text, strlen(text));
    else if (buf)
        evbuffer_add(buf, "{}", 2);
    gps_http_send_reply(req, status, NULL, buf);
    if (buf)
        evbuffer_free(buf);
    free(text);
}

void gps_http_send_json_text(struct evhttp_request *req, int status, const char *text, size_t n)
{
    struct evbuffer *buf = evbuffer_new();
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_remove_header(h, "Content-Type");
    evhttp_add_header(h, "Content-Type", "application/json");
    if (buf)
        evbuffer_add(buf, text, n);
    gps_http_send_reply(req, status, NULL, buf);
    if (buf)
        evbuffer_free(buf);
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
    /* The usual body without jansson's parser (a third of its cost); the
     * rest, and every error message, from json_loadb. */
    json_t *j = gp_json_read(body, len);
    if (!j)
        j = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
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
/* Small helpers                                                       */
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

/* The methods routes of path take (HEAD with GET), for Allow. */
static void allow_methods(gps_http *h, const char *path, char *allow, size_t cap)
{
    unsigned m = 0;
    for (size_t i = 0; i < h->nroutes; i++)
        if (pattern_match(h->routes[i].pattern, path, NULL, NULL))
            m |= h->routes[i].methods;
    if (m & EVHTTP_REQ_GET)
        m |= EVHTTP_REQ_HEAD;
    allow[0] = '\0';
    static const unsigned all[] = {EVHTTP_REQ_GET,    EVHTTP_REQ_HEAD,  EVHTTP_REQ_POST,
                                   EVHTTP_REQ_PUT,    EVHTTP_REQ_DELETE, EVHTTP_REQ_PATCH,
                                   EVHTTP_REQ_OPTIONS};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (!(m & all[i]))
            continue;
        if (allow[0])
            strncat(allow, ", ", cap - strlen(allow) - 1);
        strncat(allow, method_name(all[i]), cap - strlen(allow) - 1);
    }
}

/* ------------------------------------------------------------------ */
/* Head parsing (pure)                                                 */
/* ------------------------------------------------------------------ */

static bool is_tchar(unsigned char c)
{
    return isalnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

bool gps_http_target_ok(const char *t)
{
    if (t[0] != '/')
        return false;
    for (const char *p = t; *p; p++)
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f)
            return false;
    size_t plen = strcspn(t, "?#");
    /* Segment by segment: "" (from "//"), "." and ".." are refused; so is a
     * percent-encoded dot segment, which a proxy might decode. */
    const char *seg = t + 1, *end = t + plen;
    while (seg <= end) {
        const char *s = memchr(seg, '/', (size_t)(end - seg));
        size_t sl = s ? (size_t)(s - seg) : (size_t)(end - seg);
        bool last = !s;
        if (sl == 0 && !last)
            return false; /* "//" */
        char dec[8];
        size_t dl = 0;
        for (size_t i = 0; i < sl && dl < sizeof dec - 1; i++) {
            if (seg[i] == '%' && i + 2 < sl + 1 && strncasecmp(seg + i, "%2e", 3) == 0) {
                dec[dl++] = '.';
                i += 2;
            } else {
                dec[dl++] = seg[i];
            }
        }
        dec[dl] = '\0';
        if (sl <= 9 && (strcmp(dec, ".") == 0 || strcmp(dec, "..") == 0))
            return false;
        if (last)
            break;
        seg = s + 1;
    }
    return true;
}

static const struct {
    const char *name;
    unsigned m;
} methods[] = {
    {"GET", EVHTTP_REQ_GET},       {"HEAD", EVHTTP_REQ_HEAD},   {"POST", EVHTTP_REQ_POST},
    {"PUT", EVHTTP_REQ_PUT},       {"DELETE", EVHTTP_REQ_DELETE},
    {"OPTIONS", EVHTTP_REQ_OPTIONS}, {"PATCH", EVHTTP_REQ_PATCH},
};

/* Append to out->canon; false when it does not fit. */
static bool canon_add(gps_head *out, size_t cap, const char *s, size_t n)
{
    if (out->canon_len + n + 1 > cap)
        return false;
    memcpy(out->canon + out->canon_len, s, n);
    out->canon_len += n;
    out->canon[out->canon_len] = '\0';
    return true;
}

#define HEAD_FAIL(st, ...)                                                                         \
    do {                                                                                           \
        snprintf(msg, msglen, __VA_ARGS__);                                                        \
        return (st);                                                                               \
    } while (0)

/* The fields home mode and pool loops look at (issue 25): Host, Origin,
 * Content-Type, X-Pool-Via. 0, or the status to refuse with. */
static int head_site_field(gps_head *out, const char *name, size_t nl, const char *v,
                           size_t vlen, char *msg, size_t msglen)
{
#define IS(n) (nl == sizeof(n) - 1 && strncasecmp(name, n, nl) == 0)
    if (IS("Host")) {
        if (out->has_host)
            HEAD_FAIL(400, "more than one Host header");
        out->has_host = true;
        if (vlen < sizeof out->host)
            gp_copy_cut(out->host, sizeof out->host, v, vlen);
    } else if (IS("Origin")) {
        if (out->has_origin)
            HEAD_FAIL(400, "more than one Origin header");
        out->has_origin = true;
        if (vlen < sizeof out->origin)
            gp_copy_cut(out->origin, sizeof out->origin, v, vlen);
    } else if (IS("X-Pool-Via")) {
        if (out->has_via)
            HEAD_FAIL(400, "more than one X-Pool-Via header");
        out->has_via = true;
        if (vlen >= sizeof out->via)
            HEAD_FAIL(400, "X-Pool-Via longer than %zu bytes: a loop of pools?",
                      sizeof out->via - 1);
        gp_copy_cut(out->via, sizeof out->via, v, vlen);
    } else if (IS("Content-Type")) {
        /* A second one makes the type unknown ("" never matches). */
        if (!out->has_ctype && vlen < sizeof out->ctype)
            gp_copy_cut(out->ctype, sizeof out->ctype, v, vlen);
        else
            out->ctype[0] = '\0';
        out->has_ctype = true;
    }
#undef IS
    return 0;
}

/* The request line (p .. eol, eol at its LF): METHOD SP target SP
 * HTTP/1.x CRLF, copied canonical into out->canon. 0, or the HTTP status
 * to refuse with (msg says why). */
static int head_request_line(const char *p, const char *eol, gps_head *out, size_t canon_cap,
                             char *msg, size_t msglen)
{
    if (eol == p || eol[-1] != '\r')
        HEAD_FAIL(400, "malformed request line (lines end with CRLF)");
    const char *sp1 = memchr(p, ' ', (size_t)(eol - p));
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
    if (!sp1 || !sp2 || sp1 == p || sp2 == sp1 + 1)
        HEAD_FAIL(400, "malformed request line");
    size_t ml = (size_t)(sp1 - p);
    for (size_t i = 0; i < ml; i++)
        if (!is_tchar((unsigned char)p[i]))
            HEAD_FAIL(400, "malformed request method");
    gp_copy_cut(out->method_name, sizeof out->method_name, p, ml);
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (strlen(methods[i].name) == ml && memcmp(methods[i].name, p, ml) == 0)
            out->method = methods[i].m;
    size_t tl = (size_t)(sp2 - sp1 - 1);
    const char *ver = sp2 + 1;
    size_t vl = (size_t)(eol - 1 - ver);
    if (vl != 8 || memcmp(ver, "HTTP/1.", 7) != 0 || (ver[7] != '0' && ver[7] != '1'))
        HEAD_FAIL(400, "unsupported HTTP version (HTTP/1.0 and HTTP/1.1 only)");
    out->minor = ver[7] - '0';
    if (tl >= sizeof out->target)
        HEAD_FAIL(414, "request target longer than %zu bytes", sizeof out->target - 1);
    memcpy(out->target, sp1 + 1, tl);
    out->target[tl] = '\0';
    if (!out->method)
        HEAD_FAIL(501, "method %s is not implemented", out->method_name);
    /* A NUL would end the target gps_http_target_ok reads (and routes see)
     * while the bytes after it still went to evhttp. */
    if (memchr(out->target, '\0', tl) || !gps_http_target_ok(out->target))
        HEAD_FAIL(400, "request target must be a normalised path (origin-form: no scheme or "
                       "host, no empty, '.' or '..' segment)");
    const char *vers = out->minor ? " HTTP/1.1\r\n" : " HTTP/1.0\r\n";
    if (!canon_add(out, canon_cap, out->method_name, strlen(out->method_name)) ||
        !canon_add(out, canon_cap, " ", 1) || !canon_add(out, canon_cap, out->target, tl) ||
        !canon_add(out, canon_cap, vers, strlen(vers)))
        HEAD_FAIL(431, "request head too large");
    return 0;
}

/* A header field the server reads itself (name p of nl bytes, value v of
 * vlen, trimmed); any other goes to head_site_field. *te: a
 * Transfer-Encoding was seen. 0, or the status to refuse with. */
static int head_field(gps_head *out, const char *p, size_t nl, const char *v, size_t vlen,
                      bool *te, char *msg, size_t msglen)
{
#define IS(name) (nl == sizeof(name) - 1 && strncasecmp(p, name, nl) == 0)
    if (IS("Content-Length")) {
        if (out->content_length >= 0)
            HEAD_FAIL(400, "more than one Content-Length header");
        if (vlen == 0 || vlen > 18)
            HEAD_FAIL(400, "invalid Content-Length");
        long long cl = 0;
        for (size_t i = 0; i < vlen; i++) {
            if (v[i] < '0' || v[i] > '9')
                HEAD_FAIL(400, "invalid Content-Length (digits only)");
            cl = cl * 10 + (v[i] - '0');
        }
        out->content_length = cl;
    } else if (IS("Transfer-Encoding")) {
        if (*te)
            HEAD_FAIL(400, "more than one Transfer-Encoding header");
        *te = true;
        if (vlen != 7 || strncasecmp(v, "chunked", 7) != 0)
            HEAD_FAIL(400, "unsupported Transfer-Encoding (only chunked)");
        out->chunked = true;
    } else if (IS("Authorization")) {
        if (out->has_auth)
            HEAD_FAIL(400, "more than one Authorization header");
        out->has_auth = true;
        gp_copy_cut(out->auth, sizeof out->auth, v, vlen);
    } else if (IS("x-api-key")) {
        if (out->has_api_key)
            HEAD_FAIL(400, "more than one x-api-key header");
        out->has_api_key = true;
        gp_copy_cut(out->api_key, sizeof out->api_key, v, vlen);
    } else if (IS("X-Forwarded-For")) {
        gp_copy_cut(out->xff, sizeof out->xff, v, vlen);
    } else if (IS("X-Correlation-Id")) {
        if (vlen < sizeof out->corr)
            gp_copy_cut(out->corr, sizeof out->corr, v, vlen);
    } else {
        return head_site_field(out, p, nl, v, vlen, msg, msglen);
    }
#undef IS
    return 0;
}

/* One header line (p .. eol, eol at its LF): checked, read (head_field)
 * and copied canonical. 0, or the status to refuse with. */
static int head_line(const char *p, const char *eol, gps_head *out, size_t canon_cap, bool *te,
                     char *msg, size_t msglen)
{
    if (eol == p || eol[-1] != '\r')
        HEAD_FAIL(400, "malformed header line (lines end with CRLF)");
    const char *le = eol - 1; /* the CR */
    if (*p == ' ' || *p == '\t')
        HEAD_FAIL(400, "obsolete header line folding is not accepted");
    const char *colon = memchr(p, ':', (size_t)(le - p));
    if (!colon || colon == p)
        HEAD_FAIL(400, "malformed header line");
    for (const char *q = p; q < colon; q++)
        if (!is_tchar((unsigned char)*q))
            HEAD_FAIL(400, "malformed header name");
    const char *v = colon + 1, *ve = le;
    while (v < ve && (*v == ' ' || *v == '\t'))
        v++;
    while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
        ve--;
    for (const char *q = v; q < ve; q++)
        if (((unsigned char)*q < 0x20 && *q != '\t') || *q == 0x7f)
            HEAD_FAIL(400, "control character in a header value");
    size_t nl = (size_t)(colon - p), vlen = (size_t)(ve - v);
    int st = head_field(out, p, nl, v, vlen, te, msg, msglen);
    if (st)
        return st;
    if (!canon_add(out, canon_cap, p, nl) || !canon_add(out, canon_cap, ": ", 2) ||
        !canon_add(out, canon_cap, v, vlen) || !canon_add(out, canon_cap, "\r\n", 2))
        HEAD_FAIL(431, "request head too large");
    return 0;
}

int gps_http_head_parse(const char *head, size_t len, gps_head *out, char *canon,
                        size_t canon_cap, char *msg, size_t msglen)
{
    memset(out, 0, sizeof *out);
    out->canon = canon;
    if (canon_cap)
        canon[0] = '\0';
    out->content_length = -1;
    const char *p = head, *end = head + len;
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol)
        HEAD_FAIL(400, "malformed request line (lines end with CRLF)");
    int st = head_request_line(p, eol, out, canon_cap, msg, msglen);
    if (st)
        return st;
    bool te = false;
    for (p = eol + 1; p < end; p = eol + 1) {
        eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            HEAD_FAIL(400, "malformed header line (lines end with CRLF)");
        if ((st = head_line(p, eol, out, canon_cap, &te, msg, msglen)) != 0)
            return st;
    }
    if (out->chunked && out->content_length >= 0)
        HEAD_FAIL(400, "both Content-Length and Transfer-Encoding");
    /* evhttp never reads a body after HEAD: one sent anyway would be taken
     * for the next request. A GET body means nothing to any route, and
     * would only be bytes a peer makes the server hold (issue 25). */
    if (out->method == EVHTTP_REQ_HEAD && (out->chunked || out->content_length > 0))
        HEAD_FAIL(400, "a HEAD request has no body");
    if (out->method == EVHTTP_REQ_GET && (out->chunked || out->content_length > 0))
        HEAD_FAIL(400, "a GET request has no body");
    if (!canon_add(out, canon_cap, "\r\n", 2))
        HEAD_FAIL(431, "request head too large");
    return 0;
}
#undef HEAD_FAIL

/* ------------------------------------------------------------------ */
/* The gate                                                            */
/* ------------------------------------------------------------------ */

typedef enum {
    G_HEAD,        /* collecting a request head */
    G_BODY,        /* Content-Length body: `left` bytes to pass */
    G_CHUNK_SIZE,  /* chunked: expecting a chunk-size line */
    G_CHUNK_DATA,  /* chunked: `left` data bytes to pass */
    G_CHUNK_CRLF,  /* chunked: the CRLF after the data */
    G_TRAILER,     /* chunked: trailer lines until the empty one (dropped) */
    G_DONE,        /* request handed over; later bytes wait for the next */
    G_DISCARD,     /* refused with a body pending: drop everything */
} gate_state;

struct gps_conn {
    gps_http *h;
    struct gps_conn *prev, *next;      /* h->conns_all */
    struct bufferevent *bev;
    struct evhttp_connection *evcon;   /* NULL until attached */
    struct evbuffer_cb_entry *cbe;
    struct event *init_ev;             /* NULL once attached */
    struct event *deadline;            /* head or body deadline */
    struct event *hs_deadline;         /* TLS: the handshake's, from accept */
    struct evbuffer *raw;              /* bytes held back from evhttp */
    struct evbuffer *held;             /* the vetted request, until it is whole */
    int fd;
    bool busy;                         /* we are changing the input ourselves */
    bool holds_ref;                    /* bufferevent_incref until attached */
    gate_state st;
    size_t vetted;                     /* leading input bytes evhttp may read */
    uint64_t left;
    uint64_t body_total;
    size_t reserved;                   /* our share of h->inflight */
    size_t reserved_unauth;            /* ... and of h->inflight_unauth */
    unsigned char peer[16];            /* the peer's address (IPv4 mapped), for per-peer bounds */
    bool peer_v4;                      /* the socket is AF_INET (peer + 12 is its address) */
    bool has_peer;
    /* What dispatch must know. */
    int refuse;                        /* HTTP status, 0 = accepted */
    gps_dialect dialect;
    const char *code;
    char msg[240];
    char allow[64];
    bool www_auth, no_retry, close_after, retry_after;
    bool authed;
    bool unauth;                       /* a route without credentials (role NONE) */
    char corr[65];                     /* the request's X-Correlation-Id, for a stand-in */
    char key_id[65];
};

static void conn_free(gps_conn *c);
static void gate_run(gps_conn *c);

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    gps_conn *c = arg;
    gp_log_write(GP_LOG_DEBUG, "request_deadline", NULL,
                 json_pack("{s:s}", "phase", c->st == G_HEAD ? "head" : "body"),
                 "closing a connection whose request %s did not arrive in time",
                 c->st == G_HEAD ? "head" : "body");
    /* Not inside evhttp's callbacks: freeing the connection runs its close
     * callback, which frees c (and this event). */
    evhttp_connection_free(c->evcon);
}

/* A TLS handshake must end within header_timeout_sec of the accept: a
 * ClientHello sent a byte a second kept the connection forever, as every
 * byte renewed the idle timeout (issue 25). */
static void hs_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    gps_conn *c = arg;
    SSL *ssl = bufferevent_openssl_get_ssl(c->bev);
    if (!ssl || SSL_is_init_finished(ssl) || !c->evcon)
        return;
    gp_log_write(GP_LOG_DEBUG, "tls_handshake_deadline", NULL,
                 json_pack("{s:i}", "timeout_sec", c->h->opts.header_timeout_sec),
                 "closing a connection whose TLS handshake did not end in time");
    evhttp_connection_free(c->evcon); /* frees c (its close callback) */
}

static void deadline_set(gps_conn *c, int sec)
{
    if (c->deadline)
        event_del(c->deadline);
    if (sec <= 0 || !c->deadline)
        return;
    struct timeval tv = {sec, 0};
    event_add(c->deadline, &tv);
}

static void inflight_release(gps_conn *c)
{
    c->h->inflight -= c->reserved;
    c->h->inflight_unauth -= c->reserved_unauth;
    c->reserved = 0;
    c->reserved_unauth = 0;
}

/* The budgets a request's body bytes are charged to as they arrive (issue
 * 25: a declared Content-Length reserved at the head let 16 peers holding
 * one byte each fill the budget). Requests without credentials get a
 * quarter at most, so enrollments can never starve agents and clients.
 * false: the bytes do not fit (nothing charged). */
static size_t unauth_share(const gps_http *h)
{
    return h->opts.max_inflight_body_bytes / 4;
}

static size_t unauth_cap(const gps_http *h)
{
    return h->opts.max_unauth_body_bytes ? h->opts.max_unauth_body_bytes : 65536;
}

/* Bytes of requests without credentials one peer address has in flight:
 * the gates are scanned (only for such requests, which are rare). */
static size_t peer_unauth(const gps_conn *c)
{
    size_t sum = 0;
    if (!c->has_peer)
        return 0;
    for (const gps_conn *o = c->h->conns_all; o; o = o->next)
        if (o->reserved_unauth && o->has_peer && memcmp(o->peer, c->peer, sizeof o->peer) == 0)
            sum += o->reserved_unauth;
    return sum;
}

static bool inflight_fits(const gps_conn *c, uint64_t n)
{
    const gps_http *h = c->h;
    size_t max = h->opts.max_inflight_body_bytes;
    if (max && (n > max || h->inflight + n > max))
        return false;
    if (!c->unauth)
        return true;
    if (max && h->inflight_unauth + n > unauth_share(h))
        return false;
    /* One address may hold GPS_HTTP_PEER_UNAUTH_BODIES such bodies' worth. */
    return peer_unauth(c) + n <= GPS_HTTP_PEER_UNAUTH_BODIES * unauth_cap(h);
}

static bool inflight_charge(gps_conn *c, size_t n)
{
    if (!inflight_fits(c, n))
        return false;
    c->reserved += n;
    c->h->inflight += n;
    if (c->unauth) {
        c->reserved_unauth += n;
        c->h->inflight_unauth += n;
    }
    return true;
}

/* Append to a bufferevent's input. The bufferevent keeps its end frozen
 * except while it reads from the socket (when our input callback runs);
 * at dispatch and on completion we are outside that window, so thaw it
 * for the call and freeze it again. src: an evbuffer to move (data NULL)
 * or bytes. */
static void input_append(struct evbuffer *in, struct evbuffer *src, const void *data, size_t n)
{
    int rc = src ? evbuffer_add_buffer(in, src) : evbuffer_add(in, data, n);
    if (rc == 0)
        return;
    evbuffer_unfreeze(in, 0);
    if (src)
        evbuffer_add_buffer(in, src);
    else
        evbuffer_add(in, data, n);
    evbuffer_freeze(in, 0);
}

/* The gate's output for the current request is held until the request is
 * whole (or refused): evhttp never sees a partial body, so a refusal in
 * the middle of one is a plain stand-in request (below). */
static void release(gps_conn *c, const void *data, size_t n)
{
    if (evbuffer_add(c->held, data, n) < 0)
        c->st = G_DISCARD; /* ENOMEM: nothing reaches evhttp; the deadline closes it */
}

static void release_raw(gps_conn *c, size_t n)
{
    if (evbuffer_remove_buffer(c->raw, c->held, n) != (int)n) {
        evbuffer_drain(c->raw, n);
        c->st = G_DISCARD;
    }
}

/* The request is whole: hand it to evhttp. */
static void flush_held(gps_conn *c)
{
    size_t n = evbuffer_get_length(c->held);
    input_append(bufferevent_get_input(c->bev), c->held, NULL, 0);
    c->vetted += n;
}

/* Refuse the current request. At the head: evhttp gets a bodiless
 * stand-in that dispatch answers with the refusal. Inside a chunked body:
 * evhttp gets the last chunk, and dispatch answers the same way. */
static void refuse(gps_conn *c, int status, const char *code, gps_dialect d, const char *fmt,
                   ...) __attribute__((format(printf, 5, 6)));
static void refuse(gps_conn *c, int status, const char *code, gps_dialect d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof c->msg, fmt, ap);
    va_end(ap);
    c->refuse = status;
    c->code = code;
    c->dialect = d;
}

static void finish_stand_in(gps_conn *c, bool head_method, const char *corr, bool body_pending)
{
    char stand_in[160];
    int n = snprintf(stand_in, sizeof stand_in, "%s / HTTP/1.1\r\n%s%s%s\r\n",
                     head_method ? "HEAD" : "GET", corr[0] ? "X-Correlation-Id: " : "", corr,
                     corr[0] ? "\r\n" : "");
    evbuffer_drain(c->held, evbuffer_get_length(c->held));
    release(c, stand_in, (size_t)n);
    flush_held(c);
    c->close_after = body_pending;
    c->st = body_pending ? G_DISCARD : G_DONE;
    deadline_set(c, 0);
}

static void finish_refused_head(gps_conn *c, const gps_head *hd, bool body_pending)
{
    finish_stand_in(c, hd && hd->method == EVHTTP_REQ_HEAD, hd ? hd->corr : "", body_pending);
}

/* Inside a body: what was held of the request is dropped and evhttp gets
 * the stand-in instead; the rest of the body is discarded. */
static void refuse_in_body(gps_conn *c)
{
    finish_stand_in(c, false, c->corr, true);
}

static void refuse_busy(gps_conn *c)
{
    c->retry_after = true;
    refuse(c, 503, "SERVER_BUSY", c->dialect,
           "too many request bodies are being received; retry shortly");
    refuse_in_body(c);
}

/* ip (trimmed span [p, e)) is one of h's trusted proxies (exact match). */
static bool proxy_trusted(const gps_http *h, const char *p, const char *e)
{
    const char *l = h->opts.trusted_proxies;
    while (p < e && (*p == ' ' || *p == '\t'))
        p++;
    while (e > p && (e[-1] == ' ' || e[-1] == '\t'))
        e--;
    size_t n = (size_t)(e - p);
    while (l && *l && n) {
        l += strspn(l, " ,\t");
        size_t k = strcspn(l, " ,\t");
        if (k == n && strncmp(l, p, n) == 0)
            return true;
        l += k;
    }
    return false;
}

/* The client address for logs (gps_auth_fn): peer, or behind trusted
 * proxies the rightmost X-Forwarded-For entry that is not one of them
 * (entries left of it are the client's say, so not believed); when every
 * entry is a trusted proxy, the leftmost. */
static void client_addr(const gps_http *h, const char *peer, const char *xff, char *out,
                        size_t outlen)
{
    gp_copy_str(out, outlen, peer && *peer ? peer : "?");
    if (!peer || !xff || !*xff || !proxy_trusted(h, peer, peer + strlen(peer)))
        return;
    const char *end = xff + strlen(xff);
    while (end > xff) {
        const char *start = end;
        while (start > xff && start[-1] != ',')
            start--;
        const char *s = start, *e = end;
        while (s < e && (*s == ' ' || *s == '\t'))
            s++;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        if (e > s) {
            gp_copy_cut(out, outlen, s, (size_t)(e - s));
            if (!proxy_trusted(h, s, e))
                return;
        }
        end = start > xff ? start - 1 : xff;
    }
}

/* The numeric address of the connection's peer ("" when unknown): from
 * the address conn_attach took (peer_from_evhttp), not a getpeername. */
static void peer_text(const gps_conn *c, char *out, size_t outlen)
{
    out[0] = '\0';
    if (!c->has_peer)
        return;
    if (c->peer_v4)
        inet_ntop(AF_INET, c->peer + 12, out, (socklen_t)outlen);
    else
        inet_ntop(AF_INET6, c->peer, out, (socklen_t)outlen);
}

static const char *blank_to_null(const char *s, bool present)
{
    return present && s[0] ? s : NULL;
}

/* The largest body the current request may have. */
static size_t body_cap(const gps_conn *c)
{
    size_t unauth = unauth_cap(c->h);
    size_t max = c->h->opts.max_body_bytes;
    return c->unauth && unauth < max ? unauth : max;
}

/* Host is a loopback name or address, with or without a port. */
static bool host_is_loopback(const char *host)
{
    char name[256];
    snprintf(name, sizeof name, "%s", host);
    if (name[0] == '[') {
        char *e = strchr(name, ']');
        if (!e || (e[1] && (e[1] != ':' || !e[2] || strspn(e + 2, "0123456789") != strlen(e + 2))))
            return false;
        *e = '\0';
        return strcmp(name + 1, "::1") == 0;
    }
    char *colon = strchr(name, ':');
    if (colon) {
        if (!colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1))
            return false;
        *colon = '\0';
    }
    if (strcasecmp(name, "localhost") == 0 || strcasecmp(name, "localhost.") == 0)
        return true;
    struct in_addr a;
    return inet_pton(AF_INET, name, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

/* Home mode (auth off): refuse what a web page elsewhere could make a
 * browser send (issue 25, finding 2). Returns true when refused. */
static bool home_refuse(gps_conn *c, const gps_head *hd, gps_dialect d)
{
    gps_http *h = c->h;
    if (!h->home || !h->home(h->home_arg))
        return false;
    c->no_retry = true;
    /* A browser always sends Host; a rebound DNS name arrives as its own. */
    if (hd->has_host && !host_is_loopback(hd->host)) {
        refuse(c, 403, "HOST_NOT_ALLOWED", d,
               "with auth off this server answers only requests addressed to a loopback name "
               "(Host: localhost, 127.0.0.1 or [::1]), not '%.100s'; create a key to serve "
               "other names",
               hd->host);
        return true;
    }
    if (hd->has_origin) {
        char http_o[300], https_o[300];
        snprintf(http_o, sizeof http_o, "http://%s", hd->host);
        snprintf(https_o, sizeof https_o, "https://%s", hd->host);
        if (!hd->has_host || !hd->origin[0] ||
            (strcasecmp(hd->origin, http_o) != 0 && strcasecmp(hd->origin, https_o) != 0)) {
            refuse(c, 403, "ORIGIN_NOT_ALLOWED", d,
                   "cross-origin request refused: with auth off only pages of this server "
                   "(Origin %.100s) may call it, not '%.100s'",
                   http_o, hd->origin);
            return true;
        }
    }
    bool body = hd->chunked || hd->content_length > 0;
    if (body) {
        size_t tl = strcspn(hd->ctype, "; \t");
        if (tl != 16 || strncasecmp(hd->ctype, "application/json", 16) != 0) {
            refuse(c, 415, "UNSUPPORTED_MEDIA_TYPE", d,
                   "request bodies must be sent as Content-Type: application/json%s%.100s%s",
                   hd->has_ctype ? " (not '" : "", hd->ctype, hd->has_ctype ? "')" : "");
            return true;
        }
    }
    return false;
}

/* X-Pool-Via: ids separated by commas (and blanks). Returns true when
 * refused: this pool is in it, or it holds GPS_POOL_MAX_HOPS ids already
 * (this pool would add one more). */
static bool pool_loop_refuse(gps_conn *c, const gps_head *hd, gps_dialect d)
{
    if (!hd->has_via)
        return false;
    int hops = 0;
    bool self = false;
    for (const char *p = hd->via; *p;) {
        p += strspn(p, ", \t");
        size_t n = strcspn(p, ", \t");
        if (n == 0)
            break;
        hops++;
        if (n == strlen(c->h->pool_id) && strncmp(p, c->h->pool_id, n) == 0)
            self = true;
        p += n;
    }
    /* This pool's id must fit behind the chain it passes on. */
    bool fits = strlen(hd->via) + 2 + strlen(c->h->pool_id) < GPS_POOL_VIA_MAX;
    if (!self && hops < GPS_POOL_MAX_HOPS && fits)
        return false;
    c->no_retry = true;
    if (self)
        refuse(c, 508, "POOL_LOOP", d,
               "pool loop: this request already passed through this pool (X-Pool-Via: %.100s); "
               "an agent's upstream leads back into a pool the request came through",
               hd->via);
    else
        refuse(c, 508, "POOL_LOOP", d,
               "this request passed through %d pools (X-Pool-Via: %.100s), the most a request "
               "may: a loop of pools?",
               hops, hd->via);
    return true;
}

/* The decision on a complete head. Returns true when accepted. */
static bool decide(gps_conn *c, const gps_head *hd)
{
    gps_http *h = c->h;
    const char *q = strchr(hd->target, '?');
    char path[sizeof hd->target];
    gp_copy_cut(path, sizeof path, hd->target, q ? (size_t)(q - hd->target) : strlen(hd->target));
    gps_dialect pd = gps_dialect_for_path(path);
    bool body = hd->chunked || hd->content_length > 0;
    const gps_route *route = NULL;
    unsigned m = hd->method == EVHTTP_REQ_HEAD ? EVHTTP_REQ_GET : hd->method;
    int rc = gps_route_lookup(h->routes, h->nroutes, hd->method, path, &route, NULL, NULL);
    if (rc != 0 && hd->method == EVHTTP_REQ_HEAD)
        rc = gps_route_lookup(h->routes, h->nroutes, m, path, &route, NULL, NULL);
    /* HEAD is answered as GET would be, down to the (unsent) message, so
     * that Content-Length is the same. */
    const char *mn = hd->method == EVHTTP_REQ_HEAD ? "GET" : hd->method_name;
    if (rc == 404) {
        refuse(c, 404, "NOT_FOUND", pd, "no route for %s %.120s", mn, path);
        return false;
    }
    if (rc == 405) {
        refuse(c, 405, "METHOD_NOT_ALLOWED", route->dialect, "method %s is not allowed on %.120s",
               mn, path);
        allow_methods(h, path, c->allow, sizeof c->allow);
        return false;
    }
    c->dialect = route->dialect;
    if (home_refuse(c, hd, route->dialect))
        return false;
    if (route->role != GPS_ROLE_NONE && h->auth) {
        const char *cred = blank_to_null(hd->auth, hd->has_auth);
        if (!cred && route->dialect == GPS_DIALECT_ANTHROPIC)
            cred = blank_to_null(hd->api_key, hd->has_api_key);
        char peer[INET6_ADDRSTRLEN], client[256];
        peer_text(c, peer, sizeof peer);
        client_addr(h, peer, hd->xff, client, sizeof client);
        int st = h->auth(h->auth_arg, cred, route->role, c->key_id, client);
        if (st != 0) {
            c->no_retry = true;
            if (st == 403) {
                refuse(c, 403, "FORBIDDEN", route->dialect,
                       "this key's role may not use this endpoint");
            } else {
                c->www_auth = route->dialect != GPS_DIALECT_NATIVE;
                if (cred)
                    refuse(c, 401, "INVALID_API_KEY", route->dialect, "invalid API key");
                else
                    refuse(c, 401, "UNAUTHORIZED", route->dialect,
                           "missing API key (Authorization: Bearer <key>%s)",
                           route->dialect == GPS_DIALECT_ANTHROPIC ? " or x-api-key" : "");
            }
            return false;
        }
        c->authed = true;
    }
    if (pool_loop_refuse(c, hd, route->dialect))
        return false;
    c->unauth = route->role == GPS_ROLE_NONE;
    size_t cap = body_cap(c);
    if (hd->content_length > 0 && (uint64_t)hd->content_length > cap) {
        refuse(c, 413, "BODY_TOO_LARGE", route->dialect, "request body exceeds %zu bytes%s", cap,
               c->unauth ? " (a request without credentials)" : "");
        return false;
    }
    /* Nothing is reserved on the declared length (bytes are charged as
     * they arrive), but a body that could not fit now is refused at once. */
    if (hd->content_length > 0 && !inflight_fits(c, (uint64_t)hd->content_length)) {
        c->retry_after = true;
        refuse(c, 503, "SERVER_BUSY", route->dialect,
               "too many request bodies are being received; retry shortly");
        return false;
    }
    (void)body;
    return true;
}

/* Parse the head at the front of raw (head_len bytes with the empty line). */
static void gate_head(gps_conn *c, size_t head_len)
{
    gps_head *hd = malloc(sizeof *hd);
    char *flat = malloc(head_len + 1);
    size_t canon_cap = 2 * head_len + 64;
    char *canon = malloc(canon_cap);
    char msg[200];
    if (!hd || !flat || !canon) {
        free(hd);
        free(flat);
        free(canon);
        refuse(c, 503, "OUT_OF_MEMORY", GPS_DIALECT_NATIVE, "out of memory");
        finish_refused_head(c, NULL, true);
        return;
    }
    evbuffer_remove(c->raw, flat, head_len);
    flat[head_len] = '\0';
    memset(&c->refuse, 0, sizeof *c - offsetof(gps_conn, refuse));
    deadline_set(c, 0);
    /* The empty line is not part of what the parser takes. */
    int st = gps_http_head_parse(flat, head_len - 2, hd, canon, canon_cap, msg, sizeof msg);
    if (st != 0) {
        /* Dialect by the path when the target is at least a path. */
        gps_dialect d = hd->target[0] == '/' ? gps_dialect_for_path(hd->target)
                                             : GPS_DIALECT_NATIVE;
        refuse(c, st,
               st == 501   ? "NOT_IMPLEMENTED"
               : st == 400 ? "INVALID_REQUEST"
               : st == 414 ? "URI_TOO_LONG"
                           : "HEAD_TOO_LARGE",
               d, "%s", msg);
        /* The framing cannot be trusted: always close afterwards. */
        finish_refused_head(c, hd, true);
        goto done;
    }
    bool body = hd->chunked || hd->content_length > 0;
    if (!decide(c, hd)) {
        finish_refused_head(c, hd, body);
        goto done;
    }
    gp_copy_str(c->corr, sizeof c->corr, hd->corr);
    release(c, hd->canon, hd->canon_len);
    if (hd->chunked) {
        c->st = G_CHUNK_SIZE;
        c->body_total = 0;
    } else if (hd->content_length > 0) {
        c->st = G_BODY;
        c->left = (uint64_t)hd->content_length;
    } else {
        c->st = G_DONE;
        flush_held(c);
    }
    if (body)
        deadline_set(c, c->h->opts.body_timeout_sec);
done:
    free(hd);
    free(flat);
    free(canon);
}

/* One chunk-size line at the front of raw. false: wait for more. */
static bool gate_chunk_size(gps_conn *c)
{
    size_t len = evbuffer_get_length(c->raw);
    struct evbuffer_ptr e = evbuffer_search(c->raw, "\n", 1, NULL);
    if (e.pos < 0) {
        if (len > 1024) {
            refuse(c, 400, "INVALID_REQUEST", c->dialect, "chunk-size line too long");
            refuse_in_body(c);
            return true;
        }
        return false;
    }
    size_t ll = (size_t)e.pos + 1;
    char line[1040];
    if (ll >= sizeof line) {
        refuse(c, 400, "INVALID_REQUEST", c->dialect, "chunk-size line too long");
        refuse_in_body(c);
        return true;
    }
    evbuffer_remove(c->raw, line, ll);
    line[ll] = '\0';
    size_t i = 0;
    uint64_t size = 0;
    while (isxdigit((unsigned char)line[i]) && i < 15) {
        char ch = line[i++];
        size = size * 16 + (uint64_t)(isdigit((unsigned char)ch) ? ch - '0'
                                                                  : tolower((unsigned char)ch) - 'a' + 10);
    }
    bool ok = i > 0 && ll >= 2 && line[ll - 2] == '\r';
    if (ok && line[i] != '\r') {
        /* chunk-ext: *( BWS ";" BWS name [ BWS "=" BWS value ] ), printable. */
        ok = line[i] == ';' || line[i] == ' ' || line[i] == '\t';
        for (size_t k = i; ok && k < ll - 2; k++)
            ok = (unsigned char)line[k] >= 0x20 ? line[k] != 0x7f : line[k] == '\t';
        if (ok) {
            size_t k = i;
            while (line[k] == ' ' || line[k] == '\t')
                k++;
            ok = line[k] == ';';
        }
    }
    if (!ok) {
        refuse(c, 400, "INVALID_REQUEST", c->dialect, "invalid chunk size");
        refuse_in_body(c);
        return true;
    }
    if (size == 0) {
        c->st = G_TRAILER;
        return true;
    }
    size_t cap = body_cap(c);
    if (c->body_total + size > cap) {
        refuse(c, 413, "BODY_TOO_LARGE", c->dialect, "request body exceeds %zu bytes%s", cap,
               c->unauth ? " (a request without credentials)" : "");
        refuse_in_body(c);
        return true;
    }
    if (!inflight_fits(c, size)) {
        refuse_busy(c);
        return true;
    }
    c->body_total += size;
    char out[32];
    int n = snprintf(out, sizeof out, "%llx\r\n", (unsigned long long)size);
    release(c, out, (size_t)n);
    c->left = size;
    c->st = G_CHUNK_DATA;
    return true;
}

/* Trailer lines after the last chunk: dropped (they would be merged into
 * the request headers after the checks). */
static bool gate_trailer(gps_conn *c)
{
    for (;;) {
        struct evbuffer_ptr e = evbuffer_search(c->raw, "\n", 1, NULL);
        if (e.pos < 0) {
            if (evbuffer_get_length(c->raw) > c->h->opts.max_header_bytes) {
                refuse(c, 400, "INVALID_REQUEST", c->dialect, "chunked trailer too large");
                refuse_in_body(c);
                return true;
            }
            return false;
        }
        bool empty = e.pos == 0 || e.pos == 1;
        char first = 0;
        evbuffer_copyout(c->raw, &first, 1);
        evbuffer_drain(c->raw, (size_t)e.pos + 1);
        if (empty && (e.pos == 0 || first == '\r')) {
            release(c, "0\r\n\r\n", 5);
            c->st = G_DONE;
            flush_held(c);
            deadline_set(c, 0);
            return true;
        }
    }
}

/* Where the head ends in raw (bytes including the empty line), 0 when not
 * yet there. Leading empty lines (allowed before a request) are dropped. */
static size_t head_end(gps_conn *c)
{
    for (;;) {
        unsigned char two[2];
        ev_ssize_t n = evbuffer_copyout(c->raw, two, 2);
        if (n >= 1 && two[0] == '\n')
            evbuffer_drain(c->raw, 1);
        else if (n == 2 && two[0] == '\r' && two[1] == '\n')
            evbuffer_drain(c->raw, 2);
        else
            break;
    }
    struct evbuffer_ptr e = evbuffer_search(c->raw, "\r\n\r\n", 4, NULL);
    if (e.pos >= 0)
        return (size_t)e.pos + 4;
    /* A bare LF line end would never match: find "\n\n" to refuse it. */
    e = evbuffer_search(c->raw, "\n\n", 2, NULL);
    if (e.pos >= 0)
        return (size_t)e.pos + 2;
    return 0;
}

static void gate_step(gps_conn *c)
{
    gps_http *h = c->h;
    for (;;) {
        size_t len = evbuffer_get_length(c->raw);
        switch (c->st) {
        case G_HEAD: {
            if (len == 0)
                return;
            size_t he = head_end(c);
            len = evbuffer_get_length(c->raw);
            if (he == 0 || he > h->opts.max_header_bytes + 4) {
                if (len > h->opts.max_header_bytes) {
                    memset(&c->refuse, 0, sizeof *c - offsetof(gps_conn, refuse));
                    refuse(c, 431, "HEAD_TOO_LARGE", GPS_DIALECT_NATIVE,
                           "request head exceeds %zu bytes", h->opts.max_header_bytes);
                    finish_refused_head(c, NULL, true);
                    continue;
                }
                if (len > 0 && !event_pending(c->deadline, EV_TIMEOUT, NULL))
                    deadline_set(c, h->opts.header_timeout_sec);
                return;
            }
            gate_head(c, he);
            continue;
        }
        case G_BODY: {
            if (len == 0)
                return;
            size_t n = len < c->left ? len : (size_t)c->left;
            if (!inflight_charge(c, n)) {
                refuse_busy(c);
                continue;
            }
            release_raw(c, n);
            c->left -= n;
            if (c->left == 0 && c->st == G_BODY) {
                c->st = G_DONE;
                flush_held(c);
                deadline_set(c, 0);
            }
            continue;
        }
        case G_CHUNK_SIZE:
            if (len == 0 || !gate_chunk_size(c))
                return;
            continue;
        case G_CHUNK_DATA: {
            if (len == 0)
                return;
            size_t n = len < c->left ? len : (size_t)c->left;
            if (!inflight_charge(c, n)) {
                refuse_busy(c);
                continue;
            }
            release_raw(c, n);
            c->left -= n;
            if (c->left == 0 && c->st == G_CHUNK_DATA)
                c->st = G_CHUNK_CRLF;
            continue;
        }
        case G_CHUNK_CRLF: {
            if (len < 2)
                return;
            char two[2];
            evbuffer_remove(c->raw, two, 2);
            if (two[0] != '\r' || two[1] != '\n') {
                refuse(c, 400, "INVALID_REQUEST", c->dialect, "chunk data not followed by CRLF");
                refuse_in_body(c);
                continue;
            }
            release(c, "\r\n", 2);
            c->st = G_CHUNK_SIZE;
            continue;
        }
        case G_TRAILER:
            if (len == 0 || !gate_trailer(c))
                return;
            continue;
        case G_DONE:
            /* Pipelined bytes wait for the next request (dispatch follows
             * at once; this only bounds a peer that floods meanwhile). */
            if (len > h->opts.max_header_bytes)
                bufferevent_disable(c->bev, EV_READ);
            return;
        case G_DISCARD:
            evbuffer_drain(c->raw, len);
            return;
        }
    }
}

/* Move the bytes evhttp has not been given yet into raw, then step. */
static void gate_run(gps_conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t len = evbuffer_get_length(in);
    c->busy = true;
    if (len > c->vetted) {
        struct evbuffer *keep = evbuffer_new();
        if (keep) {
            evbuffer_remove_buffer(in, keep, c->vetted);
            evbuffer_add_buffer(c->raw, in);
            input_append(in, keep, NULL, 0);
            evbuffer_free(keep);
        } else {
            evbuffer_drain(in, len - c->vetted); /* ENOMEM: the peer resends or gives up */
        }
    }
    gate_step(c);
    c->busy = false;
}

static void input_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    gps_conn *c = arg;
    if (c->busy)
        return;
    /* evhttp consumed what we gave it. */
    c->vetted = info->n_deleted < c->vetted ? c->vetted - info->n_deleted : 0;
    if (info->n_added == 0)
        return;
    if (!c->evcon) {
        /* Data before the first loop pass (not expected): hold it until
         * attach runs. */
        return;
    }
    gate_run(c);
}

static void conn_closed(struct evhttp_connection *evcon, void *arg)
{
    conn_free(arg);
}

static int conn_table_put(gps_http *h, int fd, gps_conn *c)
{
    if (fd < 0)
        return -1;
    if ((size_t)fd >= h->nconn_by_fd) {
        size_t n = h->nconn_by_fd ? h->nconn_by_fd : 64;
        while (n <= (size_t)fd)
            n *= 2;
        gps_conn **t = realloc(h->conn_by_fd, n * sizeof *t);
        if (!t)
            return -1;
        memset(t + h->nconn_by_fd, 0, (n - h->nconn_by_fd) * sizeof *t);
        h->conn_by_fd = t;
        h->nconn_by_fd = n;
    }
    h->conn_by_fd[fd] = c;
    return 0;
}

static gps_conn *conn_of(gps_http *h, struct evhttp_connection *evcon)
{
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    int fd = bev ? (int)bufferevent_getfd(bev) : -1;
    if (fd < 0 || (size_t)fd >= h->nconn_by_fd)
        return NULL;
    gps_conn *c = h->conn_by_fd[fd];
    return c && c->bev == bev ? c : NULL;
}

static void conn_free(gps_conn *c)
{
    if (!c)
        return;
    gps_http *h = c->h;
    inflight_release(c);
    if (c->fd >= 0 && (size_t)c->fd < h->nconn_by_fd && h->conn_by_fd[c->fd] == c)
        h->conn_by_fd[c->fd] = NULL;
    if (c->cbe)
        evbuffer_remove_cb_entry(bufferevent_get_input(c->bev), c->cbe);
    if (c->init_ev)
        event_free(c->init_ev);
    if (c->deadline)
        event_free(c->deadline);
    if (c->hs_deadline)
        event_free(c->hs_deadline);
    if (c->raw)
        evbuffer_free(c->raw);
    if (c->held)
        evbuffer_free(c->held);
    if (c->holds_ref)
        bufferevent_decref(c->bev);
    if (c->prev)
        c->prev->next = c->next;
    else
        h->conns_all = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c);
}

static gps_conn *conn_new(gps_http *h, struct bufferevent *bev)
{
    gps_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->h = h;
    c->bev = bev;
    c->fd = -1;
    c->raw = evbuffer_new();
    c->held = evbuffer_new();
    c->deadline = evtimer_new(h->base, deadline_cb, c);
    c->cbe = evbuffer_add_cb(bufferevent_get_input(bev), input_cb, c);
    c->next = h->conns_all;
    if (c->next)
        c->next->prev = c;
    h->conns_all = c;
    if (!c->raw || !c->held || !c->deadline || !c->cbe) {
        conn_free(c);
        return NULL;
    }
    return c;
}

/* c->peer + 12 holds an IPv4 address: the rest is the IPv4-mapped prefix
 * (::ffff:0:0/96), so that per-peer bounds compare one 16-byte form. */
static void peer_mark_v4(gps_conn *c)
{
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    memcpy(c->peer, mapped, sizeof mapped);
    c->peer_v4 = true;
}

/* The peer's address as evhttp wrote it at accept (numeric, from
 * getnameinfo; an IPv6 zone after '%' is dropped, as inet_ntop drops it):
 * a keep-alive connection gets a new gate per request, and a getpeername
 * each was one system call a request. false: evhttp has none. */
static bool peer_from_evhttp(gps_conn *c, struct evhttp_connection *evcon)
{
    char *addr = NULL, buf[INET6_ADDRSTRLEN];
    ev_uint16_t port = 0;
    evhttp_connection_get_peer(evcon, &addr, &port);
    if (!addr)
        return false;
    size_t n = strcspn(addr, "%");
    if (n >= sizeof buf)
        return false;
    memcpy(buf, addr, n);
    buf[n] = '\0';
    if (inet_pton(AF_INET, buf, c->peer + 12) == 1) {
        peer_mark_v4(c);
    } else if (inet_pton(AF_INET6, buf, c->peer) != 1) {
        return false;
    }
    c->has_peer = true;
    return true;
}

static void peer_from_fd(gps_conn *c)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (c->fd < 0 || getpeername(c->fd, (struct sockaddr *)&ss, &sl) != 0)
        return;
    if (ss.ss_family == AF_INET6) {
        memcpy(c->peer, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
        c->has_peer = true;
    } else if (ss.ss_family == AF_INET) {
        memcpy(c->peer + 12, &((struct sockaddr_in *)&ss)->sin_addr, 4);
        peer_mark_v4(c);
        c->has_peer = true;
    }
}

/* evhttp has set the connection up: from here on evhttp calls conn_closed
 * when it goes away. false: the connection is gone (c freed). */
static bool conn_attach(gps_conn *c, struct evhttp_connection *evcon)
{
    c->evcon = evcon;
    c->fd = (int)bufferevent_getfd(c->bev);
    if (!peer_from_evhttp(c, evcon))
        peer_from_fd(c);
    if (conn_table_put(c->h, c->fd, c) < 0) {
        c->fd = -1;
        conn_free(c); /* the caller closes the connection */
        return false;
    }
    evhttp_connection_set_closecb(evcon, conn_closed, c);
    if (c->holds_ref) {
        c->holds_ref = false;
        bufferevent_decref(c->bev);
    }
    if (c->init_ev) {
        event_free(c->init_ev);
        c->init_ev = NULL;
    }
    gate_run(c);
    return true;
}

static void init_cb(evutil_socket_t fd, short what, void *arg)
{
    gps_conn *c = arg;
    void *cbarg = NULL;
    bufferevent_getcb(c->bev, NULL, NULL, NULL, &cbarg);
    if (!cbarg) {
        /* evhttp failed to set the connection up and freed the
         * bufferevent (our reference kept it readable): let it go. */
        conn_free(c);
        return;
    }
    if (!conn_attach(c, cbarg))
        evhttp_connection_free(cbarg); /* a loop callback: safe here */
}

/* Every accepted connection's bufferevent goes through here. Without
 * memory for the gate, the connection is starved (reads capped at one
 * byte) and evhttp's idle timeout closes it: it is never ungated. */
static struct bufferevent *gate_bev(gps_http *h, struct bufferevent *bev, bool tls)
{
    if (!bev)
        return NULL;
    gps_conn *c = conn_new(h, bev);
    if (c && tls && h->opts.header_timeout_sec > 0) {
        struct timeval tv = {h->opts.header_timeout_sec, 0};
        c->hs_deadline = evtimer_new(h->base, hs_deadline_cb, c);
        if (!c->hs_deadline || event_add(c->hs_deadline, &tv) < 0) {
            conn_free(c);
            c = NULL;
        }
    }
    if (c) {
        c->init_ev = event_new(h->base, -1, 0, init_cb, c);
        if (c->init_ev) {
            /* Runs before the loop polls again, so before any byte. */
            bufferevent_incref(bev);
            c->holds_ref = true;
            event_active(c->init_ev, EV_TIMEOUT, 0);
            return bev;
        }
        conn_free(c);
    }
    bufferevent_setwatermark(bev, EV_READ, 0, 1);
    return bev;
}

static struct bufferevent *plain_bevcb(struct event_base *base, void *arg)
{
    return gate_bev(arg, bufferevent_socket_new(base, -1, 0), false);
}

/* A request was answered completely: the next one on the connection goes
 * through a new gate (the old one ended at dispatch, when the handler took
 * the connection's close callback over). */
static void on_complete(struct evhttp_request *req, void *arg)
{
    gps_http *h = arg;
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    if (!bev)
        return;
    bufferevent_setwatermark(bev, EV_READ, 0, 0);
    gps_conn *c = conn_new(h, bev);
    if (!c || !conn_attach(c, evcon)) {
        /* Inside evhttp's send path: it closes the connection after this
         * callback when the reply says so. */
        bufferevent_setwatermark(bev, EV_READ, 0, 1);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
    }
}

/* Lingering close. A refusal with a body pending closes the connection,
 * but most clients (Python's http.client, the SDKs) send the whole body
 * before they read a reply: closing with their bytes unread would make the
 * kernel send a reset that destroys the reply. So the socket (a duplicate
 * of evhttp's descriptor, which evhttp shuts down for writing and closes)
 * is drained for up to LINGER_SEC or LINGER_BYTES, nothing kept, then
 * closed. */
#define LINGER_SEC 5
#define LINGER_BYTES (64u << 20)

struct lingerer {
    gps_http *h;
    lingerer *prev, *next;
    int fd;
    struct event *ev;
    size_t drained;
};

static void linger_free(lingerer *l)
{
    if (l->prev)
        l->prev->next = l->next;
    else
        l->h->lingers = l->next;
    if (l->next)
        l->next->prev = l->prev;
    if (l->ev)
        event_free(l->ev);
    close(l->fd);
    free(l);
}

static void linger_cb(evutil_socket_t fd, short what, void *arg)
{
    lingerer *l = arg;
    if (what & EV_TIMEOUT) {
        linger_free(l);
        return;
    }
    char buf[16384];
    for (int i = 0; i < 64; i++) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        if (n <= 0 || (l->drained += (size_t)n) > LINGER_BYTES) {
            linger_free(l);
            return;
        }
    }
}

static void on_complete_linger(struct evhttp_request *req, void *arg)
{
    gps_http *h = arg;
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    int fd = bev ? (int)bufferevent_getfd(bev) : -1;
    int dfd = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (dfd < 0)
        return; /* out of descriptors: a plain close */
    lingerer *l = calloc(1, sizeof *l);
    if (l) {
        l->h = h;
        l->fd = dfd;
        l->next = h->lingers;
        if (l->next)
            l->next->prev = l;
        h->lingers = l;
        l->ev = event_new(h->base, dfd, EV_READ | EV_PERSIST, linger_cb, l);
    }
    struct timeval tv = {LINGER_SEC, 0};
    if (!l || !l->ev || event_add(l->ev, &tv) < 0) {
        if (l)
            linger_free(l);
        else
            close(dfd);
    }
}

/* Dispatch takes the gate's decision and ends the gate: the handler may
 * set the connection's close callback, so the gate must not need it. */
static void conn_detach(gps_conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    evhttp_connection_set_closecb(c->evcon, NULL, NULL);
    evbuffer_remove_cb_entry(in, c->cbe);
    c->cbe = NULL;
    if (c->st != G_DISCARD)
        input_append(in, c->raw, NULL, 0); /* pipelined: the next gate reads it */
    /* Until the reply is done nobody reads the input: bound it. */
    bufferevent_setwatermark(c->bev, EV_READ, 0, c->h->opts.max_header_bytes);
    conn_free(c);
}

size_t gps_http_inflight_bytes(const gps_http *h)
{
    return h->inflight;
}

/* ------------------------------------------------------------------ */
/* Dispatch                                                            */
/* ------------------------------------------------------------------ */

/* Send the gate's refusal in its dialect. */
static void send_refusal(gps_req *r, const gps_conn *c)
{
    struct evkeyvalq *oh = evhttp_request_get_output_headers(r->req);
    if (c->allow[0])
        evhttp_add_header(oh, "Allow", c->allow);
    if (c->www_auth)
        evhttp_add_header(oh, "WWW-Authenticate", "Bearer");
    /* The Stainless SDKs honour this header before their own rules;
     * without it Claude Code retries a 401 ten times with backoff
     * (minutes) before telling the user the key is wrong. */
    if (c->no_retry)
        evhttp_add_header(oh, "x-should-retry", "false");
    if (c->retry_after)
        evhttp_add_header(oh, "Retry-After", "1");
    /* A body we did not read, or framing we could not trust: the
     * connection cannot carry another request. CONNECT too (evhttp
     * would keep a CONNECT connection open). */
    if (c->close_after || c->refuse == 501) {
        evhttp_add_header(oh, "Connection", "close");
        if (c->close_after)
            evhttp_request_set_on_complete_cb(r->req, on_complete_linger, r->http);
    }
    json_t *body = gps_error_body(c->dialect, c->refuse, c->code, c->msg, NULL,
                                  r->correlation_id, NULL);
    gps_http_send_json(r->req, c->refuse, body);
}

/* A path of the agents' protocol (docs/protocol.md) but enroll and check,
 * which take no agent key: what the agent's own requests use. */
static bool agent_path(const char *path)
{
    return strncmp(path, "/agents/", 8) == 0 && strcmp(path, "/agents/enroll") != 0 &&
           strcmp(path, "/agents/check") != 0;
}

/* r filled from the request: the request itself, its method and path. */
static void req_init(gps_req *r, gps_http *h, struct evhttp_request *req)
{
    memset(r, 0, sizeof *r);
    r->req = req;
    r->http = h;
    r->start_us = gp_now_mono_us();
    r->method = (unsigned)evhttp_request_get_command(req);
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    r->path = path && *path ? path : "/";
}

/* r's X-Pool-Via chain (with this pool's id) and correlation id (the
 * request's when well-formed, else a new one). */
static void req_ids(gps_req *r)
{
    gps_http *h = r->http;
    struct evhttp_request *req = r->req;
    /* The chain this pool passes on (the gate checked the header). */
    const char *via = evhttp_find_header(evhttp_request_get_input_headers(req), "X-Pool-Via");
    snprintf(r->pool_via, sizeof r->pool_via, "%s%s%s", via && *via ? via : "",
             via && *via ? ", " : "", h->pool_id);

    const char *corr = evhttp_find_header(evhttp_request_get_input_headers(req),
                                          "X-Correlation-Id");
    if (corr && corr_ok(corr))
        gp_copy_str(r->correlation_id, sizeof r->correlation_id, corr);
    else
        gps_id_hex(r->correlation_id, 16);
}

/* The headers every reply carries: the correlation id, nosniff and, in the
 * Anthropic dialect, request-id. */
static void add_reply_headers(gps_req *r, const gps_conn *c)
{
    struct evkeyvalq *oh = evhttp_request_get_output_headers(r->req);
    /* The agents' routes (their long-polls and uploads: a few per relayed
     * request) carry neither header: the agent reads no header of the
     * server's replies, its errors carry the id in the body, and nosniff
     * is for browsers. A header costs ~2,000 instructions (evhttp's list
     * and its printf of the reply head). */
    if (!agent_path(r->path)) {
        evhttp_add_header(oh, "X-Correlation-Id", r->correlation_id);
        evhttp_add_header(oh, "X-Content-Type-Options", "nosniff");
    }
    if ((c && c->refuse ? c->dialect : gps_dialect_for_path(r->path)) == GPS_DIALECT_ANTHROPIC) {
        /* The Anthropic SDKs surface `request-id` in errors and logs. */
        char rid[72];
        snprintf(rid, sizeof rid, "req_%s", r->correlation_id);
        evhttp_add_header(oh, "request-id", rid);
    }
}

/* The request's route (r->route and r->params set), or NULL when no route
 * takes it (404 or 405 sent). */
static const gps_route *find_route(gps_req *r)
{
    gps_http *h = r->http;
    const gps_route *route = NULL;
    int rc = gps_route_lookup(h->routes, h->nroutes, r->method, r->path, &route, r->params,
                              &r->nparams);
    if (rc != 0 && r->method == EVHTTP_REQ_HEAD) /* HEAD is GET without the body */
        rc = gps_route_lookup(h->routes, h->nroutes, EVHTTP_REQ_GET, r->path, &route, r->params,
                              &r->nparams);
    unsigned shown = r->method == EVHTTP_REQ_HEAD ? EVHTTP_REQ_GET : r->method; /* see decide() */
    if (rc == 404) {
        char msg[200];
        snprintf(msg, sizeof msg, "no route for %s %.120s", method_name(shown), r->path);
        gps_req_error(r, 404, "NOT_FOUND", msg, NULL);
        return NULL;
    }
    r->route = route;
    if (rc == 405) {
        char msg[200], allow[64];
        snprintf(msg, sizeof msg, "method %s is not allowed on %.120s", method_name(shown),
                 r->path);
        allow_methods(h, r->path, allow, sizeof allow);
        gps_req_add_header(r, "Allow", allow);
        gps_req_error(r, 405, "METHOD_NOT_ALLOWED", msg, NULL);
        return NULL;
    }
    return route;
}

/* r->key_id: the gate's, or the auth hook's when the gate did not check
 * the key; -1 when the hook refuses (401 or 403 sent). */
static int authorize(gps_req *r, const gps_conn *c, const gps_route *route)
{
    gps_http *h = r->http;
    struct evhttp_request *req = r->req;
    if (c && c->authed) {
        gp_copy_str(r->key_id, sizeof r->key_id, c->key_id);
    } else if (route->role != GPS_ROLE_NONE && h->auth) {
        struct evkeyvalq *ih = evhttp_request_get_input_headers(req);
        const char *cred = evhttp_find_header(ih, "Authorization");
        if (!cred && route->dialect == GPS_DIALECT_ANTHROPIC)
            cred = evhttp_find_header(ih, "x-api-key");
        if (cred && !cred[strspn(cred, " \t")])
            cred = NULL; /* blank: missing, not invalid */
        char *peer = NULL, client[256];
        ev_uint16_t pport = 0;
        struct evhttp_connection *evc = evhttp_request_get_connection(req);
        if (evc)
            evhttp_connection_get_peer(evc, &peer, &pport);
        client_addr(h, peer, evhttp_find_header(ih, "X-Forwarded-For"), client, sizeof client);
        int st = h->auth(h->auth_arg, cred, route->role, r->key_id, client);
        if (st != 0) {
            struct evkeyvalq *oh = evhttp_request_get_output_headers(req);
            if (st == 401 && route->dialect != GPS_DIALECT_NATIVE)
                evhttp_add_header(oh, "WWW-Authenticate", "Bearer");
            evhttp_add_header(oh, "x-should-retry", "false");
            if (st == 403)
                gps_req_error(r, 403, "FORBIDDEN", "this key's role may not use this endpoint",
                              NULL);
            else
                gps_req_error(r, 401, cred ? "INVALID_API_KEY" : "UNAUTHORIZED",
                              cred ? "invalid API key"
                                   : "missing API key (Authorization: Bearer <key>)",
                              NULL);
            return -1;
        }
    }
    return 0;
}

/* Whether the server cannot take the request now (503 sent): the admit
 * hook refuses a client's POST, or the server is shutting down. */
static bool refuse_unavailable(gps_req *r, const gps_route *route)
{
    gps_http *h = r->http;
    if (h->admit && route->role == GPS_ROLE_CLIENT && r->method == EVHTTP_REQ_POST) {
        char msg[300];
        int sec = h->admit(h->admit_arg, msg, sizeof msg);
        if (sec > 0) {
            gps_send_error_retry(r->req, route->dialect, 503, "SERVER_BUSY", msg, NULL,
                                 r->correlation_id, sec);
            return true;
        }
    }
    if (h->shutting_down && (route->role == GPS_ROLE_CLIENT || route->role == GPS_ROLE_ADMIN)) {
        gps_req_add_header(r, "Retry-After", "1");
        gps_req_add_header(r, "Connection", "close");
        gps_req_error(r, 503, "SHUTTING_DOWN", "the server is shutting down", NULL);
        return true;
    }
    return false;
}

static void dispatch(struct evhttp_request *req, void *arg)
{
    gps_http *h = arg;
    gps_req r;
    req_init(&r, h, req);

    /* The gate decided on the head; take its decision and end it. */
    gps_conn gc;
    gps_conn *c = conn_of(h, evhttp_request_get_connection(req));
    if (c) {
        gc = *c;
        conn_detach(c);
        c = &gc;
    }
    evhttp_request_set_on_complete_cb(req, on_complete, h);
    req_ids(&r);
    add_reply_headers(&r, c);
    if (c && c->refuse) {
        send_refusal(&r, c);
        return;
    }

    const gps_route *route = find_route(&r);
    if (!route)
        return;

    /* Without a gate (never expected) the old checks still hold. */
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    if (in && evbuffer_get_length(in) > h->opts.max_body_bytes) {
        char msg[128];
        snprintf(msg, sizeof msg, "request body exceeds %zu bytes", h->opts.max_body_bytes);
        gps_req_error(&r, 413, "BODY_TOO_LARGE", msg, NULL);
        return;
    }
    if (authorize(&r, c, route) != 0)
        return;
    if (refuse_unavailable(&r, route))
        return;
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
    /* Every connection through the request gate (the HTTPS evhttp
     * replaces this with tls_bevcb, which does the same). */
    evhttp_set_bevcb(evh, plain_bevcb, h);
}

gps_http *gps_http_new(struct event_base *base, const gps_http_opts *opts)
{
    gps_http *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->base = base;
    h->opts = *opts;
    gp_random_hex(h->pool_id, 8);
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
    for (int i = 0; i < 2; i++)
        if (h->pause[i].resume)
            event_free(h->pause[i].resume);
    for (size_t i = 0; i < sizeof pause_owners / sizeof pause_owners[0]; i++)
        if (pause_owners[i] == h)
            pause_owners[i] = NULL;
    if (h->evh)
        evhttp_free(h->evh);
    if (h->evh_tls)
        evhttp_free(h->evh_tls);
    /* Gates of connections accepted in the last loop pass (not attached
     * yet; evhttp_free freed the others through their close callbacks). */
    while (h->conns_all)
        conn_free(h->conns_all);
    while (h->lingers)
        linger_free(h->lingers);
    free(h->conn_by_fd);
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

int gps_http_add_routes(gps_http *h, const gps_route *table, size_t n, void *arg)
{
    for (size_t i = 0; i < n; i++)
        if (gps_http_add_route(h, table[i].methods, table[i].pattern, table[i].dialect,
                               table[i].role, table[i].fn, arg) < 0)
            return -1;
    return 0;
}

void gps_http_set_auth(gps_http *h, gps_auth_fn fn, void *arg)
{
    h->auth = fn;
    h->auth_arg = arg;
}

void gps_http_set_admit(gps_http *h, gps_admit_fn fn, void *arg)
{
    h->admit = fn;
    h->admit_arg = arg;
}

void gps_http_set_home_check(gps_http *h, bool (*fn)(void *arg), void *arg)
{
    h->home = fn;
    h->home_arg = arg;
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

/* ------------------------------------------------------------------ */
/* Out of descriptors: pause accepting                                 */
/* ------------------------------------------------------------------ */

/* libevent retries a failed accept() at once while the listening socket
 * stays readable: with EMFILE/ENFILE that is a busy loop (issue 9, finding
 * 6: 76 % CPU, 2.95 M log lines in 7 s, /health unanswered). The listener
 * pauses for ACCEPT_PAUSE_MS instead (the kernel keeps new connections in
 * the backlog meanwhile) and the log says so at most once per
 * ACCEPT_LOG_MS, with the count of pauses it did not log. */
#define ACCEPT_PAUSE_MS 100
#define ACCEPT_LOG_MS 10000

static void accept_resume(evutil_socket_t fd, short what, void *arg)
{
    accept_pause *p = arg;
    if (p->lev)
        evconnlistener_enable(p->lev);
}

/* Our listeners' user data is the evhttp (evhttp_bind_socket sets it): find
 * the pause record by listener among the gps_https that asked for it. */
static accept_pause *pause_of(struct evconnlistener *lev, void *evh);

static void accept_error(struct evconnlistener *lev, void *evh)
{
    int e = EVUTIL_SOCKET_ERROR();
    accept_pause *p = pause_of(lev, evh);
    if (!p)
        return;
    evconnlistener_disable(lev);
    struct timeval tv = {0, ACCEPT_PAUSE_MS * 1000};
    event_add(p->resume, &tv);
    uint64_t now = gp_now_mono_ms();
    if (p->last_log_ms && now - p->last_log_ms < ACCEPT_LOG_MS) {
        p->suppressed++;
        return;
    }
    gp_log_write(GP_LOG_WARN, "accept_failed", NULL,
                 json_pack("{s:s,s:i,s:k}", "error", strerror(e), "pause_ms", ACCEPT_PAUSE_MS,
                           "suppressed", p->suppressed),
                 "accept failed (%s): not accepting for %d ms; %lu more such pauses since the "
                 "last line",
                 strerror(e), ACCEPT_PAUSE_MS, p->suppressed);
    p->last_log_ms = now;
    p->suppressed = 0;
}

static accept_pause *pause_of(struct evconnlistener *lev, void *evh)
{
    for (size_t i = 0; i < sizeof pause_owners / sizeof pause_owners[0]; i++) {
        gps_http *h = pause_owners[i];
        for (int k = 0; h && k < 2; k++)
            if (h->pause[k].lev == lev)
                return &h->pause[k];
    }
    (void)evh;
    return NULL;
}

static void pause_setup(gps_http *h, int k, struct evhttp_bound_socket *b)
{
    accept_pause *p = &h->pause[k];
    p->h = h;
    p->lev = evhttp_bound_socket_get_listener(b);
    if (!p->resume)
        p->resume = evtimer_new(h->base, accept_resume, p);
    if (!p->lev || !p->resume)
        return;
    size_t i = 0;
    while (i < sizeof pause_owners / sizeof pause_owners[0] && pause_owners[i] &&
           pause_owners[i] != h)
        i++;
    if (i == sizeof pause_owners / sizeof pause_owners[0])
        return; /* more servers than any process of ours runs: default handling */
    pause_owners[i] = h;
    evconnlistener_set_error_cb(p->lev, accept_error);
}

static void pause_forget(gps_http *h, int k)
{
    h->pause[k].lev = NULL;
    if (h->pause[k].resume)
        event_del(h->pause[k].resume);
}

static void set_nodelay(evutil_socket_t fd)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
        gp_log_warn("tcp_nodelay", "cannot set TCP_NODELAY on the listener: %s",
                    strerror(errno));
}

int gps_http_bind(gps_http *h, const char *host, int port, int *bound_port, char *err,
                  size_t errlen)
{
    h->bound = evhttp_bind_socket_with_handle(h->evh, host, (ev_uint16_t)port);
    if (!h->bound) {
        snprintf(err, errlen, "cannot listen on %s:%d", host, port);
        return -1;
    }
    pause_setup(h, 0, h->bound);
    /* A stream is many small writes (one SSE event each); with Nagle on,
     * each write after the first waits for the peer's delayed ACK (~40 ms)
     * whenever one is unacknowledged: a 64-token reply took 44 ms instead
     * of 4. Accepted sockets inherit TCP_NODELAY from the listener. */
    set_nodelay(evhttp_bound_socket_get_fd(h->bound));
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
    return gate_bev(h, bev, true);
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
    pause_setup(h, 1, h->bound_tls);
    /* TLS sends a reply as several records (one per write of the
     * bufferevent), i.e. several small segments: with Nagle on, the second
     * waits for the client's delayed ACK (~40 ms per request). Accepted
     * sockets inherit TCP_NODELAY from the listener on Linux. */
    set_nodelay(evhttp_bound_socket_get_fd(h->bound_tls));
    return bound_port_of(h->bound_tls, port, bound_port, err, errlen);
}

void gps_http_stop_accepting(gps_http *h)
{
    if (h->bound) {
        pause_forget(h, 0);
        evhttp_del_accept_socket(h->evh, h->bound);
        h->bound = NULL;
    }
    if (h->bound_tls) {
        pause_forget(h, 1);
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
