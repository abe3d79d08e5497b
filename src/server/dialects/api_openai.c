/* api_openai: see api_openai.h. */
#include "server/dialects/api_openai.h"


#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/http/errors.h"
#include "server/http/held.h"
#include "server/http/http.h"
#include "server/dialects/openai_render.h"
#include "server/dialects/relay.h"
#include "server/dialects/rformat.h"
#include "server/dialects/reqcheck.h"
#include "server/metrics.h"
#include "server/http/sse.h"
#include "server/http/ids.h"

#define DEFAULT_MAX_TOKENS_COMPLETION 16   /* OpenAI's documented default */
#define DEFAULT_MAX_TOKENS_CHAT 1024       /* OpenAI: "until the context ends"; we bound it */
#define MAX_STOP 4

/* ------------------------------------------------------------------ */
/* Request validation                                                  */
/* ------------------------------------------------------------------ */



/* An assistant message's tool_calls: [{id, type:"function", function:
 * {name, arguments:string}}]. */
static int tool_calls_check(const json_t *calls, size_t idx, char *msg, size_t msglen)
{
    if (!json_is_array(calls)) {
        snprintf(msg, msglen, "messages[%zu].tool_calls must be an array", idx);
        return -1;
    }
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c)
    {
        const json_t *fn = json_object_get(c, "function");
        if (!json_is_string(json_object_get(c, "id")) ||
            !json_is_string(json_object_get(fn, "name")) ||
            !json_is_string(json_object_get(fn, "arguments"))) {
            snprintf(msg, msglen,
                     "messages[%zu].tool_calls[%zu] must be {\"id\":string,\"type\":"
                     "\"function\",\"function\":{\"name\":string,\"arguments\":string}}",
                     idx, i);
            return -1;
        }
    }
    return 0;
}

int gps_openai_tools_check(const json_t *tools, const json_t *tool_choice, char *msg,
                           size_t msglen, const char **param)
{
    *param = "tools";
    if (!json_is_array(tools)) {
        snprintf(msg, msglen, "'tools' must be an array");
        return -1;
    }
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        const char *type = json_string_value(json_object_get(t, "type"));
        const json_t *fn = json_object_get(t, "function");
        const json_t *params = json_object_get(fn, "parameters");
        if (!type || strcmp(type, "function") != 0 || !json_is_object(fn) ||
            !json_is_string(json_object_get(fn, "name")) ||
            (params && !json_is_null(params) && !json_is_object(params))) {
            snprintf(msg, msglen,
                     "tools[%zu] must be {\"type\":\"function\",\"function\":{\"name\":string,"
                     "\"parameters\":object}}",
                     i);
            return -1;
        }
    }
    *param = "tool_choice";
    if (!tool_choice || json_is_null(tool_choice))
        return 0;
    if (json_is_string(tool_choice)) {
        const char *v = json_string_value(tool_choice);
        if (strcmp(v, "auto") == 0 || strcmp(v, "none") == 0 || strcmp(v, "required") == 0)
            return 0;
    } else if (json_is_object(tool_choice)) {
        const char *type = json_string_value(json_object_get(tool_choice, "type"));
        const char *name =
            json_string_value(json_object_get(json_object_get(tool_choice, "function"), "name"));
        if (type && strcmp(type, "function") == 0 && name)
            return 0;
    }
    snprintf(msg, msglen, "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                          "{\"type\":\"function\",\"function\":{\"name\":string}}");
    return -1;
}

/* Chat content: a string, or {type:"text", text} parts concatenated
 * (gps_content_text). */
static int content_text(const json_t *c, size_t idx, char **out, char *msg, size_t msglen)
{
    static const char *const types[] = {"text", NULL};
    char field[40];
    snprintf(field, sizeof field, "messages[%zu]", idx);
    return gps_content_text(c, field, types, out, msg, msglen);
}

/* The request's helpers below share one shape: 0, or -1 with msg and
 * *param set (GPS_FAIL), or GPS_PARSE_OOM with msg and no param; what they
 * stored in the spec is the caller's to clear (gps_job_spec_clear), on
 * failure as on success. */

