/*
 * relay: the client side of a relayed request, written once for every
 * dialect that streams a job to its client (OpenAI, Anthropic).
 *
 * A dialect's stream embeds a gps_relay and gives it a const table of
 * operations; the relay owns, for it:
 *   - submit: a refused job is an HTTP error in the dialect's shape
 *     (errors.h: param "model" on 404, Retry-After + retry_after_sec);
 *   - hold: the request is held (held.h) with a peer-close watch; a client
 *     that goes away cancels its job (outcome "cancelled");
 *   - subscribe / unsubscribe to the job;
 *   - output: gps_relay_send_output is the one way a dialect writes bytes
 *     that came from the agent, and it marks the job output-sent (after
 *     that a lost agent can no longer be hidden by a requeue): dialects
 *     never call gps_job_mark_output_sent;
 *   - backpressure (sse.h, gps_sse_pace): the dialect asks
 *     gps_relay_blocked before rendering what is behind and keeps it where
 *     it is (the job's text) while blocked; ops->writable runs when the
 *     connection drained; a client behind for slow_client_timeout_sec is
 *     dropped (outcome "client_too_slow", job cancelled);
 *   - errors: before the first byte an HTTP error, after it one stream
 *     error event (ops->error_event names its SSE event, NULL: data only);
 *   - metrics: requests_total / request_duration_seconds{api, outcome}
 *     through the closed outcome table (metrics.h), and
 *     time_to_first_token_seconds{api, model}: streaming, when the first
 *     bytes from the agent go out (gps_relay_send_output); a whole body,
 *     from the job's first token (gps_relay_end_body). Dialects never
 *     observe metrics themselves.
 * The dialect renders: open, token, tool call, end, whole body (its own
 * file); it parses the body into a job spec before the relay exists.
 */
#ifndef GPS_RELAY_H
#define GPS_RELAY_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "common/gp_util.h"
#include "server/http/held.h"
#include "server/http/http.h"
#include "server/jobs/jobs.h"
#include "server/http/sse.h"
#include "server/stream/stream.h"

struct gps_metrics;

typedef struct gps_relay_ops {
    const char *api;              /* metrics label: "openai", "anthropic" */
    gps_dialect dialect;          /* error shape */
    const char *error_event;      /* SSE event of a stream error; NULL: data line only */
    gps_job_event_fn on_event;    /* the job's events while the client is there (arg: owner) */
    /* The client drained: catch up; NULL: gps_relay_catch_up. */
    void (*writable)(void *owner);
    /* Bytes behind (logged when dropped); NULL: gps_relay_behind. */
    long long (*behind)(void *owner);
    void (*free)(void *owner);    /* free the dialect's stream (the relay is inside) */
    /* A dialect that streams through the relay's catch-up queue
     * (gps_relay_stream_event) renders with these two: n bytes of the
     * job's text (text points into it, at the relay's cursor) as one
     * delta, and any other event; true: the reply is complete (a stop
     * sequence matched in the text, the end, an error; the owner is freed
     * later, gps_relay_finish). NULL for the others. */
    bool (*render_text)(void *owner, gps_job *job, const char *text, size_t n);
    bool (*render_event)(void *owner, gps_job *job, gps_event_type type, json_t *ev);
} gps_relay_ops;

/* What the relaying dialects' handlers share (jobs and metrics borrowed):
 * one for OpenAI and Anthropic (main.c). */
typedef struct gps_relay_ctx {
    gps_jobs *jobs;
    struct gps_metrics *metrics;
    int request_timeout_sec;
} gps_relay_ctx;
/* NULL on ENOMEM. Free after the HTTP server (routes point at it). */
gps_relay_ctx *gps_relay_ctx_new(gps_jobs *jobs, struct gps_metrics *m, int request_timeout_sec);
void gps_relay_ctx_free(gps_relay_ctx *c);

typedef struct gps_relay {
    const gps_relay_ops *ops;
    void *owner;
    gps_jobs *jobs;
    struct gps_metrics *metrics;
    /* The held reply (stream.h): hold, peer-close watch, output buffer,
     * backpressure, slow-client drop. s.req: NULL once the client is gone
     * or answered. */
    gps_stream s;
    gps_job *job;
    /* The cursor over the job's text (gps_relay_stream_event):
     * job->text[0..sent) was rendered; the events that came while the
     * client was behind wait here with the text offset they followed. */
    size_t sent;
    unsigned text_resets; /* gps_job_text_resets when sent was last valid */
    struct gps_relay_deferred {
        gps_event_type type;
        json_t *ev;
        size_t at;
    } *dv;
    size_t dn, dcap;
    uint64_t start_us;
    bool ttft_done;               /* time_to_first_token observed */
} gps_relay;

