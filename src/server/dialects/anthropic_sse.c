/* anthropic_sse: see anthropic_sse.h. */
#include "server/dialects/anthropic_sse.h"

#include <stdio.h>
#include <string.h>

#include "server/dialects/api_anthropic.h"
#include "common/gp_util.h"
#include "server/http/textcheck.h"

/* The open field of the text delta template (the delta holds no other
 * string from outside, so the marker is always its one occurrence). */
#define DELTA_MARKER "@@gpupool-text@@"

void gps_an_out_init(gps_an_out *o, const char *id, const char *model)
{
    memset(o, 0, sizeof *o);
    snprintf(o->id, sizeof o->id, "%s", id ? id : "");
    snprintf(o->model, sizeof o->model, "%s", model ? model : "");
    o->open_block = -1;
    o->delta_tpl_index = -1;
}

void gps_an_out_clear(gps_an_out *o)
{
    gps_sse_tpl_free(&o->delta_tpl);
}

json_t *gps_anthropic_usage(long long in, long long out)
{
    return json_pack("{s:I,s:I}", "input_tokens", (json_int_t)(in > 0 ? in : 0), "output_tokens",
                     (json_int_t)(out > 0 ? out : 0));
}

/*
 * The per-reply events written as text (issue 24, fourth round): built as
 * jansson objects and dumped they were ~40,000 instructions a reply.
 * Each writes the bytes emit() wrote for the same json_pack object (its
 * keys in the pack's order; test_anthropic_sse compares them with
 * jansson's). An event either is written whole or not at all (cut back to
 * where it began), as a failed gps_sse_format_json left it.
 */
#define LIT(b, s) gp_buf_append((b), (s), sizeof(s) - 1)

/* "s" as json_pack takes it: NULL or not UTF-8 fails the whole object. */
static int put_str(gp_buf *b, const char *s)
{
    if (!s || !gp_utf8_valid(s, strlen(s)))
        return -1;
    return gp_json_str_append(b, s);
}

/* {"input_tokens":I,"output_tokens":O}, as gps_anthropic_usage. */
static int put_usage(gp_buf *b, long long in, long long out)
{
    return LIT(b, "{\"input_tokens\":") < 0 || gp_buf_append_int(b, in > 0 ? in : 0) < 0 ||
                   LIT(b, ",\"output_tokens\":") < 0 || gp_buf_append_int(b, out > 0 ? out : 0) < 0
               ? -1
               : LIT(b, "}");
}

/* ok: the event from at on is whole; its end written here, or cut back.
 * Returns whether it was written. */
static bool ev_end(gp_buf *sse, size_t at, bool ok)
{
    if (!ok || LIT(sse, "}\n\n") < 0) {
        gp_buf_truncate(sse, at);
        return false;
    }
    return true;
}

/* sse back to at (a frame that could not be written whole); -1. */
static int cut(gp_buf *sse, size_t at)
{
    gp_buf_truncate(sse, at);
    return -1;
}

static bool close_block(gps_an_out *o, gp_buf *sse)
{
    if (o->open_block < 0)
        return true;
    size_t at = sse->len;
    bool ok = ev_end(sse, at,
                     LIT(sse, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\","
                              "\"index\":") == 0 &&
                         gp_buf_append_int(sse, o->open_block) == 0);
    o->open_block = -1;
    return ok;
}

static bool open_text_block(gps_an_out *o, gp_buf *sse)
{
    bool ok = close_block(o, sse);
    o->open_block = o->next_block++;
    o->open_is_text = true;
    size_t at = sse->len;
    return ev_end(sse, at,
                  LIT(sse, "event: content_block_start\ndata: {\"type\":\"content_block_start\","
                           "\"index\":") == 0 &&
                      gp_buf_append_int(sse, o->open_block) == 0 &&
                      LIT(sse, ",\"content_block\":{\"type\":\"text\",\"text\":\"\"}") == 0) &&
           ok;
}

static bool utf8_str(const char *s)
{
    return s && gp_utf8_valid(s, strlen(s));
}

