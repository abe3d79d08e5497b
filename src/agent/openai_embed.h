/*
 * openai_embed: embeddings jobs on the openai backend (issue 26 item 2),
 * passed through to the upstream's POST /v1/embeddings. The request body,
 * the reply's parsing into the job sink's embedding() calls, and the
 * start-up probe that decides whether the agent's model facts say
 * supports_embeddings (a chat-only upstream never gets such a job).
 * No event loop here: the backend (backend_openai.c) moves the bytes.
 */
#ifndef AGENT_OPENAI_EMBED_H
#define AGENT_OPENAI_EMBED_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "agent/agent_config.h"
#include "agent/backend.h"

/* The upstream request for an embeddings job: {model, input (the job's
 * array as given), encoding_format "float"}. NULL with err set when the
 * job has no non-empty input array; *n_inputs is its length. */
json_t *oai_embed_request(const char *upstream_model, json_t *job, int *n_inputs, char *err,
                          size_t errlen);

/* A 2xx JSON reply (body, len) to an embeddings request of n_inputs:
 * checked whole (one vector per input, by `index`, all of one length, all
 * numbers), then started, one embedding() per input in index order and end
 * "stop" with usage.prompt_tokens (0 when absent). 0, or -1 with err set
 * and nothing sent (the reply is not what it should be), or -2 the same
 * when the agent ran out of memory reading it (not the upstream's fault). */
int oai_embed_deliver(const char *body, size_t len, int n_inputs, const agent_job_sink *sink,
                      char *err, size_t errlen);

typedef enum {
    OAI_EMBED_YES,   /* 200 with a data array of a vector */
    OAI_EMBED_NO,    /* an answer that says no: 4xx (404: no such route), 501, no vector */
    OAI_EMBED_RETRY, /* no answer yet: unreachable, timed out, 5xx (a server still loading),
                        or a 200 the agent had no memory to read */
} oai_embed_probe_result;

/* The probe's request body: {"model": upstream_model, "input": ["gpupool
 * probe"], "encoding_format": "float"}. Malloc'd (caller frees), NULL when
 * memory ran out (or upstream_model is not UTF-8). */
char *oai_embed_probe_body(const char *upstream_model);
/* Blocking: a small POST url {model, input ["gpupool probe"]} (auth_header
 * may be NULL), bounded by the options' connect timeout and 10 s in all;
 * it gives up at once when *stop becomes true (NULL: never). */
oai_embed_probe_result oai_embed_probe(const agent_options *o, const char *url,
                                       const char *auth_header, atomic_bool *stop);

#endif
