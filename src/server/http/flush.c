/* flush: one write a connection at the end of each loop turn (flush.h). */
#include "server/http/flush.h"

#include <stdbool.h>
#include <stdlib.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>

struct gps_flush {
    struct event_base *base;
    struct event *ev;          /* made active when the first mark of a turn comes */
    struct bufferevent **marked; /* each with a reference taken */
    size_t n, cap;
    bool armed;
};

/* Process-wide, to find the flusher of a connection's base (a server has
 * one; tests may make several). Loop thread only. */
static gps_flush *flushers[8];

static gps_flush *flusher_of(struct event_base *base)
{
    for (size_t i = 0; i < sizeof flushers / sizeof flushers[0]; i++)
        if (flushers[i] && flushers[i]->base == base)
            return flushers[i];
    return NULL;
}

/* Write bev's output; when all of it went, do what the write event's
 * handler does on finding the output empty: the event off (evhttp turns
 * it on again for its next write, and off itself when it goes back to
 * reading) and the write callback (evhttp's: the reply's completion,
 * which may free the connection; the caller's reference keeps bev). A
 * freed connection's bufferevent has no callbacks left: skipped. */
static void write_out(struct bufferevent *bev, int trigger_options)
{
    bufferevent_data_cb wcb = NULL;
    bufferevent_getcb(bev, NULL, &wcb, NULL, NULL);
    evutil_socket_t fd = bufferevent_getfd(bev);
    struct evbuffer *out = bufferevent_get_output(bev);
    if (!wcb || fd < 0 || evbuffer_get_length(out) == 0)
        return;
    (void)evbuffer_write(out, fd);
    if (evbuffer_get_length(out) != 0)
        return; /* full, or an error: the write event sends the rest or reports it */
    bufferevent_disable(bev, EV_WRITE);
    bufferevent_trigger(bev, EV_WRITE, trigger_options);
}

static void flush_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gps_flush *f = arg;
    f->armed = false;
    /* Marks made by the callbacks below (a kept-alive connection's next
     * request answered at once) go in a fresh list and a later pass. */
    struct bufferevent **v = f->marked;
    size_t n = f->n;
    f->marked = NULL;
    f->n = f->cap = 0;
    for (size_t i = 0; i < n; i++) {
        write_out(v[i], 0);
        bufferevent_decref(v[i]);
    }
    free(v);
}

gps_flush *gps_flush_new(struct event_base *base)
{
    size_t slot = 0;
    while (slot < sizeof flushers / sizeof flushers[0] && flushers[slot])
        slot++;
    if (slot == sizeof flushers / sizeof flushers[0])
        return NULL; /* the caller writes at once */
    gps_flush *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->base = base;
    f->ev = event_new(base, -1, 0, flush_cb, f);
    if (!f->ev) {
        free(f);
        return NULL;
    }
    flushers[slot] = f;
    return f;
}

void gps_flush_free(gps_flush *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < sizeof flushers / sizeof flushers[0]; i++)
        if (flushers[i] == f)
            flushers[i] = NULL;
    /* The loop has stopped: write what is marked, run no callback (a
     * deferred one would never run and keep its bufferevent). */
    for (size_t i = 0; i < f->n; i++) {
        struct bufferevent *bev = f->marked[i];
        bufferevent_data_cb wcb = NULL;
        bufferevent_getcb(bev, NULL, &wcb, NULL, NULL);
        if (wcb && bufferevent_getfd(bev) >= 0)
            (void)evbuffer_write(bufferevent_get_output(bev), bufferevent_getfd(bev));
        bufferevent_decref(bev);
    }
    free(f->marked);
    event_free(f->ev);
    free(f);
}

static bool mark(gps_flush *f, struct bufferevent *bev)
{
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 64;
        struct bufferevent **v = realloc(f->marked, cap * sizeof *v);
        if (!v)
            return false;
        f->marked = v;
        f->cap = cap;
    }
    bufferevent_incref(bev);
    f->marked[f->n++] = bev;
    if (!f->armed) {
        f->armed = true;
        event_active(f->ev, EV_TIMEOUT, 0);
    }
    return true;
}

void gps_flush_conn(struct evhttp_connection *evcon)
{
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    if (!bev || bufferevent_openssl_get_ssl(bev) ||
        evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        return;
    gps_flush *f = flusher_of(evhttp_connection_get_base(evcon));
    if (f && mark(f, bev))
        return;
    /* No flusher (or no memory for the mark): now, its callback deferred
     * to later in this turn (the caller may still hold the request). */
    write_out(bev, BEV_TRIG_DEFER_CALLBACKS);
}
