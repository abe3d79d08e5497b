/* responses: the Responses API's shapes (see responses.h). */
#include "server/dialects/responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_json.h"
#include "server/dialects/api_openai.h"
#include "server/dialects/reqcheck.h"
#include "server/dialects/rformat.h"
#include "server/http/sse.h"
#include "server/http/ids.h"

#define DEFAULT_MAX_OUTPUT_TOKENS 4096 /* OpenAI: up to the model's limit; we bound it */
#define MAX_METADATA_KEYS 16

/* ------------------------------------------------------------------ */
/* Request                                                             */
/* ------------------------------------------------------------------ */

/* A message's content: a string, or parts of type input_text /
 * output_text / text concatenated (gps_content_text; images, files and
 * audio are not supported). */
static int content_text(const json_t *c, size_t idx, char **out, char *msg, size_t msglen)
{
    static const char *const types[] = {"input_text", "output_text", "text", NULL};
    char field[40];
    snprintf(field, sizeof field, "input[%zu]", idx);
    return gps_content_text(c, field, types, out, msg, msglen);
}

/* The assistant message that function_call items attach to: the last
 * message when it is an assistant's (its calls go with its text), else a
 * new one with content null. */
static json_t *calls_holder(json_t *messages)
{
    json_t *last = json_array_get(messages, json_array_size(messages) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    if (!last || !role || strcmp(role, "assistant") != 0) {
        last = json_pack("{s:s,s:n}", "role", "assistant", "content");
        if (!last || json_array_append_new(messages, last) < 0)
            return NULL;
    }
    json_t *calls = json_object_get(last, "tool_calls");
    if (!calls) {
        calls = json_array();
        if (!calls || json_object_set_new(last, "tool_calls", calls) < 0)
            return NULL;
    }
    return calls;
}

/* Appends a new {role, content} message to messages; -1 when out of memory
 * (a message lost would have the model answer another conversation). */
static int append_message(json_t *messages, const char *role, const char *content)
{
    return json_array_append_new(messages,
                                 json_pack("{s:s,s:s}", "role", role, "content", content));
}

/* input (string or items) + instructions -> chat messages. */
static int parse_input(const json_t *input, const json_t *instructions, json_t *messages,
                       char *msg, size_t msglen, const char **param)
{
    int rc = -1;
    char *text = NULL;
    if (!gps_absent(instructions)) {
        if (!json_is_string(instructions))
            GPS_FAIL("instructions", "'instructions' must be a string");
        if (append_message(messages, "system", json_string_value(instructions)) < 0)
            GPS_FAIL_OOM();
    }
    if (gps_absent(input))
        GPS_FAIL("input", "'input' is required");
    if (json_is_string(input)) {
        if (append_message(messages, "user", json_string_value(input)) < 0)
            GPS_FAIL_OOM();
        return 0;
    }
    if (!json_is_array(input) || json_array_size(input) == 0)
        GPS_FAIL("input", "'input' must be a string or a non-empty array of items");
    size_t i;
    json_t *it;
    json_array_foreach(input, i, it)
    {
        if (!json_is_object(it))
            GPS_FAIL("input", "input[%zu] must be an object", i);
        const char *type = json_string_value(json_object_get(it, "type"));
        const char *role = json_string_value(json_object_get(it, "role"));
        if ((!type && role) || (type && strcmp(type, "message") == 0)) {
            if (!role)
                GPS_FAIL("input", "input[%zu].role must be a string", i);
            const char *r = strcmp(role, "developer") == 0 ? "system" : role;
            if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 &&
                strcmp(r, "assistant") != 0)
                GPS_FAIL("input",
                         "input[%zu].role '%.40s' is not supported (user, assistant, system, "
                         "developer)",
                         i, role);
            *param = "input"; /* what content_text refuses (fail: not out of memory) */
            GPS_TRY(content_text(json_object_get(it, "content"), i, &text, msg, msglen));
            int arc = append_message(messages, r, text);
            free(text);
            text = NULL;
            if (arc < 0)
                GPS_FAIL_OOM();
        } else if (type && strcmp(type, "function_call") == 0) {
            const char *call_id = json_string_value(json_object_get(it, "call_id"));
            const char *name = json_string_value(json_object_get(it, "name"));
            const char *args = json_string_value(json_object_get(it, "arguments"));
            if (!call_id || !name || !args)
                GPS_FAIL("input",
                         "input[%zu] (function_call) needs string call_id, name and arguments",
                         i);
            json_t *calls = calls_holder(messages);
            if (!calls ||
                json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", call_id,
                                                       "type", "function", "function", "name",
                                                       name, "arguments", args)) < 0)
                GPS_FAIL_OOM();
        } else if (type && strcmp(type, "function_call_output") == 0) {
            const char *call_id = json_string_value(json_object_get(it, "call_id"));
            const json_t *out = json_object_get(it, "output");
            if (!call_id)
                GPS_FAIL("input", "input[%zu] (function_call_output) needs a string call_id", i);
            *param = "input";
            GPS_TRY(json_is_string(out)
                        ? gps_strdup_msg(json_string_value(out), &text, msg, msglen)
                        : content_text(out, i, &text, msg, msglen));
            int arc = json_array_append_new(messages,
                                            json_pack("{s:s,s:s,s:s}", "role", "tool",
                                                      "tool_call_id", call_id, "content", text));
            free(text);
            text = NULL;
            if (arc < 0)
                GPS_FAIL_OOM();
        } else if (type && strcmp(type, "item_reference") == 0) {
            const char *id = json_string_value(json_object_get(it, "id"));
            if (!id || !*id || strlen(id) > 64)
                GPS_FAIL("input", "input[%zu] (item_reference) needs a string id", i);
            /* Marked here, resolved from the store (gps_resp_splice). */
            if (json_array_append_new(messages, json_pack("{s:s,s:s,s:I}", "role", "$ref",
                                                          "id", id, "index",
                                                          (json_int_t)i)) < 0)
                GPS_FAIL_OOM();
        } else if (type && strcmp(type, "reasoning") == 0) {
            continue; /* a reasoning model's own items: nothing to replay here */
        } else {
            GPS_FAIL("input",
                     "input[%zu] has type '%.40s': supported are message, function_call, "
                     "function_call_output, item_reference (and reasoning, ignored)",
                     i, type ? type : "(none)");
        }
    }
    *param = NULL;
    return 0;
fail:
    free(text);
    if (rc == GPS_PARSE_OOM)
        *param = NULL;
    return rc;
}

/* Responses function tools ({type, name, description, parameters, strict})
 * into chat tools ({type, function: {name, description, parameters,
 * strict}}). `strict` is carried only when the request sets it: OpenAI's
 * default is true, but taking that default would make every tool without
 * it strict, and a gguf agent refuses a strict tool whose parameters its
 * grammar cannot enforce, so requests that work today would fail (the
 * OpenAI Agents SDK and Codex send it explicitly). docs/api.md "Tools". */
static int parse_tools(const json_t *tools, const json_t *choice, gps_job_spec *s,
                       json_t *warnings, char *msg, size_t msglen, const char **param)
{
    int rc = -1;
    if (!json_is_array(tools))
        GPS_FAIL("tools", "'tools' must be an array");
    json_t *chat = json_array();
    s->tools = chat;
    if (!chat)
        GPS_FAIL_OOM();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        const char *type = json_string_value(json_object_get(t, "type"));
        json_t *name = json_object_get(t, "name");
        json_t *params = json_object_get(t, "parameters");
        json_t *desc = json_object_get(t, "description");
        json_t *strict = json_object_get(t, "strict");
        if (!type)
            GPS_FAIL("tools", "tools[%zu].type must be a string", i);
        if (strcmp(type, "function") != 0) {
            /* Hosted tools (web_search, file_search, ...) and namespaces
             * are the provider's own: an agent runs functions only. The
             * request still runs (Codex offers such tools by default). */
            char w[160];
            snprintf(w, sizeof w, "tools[%zu] of type '%.40s' was ignored: only function tools "
                     "are supported", i, type);
            if (json_array_append_new(warnings, json_string(w)) < 0)
                GPS_FAIL_OOM(); /* the client is told of what is ignored */
            continue;
        }
        if (!json_is_string(name) || (params && !json_is_null(params) && !json_is_object(params)) ||
            (desc && !json_is_null(desc) && !json_is_string(desc)))
            GPS_FAIL("tools",
                     "tools[%zu] must be {\"type\":\"function\",\"name\":string,"
                     "\"parameters\":object}",
                     i);
        if (strict && !json_is_boolean(strict) && !json_is_null(strict))
            GPS_FAIL("tools", "tools[%zu].strict must be a boolean", i);
        /* A tool (or a field of one) lost would have the model call what the
         * client did not describe: out of memory fails the request. */
        json_t *fn = json_pack("{s:O}", "name", name);
        if (!fn || (json_is_string(desc) && json_object_set(fn, "description", desc) < 0) ||
            (json_is_object(params) && json_object_set(fn, "parameters", params) < 0) ||
            (json_is_boolean(strict) && json_object_set(fn, "strict", strict) < 0)) {
            json_decref(fn);
            GPS_FAIL_OOM();
        }
        if (json_array_append_new(chat, json_pack("{s:s,s:o}", "type", "function", "function",
                                                  fn)) < 0)
            GPS_FAIL_OOM();
    }
    if (gps_absent(choice))
        return 0;
    if (json_is_string(choice)) {
        const char *v = json_string_value(choice);
        if (strcmp(v, "auto") == 0 || strcmp(v, "none") == 0 || strcmp(v, "required") == 0) {
            s->tool_choice = json_string(v);
            if (!s->tool_choice)
                GPS_FAIL_OOM();
            return 0;
        }
    } else if (json_is_object(choice)) {
        const char *type = json_string_value(json_object_get(choice, "type"));
        const char *name = json_string_value(json_object_get(choice, "name"));
        if (type && strcmp(type, "function") == 0 && name) {
            size_t k;
            json_t *t2;
            json_array_foreach(chat, k, t2)
            {
                if (strcmp(json_string_value(json_object_get(json_object_get(t2, "function"),
                                                             "name")),
                           name) == 0) {
                    s->tool_choice = json_pack("{s:s,s:{s:s}}", "type", "function", "function",
                                               "name", name);
                    if (!s->tool_choice)
                        GPS_FAIL_OOM();
                    return 0;
                }
            }
            GPS_FAIL("tool_choice", "'tool_choice' names '%.64s', which is not a function in "
                                    "'tools'",
                     name);
        }
    }
    GPS_FAIL("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                            "{\"type\":\"function\",\"name\":string}");
fail:
    return rc;
}

