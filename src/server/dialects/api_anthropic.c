/* api_anthropic: see api_anthropic.h. */
#include "server/dialects/api_anthropic.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "common/gp_json.h"
#include "common/gp_log.h"
#include "common/gp_stop.h"
#include "server/dialects/rformat.h"
#include "common/gp_util.h"
#include "server/dialects/anthropic_sse.h"
#include "server/dialects/poolmeta.h"
#include "server/dialects/relay.h"
#include "server/dialects/reqcheck.h"
#include "server/dialects/toolcalls.h"
#include "server/http/errors.h"
#include "server/http/held.h"
#include "server/http/http.h"
#include "server/metrics.h"
#include "server/http/sse.h"
#include "server/http/textcheck.h"
#include "server/http/ids.h"

#define MAX_STOP_SEQUENCES 64
#define MAX_USER_ID 4096
#define BYTES_PER_TOKEN_MAX 8   /* see the header: lower bound of the token count */

/* ------------------------------------------------------------------ */
/* Request parsing                                                     */
/* ------------------------------------------------------------------ */

#define FAIL(...)                                                                              \
    do {                                                                                       \
        snprintf(msg, msglen, __VA_ARGS__);                                                    \
        goto fail;                                                                             \
    } while (0)

/* GPS_FAIL_OOM without a param (this dialect names none): expects
 * `int rc = -1;` and a fail label that returns rc, as GPS_TRY does. */
#define FAIL_OOM()                                                                             \
    do {                                                                                       \
        rc = gps_parse_oom(msg, msglen);                                                       \
        goto fail;                                                                             \
    } while (0)


/* Adds a warning for x_pool_meta. -1 when out of memory: the client is
 * told of everything left out, so a warning lost fails the request. */
static int warn(gps_anthropic_req *r, const char *fmt, const char *arg)
{
    char w[256];
    snprintf(w, sizeof w, fmt, arg);
    /* Same warning once. */
    size_t i;
    json_t *e;
    json_array_foreach(r->warnings, i, e) if (strcmp(json_string_value(e), w) == 0) return 0;
    return json_array_append_new(r->warnings, json_string(w));
}

/* Appends sep (unless b is empty) and s[0..n). 0, or -1 out of memory. */
static int sep_append(gp_buf *b, const char *s, size_t n, const char *sep)
{
    if (b->len && sep && gp_buf_append(b, sep, strlen(sep)) < 0)
        return -1;
    return gp_buf_append(b, s, n);
}

/* The text of a tool_result's content (a string or blocks). -1 or
 * GPS_PARSE_OOM with msg. */
static int tool_result_text(const json_t *c, gp_buf *b, const char *where, char *msg,
                            size_t msglen)
{
    if (gps_absent(c))
        return 0;
    if (json_is_string(c)) {
        if (sep_append(b, json_string_value(c), json_string_length(c), "\n") < 0)
            goto oom;
        return 0;
    }
    if (!json_is_array(c)) {
        snprintf(msg, msglen, "%s.content must be a string or an array of blocks", where);
        return -1;
    }
    size_t i;
    json_t *blk;
    json_array_foreach(c, i, blk)
    {
        const char *t = json_string_value(json_object_get(blk, "type"));
        const json_t *tx = json_object_get(blk, "text");
        if (!t || strcmp(t, "text") != 0 || !json_is_string(tx)) {
            snprintf(msg, msglen,
                     "%s.content[%zu]: blocks of type '%.40s' are not supported by this pool "
                     "(text only)",
                     where, i, t ? t : "(none)");
            return -1;
        }
        if (sep_append(b, json_string_value(tx), json_string_length(tx), "\n") < 0)
            goto oom;
    }
    return 0;
oom:
    return gps_parse_oom(msg, msglen);
}

/* A tool_use or tool_result block as text, appended to b (blocks of the
 * text path). 0, or -1 or GPS_PARSE_OOM with msg. */
static int tool_block_text(const json_t *blk, bool use, const char *where, gp_buf *b,
                           char *msg, size_t msglen)
{
    gp_buf tmp;
    gp_buf_init(&tmp);
    int rc = -1;
    if (use) {
        const char *name = json_string_value(json_object_get(blk, "name"));
        const char *id = json_string_value(json_object_get(blk, "id"));
        const json_t *in = json_object_get(blk, "input");
        /* No input: "{}". Input that could not be written (out of memory)
         * must not become "{}": the call would read as made without it;
         * nor lose a key (json_dumps can, and succeed: gp_json_dump_append
         * cannot). */
        if (gp_buf_appendf(&tmp, "[tool_use id=%s name=%s] ", id ? id : "",
                           name ? name : "") < 0 ||
            (in ? gp_json_dump_append(&tmp, in) : gp_buf_append(&tmp, "{}", 2)) < 0)
            goto oom;
    } else {
        const char *id = json_string_value(json_object_get(blk, "tool_use_id"));
        if (gp_buf_appendf(&tmp, "[tool_result id=%s%s]", id ? id : "",
                           json_is_true(json_object_get(blk, "is_error")) ? " error" : "") < 0)
            goto oom;
        if ((rc = tool_result_text(json_object_get(blk, "content"), &tmp, where, msg,
                                   msglen)) < 0)
            goto out;
    }
    if (sep_append(b, tmp.data, tmp.len, "\n") < 0)
        goto oom;
    rc = 0;
    goto out;
oom:
    rc = gps_parse_oom(msg, msglen);
out:
    gp_buf_free(&tmp);
    return rc;
}

/* Render one message's content (string or blocks) into b. -1 or
 * GPS_PARSE_OOM with msg. */
static int content_to_text(gps_anthropic_req *r, const json_t *c, size_t mi, bool system_role,
                           gp_buf *b, char *msg, size_t msglen)
{
    if (json_is_string(c)) {
        if (gp_buf_append(b, json_string_value(c), json_string_length(c)) < 0)
            goto oom;
        return 0;
    }
    if (!json_is_array(c)) {
        snprintf(msg, msglen, "messages.%zu.content: must be a string or an array of content "
                              "blocks", mi);
        return -1;
    }
    size_t i;
    json_t *blk;
    json_array_foreach(c, i, blk)
    {
        char where[64];
        snprintf(where, sizeof where, "messages.%zu.content.%zu", mi, i);
        const char *t = json_string_value(json_object_get(blk, "type"));
        if (!json_is_object(blk) || !t) {
            snprintf(msg, msglen, "%s: a content block must be an object with a 'type'", where);
            return -1;
        }
        if (strcmp(t, "text") == 0) {
            const json_t *tx = json_object_get(blk, "text");
            if (!json_is_string(tx)) {
                snprintf(msg, msglen, "%s.text: must be a string", where);
                return -1;
            }
            if (sep_append(b, json_string_value(tx), json_string_length(tx), "\n") < 0)
                goto oom;
        } else if (!system_role &&
                   (strcmp(t, "tool_use") == 0 || strcmp(t, "tool_result") == 0)) {
            int rc = tool_block_text(blk, strcmp(t, "tool_use") == 0, where, b, msg, msglen);
            if (rc < 0)
                return rc;
        } else if (!system_role &&
                   (strcmp(t, "thinking") == 0 || strcmp(t, "redacted_thinking") == 0)) {
            if (warn(r, "%s blocks in messages are not sent to the model", t) < 0)
                goto oom;
        } else {
            snprintf(msg, msglen,
                     "%s: content blocks of type '%.40s' are not supported by this pool "
                     "(it serves text: text, tool_use and tool_result blocks)",
                     where, t);
            return -1;
        }
    }
    return 0;
oom:
    return gps_parse_oom(msg, msglen);
}

