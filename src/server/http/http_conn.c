/*
 * http_conn.c: a gate's life beside its evhttp connection: the gate table
 * by socket, the bufferevents evhttp is given, attach on the first loop
 * pass, completion, and refused connections drained before they close.
 */
#include "server/http/http_priv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/util.h>

static void conn_closed(struct evhttp_connection *evcon, void *arg)
{
    http_conn_free(arg);
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

gps_conn *http_conn_of(gps_http *h, struct evhttp_connection *evcon)
{
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    int fd = bev ? (int)bufferevent_getfd(bev) : -1;
    if (fd < 0 || (size_t)fd >= h->nconn_by_fd)
        return NULL;
    gps_conn *c = h->conn_by_fd[fd];
    return c && c->bev == bev ? c : NULL;
}

void http_conn_free(gps_conn *c)
{
    if (!c)
        return;
    gps_http *h = c->h;
    http_inflight_release(c);
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
    c->deadline = evtimer_new(h->base, http_deadline_cb, c);
    c->cbe = evbuffer_add_cb(bufferevent_get_input(bev), http_input_cb, c);
    c->next = h->conns_all;
    if (c->next)
        c->next->prev = c;
    h->conns_all = c;
    if (!c->raw || !c->held || !c->deadline || !c->cbe) {
        http_conn_free(c);
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
        http_conn_free(c); /* the caller closes the connection */
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
    http_gate_run(c);
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
        http_conn_free(c);
        return;
    }
    if (!conn_attach(c, cbarg))
        evhttp_connection_free(cbarg); /* a loop callback: safe here */
}

/* Connections that got no gate are closed on the next loop pass, once
 * evhttp has set them up (as init_cb, whose event could not be made): an
 * ungated connection must never reach evhttp's parser. They used to be
 * starved instead (reads capped at one byte), waiting for evhttp's idle
 * timeout; but libevent 2.1 re-runs the read callback of a bufferevent at
 * its high watermark (bufferevent_inbuf_wm_check) while evhttp waits for a
 * whole line, so the loop spun, and with reading suspended the idle
 * timeout never came. h->orphan_ev is made with h: closing needs no
 * memory. */
void http_orphans_cb(evutil_socket_t fd, short what, void *arg)
{
    gps_http *h = arg;
    while (h->norphans) {
        struct bufferevent *bev = h->orphans[--h->norphans];
        void *evcon = NULL;
        bufferevent_getcb(bev, NULL, NULL, NULL, &evcon);
        if (evcon)
            evhttp_connection_free(evcon); /* a loop callback: safe here */
        bufferevent_decref(bev);           /* (evhttp freed it when it failed) */
    }
}

/* At gps_http_free, after evhttp_free closed the connections. */
void http_orphans_free(gps_http *h)
{
    while (h->norphans)
        bufferevent_decref(h->orphans[--h->norphans]);
}

/* A connection without a gate: closed on the next pass. When GPS_HTTP_ORPHANS
 * connections in one pass already wait (memory short for every accept), it
 * is starved instead: at most one byte read, and a low watermark no input
 * reaches, so that evhttp's read callback never runs on it (no spin); it
 * stays open until its peer gives up. */
static struct bufferevent *orphan(gps_http *h, struct bufferevent *bev)
{
    if (h->orphan_ev && h->norphans < GPS_HTTP_ORPHANS) {
        bufferevent_incref(bev);
        h->orphans[h->norphans++] = bev;
        event_active(h->orphan_ev, EV_TIMEOUT, 0);
        return bev;
    }
    bufferevent_setwatermark(bev, EV_READ, (size_t)-1, 1);
    return bev;
}

/* Every accepted connection's bufferevent goes through here; one without
 * memory for its gate is closed (orphan), and so is one accepted while
 * libevent's reserve is spent (the listeners pause on the next loop pass:
 * http.c, "Memory low"). */
struct bufferevent *http_gate_bev(gps_http *h, struct bufferevent *bev, bool tls)
{
    if (!bev)
        return NULL;
    if (http_mem_refuse(h))
        return orphan(h, bev);
    gps_conn *c = conn_new(h, bev);
    if (c && tls && h->opts.header_timeout_sec > 0) {
        struct timeval tv = {h->opts.header_timeout_sec, 0};
        c->hs_deadline = evtimer_new(h->base, http_hs_deadline_cb, c);
        if (!c->hs_deadline || event_add(c->hs_deadline, &tv) < 0) {
            http_conn_free(c);
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
        http_conn_free(c);
    }
    return orphan(h, bev);
}

struct bufferevent *http_plain_bevcb(struct event_base *base, void *arg)
{
    return http_gate_bev(arg, bufferevent_socket_new(base, -1, 0), false);
}

/* A request was answered completely: the next one on the connection goes
 * through a new gate (the old one ended at dispatch, when the handler took
 * the connection's close callback over). */
void http_on_complete(struct evhttp_request *req, void *arg)
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

void http_linger_free(lingerer *l)
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
        http_linger_free(l);
        return;
    }
    char buf[16384];
    for (int i = 0; i < 64; i++) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        if (n <= 0 || (l->drained += (size_t)n) > LINGER_BYTES) {
            http_linger_free(l);
            return;
        }
    }
}

void http_on_complete_linger(struct evhttp_request *req, void *arg)
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
            http_linger_free(l);
        else
            close(dfd);
    }
}

/* Dispatch takes the gate's decision and ends the gate: the handler may
 * set the connection's close callback, so the gate must not need it. */
void http_conn_detach(gps_conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    evhttp_connection_set_closecb(c->evcon, NULL, NULL);
    evbuffer_remove_cb_entry(in, c->cbe);
    c->cbe = NULL;
    if (c->st != G_DISCARD)
        http_input_append(in, c->raw, NULL, 0); /* pipelined: the next gate reads it */
    /* Until the reply is done nobody reads the input: bound it. */
    bufferevent_setwatermark(c->bev, EV_READ, 0, c->h->opts.max_header_bytes);
    http_conn_free(c);
}

size_t gps_http_inflight_bytes(const gps_http *h)
{
    return h->inflight;
}