static int parse_model(const json_t *body, gps_job_spec *s, char *msg, size_t msglen,
                       const char **param)
{
    const json_t *model = json_object_get(body, "model");
    if (gps_absent(model))
        GPS_FAIL("model", "'model' is required");
    if (!json_is_string(model))
        GPS_FAIL("model", "'model' must be a string");
    if (json_string_length(model) == 0 || json_string_length(model) > GPS_MAX_MODEL_NAME)
        GPS_FAIL("model", "'model' must be a non-empty string of at most %d bytes",
                 GPS_MAX_MODEL_NAME);
    s->model = strdup(json_string_value(model));
    return 0;
fail:
    return -1;
}

static int parse_prompt(const json_t *body, gps_job_spec *s, char *msg, size_t msglen,
                        const char **param)
{
    const json_t *p = json_object_get(body, "prompt");
    if (gps_absent(p))
        GPS_FAIL("prompt", "'prompt' is required");
    if (json_is_array(p)) {
        if (json_array_size(p) != 1 || !json_is_string(json_array_get(p, 0)))
            GPS_FAIL("prompt", "'prompt' must be a string or an array of exactly one string "
                           "(token arrays and batches are not supported)");
        p = json_array_get(p, 0);
    }
    if (!json_is_string(p))
        GPS_FAIL("prompt", "'prompt' must be a string");
    s->prompt = strdup(json_string_value(p));
    return 0;
fail:
    return -1;
}

/* One chat message, appended to s->messages in the shape agents get. */
static int parse_message(const json_t *e, size_t i, gps_job_spec *s, char *msg, size_t msglen,
                         const char **param)
{
    int rc = -1;
    char *text = NULL;
    if (!json_is_object(e))
        GPS_FAIL("messages", "messages[%zu] must be an object", i);
    const json_t *role = json_object_get(e, "role");
    if (!json_is_string(role))
        GPS_FAIL("messages", "messages[%zu].role must be a string", i);
    const char *r = json_string_value(role);
    if (strcmp(r, "developer") == 0)
        r = "system";
    if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 &&
        strcmp(r, "assistant") != 0 && strcmp(r, "tool") != 0)
        GPS_FAIL("messages",
             "messages[%zu].role '%.40s' is not supported (system, developer, user, "
             "assistant, tool)",
             i, json_string_value(role));
    const json_t *c = json_object_get(e, "content");
    const json_t *calls = json_object_get(e, "tool_calls");
    /* What the helpers below refuse is this message (fail: not when
     * memory ran out). */
    *param = "messages";
    json_t *m;
    if (strcmp(r, "assistant") == 0 && !gps_absent(calls) &&
        !(json_is_array(calls) && json_array_size(calls) == 0)) {
        /* An earlier turn that called tools: kept as it is (content
         * may be null), validated so agents get a clean shape. */
        GPS_TRY(tool_calls_check(calls, i, msg, msglen));
        if (!gps_absent(c))
            GPS_TRY(content_text(c, i, &text, msg, msglen));
        m = json_pack("{s:s,s:O,s:s?}", "role", "assistant", "tool_calls", calls, "content",
                      text);
    } else if (strcmp(r, "tool") == 0) {
        const char *tcid = json_string_value(json_object_get(e, "tool_call_id"));
        if (!tcid)
            GPS_FAIL("messages", "messages[%zu].tool_call_id must be a string", i);
        GPS_TRY(gps_absent(c) ? gps_strdup_msg("", &text, msg, msglen)
                              : content_text(c, i, &text, msg, msglen));
        m = json_pack("{s:s,s:s,s:s}", "role", "tool", "tool_call_id", tcid, "content", text);
    } else {
        if (gps_absent(c))
            GPS_FAIL("messages", "messages[%zu].content is required", i);
        GPS_TRY(content_text(c, i, &text, msg, msglen));
        m = json_pack("{s:s,s:s}", "role", r, "content", text);
    }
    free(text);
    text = NULL;
    /* A message lost here would have the model answer another
     * conversation: out of memory fails the request instead. */
    if (json_array_append_new(s->messages, m) < 0)
        GPS_FAIL_OOM();
    *param = NULL;
    return 0;
fail:
    free(text);
    if (rc == GPS_PARSE_OOM)
        *param = NULL;
    return rc;
}