static const char *const known_fields[] = {
    "model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p",
    "top_k", "metadata", "stream", "tools", "tool_choice", "thinking", "x_pool_options",
    "service_tier", "output_config", "output_format", NULL};

/* Structured outputs: `output_config.format` (Anthropic's GA form) or
 * `output_format` (its beta form), both {"type": "json_schema", "schema"}.
 * Brought to the job's OpenAI chat form and checked by the same schema
 * compiler as every dialect (rformat.h): an unsupported keyword is a 400
 * naming it, before any token. The JSON comes back as the text block. */
static int output_format(const json_t *body, gps_anthropic_req *out, char *msg, size_t msglen)
{
    const json_t *oc = json_object_get(body, "output_config");
    const json_t *beta = json_object_get(body, "output_format");
    const char *where = "output_format";
    const json_t *f = beta;
    if (!gps_absent(oc)) {
        if (!json_is_object(oc)) {
            snprintf(msg, msglen, "output_config: must be an object");
            return -1;
        }
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)oc, k, v)
        {
            if (strcmp(k, "format") != 0 &&
                warn(out, "output_config.%.64s is not supported by this pool; ignored", k) < 0)
                return gps_parse_oom(msg, msglen);
        }
        if (!gps_absent(json_object_get(oc, "format"))) {
            if (!gps_absent(beta)) {
                snprintf(msg, msglen, "output_config.format and output_format: give one");
                return -1;
            }
            f = json_object_get(oc, "format");
            where = "output_config.format";
        }
    }
    if (gps_absent(f))
        return 0;
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!json_is_object(f) || !type || strcmp(type, "json_schema") != 0 ||
        !json_is_object(json_object_get(f, "schema"))) {
        snprintf(msg, msglen, "%s: must be {\"type\": \"json_schema\", \"schema\": {...}}",
                 where);
        return -1;
    }
    json_t *rf = json_pack("{s:s, s:{s:s, s:O, s:b}}", "type", "json_schema", "json_schema",
                           "name", "output", "schema", json_object_get(f, "schema"), "strict", 1);
    if (!rf)
        return gps_parse_oom(msg, msglen);
    char why[400];
    int r = gps_rformat_chat(rf, &out->spec.response_format, why, sizeof why);
    json_decref(rf);
    if (r == GPS_PARSE_OOM)
        return gps_parse_oom(msg, msglen);
    if (r < 0) {
        snprintf(msg, msglen, "%s: %s", where, why);
        return -1;
    }
    return 0;
}

/* The tools as text into r->tools_text. 0, or -1 out of memory (the text
 * sizes the prompt's bound: a part left out would understate it). */
static int render_tools(gps_anthropic_req *r, const json_t *tools)
{
    gp_buf b;
    gp_buf_init(&b);
    if (gp_buf_appendf(&b, "# Tools\n\nYou may call the following tools. To call one, answer "
                           "with a JSON object {\"name\": <tool name>, \"input\": "
                           "<arguments>}.\n") < 0)
        goto fail;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        const char *name = json_string_value(json_object_get(t, "name"));
        const char *type = json_string_value(json_object_get(t, "type"));
        const char *desc = json_string_value(json_object_get(t, "description"));
        if (gp_buf_appendf(&b, "\n## %s\n", name ? name : "") < 0 ||
            (type && strcmp(type, "custom") != 0 &&
             gp_buf_appendf(&b, "Built-in tool of type %s.\n", type) < 0) ||
            (desc && gp_buf_appendf(&b, "%s\n", desc) < 0))
            goto fail;
        const json_t *schema = json_object_get(t, "input_schema");
        /* Not json_dumps(JSON_SORT_KEYS): jansson 2.14's sorted dump skips a
         * key whose write ran out of memory and still returns the text. The
         * text only sizes the prompt, so the keys' order does not matter. */
        if (json_is_object(schema) &&
            (gp_buf_appendf(&b, "Input schema: ") < 0 || gp_json_dump_append(&b, schema) < 0 ||
             gp_buf_append(&b, "\n", 1) < 0))
            goto fail;
    }
    r->tools_text = gp_buf_steal(&b);
    return 0;
fail:
    gp_buf_free(&b);
    return -1;
}

/* Anthropic tools -> OpenAI function tools (input_schema -> parameters,
 * strict as given: structured outputs' strict tool use).
 * Built-in tools (a type other than custom) have no schema: they become
 * functions taking any object, described by their type. */
json_t *gps_anthropic_tools_to_openai(const json_t *tools)
{
    json_t *out = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        const char *name = json_string_value(json_object_get(t, "name"));
        const char *type = json_string_value(json_object_get(t, "type"));
        const json_t *desc = json_object_get(t, "description");
        const json_t *schema = json_object_get(t, "input_schema");
        const json_t *strict = json_object_get(t, "strict");
        char d[128] = "";
        if (!json_is_string(desc) && type && strcmp(type, "custom") != 0)
            snprintf(d, sizeof d, "Built-in tool of type %.64s.", type);
        /* Any part missing (out of memory) fails the whole list: a tool
         * without its schema or description is not the tool offered. */
        json_t *fn = json_pack("{s:s}", "name", name ? name : "");
        if (!fn || !out ||
            (json_is_string(desc) && json_object_set(fn, "description", (json_t *)desc) < 0) ||
            (d[0] && json_object_set_new(fn, "description", json_string(d)) < 0) ||
            json_object_set_new(fn, "parameters", json_is_object(schema)
                                                      ? json_deep_copy(schema)
                                                      : json_pack("{s:s}", "type", "object")) <
                0 ||
            (json_is_boolean(strict) && json_object_set(fn, "strict", (json_t *)strict) < 0)) {
            json_decref(fn);
            json_decref(out);
            return NULL;
        }
        if (json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function",
                                                 fn)) < 0) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

json_t *gps_anthropic_tool_choice_to_openai(const json_t *tc)
{
    const char *t = json_string_value(json_object_get(tc, "type"));
    if (!t || strcmp(t, "auto") == 0)
        return json_string("auto");
    if (strcmp(t, "any") == 0)
        return json_string("required");
    if (strcmp(t, "none") == 0)
        return json_string("none");
    const char *name = json_string_value(json_object_get(tc, "name"));
    if (strcmp(t, "tool") == 0 && name)
        return json_pack("{s:s,s:{s:s}}", "type", "function", "function", "name", name);
    return json_string("auto");
}

/* Append an OpenAI message; consecutive plain messages of the same role
 * are joined (blank line between), as on the text path. tool_calls is
 * stolen. 0, or -1 out of memory. */