static int parse_model(const json_t *body, gps_job_spec *s, char *msg, size_t msglen,
                       const char **param)
{
    const json_t *model = json_object_get(body, "model");
    if (!json_is_string(model) || json_string_length(model) == 0 ||
        json_string_length(model) > GPS_MAX_MODEL_NAME)
        GPS_FAIL("model", "'model' is required: a non-empty string of at most %d bytes",
                 GPS_MAX_MODEL_NAME);
    s->model = strdup(json_string_value(model));
    return 0;
fail:
    return -1;
}

static int parse_state(const json_t *body, gps_resp_req *out, char *msg, size_t msglen,
                       const char **param)
{
    int rc = -1;
    const json_t *prev = json_object_get(body, "previous_response_id");
    if (!gps_absent(prev)) {
        if (!json_is_string(prev) || json_string_length(prev) == 0 ||
            json_string_length(prev) > 64)
            GPS_FAIL("previous_response_id",
                     "'previous_response_id' must be a response id (a string)");
        out->prev_id = strdup(json_string_value(prev));
        if (!out->prev_id)
            GPS_FAIL_OOM();
    }
    const json_t *bg = json_object_get(body, "background");
    if (!gps_absent(bg) && !json_is_false(bg))
        GPS_FAIL("background", "background responses are not supported");
    const json_t *conv = json_object_get(body, "conversation");
    if (!gps_absent(conv))
        GPS_FAIL("conversation", "'conversation' is not supported: send the whole "
                                 "conversation in 'input'");
    return 0;
fail:
    return rc;
}

static int parse_messages(const json_t *body, gps_resp_req *out, char *msg, size_t msglen,
                          const char **param)
{
    int rc = -1;
    gps_job_spec *s = &out->spec;
    s->messages = json_array();
    if (!s->messages)
        GPS_FAIL_OOM();
    GPS_TRY(parse_input(json_object_get(body, "input"), json_object_get(body, "instructions"),
                        s->messages, msg, msglen, param));
    out->n_instr = json_is_string(json_object_get(body, "instructions")) ? 1 : 0;
    if (json_array_size(s->messages) == 0 && !out->prev_id)
        GPS_FAIL("input", "'input' holds no message");
    size_t mi;
    json_t *m;
    json_array_foreach(s->messages, mi, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (strcmp(role, "$ref") != 0)
            continue;
        /* An id not looked up would leave its mark in the messages. */
        if ((!out->refs && !(out->refs = json_array())) ||
            json_array_append(out->refs, json_object_get(m, "id")) < 0)
            GPS_FAIL_OOM();
    }
    return 0;
fail:
    return rc;
}

static int parse_limits(const json_t *body, gps_job_spec *s, char *msg, size_t msglen,
                        const char **param)
{
    int rc = -1;
    const json_t *mt = json_object_get(body, "max_output_tokens");
    if (!gps_absent(mt)) {
        if (!json_is_integer(mt) || json_integer_value(mt) < 1 ||
            json_integer_value(mt) > GPS_MAX_TOKENS_LIMIT)
            GPS_FAIL("max_output_tokens", "'max_output_tokens' must be an integer between 1 "
                                          "and %d",
                     GPS_MAX_TOKENS_LIMIT);
        s->max_tokens = json_integer_value(mt);
    }
    if (!gps_absent(json_object_get(body, "stop")))
        GPS_FAIL("stop", "'stop' is not a Responses API parameter");
    GPS_TRY(gps_sampling_parse(body, s, 2, 0, msg, msglen, param));
    return 0;
fail:
    return rc;
}

static int parse_tool_fields(const json_t *body, gps_resp_req *out, char *msg, size_t msglen,
                             const char **param)
{
    int rc = -1;
    gps_job_spec *s = &out->spec;
    const json_t *tools = json_object_get(body, "tools");
    const json_t *tchoice = json_object_get(body, "tool_choice");
    if (!gps_absent(tools)) {
        out->warnings = json_array();
        if (!out->warnings)
            GPS_FAIL_OOM();
        GPS_TRY(parse_tools(tools, tchoice, s, out->warnings, msg, msglen, param));
        if (json_array_size(s->tools) == 0) {
            json_decref(s->tools);
            json_decref(s->tool_choice);
            s->tools = s->tool_choice = NULL;
        }
    } else if (!gps_absent(tchoice) &&
               !(json_is_string(tchoice) && (strcmp(json_string_value(tchoice), "none") == 0 ||
                                             strcmp(json_string_value(tchoice), "auto") == 0))) {
        GPS_FAIL("tool_choice", "'tool_choice' needs 'tools'");
    }
    return 0;
fail:
    return rc;
}

