/*
 * api_anthropic: the Anthropic Messages dialect.
 *
 *   POST /v1/messages               messages -> "message" (or its SSE events)
 *   POST /v1/messages/count_tokens  messages -> {"input_tokens": n}
 *
 * Auth: `x-api-key` or `Authorization: Bearer` (the http layer reads
 * both for this dialect); `anthropic-version` and `anthropic-beta` are
 * accepted whatever they say. Every response carries `request-id`.
 *
 * Mapping onto a pool job (kind chat, messages of {role, content:string}):
 * - `system` (a string or text blocks) and every {"role":"system"} entry
 *   inside `messages` are merged, in order, into one leading system message.
 * - Content blocks: `text` is kept; `tool_use` and `tool_result` are
 *   rendered as text; `thinking`/`redacted_thinking` blocks are left out
 *   (reported in x_pool_meta.warnings); anything else (image, document,
 *   ...) is a 400: the pool serves text only and never drops input silently.
 * - Consecutive messages of the same role are joined (blank line between).
 * - `tools` go to the agent as OpenAI function tools (input_schema ->
 *   parameters; tool_choice auto|any|tool|none -> auto|required|{function}|
 *   none) when at least one live agent that serves the model reports
 *   `"supports_tools": true` in its model facts (the job then goes only to
 *   such agents: sched_job needs_tools); the conversation then goes
 *   in OpenAI form too (tool_use -> assistant tool_calls, tool_result ->
 *   role "tool" messages). Otherwise tools are ignored (warning) and tool
 *   blocks are rendered as text. `tool_choice: {"type":"none"}` drops them.
 * - Replies: the agent's tool_call events become `tool_use` blocks (id
 *   "toolu_..." from the call id, input parsed from the arguments JSON;
 *   streamed as content_block_start + input_json_delta deltas + one
 *   content_block_stop) and stop_reason "tool_use".
 * - `thinking`, unknown top-level fields and `cache_control` are accepted
 *   and ignored (warnings name the fields).
 * - `stop_sequences` are matched by the server on the relayed text (so it
 *   can report which one matched): the text is cut before the match, the
 *   stop_reason is "stop_sequence" and the agent is told to stop.
 * - Context: the model's context length is the smallest `context_length`
 *   that a live agent serving it reports. Before submitting, the prompt's
 *   token count is bounded from below by its UTF-8 bytes / 8 (no tokenizer
 *   averages more than 8 bytes a token on real text). When even that bound
 *   fills the context the request is a 400 stating both numbers; otherwise
 *   max_tokens is clamped to context - bound (a warning says so). The agent
 *   knows the exact count: a prompt over its context comes back as
 *   CONTEXT_OVERFLOW (400 with both numbers, before any byte was sent) and
 *   generation that reaches the end of the context ends with "max_tokens".
 *
 * The parse/assemble/build functions are pure (unit-tested).
 */
#ifndef GPS_API_ANTHROPIC_H
#define GPS_API_ANTHROPIC_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "server/jobs/jobs.h"

typedef struct gps_anthropic_req {
    gps_job_spec spec;       /* kind chat; messages without the system prompt until
                                gps_anthropic_assemble; owned, moved on submit */
    bool stream;
    bool count_only;         /* /v1/messages/count_tokens */
    char *system;            /* merged system prompt, NULL when none */
    char *tools_text;        /* rendered tool list (sizes the prompt bound), NULL when none */
    json_t *tools;           /* OpenAI function tools, NULL when none (or tool_choice none) */
    json_t *tool_choice;     /* OpenAI tool_choice, with tools */
    json_t *tool_messages;   /* the conversation in OpenAI form (tool_calls, role "tool"),
                                with tools; replaces spec.messages when tools are taken */
    json_t *stop_sequences;  /* array of non-empty strings, or NULL */
    json_t *warnings;        /* array of strings (never NULL after a successful parse) */
    size_t prompt_bytes;     /* system + messages + tools text */
} gps_anthropic_req;

/* Validate a parsed body. count_only: the count_tokens endpoint (no
 * max_tokens needed). Returns 0, or -1 with a message in msg (400), or
 * GPS_PARSE_OOM (reqcheck.h) with msg (500). On error out holds nothing
 * to free. */
int gps_anthropic_parse(const json_t *body, bool count_only, gps_anthropic_req *out, char *msg,
                        size_t msglen);
void gps_anthropic_req_clear(gps_anthropic_req *r);

/* Anthropic tools / tool_choice -> OpenAI form (new references; NULL when
 * out of memory). */
json_t *gps_anthropic_tools_to_openai(const json_t *tools);
json_t *gps_anthropic_tool_choice_to_openai(const json_t *tool_choice);

/* The tool_use id for an agent's tool call id ("call_X" -> "toolu_X"). */
void gps_anthropic_tool_use_id(const char *call_id, char *out, size_t outlen);

/* Lower bound of the prompt's tokens from its bytes (see above). */
long long gps_anthropic_tokens_lower_bound(size_t bytes);

/* Finish the job spec for a model with context_length (0 = unknown) and
 * tool support: prepend the system message (with the tools when
 * supported), clamp max_tokens, add warnings. Returns 0, or -1 with a
 * message (400 invalid_request_error), or GPS_PARSE_OOM with msg (500). */
int gps_anthropic_assemble(gps_anthropic_req *r, long long context_length, bool tools_supported,
                           char *msg, size_t msglen);

/* Stop strings are scanned with gp_stop_scan (common/gp_stop.h). */

/* "end_turn" for "stop", "max_tokens" for "length". */
const char *gps_anthropic_stop_reason(const char *finish_reason);

/* The non-streaming body (type "message"). stop_sequence may be NULL. meta
 * (stolen, may be NULL) becomes x_pool_meta. NULL when out of memory. */
json_t *gps_anthropic_message(const char *id, const char *model, const char *text,
                              const char *stop_reason, const char *stop_sequence,
                              long long input_tokens, long long output_tokens, json_t *meta);
/* The tool_use blocks of calls appended to such a body's content (its
 * text block dropped when !with_text: an empty text). input is a call's
 * arguments JSON parsed; arguments that are not a JSON object give {} and
 * a warning in x_pool_meta. 0, or -1 out of memory (a block or warning
 * left out: the body is not sent). */
struct gps_tool_calls;
int gps_anthropic_tool_use_blocks(json_t *body, const struct gps_tool_calls *calls,
                                  bool with_text);

struct gps_http;
struct gps_metrics;
struct gps_relay_ctx;
/* Routes /v1/messages and /v1/messages/count_tokens on h; c (the relay's
 * context, relay.h) is shared with OpenAI and must outlive h. */
int gps_anthropic_register(struct gps_http *h, struct gps_relay_ctx *c);

#endif