static int oai_append(json_t *arr, const char *role, const char *text, size_t len,
                      json_t *tool_calls)
{
    json_t *last = json_array_get(arr, json_array_size(arr) - 1);
    const char *lr = json_string_value(json_object_get(last, "role"));
    const json_t *lc = json_object_get(last, "content");
    if (!tool_calls && lr && strcmp(lr, role) == 0 && json_is_string(lc) &&
        !json_object_get(last, "tool_calls") && strcmp(role, "tool") != 0) {
        gp_buf b;
        gp_buf_init(&b);
        int rc = -1;
        if (gp_buf_append(&b, json_string_value(lc), json_string_length(lc)) == 0 &&
            sep_append(&b, text, len, "\n\n") == 0)
            rc = json_object_set_new(last, "content", json_stringn(b.data ? b.data : "", b.len));
        gp_buf_free(&b);
        return rc;
    }
    json_t *m = tool_calls ? json_pack("{s:s,s:o,s:o}", "role", role, "content",
                                       len ? json_stringn(text, len) : json_null(),
                                       "tool_calls", tool_calls)
                           : json_pack("{s:s,s:s%}", "role", role, "content", text ? text : "",
                                       len);
    return json_array_append_new(arr, m);
}

/* An assistant's tool_use block as an OpenAI tool call, appended to
 * *calls (made on the first). 0, or -1 out of memory. */
static int oai_tool_call(const json_t *blk, json_t **calls)
{
    const char *id = json_string_value(json_object_get(blk, "id"));
    const char *name = json_string_value(json_object_get(blk, "name"));
    const json_t *in = json_object_get(blk, "input");
    /* no input: "{}" (a json_object() made here leaked); input that could
     * not be written is no "{}" but out of memory, and no input with a key
     * left out either (json_dumps can drop one and succeed) */
    gp_buf args;
    gp_buf_init(&args);
    int rc = -1;
    if ((in ? gp_json_dump_append(&args, in) : gp_buf_append(&args, "{}", 2)) < 0 ||
        (!*calls && !(*calls = json_array())))
        goto out;
    rc = json_array_append_new(*calls, json_pack("{s:s,s:s,s:{s:s,s:s%}}", "id", id ? id : "",
                                                 "type", "function", "function", "name",
                                                 name ? name : "", "arguments", args.data,
                                                 args.len));
out:
    gp_buf_free(&args);
    return rc;
}

/* A user's tool_result block as a role "tool" message. 0, or -1 out of
 * memory. */
static int oai_tool_result(const json_t *blk, json_t *out)
{
    const char *id = json_string_value(json_object_get(blk, "tool_use_id"));
    gp_buf r, body;
    gp_buf_init(&r);
    gp_buf_init(&body);
    char ignored[16]; /* the content was validated: only out of memory fails */
    int rc = -1;
    if (tool_result_text(json_object_get(blk, "content"), &body, "", ignored, sizeof ignored) <
            0 ||
        (json_is_true(json_object_get(blk, "is_error")) && gp_buf_appendf(&r, "Error: ") < 0) ||
        gp_buf_append(&r, body.data ? body.data : "", body.len) < 0)
        goto out;
    rc = json_array_append_new(out, json_pack("{s:s,s:s,s:s%}", "role", "tool", "tool_call_id",
                                              id ? id : "", "content", r.data ? r.data : "",
                                              r.len));
out:
    gp_buf_free(&body);
    gp_buf_free(&r);
    return rc;
}

/* One message's blocks in OpenAI form onto out. 0, or -1 out of memory. */
static int oai_blocks(const json_t *c, const char *role, json_t *out)
{
    bool user = strcmp(role, "user") == 0;
    gp_buf text;
    gp_buf_init(&text);
    json_t *calls = NULL;
    size_t k;
    json_t *blk;
    json_array_foreach(c, k, blk)
    {
        const char *t = json_string_value(json_object_get(blk, "type"));
        if (!t)
            continue;
        if (strcmp(t, "text") == 0) {
            const json_t *tx = json_object_get(blk, "text");
            if (sep_append(&text, json_string_value(tx), json_string_length(tx), "\n") < 0)
                goto fail;
        } else if (!user && strcmp(t, "tool_use") == 0) {
            if (oai_tool_call(blk, &calls) < 0)
                goto fail;
        } else if (user && strcmp(t, "tool_result") == 0) {
            if (oai_tool_result(blk, out) < 0)
                goto fail;
        }
    }
    int rc = 0;
    if (calls)
        rc = oai_append(out, "assistant", text.data, text.len, calls); /* calls stolen */
    else if (text.len)
        rc = oai_append(out, role, text.data, text.len, NULL);
    gp_buf_free(&text);
    return rc;
fail:
    json_decref(calls);
    gp_buf_free(&text);
    return -1;
}

/* The conversation in OpenAI form for agents that take tools: assistant
 * tool_use blocks -> tool_calls, user tool_result blocks -> role "tool"
 * messages (before the user's own text of that turn). System entries are
 * skipped (merged into the system prompt by the text path). The blocks
 * were validated by content_to_text already. NULL when out of memory (a
 * message missing would be another conversation). */
