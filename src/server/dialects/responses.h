/*
 * responses: the OpenAI Responses API's shapes (POST /v1/responses), the
 * pure half of the dialect: the request into a chat job spec, and the
 * response object and its typed stream events out of what a job produced.
 * api_responses.c relays jobs with them (relay.h).
 *
 * Request: `input` as a string (one user message) or items: messages
 * (role user / assistant / system / developer; content a string or
 * input_text / output_text parts), `function_call` items (an earlier turn's
 * calls: they become the assistant message's tool_calls) and
 * `function_call_output` items (role tool); `reasoning` items are dropped.
 * `instructions` is a first system message. `max_output_tokens`,
 * `temperature`, `top_p`, function `tools` with `tool_choice`, `stream`,
 * `user`, `metadata`, `parallel_tool_calls`, `x_pool_options`. Tools of
 * other types (hosted tools, namespaces) are dropped with a warning in
 * x_pool_meta (an agent runs functions only). `store` (default true)
 * keeps the response for `previous_response_id` and `item_reference`
 * items of later requests (resp_state.h); this module only marks those
 * references and splices what was read (gps_resp_splice).
 *
 * Stream: response.created, response.in_progress, then per output item
 * response.output_item.added; for a message response.content_part.added,
 * response.output_text.delta..., response.output_text.done,
 * response.content_part.done; for a function call
 * response.function_call_arguments.delta..., .done; response.output_item.done;
 * last response.completed (or response.incomplete when max_output_tokens
 * cut it). Every event carries `type` and `sequence_number`; the SSE event
 * name is the type.
 */
#ifndef GPS_RESPONSES_H
#define GPS_RESPONSES_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "common/gp_util.h"
#include "server/dialects/reqcheck.h"
#include "server/dialects/toolcalls.h"
#include "server/jobs/jobs.h"

typedef struct gps_resp_req {
    gps_job_spec spec;   /* owned; moved into the job on submit */
    bool stream;
    bool store;          /* keep the response (store, default true) */
    json_t *echo;        /* request fields the response object repeats (owned) */
    json_t *warnings;    /* strings for x_pool_meta.warnings (owned), or NULL */
    /* Stored state the request refers to (resolve with gps_resp_splice
     * once read): previous_response_id, and the ids of its item_reference
     * items (each stands in spec.messages as a {"role":"$ref"} mark). */
    char *prev_id;       /* owned, or NULL */
    json_t *refs;        /* array of item ids (owned), or NULL */
    size_t n_instr;      /* leading system messages from `instructions` */
} gps_resp_req;

/* Validate a JSON body. 0, or -1 with msg and *param (the field), or
 * GPS_PARSE_OOM (reqcheck.h) with msg and no param; on error out holds
 * nothing; on success free with gps_resp_req_clear unless the spec was
 * moved. */
int gps_resp_parse(const json_t *body, gps_resp_req *out, char *msg, size_t msglen,
                   const char **param);
void gps_resp_req_clear(gps_resp_req *r);

/* Put the stored state into the request's messages: prev_context (the
 * previous response's conversation, or NULL) after the instructions, and
 * each item_reference mark replaced by items[id] (an object of chat message
 * fragments by item id; a function call joins the assistant message before
 * it). 0, or -1 with msg and *param naming what was not found, or
 * GPS_PARSE_OOM with msg and no param. */
int gps_resp_splice(gps_resp_req *r, json_t *prev_context, json_t *items,
                    char *msg, size_t msglen, const char **param);

#define GPS_RESP_MAX_ITEMS 128

/* The output a response has built so far, and its stream's state. */
typedef struct gps_resp_out {
    char id[48];                 /* resp_... */
    long long created;           /* unix seconds */
    char model[GPS_MAX_MODEL_NAME + 1];
    json_t *echo;                /* borrowed from the request (its own reference) */
    /* The echo as the response object's text writes it, made once: its
     * keys that json_pack's do not hold (",\"k\":v..."), and which of
     * those it replaces (bit k: FIXED_KEYS[k] in responses.c); echo_ok
     * false: not writable (the object is then jansson's). */
    gp_buf echo_text;
    unsigned echo_fixed;
    bool echo_ok;
    long long seq;               /* next sequence_number */
    /* Output items in order: a message (its text) or a function call.
     * Grown as they come (at most GPS_RESP_MAX_ITEMS): a reply has one or
     * two, and a fixed array of 128 was 10 KiB to zero twice a request. */
    struct gps_resp_item {
        bool is_call;
        int call;                /* is_call: index into the job's tool calls */
        char item_id[48];        /* msg_... / fc_... */
        size_t text_from, text_to; /* message: its bytes of the response's text */
        bool done;
    } *items;                    /* owned */
    int n_items, cap_items;
    gp_buf text;                 /* every message's text, in order */
    /* The text delta's frame up to its text, for one item (made once per
     * message, not per token). */
    char delta_pre[192];
    size_t delta_pre_len;
    int delta_pre_item;          /* its item's index + 1; 0: none yet */
} gps_resp_out;

/* echo borrowed (kept referenced by the caller until gps_resp_out_clear). */
void gps_resp_out_init(gps_resp_out *o, const char *model, json_t *echo);
void gps_resp_out_clear(gps_resp_out *o);

