/*
 * sse: Server-Sent Events framing and the chunked-reply plumbing that
 * carries it.
 *
 * Framing (WHATWG HTML "server-sent events"): optional "event: NAME",
 * optional "id: ID", then the data split at newlines into one "data: " line
 * each, then a blank line. OpenAI streams use data lines only and end with
 * "data: [DONE]".
 *
 * The format functions append to a gp_buf and are pure (unit-tested); the
 * stream functions write to an evhttp request that is in chunked mode.
 */
#ifndef GPS_SSE_H
#define GPS_SSE_H

#include <stdbool.h>
#include <stddef.h>

#include <event2/http.h>
#include <jansson.h>

#include "common/gp_util.h"

/* Append one event. event and id may be NULL. data may contain newlines
 * (each line becomes its own "data:" line). 0 or -1 (ENOMEM). */
int gps_sse_format(gp_buf *out, const char *event, const char *id, const char *data);
/* Append "data: <compact JSON>\n\n". j is borrowed. */
int gps_sse_format_json(gp_buf *out, const char *event, const char *id, const json_t *j);
/*
 * An event rendered once with one string field left open (a "template"):
 * a stream's token events differ only in their text, so a token costs an
 * escape and two copies instead of building and dumping a JSON object (the
 * relay's hottest path: json_pack + json_dumps per token were a third of
 * the server's CPU at 64 streams).
 */
typedef struct gps_sse_tpl {
    char *pre, *post;     /* "[event: E\n]data: {...\"" and "\"...}\n\n" (owned) */
    size_t npre, npost;
} gps_sse_tpl;
/* Render obj (borrowed) once: the string value equal to marker (which must
 * occur exactly once in the dump) is the open field. event may be NULL.
 * 0, or -1 (ENOMEM, marker not found or not unique). */
int gps_sse_tpl_init(gps_sse_tpl *t, const char *event, const json_t *obj, const char *marker);
/* Append the event with text (n bytes of UTF-8) in the open field,
 * escaped as JSON. 0 or -1 (ENOMEM). */
int gps_sse_tpl_emit(gp_buf *out, const gps_sse_tpl *t, const char *text, size_t n);
void gps_sse_tpl_free(gps_sse_tpl *t);
/* Append text as the inside of a JSON string: '"' and '\\' escaped,
 * control characters as \n, \t, ... or \u00XX; other bytes (UTF-8) as
 * they are (what json_dumps writes without JSON_ENSURE_ASCII). */
int gps_json_escape_append(gp_buf *out, const char *text, size_t n);

/* Append a comment line (": text\n\n"), used as a keep-alive. */
int gps_sse_format_comment(gp_buf *out, const char *text);

/* Start a chunked 200 text/event-stream reply on req. */
void gps_sse_start(struct evhttp_request *req);
/* Send what is in buf (then emptied) as one chunk. */
void gps_sse_send(struct evhttp_request *req, gp_buf *buf);
/* End the chunked reply. */
void gps_sse_end(struct evhttp_request *req);

/*
 * Backpressure for one streaming reply (a "pace"). A client that does not
 * read must not make the server buffer its whole stream: the writer asks
 * gps_sse_pace_blocked before writing and, while it is true, keeps what is
 * behind where it already is (the job's text, a task's event log) instead
 * of formatting it. Blocked means the connection's unsent output is above
 * the high-water mark (client_buffer_bytes). Chunks sent through
 * gps_sse_pace_send carry a completion callback: when the output has
 * drained after being blocked, on_writable runs and the writer catches up.
 * Blocked for slow_client_timeout_sec without draining: on_slow runs, and
 * the writer drops the client (gps_sse_pace_drop).
 *
 * Lifetime: free the pace when the reply ends (after gps_sse_end, which
 * replaces the completion callback) or when the connection closed. The
 * callbacks may free the pace (they are its last use).
 */
typedef struct gps_sse_pace gps_sse_pace;
typedef void (*gps_sse_pace_fn)(void *arg);

/* Process-wide limits (config client_buffer_bytes, slow_client_timeout_sec),
 * set once at start-up; defaults 1 MiB and 60 s. */
void gps_sse_pace_configure(size_t high_water, int slow_timeout_sec);
size_t gps_sse_pace_high_water(void);
/* Bytes written to req's connection and not yet sent (0 without one). */
size_t gps_sse_unsent(struct evhttp_request *req);

/* A pace for req (a started chunked reply). NULL on ENOMEM or when req has
 * no connection (then write unpaced). */
gps_sse_pace *gps_sse_pace_new(struct evhttp_request *req, gps_sse_pace_fn on_writable,
                               gps_sse_pace_fn on_slow, void *arg);
void gps_sse_pace_free(gps_sse_pace *p);
/* True when the writer must hold back (output above the mark); starts the
 * slow-client clock. A NULL pace never blocks. */
bool gps_sse_pace_blocked(gps_sse_pace *p);
/* gps_sse_send with the drain callback (p may be NULL: plain send). On a
 * plain socket with nothing queued and the pace unblocked, the chunk is
 * written to the socket at once (one sendmsg, no write event armed, as
 * nginx and redis write); what the socket does not take is queued on the
 * connection as evhttp would queue it. */
void gps_sse_pace_send(gps_sse_pace *p, struct evhttp_request *req, gp_buf *buf);
/* Close the connection of a too slow client now: its close callback runs
 * (inside this call), as when the client goes away. */
void gps_sse_pace_drop(struct evhttp_connection *evcon);
/* How many bytes of text starting at s (at most n) make a slice of at most
 * max bytes that ends on a UTF-8 character boundary (>= 1 when n >= 1). */
size_t gps_sse_utf8_slice(const char *s, size_t n, size_t max);

#endif
