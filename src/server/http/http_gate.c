/*
 * http_gate.c: the gate of one connection. evhttp reads only bytes the gate
 * has vetted: a request head parsed by gps_http_head_parse and decided on
 * (http_admit.c), then its body (Content-Length or chunked) within the
 * deadlines and the in-flight byte budget; a refusal answers in the
 * request's dialect.
 */
#include "server/http/http_priv.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/util.h>
#include <openssl/ssl.h>
#include "common/gp_log.h"
#include "common/gp_util.h"

/* ------------------------------------------------------------------ */
/* The gate                                                            */
/* ------------------------------------------------------------------ */

void http_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    gps_conn *c = arg;
    if (c->lost) {
        gp_log_error("request_out_of_memory",
                     "closing a connection whose request could not be held (out of memory)");
        evhttp_connection_free(c->evcon);
        return;
    }
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
void http_hs_deadline_cb(evutil_socket_t fd, short what, void *arg)
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

void http_inflight_release(gps_conn *c)
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

size_t http_unauth_cap(const gps_http *h)
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

bool http_inflight_fits(const gps_conn *c, uint64_t n)
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
    return peer_unauth(c) + n <= GPS_HTTP_PEER_UNAUTH_BODIES * http_unauth_cap(h);
}

static bool inflight_charge(gps_conn *c, size_t n)
{
    if (!http_inflight_fits(c, n))
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
int http_input_append(struct evbuffer *in, struct evbuffer *src, const void *data, size_t n)
{
    int rc = src ? evbuffer_add_buffer(in, src) : evbuffer_add(in, data, n);
    if (rc == 0)
        return 0;
    evbuffer_unfreeze(in, 0);
    rc = src ? evbuffer_add_buffer(in, src) : evbuffer_add(in, data, n);
    evbuffer_freeze(in, 0);
    return rc;
}

/* Out of memory while the request was passed on: evhttp cannot get it
 * whole, and nothing it has can be answered, so the connection is closed
 * on the next loop pass (the deadline's event, activated: it needs no
 * memory and runs outside evhttp's callbacks). It used to be left to the
 * deadline, or with none set (a request handed over empty) to evhttp's
 * idle timeout: a connection that neither answered nor closed. */
static void gate_lost(gps_conn *c)
{
    c->st = G_DISCARD;
    c->lost = true;
    evbuffer_drain(c->raw, evbuffer_get_length(c->raw));
    evbuffer_drain(c->held, evbuffer_get_length(c->held));
    event_active(c->deadline, EV_TIMEOUT, 0);
}

/* The gate's output for the current request is held until the request is
 * whole (or refused): evhttp never sees a partial body, so a refusal in
 * the middle of one is a plain stand-in request (below). false: out of
 * memory (gate_lost). */
static bool release(gps_conn *c, const void *data, size_t n)
{
    if (evbuffer_add(c->held, data, n) == 0)
        return true;
    gate_lost(c);
    return false;
}

static bool release_raw(gps_conn *c, size_t n)
{
    if (evbuffer_remove_buffer(c->raw, c->held, n) == (int)n)
        return true;
    gate_lost(c);
    return false;
}

/* The request is whole: hand it to evhttp. false: out of memory
 * (gate_lost). */
static bool flush_held(gps_conn *c)
{
    size_t n = evbuffer_get_length(c->held);
    if (http_input_append(bufferevent_get_input(c->bev), c->held, NULL, 0) < 0) {
        gate_lost(c);
        return false;
    }
    c->vetted += n;
    return true;
}

/* Refuse the current request. At the head: evhttp gets a bodiless
 * stand-in that dispatch answers with the refusal. Inside a chunked body:
 * evhttp gets the last chunk, and dispatch answers the same way. */
void http_refuse(gps_conn *c, int status, const char *code, gps_dialect d, const char *fmt, ...)
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
    if (!release(c, stand_in, (size_t)n) || !flush_held(c))
        return;
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
    http_refuse(c, 503, "SERVER_BUSY", c->dialect,
                "too many request bodies are being received; retry shortly");
    refuse_in_body(c);
}

/* The dialect of the request whose head is at the front of raw, from its
 * target alone: for a refusal before the head could be parsed. */
