/*
 * errors: the one builder of error bodies, for every dialect. The same
 * facts go in every shape, in the same place:
 *
 *   OpenAI     {"error":{"message","type","param","code"[,"retry_after_sec"]}}
 *   Anthropic  {"type":"error","error":{"type","message"[,"param"][,"retry_after_sec"]}}
 *   native     {"error":{"code","message"[,"details":{"param"}],"correlation_id"
 *                        [,"retry_after_sec"]}}
 *
 * param names the offending field (a 404 for an unknown model names
 * "model" in every dialect); retry_after_sec, when the server knows when to
 * come back, sits in the error object beside the message in every dialect
 * and matches the Retry-After header. docs/api.md documents the shapes.
 * The dialect's error "type" tables (OpenAI's, Anthropic's) live here and
 * nowhere else. Pure except gps_send_error_retry (unit-tested).
 */
#ifndef GPS_ERRORS_H
#define GPS_ERRORS_H

#include <jansson.h>

#include "server/http/http.h"

struct evhttp_request;

/* The error body of dialect d (new reference), whole or NULL out of memory
 * (gps_http_send_json answers NULL with its fixed 500). code is a stable
 * native code ("INVALID_REQUEST"; OpenAI gets it lower-cased); message is
 * not NULL; param names the offending field or NULL; bytes of message,
 * param or correlation_id that are not UTF-8 become U+FFFD; extra (stolen,
 * may be NULL) is merged into the inner error object. */
json_t *gps_error_body(gps_dialect d, int status, const char *code, const char *message,
                       const char *param, const char *correlation_id, json_t *extra);
/* The same with error.retry_after_sec when retry_after_sec > 0. */
json_t *gps_error_body_retry(gps_dialect d, int status, const char *code, const char *message,
                             const char *param, const char *correlation_id, int retry_after_sec);
/* Send it: with retry_after_sec > 0 also the Retry-After header. */
void gps_send_error_retry(struct evhttp_request *req, gps_dialect d, int status,
                          const char *code, const char *message, const char *param,
                          const char *correlation_id, int retry_after_sec);
/* OpenAI "type" for a status (invalid_request_error, authentication_error, ...). */
const char *gps_openai_error_type(int status);

#endif
