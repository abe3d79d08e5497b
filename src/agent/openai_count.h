/*
 * openai_count: counting a prompt's tokens through an OpenAI-compatible
 * upstream that may or may not have a count endpoint (the openai backend's
 * count_tokens jobs; docs/agent.md "Counting tokens").
 *
 * Methods, tried in this order (the backend remembers the first that
 * answered and starts there next time):
 *   1. POST ROOT/v1/messages/count_tokens: another gpupool-server (a pool
 *      of pools) or any Anthropic-compatible server; exact, with the inner
 *      model's own chat template.
 *   2. POST ROOT/tokenize: llama-server ({"tokens":[...]}) and vLLM
 *      ({"count": n, ...}); the messages' contents only (no template).
 *   3. An estimate, never a failure: ceil(UTF-8 bytes / 4) of every content
 *      plus 4 tokens per message, marked as estimated.
 * Pure functions: no I/O here.
 */
#ifndef GPUPOOL_AGENT_OPENAI_COUNT_H
#define GPUPOOL_AGENT_OPENAI_COUNT_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

typedef enum {
    OAI_COUNT_MESSAGES = 0, /* ROOT/v1/messages/count_tokens */
    OAI_COUNT_TOKENIZE = 1, /* ROOT/tokenize */
    OAI_COUNT_ESTIMATE = 2,
} oai_count_method;

/* The Anthropic count_tokens body for a count job (its `messages`: system
 * messages become `system`, tool results user text, tool calls their
 * arguments as text; or its `prompt` as one user message). New reference,
 * NULL when the job has neither or on ENOMEM. */
json_t *oai_count_messages_body(const json_t *job, const char *model);

/* The text /tokenize counts and the estimate of method 3: common/gp_count.h. */

/* Parse a 2xx reply of method m: *n = the count; *estimated = the upstream
 * itself said it estimated (an inner gpupool's x_pool_meta.estimated).
 * Returns 0, or -1 when the body is not such a reply. */
int oai_count_parse(oai_count_method m, const char *body, size_t len, long long *n,
                    bool *estimated);

#endif
