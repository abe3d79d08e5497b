/*
 * api_responses: the OpenAI Responses API, POST /v1/responses (what the
 * SDK's client.responses.create / .stream and OpenAI's Codex CLI speak).
 * The request and the shapes are responses.h; this module relays a job to
 * the client through relay.h like the other dialects: same scheduling,
 * failover, limits and errors (OpenAI's error body; after the first byte a
 * stream `error` event). With store (the default) a finished response is
 * kept per key and previous_response_id / item_reference resolve against
 * what was kept (resp_state.h): such a request waits for that read first.
 */
#ifndef GPS_API_RESPONSES_H
#define GPS_API_RESPONSES_H

struct gps_http;
struct gps_relay_ctx;
struct gps_resp_state;

typedef struct gps_responses gps_responses;

/* c (relay.h) and st (resp_state.h; NULL: nothing is stored) must outlive
 * it. NULL on ENOMEM. Free after the HTTP server (routes point at it). */
gps_responses *gps_responses_new(struct gps_relay_ctx *c, struct gps_resp_state *st);
void gps_responses_free(gps_responses *api);
/* Route POST, GET and DELETE /v1/responses on h. */
int gps_responses_register(struct gps_http *h, gps_responses *api);

#endif
