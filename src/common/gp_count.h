/*
 * gp_count: a prompt's size in tokens when no tokenizer is at hand: the
 * documented estimate (docs/agent.md "Counting tokens"), ceil(UTF-8 bytes /
 * 4) of the prompt or of every message's content and tool calls, plus 4
 * tokens per message. The agent's openai backend answers count_tokens with
 * it when its upstream cannot count; the server charges it for a cancelled
 * job whose agent never said the prompt's size. Pure functions over a job's
 * wire JSON (prompt or messages, as docs/protocol.md).
 */
#ifndef GP_COUNT_H
#define GP_COUNT_H

#include <jansson.h>

#include "common/gp_util.h"

/* The text of a message's content (a string, or the text parts of an array
 * of content parts), appended to out. 0, or -1 (ENOMEM: out holds part of
 * it). */
int gp_count_content_text(const json_t *content, gp_buf *out);
/* An assistant message's tool calls as "name(arguments)" lines, appended.
 * 0, or -1 (ENOMEM: out holds part of them). */
int gp_count_calls_text(const json_t *message, gp_buf *out);

/* The text a count covers: prompt, or the messages' contents (and tool
 * calls) joined by newlines. Malloc'd (caller frees), NULL when the job has
 * neither or memory ran out (never a text with a part left out). */
char *gp_count_text(const json_t *job);

/* The estimate for job (>= 1 for any non-empty job; 0 when it has neither
 * prompt nor messages): the bytes of gp_count_text measured, not copied, so
 * that it needs no memory. */
long long gp_count_estimate(const json_t *job);

#endif
