/*
 * api_openai: the OpenAI dialect.
 *
 *   POST /v1/completions        prompt -> text_completion (+ SSE chunks)
 *   POST /v1/chat/completions   messages -> chat.completion (+ chat.completion.chunk)
 *   GET  /v1/models             models served now (also the Anthropic SDK's
 *                               models.list shape: has_more, first_id, last_id)
 *
 * Streaming: every chunk carries a `choices` array; the first chat delta
 * carries role "assistant"; the last content chunk carries finish_reason;
 * with stream_options.include_usage a final chunk with `choices: []` and
 * `usage`; then `data: [DONE]`. An error before the first byte is a plain
 * HTTP error in OpenAI's shape; later, a `data: {"error":{...}}` chunk.
 *
 * The parse function is pure (unit-tested), so are the reply's bytes
 * (openai_render.h); the handlers are registered by gps_openai_register.
 */
#ifndef GPS_API_OPENAI_H
#define GPS_API_OPENAI_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "server/jobs/jobs.h"
#include "server/dialects/openai_render.h"
#include "server/dialects/poolmeta.h"
#include "server/dialects/reqcheck.h"
#include "server/dialects/toolcalls.h"

typedef struct gps_openai_req {
    gps_job_spec spec;       /* owned; moved into the job on submit */
    bool chat;
    bool stream;
    bool include_usage;
} gps_openai_req;

/* Validate an already parsed JSON body. Returns 0, or -1 with a message
 * for people in msg and the offending field in *param (static string, or
 * NULL), or GPS_PARSE_OOM (reqcheck.h) with msg and no param. On error out
 * holds nothing to free; on success free with gps_job_spec_clear(&out->spec)
 * unless moved. */
int gps_openai_parse(const json_t *body, bool chat, gps_openai_req *out, char *msg,
                     size_t msglen, const char **param);

/* Validate OpenAI function tools and tool_choice ("auto" | "none" |
 * "required" | {"type":"function","function":{"name"}}); tool_choice may
 * be NULL. Returns 0, or -1 with msg and *param (it allocates nothing). */
int gps_openai_tools_check(const json_t *tools, const json_t *tool_choice, char *msg,
                           size_t msglen, const char **param);

struct gps_http;
struct gps_metrics;
struct evhttp_request;

struct gps_relay_ctx;
/* Routes /v1/completions, /v1/chat/completions and /v1/models on h; c (the
 * relay's context, relay.h) is shared with Anthropic and must outlive h. */
int gps_openai_register(struct gps_http *h, struct gps_relay_ctx *c);

#endif
