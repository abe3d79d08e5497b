/* flush: one write a connection at the end of each loop turn (flush.h). */
#include "server/http/flush.h"

#include <stdbool.h>
#include <stdlib.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>

typedef struct {
    struct bufferevent *bev; /* compared, never used, until alive() says it is live */
    evutil_socket_t fd;
} mark_t;

struct gps_flush {
    struct event_base *base;
    gps_flush_alive_fn alive;
    void *alive_arg;
    struct event *ev; /* made active when the first mark of a turn comes */
    mark_t *marked;
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
 * which may free the connection). No reference to bev is held across the
 * turn: a bufferevent kept past its connection's end would take its
 * events out of epoll after evhttp closed the descriptor, which by then
 * may be a new connection's. */
static void write_out(gps_flush *f, const mark_t *m, bool complete)
{
    if (!f->alive(f->alive_arg, m->fd, m->bev))
        return; /* the connection ended since */
    struct evbuffer *out = bufferevent_get_output(m->bev);
    if (evbuffer_get_length(out) == 0)
        return; /* written already (marked twice, or by its write event) */
    (void)evbuffer_write(out, m->fd);
    if (evbuffer_get_length(out) != 0 || !complete)
        return; /* full, or an error: the write event sends the rest or reports it */
    bufferevent_disable(m->bev, EV_WRITE);
    bufferevent_trigger(m->bev, EV_WRITE, 0);
}

static void flush_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gps_flush *f = arg;
    f->armed = false;
    /* Marks made by the callbacks below (a kept-alive connection's next
     * request answered at once) go in a fresh list and a later pass. */
    mark_t *v = f->marked;
    size_t n = f->n;
    f->marked = NULL;
    f->n = f->cap = 0;
    for (size_t i = 0; i < n; i++)
        write_out(f, &v[i], true);
    free(v);
}

gps_flush *gps_flush_new(struct event_base *base, gps_flush_alive_fn alive, void *arg)
{
    size_t slot = 0;
    while (slot < sizeof flushers / sizeof flushers[0] && flushers[slot])
        slot++;
    if (slot == sizeof flushers / sizeof flushers[0] || !alive)
        return NULL; /* evhttp writes as it would alone */
    gps_flush *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->base = base;
    f->alive = alive;
    f->alive_arg = arg;
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
    /* The loop has stopped: write what is marked, run no callback. */
    for (size_t i = 0; i < f->n; i++)
        write_out(f, &f->marked[i], false);
    free(f->marked);
    event_free(f->ev);
    free(f);
}

static bool mark(gps_flush *f, struct bufferevent *bev, evutil_socket_t fd)
{
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 64;
        mark_t *v = realloc(f->marked, cap * sizeof *v);
        if (!v)
            return false;
        f->marked = v;
        f->cap = cap;
    }
    f->marked[f->n++] = (mark_t){bev, fd};
    if (!f->armed) {
        f->armed = true;
        event_active(f->ev, EV_TIMEOUT, 0);
    }
    return true;
}

void gps_flush_conn(struct evhttp_connection *evcon)
{
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    if (!bev || bufferevent_openssl_get_ssl(bev) || bufferevent_getfd(bev) < 0 ||
        evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        return;
    gps_flush *f = flusher_of(evhttp_connection_get_base(evcon));
    /* Without a flusher (or memory for the mark) evhttp's write event
     * writes it a turn later, as it would alone. */
    if (f)
        (void)mark(f, bev, bufferevent_getfd(bev));
}
