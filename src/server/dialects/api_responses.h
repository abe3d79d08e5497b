/*
 * api_responses: the OpenAI Responses API, POST /v1/responses (what the
 * SDK's client.responses.create / .stream and OpenAI's Codex CLI speak).
 * The request and the shapes are responses.h; this module relays a job to
 * the client through relay.h like the other dialects: same scheduling,
 * failover, limits and errors (OpenAI's error body; after the first byte a
 * stream `error` event). Nothing is stored.
 */
#ifndef GPS_API_RESPONSES_H
#define GPS_API_RESPONSES_H

struct gps_http;
struct gps_relay_ctx;

/* Route POST /v1/responses on h; c (relay.h) must outlive h. */
int gps_responses_register(struct gps_http *h, struct gps_relay_ctx *c);

#endif
