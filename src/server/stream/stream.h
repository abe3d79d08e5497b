/*
 * stream: one held streaming (SSE) reply, written once for every kind of
 * source: a live job relayed in a client dialect (relay.h), a native task's
 * durable event log (api_tasks.c) and the dashboard's snapshots.
 *
 * A stream owns, for its owner:
 *   - hold and peer-close watch (held.h): a client that goes away, or that
 *     is dropped as too slow, ends in ops->gone (the owner finishes:
 *     gps_stream_free_later);
 *   - the output buffer: the owner renders into s->out, and the stream
 *     writes it at once (gps_stream_send) or once at the end of this loop
 *     turn (gps_stream_send_soon: every token of an upload is one write);
 *   - backpressure as a pull (sse.h pace): the owner asks
 *     gps_stream_blocked before rendering what is behind and keeps it
 *     where it already is (the job's text, the task's log); when the
 *     connection drained, ops->writable runs and the owner writes more;
 *   - the slow-client drop: blocked for slow_client_timeout_sec, the
 *     client is logged once ("client_too_slow", with "behind": bytes of
 *     the source not yet written, ops->behind) and dropped (ops->gone runs
 *     with s->too_slow set);
 *   - keep-alives (gps_stream_keepalive, from the owner's timer);
 *   - the end: gps_stream_end writes the rest and ends the chunked reply;
 *   - the free, deferred (redis's freeClientAsync): gps_stream_free_later
 *     is the one finalise path; the owner is freed once the callback chain
 *     that finished it has returned (the loop's next event), so nothing up
 *     the stack (a job's event loop, held.c's close callback, the pace's
 *     drain) ever touches freed memory. Until then the stream is inert.
 * The owner renders (its dialect's bytes) and decides when it is done.
 *
 * The gps_stream lives inside its owner (its address is the callbacks'
 * argument): the owner must not move once the stream is held.
 */
#ifndef GPS_STREAM_H
#define GPS_STREAM_H

#include <stdbool.h>
#include <stdint.h>

#include "common/gp_util.h"
#include "server/http/held.h"
#include "server/http/sse.h"

struct evhttp_request;
struct event;

typedef struct gps_stream_ops {
    /* The client drained its output after being blocked: write more. */
    void (*writable)(void *owner);
    /* Bytes of the source not yet written (logged when dropped); NULL: 0. */
    long long (*behind)(void *owner);
    /* The client went away, or was dropped as too slow (s->too_slow): the
     * request is gone (s->req NULL); the owner cleans up and finishes
     * (gps_stream_free_later; never a free here, inside held.c's close
     * callback). */
    void (*gone)(void *owner);
} gps_stream_ops;

typedef struct gps_stream {
    const gps_stream_ops *ops;
    void *owner;
    struct evhttp_request *req;   /* NULL once the client is gone or answered */
    gps_held held;
    gps_sse_pace *pace;           /* from gps_stream_start */
    gp_buf out;                   /* rendered, not yet written */
    struct event *flush;          /* gps_stream_send_soon's end-of-turn write */
    bool flush_queued;            /* flush is active: asking again costs nothing */
    uint64_t last_write_us;       /* for keep-alives */
    bool started;                 /* SSE headers sent */
    bool too_slow;                /* dropped as too slow (before ops->gone) */
    char corr[65];                /* correlation id of the logs */
    char job_id[48];              /* named in the logs; set by the owner */
    /* The deferred free (gps_stream_free_later). */
    struct event_base *base;      /* the connection's loop, from init */
    bool closing;                 /* finished: waits for free_fn, inert */
    void (*free_fn)(void *owner);
    struct gps_stream *reap_prev, *reap_next; /* the streams waiting for it */
} gps_stream;

/* Zero s and bind it to req (not held yet). corr may be NULL. */
void gps_stream_init(gps_stream *s, const gps_stream_ops *ops, void *owner,
                     struct evhttp_request *req, const char *corr);
/* Hold the request (held.h) with a peer-close watch; timeout_sec > 0: the
 * connection's timeout for the wait. False when req has no connection. */
bool gps_stream_hold(gps_stream *s, int timeout_sec);
/* Start the chunked SSE reply (headers the caller added go with it) and
 * its pace. Idempotent. */
void gps_stream_start(gps_stream *s);
/* True while the client is behind (the owner keeps what is behind). */
bool gps_stream_blocked(gps_stream *s);
/* Write out now / at the end of this loop turn (16 KiB or more waiting
 * goes at once). */
void gps_stream_send(gps_stream *s);
void gps_stream_send_soon(gps_stream *s);
/* A keep-alive comment when nothing was written for idle_us and the
 * client is not behind. */
void gps_stream_keepalive(gps_stream *s, uint64_t now_us, uint64_t idle_us);
/* Write the rest, stop holding and end the chunked reply; s->req becomes
 * NULL. The owner finishes after (gps_stream_free_later). */
void gps_stream_end(gps_stream *s);
/* Stop holding before a reply that is not this stream's (an HTTP error or
 * a whole body): the caller answers s->req itself. */
void gps_stream_release(gps_stream *s);
/* Free what the stream holds (the owner's free). */
void gps_stream_clear(gps_stream *s);
/* The owner is done (the reply ended or the client is gone): stop holding,
 * and run free_fn(owner) once the current callback chain has returned (the
 * owner calls gps_stream_clear there). Until then no callback of the
 * stream reaches the owner. Without a loop (no connection at init, or
 * ENOMEM) free_fn runs now. Idempotent. */
void gps_stream_free_later(gps_stream *s, void (*free_fn)(void *owner));
/* Shutdown: run every free still waiting, now (after the HTTP server is
 * freed, while what the owners borrow is still there). */
void gps_stream_reap_all(void);

#endif
