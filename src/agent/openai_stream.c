/*
 * openai_stream: see openai_stream.h. Bytes in, job events out; no I/O.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "agent/openai_stream.h"
#include "agent/oai_chunk.h"
#include "common/gp_json.h"
#include "common/gp_stop.h"
#include "common/gp_util.h"

#define MAX_ERRBODY (64u << 10)     /* error bodies: kept for the message only */
#define MAX_JSONBODY (16u << 20)    /* a non-streamed reply (lenient path) */
#define MAX_TOOL_CALLS 128

void oai_stream_init(oai_stream *s, const agent_job_sink *sink, const char *job_id, bool chat,
                     bool count, const json_t *stops, size_t max_line)
{
    memset(s, 0, sizeof *s);
    s->sink = *sink;
    s->job_id = job_id;
    s->chat = chat;
    s->count = count;
    s->stops = stops;
    s->prompt_tokens = s->completion_tokens = -1;
    agent_sse_init(&s->sse, max_line);
    gp_buf_init(&s->raw);
    gp_buf_init(&s->pending);
    gp_buf_init(&s->text);
    oai_chunk_memo_init(&s->memo);
    s->t_start_us = gp_now_mono_us();
    s->last_byte_ms = gp_now_mono_ms();
}

void oai_stream_free(oai_stream *s)
{
    agent_sse_free(&s->sse);
    gp_buf_free(&s->raw);
    gp_buf_free(&s->pending);
    gp_buf_free(&s->text);
    oai_chunk_memo_free(&s->memo);
    free(s->stop_seq);
    s->stop_seq = NULL;
}

void oai_stream_reset(oai_stream *s, bool count)
{
    size_t max_line = s->sse.max_line;
    s->count = count;
    s->failed = false;
    s->err_code[0] = s->err_msg[0] = '\0';
    s->status = 0;
    s->mode = OAI_BODY_UNKNOWN;
    s->raw.len = 0;
    s->done_seen = false;
    agent_sse_free(&s->sse);
    agent_sse_init(&s->sse, max_line);
}

void oai_stream_fail(oai_stream *s, const char *code, const char *fmt, ...)
{
    if (s->failed)
        return; /* keep the first cause */
    s->failed = true;
    snprintf(s->err_code, sizeof s->err_code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err_msg, sizeof s->err_msg, fmt, ap);
    va_end(ap);
}

void oai_stream_started(oai_stream *s)
{
    if (s->started_sent)
        return;
    s->started_sent = true;
    s->sink.started(s->sink.ctx);
}

static void send_text(oai_stream *s, const char *text, size_t len)
{
    if (len == 0)
        return;
    oai_stream_started(s); /* the contract: started before the first token */
    oai_schema_text(s->check, text, len);
    s->sink.token(s->sink.ctx, text, len, -1);
}

/* Text held back for a possible stop string goes out (before a tool call,
 * at the reply's end). */
static void flush_pending(oai_stream *s)
{
    send_text(s, s->pending.data, s->pending.len);
    gp_buf_consume(&s->pending, s->pending.len);
}

/* A piece of the reply's text. The job's stop strings are matched here,
 * not upstream (issue 26 item 4: an upstream that stops on one rarely says
 * which): text that may start one is held back; on a match the text before
 * it goes out, the rest of the reply is ignored and the reply ends with
 * that string (the transport then drops the transfer). */
static void emit_text(oai_stream *s, const char *text, size_t len)
{
    if (len == 0 || s->stop_seq)
        return;
    if (!s->t_first_us)
        s->t_first_us = gp_now_mono_us();
    s->ntokens++; /* an upstream chunk is about one token */
    if (json_array_size(s->stops) == 0) {
        send_text(s, text, len);
        return;
    }
    gp_buf_append(&s->pending, text, len);
    size_t safe = 0, at = 0;
    int hit = gp_stop_scan(s->pending.data ? s->pending.data : "", s->pending.len, s->stops,
                           &safe, &at);
    send_text(s, s->pending.data, safe);
    if (hit >= 0) {
        s->stop_seq = strdup(json_string_value(json_array_get(s->stops, (size_t)hit)));
        if (!s->stop_seq)
            oai_stream_fail(s, "INTERNAL_ERROR", "out of memory");
        gp_buf_consume(&s->pending, s->pending.len);
        return;
    }
    gp_buf_consume(&s->pending, safe);
}

