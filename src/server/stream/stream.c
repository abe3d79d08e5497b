/* stream: one held streaming reply (see stream.h). */
#include "server/stream/stream.h"

#include <stdio.h>
#include <string.h>

#include <event2/event.h>
#include <event2/http.h>

#include "common/gp_log.h"

void gps_stream_init(gps_stream *s, const gps_stream_ops *ops, void *owner,
                     struct evhttp_request *req, const char *corr)
{
    memset(s, 0, sizeof *s);
    s->ops = ops;
    s->owner = owner;
    s->req = req;
    gp_copy_str(s->corr, sizeof s->corr, corr ? corr : "");
    gp_buf_init(&s->out);
    s->last_write_us = gp_now_mono_us();
    struct evhttp_connection *c = req ? evhttp_request_get_connection(req) : NULL;
    s->base = c ? evhttp_connection_get_base(c) : NULL;
}

/* The connection closed while held (held.c dropped the request). */
static void gone(void *arg)
{
    gps_stream *s = arg;
    s->req = NULL;
    if (!s->closing)
        s->ops->gone(s->owner);
}

bool gps_stream_hold(gps_stream *s, int timeout_sec)
{
    return gps_held_start(&s->held, s->req, true, timeout_sec, gone, s);
}

static void writable(void *arg)
{
    gps_stream *s = arg;
    if (!s->closing && s->ops->writable)
        s->ops->writable(s->owner);
}

/* Behind for slow_client_timeout_sec: drop the client like a disconnect
 * (ops->gone runs), logged once for every kind of stream. */
static void too_slow(void *arg)
{
    gps_stream *s = arg;
    if (!s->held.evcon || s->closing)
        return;
    s->too_slow = true;
    long long behind = s->ops->behind ? s->ops->behind(s->owner) : 0;
    gp_log_write(GP_LOG_WARN, "client_too_slow", s->corr[0] ? s->corr : NULL,
                 json_pack("{s:s,s:I,s:I}", "job_id", s->job_id, "behind", (json_int_t)behind,
                           "unsent", (json_int_t)gps_sse_unsent(s->req)),
                 "client did not read its stream in time; dropping it");
    gps_held_drop(&s->held); /* runs gone: the owner is freed */
}

void gps_stream_start(gps_stream *s)
{
    if (s->started || !s->req)
        return;
    s->started = true;
    gps_sse_start(s->req);
    s->pace = gps_sse_pace_new(s->req, writable, too_slow, s);
}

bool gps_stream_blocked(gps_stream *s)
{
    return gps_sse_pace_blocked(s->pace);
}

void gps_stream_send(gps_stream *s)
{
    if (!s->req || s->out.len == 0)
        return;
    gps_sse_pace_send(s->pace, s->req, &s->out);
    s->last_write_us = gp_now_mono_us();
}

/* Output rendered during one loop turn goes out as one chunk at its end:
 * an upload that carries many tokens of a stream (or several uploads read
 * in one turn) costs one write, not one per token (a chunk's evbuffer and
 * its bufferevent write were a sixth of the server's instructions per
 * token). More than this much waiting is written at once, so what is not
 * yet counted by the pace's high-water mark stays small. */
#define FLUSH_NOW (16 * 1024)

static void reap(gps_stream *s);

/* The end of the turn's write, or (closing) the deferred free. */
static void flush_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gps_stream *s = arg;
    s->flush_queued = false;
    if (s->closing)
        reap(s); /* frees s: last use */
    else
        gps_stream_send(s);
}

/* Run flush_cb from the loop's active queue, after the callback that asks
 * has returned. */
static bool run_later(gps_stream *s)
{
    if (!s->flush) {
        s->flush = s->base ? event_new(s->base, -1, 0, flush_cb, s) : NULL;
        if (!s->flush)
            return false;
    }
    /* Once per turn, not per token: a flag test is cheaper than
     * event_active's own "already active" check. */
    if (!s->flush_queued) {
        s->flush_queued = true;
        event_active(s->flush, EV_TIMEOUT, 1);
    }
    return true;
}

static bool flush_later(gps_stream *s)
{
    return s->req && run_later(s);
}

void gps_stream_send_soon(gps_stream *s)
{
    if (s->out.len >= FLUSH_NOW || !flush_later(s))
        gps_stream_send(s);
}

void gps_stream_keepalive(gps_stream *s, uint64_t now_us, uint64_t idle_us)
{
    if (!s->req || !s->started || now_us - s->last_write_us <= idle_us || gps_stream_blocked(s))
        return;
    /* Through the pace: a plain chunk would clear the connection's drain
     * callback. */
    gps_sse_format_comment(&s->out, "keep-alive");
    gps_stream_send(s);
    s->last_write_us = now_us;
}

void gps_stream_end(gps_stream *s)
{
    gps_stream_send(s);
    gps_held_release(&s->held);
    if (s->req)
        gps_sse_end(s->req);
    s->req = NULL;
}

void gps_stream_release(gps_stream *s)
{
    gps_held_release(&s->held);
}

/* The streams whose free waits for the loop (all on the loop thread). */
static gps_stream *reap_list;

static void reap(gps_stream *s)
{
    if (s->reap_prev)
        s->reap_prev->reap_next = s->reap_next;
    else if (reap_list == s)
        reap_list = s->reap_next;
    if (s->reap_next)
        s->reap_next->reap_prev = s->reap_prev;
    s->reap_prev = s->reap_next = NULL;
    s->free_fn(s->owner); /* gps_stream_clear frees s->flush, s with the owner */
}

void gps_stream_free_later(gps_stream *s, void (*free_fn)(void *owner))
{
    if (s->closing)
        return;
    s->closing = true;
    s->free_fn = free_fn;
    gps_held_release(&s->held);
    s->req = NULL;
    if (!run_later(s)) {
        free_fn(s->owner);
        return;
    }
    s->reap_next = reap_list;
    if (reap_list)
        reap_list->reap_prev = s;
    reap_list = s;
}

void gps_stream_reap_all(void)
{
    while (reap_list)
        reap(reap_list);
}

void gps_stream_clear(gps_stream *s)
{
    gps_held_release(&s->held);
    gp_buf_free(&s->out);
    gps_sse_pace_free(s->pace);
    s->pace = NULL;
    if (s->flush)
        event_free(s->flush); /* (also takes it off the active queue) */
    s->flush = NULL;
}
