/*
 * gguf_tools: OpenAI tool calls on the gguf backend.
 *
 * The chat template renders a job's `tools` into the prompt (engine.h
 * gpe_chat_apply_tools); this module reads the model's calls back out of
 * what it writes (gpe_toolparse, in the template family's format) and
 * carries out `tool_choice`:
 *   "auto"      the model decides; text that is a call becomes a call.
 *   "required"  the model must call one of the tools: the family's call
 *               opener is appended to the prompt and a grammar holds the
 *               model to {"name": one of the tools, "arguments": ...}.
 *   {"type":"function","function":{"name":N}}
 *               the same with the name fixed and the arguments held to
 *               N's `parameters` schema.
 * A forced call's arguments follow the tool's `parameters` when there is
 * one candidate tool and the schema compiles; otherwise any JSON object.
 * A tool marked `"strict": true` whose parameters cannot be enforced is an
 * error naming the keyword (never silently unenforced).
 * With several candidate tools the arguments are only held to an object
 * (the grammar has no same-type anyOf yet).
 */
#ifndef AGENT_GGUF_TOOLS_H
#define AGENT_GGUF_TOOLS_H

#include <stdbool.h>
#include <stddef.h>

#include <gpupool/engine.h>
#include <jansson.h>

typedef struct gguf_tools {
    gpe_toolparse *tp;   /* NULL: no tools, or none the model's template writes */
    gpe_grammar *gram;   /* a forced call's grammar (the job takes it), else NULL */
    const char *prefix;  /* prompt text that opens a forced call (static), else NULL */
    size_t n_sent;       /* calls already handed to the sink */
} gguf_tools;

/* Set t up for a chat job. family: the model's chat format; writes_tools:
 * its template has a tools format (gpe_chat_supports_tools); forcing is
 * skipped for a continuation (the text so far decides). 0, or -1 with a
 * message for the client in err. */
int gguf_tools_init(gguf_tools *t, const char *family, bool writes_tools,
                    const gpe_grammar_vocab *gv, json_t *job, bool continuation, char *err,
                    size_t errlen);
void gguf_tools_free(gguf_tools *t);

/* The schema a forced call is held to (new reference), for tests and for
 * gguf_tools_init. only: the one tool's name, or NULL for any of them. */
json_t *gguf_tools_call_schema(const char *family, json_t *tools, const char *only, char *err,
                               size_t errlen);

#endif
