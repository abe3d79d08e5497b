/*
 * http_priv.h: what the files of the http module share (http.c lists
 * them). Private to those files: the rest of the server sees http.h only.
 */
#ifndef GPS_HTTP_PRIV_H
#define GPS_HTTP_PRIV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <event2/listener.h>

#include "server/http/http.h"
#include "server/http/tls.h"

#define MAX_ROUTES 64
/* Connections accepted without memory for their gate, closed on the next
 * loop pass (http_conn.c http_orphans_cb). */
#define GPS_HTTP_ORPHANS 64

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
    struct event *orphan_ev;    /* closes the orphans (made with h: none needed then) */
    /* Memory low (evmem.h): mem_ev is activated when libevent's reserve
     * is spent and pauses accepting; mem_retry then tries to get the
     * reserve back every MEM_RETRY_MS and resumes (it stays in the timer
     * heap meanwhile, with a long period). Made with h. */
    struct event *mem_ev, *mem_retry;
    bool mem_paused;
    struct bufferevent *orphans[GPS_HTTP_ORPHANS]; /* referenced, not gated yet */
    size_t norphans;
};
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
    bool lost;                         /* out of memory: closing (gate_lost) */
    /* What dispatch must know. */
    int refuse;                             /* HTTP status, 0 = accepted */
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

/* Memory low (http.c): whether a connection accepted now must be closed,
 * libevent's reserve spent and still not to be had. */
bool http_mem_refuse(gps_http *h);

/* routes, dispatch (http.c) */
bool http_pattern_match(const char *pat, const char *path, char params[][GPS_ROUTE_PARAM_MAX],
                        int *nparams);

/* head parsing and helpers (http_head.c) */
bool http_corr_ok(const char *s);
const char *http_method_name(unsigned m);
void http_allow_methods(gps_http *h, const char *path, char *allow, size_t cap);

/* the gate (http_gate.c) */
void http_deadline_cb(evutil_socket_t fd, short what, void *arg);
void http_hs_deadline_cb(evutil_socket_t fd, short what, void *arg);
void http_inflight_release(gps_conn *c);
size_t http_unauth_cap(const gps_http *h);
bool http_inflight_fits(const gps_conn *c, uint64_t n);
int http_input_append(struct evbuffer *in, struct evbuffer *src, const void *data, size_t n);
void http_refuse(gps_conn *c, int status, const char *code, gps_dialect d, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void http_gate_run(gps_conn *c);
void http_input_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg);

/* the decision on a head (http_admit.c) */
void http_client_addr(const gps_http *h, const char *peer, const char *xff, char *out,
                      size_t outlen);
size_t http_body_cap(const gps_conn *c);
bool http_decide(gps_conn *c, const gps_head *hd);

/* a gate and its connection (http_conn.c) */
gps_conn *http_conn_of(gps_http *h, struct evhttp_connection *evcon);
void http_conn_free(gps_conn *c);
struct bufferevent *http_gate_bev(gps_http *h, struct bufferevent *bev, bool tls);
struct bufferevent *http_plain_bevcb(struct event_base *base, void *arg);
void http_on_complete(struct evhttp_request *req, void *arg);
void http_linger_free(lingerer *l);
void http_on_complete_linger(struct evhttp_request *req, void *arg);
void http_conn_detach(gps_conn *c);
void http_orphans_cb(evutil_socket_t fd, short what, void *arg);
void http_orphans_free(gps_http *h);

#endif
