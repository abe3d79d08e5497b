/* held: one helper for every request the server holds (see held.h). */
#include "server/http/held.h"

#include <stdio.h>

#include <event2/http.h>

#include "server/http/sse.h"

/* evhttp runs this when the connection closes (the peer went away, the
 * watch saw EOF, a write failed, a timeout). */
static void held_closed(struct evhttp_connection *evcon, void *arg)
{
    (void)evcon;
    gps_held *h = arg;
    gps_conn_watch_free(h->watch); /* may be the watch that got us here: it expects this */
    h->watch = NULL;
    h->evcon = NULL; /* closing: its callbacks are not ours to clear */
    gps_http_drop_request(h->req);
    h->req = NULL;
    if (h->gone)
        h->gone(h->arg); /* may free the owner, h with it: last use */
}

bool gps_held_start(gps_held *h, struct evhttp_request *req, bool watch, int timeout_sec,
                    gps_held_gone_fn gone, void *arg)
{
    h->req = req;
    h->gone = gone;
    h->arg = arg;
    h->watch = NULL;
    h->evcon = evhttp_request_get_connection(req);
    if (!h->evcon)
        return false;
    evhttp_connection_set_closecb(h->evcon, held_closed, h);
    if (timeout_sec > 0)
        evhttp_connection_set_timeout(h->evcon, timeout_sec);
    if (watch)
        h->watch = gps_http_watch_close(req);
    return true;
}

void gps_held_release(gps_held *h)
{
    gps_conn_watch_free(h->watch);
    h->watch = NULL;
    if (h->evcon)
        evhttp_connection_set_closecb(h->evcon, NULL, NULL);
    h->evcon = NULL;
}

void gps_held_drop(gps_held *h)
{
    if (h->evcon)
        gps_sse_pace_drop(h->evcon);
}

void gps_db_wait_start(gps_db_wait *w, gps_req *r)
{
    w->dialect = r->route ? r->route->dialect : GPS_DIALECT_NATIVE;
    snprintf(w->corr, sizeof w->corr, "%s", r->correlation_id);
    gps_held_start(&w->held, r->req, false, 0, NULL, NULL);
}

bool gps_db_wait_take(gps_db_wait *w)
{
    if (!w->held.req)
        return false;
    gps_held_release(&w->held);
    return true;
}

void gps_db_wait_error(gps_db_wait *w, int status, const char *code, const char *message)
{
    gps_http_send_error(w->held.req, w->dialect, status, code, message, NULL, w->corr, NULL);
}