static void take_usage(oai_stream *s, json_t *usage)
{
    if (!json_is_object(usage))
        return;
    json_t *pt = json_object_get(usage, "prompt_tokens");
    json_t *ct = json_object_get(usage, "completion_tokens");
    if (json_is_integer(pt))
        s->prompt_tokens = json_integer_value(pt);
    if (json_is_integer(ct))
        s->completion_tokens = json_integer_value(ct);
}

static void take_finish(oai_stream *s, json_t *c0)
{
    const char *fr = json_string_value(json_object_get(c0, "finish_reason"));
    if (fr && *fr)
        snprintf(s->finish, sizeof s->finish, "%s", fr);
}

/* The tool_calls array of a delta (streamed: pieces with an index; the
 * first piece of a call carries id and name) or of a message (whole
 * calls). Each piece becomes one tool_call event. Returns 0, or 2 with the
 * job failed. */
static int take_tool_calls(oai_stream *s, json_t *calls, bool streamed)
{
    if (!calls || json_is_null(calls) || s->stop_seq)
        return 0; /* after a stop string the reply is over */
    if (!json_is_array(calls)) {
        oai_stream_fail(s, "UPSTREAM_MALFORMED", "upstream tool_calls is not an array");
        return 2;
    }
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c)
    {
        json_t *ix = json_object_get(c, "index");
        json_t *fn = json_object_get(c, "function");
        json_t *args = json_object_get(fn, "arguments");
        /* Without an index (whole messages; some servers' streams): a
         * piece with a function name starts the next call, one without
         * continues the last. */
        long long index = json_is_integer(ix) ? json_integer_value(ix)
                          : !streamed || json_string_value(json_object_get(fn, "name"))
                              ? s->ntool_calls
                              : s->ntool_calls - 1;
        if (!json_is_object(c) || (ix && !json_is_integer(ix)) || index < 0 ||
            index >= MAX_TOOL_CALLS || (fn && !json_is_object(fn)) ||
            (args && !json_is_null(args) && !json_is_string(args))) {
            oai_stream_fail(s, "UPSTREAM_MALFORMED", "upstream sent a malformed tool call");
            return 2;
        }
        const char *id = json_string_value(json_object_get(c, "id"));
        const char *name = json_string_value(json_object_get(fn, "name"));
        bool first = index >= s->ntool_calls;
        if (first) {
            /* A call starts: it must say which function (ids are made up
             * when the upstream gives none). Calls arrive in index order. */
            if (!name || index != s->ntool_calls) {
                oai_stream_fail(s, "UPSTREAM_MALFORMED",
                                "upstream tool call %lld starts without a function name", index);
                return 2;
            }
            s->ntool_calls++;
        }
        char made[160];
        if (first && !id) {
            snprintf(made, sizeof made, "call_%s_%lld", s->job_id ? s->job_id : "", index);
            id = made;
        }
        if (!s->t_first_us)
            s->t_first_us = gp_now_mono_us();
        oai_stream_started(s);
        flush_pending(s); /* text held back for a stop string comes first */
        oai_schema_tool(s->check, (int)index, first ? name : NULL,
                        json_string_value(args) ? json_string_value(args) : "",
                        json_string_value(args) ? json_string_length(args) : 0);
        if (s->sink.tool_call)
            s->sink.tool_call(s->sink.ctx, (int)index, first ? id : NULL, first ? name : NULL,
                          json_string_value(args) ? json_string_value(args) : "",
                          json_string_value(args) ? json_string_length(args) : 0);
    }
    return 0;
}

