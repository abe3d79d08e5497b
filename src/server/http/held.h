/*
 * held: a request the server holds before answering it (a queued or
 * streaming job, a parked agent long-poll, a reply waiting for the DB
 * thread). One helper for every such site: it hooks the connection's close
 * callback, optionally watches the socket so a peer that goes away while
 * nothing is being written is noticed at once (http.h, gps_conn_watch),
 * and raises the connection timeout for the wait.
 *
 * When the connection closes while held: the watch is freed, the request
 * is dropped (gps_http_drop_request), h->req becomes NULL, then gone(arg)
 * runs (the owner cancels its job, frees itself, ...). Before the final
 * reply, and when the owner is freed while still held, call
 * gps_held_release: a keep-alive connection outlives the request, so its
 * close callback must not point at the owner any more.
 *
 * The gps_held lives inside its owner (its address is the callback's
 * argument): the owner must not move while held.
 */
#ifndef GPS_HELD_H
#define GPS_HELD_H

#include <stdbool.h>

#include "server/http/http.h"

struct evhttp_request;
struct evhttp_connection;

typedef void (*gps_held_gone_fn)(void *arg);

typedef struct gps_held {
    struct evhttp_request *req;       /* NULL once the client went away */
    struct evhttp_connection *evcon;  /* non-NULL while held */
    gps_conn_watch *watch;
    gps_held_gone_fn gone;            /* may be NULL */
    void *arg;
} gps_held;

/* Hold req (h zeroed or released before). watch: also watch the socket for
 * the peer closing. timeout_sec > 0: the connection's timeout for the wait
 * (not idle_timeout). False when req has no connection (nothing is held;
 * h->req is still set). */
bool gps_held_start(gps_held *h, struct evhttp_request *req, bool watch, int timeout_sec,
                    gps_held_gone_fn gone, void *arg);
/* Stop holding: free the watch and forget the close callback. h->req stays
 * (the caller answers it). Idempotent. */
void gps_held_release(gps_held *h);
/* Close the connection of a client too slow to read now: the close runs
 * as when the client goes away (gone runs inside this call). No-op when
 * not held. */
void gps_held_drop(gps_held *h);

/* A reply that waits for the DB thread (GET of stored rows and the like):
 * no socket watch, no timeout change, nothing to cancel; the callback takes
 * the request back and answers it, or finds the client gone. */
typedef struct gps_db_wait {
    gps_held held;                    /* held.req: NULL once the client left */
    gps_dialect dialect;              /* of the error body */
    char corr[65];
} gps_db_wait;

void gps_db_wait_start(gps_db_wait *w, gps_req *r);
/* Stop holding; true when the client is still there to answer. */
bool gps_db_wait_take(gps_db_wait *w);
/* After a true gps_db_wait_take: an error in the request's dialect. */
void gps_db_wait_error(gps_db_wait *w, int status, const char *code, const char *message);

#endif
