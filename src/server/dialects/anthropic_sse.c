/* anthropic_sse: see anthropic_sse.h. */
#include "server/dialects/anthropic_sse.h"

#include <stdio.h>
#include <string.h>

#include "server/dialects/api_anthropic.h"
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

static void emit(gp_buf *sse, const char *name, json_t *j)
{
    gps_sse_format_json(sse, name, NULL, j);
    json_decref(j);
}

static void close_block(gps_an_out *o, gp_buf *sse)
{
    if (o->open_block < 0)
        return;
    emit(sse, "content_block_stop",
         json_pack("{s:s,s:i}", "type", "content_block_stop", "index", o->open_block));
    o->open_block = -1;
}

static void open_text_block(gps_an_out *o, gp_buf *sse)
{
    close_block(o, sse);
    o->open_block = o->next_block++;
    o->open_is_text = true;
    emit(sse, "content_block_start",
         json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_start", "index",
                   o->open_block, "content_block", "type", "text", "text", ""));
}

void gps_an_open(gps_an_out *o, gp_buf *sse, long long input_tokens, const json_t *warnings,
                 bool with_text)
{
    json_t *msg = json_pack("{s:s,s:s,s:s,s:[],s:s,s:n,s:n,s:o}", "id", o->id, "type",
                            "message", "role", "assistant", "content", "model", o->model,
                            "stop_reason", "stop_sequence", "usage",
                            gps_anthropic_usage(input_tokens, 0));
    if (msg && json_array_size(warnings))
        json_object_set_new(msg, "x_pool_meta", json_pack("{s:O}", "warnings", warnings));
    emit(sse, "message_start", json_pack("{s:s,s:o}", "type", "message_start", "message", msg));
    if (with_text)
        open_text_block(o, sse);
    emit(sse, "ping", json_pack("{s:s}", "type", "ping"));
}

void gps_an_text(gps_an_out *o, gp_buf *sse, const char *t, size_t n)
{
    /* Not UTF-8 on its own cannot happen for whole agent tokens (jansson
     * checked the upload); a piece cut inside a character would be sent
     * as an empty delta, as before. */
    if (!gps_text_utf8(t, n))
        n = 0;
    if (o->open_block < 0 || !o->open_is_text)
        open_text_block(o, sse); /* text after a tool call: a new text block */
    if (o->delta_tpl_index != o->open_block) {
        /* Every delta of a text block is the same but for its text: render
         * it once (an escape and two copies per token, as OpenAI's). */
        gps_sse_tpl_free(&o->delta_tpl);
        json_t *d = json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index",
                              o->open_block, "delta", "type", "text_delta", "text",
                              DELTA_MARKER);
        if (d && gps_sse_tpl_init(&o->delta_tpl, "content_block_delta", d, DELTA_MARKER) == 0)
            o->delta_tpl_index = o->open_block;
        else
            o->delta_tpl.pre = NULL;
        json_decref(d);
    }
    if (o->delta_tpl.pre && o->delta_tpl_index == o->open_block)
        gps_sse_tpl_emit(sse, &o->delta_tpl, t, n);
    else
        emit(sse, "content_block_delta",
             json_pack("{s:s,s:i,s:{s:s,s:s%}}", "type", "content_block_delta", "index",
                       o->open_block, "delta", "type", "text_delta", "text", t, n));
}

void gps_an_call(gps_an_out *o, gp_buf *sse, const gps_tool_calls *calls, int i, bool started,
                 const char *args)
{
    if (started) {
        close_block(o, sse);
        char id[160];
        gps_anthropic_tool_use_id(calls->v[i].id, id, sizeof id);
        o->open_block = o->next_block++;
        o->open_is_text = false;
        o->open_call = i;
        emit(sse, "content_block_start",
             json_pack("{s:s,s:i,s:{s:s,s:s,s:s,s:{}}}", "type", "content_block_start", "index",
                       o->open_block, "content_block", "type", "tool_use", "id", id, "name",
                       calls->v[i].name, "input"));
    }
    /* Pieces of a call whose block was closed already cannot be shown
     * any more (upstreams send calls one after another). */
    if (!args || !*args || o->open_block < 0 || o->open_is_text || o->open_call != i)
        return;
    emit(sse, "content_block_delta",
         json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index",
                   o->open_block, "delta", "type", "input_json_delta", "partial_json", args));
}

void gps_an_close(gps_an_out *o, gp_buf *sse, const char *stop_reason, const char *stop_seq,
                  long long input_tokens, long long output_tokens, json_t *meta)
{
    close_block(o, sse);
    json_t *md = json_pack("{s:s,s:{s:s,s:o},s:o}", "type", "message_delta", "delta",
                           "stop_reason", stop_reason, "stop_sequence",
                           stop_seq ? json_string(stop_seq) : json_null(), "usage",
                           gps_anthropic_usage(input_tokens, output_tokens));
    if (md && meta)
        json_object_set_new(md, "x_pool_meta", meta);
    else
        json_decref(meta);
    emit(sse, "message_delta", md);
    emit(sse, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}