/* One parsed chunk object (streamed), or the whole reply (not streamed). */
static int handle_object(oai_stream *s, json_t *obj, bool streamed)
{
    if (!json_is_object(obj)) {
        oai_stream_fail(s, "UPSTREAM_MALFORMED", "upstream sent a chunk that is not a JSON object");
        return 2;
    }
    json_t *err = json_object_get(obj, "error");
    if (err && !json_is_null(err)) {
        const char *m = json_string_value(json_object_get(err, "message"));
        if (!m)
            m = json_string_value(err);
        oai_stream_fail(s, "UPSTREAM_ERROR", "upstream reported an error: %.200s",
                        m ? m : "(no message)");
        return 2;
    }
    json_t *choices = json_object_get(obj, "choices");
    if (choices && !json_is_array(choices)) {
        oai_stream_fail(s, "UPSTREAM_MALFORMED",
                        "upstream chunk has a 'choices' that is not an array");
        return 2;
    }
    json_t *c0 = json_array_get(choices, 0);
    if (c0) {
        if (!json_is_object(c0)) {
            oai_stream_fail(s, "UPSTREAM_MALFORMED", "upstream choice is not an object");
            return 2;
        }
        json_t *t;
        if (s->chat)
            t = json_object_get(json_object_get(c0, streamed ? "delta" : "message"), "content");
        else
            t = json_object_get(c0, "text");
        if (t && !json_is_null(t) && !json_is_string(t)) {
            oai_stream_fail(s, "UPSTREAM_MALFORMED", "upstream text is not a string");
            return 2;
        }
        if (json_is_string(t))
            emit_text(s, json_string_value(t), json_string_length(t));
        if (s->chat && take_tool_calls(s,
                                       json_object_get(json_object_get(c0, streamed ? "delta"
                                                                                    : "message"),
                                                       "tool_calls"),
                                       streamed) != 0)
            return 2;
        take_finish(s, c0);
    } else if (!streamed) {
        oai_stream_fail(s, "UPSTREAM_MALFORMED", "upstream reply has no choices");
        return 2;
    }
    take_usage(s, json_object_get(obj, "usage"));
    /* An upstream that is itself a pool says how it ran the request (the
     * last stream chunk or the body); the end event passes it on. */
    json_t *meta = json_object_get(obj, "x_pool_meta");
    if (json_is_object(meta) && s->sink.upstream_meta)
        s->sink.upstream_meta(s->sink.ctx, meta);
    return 0;
}

/* SSE event data. Returns 0 to go on, 1 at [DONE], 2 on failure. */
static int on_sse_data(void *ud, const char *data, size_t len)
{
    oai_stream *s = ud;
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        s->done_seen = true;
        return 1;
    }
    /* A plain token chunk (nearly all of them) without a JSON tree; what
     * it would have done with one is emit its text (oai_chunk.h). */
    oai_chunk ch;
    if (oai_chunk_read(&s->memo, data, len, s->chat, &s->text, &ch)) {
        if (ch.text) /* in handle_object's order: text, finish, usage */
            emit_text(s, ch.text, ch.len);
        if (ch.finish_len > 0)
            snprintf(s->finish, sizeof s->finish, "%.*s", (int)ch.finish_len, ch.finish);
        if (ch.prompt_tokens >= 0)
            s->prompt_tokens = ch.prompt_tokens;
        if (ch.completion_tokens >= 0)
            s->completion_tokens = ch.completion_tokens;
        if (s->stop_seq) {
            s->done_seen = true; /* a stop string ended the reply: nothing more is read */
            return 1;
        }
        return 0;
    }
    json_error_t je;
    json_t *obj = gp_json_load_checked(data, len, 0, &je);
    if (!obj && json_error_code(&je) == json_error_out_of_memory) {
        oai_stream_fail(s, "AGENT_OUT_OF_MEMORY", "the agent ran out of memory while reading an upstream "
                        "chunk");
        return 2;
    }
    if (!obj) {
        oai_stream_fail(s, "UPSTREAM_MALFORMED", "upstream sent a chunk that is not JSON (%s)",
                        je.text);
        return 2;
    }
    int rc = handle_object(s, obj, true);
    json_decref(obj);
    if (rc == 0 && s->stop_seq) {
        s->done_seen = true; /* a stop string ended the reply: nothing more is read */
        return 1;
    }
    return rc;
}

/* Fills err/msg for a finished non-2xx reply. */
static void fail_status(oai_stream *s)
{
    json_t *b = gp_json_load_checked(s->raw.data ? s->raw.data : "", s->raw.len, 0, NULL);
    const char *m = json_string_value(json_object_get(json_object_get(b, "error"), "message"));
    if (!m)
        m = json_string_value(json_object_get(b, "error"));
    if (!m)
        m = json_string_value(json_object_get(b, "message"));
    if (m)
        oai_stream_fail(s, "UPSTREAM_ERROR", "upstream replied HTTP %ld: %.200s", s->status, m);
    else
        oai_stream_fail(s, "UPSTREAM_ERROR", "upstream replied HTTP %ld", s->status);
    json_decref(b);
}

/* The usual events read where they lie (issue 24): while the SSE reader
 * holds nothing (no partial line, no event being assembled), each whole
 * "data: <line>\n\n" at the front of p, its line without a CR, is
 * exactly one event with that line as its data, as agent_sse_feed would
 * read it; it goes to on_sse_data without the reader's two line scans.
 * Stops at anything else (another field, a comment, CRLF, a data line
 * without its blank line yet, an overlong line), which agent_sse_feed
 * then reads from *used on, from the same clean state. Returns 0, or what
 * on_sse_data returned (1 at [DONE], 2 on failure). */