static json_t *openai_messages(const json_t *m)
{
    json_t *out = json_array();
    if (!out)
        return NULL;
    size_t i;
    json_t *e;
    json_array_foreach(m, i, e)
    {
        const char *role = json_string_value(json_object_get(e, "role"));
        const json_t *c = json_object_get(e, "content");
        if (!role || strcmp(role, "system") == 0)
            continue;
        int rc = json_is_string(c) ? oai_append(out, role, json_string_value(c),
                                                json_string_length(c), NULL)
                                   : oai_blocks(c, role, out);
        if (rc < 0) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

static int parse_model_max_tokens(const json_t *body, bool count_only, gps_anthropic_req *out,
                                  char *msg, size_t msglen)
{
    gps_job_spec *s = &out->spec;
    const json_t *model = json_object_get(body, "model");
    if (gps_absent(model))
        FAIL("model: field required");
    if (!json_is_string(model) || json_string_length(model) == 0 ||
        json_string_length(model) > GPS_MAX_MODEL_NAME)
        FAIL("model: must be a non-empty string of at most %d bytes", GPS_MAX_MODEL_NAME);
    s->model = strdup(json_string_value(model));

    const json_t *mt = json_object_get(body, "max_tokens");
    if (gps_absent(mt)) {
        if (!count_only)
            FAIL("max_tokens: field required");
        s->max_tokens = 1;
    } else {
        if (!json_is_integer(mt))
            FAIL("max_tokens: must be an integer");
        json_int_t v = json_integer_value(mt);
        if (v < 1)
            FAIL("max_tokens: must be at least 1 (got %lld)", (long long)v);
        s->max_tokens = v > GPS_MAX_TOKENS_LIMIT ? GPS_MAX_TOKENS_LIMIT : v;
        if (count_only)
            s->max_tokens = 1;
    }
    return 0;
fail:
    return -1;
}

/* system: string or text blocks */
static int parse_system(const json_t *body, gp_buf *sys, char *msg, size_t msglen)
{
    int rc = -1;
    const json_t *system = json_object_get(body, "system");
    if (!gps_absent(system)) {
        if (json_is_string(system)) {
            if (gp_buf_append(sys, json_string_value(system), json_string_length(system)) < 0)
                FAIL_OOM();
        } else if (json_is_array(system)) {
            size_t i;
            json_t *blk;
            json_array_foreach(system, i, blk)
            {
                const char *t = json_string_value(json_object_get(blk, "type"));
                const json_t *tx = json_object_get(blk, "text");
                if (!t || strcmp(t, "text") != 0 || !json_is_string(tx))
                    FAIL("system.%zu: system blocks must be {\"type\":\"text\",\"text\":string}",
                         i);
                if (sep_append(sys, json_string_value(tx), json_string_length(tx), "\n\n") < 0)
                    FAIL_OOM();
            }
        } else {
            FAIL("system: must be a string or an array of text blocks");
        }
    }
    return 0;
fail:
    return rc;
}

/* One merged turn {role, content} onto messages. 0, or -1 out of memory. */
static int turn_append(json_t *messages, const char *role, const gp_buf *text)
{
    return json_array_append_new(messages, json_pack("{s:s,s:s%}", "role", role, "content",
                                                     text->data ? text->data : "", text->len));
}

/* messages: consecutive turns of one role merge into one message. sys stays
 * the caller's, given to out only once every system entry has joined it. */
static int parse_messages(const json_t *body, gps_anthropic_req *out, gp_buf *sys, char *msg,
                          size_t msglen)
{
    gps_job_spec *s = &out->spec;
    int rc = -1;
    gp_buf cur;
    gp_buf_init(&cur);
    const json_t *m = json_object_get(body, "messages");
    if (gps_absent(m))
        FAIL("messages: field required");
    if (!json_is_array(m))
        FAIL("messages: must be an array");
    s->messages = json_array();
    if (!s->messages)
        FAIL_OOM();
    const char *cur_role = NULL;
    size_t i;
    json_t *e;
    json_array_foreach(m, i, e)
    {
        if (!json_is_object(e))
            FAIL("messages.%zu: must be an object", i);
        const char *role = json_string_value(json_object_get(e, "role"));
        if (!role)
            FAIL("messages.%zu.role: field required", i);
        bool is_system = strcmp(role, "system") == 0;
        if (!is_system && strcmp(role, "user") != 0 && strcmp(role, "assistant") != 0)
            FAIL("messages.%zu.role: must be 'user' or 'assistant' (got '%.40s')", i, role);
        const json_t *c = json_object_get(e, "content");
        if (gps_absent(c))
            FAIL("messages.%zu.content: field required", i);
        gp_buf text;
        gp_buf_init(&text);
        int crc = content_to_text(out, c, i, is_system, &text, msg, msglen);
        if (crc < 0) {
            gp_buf_free(&text);
            rc = crc;
            goto fail;
        }
        out->prompt_bytes += text.len;
        /* Every append below is checked: a turn (or part of one) lost to a
         * failed allocation would have the model answer another conversation. */
        int arc;
        if (is_system) {
            /* Mid-conversation system entries join the system prompt. */
            arc = sep_append(sys, text.data ? text.data : "", text.len, "\n\n");
        } else if (cur_role && strcmp(cur_role, role) == 0) {
            arc = sep_append(&cur, text.data ? text.data : "", text.len, "\n\n");
        } else {
            arc = cur_role ? turn_append(s->messages, cur_role, &cur) : 0;
            gp_buf_free(&cur);
            gp_buf_init(&cur);
            if (arc == 0)
                arc = gp_buf_append(&cur, text.data ? text.data : "", text.len);
            cur_role = strcmp(role, "user") == 0 ? "user" : "assistant";
        }
        gp_buf_free(&text);
        if (arc < 0)
            FAIL_OOM();
    }
    if (cur_role && turn_append(s->messages, cur_role, &cur) < 0)
        FAIL_OOM();
    if (json_array_size(s->messages) == 0)
        FAIL("messages: at least one user or assistant message is required");
    gp_buf_free(&cur);
    return 0;
fail:
    gp_buf_free(&cur);
    return rc;
}

static int parse_sampling(const json_t *body, gps_anthropic_req *out, char *msg, size_t msglen)
{
    int rc = -1;
    gps_job_spec *s = &out->spec;
    if (gps_check_number(body, "temperature", "temperature:", 0, 1, &s->temperature, msg,
                         msglen) < 0 ||
        gps_check_number(body, "top_p", "top_p:", 0, 1, &s->top_p, msg,
                         msglen) < 0)
        goto fail;
    const json_t *tk = json_object_get(body, "top_k");
    if (!gps_absent(tk)) {
        if (!json_is_integer(tk) || json_integer_value(tk) < 0 ||
            json_integer_value(tk) > 1000000)
            FAIL("top_k: must be a non-negative integer");
        s->top_k = json_integer_value(tk);
    }

    const json_t *stops = json_object_get(body, "stop_sequences");
    if (!gps_absent(stops)) {
        if (!json_is_array(stops) || json_array_size(stops) > MAX_STOP_SEQUENCES)
            FAIL("stop_sequences: must be an array of at most %d strings", MAX_STOP_SEQUENCES);
        out->stop_sequences = json_array();
        if (!out->stop_sequences)
            FAIL_OOM();
        size_t i;
        json_t *e;
        json_array_foreach(stops, i, e)
        {
            if (!json_is_string(e) || json_string_length(e) == 0 ||
                json_string_length(e) > GPS_MAX_STOP_LEN)
                FAIL("stop_sequences.%zu: must be a non-empty string of at most %d bytes", i,
                     GPS_MAX_STOP_LEN);
            /* A sequence lost would let the reply run past it. */
            if (json_array_append_new(out->stop_sequences, json_string(json_string_value(e))) <
                0)
                FAIL_OOM();
        }
        if (json_array_size(out->stop_sequences) == 0) {
            json_decref(out->stop_sequences);
            out->stop_sequences = NULL;
        }
        /* The agent gets them too: it (or its upstream) stops before the
         * string and reports usage and which string it was (end event
         * stop_sequence). The relay still scans the text for agents that
         * do not stop on them. */
        if (out->stop_sequences && !(s->stop = json_deep_copy(out->stop_sequences)))
            FAIL_OOM();
    }
    return 0;
fail:
    return rc;
}

static int parse_metadata_stream(const json_t *body, bool count_only, gps_anthropic_req *out,
                                 char *msg, size_t msglen)
{
    int rc = -1;
    gps_job_spec *s = &out->spec;
    const json_t *md = json_object_get(body, "metadata");
    if (!gps_absent(md)) {
        if (!json_is_object(md))
            FAIL("metadata: must be an object");
        const json_t *uid = json_object_get(md, "user_id");
        if (!gps_absent(uid)) {
            if (!json_is_string(uid) || json_string_length(uid) > MAX_USER_ID)
                FAIL("metadata.user_id: must be a string of at most %d bytes", MAX_USER_ID);
            /* scheduler affinity key: not dropped silently */
            if (json_string_length(uid) > 0 && !(s->user = strdup(json_string_value(uid))))
                FAIL_OOM();
        }
    }

    const json_t *stream = json_object_get(body, "stream");
    if (!gps_absent(stream)) {
        if (!json_is_boolean(stream))
            FAIL("stream: must be a boolean");
        out->stream = json_is_true(stream) && !count_only;
    }
    /* message_start carries usage.input_tokens: the agent must know the
     * prompt's size before the first token (issue 26 item 4). */
    s->prompt_tokens_first = out->stream;
    return 0;
fail:
    return rc;
}

/* tool_choice is checked before tools, so it is the error named when both
 * are wrong. */
static int parse_tools(const json_t *body, gps_anthropic_req *out, char *msg, size_t msglen)
{
    int rc = -1;
    const json_t *tools = json_object_get(body, "tools");
    const json_t *tc = json_object_get(body, "tool_choice");
    if (!gps_absent(tc) && !json_is_object(tc))
        FAIL("tool_choice: must be an object");
    const char *tc_type = json_string_value(json_object_get(tc, "type"));
    if (!gps_absent(tc)) {
        /* Anything else used to become "auto" silently. */
        if (!tc_type || (strcmp(tc_type, "auto") != 0 && strcmp(tc_type, "any") != 0 &&
                         strcmp(tc_type, "tool") != 0 && strcmp(tc_type, "none") != 0))
            FAIL("tool_choice.type: must be 'auto', 'any', 'tool' or 'none'");
        const json_t *tcn = json_object_get(tc, "name");
        if (strcmp(tc_type, "tool") == 0 &&
            (!json_is_string(tcn) || json_string_length(tcn) == 0 ||
             json_string_length(tcn) > 256))
            FAIL("tool_choice.name: a 'tool' choice needs the tool's name (1 to 256 bytes)");
    }
    if (!gps_absent(tools)) {
        if (!json_is_array(tools))
            FAIL("tools: must be an array");
        size_t i;
        json_t *e;
        json_array_foreach(tools, i, e)
        {
            if (!json_is_object(e) || !json_is_string(json_object_get(e, "name")))
                FAIL("tools.%zu: a tool must be an object with a string 'name'", i);
            const json_t *schema = json_object_get(e, "input_schema");
            if (!gps_absent(schema) && !json_is_object(schema))
                FAIL("tools.%zu.input_schema: must be an object", i);
            const json_t *strict = json_object_get(e, "strict");
            if (!gps_absent(strict) && !json_is_boolean(strict))
                FAIL("tools.%zu.strict: must be a boolean", i);
        }
        if (json_array_size(tools) > 0 && !(tc_type && strcmp(tc_type, "none") == 0)) {
            /* The text form only sizes the prompt bound: agents render the
             * structured tools with their own chat template. */
            if (render_tools(out, tools) < 0)
                FAIL_OOM();
            out->prompt_bytes += strlen(out->tools_text);
            out->tools = gps_anthropic_tools_to_openai(tools);
            out->tool_choice = gps_anthropic_tool_choice_to_openai(tc);
            out->tool_messages = openai_messages(json_object_get(body, "messages"));
            if (!out->tools || !out->tool_choice || !out->tool_messages)
                FAIL_OOM();
        }
    }
    return 0;
fail:
    return rc;
}

static int parse_thinking(const json_t *body, gps_anthropic_req *out, char *msg, size_t msglen)
{
    int rc = -1;
    const json_t *th = json_object_get(body, "thinking");
    if (!gps_absent(th)) {
        if (!json_is_object(th))
            FAIL("thinking: must be an object");
        const char *tt = json_string_value(json_object_get(th, "type"));
        if ((!tt || strcmp(tt, "disabled") != 0) &&
            warn(out, "thinking (%s) is not supported by this pool; answered without it",
                 tt ? tt : "?") < 0)
            FAIL_OOM();
    }
    return 0;
fail:
    return rc;
}

/* 0, or -1 out of memory. */
static int warn_unknown_fields(const json_t *body, gps_anthropic_req *out)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)body, k, v)
    {
        bool known = false;
        for (size_t f = 0; known_fields[f]; f++)
            known = known || strcmp(k, known_fields[f]) == 0;
        if (!known && warn(out, "unknown field '%.64s' ignored", k) < 0)
            return -1;
    }
    return 0;
}