static int parse_messages(const json_t *body, gps_job_spec *s, char *msg, size_t msglen,
                          const char **param)
{
    int rc = -1;
    const json_t *m = json_object_get(body, "messages");
    if (gps_absent(m))
        GPS_FAIL("messages", "'messages' is required");
    if (!json_is_array(m))
        GPS_FAIL("messages", "'messages' must be an array");
    if (json_array_size(m) == 0)
        GPS_FAIL("messages", "'messages' must contain at least one message");
    s->messages = json_array();
    if (!s->messages)
        GPS_FAIL_OOM();
    size_t i;
    json_t *e;
    json_array_foreach(m, i, e)
        GPS_TRY(parse_message(e, i, s, msg, msglen, param));
    return 0;
fail:
    return rc;
}

/* max_tokens (max_completion_tokens is the newer chat name) */
static int parse_max_tokens(const json_t *body, bool chat, gps_job_spec *s, char *msg,
                            size_t msglen, const char **param)
{
    const char *mt_key = "max_tokens";
    const json_t *mt = json_object_get(body, "max_tokens");
    if (chat && gps_absent(mt)) {
        mt = json_object_get(body, "max_completion_tokens");
        mt_key = "max_completion_tokens";
    }
    if (!gps_absent(mt)) {
        if (!json_is_integer(mt))
            GPS_FAIL(mt_key, "'%s' must be an integer", mt_key);
        json_int_t v = json_integer_value(mt);
        if (v < 1 || v > GPS_MAX_TOKENS_LIMIT)
            GPS_FAIL(mt_key, "'%s' must be between 1 and %d (got %lld)", mt_key,
                     GPS_MAX_TOKENS_LIMIT, (long long)v);
        s->max_tokens = v;
    }
    return 0;
fail:
    return -1;
}

/* The penalties (checked, not used), temperature, top_p, top_k (an
 * extension: llama.cpp, vLLM), stop (up to 4 sequences) and seed. */
static int parse_sampling(const json_t *body, gps_job_spec *s, char *msg, size_t msglen,
                          const char **param)
{
    int rc = -1;
    double pen = 0;
    if (gps_check_number(body, "presence_penalty", "'presence_penalty'", -2, 2, &pen, msg,
                         msglen) < 0) {
        *param = "presence_penalty";
        goto fail;
    }
    if (gps_check_number(body, "frequency_penalty", "'frequency_penalty'", -2, 2, &pen, msg,
                         msglen) < 0) {
        *param = "frequency_penalty";
        goto fail;
    }
    GPS_TRY(gps_sampling_parse(body, s, 2, MAX_STOP, msg, msglen, param));
    if (gps_seed_parse(json_object_get(body, "seed"), s) < 0)
        GPS_FAIL("seed", "'seed' must be an integer");
    return 0;
fail:
    return rc;
}

static int parse_stream(const json_t *body, gps_openai_req *out, char *msg, size_t msglen,
                        const char **param)
{
    const json_t *stream = json_object_get(body, "stream");
    if (!gps_absent(stream)) {
        if (!json_is_boolean(stream))
            GPS_FAIL("stream", "'stream' must be a boolean");
        out->stream = json_is_true(stream);
    }
    const json_t *so = json_object_get(body, "stream_options");
    if (!gps_absent(so)) {
        if (!json_is_object(so))
            GPS_FAIL("stream_options", "'stream_options' must be an object");
        if (!out->stream)
            GPS_FAIL("stream_options", "'stream_options' is only allowed when 'stream' is true");
        const json_t *iu = json_object_get(so, "include_usage");
        if (!gps_absent(iu)) {
            if (!json_is_boolean(iu))
                GPS_FAIL("stream_options", "'stream_options.include_usage' must be a boolean");
            out->include_usage = json_is_true(iu);
        }
    }
    return 0;
fail:
    return -1;
}

/* user, and the options a pool cannot honour (refused rather than
 * answered as if they had been). */