static int parse_options(const json_t *body, gps_resp_req *out, char *msg, size_t msglen,
                         const char **param)
{
    int rc = -1;
    gps_job_spec *s = &out->spec;
    const json_t *stream = json_object_get(body, "stream");
    if (!gps_absent(stream)) {
        if (!json_is_boolean(stream))
            GPS_FAIL("stream", "'stream' must be a boolean");
        out->stream = json_is_true(stream);
    }
    const json_t *store = json_object_get(body, "store");
    if (!gps_absent(store) && !json_is_boolean(store))
        GPS_FAIL("store", "'store' must be a boolean");
    out->store = !json_is_false(store);
    const json_t *ptc = json_object_get(body, "parallel_tool_calls");
    if (!gps_absent(ptc) && !json_is_boolean(ptc))
        GPS_FAIL("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    const json_t *md = json_object_get(body, "metadata");
    if (!gps_absent(md) && (!json_is_object(md) || json_object_size(md) > MAX_METADATA_KEYS))
        GPS_FAIL("metadata", "'metadata' must be an object of at most %d keys",
                 MAX_METADATA_KEYS);
    const json_t *text = json_object_get(body, "text");
    if (!gps_absent(text)) {
        if (!json_is_object(text))
            GPS_FAIL("text", "'text' must be an object");
        *param = "text.format"; /* what the format check refuses (fail: not out of memory) */
        GPS_TRY(gps_rformat_responses(json_object_get(text, "format"), &s->response_format,
                                      msg, msglen));
        *param = NULL;
    }
    const json_t *tlp = json_object_get(body, "top_logprobs");
    if (!gps_absent(tlp) && !(json_is_integer(tlp) && json_integer_value(tlp) == 0))
        GPS_FAIL("top_logprobs", "logprobs are not supported");
    const json_t *user = json_object_get(body, "user");
    if (!gps_absent(user)) {
        if (!json_is_string(user) || json_string_length(user) > 256)
            GPS_FAIL("user", "'user' must be a string of at most 256 bytes");
        s->user = strdup(json_string_value(user));
        if (!s->user) /* the scheduler's affinity key: not dropped silently */
            GPS_FAIL_OOM();
    }
    GPS_TRY(gps_pool_options_parse(json_object_get(body, "x_pool_options"), s, msg, msglen,
                                   param));
    return 0;
fail:
    if (rc == GPS_PARSE_OOM)
        *param = NULL;
    return rc;
}

/* What the response object repeats of the request. */
static int build_echo(const json_t *body, gps_resp_req *out, char *msg, size_t msglen,
                      const char **param)
{
    int rc = -1;
    gps_job_spec *s = &out->spec;
    const json_t *tools = json_object_get(body, "tools");
    const json_t *tchoice = json_object_get(body, "tool_choice");
    const json_t *ptc = json_object_get(body, "parallel_tool_calls");
    const json_t *md = json_object_get(body, "metadata");
    const json_t *text = json_object_get(body, "text");
    out->echo = json_pack("{s:o,s:I,s:f,s:f,s:b,s:o,s:b}", "instructions",
                          json_is_string(json_object_get(body, "instructions"))
                              ? json_deep_copy(json_object_get(body, "instructions"))
                              : json_null(),
                          "max_output_tokens", (json_int_t)s->max_tokens, "temperature",
                          s->temperature, "top_p", s->top_p, "parallel_tool_calls",
                          !json_is_false(ptc), "metadata",
                          json_is_object(md) ? json_deep_copy(md) : json_object(), "store",
                          (int)out->store);
    if (!out->echo)
        GPS_FAIL_OOM();
    /* The response object repeats these: one missing would misreport the
     * request, so out of memory fails it like any other field. */
    if ((out->prev_id && json_object_set_new(out->echo, "previous_response_id",
                                             json_string(out->prev_id)) < 0) ||
        /* The tools as the client gave them (Responses shape). */
        json_object_set_new(out->echo, "tools",
                            json_is_array(tools) ? json_deep_copy(tools) : json_array()) < 0 ||
        json_object_set_new(out->echo, "tool_choice",
                            gps_absent(tchoice) ? json_string("auto")
                                                : json_deep_copy(tchoice)) < 0 ||
        (s->user && json_object_set_new(out->echo, "user", json_string(s->user)) < 0) ||
        /* structured output: the format as given */
        (s->response_format &&
         json_object_set_new(out->echo, "text", json_deep_copy(text)) < 0))
        GPS_FAIL_OOM();
    return 0;
fail:
    return rc;
}

int gps_resp_parse(const json_t *body, gps_resp_req *out, char *msg, size_t msglen,
                   const char **param)
{
    memset(out, 0, sizeof *out);
    gps_job_spec *s = &out->spec;
    gps_spec_defaults(s, "openai");
    s->kind = GPS_JOB_CHAT;
    s->max_tokens = DEFAULT_MAX_OUTPUT_TOKENS;
    *param = NULL;
    msg[0] = '\0';
    int rc = -1;
    if (!json_is_object(body))
        GPS_FAIL(NULL, "request body must be a JSON object");
    GPS_TRY(parse_model(body, s, msg, msglen, param));
    GPS_TRY(parse_state(body, out, msg, msglen, param));
    GPS_TRY(parse_messages(body, out, msg, msglen, param));
    GPS_TRY(parse_limits(body, s, msg, msglen, param));
    GPS_TRY(parse_tool_fields(body, out, msg, msglen, param));
    GPS_TRY(parse_options(body, out, msg, msglen, param));
    GPS_TRY(build_echo(body, out, msg, msglen, param));
    if (!s->model) /* copied unchecked by parse_model */
        GPS_FAIL_OOM();
    return 0;
fail:
    gps_resp_req_clear(out);
    return rc;
}

void gps_resp_req_clear(gps_resp_req *r)
{
    gps_job_spec_clear(&r->spec);
    json_decref(r->echo);
    json_decref(r->warnings);
    json_decref(r->refs);
    free(r->prev_id);
    r->echo = r->warnings = r->refs = NULL;
    r->prev_id = NULL;
}

/* Copies of src's messages onto out (a later call may add tool_calls to
 * the last one: the caller's array must not change). */
static int extend_copy(json_t *out, const json_t *src)
{
    for (size_t i = 0; i < json_array_size(src); i++)
        if (json_array_append_new(out, json_deep_copy(json_array_get(src, i))) < 0)
            return -1;
    return 0;
}

/* A stored fragment into out: a function call joins the assistant message
 * before it (as parse_input's function_call items do). */
static int splice_one(json_t *out, json_t *frag)
{
    json_t *calls = json_object_get(frag, "tool_calls");
    if (!json_is_array(calls))
        return json_array_append_new(out, json_deep_copy(frag));
    json_t *holder = calls_holder(out);
    if (!holder)
        return -1;
    return json_array_extend(holder, calls);
}

int gps_resp_splice(gps_resp_req *r, json_t *prev_context, json_t *items,
                    char *msg, size_t msglen, const char **param)
{
    *param = NULL;
    int rc = -1;
    json_t *old = r->spec.messages, *out = json_array();
    if (!out)
        GPS_FAIL_OOM();
    size_t i;
    json_t *m;
    json_array_foreach(old, i, m)
    {
        if (i == r->n_instr && prev_context && extend_copy(out, prev_context) < 0)
            GPS_FAIL_OOM();
        const char *role = json_string_value(json_object_get(m, "role"));
        if (strcmp(role, "$ref") != 0) {
            if (json_array_append_new(out, json_deep_copy(m)) < 0)
                GPS_FAIL_OOM();
            continue;
        }
        const char *id = json_string_value(json_object_get(m, "id"));
        json_t *frag = json_object_get(items, id);
        if (!json_is_object(frag))
            GPS_FAIL("input",
                     "input[%lld] (item_reference): no stored item '%.64s' for this key "
                     "(expired, deleted, never stored or another key's)",
                     (long long)json_integer_value(json_object_get(m, "index")), id);
        if (splice_one(out, frag) < 0)
            GPS_FAIL_OOM();
    }
    if (json_array_size(old) <= r->n_instr && prev_context && extend_copy(out, prev_context) < 0)
        GPS_FAIL_OOM();
    if (json_array_size(out) == r->n_instr)
        GPS_FAIL("input", "'input' holds no message");
    r->spec.messages = out;
    json_decref(old);
    return 0;
fail:
    json_decref(out);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Response                                                            */
/* ------------------------------------------------------------------ */

static void echo_prepare(gps_resp_out *o);

void gps_resp_out_init(gps_resp_out *o, const char *model, json_t *echo)
{
    memset(o, 0, sizeof *o);
    gps_id_new("resp_", o->id, sizeof o->id);
    o->created = gp_now_wall_ms() / 1000;
    snprintf(o->model, sizeof o->model, "%s", model);
    o->echo = echo;
    gp_buf_init(&o->text);
    echo_prepare(o);
}

void gps_resp_out_clear(gps_resp_out *o)
{
    gp_buf_free(&o->text);
    gp_buf_free(&o->echo_text);
    free(o->items);
    o->items = NULL;
    o->n_items = o->cap_items = 0;
}

/* A new item, zeroed, at the end; NULL past GPS_RESP_MAX_ITEMS (a reply
 * this fragmented is not a real one) or out of memory. Pointers to items
 * do not survive it. */
static struct gps_resp_item *new_item(gps_resp_out *o)
{
    if (o->n_items >= GPS_RESP_MAX_ITEMS)
        return NULL;
    if (o->n_items == o->cap_items) {
        int cap = o->cap_items ? 2 * o->cap_items : 2;
        struct gps_resp_item *v = realloc(o->items, (size_t)cap * sizeof *v);
        if (!v)
            return NULL;
        o->items = v;
        o->cap_items = cap;
    }
    struct gps_resp_item *it = &o->items[o->n_items++];
    memset(it, 0, sizeof *it);
    return it;
}

static json_t *usage_json(long long in, long long outn)
{
    if (in < 0)
        in = 0;
    if (outn < 0)
        outn = 0;
    return json_pack("{s:I,s:{s:i},s:I,s:{s:i},s:I}", "input_tokens", (json_int_t)in,
                     "input_tokens_details", "cached_tokens", 0, "output_tokens",
                     (json_int_t)outn, "output_tokens_details", "reasoning_tokens", 0,
                     "total_tokens", (json_int_t)(in + outn));
}

static json_t *text_part(const char *t, size_t n)
{
    json_t *s = json_stringn(t ? t : "", t ? n : 0);
    if (!s && gp_utf8_valid(t ? t : "", t ? n : 0))
        return NULL; /* ENOMEM (text that is not UTF-8 is "", as before) */
    return json_pack("{s:s,s:o,s:[]}", "type", "output_text", "text", s ? s : json_string(""),
                     "annotations");
}

static json_t *item_json(const gps_resp_out *o, const struct gps_resp_item *it,
                         const gps_tool_calls *calls, bool done)
{
    const char *status = done ? "completed" : "in_progress";
    if (it->is_call) {
        const gps_tool_call *c = &calls->v[it->call];
        const char *ad = done && c->args.data ? c->args.data : "";
        json_t *args = json_stringn(ad, done ? c->args.len : 0);
        if (!args && gp_utf8_valid(ad, done ? c->args.len : 0))
            return NULL; /* ENOMEM (arguments that are not UTF-8 are "", as before) */
        return json_pack("{s:s,s:s,s:s,s:s,s:o,s:s}", "type", "function_call", "id",
                         it->item_id, "call_id", c->id, "name", c->name, "arguments",
                         args ? args : json_string(""), "status", status);
    }
    json_t *content = json_array();
    if (done && json_array_append_new(content, text_part(o->text.data + it->text_from,
                                                         it->text_to - it->text_from)) < 0) {
        json_decref(content);
        return NULL;
    }
    return json_pack("{s:s,s:s,s:s,s:s,s:o}", "type", "message", "id", it->item_id, "status",
                     status, "role", "assistant", "content", content);
}

/* The response object: status, output items (as far as built), usage. */
static json_t *response_json(const gps_resp_out *o, const gps_tool_calls *calls,
                             const char *status, bool with_usage, long long in, long long outn,
                             json_t *meta)
{
    json_t *output = json_array();
    for (int i = 0; output && i < o->n_items; i++) {
        const struct gps_resp_item *it = &o->items[i];
        json_t *item = item_json(o, it, calls, it->done);
        /* (a call whose id or name is not UTF-8 is left out, as before;
         * any other item that could not be made is ENOMEM) */
        if (!item && (!it->is_call || (gp_utf8_valid(calls->v[it->call].id,
                                                     strlen(calls->v[it->call].id)) &&
                                       gp_utf8_valid(calls->v[it->call].name,
                                                     strlen(calls->v[it->call].name))))) {
            json_decref(output);
            output = NULL;
        } else if (item && json_array_append_new(output, item) < 0) {
            json_decref(output);
            output = NULL;
        }
    }
    if (!output) {
        json_decref(meta);
        return NULL;
    }
    json_t *r = json_pack("{s:s,s:s,s:I,s:s,s:n,s:o,s:s,s:o,s:s,s:{s:{s:s}},s:n}", "id", o->id,
                          "object", "response", "created_at", (json_int_t)o->created, "status",
                          status, "error", "incomplete_details",
                          strcmp(status, "incomplete") == 0
                              ? json_pack("{s:s}", "reason", "max_output_tokens")
                              : json_null(),
                          "model", o->model, "output", output,
                          "truncation", "disabled", "text", "format", "type", "text",
                          "previous_response_id");
    if (!r) {
        json_decref(meta);
        return NULL;
    }
    /* Whole or NULL: a response with its usage, meta or an echoed field
     * left out would tell the client another reply. */
    if ((o->echo && json_object_update(r, o->echo) < 0) ||
        json_object_set_new(r, "usage", with_usage ? usage_json(in, outn) : json_null()) < 0) {
        json_decref(meta);
        json_decref(r);
        return NULL;
    }
    if (meta && json_object_set_new(r, "x_pool_meta", meta) < 0) {
        json_decref(r); /* (set_new took meta) */
        return NULL;
    }
    return r;
}

/* Append a string literal. */
#define LIT(b, s) gp_buf_append((b), (s), sizeof(s) - 1)

/*
 * The response object as text (issue 24, fifth round): what
 * gp_json_dump_append writes for response_json's tree, byte for byte,
 * without building it. The tree, its dump and the store's copy of it were
 * about 190,000 instructions a Responses request; this escapes the text
 * once and dumps only the request's echo values. response_json stays as
 * the reference (and the fallback): test_responses compares the two over
 * texts, call names, arguments, echo values and models that need escapes.
 *
 * Key order is jansson's: json_pack's keys, then the echo's in its order
 * (json_object_update replaces a key that is already there in place), then
 * usage and x_pool_meta. The echo is gps_resp_parse's: it never holds
 * usage or x_pool_meta.
 */
static const char *const FIXED_KEYS[] = {
    "id",     "object", "created_at", "status",   "error", "incomplete_details",
    "model",  "output", "truncation", "text",     "previous_response_id",
};
#define N_FIXED (sizeof FIXED_KEYS / sizeof FIXED_KEYS[0])

/* "TEXT" as json_stringn made it: text that is not UTF-8 was refused,
 * and the callers put "" in its place. */
static int str_or_empty(gp_buf *b, const char *t, size_t n)
{
    if (!t || !gp_utf8_valid(t, n))
        n = 0;
    return LIT(b, "\"") < 0 || gp_json_escape_append(b, t ? t : "", n) < 0 || LIT(b, "\"") < 0
               ? -1
               : 0;
}

/* A string json_pack's "s" takes whole, or -1 where it refuses it (the
 * item or the response is then left out: the caller falls back). */
static int str_strict(gp_buf *b, const char *s)
{
    if (!s || !gp_utf8_valid(s, strlen(s)))
        return -1;
    return gp_json_str_append(b, s);
}

/* item_json's object as text; -1 where item_json gives NULL. */
static int item_text(gp_buf *b, const gps_resp_out *o, const struct gps_resp_item *it,
                     const gps_tool_calls *calls)
{
    const char *status = it->done ? "completed" : "in_progress";
    if (it->is_call) {
        const gps_tool_call *c = &calls->v[it->call];
        if (LIT(b, "{\"type\":\"function_call\",\"id\":\"") < 0 ||
            gp_buf_append(b, it->item_id, strlen(it->item_id)) < 0 ||
            LIT(b, "\",\"call_id\":") < 0 || str_strict(b, c->id) < 0 ||
            LIT(b, ",\"name\":") < 0 || str_strict(b, c->name) < 0 ||
            LIT(b, ",\"arguments\":") < 0)
            return -1;
        if (str_or_empty(b, it->done ? c->args.data : "", it->done ? c->args.len : 0) < 0 ||
            LIT(b, ",\"status\":\"") < 0 || gp_buf_append(b, status, strlen(status)) < 0)
            return -1;
        return LIT(b, "\"}");
    }
    if (LIT(b, "{\"type\":\"message\",\"id\":\"") < 0 ||
        gp_buf_append(b, it->item_id, strlen(it->item_id)) < 0 || LIT(b, "\",\"status\":\"") < 0 ||
        gp_buf_append(b, status, strlen(status)) < 0 ||
        LIT(b, "\",\"role\":\"assistant\",\"content\":[") < 0)
        return -1;
    if (it->done && (LIT(b, "{\"type\":\"output_text\",\"text\":") < 0 ||
                     str_or_empty(b, o->text.data ? o->text.data + it->text_from : "",
                                  it->text_to - it->text_from) < 0 ||
                     LIT(b, ",\"annotations\":[]}") < 0))
        return -1;
    return LIT(b, "]}");
}

static int usage_text(gp_buf *b, bool with_usage, long long in, long long outn)
{
    if (!with_usage)
        return LIT(b, "null");
    if (in < 0)
        in = 0;
    if (outn < 0)
        outn = 0;
    return LIT(b, "{\"input_tokens\":") < 0 || gp_buf_append_int(b, in) < 0 ||
                   LIT(b, ",\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":") <
                       0 ||
                   gp_buf_append_int(b, outn) < 0 ||
                   LIT(b, ",\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":") <
                       0 ||
                   gp_buf_append_int(b, in + outn) < 0 || LIT(b, "}") < 0
               ? -1
               : 0;
}

/* Key k's default value in response_json's json_pack. */
static int fixed_default(gp_buf *b, const gps_resp_out *o, const gps_tool_calls *calls, size_t k,
                         const char *status)
{
    switch (k) {
    case 0:
        return LIT(b, "\"") < 0 || gp_buf_append(b, o->id, strlen(o->id)) < 0 || LIT(b, "\"") < 0
                   ? -1
                   : 0;
    case 1:
        return LIT(b, "\"response\"");
    case 2:
        return gp_buf_append_int(b, o->created);
    case 3:
        return LIT(b, "\"") < 0 || gp_buf_append(b, status, strlen(status)) < 0 ||
                       LIT(b, "\"") < 0
                   ? -1
                   : 0;
    case 5:
        return strcmp(status, "incomplete") == 0 ? LIT(b, "{\"reason\":\"max_output_tokens\"}")
                                                 : LIT(b, "null");
    case 6:
        return str_strict(b, o->model);
    case 7:
        if (LIT(b, "[") < 0)
            return -1;
        for (int i = 0; i < o->n_items; i++)
            if ((i && LIT(b, ",") < 0) || item_text(b, o, &o->items[i], calls) < 0)
                return -1;
        return LIT(b, "]");
    case 8:
        return LIT(b, "\"disabled\"");
    case 9:
        return LIT(b, "{\"format\":{\"type\":\"text\"}}");
    default: /* error, previous_response_id */
        return LIT(b, "null");
    }
}

/* The echo's part of every render, written once a request (a streamed
 * reply writes the object twice): the echo is not changed after init. */
static void echo_prepare(gps_resp_out *o)
{
    gp_buf_init(&o->echo_text);
    o->echo_fixed = 0;
    o->echo_ok = true;
    const char *key;
    json_t *v;
    json_object_foreach(o->echo, key, v)
    {
        bool fixed = false;
        for (size_t k = 0; k < N_FIXED && !fixed; k++)
            if (strcmp(key, FIXED_KEYS[k]) == 0) {
                o->echo_fixed |= 1u << k;
                fixed = true;
            }
        if (fixed)
            continue;
        if (LIT(&o->echo_text, ",") < 0 || gp_json_str_append(&o->echo_text, key) < 0 ||
            LIT(&o->echo_text, ":") < 0 || gp_json_dump_append(&o->echo_text, v) < 0) {
            o->echo_ok = false;
            return;
        }
    }
}

/* response_json(o, calls, status, with_usage, in, outn, NULL) as text.
 * 0, or -1 with out as it was (a string jansson refuses, ENOMEM). */
static int render(gp_buf *out, const gps_resp_out *o, const gps_tool_calls *calls,
                  const char *status, bool with_usage, long long in, long long outn)
{
    size_t at = out->len;
    if (!o->echo_ok || LIT(out, "{") < 0)
        goto fail;
    for (size_t k = 0; k < N_FIXED; k++) {
        const json_t *v =
            o->echo_fixed & (1u << k) ? json_object_get(o->echo, FIXED_KEYS[k]) : NULL;
        if ((k && LIT(out, ",") < 0) || LIT(out, "\"") < 0 ||
            gp_buf_append(out, FIXED_KEYS[k], strlen(FIXED_KEYS[k])) < 0 || LIT(out, "\":") < 0)
            goto fail;
        if (v ? gp_json_dump_append(out, v) < 0 : fixed_default(out, o, calls, k, status) < 0)
            goto fail;
    }
    if (gp_buf_append(out, o->echo_text.data, o->echo_text.len) < 0)
        goto fail;
    if (LIT(out, ",\"usage\":") < 0 || usage_text(out, with_usage, in, outn) < 0 ||
        LIT(out, "}") < 0)
        goto fail;
    return 0;
fail:
    gp_buf_truncate(out, at);
    return -1;
}

/* render(), or where it refuses, response_json's tree dumped (the same
 * bytes: it leaves out what jansson left out). 0, or -1: no object. */
static int render_any(gp_buf *out, const gps_resp_out *o, const gps_tool_calls *calls,
                      const char *status, bool with_usage, long long in, long long outn)
{
    if (render(out, o, calls, status, with_usage, in, outn) == 0)
        return 0;
    json_t *r = response_json(o, calls, status, with_usage, in, outn, NULL);
    size_t at = out->len;
    int rc = r ? gp_json_dump_append(out, r) : -1;
    json_decref(r);
    if (rc < 0) {
        gp_buf_truncate(out, at);
    }
    return rc;
}

int gps_resp_render(gp_buf *out, const gps_resp_out *o, const gps_tool_calls *calls,
                    const char *finish_reason, long long prompt_tokens,
                    long long completion_tokens)
{
    bool incomplete = finish_reason && strcmp(finish_reason, "length") == 0;
    return render_any(out, o, calls, incomplete ? "incomplete" : "completed", true,
                      prompt_tokens, completion_tokens);
}

int gps_resp_render_meta_text(gp_buf *out, size_t from, const char *meta, size_t meta_len)
{
    if (!meta)
        return 0;
    if (out->len <= from || out->data[out->len - 1] != '}')
        return -1;
    size_t at = out->len;
    out->len--;
    if (LIT(out, ",\"x_pool_meta\":") < 0 || gp_buf_append(out, meta, meta_len) < 0 ||
        LIT(out, "}") < 0) {
        out->len = at;
        out->data[at - 1] = '}';
        out->data[at] = '\0';
        return -1;
    }
    return 0;
}

int gps_resp_render_meta(gp_buf *out, size_t from, const json_t *meta)
{
    if (!meta)
        return 0;
    gp_buf m;
    gp_buf_init(&m);
    int rc = gp_json_dump_append(&m, meta) == 0
                 ? gps_resp_render_meta_text(out, from, m.data ? m.data : "", m.len)
                 : -1;
    gp_buf_free(&m);
    return rc;
}

/* One event: `type` and `sequence_number` added to ev (stolen). 0, or -1
 * when it could not be written whole (ev NULL too; sse as it was). */
static int emit(gps_resp_out *o, gp_buf *sse, const char *type, json_t *ev)
{
    if (!ev)
        return -1;
    int rc = json_object_set_new(ev, "type", json_string(type)) < 0 ||
                     json_object_set_new(ev, "sequence_number", json_integer(o->seq++)) < 0
                 ? -1
                 : gps_sse_format_json(sse, type, NULL, ev);
    json_decref(ev);
    return rc;
}

/* Append the decimal digits of v (>= 0). */
static int append_uint(gp_buf *b, unsigned long long v)
{
    char d[24];
    size_t i = sizeof d;
    do {
        d[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return gp_buf_append(b, d + i, sizeof d - i);
}

/*
 * Events written as text (issue 24, fourth round): the ones that carry a
 * message's whole text or the response object, once per reply each. Built
 * as jansson objects and dumped, they were about 300,000 instructions a
 * Responses request: the text escaped three times over, the response
 * dumped twice. Each writes the bytes emit() wrote for the same object:
 * its fields in json_pack's order, then "type" and "sequence_number"
 * (test_responses compares them with jansson's over texts that need
 * escapes and over text that is not UTF-8). A frame is opened by
 * ev_begin and closed by ev_end, which takes the sequence number whether
 * or not the event could be written, as emit() did.
 */
/* false when it could not be written whole: the caller's part is then not
 * written either, and ev_end cuts the frame (never a frame with its
 * "data: {" left out and the rest after it). */
static bool ev_begin(gp_buf *sse, const char *type)
{
    return LIT(sse, "event: ") == 0 && gp_buf_append(sse, type, strlen(type)) == 0 &&
           LIT(sse, "\ndata: {") == 0;
}

/* ok: the caller's part was written; else the event is cut back to at.
 * Returns whether the event was written. */
static bool ev_end(gps_resp_out *o, gp_buf *sse, size_t at, const char *type, bool ok)
{
    unsigned long long seq = (unsigned long long)o->seq++;
    if (!ok || LIT(sse, ",\"type\":\"") < 0 ||
        gp_buf_append(sse, type, strlen(type)) < 0 ||
        LIT(sse, "\",\"sequence_number\":") < 0 || append_uint(sse, seq) < 0 ||
        LIT(sse, "}\n\n") < 0) {
        gp_buf_truncate(sse, at);
        return false;
    }
    return true;
}

/* A frame (or frames) that could not be written whole: sse back to at,
 * the sequence number back to seq; -1. */
static int cut(gps_resp_out *o, gp_buf *sse, size_t at, long long seq)
{
    gp_buf_truncate(sse, at);
    o->seq = seq;
    return -1;
}

/* "item_id":"ID","output_index":N,"content_index":0, (item ids are ours:
 * "msg_" and hex, nothing to escape) */
static int item_head(gp_buf *b, const char *item_id, int idx)
{
    return LIT(b, "\"item_id\":\"") < 0 ||
                   gp_buf_append(b, item_id, strlen(item_id)) < 0 ||
                   LIT(b, "\",\"output_index\":") < 0 ||
                   append_uint(b, (unsigned)idx) < 0 ||
                   LIT(b, ",\"content_index\":0,") < 0
               ? -1
               : 0;
}

/* {"type":"output_text","text":"TEXT","annotations":[]}: esc is the text
 * already escaped. */
static int part_text(gp_buf *b, const gp_buf *esc)
{
    return LIT(b, "{\"type\":\"output_text\",\"text\":\"") < 0 ||
                   gp_buf_append(b, esc->data ? esc->data : "", esc->len) < 0 ||
                   LIT(b, "\",\"annotations\":[]}") < 0
               ? -1
               : 0;
}

/* "output_index":N,"item":{"type":"message","id":"ID","status":S,
 * "role":"assistant","content":[ -- the content and "]}" are the caller's. */
static int message_head(gp_buf *b, const char *item_id, int idx, const char *status)
{
    return LIT(b, "\"output_index\":") < 0 || append_uint(b, (unsigned)idx) < 0 ||
                   LIT(b, ",\"item\":{\"type\":\"message\",\"id\":\"") < 0 ||
                   gp_buf_append(b, item_id, strlen(item_id)) < 0 ||
                   LIT(b, "\",\"status\":\"") < 0 ||
                   gp_buf_append(b, status, strlen(status)) < 0 ||
                   LIT(b, "\",\"role\":\"assistant\",\"content\":[") < 0
               ? -1
               : 0;
}

/* A new message item: output_item.added, then content_part.added. */
static bool message_added(gps_resp_out *o, gp_buf *sse, const char *item_id, int idx)
{
    static const gp_buf empty = {0};
    size_t at = sse->len;
    bool ok = ev_begin(sse, "response.output_item.added") &&
              message_head(sse, item_id, idx, "in_progress") == 0 &&
              LIT(sse, "]}") == 0;
    if (!ev_end(o, sse, at, "response.output_item.added", ok))
        return false;
    at = sse->len;
    ok = ev_begin(sse, "response.content_part.added") && item_head(sse, item_id, idx) == 0 && LIT(sse, "\"part\":") == 0 &&
         part_text(sse, &empty) == 0;
    return ev_end(o, sse, at, "response.content_part.added", ok);
}

/* A message's end: output_text.done, content_part.done, output_item.done,
 * each with the whole text (escaped once here). Text that is not UTF-8
 * is written as "", which is what json_stringn's refusal made of it. */
static bool message_done(gps_resp_out *o, gp_buf *sse, const char *item_id, int idx,
                         const char *t, size_t n)
{
    gp_buf esc;
    gp_buf_init(&esc);
    bool ok = !gp_utf8_valid(t, n) || gp_json_escape_append(&esc, t, n) == 0;
    size_t at = sse->len;
    bool w = ok && ev_begin(sse, "response.output_text.done") && item_head(sse, item_id, idx) == 0 &&
             LIT(sse, "\"text\":\"") == 0 &&
             gp_buf_append(sse, esc.data ? esc.data : "", esc.len) == 0 &&
             LIT(sse, "\"") == 0;
    bool all = ev_end(o, sse, at, "response.output_text.done", w);
    at = sse->len;
    w = ok && ev_begin(sse, "response.content_part.done") && item_head(sse, item_id, idx) == 0 && LIT(sse, "\"part\":") == 0 &&
        part_text(sse, &esc) == 0;
    all = ev_end(o, sse, at, "response.content_part.done", w) && all;
    at = sse->len;
    w = ok && ev_begin(sse, "response.output_item.done") &&
        message_head(sse, item_id, idx, "completed") == 0 && part_text(sse, &esc) == 0 &&
        LIT(sse, "]}") == 0;
    all = ev_end(o, sse, at, "response.output_item.done", w) && all;
    gp_buf_free(&esc);
    return all;
}

/* {"response":R,"type":TYPE,"sequence_number":N}, R dumped already (r). */
static bool response_event(gps_resp_out *o, gp_buf *sse, const char *type, const gp_buf *r)
{
    size_t at = sse->len;
    bool ok = r->len > 0 && ev_begin(sse, type) && LIT(sse, "\"response\":") == 0 &&
              gp_buf_append(sse, r->data, r->len) == 0;
    return ev_end(o, sse, at, type, ok);
}

int gps_resp_open(gps_resp_out *o, gp_buf *sse)
{
    /* Both events carry the same response: written once. */
    size_t at = sse->len;
    long long seq = o->seq;
    gp_buf d;
    gp_buf_init(&d);
    json_t *r = NULL;
    if (render(&d, o, NULL, "in_progress", false, 0, 0) < 0) {
        r = response_json(o, NULL, "in_progress", false, 0, 0, NULL);
        if (!r || gp_json_dump_append(&d, r) < 0)
            gp_buf_truncate(&d, 0);
    }
    bool ok = response_event(o, sse, "response.created", &d) &&
              response_event(o, sse, "response.in_progress", &d);
    gp_buf_free(&d);
    json_decref(r);
    return ok ? 0 : cut(o, sse, at, seq);
}

static struct gps_resp_item *open_message(gps_resp_out *o)
{
    struct gps_resp_item *last = o->n_items ? &o->items[o->n_items - 1] : NULL;
    if (last && !last->is_call && !last->done)
        return last;
    return NULL;
}

/* Close the open message, if any. false: its events could not all be
 * written (ENOMEM). */
static bool close_message(gps_resp_out *o, gp_buf *sse)
{
    struct gps_resp_item *it = open_message(o);
    if (!it)
        return true;
    int idx = (int)(it - o->items);
    it->text_to = o->text.len;
    const char *t = o->text.data ? o->text.data + it->text_from : "";
    bool ok = message_done(o, sse, it->item_id, idx, t, it->text_to - it->text_from);
    it->done = true;
    return ok;
}

/*
 * A text delta, the one event a reply sends per token: rendered as text
 * (the same fields, in the same order, that json_pack + json_dumps wrote)
 * rather than built as a jansson object and dumped, which was a fifth of
 * the server's instructions per relayed token. item_id is ours ("msg_" +
 * hex), so it needs no escaping; the delta is escaped as sse.h says.
 */
static int delta_render(gps_resp_out *o, gp_buf *sse, const char *item_id, int idx,
                        const char *t, size_t n)
{
    static const char pre[] = "event: response.output_text.delta\ndata: {\"item_id\":\"";
    static const char mid[] = ",\"content_index\":0,\"delta\":\"";
    static const char post[] =
        "\",\"logprobs\":[],\"type\":\"response.output_text.delta\",\"sequence_number\":";
    if (o->delta_pre_item != idx + 1) {
        /* Everything before the text is the item's: made once. */
        gp_buf p;
        gp_buf_init(&p);
        int rc = gp_buf_append(&p, pre, sizeof pre - 1) < 0 ||
                 gp_buf_append(&p, item_id, strlen(item_id)) < 0 ||
                 gp_buf_append(&p, "\",\"output_index\":", 17) < 0 ||
                 append_uint(&p, (unsigned)idx) < 0 || gp_buf_append(&p, mid, sizeof mid - 1) < 0;
        if (!rc && p.len <= sizeof o->delta_pre) {
            memcpy(o->delta_pre, p.data, p.len);
            o->delta_pre_len = p.len;
            o->delta_pre_item = idx + 1;
        }
        gp_buf_free(&p);
        if (o->delta_pre_item != idx + 1)
            return -1;
    }
    /* The rest, after the text: post, the sequence number, the end. */
    char tail[sizeof post - 1 + 24 + 3];
    memcpy(tail, post, sizeof post - 1);
    size_t tl = sizeof post - 1;
    char d[24];
    size_t i = sizeof d;
    unsigned long long v = (unsigned long long)o->seq;
    do {
        d[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    memcpy(tail + tl, d + i, sizeof d - i);
    tl += sizeof d - i;
    memcpy(tail + tl, "}\n\n", 3);
    tl += 3;
    if (gp_buf_append(sse, o->delta_pre, o->delta_pre_len) < 0 ||
        gps_json_escape_append(sse, t, n) < 0 || gp_buf_append(sse, tail, tl) < 0)
        return -1; /* (the caller cuts sse back) */
    o->seq++;
    return 0;
}

int gps_resp_text(gps_resp_out *o, gp_buf *sse, const char *t, size_t n)
{
    if (n == 0)
        return 0;
    size_t at = sse->len, tlen = o->text.len;
    long long seq = o->seq;
    int n_items = o->n_items;
    struct gps_resp_item *it = open_message(o);
    if (!it) {
        it = new_item(o);
        if (!it) /* past GPS_RESP_MAX_ITEMS the text is not shown, as before */
            return o->n_items >= GPS_RESP_MAX_ITEMS ? 0 : -1;
        gps_id_new("msg_", it->item_id, sizeof it->item_id);
        it->text_from = it->text_to = o->text.len;
        if (!message_added(o, sse, it->item_id, (int)(it - o->items)))
            goto fail;
    }
    if (gp_buf_append(&o->text, t, n) < 0)
        goto fail;
    it->text_to = o->text.len;
    if (delta_render(o, sse, it->item_id, (int)(it - o->items), t, n) < 0)
        goto fail;
    return 0;
fail:
    /* Nothing of this call stays: no frame, no text, no new item. */
    gp_buf_truncate(&o->text, tlen);
    if (o->n_items > n_items)
        o->n_items = n_items;
    else
        it->text_to = tlen;
    return cut(o, sse, at, seq);
}

static struct gps_resp_item *call_item(gps_resp_out *o, int call)
{
    for (int i = 0; i < o->n_items; i++)
        if (o->items[i].is_call && o->items[i].call == call)
            return &o->items[i];
    return NULL;
}

static bool utf8_str(const char *s)
{
    return s && gp_utf8_valid(s, strlen(s));
}

int gps_resp_call(gps_resp_out *o, gp_buf *sse, const gps_tool_calls *calls, int i,
                  bool started, const char *args)
{
    size_t at = sse->len;
    long long seq = o->seq;
    if (!close_message(o, sse))
        return cut(o, sse, at, seq);
    struct gps_resp_item *it = call_item(o, i);
    if (started && !it) {
        it = new_item(o);
        if (!it) /* past GPS_RESP_MAX_ITEMS the call is not shown, as before */
            return o->n_items >= GPS_RESP_MAX_ITEMS ? 0 : cut(o, sse, at, seq);
        it->is_call = true;
        it->call = i;
        gps_id_new("fc_", it->item_id, sizeof it->item_id);
        /* (a call id or name that is not UTF-8: the event left out, as
         * json_pack refused it before; anything else is ENOMEM) */
        if (emit(o, sse, "response.output_item.added",
                 json_pack("{s:i,s:o}", "output_index", (int)(it - o->items), "item",
                           item_json(o, it, calls, false))) < 0 &&
            utf8_str(calls->v[i].id) && utf8_str(calls->v[i].name)) {
            o->n_items--; /* the item it made */
            return cut(o, sse, at, seq);
        }
    }
    if (!it || !args || !*args)
        return 0;
    if (emit(o, sse, "response.function_call_arguments.delta",
             json_pack("{s:s,s:i,s:s}", "item_id", it->item_id, "output_index",
                       (int)(it - o->items), "delta", args)) < 0 &&
        utf8_str(args))
        return cut(o, sse, at, seq);
    return 0;
}

/* Close every open item: a message's done events, each call's. false:
 * an event found no memory (arguments that are not UTF-8 are "", and a
 * call id or name that is not UTF-8 leaves its event out, as before). */
static bool close_items(gps_resp_out *o, gp_buf *sse, const gps_tool_calls *calls)
{
    if (!close_message(o, sse))
        return false;
    for (int i = 0; i < o->n_items; i++) {
        struct gps_resp_item *it = &o->items[i];
        if (!it->is_call || it->done)
            continue;
        const gps_tool_call *c = &calls->v[it->call];
        const char *ad = c->args.data ? c->args.data : "";
        json_t *a = json_stringn(ad, c->args.len);
        if (!a && gp_utf8_valid(ad, c->args.len))
            return false;
        if (emit(o, sse, "response.function_call_arguments.done",
                 json_pack("{s:s,s:i,s:o}", "item_id", it->item_id, "output_index", i,
                           "arguments", a ? a : json_string(""))) < 0)
            return false;
        it->done = true;
        if (emit(o, sse, "response.output_item.done",
                 json_pack("{s:i,s:o}", "output_index", i, "item",
                           item_json(o, it, calls, true))) < 0 &&
            utf8_str(c->id) && utf8_str(c->name))
            return false;
    }
    return true;
}

/* gps_resp_close_final; *ok: every event was written (else ENOMEM). */
static json_t *close_final(gps_resp_out *o, gp_buf *sse, const gps_tool_calls *calls,
                           const char *finish_reason, long long prompt_tokens,
                           long long completion_tokens, json_t *meta, bool *ok)
{
    *ok = close_items(o, sse, calls);
    bool incomplete = finish_reason && strcmp(finish_reason, "length") == 0;
    const char *status = incomplete ? "incomplete" : "completed";
    /* The final response is this event's without x_pool_meta (meta is
     * added last): a shallow copy, not a second build. */
    json_t *r = response_json(o, calls, status, true, prompt_tokens, completion_tokens, NULL);
    json_t *fin = r ? json_copy(r) : NULL;
    /* (a set that fails frees meta: never an event without x_pool_meta) */
    if (r && meta && json_object_set_new(r, "x_pool_meta", meta) < 0) {
        json_decref(r);
        r = NULL;
    } else if (!r) {
        json_decref(meta);
    }
    if (r) {
        gp_buf d;
        gp_buf_init(&d);
        if (gp_json_dump_append(&d, r) < 0)
            gp_buf_truncate(&d, 0);
        if (!response_event(o, sse, incomplete ? "response.incomplete" : "response.completed",
                            &d))
            *ok = false;
        gp_buf_free(&d);
        json_decref(r);
    } else {
        *ok = false;
    }
    return fin;
}

json_t *gps_resp_close_final(gps_resp_out *o, gp_buf *sse, const gps_tool_calls *calls,
                             const char *finish_reason, long long prompt_tokens,
                             long long completion_tokens, json_t *meta)
{
    bool ok;
    return close_final(o, sse, calls, finish_reason, prompt_tokens, completion_tokens, meta,
                       &ok);
}

int gps_resp_close(gps_resp_out *o, gp_buf *sse, const gps_tool_calls *calls,
                   const char *finish_reason, long long prompt_tokens,
                   long long completion_tokens, json_t *meta)
{
    int rc = gps_resp_close_text(o, sse, calls, finish_reason, prompt_tokens,
                                 completion_tokens, meta, NULL);
    json_decref(meta);
    return rc;
}

int gps_resp_close_meta_text(gps_resp_out *o, gp_buf *sse, const gps_tool_calls *calls,
                              const char *finish_reason, long long prompt_tokens,
                             long long completion_tokens, const char *meta, size_t meta_len,
                             gp_buf *fin)
{
    bool incomplete = finish_reason && strcmp(finish_reason, "length") == 0;
    const char *type = incomplete ? "response.incomplete" : "response.completed";
    size_t at0 = sse->len;
    long long seq0 = o->seq;
    bool ok = false;
    gp_buf own;
    gp_buf_init(&own);
    gp_buf *r = fin ? fin : &own;
    size_t from = r->len;
    if (!close_items(o, sse, calls))
        goto done;
    if (render(r, o, calls, incomplete ? "incomplete" : "completed", true, prompt_tokens,
               completion_tokens) < 0) {
        /* A string jansson refuses: the tree, as gps_resp_close_final. */
        /* The meta is ours, valid JSON: not loaded is ENOMEM, and the
         * checked load never hands back a tree that differs from it
         * (jansson alone can drop a byte of a long string and succeed). */
        json_t *m = meta ? gp_json_load_checked(meta, meta_len, 0, NULL) : NULL;
        json_t *f = meta && !m ? NULL
                               : close_final(o, sse, calls, finish_reason, prompt_tokens,
                                             completion_tokens, m, &ok);
        if (!f || (fin && gp_json_dump_append(fin, f) < 0))
            ok = false;
        json_decref(f);
        goto done;
    }
    /* The event's response is the stored one with x_pool_meta last. */
    size_t at = sse->len;
    bool begun = ev_begin(sse, type);
    size_t obj = sse->len + sizeof "\"response\":" - 1;
    ok = begun && LIT(sse, "\"response\":") == 0 &&
         gp_buf_append(sse, r->data + from, r->len - from) == 0 &&
         gps_resp_render_meta_text(sse, obj, meta, meta_len) == 0;
    ok = ev_end(o, sse, at, type, ok);
done:
    gp_buf_free(&own);
    if (ok)
        return 0;
    if (fin) {
        gp_buf_truncate(fin, from);
    }
    return cut(o, sse, at0, seq0);
}

int gps_resp_close_text(gps_resp_out *o, gp_buf *sse, const gps_tool_calls *calls,
                        const char *finish_reason, long long prompt_tokens,
                        long long completion_tokens, const json_t *meta, gp_buf *fin)
{
    gp_buf m;
    gp_buf_init(&m);
    int rc = meta && gp_json_dump_append(&m, meta) < 0
                 ? -1 /* (never a response without its x_pool_meta) */
                 : gps_resp_close_meta_text(o, sse, calls, finish_reason, prompt_tokens,
                                            completion_tokens,
                                            meta ? (m.data ? m.data : "") : NULL, m.len, fin);
    gp_buf_free(&m);
    return rc;
}

json_t *gps_resp_object(gps_resp_out *o, const gps_tool_calls *calls, const char *text,
                        size_t text_len, const char *finish_reason, long long prompt_tokens,
                        long long completion_tokens, json_t *meta)
{
    if (gps_resp_whole(o, calls, text, text_len) < 0) {
        json_decref(meta); /* (stolen) */
        return NULL;
    }
    bool incomplete = finish_reason && strcmp(finish_reason, "length") == 0;
    return response_json(o, calls, incomplete ? "incomplete" : "completed", true, prompt_tokens,
                         completion_tokens, meta);
}

int gps_resp_whole(gps_resp_out *o, const gps_tool_calls *calls, const char *text,
                   size_t text_len)
{
    /* The whole reply at once: its text as one message, then its calls
     * (past GPS_RESP_MAX_ITEMS a call is not shown, as in a stream). Made
     * aside and swapped in, so that out of memory leaves o as it was. */
    size_t n_calls = calls ? calls->n : 0;
    size_t n = (text_len > 0) + n_calls;
    if (n > GPS_RESP_MAX_ITEMS)
        n = GPS_RESP_MAX_ITEMS;
    struct gps_resp_item *items = n ? calloc(n, sizeof *items) : NULL;
    gp_buf t;
    gp_buf_init(&t);
    if ((n && !items) || (text_len > 0 && gp_buf_append(&t, text, text_len) < 0))
        goto fail;
    size_t k = 0;
    if (text_len > 0) {
        gps_id_new("msg_", items[k].item_id, sizeof items[k].item_id);
        items[k].text_to = t.len;
        items[k++].done = true;
    }
    for (size_t i = 0; k < n; i++, k++) {
        items[k].is_call = true;
        items[k].call = (int)i;
        items[k].done = true;
        gps_id_new("fc_", items[k].item_id, sizeof items[k].item_id);
    }
    free(o->items);
    gp_buf_free(&o->text);
    o->items = items;
    o->n_items = o->cap_items = (int)n;
    o->text = t;
    o->delta_pre_item = 0; /* (its items are new) */
    return 0;
fail:
    free(items);
    gp_buf_free(&t);
    return -1;
}

/* ------------------------------------------------------------------ */
/* Stored state                                                        */
/* ------------------------------------------------------------------ */

static json_t *call_json(const gps_tool_call *c)
{
    json_t *args = json_stringn(c->args.data ? c->args.data : "", c->args.len);
    return json_pack("{s:s,s:s,s:{s:s,s:o}}", "id", c->id, "type", "function", "function",
                     "name", c->name, "arguments", args ? args : json_string(""));
}

json_t *gps_resp_context(const gps_resp_out *o, const gps_tool_calls *calls,
                         const json_t *messages, size_t n_instr, json_t **items)
{
    json_t *ctx = json_array(), *its = json_array();
    json_t *reply = json_pack("{s:s,s:n}", "role", "assistant", "content");
    gp_buf text;
    gp_buf_init(&text);
    if (!ctx || !its || !reply)
        goto fail;
    for (size_t i = n_instr; i < json_array_size(messages); i++)
        if (json_array_append(ctx, json_array_get(messages, i)) < 0)
            goto fail;
    json_t *tc = NULL;
    for (int i = 0; i < o->n_items; i++) {
        const struct gps_resp_item *it = &o->items[i];
        json_t *frag;
        if (it->is_call) {
            if (!calls || it->call < 0 || (size_t)it->call >= calls->n)
                continue;
            json_t *c = call_json(&calls->v[it->call]);
            if (!tc && json_object_set_new(reply, "tool_calls", tc = json_array()) < 0)
                goto fail;
            json_array_append(tc, c);
            frag = json_pack("{s:s,s:n,s:[o]}", "role", "assistant", "content", "tool_calls",
                             c);
        } else {
            const char *t = o->text.data ? o->text.data + it->text_from : "";
            size_t n = it->text_to - it->text_from;
            gp_buf_append(&text, t, n);
            frag = json_pack("{s:s,s:s%}", "role", "assistant", "content", t, n);
        }
        if (!frag || json_array_append_new(its, json_pack("{s:s,s:o}", "id", it->item_id,
                                                          "message", frag)) < 0)
            goto fail;
    }
    if (text.len)
        json_object_set_new(reply, "content", json_stringn(text.data, text.len));
    if (json_array_append_new(ctx, reply) < 0) {
        reply = NULL;
        goto fail;
    }
    gp_buf_free(&text);
    *items = its;
    return ctx;
fail:
    gp_buf_free(&text);
    json_decref(ctx);
    json_decref(its);
    json_decref(reply);
    return NULL;
}

json_t *gps_resp_final(const gps_resp_out *o, const gps_tool_calls *calls,
                       const char *finish_reason, long long prompt_tokens,
                       long long completion_tokens)
{
    bool incomplete = finish_reason && strcmp(finish_reason, "length") == 0;
    return response_json(o, calls, incomplete ? "incomplete" : "completed", true, prompt_tokens,
                         completion_tokens, NULL);
}

/*
 * gps_resp_context's two values as text (issue 24, fifth round): the
 * conversation and the items, dumped as gp_json_dump_append wrote the
 * trees, each text escaped once per value instead of built, dumped and
 * freed. Key order is the tree's: "role", "content" (null, or the texts
 * joined), then "tool_calls" in the reply; "id", "message" per item.
 * Where jansson refuses a string (a text, id or name that is not UTF-8)
 * gps_resp_context gives no conversation at all: -1 here, and the caller
 * falls back to it, so the store keeps what it kept.
 */
static int call_text(gp_buf *b, const gps_tool_call *c)
{
    return LIT(b, "{\"id\":") < 0 || str_strict(b, c->id) < 0 ||
                   LIT(b, ",\"type\":\"function\",\"function\":{\"name\":") < 0 ||
                   str_strict(b, c->name) < 0 || LIT(b, ",\"arguments\":") < 0 ||
                   str_or_empty(b, c->args.data, c->args.len) < 0 || LIT(b, "}}") < 0
               ? -1
               : 0;
}

static bool call_ok(const gps_tool_calls *calls, const struct gps_resp_item *it)
{
    return calls && it->call >= 0 && (size_t)it->call < calls->n;
}

/* The reply message: {"role":"assistant","content":C[,"tool_calls":[...]]}. */
static int reply_text(gp_buf *b, const gps_resp_out *o, const gps_tool_calls *calls)
{
    size_t n_text = 0;
    bool any_call = false;
    for (int i = 0; i < o->n_items; i++) {
        const struct gps_resp_item *it = &o->items[i];
        if (!it->is_call)
            n_text += it->text_to - it->text_from;
        else if (call_ok(calls, it))
            any_call = true;
    }
    if (LIT(b, "{\"role\":\"assistant\",\"content\":") < 0)
        return -1;
    if (n_text == 0 && LIT(b, "null") < 0)
        return -1;
    if (n_text && LIT(b, "\"") < 0)
        return -1;
    for (int i = 0; n_text && i < o->n_items; i++) {
        const struct gps_resp_item *it = &o->items[i];
        if (!it->is_call && gp_json_escape_append(b, o->text.data + it->text_from,
                                                  it->text_to - it->text_from) < 0)
            return -1;
    }
    if (n_text && LIT(b, "\"") < 0)
        return -1;
    if (any_call) {
        if (LIT(b, ",\"tool_calls\":[") < 0)
            return -1;
        bool first = true;
        for (int i = 0; i < o->n_items; i++) {
            const struct gps_resp_item *it = &o->items[i];
            if (!it->is_call || !call_ok(calls, it))
                continue;
            if ((!first && LIT(b, ",") < 0) || call_text(b, &calls->v[it->call]) < 0)
                return -1;
            first = false;
        }
        if (LIT(b, "]") < 0)
            return -1;
    }
    return LIT(b, "}");
}

static int context_text(const gps_resp_out *o, const gps_tool_calls *calls,
                        const json_t *messages, size_t n_instr, gp_buf *ctx, gp_buf *items)
{
    /* Every text must be UTF-8 (json_pack's "s%" refuses the item else). */
    for (int i = 0; i < o->n_items; i++) {
        const struct gps_resp_item *it = &o->items[i];
        if (!it->is_call && !gp_utf8_valid(o->text.data ? o->text.data + it->text_from : "",
                                           it->text_to - it->text_from))
            return -1;
    }
    if (LIT(ctx, "[") < 0)
        return -1;
    for (size_t i = n_instr; i < json_array_size(messages); i++)
        if (gp_json_dump_append(ctx, json_array_get(messages, i)) < 0 || LIT(ctx, ",") < 0)
            return -1;
    if (reply_text(ctx, o, calls) < 0 || LIT(ctx, "]") < 0 || LIT(items, "[") < 0)
        return -1;
    bool first = true;
    for (int i = 0; i < o->n_items; i++) {
        const struct gps_resp_item *it = &o->items[i];
        if (it->is_call && !call_ok(calls, it))
            continue;
        if ((!first && LIT(items, ",") < 0) || LIT(items, "{\"id\":\"") < 0 ||
            gp_buf_append(items, it->item_id, strlen(it->item_id)) < 0 ||
            LIT(items, "\",\"message\":{\"role\":\"assistant\",\"content\":") < 0)
            return -1;
        first = false;
        if (it->is_call) {
            if (LIT(items, "null,\"tool_calls\":[") < 0 ||
                call_text(items, &calls->v[it->call]) < 0 || LIT(items, "]}}") < 0)
                return -1;
        } else if (LIT(items, "\"") < 0 ||
                   gp_json_escape_append(items, o->text.data ? o->text.data + it->text_from : "",
                                         it->text_to - it->text_from) < 0 ||
                   LIT(items, "\"}}") < 0) {
            return -1;
        }
    }
    return LIT(items, "]");
}

int gps_resp_context_text(const gps_resp_out *o, const gps_tool_calls *calls,
                          const json_t *messages, size_t n_instr, gp_buf *ctx, gp_buf *items)
{
    size_t c0 = ctx->len, i0 = items->len;
    if (context_text(o, calls, messages, n_instr, ctx, items) == 0)
        return 0;
    ctx->len = c0;
    items->len = i0;
    json_t *its = NULL;
    json_t *c = gps_resp_context(o, calls, messages, n_instr, &its);
    int rc = c && gp_json_dump_append(ctx, c) == 0 && gp_json_dump_append(items, its) == 0
                 ? 0
                 : -1;
    json_decref(c);
    json_decref(its);
    if (rc < 0) {
        ctx->len = c0;
        items->len = i0;
    }
    return rc;
}