/* A request answered before any relay exists: counted (an error already
 * sent, e.g. by gps_req_json) / refused with the error in ops' dialect. */
void gps_relay_count_req(const gps_relay_ops *ops, struct gps_metrics *m, gps_req *r,
                         const char *outcome);
void gps_relay_refuse(const gps_relay_ops *ops, struct gps_metrics *m, gps_req *r, int status,
                      const char *code, const char *message, const char *param);
void gps_relay_init(gps_relay *rl, const gps_relay_ops *ops, void *owner, gps_jobs *jobs,
                    struct gps_metrics *m, gps_req *r);
/* Submit spec (cleared). Refused: the error is sent and counted, NULL is
 * returned and the caller frees its stream. Else the job is subscribed
 * and the request held (timeout_sec for the wait). */
gps_job *gps_relay_submit(gps_relay *rl, gps_job_spec *spec, gps_req *r, int timeout_sec);
/* requests_total{api,outcome} for this request. */
void gps_relay_count(gps_relay *rl, const char *outcome);
/* Start the SSE reply: x-pool-* headers, chunked reply, pace. */
void gps_relay_start(gps_relay *rl);
bool gps_relay_blocked(gps_relay *rl);
/* Write out (paced): framing only, at once / bytes that came from the
 * agent, at the end of this loop turn (every stream's output of a turn is
 * one write; 16 KiB or more waiting goes at once) / framing only, at the
 * end of this loop turn. */
void gps_relay_send(gps_relay *rl);
void gps_relay_send_output(gps_relay *rl);
void gps_relay_send_soon(gps_relay *rl);
/* The job failed (ev: its error event; message NULL: ev's). Sends the
 * error (HTTP or stream event), counts it, finishes (gps_relay_finish). */
void gps_relay_fail(gps_relay *rl, const json_t *ev, const char *message);
/* The same for a reply that could not be built whole (out of memory):
 * 500 INTERNAL "out of memory" (a stream: its error event), never a reply
 * with a part left out. Returns true, the reply being complete: what
 * ops->render_text / render_event return when a frame found no memory. */
bool gps_relay_fail_oom(gps_relay *rl);
/* Done: the stream's last bytes are in out / the whole body (stolen).
 * Counts "ok", finishes (gps_relay_finish). */
void gps_relay_end_stream(gps_relay *rl);
/* pool_headers: the x-pool-* headers too (not for a plain request). */
void gps_relay_end_body(gps_relay *rl, json_t *body, bool pool_headers);
/* The same with the body as JSON text (n bytes, still the caller's). */
void gps_relay_end_body_text(gps_relay *rl, const char *body, size_t n, bool pool_headers);
/* A streaming dialect's on_event (ops->render_text / render_event): text
 * goes out as fast as the client reads it, straight from the job's text,
 * and the events after it (tool calls, end, error) wait in order behind it
 * while the client is behind. A non-streaming reply may use it too (it is
 * never blocked: the text is rendered as it comes, e.g. into a stop-string
 * scan). A transparent requeue that dropped the job's text (nothing was
 * sent yet) moves the cursor back to 0: render_text then gets text at the
 * start of job->text again, and a dialect that holds back text (stop
 * strings) starts over. */
void gps_relay_stream_event(gps_relay *rl, gps_job *job, gps_event_type type, json_t *ev);
/* ops->writable of such a dialect: write what is behind. Returns true when
 * the reply completed. */
bool gps_relay_catch_up(gps_relay *rl);
/* ops->behind of such a dialect: bytes of text not yet written. */
long long gps_relay_behind(const gps_relay *rl);

/* The one finalise path (every end, error, and a client gone): unsubscribe
 * and free the owner (ops->free) once the callback chain that got here has
 * returned (stream.h, gps_stream_free_later). A refused submit's caller
 * frees its stream itself (nothing is held yet). */
void gps_relay_finish(gps_relay *rl);
/* For ops->free: what the relay itself holds. */
void gps_relay_clear(gps_relay *rl);

#endif