static int parse_user_and_refused(const json_t *body, gps_job_spec *s, char *msg,
                                  size_t msglen, const char **param)
{
    int rc = -1;
    const json_t *user = json_object_get(body, "user");
    if (!gps_absent(user)) {
        if (!json_is_string(user) || json_string_length(user) > 256)
            GPS_FAIL("user", "'user' must be a string of at most 256 bytes");
        s->user = strdup(json_string_value(user));
        if (!s->user) /* the scheduler's affinity key: not dropped silently */
            GPS_FAIL_OOM();
    }

    const json_t *n = json_object_get(body, "n");
    if (!gps_absent(n) && (!json_is_integer(n) || json_integer_value(n) != 1))
        GPS_FAIL("n", "only n=1 is supported");
    const json_t *best_of = json_object_get(body, "best_of");
    if (!gps_absent(best_of) &&
        (!json_is_integer(best_of) || json_integer_value(best_of) != 1))
        GPS_FAIL("best_of", "only best_of=1 is supported");
    const json_t *echo = json_object_get(body, "echo");
    if (!gps_absent(echo) && !json_is_false(echo))
        GPS_FAIL("echo", "echo is not supported");
    const json_t *lp = json_object_get(body, "logprobs");
    if (!gps_absent(lp) && !json_is_false(lp) &&
        !(json_is_integer(lp) && json_integer_value(lp) == 0))
        GPS_FAIL("logprobs", "logprobs are not supported");
    const json_t *suffix = json_object_get(body, "suffix");
    if (!gps_absent(suffix))
        GPS_FAIL("suffix", "suffix is not supported");
    return 0;
fail:
    return rc;
}

/* tools and tool_choice, then response_format. */
static int parse_tools_and_format(const json_t *body, bool chat, gps_job_spec *s, char *msg,
                                  size_t msglen, const char **param)
{
    int rc = -1;
    const json_t *tools = json_object_get(body, "tools");
    const json_t *tchoice = json_object_get(body, "tool_choice");
    if (!gps_absent(tools)) {
        if (!chat)
            GPS_FAIL("tools", "tools are only supported by /v1/chat/completions");
        GPS_TRY(gps_openai_tools_check(tools, tchoice, msg, msglen, param));
        if (json_array_size(tools) > 0) {
            s->tools = json_deep_copy(tools);
            if (!gps_absent(tchoice))
                s->tool_choice = json_deep_copy(tchoice);
            /* Without them the model would answer as if no tool were offered. */
            if (!s->tools || (!gps_absent(tchoice) && !s->tool_choice))
                GPS_FAIL_OOM();
        }
    } else if (!gps_absent(tchoice) &&
               !(json_is_string(tchoice) && (strcmp(json_string_value(tchoice), "none") == 0 ||
                                             strcmp(json_string_value(tchoice), "auto") == 0))) {
        GPS_FAIL("tool_choice", "'tool_choice' needs 'tools'");
    }
    const json_t *rf = json_object_get(body, "response_format");
    if (!gps_absent(rf)) {
        const char *t = json_string_value(json_object_get(rf, "type"));
        if (!chat && (!t || strcmp(t, "text") != 0))
            GPS_FAIL("response_format", "response_format is only supported by "
                     "/v1/chat/completions");
        if (chat) {
            *param = "response_format"; /* what it refuses (fail: not out of memory) */
            GPS_TRY(gps_rformat_chat(rf, &s->response_format, msg, msglen));
            *param = NULL;
        }
    }
    return 0;
fail:
    if (rc == GPS_PARSE_OOM)
        *param = NULL;
    return rc;
}