int gps_an_open(gps_an_out *o, gp_buf *sse, long long input_tokens, const json_t *warnings,
                bool with_text)
{
    size_t at0 = sse->len, at = at0;
    bool ok = LIT(sse, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":"
                       "{\"id\":") == 0 &&
              put_str(sse, o->id) == 0 &&
              LIT(sse, ",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":") ==
                  0 &&
              put_str(sse, o->model) == 0 &&
              LIT(sse, ",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":") == 0 &&
              put_usage(sse, input_tokens, 0) == 0;
    if (ok && json_array_size(warnings))
        ok = LIT(sse, ",\"x_pool_meta\":{\"warnings\":") == 0 &&
             gp_json_dump_append(sse, warnings) == 0 && LIT(sse, "}") == 0;
    /* An id or model that is not UTF-8 left message_start out before (as
     * json_pack refused it): still so; anything else is ENOMEM. */
    if (!ev_end(sse, at, ok && LIT(sse, "}") == 0) && utf8_str(o->id) && utf8_str(o->model))
        return cut(sse, at0);
    if (with_text && !open_text_block(o, sse))
        return cut(sse, at0);
    if (LIT(sse, "event: ping\ndata: {\"type\":\"ping\"}\n\n") < 0)
        return cut(sse, at0);
    return 0;
}

/* gps_an_text's slow path: the delta built and dumped. */
static int text_slow(gps_an_out *o, gp_buf *sse, const char *t, size_t n)
{
    json_t *d = json_pack("{s:s,s:i,s:{s:s,s:s%}}", "type", "content_block_delta", "index",
                          o->open_block, "delta", "type", "text_delta", "text", t, n);
    int rc = gps_sse_format_json(sse, "content_block_delta", NULL, d); /* (NULL: -1) */
    json_decref(d);
    return rc;
}

int gps_an_text(gps_an_out *o, gp_buf *sse, const char *t, size_t n)
{
    /* Not UTF-8 on its own cannot happen for whole agent tokens (jansson
     * checked the upload); a piece cut inside a character would be sent
     * as an empty delta, as before. */
    if (!gps_text_utf8(t, n))
        n = 0;
    size_t at = sse->len;
    if ((o->open_block < 0 || !o->open_is_text) && !open_text_block(o, sse))
        return cut(sse, at); /* text after a tool call: a new text block */
    if (o->delta_tpl_index != o->open_block) {
        /* Every delta of a text block is the same but for its text: render
         * it once (an escape and two copies per token, as OpenAI's). */
        gps_sse_tpl_free(&o->delta_tpl);
        o->delta_tpl_index = -1;
        json_t *d = json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index",
                              o->open_block, "delta", "type", "text_delta", "text",
                              DELTA_MARKER);
        if (d && gps_sse_tpl_init(&o->delta_tpl, "content_block_delta", d, DELTA_MARKER) == 0)
            o->delta_tpl_index = o->open_block;
        else
            o->delta_tpl.pre = NULL;
        json_decref(d);
    }
    int rc = o->delta_tpl.pre && o->delta_tpl_index == o->open_block
                 ? gps_sse_tpl_emit(sse, &o->delta_tpl, t, n)
                 : text_slow(o, sse, t, n);
    return rc < 0 ? cut(sse, at) : 0;
}

int gps_an_call(gps_an_out *o, gp_buf *sse, const gps_tool_calls *calls, int i, bool started,
                const char *args)
{
    size_t at = sse->len;
    if (started) {
        if (!close_block(o, sse))
            return cut(sse, at);
        char id[160];
        gps_anthropic_tool_use_id(calls->v[i].id, id, sizeof id);
        o->open_block = o->next_block++;
        o->open_is_text = false;
        o->open_call = i;
        json_t *e = json_pack("{s:s,s:i,s:{s:s,s:s,s:s,s:{}}}", "type", "content_block_start",
                              "index", o->open_block, "content_block", "type", "tool_use", "id",
                              id, "name", calls->v[i].name, "input");
        /* (an id or name that is not UTF-8: the event left out, as before) */
        if (gps_sse_format_json(sse, "content_block_start", NULL, e) < 0 &&
            (e || (utf8_str(id) && utf8_str(calls->v[i].name)))) {
            json_decref(e);
            return cut(sse, at);
        }
        json_decref(e);
    }
    /* Pieces of a call whose block was closed already cannot be shown
     * any more (upstreams send calls one after another). */
    if (!args || !*args || o->open_block < 0 || o->open_is_text || o->open_call != i)
        return 0;
    json_t *e = json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index",
                          o->open_block, "delta", "type", "input_json_delta", "partial_json",
                          args);
    if (gps_sse_format_json(sse, "content_block_delta", NULL, e) < 0 && (e || utf8_str(args))) {
        json_decref(e);
        return cut(sse, at);
    }
    json_decref(e);
    return 0;
}

int gps_an_close_text(gps_an_out *o, gp_buf *sse, const char *stop_reason, const char *stop_seq,
                      long long input_tokens, long long output_tokens, const char *meta,
                      size_t meta_len)
{
    size_t at0 = sse->len;
    if (!close_block(o, sse))
        return cut(sse, at0);
    size_t at = sse->len;
    bool ok = LIT(sse, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":"
                       "{\"stop_reason\":") == 0 &&
              put_str(sse, stop_reason) == 0 && LIT(sse, ",\"stop_sequence\":") == 0 &&
              (stop_seq ? put_str(sse, stop_seq) : LIT(sse, "null")) == 0 &&
              LIT(sse, "},\"usage\":") == 0 &&
              put_usage(sse, input_tokens, output_tokens) == 0 &&
              (!meta || (LIT(sse, ",\"x_pool_meta\":") == 0 &&
                         gp_buf_append(sse, meta, meta_len) == 0));
    /* (a stop reason or sequence that is not UTF-8 left message_delta out
     * before, as json_pack refused it: still so; else ENOMEM) */
    if (!ev_end(sse, at, ok) && utf8_str(stop_reason) && (!stop_seq || utf8_str(stop_seq)))
        return cut(sse, at0);
    if (LIT(sse, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") < 0)
        return cut(sse, at0);
    return 0;
}

int gps_an_close(gps_an_out *o, gp_buf *sse, const char *stop_reason, const char *stop_seq,
                 long long input_tokens, long long output_tokens, json_t *meta)
{
    gp_buf m;
    gp_buf_init(&m);
    int rc = meta && gp_json_dump_append(&m, meta) < 0
                 ? -1 /* (never a message_delta without its x_pool_meta) */
                 : gps_an_close_text(o, sse, stop_reason, stop_seq, input_tokens, output_tokens,
                                     meta ? (m.data ? m.data : "") : NULL, m.len);
    gp_buf_free(&m);
    json_decref(meta);
    return rc;
}
