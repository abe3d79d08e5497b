/*
 * rformat: structured-output requests (issue 26): OpenAI chat
 * `response_format` and Responses `text.format`, checked and brought to one
 * form for the job spec. The schema goes through the engine's schema
 * compiler (gpe_schema_check), so an unsupported keyword is a 400 naming it
 * before any token, on every backend, with the same rules the gguf agent
 * enforces (docs/api.md "Structured outputs").
 *
 * The job form is OpenAI's chat form: {"type":"json_object"} or
 * {"type":"json_schema","json_schema":{"name","schema","strict"[,"description"]}}.
 */
#ifndef GPS_RFORMAT_H
#define GPS_RFORMAT_H

#include <jansson.h>
#include <stddef.h>

/* Chat `response_format` (borrowed, may be NULL). *out: the job form (new
 * reference), NULL for none/text. 0, or -1 with a message for a 400, or
 * GPS_PARSE_OOM (reqcheck.h) with msg. */
int gps_rformat_chat(const json_t *rf, json_t **out, char *msg, size_t msglen);
/* Responses `text.format` (borrowed, may be NULL); same *out. */
int gps_rformat_responses(const json_t *fmt, json_t **out, char *msg, size_t msglen);

#endif