/* Stream events, appended to sse as `event: TYPE` / `data: JSON`: */
/* open, text and call return 0, or -1 out of memory: then sse is as it was
 * before the call (no part of an event goes out) and the caller fails the
 * reply. */
/* response.created and response.in_progress. */
int gps_resp_open(gps_resp_out *o, gp_buf *sse);
/* Text: opens a message item when none is open, then one delta. */
int gps_resp_text(gps_resp_out *o, gp_buf *sse, const char *t, size_t n);
/* A tool call event: call i of calls (started: its first piece; args: this
 * piece's arguments delta). Closes an open message first. */
int gps_resp_call(gps_resp_out *o, gp_buf *sse, const gps_tool_calls *calls, int i,
                  bool started, const char *args);
/* Close every open item and end with response.completed (incomplete when
 * finish_reason is "length"); meta (stolen, may be NULL) is x_pool_meta.
 * The close functions but gps_resp_close_final return 0, or -1 out of
 * memory: sse (and fin) as they were; the caller fails the reply. */
int gps_resp_close(gps_resp_out *o, gp_buf *sse, const gps_tool_calls *calls,
                   const char *finish_reason, long long prompt_tokens,
                   long long completion_tokens, json_t *meta);

/* gps_resp_close, returning what gps_resp_final would (new reference, or
 * NULL out of memory), made from the same build. */
json_t *gps_resp_close_final(gps_resp_out *o, gp_buf *sse, const gps_tool_calls *calls,
                             const char *finish_reason, long long prompt_tokens,
                             long long completion_tokens, json_t *meta);

/* gps_resp_close, writing the response.completed event as text (the same
 * bytes; meta borrowed, may be NULL) and appending to fin (may be NULL)
 * the final response without x_pool_meta: gps_resp_final's object as
 * gp_json_dump_append writes it, what the store keeps. */
int gps_resp_close_text(gps_resp_out *o, gp_buf *sse, const gps_tool_calls *calls,
                        const char *finish_reason, long long prompt_tokens,
                        long long completion_tokens, const json_t *meta, gp_buf *fin);
/* The same with x_pool_meta as its compact JSON text (meta_len bytes,
 * gps_pool_meta_append's; meta NULL: none), copied as it is (issue 24). */
int gps_resp_close_meta_text(gps_resp_out *o, gp_buf *sse, const gps_tool_calls *calls,
                             const char *finish_reason, long long prompt_tokens,
                             long long completion_tokens, const char *meta, size_t meta_len,
                             gp_buf *fin);

/* Non-streaming: make the output items the whole text (one message) and
 * the calls, as gps_resp_object does before it builds the object. 0, or
 * -1 out of memory with o's output as it was (the caller fails the reply:
 * never a body with an item or its text left out). */
int gps_resp_whole(gps_resp_out *o, const gps_tool_calls *calls, const char *text,
                   size_t text_len);
/* Append gps_resp_final's object as text (gp_json_dump_append's bytes,
 * without building it; jansson's tree only where a string is one jansson
 * refuses). 0, or -1 (no object: jansson gave none, or ENOMEM). */
int gps_resp_render(gp_buf *out, const gps_resp_out *o, const gps_tool_calls *calls,
                    const char *finish_reason, long long prompt_tokens,
                    long long completion_tokens);
/* Turn the object that out holds from offset from (ending in '}') into
 * the same object with x_pool_meta (meta borrowed) last, as
 * json_object_set_new(r, "x_pool_meta", meta) and a dump would. meta NULL:
 * nothing. 0, or -1 with out as it was. */
int gps_resp_render_meta(gp_buf *out, size_t from, const json_t *meta);
/* The same with x_pool_meta as text (meta_len bytes; NULL: nothing). */
int gps_resp_render_meta_text(gp_buf *out, size_t from, const char *meta, size_t meta_len);

/* Non-streaming: the whole text and calls as one response object (new
 * reference, or NULL out of memory); meta stolen. Also what response.completed carries. The
 * jansson reference that the text above is tested against. */
json_t *gps_resp_object(gps_resp_out *o, const gps_tool_calls *calls, const char *text,
                        size_t text_len, const char *finish_reason, long long prompt_tokens,
                        long long completion_tokens, json_t *meta);

/* What a stored response keeps: the conversation through it (messages
 * after the instructions, then the output as one assistant message; new
 * reference) and, in *items, [{id, message}] per output item (new). */
json_t *gps_resp_context(const gps_resp_out *o, const gps_tool_calls *calls,
                         const json_t *messages, size_t n_instr, json_t **items);
/* The same two values as JSON text, appended to ctx and items: the bytes
 * gp_json_dump_append writes for gps_resp_context's trees (the trees
 * themselves only where jansson refuses a string). 0, or -1: no
 * conversation (gps_resp_context gave none, or ENOMEM); ctx and items as
 * they were. */
int gps_resp_context_text(const gps_resp_out *o, const gps_tool_calls *calls,
                          const json_t *messages, size_t n_instr, gp_buf *ctx, gp_buf *items);
/* The final response object without x_pool_meta (new reference). */
json_t *gps_resp_final(const gps_resp_out *o, const gps_tool_calls *calls,
                       const char *finish_reason, long long prompt_tokens,
                       long long completion_tokens);

#endif
