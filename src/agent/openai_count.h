/*
 * openai_count: counting a prompt's tokens through an OpenAI-compatible
 * upstream that may or may not have a count endpoint (the openai backend's
 * count_tokens jobs; docs/agent.md "Counting tokens").
 *
 * Methods, tried in this order (the backend remembers the first that
 * answered, for chat jobs and for prompts apart, and starts there next
 * time):
 *   1. POST ROOT/v1/messages/count_tokens: another gpupool-server (a pool
 *      of pools) or any Anthropic-compatible server; exact, with the inner
 *      model's own chat template.
 *   2. Chat jobs only: POST ROOT/apply-template with the messages and
 *      tools (llama-server renders its chat template: {"prompt": text}),
 *      then POST ROOT/tokenize of that text with add_special, as
 *      llama-server tokenizes a chat prompt: exact.
 *   3. POST ROOT/tokenize: vLLM ({"count": n, ...}) reads a chat job's
 *      messages and tools and applies its template (exact); llama-server
 *      ({"tokens":[...]}) the joined contents ("content": no template) and
 *      a prompt exactly.
 *   4. An estimate, never a failure: ceil(UTF-8 bytes / 4) of every content
 *      plus 4 tokens per message, marked as estimated.
 * Pure functions: no I/O here.
 */
#ifndef GPUPOOL_AGENT_OPENAI_COUNT_H
#define GPUPOOL_AGENT_OPENAI_COUNT_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

/* Out of memory: the count cannot be made as asked (a method skipped or a
 * body cut short would answer another number), the agent's own failure
 * (the count_tokens job ends AGENT_OUT_OF_MEMORY and fails over). The
 * builders below say it in *nomem, oai_count_parse by this code. */
#define OAI_COUNT_NOMEM (-2)

typedef enum {
    OAI_COUNT_MESSAGES = 0, /* ROOT/v1/messages/count_tokens */
    OAI_COUNT_TEMPLATE = 1, /* ROOT/apply-template, then ROOT/tokenize */
    OAI_COUNT_TOKENIZE = 2, /* ROOT/tokenize */
    OAI_COUNT_ESTIMATE = 3,
} oai_count_method;

/* The Anthropic count_tokens body for a count job (its `messages`: system
 * messages become `system`, tool results user text, tool calls their
 * arguments as text; or its `prompt` as one user message). New reference,
 * or NULL: *nomem false when the job has neither (the method is skipped),
 * true when memory ran out. */
json_t *oai_count_messages_body(const json_t *job, const char *model, bool *nomem);

/* Method 2's /apply-template body for a chat job: {"model", "messages" (the
 * job's, as the generation sends them), "tools" (when it has some)}. New
 * reference; NULL for a job without messages (*nomem false) or when memory
 * ran out (*nomem true). */
json_t *oai_count_template_body(const json_t *job, const char *model, bool *nomem);

/* Method 2's second step: from a 2xx /apply-template reply ({"prompt":
 * text}), the /tokenize body that counts text as llama-server tokenizes a
 * chat prompt ({"content": text, "add_special": true, "parse_special":
 * true}). Malloc'd JSON (caller frees); NULL when the reply is not one
 * (*nomem false) or when memory ran out reading it or writing the body
 * (*nomem true). */
char *oai_count_template_tokenize(const char *body, size_t len, bool *nomem);

/* Method 3's /tokenize body: "content" (gp_count_text: the prompt, or the
 * messages' contents joined) and "add_special" for llama-server; a prompt
 * also as "prompt", a chat job's "messages", "tools" and
 * "add_generation_prompt" for vLLM (which then applies the chat template).
 * New reference; NULL when the job has neither prompt nor messages, or its
 * text is not valid UTF-8 (*nomem false), or when memory ran out (*nomem
 * true). */
json_t *oai_count_tokenize_body(const json_t *job, const char *model, bool *nomem);

/* The estimate of method 4: common/gp_count.h. */

/* Parse a 2xx reply of method m (method 2: of its /tokenize step): *n =
 * the count; *estimated = the upstream itself said it estimated (an inner
 * gpupool's x_pool_meta.estimated). Returns 0, or -1 when the body is not
 * such a reply (a /tokenize answer of no tokens at all is not: llama-server
 * answers that to a body without "content"), or OAI_COUNT_NOMEM when memory
 * ran out reading it (not the upstream's fault: the next method must not be
 * tried for it). */
int oai_count_parse(oai_count_method m, const char *body, size_t len, long long *n,
                    bool *estimated);

#endif
