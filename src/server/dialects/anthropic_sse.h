/*
 * anthropic_sse: the bytes of a streamed Anthropic Messages reply, as
 * functions from values to SSE frames (pure: no job, no socket; the
 * model is responses.h's gps_resp_out). api_anthropic.c decides what
 * comes when; this file says what it looks like:
 *
 *   message_start, [content_block_start(text)], ping,
 *   (content_block_delta(text_delta) | content_block_start(tool_use),
 *    content_block_delta(input_json_delta)... | content_block_stop)*,
 *   content_block_stop, message_delta, message_stop
 *
 * At most one content block is open at a time, each closed by exactly one
 * content_block_stop before the next starts.
 */
#ifndef GPS_ANTHROPIC_SSE_H
#define GPS_ANTHROPIC_SSE_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "common/gp_util.h"
#include "server/dialects/reqcheck.h"
#include "server/dialects/toolcalls.h"
#include "server/http/sse.h"

typedef struct gps_an_out {
    char id[48];                   /* msg_... */
    char model[GPS_MAX_MODEL_NAME + 1];
    int open_block;                /* index of the open content block, -1 none */
    bool open_is_text;             /* ... and whether it is the text block */
    int open_call;                 /* ... the tool call it shows (tool_use block) */
    int next_block;                /* index the next content block gets */
    gps_sse_tpl delta_tpl;         /* a text delta with the text left open (sse.h) */
    int delta_tpl_index;           /* the block index it was made for; -1: none yet */
} gps_an_out;

void gps_an_out_init(gps_an_out *o, const char *id, const char *model);
void gps_an_out_clear(gps_an_out *o);
/* {"input_tokens", "output_tokens"} (negative: 0). New reference. */
json_t *gps_anthropic_usage(long long input_tokens, long long output_tokens);
/* The stream frames below (open, text, call) return 0, or -1 out of
 * memory: then sse is as it was before the call (no part of a frame goes
 * out) and the caller fails the reply. */
/* message_start (warnings borrowed: x_pool_meta.warnings when not empty),
 * a text block when with_text, ping. */
int gps_an_open(gps_an_out *o, gp_buf *sse, long long input_tokens, const json_t *warnings,
                bool with_text);
/* n bytes of text as a text_delta (a new text block after a tool call);
 * text that is not UTF-8 on its own goes as an empty delta. */
int gps_an_text(gps_an_out *o, gp_buf *sse, const char *t, size_t n);
/* A piece of tool call i: started, a tool_use block (closing the open one);
 * argument text as input_json_delta while its block is open. */
int gps_an_call(gps_an_out *o, gp_buf *sse, const gps_tool_calls *calls, int i, bool started,
                const char *args);
/* The end: content_block_stop of the open block, message_delta (meta
 * stolen, may be NULL), message_stop. 0, or -1 out of memory (sse as it
 * was: the caller fails the reply). */
int gps_an_close(gps_an_out *o, gp_buf *sse, const char *stop_reason, const char *stop_seq,
                 long long input_tokens, long long output_tokens, json_t *meta);
/* The same with x_pool_meta as its compact JSON text (meta_len bytes,
 * gps_pool_meta_append's; NULL: none), copied as it is (issue 24). */
int gps_an_close_text(gps_an_out *o, gp_buf *sse, const char *stop_reason, const char *stop_seq,
                      long long input_tokens, long long output_tokens, const char *meta,
                      size_t meta_len);

#endif