static int sse_whole_events(oai_stream *s, const char *p, size_t n, size_t *used)
{
    const agent_sse *r = &s->sse;
    size_t i = 0;
    int rc = 0;
    if (r->line.len > 0 || r->have_data || r->pending_cr)
        return 0;
    while (rc == 0 && n - i > 8 && memcmp(p + i, "data: ", 6) == 0) {
        const char *d = p + i + 6;
        const char *nl = memchr(d, '\n', n - i - 6);
        if (!nl || (size_t)(nl - p) - i > r->max_line || nl + 1 == p + n || nl[1] != '\n' ||
            memchr(d, '\r', (size_t)(nl - d)))
            break;
        i = (size_t)(nl - p) + 2;
        rc = on_sse_data(s, d, (size_t)(nl - d));
    }
    *used = i;
    return rc;
}

uint64_t oai_stream_idle_ms(oai_stream *s, uint64_t now_ms)
{
    if (s->got_bytes || now_ms < s->last_byte_ms) {
        s->got_bytes = false;
        s->last_byte_ms = now_ms;
    }
    return now_ms - s->last_byte_ms;
}

int oai_stream_body(oai_stream *s, const char *p, size_t n)
{
    s->got_bytes = true;
    if (s->done_seen)
        return 1; /* after [DONE]: the rest of the body is not read */
    switch (s->mode) {
    case OAI_BODY_UNKNOWN:
        oai_stream_fail(s, "UPSTREAM_MALFORMED", "upstream reply has no Content-Type");
        return -1;
    case OAI_BODY_ERROR:
        if (s->raw.len < MAX_ERRBODY)
            gp_buf_append(&s->raw, p, n < MAX_ERRBODY - s->raw.len ? n : MAX_ERRBODY - s->raw.len);
        return 0;
    case OAI_BODY_JSON:
        if (s->raw.len + n > MAX_JSONBODY) {
            oai_stream_fail(s, "UPSTREAM_MALFORMED", "upstream reply larger than %u bytes",
                            MAX_JSONBODY);
            return -1;
        }
        gp_buf_append(&s->raw, p, n);
        return 0;
    case OAI_BODY_SSE: {
        size_t used = 0;
        int rc = sse_whole_events(s, p, n, &used);
        if (rc == 0)
            rc = agent_sse_feed(&s->sse, p + used, n - used, on_sse_data, s);
        if (rc == 0 || rc == 1)
            return rc; /* 1: [DONE] */
        if (rc < 0)
            oai_stream_fail(s, "UPSTREAM_MALFORMED",
                            "upstream sent an SSE line longer than %zu bytes", s->sse.max_line);
        return -1;
    }
    }
    return -1;
}

int oai_stream_header(oai_stream *s, const char *p, size_t n)
{
    s->got_bytes = true;
    if (n >= 5 && strncmp(p, "HTTP/", 5) == 0) {
        /* status line: parse the code */
        const char *sp = memchr(p, ' ', n);
        s->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        s->mode = s->status >= 200 && s->status < 300 ? OAI_BODY_UNKNOWN : OAI_BODY_ERROR;
        return 0;
    }
    if ((n == 2 && p[0] == '\r' && p[1] == '\n') || (n == 1 && p[0] == '\n')) {
        /* The headers are in: a usable generation reply has started. */
        if (!s->count && s->status >= 200 && s->status < 300 &&
            (s->mode == OAI_BODY_SSE || s->mode == OAI_BODY_JSON))
            oai_stream_started(s);
        return 0;
    }
    if (n > 13 && strncasecmp(p, "content-type:", 13) == 0 && s->status >= 200 &&
        s->status < 300) {
        const char *v = p + 13, *end = p + n;
        while (v < end && (*v == ' ' || *v == '\t'))
            v++;
        size_t left = (size_t)(end - v);
        if (left >= 17 && strncasecmp(v, "text/event-stream", 17) == 0)
            s->mode = OAI_BODY_SSE;
        else if (left >= 16 && strncasecmp(v, "application/json", 16) == 0)
            s->mode = OAI_BODY_JSON;
        else {
            size_t l = 0;
            while (l < left && l < 60 && v[l] != '\r' && v[l] != '\n' && v[l] != ';')
                l++;
            oai_stream_fail(s, "UPSTREAM_MALFORMED", "upstream replied with Content-Type '%.*s'",
                            (int)l, v);
            return -1;
        }
    }
    return 0;
}