/* The checks run in the order of the sections above: with several problems
 * in one body, the first section's error is the one reported. */
int gps_anthropic_parse(const json_t *body, bool count_only, gps_anthropic_req *out, char *msg,
                        size_t msglen)
{
    memset(out, 0, sizeof *out);
    out->count_only = count_only;
    gps_job_spec *s = &out->spec;
    gps_spec_defaults(s, "anthropic");
    s->kind = GPS_JOB_CHAT;
    msg[0] = '\0';
    int rc = -1;
    gp_buf sys;
    gp_buf_init(&sys);
    out->warnings = json_array();
    if (!out->warnings)
        FAIL_OOM();
    if (!json_is_object(body))
        FAIL("request body must be a JSON object");

    GPS_TRY(parse_model_max_tokens(body, count_only, out, msg, msglen));
    GPS_TRY(parse_system(body, &sys, msg, msglen));
    GPS_TRY(parse_messages(body, out, &sys, msg, msglen));
    out->prompt_bytes += sys.len;
    if (sys.len)
        out->system = gp_buf_steal(&sys);
    else
        gp_buf_free(&sys); /* "system": "" leaves an empty buffer behind */

    GPS_TRY(parse_sampling(body, out, msg, msglen));
    GPS_TRY(parse_metadata_stream(body, count_only, out, msg, msglen));
    GPS_TRY(parse_tools(body, out, msg, msglen));
    GPS_TRY(parse_thinking(body, out, msg, msglen));
    GPS_TRY(output_format(body, out, msg, msglen));

    const char *param = NULL;
    GPS_TRY(gps_pool_options_parse(json_object_get(body, "x_pool_options"), s, msg, msglen,
                                   &param));

    if (warn_unknown_fields(body, out) < 0 || !s->model)
        FAIL_OOM();
    return 0;
fail:
    gp_buf_free(&sys);
    gps_anthropic_req_clear(out);
    return rc;
}

void gps_anthropic_req_clear(gps_anthropic_req *r)
{
    gps_job_spec_clear(&r->spec);
    free(r->system);
    free(r->tools_text);
    json_decref(r->stop_sequences);
    json_decref(r->warnings);
    json_decref(r->tools);
    json_decref(r->tool_choice);
    json_decref(r->tool_messages);
    r->tools = r->tool_choice = r->tool_messages = NULL;
    r->system = r->tools_text = NULL;
    r->stop_sequences = r->warnings = NULL;
}

long long gps_anthropic_tokens_lower_bound(size_t bytes)
{
    return (long long)(bytes / BYTES_PER_TOKEN_MAX);
}

