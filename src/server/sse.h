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
/* Append a comment line (": text\n\n"), used as a keep-alive. */
int gps_sse_format_comment(gp_buf *out, const char *text);

/* Start a chunked 200 text/event-stream reply on req. */
void gps_sse_start(struct evhttp_request *req);
/* Send what is in buf (then emptied) as one chunk. */
void gps_sse_send(struct evhttp_request *req, gp_buf *buf);
/* End the chunked reply. */
void gps_sse_end(struct evhttp_request *req);

#endif
