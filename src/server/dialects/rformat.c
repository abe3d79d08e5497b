/*
 * rformat: structured-output request fields. Interface in rformat.h.
 */
#include "rformat.h"

#include <gpupool/engine.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_util.h"
#include "server/dialects/reqcheck.h"

/* OpenAI's rule for a format's name: 1 to 64 of [a-zA-Z0-9_-]. */
static bool name_ok(const char *n)
{
    size_t len = n ? strlen(n) : 0;
    if (len == 0 || len > 64)
        return false;
    for (const char *p = n; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
              (*p >= '0' && *p <= '9') || *p == '_' || *p == '-'))
            return false;
    return true;
}

/* Shared by both dialects: where is the part of the request that holds
 * name/schema/strict (chat: response_format.json_schema; Responses:
 * text.format itself), and what to call it in messages. */
static int check_schema(const json_t *js, const char *where, json_t **out, char *msg,
                        size_t msglen)
{
    if (!json_is_object(js)) {
        snprintf(msg, msglen, "'%s' must be an object with 'name' and 'schema'", where);
        return -1;
    }
    const json_t *name = json_object_get(js, "name");
    const json_t *schema = json_object_get(js, "schema");
    const json_t *strict = json_object_get(js, "strict");
    const json_t *desc = json_object_get(js, "description");
    if (!name_ok(json_string_value(name))) {
        snprintf(msg, msglen, "'%s.name' must be 1 to 64 letters, digits, '_' or '-'", where);
        return -1;
    }
    if (strict && !json_is_boolean(strict) && !json_is_null(strict)) {
        snprintf(msg, msglen, "'%s.strict' must be a boolean", where);
        return -1;
    }
    if (desc && !json_is_string(desc) && !json_is_null(desc)) {
        snprintf(msg, msglen, "'%s.description' must be a string", where);
        return -1;
    }
    if (schema && !json_is_object(schema)) {
        snprintf(msg, msglen, "'%s.schema' must be an object", where);
        return -1;
    }
    /* No schema: any JSON value ({} accepts everything). */
    json_t *sc = schema ? json_incref((json_t *)schema) : json_object();
    /* gp_json_dumps: jansson's dump can drop a key and succeed when an
     * allocation fails, and the schema checked would not be the client's
     * (a 400 for a keyword it did not send, or none for one it did). */
    char *text = sc ? gp_json_dumps(sc) : NULL;
    char err[256];
    gpe_status st = text ? gpe_schema_check(text, err, sizeof err) : GPE_ERR_NOMEM;
    free(text);
    if (st != GPE_OK) {
        json_decref(sc);
        /* The server's memory, not the schema: no 400 naming it. text is
         * our own dump of a JSON value, so "not JSON" (GPE_ERR_ARG) is the
         * compiler's loader running out of memory too. */
        if (st == GPE_ERR_NOMEM || st == GPE_ERR_ARG)
            return gps_parse_oom(msg, msglen);
        snprintf(msg, msglen, "'%s.schema': %s", where, err);
        return -1;
    }
    json_t *inner = json_pack("{s:O,s:o,s:b}", "name", name, "schema", sc, "strict",
                              json_is_true(strict));
    /* The description guides the model: without memory for it, no format
     * rather than a different one. */
    if (inner && json_is_string(desc) &&
        json_object_set(inner, "description", (json_t *)desc) < 0) {
        json_decref(inner);
        inner = NULL;
    }
    *out = inner ? json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", inner) : NULL;
    if (!*out)
        return gps_parse_oom(msg, msglen);
    return 0;
}

static int by_type(const json_t *obj, const json_t *js, const char *where, json_t **out,
                   char *msg, size_t msglen)
{
    *out = NULL;
    if (!obj || json_is_null(obj))
        return 0;
    const char *t = json_string_value(json_object_get(obj, "type"));
    if (!json_is_object(obj) || !t) {
        snprintf(msg, msglen, "'%s' must be an object with a 'type'", where);
        return -1;
    }
    if (!strcmp(t, "text"))
        return 0;
    if (!strcmp(t, "json_object")) {
        *out = json_pack("{s:s}", "type", "json_object");
        if (!*out)
            return gps_parse_oom(msg, msglen);
        return 0;
    }
    if (!strcmp(t, "json_schema"))
        return check_schema(js, js == obj ? where : "response_format.json_schema", out, msg,
                            msglen);
    snprintf(msg, msglen, "'%s.type' must be \"text\", \"json_object\" or \"json_schema\"",
             where);
    return -1;
}

int gps_rformat_chat(const json_t *rf, json_t **out, char *msg, size_t msglen)
{
    return by_type(rf, json_object_get(rf, "json_schema"), "response_format", out, msg,
                   msglen);
}

int gps_rformat_responses(const json_t *fmt, json_t **out, char *msg, size_t msglen)
{
    return by_type(fmt, fmt, "text.format", out, msg, msglen);
}