int gps_anthropic_assemble(gps_anthropic_req *r, long long context_length, bool tools_supported,
                           char *msg, size_t msglen)
{
    gps_job_spec *s = &r->spec;
    gp_buf sys;
    gp_buf_init(&sys);
    if (r->system && gp_buf_append(&sys, r->system, strlen(r->system)) < 0)
        goto oom;
    if (r->tools) {
        if (tools_supported) {
            /* Structured: the agent passes them on (openai) or renders them
             * with its template (gguf); tool blocks go as tool messages. */
            json_decref(s->messages);
            s->messages = r->tool_messages;
            s->tools = r->tools;
            s->tool_choice = r->tool_choice;
            r->tool_messages = r->tools = r->tool_choice = NULL;
        } else if (warn(r, "tools were ignored: the chat template of model '%.100s' does not "
                           "take tools (no agent reports supports_tools)", s->model) < 0) {
            goto oom;
        }
    }
    if (sys.len) {
        json_t *m = json_pack("{s:s,s:s%}", "role", "system", "content", sys.data, sys.len);
        if (!m || json_array_insert_new(s->messages, 0, m) < 0)
            goto oom;
    }
    gp_buf_free(&sys);
    if (context_length > 0) {
        long long lb = gps_anthropic_tokens_lower_bound(r->prompt_bytes);
        if (lb >= context_length) {
            snprintf(msg, msglen,
                     "prompt is too long: at least %lld tokens (estimated from %zu bytes) > "
                     "%lld tokens, the context length of model '%.100s'",
                     lb, r->prompt_bytes, context_length, s->model);
            return -1;
        }
        if (!r->count_only && s->max_tokens > context_length - lb) {
            char w[400];
            snprintf(w, sizeof w,
                     "max_tokens %lld was clamped to %lld: model '%.100s' has a context of "
                     "%lld tokens and the prompt takes at least %lld",
                     s->max_tokens, context_length - lb, s->model, context_length, lb);
            if (json_array_append_new(r->warnings, json_string(w)) < 0)
                return gps_parse_oom(msg, msglen); /* a clamp is never silent */
            s->max_tokens = context_length - lb;
        }
    }
    return 0;
oom:
    gp_buf_free(&sys);
    return gps_parse_oom(msg, msglen);
}

/* ------------------------------------------------------------------ */
/* Stop reasons, response bodies                                       */
/* ------------------------------------------------------------------ */

const char *gps_anthropic_stop_reason(const char *finish_reason)
{
    if (finish_reason && strcmp(finish_reason, "tool_calls") == 0)
        return "tool_use";
    return finish_reason && strcmp(finish_reason, "length") == 0 ? "max_tokens" : "end_turn";
}

json_t *gps_anthropic_message(const char *id, const char *model, const char *text,
                              const char *stop_reason, const char *stop_sequence,
                              long long input_tokens, long long output_tokens, json_t *meta)
{
    json_t *content = json_array();
    bool whole = json_array_append_new(
                     content, json_pack("{s:s,s:s}", "type", "text", "text", text ? text : "")) ==
                 0;
    json_t *o = json_pack("{s:s,s:s,s:s,s:o,s:s}", "id", id, "type", "message", "role",
                          "assistant", "content", content, "model", model);
    /* Whole or NULL: a message without its content, stop or usage is not
     * the model's reply. */
    if (!o || !whole ||
        json_object_set_new(o, "stop_reason",
                            stop_reason ? json_string(stop_reason) : json_null()) < 0 ||
        json_object_set_new(o, "stop_sequence",
                            stop_sequence ? json_string(stop_sequence) : json_null()) < 0 ||
        json_object_set_new(o, "usage", gps_anthropic_usage(input_tokens, output_tokens)) < 0)
        goto fail;
    return gps_pool_meta_attach(o, meta);
fail:
    json_decref(meta);
    json_decref(o);
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Handlers                                                            */
/* ------------------------------------------------------------------ */


/* One in-flight client request, subscriber of its job (as in api_openai:
 * freed when the reply is complete or the client went away). */
typedef struct an_stream {
    gps_relay rl;                  /* the client side (relay.h) */
    gps_relay_ctx *ctx;
    bool stream, count_only;
    gps_an_out out;                /* the stream's bytes (anthropic_sse.h): id, model, blocks */
    json_t *stops;                 /* owned, may be NULL */
    json_t *warnings;              /* owned */
    /* The job's text is the only copy of the reply's text: the relay's
     * cursor (relay.h) says how much of it was rendered, and of that
     * job->text[0..emitted) went to the client (streaming) or is the
     * body's text (not streaming); the rest up to the cursor is held back
     * while it may begin a stop sequence. */
    size_t emitted;
    gps_tool_calls calls;          /* tool calls relayed so far */
} an_stream;

static void on_job_event(gps_job *job, gps_event_type type, json_t *ev, void *arg);
static bool render_text(void *arg, gps_job *job, const char *text, size_t n);
static bool render_event(void *arg, gps_job *job, gps_event_type type, json_t *ev);

static void stream_free(void *arg)
{
    an_stream *st = arg;
    gps_relay_clear(&st->rl);
    json_decref(st->stops);
    json_decref(st->warnings);
    gps_tool_calls_free(&st->calls);
    gps_an_out_clear(&st->out);
    free(st);
}

static const gps_relay_ops OPS = {
    .api = "anthropic",
    .dialect = GPS_DIALECT_ANTHROPIC,
    .error_event = "error",
    .on_event = on_job_event,
    .free = stream_free,
    .render_text = render_text,
    .render_event = render_event,
};

/* NULL: no meta (gps_pool_meta_shown) or, as *oom tells, out of memory (a
 * meta with a warning left out would hide what the request lost). */
static json_t *pool_meta(an_stream *st, gps_job *job, bool with_warnings, bool *oom)
{
    /* The one x_pool_meta of every dialect (api_openai.h): it names the
     * model that served at the end, a fallback taken at failover too. This
     * request's own warnings (parse, submit) join its list once each. */
    json_t *meta = gps_pool_meta(job);
    *oom = !meta && gps_pool_meta_shown(job);
    if (!meta)
        return NULL;
    if (!with_warnings) {
        json_object_del(meta, "warnings");
        return meta;
    }
    json_t *list = json_object_get(meta, "warnings");
    size_t i, k;
    json_t *w, *x;
    json_array_foreach(st->warnings, i, w)
    {
        bool seen = false;
        json_array_foreach(list, k, x) if (json_equal(x, w)) seen = true;
        if (!seen && json_array_append(list, w) < 0) {
            json_decref(meta);
            *oom = true;
            return NULL;
        }
    }
    return meta;
}

/* "toolu_" + the call id without its "call_" prefix: one id per call,
 * stable across the reply. */
void gps_anthropic_tool_use_id(const char *call_id, char *out, size_t outlen)
{
    const char *s = call_id ? call_id : "";
    if (strncmp(s, "call_", 5) == 0)
        s += 5;
    else if (strncmp(s, "toolu_", 6) == 0)
        s += 6;
    snprintf(out, outlen, "toolu_%s", s);
}

/* 0, or -1: a frame found no memory (the caller fails the reply:
 * gps_relay_fail_oom). */
static int ensure_started_as(an_stream *st, bool with_text);
static int ensure_started(an_stream *st)
{
    return ensure_started_as(st, true);
}

static int ensure_started_as(an_stream *st, bool with_text)
{
    if (st->rl.s.started)
        return 0;
    gps_relay_start(&st->rl);
    return gps_an_open(&st->out, &st->rl.s.out, gps_job_prompt_tokens(st->rl.job), st->warnings,
                       with_text);
}

/* Emit the next n bytes of the job's text held back (t, at
 * job->text[emitted]) to the client (a delta; not streaming: the body's
 * text grows). 0, or -1 (ENOMEM: gps_relay_fail_oom). */
static int emit_text(an_stream *st, const char *t, size_t n)
{
    if (n == 0)
        return 0;
    st->emitted += n;
    if (!st->stream)
        return 0;
    if (gps_an_text(&st->out, &st->rl.s.out, t, n) < 0)
        return -1;
    gps_relay_send_output(&st->rl);
    return 0;
}

/* A call's arguments as its tool_use input (*input: new reference): 0, or
 * 1 when they are not a JSON object (*input NULL), or -1 out of memory.
 * The checked load (gp_json.h) tells the two apart: jansson alone words
 * most of its allocation failures as a syntax error, and may drop a byte
 * of a long string and succeed. */
static int tool_input(const gps_tool_call *c, json_t **input)
{
    const char *text = c->args.data ? c->args.data : "{}";
    size_t n = c->args.len ? c->args.len : 2;
    json_error_t err;
    *input = gp_json_load_checked(text, n, 0, &err);
    if (json_is_object(*input))
        return 0;
    if (!*input && json_error_code(&err) == json_error_out_of_memory)
        return -1;
    json_decref(*input); /* JSON, not an object; or not JSON */
    *input = NULL;
    return 1;
}

int gps_anthropic_tool_use_blocks(json_t *body, const gps_tool_calls *calls, bool with_text)
{
    json_t *content = json_object_get(body, "content");
    if (!with_text)
        json_array_clear(content);
    for (size_t i = 0; i < calls->n; i++) {
        const gps_tool_call *c = &calls->v[i];
        json_t *input;
        int rc = tool_input(c, &input);
        if (rc < 0)
            return -1;
        if (rc > 0) {
            input = json_object();
            json_t *meta = json_object_get(body, "x_pool_meta");
            json_t *w = json_object_get(meta, "warnings");
            char m[200];
            snprintf(m, sizeof m, "tool call '%.100s': the model's arguments are not a JSON "
                                  "object; input left empty", c->name);
            if (!input || (json_is_array(w) && json_array_append_new(w, json_string(m)) < 0)) {
                json_decref(input);
                return -1;
            }
        }
        char id[160];
        gps_anthropic_tool_use_id(c->id, id, sizeof id);
        if (json_array_append_new(content, json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use",
                                                     "id", id, "name", c->name, "input",
                                                     input)) < 0)
            return -1;
    }
    return 0;
}