/* The reply's end when it ran its course: the metrics event, the stop
 * string, end. */
static void finish_ok(oai_stream *s)
{
    flush_pending(s); /* no stop string came */
    uint64_t now = gp_now_mono_us();
    long long ct = s->completion_tokens >= 0 ? s->completion_tokens : s->ntokens;
    json_t *m = json_object();
    if (s->t_first_us)
        json_object_set_new(m, "ttft_ms",
                            json_real((double)(s->t_first_us - s->t_start_us) / 1000.0));
    if (s->t_first_us && now > s->t_first_us && ct > 1)
        json_object_set_new(m, "tokens_per_sec",
                            json_real((double)(ct - 1) * 1e6 / (double)(now - s->t_first_us)));
    json_object_set_new(m, "total_ms", json_real((double)(now - s->t_start_us) / 1000.0));
    s->sink.metrics(s->sink.ctx, m);
    json_decref(m);
    /* A reply that called tools ends with tool_calls whatever the
     * upstream said (some say "stop"), unless it ran out of tokens. */
    const char *fr = s->stop_seq                      ? "stop"
                     : strcmp(s->finish, "length") == 0 ? "length"
                     : s->ntool_calls > 0 || strcmp(s->finish, "tool_calls") == 0
                         ? "tool_calls"
                         : "stop";
    /* Structured output the upstream was asked for, checked once the reply
     * ran its course (cut by max_tokens or a stop string: the finish says
     * so). The text went out already; the job fails rather than end. */
    char why[600];
    int verdict = s->check && !s->stop_seq && strcmp(fr, "length") != 0
                      ? oai_schema_verdict(s->check, why, sizeof why)
                      : 0;
    if (verdict != 0) {
        /* Memory that ran out while checking is no verdict on the reply:
         * the agent's own failure, failed over. */
        s->sink.error(s->sink.ctx,
                      verdict == OAI_SCHEMA_NOMEM ? "AGENT_OUT_OF_MEMORY" : "UPSTREAM_INVALID_OUTPUT",
                      why);
        return;
    }
    if (s->stop_seq && strcmp(fr, "stop") == 0 && s->sink.stop_sequence)
        s->sink.stop_sequence(s->sink.ctx, s->stop_seq);
    s->sink.end(s->sink.ctx, fr, s->prompt_tokens, ct);
}

void oai_stream_finish(oai_stream *s, const char *xfer_code, const char *xfer_msg)
{
    if (!s->failed && xfer_code && !s->done_seen)
        oai_stream_fail(s, xfer_code, "%s", xfer_msg ? xfer_msg : "upstream transfer failed");
    if (!s->failed && (s->status < 200 || s->status >= 300))
        fail_status(s);
    if (!s->failed && s->mode == OAI_BODY_SSE && !s->done_seen) {
        int rc = agent_sse_finish(&s->sse, on_sse_data, s);
        if (rc == 0 && !s->done_seen && !s->failed)
            oai_stream_fail(s, "UPSTREAM_ERROR", "upstream stream ended before [DONE]");
    }
    if (!s->failed && s->mode == OAI_BODY_JSON) {
        json_error_t je;
        json_t *obj = gp_json_load_checked(s->raw.data ? s->raw.data : "", s->raw.len, 0, &je);
        if (!obj && json_error_code(&je) == json_error_out_of_memory) {
            oai_stream_fail(s, "AGENT_OUT_OF_MEMORY", "the agent ran out of memory while reading the "
                            "upstream's reply");
        } else if (!obj) {
            oai_stream_fail(s, "UPSTREAM_MALFORMED", "upstream reply is not JSON (%s)", je.text);
        } else {
            oai_stream_started(s);
            handle_object(s, obj, false);
        }
        json_decref(obj);
    }
    if (!s->failed && s->mode != OAI_BODY_SSE && s->mode != OAI_BODY_JSON)
        oai_stream_fail(s, "UPSTREAM_MALFORMED", "upstream reply has no usable body");
    if (s->failed) {
        s->sink.error(s->sink.ctx, s->err_code, s->err_msg);
        return;
    }
    oai_stream_started(s);
    finish_ok(s);
}

void oai_stream_finish_counted(oai_stream *s, long long prompt_tokens)
{
    if (s->prompt_tokens < 0)
        s->prompt_tokens = prompt_tokens;
    oai_stream_started(s);
    finish_ok(s);
}
