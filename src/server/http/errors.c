/* errors: the error bodies of every dialect, built in one place (see errors.h). */
#include "server/http/errors.h"

#include <ctype.h>
#include <stdio.h>

#include <event2/http.h>
#include <event2/keyvalq_struct.h>

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
    switch (d) {
    case GPS_DIALECT_OPENAI: {
        /* OpenAI codes are lower snake case ("model_not_found"). */
        char lc[64];
        size_t i = 0;
        for (; code && code[i] && i + 1 < sizeof lc; i++)
            lc[i] = (char)tolower((unsigned char)code[i]);
        lc[i] = '\0';
        json_object_set_new(err, "message", json_string(message));
        json_object_set_new(err, "type", json_string(gps_openai_error_type(status)));
        json_object_set_new(err, "param", param ? json_string(param) : json_null());
        json_object_set_new(err, "code", code ? json_string(lc) : json_null());
        json_object_set_new(top, "error", err);
        break;
    }
    case GPS_DIALECT_ANTHROPIC:
        json_object_set_new(top, "type", json_string("error"));
        json_object_set_new(err, "type", json_string(anthropic_error_type(status)));
        json_object_set_new(err, "message", json_string(message));
        /* Not in Anthropic's own shape; the SDKs keep unknown fields. */
        if (param)
            json_object_set_new(err, "param", json_string(param));
        json_object_set_new(top, "error", err);
        break;
    case GPS_DIALECT_NATIVE:
    default:
        json_object_set_new(err, "code", json_string(code ? code : "ERROR"));
        json_object_set_new(err, "message", json_string(message));
        if (param)
            json_object_set_new(err, "details", json_pack("{s:s}", "param", param));
        if (correlation_id)
            json_object_set_new(err, "correlation_id", json_string(correlation_id));
        json_object_set_new(top, "error", err);
        break;
    }
    if (extra)
        json_object_update(err, extra);
    json_decref(extra);
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