/* The reply is complete: send its end and free st. */
/* The stream's end with x_pool_meta rendered as text (pool_meta's object
 * without its tree; issue 24). 0, or -1 (nothing written) out of memory. */
static int close_stream(an_stream *st, gps_job *job, const char *stop_reason,
                        const char *stop_seq, long long in, long long out)
{
    enum { MAXW = 16 }; /* a request's warnings: a few at most */
    const char *extra[MAXW];
    size_t n = 0, i;
    json_t *w;
    json_array_foreach(st->warnings, i, w)
    {
        if (n < MAXW && json_string_value(w))
            extra[n++] = json_string_value(w);
    }
    gp_buf meta;
    gp_buf_init(&meta);
    int rc = json_array_size(st->warnings) <= MAXW ? gps_pool_meta_append(&meta, job, extra, n)
                                                   : -1;
    bool oom = false;
    if (rc < 0) { /* ENOMEM, or more warnings than listed here: the tree */
        json_t *m = pool_meta(st, job, true, &oom);
        if (!oom && gps_an_close(&st->out, &st->rl.s.out, stop_reason, stop_seq, in, out, m) < 0)
            oom = true;
    } else if (gps_an_close_text(&st->out, &st->rl.s.out, stop_reason, stop_seq, in, out,
                                 rc == 0 ? (meta.data ? meta.data : "") : NULL, meta.len) < 0) {
        oom = true;
    }
    gp_buf_free(&meta);
    return oom ? -1 : 0;
}

static void complete(an_stream *st, gps_job *job, const char *stop_reason, const char *stop_seq)
{
    long long in = gps_job_prompt_tokens(job), out = gps_job_completion_tokens(job);
    if (st->count_only) {
        /* count_tokens stays a plain request: no x-pool-* headers. An
         * estimate (an upstream without a count endpoint) says so. */
        json_t *body = json_pack("{s:I}", "input_tokens", (json_int_t)in);
        if (body && gps_job_count_estimated(job) &&
            json_object_set_new(body, "x_pool_meta", json_pack("{s:b}", "estimated", 1)) < 0) {
            json_decref(body); /* an estimate must say so */
            body = NULL;
        }
        if (body)
            gps_relay_end_body(&st->rl, body, false);
        else
            gps_relay_fail_oom(&st->rl);
    } else if (st->stream) {
        if (ensure_started(st) < 0 || close_stream(st, job, stop_reason, stop_seq, in, out) < 0)
            gps_relay_fail_oom(&st->rl); /* the error event in place of the end */
        else
            gps_relay_end_stream(&st->rl);
    } else {
        /* Out of memory anywhere: 500, not a message with a part left out. */
        bool oom;
        json_t *meta = pool_meta(st, job, true, &oom);
        json_t *body = oom ? NULL
                           : gps_anthropic_message(st->out.id, st->out.model, "", stop_reason,
                                                   stop_seq, in, out, meta);
        json_t *block = json_array_get(json_object_get(body, "content"), 0);
        json_t *t = body && st->emitted ? json_stringn(gps_job_text(job), st->emitted) : NULL;
        /* (text that is not UTF-8, which jansson refuses, stays "" as before) */
        if (body && st->emitted &&
            (t ? json_object_set_new(block, "text", t) < 0
               : gp_utf8_valid(gps_job_text(job), st->emitted)))
            oom = true;
        if (body && !oom && st->calls.n > 0 &&
            gps_anthropic_tool_use_blocks(body, &st->calls, st->emitted > 0) < 0)
            oom = true;
        if (body && !oom) {
            gps_relay_end_body(&st->rl, body, true);
        } else {
            json_decref(body);
            gps_relay_fail_oom(&st->rl);
        }
    }
}

/* The text rendered so far and not emitted: job->text[emitted..upto). */
static size_t held_back(const an_stream *st, size_t upto)
{
    return upto > st->emitted ? upto - st->emitted : 0;
}

/* ops->render_text: n more bytes of the job's text (text points into it,
 * at the relay's cursor), through the stop-sequence holdback. Returns true
 * when a stop sequence matched and the reply is complete (st is freed
 * later: relay.h). */
static bool render_text(void *arg, gps_job *job, const char *text, size_t n)
{
    an_stream *st = arg;
    size_t upto = (size_t)(text - gps_job_text(job)) + n;
    if (upto - n < st->emitted)
        st->emitted = 0; /* a requeue dropped the text (relay.h): start over */
    if (st->count_only)
        return false;
    if (st->stream && ensure_started(st) < 0)
        return gps_relay_fail_oom(&st->rl);
    const char *pend = gps_job_text(job) + st->emitted;
    size_t plen = held_back(st, upto);
    if (!st->stops) {
        if (emit_text(st, pend, plen) < 0)
            return gps_relay_fail_oom(&st->rl);
    } else {
        size_t safe = 0, at = 0;
        int hit = gp_stop_scan(pend, plen, st->stops, &safe, &at);
        if (emit_text(st, pend, safe) < 0)
            return gps_relay_fail_oom(&st->rl);
        if (hit >= 0) {
            /* Matched here: finish the reply, then the job (which tells
             * the agent to stop). complete finishes st. */
            char seq[GPS_MAX_STOP_LEN + 1];
            snprintf(seq, sizeof seq, "%s",
                     json_string_value(json_array_get(st->stops, (size_t)hit)));
            gps_jobs *jobs = st->ctx->jobs;
            complete(st, job, "stop_sequence", seq);
            gps_jobs_finish_early(jobs, job, "stop");
            return true;
        }
    }
    if (st->stream)
        gps_relay_send_soon(&st->rl);
    return false;
}

