/*
 * openai_schema: what an openai-backend job's reply is held to (issue 26
 * item 1). The upstream gets the job's response_format and strict tools as
 * they are, and most enforce them; this checks that it did, with the
 * engine's validator (src/engine/jvalidate.h, the schema's own meaning):
 *   - response_format json_schema: the reply's text (after the job's
 *     continuation, when it continues a failed-over reply) is one JSON value
 *     of the schema; json_object: a JSON object;
 *   - a tool with "strict": true: each call of it has arguments that are
 *     JSON of its parameters.
 * Not checked: the text of a reply that called tools (the model chose to
 * call rather than answer), a reply cut by max_tokens (finish "length") or
 * by one of the job's stop strings (its finish says it was cut).
 *
 * The reply's parser (openai_stream.c) hands over the text and the tool
 * call pieces it relays and asks for the verdict before its end event; a
 * reply that fails it ends with an error UPSTREAM_INVALID_OUTPUT instead
 * (docs/api.md "Structured outputs"). A check that memory ran out for (the
 * text or a call not kept, the reply not loaded) is no verdict on the
 * reply: the job ends with AGENT_OUT_OF_MEMORY, the agent's own failure,
 * and fails over (openai_stream.c maps OAI_SCHEMA_NOMEM so).
 */
#ifndef AGENT_OPENAI_SCHEMA_H
#define AGENT_OPENAI_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>


typedef struct oai_schema oai_schema;

/* oai_schema_new's return when memory ran out: not the job's fault, so
 * not refused as INVALID_REQUEST (the backend ends it as the agent's own
 * out of memory, which fails it over: backend.h AGENT_JOB_START_NOMEM). */
#define OAI_SCHEMA_NOMEM (-2)

/* The checks a job (borrowed) asks for, in *out (NULL: nothing to check).
 * 0; -1 with err set: a strict tool or a response_format whose schema the
 * validator cannot check (a keyword it does not support, named): the job
 * is refused as INVALID_REQUEST; or OAI_SCHEMA_NOMEM with err set: out of
 * memory (the validator's included: gpe_jv_new_status). */
int oai_schema_new(json_t *job, oai_schema **out, char *err, size_t errlen);
void oai_schema_free(oai_schema *c);

/* Reply text as it is relayed. */
void oai_schema_text(oai_schema *c, const char *text, size_t len);
/* A piece of tool call index (name on its first piece, else NULL). */
void oai_schema_tool(oai_schema *c, int index, const char *name, const char *args,
                     size_t len);
/* At the reply's end (with finish_reason "stop" or "tool_calls", no stop
 * string): 0 when it holds, else -1 with what is wrong in msg, or
 * OAI_SCHEMA_NOMEM with msg set: memory ran out keeping the reply or
 * checking it (no verdict on the reply). */
int oai_schema_verdict(oai_schema *c, char *msg, size_t msglen);

#endif