static gps_dialect raw_dialect(gps_conn *c)
{
    char line[256];
    ev_ssize_t n = evbuffer_copyout(c->raw, line, sizeof line - 1);
    if (n <= 0)
        return GPS_DIALECT_NATIVE;
    line[n] = '\0';
    char *t = strchr(line, ' ');
    if (!t || t[1] != '/')
        return GPS_DIALECT_NATIVE;
    t++;
    t[strcspn(t, " ?\r\n")] = '\0';
    return gps_dialect_for_path(t);
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
        /* The pool's own failure: 500 INTERNAL in the route's dialect, as
         * every other out-of-memory reply of the server (it was a 503
         * OUT_OF_MEMORY, a code no document lists). */
        gps_dialect d = raw_dialect(c);
        memset(&c->refuse, 0, sizeof *c - offsetof(gps_conn, refuse));
        http_refuse(c, 500, "INTERNAL", d, "out of memory");
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
        http_refuse(c, st,
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
    if (!http_decide(c, hd)) {
        finish_refused_head(c, hd, body);
        goto done;
    }
    gp_copy_str(c->corr, sizeof c->corr, hd->corr);
    if (!release(c, hd->canon, hd->canon_len))
        goto done;
    if (hd->chunked) {
        c->st = G_CHUNK_SIZE;
        c->body_total = 0;
    } else if (hd->content_length > 0) {
        c->st = G_BODY;
        c->left = (uint64_t)hd->content_length;
    } else {
        c->st = G_DONE;
        if (!flush_held(c))
            goto done;
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
            http_refuse(c, 400, "INVALID_REQUEST", c->dialect, "chunk-size line too long");
            refuse_in_body(c);
            return true;
        }
        return false;
    }
    size_t ll = (size_t)e.pos + 1;
    char line[1040];
    if (ll >= sizeof line) {
        http_refuse(c, 400, "INVALID_REQUEST", c->dialect, "chunk-size line too long");
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
        http_refuse(c, 400, "INVALID_REQUEST", c->dialect, "invalid chunk size");
        refuse_in_body(c);
        return true;
    }
    if (size == 0) {
        c->st = G_TRAILER;
        return true;
    }
    size_t cap = http_body_cap(c);
    if (c->body_total + size > cap) {
        http_refuse(c, 413, "BODY_TOO_LARGE", c->dialect, "request body exceeds %zu bytes%s", cap,
                    c->unauth ? " (a request without credentials)" : "");
        refuse_in_body(c);
        return true;
    }
    if (!http_inflight_fits(c, size)) {
        refuse_busy(c);
        return true;
    }
    c->body_total += size;
    char out[32];
    int n = snprintf(out, sizeof out, "%llx\r\n", (unsigned long long)size);
    if (!release(c, out, (size_t)n))
        return true;
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
                http_refuse(c, 400, "INVALID_REQUEST", c->dialect, "chunked trailer too large");
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
            c->st = G_DONE;
            if (release(c, "0\r\n\r\n", 5) && flush_held(c))
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

/* Pass up to len of the `left` body bytes (Content-Length or a chunk's
 * data) to evhttp, charged to the in-flight budget. false: refused, too
 * many bodies in flight (refuse_busy). */
static bool pass_body_bytes(gps_conn *c, size_t len)
{
    size_t n = len < c->left ? len : (size_t)c->left;
    if (!inflight_charge(c, n)) {
        refuse_busy(c);
        return false;
    }
    if (!release_raw(c, n))
        return false;
    c->left -= n;
    return true;
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
                    http_refuse(c, 431, "HEAD_TOO_LARGE", GPS_DIALECT_NATIVE,
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
        case G_BODY:
            if (len == 0)
                return;
            if (pass_body_bytes(c, len) && c->left == 0 && c->st == G_BODY) {
                c->st = G_DONE;
                if (flush_held(c))
                    deadline_set(c, 0);
            }
            continue;
        case G_CHUNK_SIZE:
            if (len == 0 || !gate_chunk_size(c))
                return;
            continue;
        case G_CHUNK_DATA:
            if (len == 0)
                return;
            if (pass_body_bytes(c, len) && c->left == 0 && c->st == G_CHUNK_DATA)
                c->st = G_CHUNK_CRLF;
            continue;
        case G_CHUNK_CRLF: {
            if (len < 2)
                return;
            char two[2];
            evbuffer_remove(c->raw, two, 2);
            if (two[0] != '\r' || two[1] != '\n') {
                http_refuse(c, 400, "INVALID_REQUEST", c->dialect,
                            "chunk data not followed by CRLF");
                refuse_in_body(c);
                continue;
            }
            if (release(c, "\r\n", 2))
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
void http_gate_run(gps_conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t len = evbuffer_get_length(in);
    c->busy = true;
    if (len > c->vetted) {
        struct evbuffer *keep = evbuffer_new();
        if (keep) {
            evbuffer_remove_buffer(in, keep, c->vetted);
            evbuffer_add_buffer(c->raw, in);
            http_input_append(in, keep, NULL, 0);
            evbuffer_free(keep);
        } else {
            /* ENOMEM: these bytes cannot be vetted, and the peer does not
             * send them again. */
            evbuffer_drain(in, len - c->vetted);
            gate_lost(c);
        }
    }
    gate_step(c);
    c->busy = false;
}

void http_input_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
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
    http_gate_run(c);
}
