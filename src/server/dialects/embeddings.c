/* embeddings: request and response shapes of /v1/embeddings (embeddings.h). */
#include "server/dialects/embeddings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_util.h"
#include "server/dialects/reqcheck.h"

void gps_embed_req_clear(gps_embed_req *r)
{
    free(r->model);
    json_decref(r->input);
    free(r->user);
    memset(r, 0, sizeof *r);
}

#define FAIL(p, ...)                              \
    do {                                          \
        snprintf(msg, msglen, __VA_ARGS__);       \
        *param = (p);                             \
        goto fail;                                \
    } while (0)

/* An array of token ids: 1 to ctx_len non-negative integers. */
static int token_array_ok(const json_t *a, size_t i, long long ctx_len, char *msg, size_t msglen)
{
    size_t n = json_array_size(a), k;
    json_t *v;
    if (n == 0) {
        snprintf(msg, msglen, "input[%zu] is empty", i);
        return -1;
    }
    if (ctx_len > 0 && (long long)n > ctx_len) {
        snprintf(msg, msglen, "input[%zu] has %zu tokens; the model's context holds %lld", i, n,
                 ctx_len);
        return -1;
    }
    json_array_foreach(a, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > 0x7fffffff) {
            snprintf(msg, msglen, "input[%zu][%zu] is not a token id", i, k);
            return -1;
        }
    }
    return 0;
}

/* input in its four forms -> *out, an array with one string or token array
 * per input (new reference). 0, or -1 or GPS_PARSE_OOM with msg. */
static int inputs_of(const json_t *in, long long ctx_len, json_t **out, char *msg,
                     size_t msglen)
{
    *out = NULL;
    if (json_is_string(in)) {
        if (json_string_length(in) == 0) {
            snprintf(msg, msglen, "input must not be an empty string");
            return -1;
        }
        *out = json_pack("[O]", in);
        return *out ? 0 : gps_parse_oom(msg, msglen);
    }
    if (!json_is_array(in) || json_array_size(in) == 0) {
        snprintf(msg, msglen, "input must be a string or a non-empty array of strings or of "
                 "token ids");
        return -1;
    }
    if (json_is_integer(json_array_get(in, 0))) {
        if (token_array_ok(in, 0, ctx_len, msg, msglen) < 0)
            return -1;
        *out = json_pack("[O]", in);
        return *out ? 0 : gps_parse_oom(msg, msglen);
    }
    if (json_array_size(in) > GPS_EMBED_MAX_INPUTS) {
        snprintf(msg, msglen, "input has %zu items; at most %d", json_array_size(in),
                 GPS_EMBED_MAX_INPUTS);
        return -1;
    }
    size_t i;
    json_t *v;
    json_array_foreach(in, i, v) {
        if (json_is_string(v) && json_string_length(v) == 0) {
            snprintf(msg, msglen, "input[%zu] is an empty string", i);
            return -1;
        }
        if (json_is_array(v) && token_array_ok(v, i, ctx_len, msg, msglen) < 0)
            return -1;
        if (!json_is_string(v) && !json_is_array(v)) {
            snprintf(msg, msglen, "input[%zu] must be a string or an array of token ids", i);
            return -1;
        }
    }
    *out = json_deep_copy(in);
    return *out ? 0 : gps_parse_oom(msg, msglen);
}

int gps_embed_parse(const json_t *body, long long ctx_len, gps_embed_req *out, char *msg,
                    size_t msglen, const char **param)
{
    memset(out, 0, sizeof *out);
    *param = NULL;
    msg[0] = '\0';
    int rc = -1;
    if (!json_is_object(body))
        FAIL(NULL, "the body must be a JSON object");
    const json_t *model = json_object_get(body, "model");
    if (!json_is_string(model) || json_string_length(model) == 0)
        FAIL("model", "model must be a non-empty string");
    out->model = strdup(json_string_value(model));
    const json_t *in = json_object_get(body, "input");
    if (!in)
        FAIL("input", "input is required");
    *param = "input"; /* what inputs_of refuses (fail: not when memory ran out) */
    GPS_TRY(inputs_of(in, ctx_len, &out->input, msg, msglen));
    *param = NULL;
    const json_t *ef = json_object_get(body, "encoding_format");
    if (ef && !json_is_null(ef)) {
        const char *s = json_string_value(ef);
        if (!s || (strcmp(s, "float") != 0 && strcmp(s, "base64") != 0))
            FAIL("encoding_format", "encoding_format must be \"float\" or \"base64\"");
        out->base64 = strcmp(s, "base64") == 0;
    }
    const json_t *dim = json_object_get(body, "dimensions");
    if (dim && !json_is_null(dim)) {
        if (!json_is_integer(dim) || json_integer_value(dim) < 1)
            FAIL("dimensions", "dimensions must be a positive integer");
        out->dimensions = json_integer_value(dim);
    }
    const json_t *user = json_object_get(body, "user");
    if (user && !json_is_null(user)) {
        if (!json_is_string(user))
            FAIL("user", "user must be a string");
        out->user = strdup(json_string_value(user));
    }
    if (!out->model || (user && !json_is_null(user) && !out->user))
        GPS_FAIL_OOM();
    return 0;
fail:
    gps_embed_req_clear(out);
    if (rc == GPS_PARSE_OOM)
        *param = NULL;
    return rc;
}

int gps_embed_response(const gps_embed_req *req, const char *model, const json_t *vecs,
                       long long prompt_tokens, json_t **out, char *msg, size_t msglen,
                       const char **param)
{
    json_t *data = json_array();
    int rc = -1;
    *out = NULL;
    *param = NULL;
    size_t n = json_array_size(req->input);
    for (size_t i = 0; data && i < n; i++) {
        const char *b64 = json_string_value(json_array_get(vecs, i));
        size_t len = 0;
        unsigned char *raw = b64 ? gp_base64_decode(b64, strlen(b64), &len) : NULL;
        if (!raw || len == 0 || len % 4 != 0) {
            free(raw);
            FAIL(NULL, "the agent sent no valid embedding for input %zu", i);
        }
        long long dim = (long long)(len / 4);
        if (req->dimensions > 0 && req->dimensions != dim) {
            free(raw);
            FAIL("dimensions", "dimensions %lld is not supported: model '%s' gives %lld "
                 "(only its own length is)", req->dimensions, model, dim);
        }
        json_t *e;
        if (req->base64) {
            e = json_string(b64);
        } else {
            e = json_array();
            for (long long k = 0; e && k < dim; k++) {
                float f;
                memcpy(&f, raw + k * 4, 4);
                /* A number lost would hand back a shorter vector. */
                if (json_array_append_new(e, json_real((double)f)) < 0) {
                    json_decref(e);
                    e = NULL;
                }
            }
        }
        free(raw);
        if (!e || json_array_append_new(data, json_pack("{s:s,s:I,s:o}", "object", "embedding",
                                                        "index", (json_int_t)i, "embedding",
                                                        e)) < 0)
            GPS_FAIL_OOM();
    }
    if (!data)
        GPS_FAIL_OOM();
    *out = json_pack("{s:s,s:o,s:s,s:{s:I,s:I}}", "object", "list", "data", data, "model",
                     model, "usage", "prompt_tokens", (json_int_t)prompt_tokens, "total_tokens",
                     (json_int_t)prompt_tokens);
    if (!*out)
        return gps_parse_oom(msg, msglen); /* json_pack freed data ("o") */
    return 0;
fail:
    json_decref(data);
    return rc;
}