/* ops->render_event: a tool call, the end or an error, in order after the
 * text before it. Returns true when the reply is complete. */
static bool render_event(void *arg, gps_job *job, gps_event_type type, json_t *ev)
{
    an_stream *st = arg;
    if (type == GPS_EV_TOOL_CALL && !st->count_only) {
        bool started = false;
        int i = gps_tool_calls_add(&st->calls, ev, &started);
        if (i == GPS_TOOL_CALLS_OOM)
            return gps_relay_fail_oom(&st->rl);
        if (i < 0)
            return false;
        size_t plen = held_back(st, st->rl.sent);
        if (st->stream && ensure_started_as(st, plen > 0) < 0)
            return gps_relay_fail_oom(&st->rl);
        /* Text held back for a stop sequence goes out before the call. */
        if (emit_text(st, gps_job_text(job) + st->emitted, plen) < 0)
            return gps_relay_fail_oom(&st->rl);
        if (st->stream) {
            if (gps_an_call(&st->out, &st->rl.s.out, &st->calls, i, started,
                            json_string_value(json_object_get(ev, "arguments"))) < 0)
                return gps_relay_fail_oom(&st->rl);
            gps_relay_send_output(&st->rl);
        }
        return false;
    }
    if (type == GPS_EV_END) {
        /* no stop sequence came */
        if (emit_text(st, gps_job_text(job) + st->emitted, held_back(st, st->rl.sent)) < 0)
            return gps_relay_fail_oom(&st->rl);
        const char *sr = gps_anthropic_stop_reason(gps_job_finish_reason(job));
        if (st->calls.n > 0 && strcmp(sr, "max_tokens") != 0)
            sr = "tool_use";
        /* The agent (or its upstream) stopped on one of our stop strings
         * itself, before sending it: say which, with the agent's usage. */
        const char *seq = NULL;
        const char *agent_seq = gps_job_stop_sequence(job);
        if (strcmp(sr, "end_turn") == 0 && agent_seq && st->stops) {
            size_t i;
            json_t *s;
            json_array_foreach(st->stops, i, s)
            {
                if (strcmp(json_string_value(s), agent_seq) == 0)
                    seq = json_string_value(s);
            }
        }
        complete(st, job, seq ? "stop_sequence" : sr, seq);
        return true;
    }
    if (type == GPS_EV_ERROR) {
        const char *code = json_string_value(json_object_get(ev, "code"));
        const char *message = json_string_value(json_object_get(ev, "message"));
        char full[512];
        if (code && strcmp(code, "CONTEXT_OVERFLOW") == 0) {
            snprintf(full, sizeof full, "prompt is too long for model '%s': %s", st->out.model,
                     message ? message : "the job failed");
            message = full;
        }
        gps_relay_fail(&st->rl, ev, message);
        return true;
    }
    return false;
}

/* Streaming or not, the text goes through the relay's cursor: the
 * stop-sequence holdback reads the job's text in place. */
static void on_job_event(gps_job *job, gps_event_type type, json_t *ev, void *arg)
{
    an_stream *st = arg;
    if (st->count_only) {
        if (type == GPS_EV_END || type == GPS_EV_ERROR)
            render_event(st, job, type, ev);
        return;
    }
    gps_relay_stream_event(&st->rl, job, type, ev);
}

static void handle(gps_req *r, gps_relay_ctx *c, bool count_only)
{
    json_t *body = gps_req_job_json(r);
    if (!body) {
        gps_relay_count_req(&OPS, c->metrics, r, "invalid_request");
        return;
    }
    gps_anthropic_req areq;
    char msg[512];
    int rc = gps_anthropic_parse(body, count_only, &areq, msg, sizeof msg);
    json_decref(body);
    if (rc == 0) {
        registry *reg = gps_jobs_registry(c->jobs);
        /* With tools kept, the job goes only to the agents that take them
         * (sched_job needs_tools). */
        rc = gps_anthropic_assemble(&areq, registry_model_min_context(reg, areq.spec.model), gps_model_takes_tools(reg, areq.spec.model),
                                    msg, sizeof msg);
        if (rc < 0)
            gps_anthropic_req_clear(&areq);
    }
    if (rc < 0) {
        const char *code;
        int status = gps_parse_refusal(rc, &code);
        gps_relay_refuse(&OPS, c->metrics, r, status, code, msg, NULL);
        return;
    }
    if (count_only)
        areq.spec.kind = GPS_JOB_COUNT_TOKENS;
    an_stream *st = calloc(1, sizeof *st);
    if (!st) {
        gps_anthropic_req_clear(&areq);
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
        return;
    }
    gps_relay_init(&st->rl, &OPS, st, c->jobs, c->metrics, r);
    st->ctx = c;
    st->stream = areq.stream;
    st->count_only = count_only;
    char id[48];
    gps_id_new("msg_", id, sizeof id);
    gps_an_out_init(&st->out, id, areq.spec.model);
    st->stops = areq.stop_sequences;
    st->warnings = areq.warnings;
    areq.stop_sequences = areq.warnings = NULL;

    gps_job *job = gps_relay_submit(&st->rl, &areq.spec, r, c->request_timeout_sec + 30);
    gps_anthropic_req_clear(&areq);
    if (!job) {
        stream_free(st);
        return;
    }
    /* The model that serves (a fallback may have taken the request). */
    snprintf(st->out.model, sizeof st->out.model, "%s", gps_job_model(job));
    if (gps_job_requested_model(job)) {
        char w[600];
        snprintf(w, sizeof w, "model '%.256s' had no capacity; served by fallback model '%.256s'",
                 gps_job_requested_model(job), gps_job_model(job));
        json_array_append_new(st->warnings, json_string(w));
    }
}

static void h_messages(gps_req *r, void *arg)
{
    handle(r, arg, false);
}

static void h_count_tokens(gps_req *r, void *arg)
{
    handle(r, arg, true);
}

static const gps_route ROUTES[] = {
    {EVHTTP_REQ_POST, "/v1/messages", GPS_DIALECT_ANTHROPIC, GPS_ROLE_CLIENT, h_messages, NULL},
    {EVHTTP_REQ_POST, "/v1/messages/count_tokens", GPS_DIALECT_ANTHROPIC, GPS_ROLE_CLIENT,
     h_count_tokens, NULL},
};

int gps_anthropic_register(gps_http *h, gps_relay_ctx *c)
{
    return gps_http_add_routes(h, ROUTES, sizeof ROUTES / sizeof ROUTES[0], c);
}
