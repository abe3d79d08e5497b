/*
 * api_embeddings: POST /v1/embeddings (OpenAI's shape, embeddings.h),
 * relayed as a GPS_JOB_EMBED job through the normal scheduler, limits and
 * keys; metrics under api "embeddings". docs/api.md "POST /v1/embeddings".
 */
#ifndef GPS_API_EMBEDDINGS_H
#define GPS_API_EMBEDDINGS_H

#include "server/dialects/relay.h"
#include "server/http/http.h"

/* Routes POST /v1/embeddings on h; c is borrowed (outlives h). */
int gps_embeddings_register(gps_http *h, gps_relay_ctx *c);

#endif
