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
 * A forced call's arguments follow the tool's `parameters` when the schema
 * compiles (with several candidates, as a union of one call object per
 * tool told apart by the name: the grammar's discriminated unions); a tool
 * whose parameters cannot be enforced gets any JSON object, unless it is
 * marked `"strict": true`: then the request is refused naming the keyword
 * (never silently unenforced).
 *
 * Tools and a response_format schema together ("auto"): the model may call
 * a tool or answer in the schema (as OpenAI's models do). The first token
 * may be the schema's or the start of the family's call opener; a model
 * that takes the opener is held to the rest of it and then to a call
 * ({"name": one of the tools, "arguments": ...}); otherwise the schema
 * holds from there. Not for llama-3, whose call is itself a JSON object
 * (the schema holds there, no call).
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
    /* schema + tools: the call grammar that takes over once the model has
     * written the opener; opener_at: bytes of it written (-1: not on it) */
    gpe_grammar *call_gram;
    const char *opener;
    int opener_at;
    bool lazy;           /* first token still to come: schema or opener */
} gguf_tools;

/* The ids of tokens whose text (control tokens' too) is a non-empty piece
 * of the family's call opener, and for each a mask of the opener offsets
 * the piece fits at (bit a: opener[a..] starts with it): computed once per
 * model for the lazy first step. *n = 0 for a family without an opener. */
int gguf_tools_opener_tokens(const gpe_model *m, const char *family, int32_t **ids,
                             uint64_t **at, int *n);

/* Lazy step (t->lazy or t->opener_at >= 0): masked is the schema grammar's
 * mask (NULL on the opener path), raw the model's logits; out (n_vocab)
 * receives the logits to sample from. */
void gguf_tools_lazy_mask(const gguf_tools *t, const float *raw, const float *masked,
                          const int32_t *ids, const uint64_t *at, int n_ids, float *out,
                          int n_vocab);
/* After sampling tok on a lazy step. Returns 1 when tok took the opener
 * path (the schema grammar must not see it; the job's grammar becomes NULL
 * until *install is set: then it is t->call_gram, moved to the caller), 0
 * when it is the schema's (lazy mode over). */
int gguf_tools_lazy_accept(gguf_tools *t, const gpe_model *m, int32_t tok, bool schema_ok,
                           gpe_grammar **install);

/* gguf_tools_init's answer when memory ran out: the agent's own failure
 * (the job start's AGENT_JOB_START_NOMEM), never the client's refusal nor
 * a weaker grammar than the tools ask for. */
#define GGUF_TOOLS_NOMEM (-2)

/* Set t up for a chat job. family: the model's chat format; writes_tools:
 * its template has a tools format (gpe_chat_supports_tools); forcing is
 * skipped for a continuation (the text so far decides). 0, or -1 with a
 * message for the client in err, or GGUF_TOOLS_NOMEM ("out of memory"). */
int gguf_tools_init(gguf_tools *t, const char *family, bool writes_tools,
                    const gpe_grammar_vocab *gv, json_t *job, bool continuation, char *err,
                    size_t errlen);
void gguf_tools_free(gguf_tools *t);

/* The schema a forced call is held to (new reference), for tests and for
 * gguf_tools_init. only: the one tool's name, or NULL for any of them.
 * NULL with err set: the tools refused, or (*oom) memory ran out. */
json_t *gguf_tools_call_schema(const char *family, json_t *tools, const char *only, bool *oom,
                               char *err, size_t errlen);

#endif