int gps_openai_parse(const json_t *body, bool chat, gps_openai_req *out, char *msg,
                     size_t msglen, const char **param)
{
    memset(out, 0, sizeof *out);
    out->chat = chat;
    gps_job_spec *s = &out->spec;
    gps_spec_defaults(s, "openai");
    s->kind = chat ? GPS_JOB_CHAT : GPS_JOB_COMPLETION;
    s->max_tokens = chat ? DEFAULT_MAX_TOKENS_CHAT : DEFAULT_MAX_TOKENS_COMPLETION;
    *param = NULL;
    msg[0] = '\0';
    int rc = -1;

    if (!json_is_object(body))
        GPS_FAIL(NULL, "request body must be a JSON object");
    GPS_TRY(parse_model(body, s, msg, msglen, param));
    GPS_TRY(chat ? parse_messages(body, s, msg, msglen, param)
                 : parse_prompt(body, s, msg, msglen, param));
    GPS_TRY(parse_max_tokens(body, chat, s, msg, msglen, param));
    GPS_TRY(parse_sampling(body, s, msg, msglen, param));
    GPS_TRY(parse_stream(body, out, msg, msglen, param));
    GPS_TRY(parse_user_and_refused(body, s, msg, msglen, param));
    GPS_TRY(parse_tools_and_format(body, chat, s, msg, msglen, param));
    /* Pool extension. */
    GPS_TRY(gps_pool_options_parse(json_object_get(body, "x_pool_options"), s, msg, msglen,
                                   param));

    /* model and prompt are copied unchecked above: a copy missing is memory. */
    if (!s->model || (!chat && !s->prompt) || (chat && !s->messages))
        GPS_FAIL_OOM();
    return 0;
fail:
    gps_job_spec_clear(s);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Handlers                                                            */
/* ------------------------------------------------------------------ */

typedef gps_relay_ctx oa_ctx;

/* One in-flight client request: subscriber of its job. Freed when the
 * reply is complete or the client went away (never while the job still
 * calls it: unsubscribe first, which only marks). */
typedef struct oa_stream {
    gps_relay rl;                   /* the client side (relay.h) */
    oa_ctx *ctx;
    bool chat, stream;
    bool tools_ignored;             /* the request's tools were dropped (warning) */
    gps_tool_calls calls;           /* tool calls relayed so far */
    gps_oa_out out;                 /* the reply's bytes (openai_render.h) */
} oa_stream;

static void on_job_event(gps_job *job, gps_event_type type, json_t *ev, void *arg);
static bool render_text(void *arg, gps_job *job, const char *text, size_t n);
static bool render_event(void *arg, gps_job *job, gps_event_type type, json_t *ev);

static void stream_free(void *arg)
{
    oa_stream *st = arg;
    gps_relay_clear(&st->rl);
    gps_tool_calls_free(&st->calls);
    gps_oa_out_clear(&st->out);
    free(st);
}

static const gps_relay_ops OPS = {
    .api = "openai",
    .dialect = GPS_DIALECT_OPENAI,
    .error_event = NULL,
    .on_event = on_job_event,
    .free = stream_free,
    .render_text = render_text,
    .render_event = render_event,
};

/* 0, or -1: the first frame found no memory (the caller fails the reply). */
static int ensure_started(oa_stream *st)
{
    if (st->rl.s.started)
        return 0;
    gps_relay_start(&st->rl);
    return gps_oa_open(&st->out, &st->rl.s.out);
}

#define TOOLS_IGNORED                                                                      \
    "tools were ignored: no live agent serving this model reports supports_tools"

/* pool_meta plus this request's own warnings (new reference). *oom: it
 * could not be built (NULL is then no answer: a reply without its
 * warnings would hide that the tools were dropped). */
static json_t *stream_meta(oa_stream *st, gps_job *job, bool *oom)
{
    json_t *meta = gps_pool_meta(job);
    *oom = !meta && gps_pool_meta_shown(job);
    if (meta && st->tools_ignored &&
        json_array_append_new(json_object_get(meta, "warnings"), json_string(TOOLS_IGNORED)) <
            0) {
        json_decref(meta);
        meta = NULL;
        *oom = true;
    }
    return meta;
}

/* The end: the stream's last chunks, or the whole body. Out of memory:
 * 500 (a stream: its error event) rather than a reply with a part left
 * out. */
static void end(oa_stream *st, gps_job *job)
{
    const char *fr = gps_oa_finish_reason(gps_job_finish_reason(job), st->calls.n);
    long long pt = gps_job_prompt_tokens(job), ct = gps_job_completion_tokens(job);
    bool oom;
    if (!st->stream) {
        json_t *meta = stream_meta(st, job, &oom);
        json_t *body = oom ? NULL
                           : gps_oa_body(&st->out, &st->calls, gps_job_text(job),
                                         gps_job_text_len(job), fr, pt, ct, meta);
        if (body)
            gps_relay_end_body(&st->rl, body, true);
        else
            gps_relay_fail_oom(&st->rl);
        return;
    }
    if (ensure_started(st) < 0) {
        gps_relay_fail_oom(&st->rl);
        return;
    }
    /* x_pool_meta rendered as text: no tree to build and dump (issue 24). */
    static const char *const ignored[] = {TOOLS_IGNORED};
    gp_buf meta;
    gp_buf_init(&meta);
    int mrc = gps_pool_meta_append(&meta, job, ignored, st->tools_ignored ? 1 : 0);
    if (mrc < 0) { /* ENOMEM: the tree's way (which may fail the same) */
        json_t *m = stream_meta(st, job, &oom);
        if (oom) {
            gp_buf_free(&meta);
            gps_relay_fail_oom(&st->rl);
            return;
        }
        mrc = gps_oa_close(&st->out, &st->rl.s.out, fr, pt, ct, m);
    } else {
        mrc = gps_oa_close_text(&st->out, &st->rl.s.out, fr, pt, ct,
                                mrc == 0 ? (meta.data ? meta.data : "") : NULL, meta.len);
    }
    gp_buf_free(&meta);
    if (mrc < 0) /* the error event in place of the end */
        gps_relay_fail_oom(&st->rl);
    else
        gps_relay_end_stream(&st->rl);
}

/* One event, rendered now. Returns true when the reply is complete. */
static bool handle_event(oa_stream *st, gps_job *job, gps_event_type type, json_t *ev)
{
    if (type == GPS_EV_TOKEN && !st->stream)
        return false;
    if (type == GPS_EV_TOOL_CALL && st->chat) {
        bool started = false;
        int i = gps_tool_calls_add(&st->calls, ev, &started);
        if (i == GPS_TOOL_CALLS_OOM)
            return gps_relay_fail_oom(&st->rl);
        if (i < 0 || !st->stream)
            return false;
        if (ensure_started(st) < 0 ||
            gps_oa_call(&st->out, &st->rl.s.out, &st->calls, i, started,
                        json_string_value(json_object_get(ev, "arguments"))) < 0)
            return gps_relay_fail_oom(&st->rl);
        gps_relay_send_output(&st->rl);
        return false;
    }
    if (type == GPS_EV_END) {
        end(st, job);
        return true;
    }
    if (type == GPS_EV_ERROR) {
        gps_relay_fail(&st->rl, ev, NULL);
        return true;
    }
    return false;
}

static bool render_text(void *arg, gps_job *job, const char *text, size_t n)
{
    (void)job;
    oa_stream *st = arg;
    if (ensure_started(st) < 0 || gps_oa_text(&st->out, &st->rl.s.out, text, n) < 0)
        return gps_relay_fail_oom(&st->rl);
    gps_relay_send_output(&st->rl);
    return false;
}

static bool render_event(void *arg, gps_job *job, gps_event_type type, json_t *ev)
{
    return handle_event(arg, job, type, ev);
}

static void on_job_event(gps_job *job, gps_event_type type, json_t *ev, void *arg)
{
    oa_stream *st = arg;
    if (!st->stream)
        handle_event(st, job, type, ev);
    else
        gps_relay_stream_event(&st->rl, job, type, ev);
}

static void handle_generate(gps_req *r, oa_ctx *c, bool chat)
{
    json_t *body = gps_req_job_json(r);
    if (!body) {
        gps_relay_count_req(&OPS, c->metrics, r, "invalid_request");
        return;
    }
    gps_openai_req oreq;
    char msg[512];
    const char *param = NULL;
    int rc = gps_openai_parse(body, chat, &oreq, msg, sizeof msg, &param);
    json_decref(body);
    if (rc < 0) {
        const char *code;
        int status = gps_parse_refusal(rc, &code);
        gps_relay_refuse(&OPS, c->metrics, r, status, code, msg, param);
        return;
    }
    oa_stream *st = calloc(1, sizeof *st);
    if (!st) {
        gps_job_spec_clear(&oreq.spec);
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
        return;
    }
    gps_relay_init(&st->rl, &OPS, st, c->jobs, c->metrics, r);
    st->ctx = c;
    st->chat = chat;
    st->stream = oreq.stream;
    char id[48];
    gps_id_new(chat ? "chatcmpl-" : "cmpl-", id, sizeof id);
    if (oreq.spec.tools && !gps_model_takes_tools(gps_jobs_registry(c->jobs), oreq.spec.model)) {
        /* No agent could take them: answer without tools rather than fail. */
        json_decref(oreq.spec.tools);
        json_decref(oreq.spec.tool_choice);
        oreq.spec.tools = oreq.spec.tool_choice = NULL;
        st->tools_ignored = true;
    }
    gps_oa_out_init(&st->out, chat, oreq.include_usage, id, gp_now_wall_ms() / 1000,
                    oreq.spec.model);
    gps_job *job = gps_relay_submit(&st->rl, &oreq.spec, r, c->request_timeout_sec + 30);
    if (!job) {
        stream_free(st);
        return;
    }
    /* The model that serves (a fallback may have taken the request). */
    gps_oa_out_set_model(&st->out, gps_job_model(job));
}

static void h_completions(gps_req *r, void *arg)
{
    handle_generate(r, arg, false);
}

static void h_chat(gps_req *r, void *arg)
{
    handle_generate(r, arg, true);
}

static void iso8601(char *out, size_t n, int64_t wall_ms)
{
    time_t t = (time_t)(wall_ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* One entry of the models list, in both dialects' fields (OpenAI's
 * object/created/owned_by, Anthropic's type/display_name/created_at). */
static json_t *model_entry(const char *id, int64_t created_wall_ms)
{
    char ts[32];
    iso8601(ts, sizeof ts, created_wall_ms);
    return json_pack("{s:s,s:s,s:I,s:s,s:s,s:s,s:s}", "id", id, "object", "model", "created",
                     (json_int_t)(created_wall_ms / 1000), "owned_by", "gpupool", "type",
                     "model", "display_name", id, "created_at", ts);
}

static int cmp_id(const void *a, const void *b)
{
    const char *x = json_string_value(json_object_get(*(json_t *const *)a, "id"));
    const char *y = json_string_value(json_object_get(*(json_t *const *)b, "id"));
    return strcmp(x ? x : "", y ? y : "");
}

/* The models this server's agents serve and those only another server's
 * agents serve (reached by a hand-off, docs/scaling.md 3e), sorted by id:
 * behind a balancer every server lists the same models. */
static void h_models(gps_req *r, void *arg)
{
    oa_ctx *c = arg;
    size_t n = 0;
    registry_model_entry *list;
    bool listed = registry_models_list(gps_jobs_registry(c->jobs), &list, &n) == 0;
    json_t *data = json_array();
    json_t *seen = json_object();
    json_t *body = NULL;
    /* Every model listed or none: a list with one left out would tell the
     * client the pool does not serve it. */
    bool ok = listed && data && seen;
    for (size_t i = 0; ok && i < n; i++)
        ok = json_array_append_new(data, model_entry(list[i].id, list[i].created_wall_ms)) ==
                 0 &&
             json_object_set_new(seen, list[i].id, json_true()) == 0;
    const json_t *peers = gps_jobs_peer_models(c->jobs);
    const char *name;
    json_t *v;
    int64_t now = gp_now_wall_ms();
    json_object_foreach((json_t *)peers, name, v)
    {
        if (ok && !json_object_get(seen, name))
            ok = json_array_append_new(data, model_entry(name, now)) == 0;
    }
    free(list);
    if (!ok)
        goto oom;
    size_t total = json_array_size(data);
    if (total > n) /* peers' names joined the registry's sorted list */
        gp_json_array_sort(data, cmp_id); /* ENOMEM: unsorted, still whole */
    body = json_pack("{s:s,s:O,s:b}", "object", "list", "data", data, "has_more", 0);
    if (!body ||
        json_object_set(body, "first_id",
                        total ? json_object_get(json_array_get(data, 0), "id") : json_null()) <
            0 ||
        json_object_set(body, "last_id",
                        total ? json_object_get(json_array_get(data, total - 1), "id")
                              : json_null()) < 0)
        goto oom;
    json_decref(seen);
    json_decref(data);
    gps_http_send_json(r->req, 200, body);
    return;
oom:
    json_decref(body);
    json_decref(seen);
    json_decref(data);
    gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
}

static const gps_route ROUTES[] = {
    {EVHTTP_REQ_POST, "/v1/completions", GPS_DIALECT_OPENAI, GPS_ROLE_CLIENT, h_completions, NULL},
    {EVHTTP_REQ_POST, "/v1/chat/completions", GPS_DIALECT_OPENAI, GPS_ROLE_CLIENT, h_chat, NULL},
    {EVHTTP_REQ_GET, "/v1/models", GPS_DIALECT_OPENAI, GPS_ROLE_CLIENT, h_models, NULL},
};

int gps_openai_register(gps_http *h, gps_relay_ctx *c)
{
    return gps_http_add_routes(h, ROUTES, sizeof ROUTES / sizeof ROUTES[0], c);
}
