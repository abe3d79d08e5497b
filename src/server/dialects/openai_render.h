/*
 * openai_render: the bytes of an OpenAI completions or chat reply, as
 * functions from values to SSE frames and JSON bodies (pure: no job, no
 * socket; the models are anthropic_sse.h and responses.h). api_openai.c
 * decides what comes when; this file says what it looks like:
 *
 *   stream:  [chat: a role chunk], text chunks and (chat) tool call
 *            chunks, the last chunk (finish_reason, x_pool_meta),
 *            [include_usage: the usage chunk], data: [DONE]
 *   whole:   one chat.completion / text_completion object
 *
 * Every chunk carries a `choices` array (the usage chunk an empty one) and,
 * with include_usage, "usage": null until the usage chunk. A stream error is
 * the relay's (relay.h: one error shape for every dialect).
 */
#ifndef GPS_OPENAI_RENDER_H
#define GPS_OPENAI_RENDER_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "common/gp_util.h"
#include "server/dialects/reqcheck.h"
#include "server/dialects/toolcalls.h"
#include "server/http/sse.h"

/* One reply's constant parts and its stream's state. */
typedef struct gps_oa_out {
    bool chat;                     /* chat.completion(.chunk), else text_completion */
    bool include_usage;            /* stream_options.include_usage */
    char id[48];                   /* chatcmpl-... / cmpl-... */
    long long created;             /* unix seconds */
    char model[GPS_MAX_MODEL_NAME + 1];
    gps_sse_tpl text_tpl;          /* a text chunk with the text left open (sse.h) */
    bool tpl_tried;                /* text_tpl made (or refused: .pre NULL) */
    bool plain;                    /* id and model UTF-8: frames written by hand */
} gps_oa_out;

void gps_oa_out_init(gps_oa_out *o, bool chat, bool include_usage, const char *id,
                     long long created, const char *model);
/* The model that serves (a fallback may have taken the request): before
 * anything was rendered. */
void gps_oa_out_set_model(gps_oa_out *o, const char *model);
void gps_oa_out_clear(gps_oa_out *o);

/* The stream frames below return 0, or -1 out of memory: then sse is as it
 * was before the call (no part of a frame goes out) and the caller fails
 * the reply (a client must not get a stream with a frame left out). */
/* The stream's first bytes: chat's role chunk (completions: nothing). */
int gps_oa_open(gps_oa_out *o, gp_buf *sse);
/* n bytes of text as one chunk (a delta's content / a completion's text). */
int gps_oa_text(gps_oa_out *o, gp_buf *sse, const char *t, size_t n);
/* A piece of chat tool call i of calls: the first piece (started) carries
 * id, type and name; every piece its index and an arguments delta (args
 * NULL: ""). */
int gps_oa_call(gps_oa_out *o, gp_buf *sse, const gps_tool_calls *calls, int i, bool started,
                const char *args);
/* The end: the last chunk with finish_reason and x_pool_meta (meta stolen,
 * may be NULL), the usage chunk when include_usage, then [DONE]. 0, or -1
 * out of memory (sse as it was: the caller fails the reply). */
int gps_oa_close(gps_oa_out *o, gp_buf *sse, const char *finish_reason, long long prompt_tokens,
                 long long completion_tokens, json_t *meta);
/* The same with x_pool_meta as its compact JSON text (meta_len bytes,
 * gps_pool_meta_append's; meta NULL: none): copied into the frame as it
 * is, without a tree (issue 24). */
int gps_oa_close_text(gps_oa_out *o, gp_buf *sse, const char *finish_reason,
                      long long prompt_tokens, long long completion_tokens, const char *meta,
                      size_t meta_len);
/* The whole (non-streaming) body, new reference: text (NUL-terminated,
 * NULL: ""; text_len its bytes) and, for chat, the tool calls (content
 * null when only tools were called, text_len 0); meta stolen, may be
 * NULL. NULL when out of memory (never a body with a part left out). */
json_t *gps_oa_body(const gps_oa_out *o, const gps_tool_calls *calls, const char *text,
                    size_t text_len, const char *finish_reason, long long prompt_tokens,
                    long long completion_tokens, json_t *meta);
/* The finish_reason a reply reports: the job's (empty: "stop"), or
 * "tool_calls" when tools were called and it was not cut by length. */
const char *gps_oa_finish_reason(const char *job_reason, size_t n_calls);

/* The JSON objects under the frames (new references; NULL when out of
 * memory, never an object with a part left out). */
/* One streaming chunk. text may be NULL (an empty delta / text); with_role
 * adds "role":"assistant" to the chat delta; finish_reason NULL = null;
 * usage_null adds "usage": null (OpenAI does so on every chunk when
 * include_usage is set). */
json_t *gps_openai_chunk(bool chat, const char *id, long long created, const char *model,
                         const char *text, bool with_role, const char *finish_reason,
                         bool usage_null);
/* The final usage chunk: choices [] and usage. */
json_t *gps_openai_usage_chunk(bool chat, const char *id, long long created, const char *model,
                               long long prompt_tokens, long long completion_tokens);
/* The non-streaming body. meta (stolen, may be NULL) becomes x_pool_meta. */
json_t *gps_openai_response(bool chat, const char *id, long long created, const char *model,
                            const char *text, const char *finish_reason,
                            long long prompt_tokens, long long completion_tokens, json_t *meta);
/* message.tool_calls: [{id, type:"function", function:{name, arguments}}]. */
json_t *gps_tool_calls_openai(const gps_tool_calls *acc);

#endif
