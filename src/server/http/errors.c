/* errors: the error bodies of every dialect, built in one place (see errors.h). */
#include "server/http/errors.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "common/gp_util.h"

const char *gps_openai_error_type(int status)
{
    switch (status) {
    case 400: case 404: case 405: case 409: case 413: case 414: case 415: case 422: case 431:
    case 501:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 429:
        return "rate_limit_error";
    case 503:
        return "service_unavailable";
    case 504:
        return "timeout";
    default:
        return "server_error";
    }
}

static const char *anthropic_error_type(int status)
{
    switch (status) {
    case 400: case 405: case 409: case 414: case 415: case 422: case 431: case 501:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 503: case 529:
        return "overloaded_error";
    case 504:
        return "timeout_error";
    default:
        return "api_error";
    }
}

/* A JSON string of s (NULL: none, counted as a failure by the set that
 * takes it). Callers cut outside text into messages ("%.256s" of a
 * client's model name) and may cut a character in two: jansson refuses such
 * a string whole, so its bytes that are not UTF-8 become U+FFFD here rather
 * than the member going missing or the error becoming a 500. NULL
 * otherwise only when out of memory. New reference. */
static json_t *text(const char *s)
{
    json_t *j = s ? json_string(s) : NULL;
    if (j || !s || gp_utf8_valid(s, strlen(s)))
        return j;
    gp_buf b;
    gp_buf_init(&b);
    const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
    int rc = 0;
    while (p < end && rc == 0) {
        size_t n = *p < 0x80 ? 1 : gp_utf8_seq_len(p, end);
        rc = n ? gp_buf_append(&b, (const char *)p, n) : gp_buf_append(&b, "\xef\xbf\xbd", 3);
        p += n ? n : 1;
    }
    j = rc == 0 ? json_stringn(b.data, b.len) : NULL;
    gp_buf_free(&b);
    return j;
}

/* Whole or NULL (out of memory): an error without its message, code or
 * type is not the error (a client that reads error.type finds nothing), and
 * gps_http_send_json answers NULL with its fixed 500. Each
 * json_object_set_new takes its value, NULL included, so the sets only count
 * their failures. */
json_t *gps_error_body(gps_dialect d, int status, const char *code, const char *message,
                       const char *param, const char *correlation_id, json_t *extra)
{
    json_t *err = json_object();
    json_t *top = json_object();
    if (!err || !top) {
        json_decref(err);
        json_decref(top);
        json_decref(extra);
        return NULL;
    }
    int bad = 0;
    switch (d) {
    case GPS_DIALECT_OPENAI: {
        /* OpenAI codes are lower snake case ("model_not_found"). */
        char lc[64];
        size_t i = 0;
        for (; code && code[i] && i + 1 < sizeof lc; i++)
            lc[i] = (char)tolower((unsigned char)code[i]);
        lc[i] = '\0';
        bad += json_object_set_new(err, "message", text(message)) < 0;
        bad += json_object_set_new(err, "type", json_string(gps_openai_error_type(status))) < 0;
        bad += json_object_set_new(err, "param", param ? text(param) : json_null()) < 0;
        bad += json_object_set_new(err, "code", code ? text(lc) : json_null()) < 0;
        break;
    }
    case GPS_DIALECT_ANTHROPIC:
        bad += json_object_set_new(top, "type", json_string("error")) < 0;
        bad += json_object_set_new(err, "type", json_string(anthropic_error_type(status))) < 0;
        bad += json_object_set_new(err, "message", text(message)) < 0;
        /* Not in Anthropic's own shape; the SDKs keep unknown fields. */
        if (param)
            bad += json_object_set_new(err, "param", text(param)) < 0;
        break;
    case GPS_DIALECT_NATIVE:
    default:
        bad += json_object_set_new(err, "code", text(code ? code : "ERROR")) < 0;
        bad += json_object_set_new(err, "message", text(message)) < 0;
        if (param) {
            json_t *details = json_object();
            bad += details && json_object_set_new(details, "param", text(param)) < 0;
            bad += json_object_set_new(err, "details", details) < 0;
        }
        if (correlation_id)
            bad += json_object_set_new(err, "correlation_id", text(correlation_id)) < 0;
        break;
    }
    bad += extra && json_object_update(err, extra) < 0;
    json_decref(extra);
    bad += json_object_set_new(top, "error", err) < 0; /* (takes err, set or not) */
    if (bad) {
        json_decref(top);
        return NULL;
    }
    return top;
}

json_t *gps_error_body_retry(gps_dialect d, int status, const char *code, const char *message,
                             const char *param, const char *correlation_id, int retry_after_sec)
{
    json_t *extra = NULL;
    if (retry_after_sec > 0) {
        extra = json_pack("{s:i}", "retry_after_sec", retry_after_sec);
        if (!extra)
            return NULL;
    }
    return gps_error_body(d, status, code, message, param, correlation_id, extra);
}

void gps_send_error_retry(struct evhttp_request *req, gps_dialect d, int status,
                          const char *code, const char *message, const char *param,
                          const char *correlation_id, int retry_after_sec)
{
    if (retry_after_sec > 0) {
        char v[32];
        snprintf(v, sizeof v, "%d", retry_after_sec);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", v);
    }
    gps_http_send_json(req, status,
                       gps_error_body_retry(d, status, code, message, param, correlation_id,
                                            retry_after_sec));
}
