/*
 * backend: how gpupool-agent runs a job. One small vtable, chosen once at
 * start-up (--upstream -> openai, --model FILE.gguf -> gguf, neither ->
 * deploy: the server's deployments choose the model).
 *
 * Concurrency model
 * -----------------
 * The agent's main thread owns the backend object: it calls create,
 * bind_loop, models, poll_facts, job_start, job_cancel and destroy, never
 * concurrently. That thread runs the agent's libevent loop. A backend runs
 * its jobs either on that loop (bind_loop: the openai backend drives every
 * job's libcurl transfer there, so a relayed token never crosses a thread)
 * or on thread(s) of its own (the gguf backend: its decode thread). Either
 * reports a job's progress through the agent_job_sink given to job_start.
 * Sink callbacks:
 *   - may be called from the loop or any backend thread, for different
 *     jobs at once;
 *   - are thread-safe and never block for long: they copy their arguments
 *     into the job's event queue and wake the agent's uploader;
 *   - for one job, are called in order from one thread at a time.
 *
 * Job lifecycle contract (every backend must keep it)
 * ---------------------------------------------------
 *   job_start() == 0  ->  started? progress* token* metrics*  then exactly ONE of
 *                         end() or error()   (the terminal event)
 * After the terminal callback returns the backend never touches that sink
 * again (the agent may free its context). job_cancel() is asynchronous: the
 * backend stops as soon as it can (the openai backend aborts the upstream
 * transfer so the upstream sees the disconnect) and still delivers one
 * terminal event (error "CANCELLED" is fine; the agent drops it). Cancel of
 * an unknown or finished job_id is a no-op. job_start() != 0 means the job
 * was not started and no callback will come: the agent reports err as an
 * error event itself. destroy() cancels what still runs and joins the
 * backend's threads (a backend bound to the loop ends its jobs there and
 * then) before returning (all terminal callbacks done).
 *
 * Job JSON (borrowed; json_incref it to keep it): exactly the object of
 * /agents/work's "jobs" array, see docs/protocol.md: job_id, kind
 * ("completion" | "chat" | "count_tokens" | "embeddings"), model, prompt, messages, params
 * {max_tokens, temperature, top_p, top_k, stop, seed}, continuation,
 * continuation_ids + continuation_digest + sampler {seed, n_sampled}
 * (token-exact failover, gguf only; others ignore them),
 * correlation_id, deadline_ms; chat jobs may carry OpenAI `tools` and
 * `tool_choice` (and then messages with tool_calls / role "tool"), only
 * when the backend's models() said "supports_tools": true. count_tokens:
 * no token events, end with finish_reason "stop" and usage.prompt_tokens
 * set. embeddings: `input` (an array of strings or of arrays of token ids);
 * one embedding() per input, then end "stop" with usage.prompt_tokens.
 *
 * Error codes (stable, go to the client): UPSTREAM_ERROR, UPSTREAM_MALFORMED,
 * UPSTREAM_TIMEOUT (openai), INVALID_REQUEST (bad job), CONTEXT_OVERFLOW,
 * INSUFFICIENT_VRAM, INTERNAL_ERROR, CANCELLED, AGENT_OUT_OF_MEMORY (openai:
 * an upstream reply the agent could not read for want of memory; the server
 * fails the job over, as for a broken event queue).
 */
#ifndef AGENT_BACKEND_H
#define AGENT_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct event_base;

#include "agent/agent_config.h"

/* job_start's return for a job not started because memory ran out: the
 * agent's own failure, not the job's, so the agent ends it with
 * AGENT_OUT_OF_MEMORY (failed over, as when its event queue breaks) and
 * not INVALID_REQUEST (a client's 400 for a request that was fine). */
#define AGENT_JOB_START_NOMEM (-2)

/* Event sink for one job. The agent fills it; ctx is the agent's per-job
 * state. Strings are borrowed for the duration of the call. */
typedef struct agent_job_sink {
    void *ctx;
    /* The backend began generating (prompt accepted). Optional to call. */
    void (*started)(void *ctx);
    /* Generated text (UTF-8, may be a partial code point sequence only if the
     * backend cannot avoid it; len bytes, not NUL-terminated). token_id is
     * -1 when unknown (openai). */
    void (*token)(void *ctx, const char *text, size_t len, int32_t token_id);
    /* Optional (may be NULL in a sink; then token is used): generated text
     * with the ids of every token sampled since the previous token call,
     * in order (n_ids >= 1). The gguf backend calls it so that the server
     * knows the ids behind all relayed text (token-exact failover). */
    void (*token_ids)(void *ctx, const char *text, size_t len, const int32_t *ids,
                      size_t n_ids);
    /* Free-form metrics object, e.g. {"prompt_tokens":5,"tokens_per_sec":410.5}.
     * Borrowed: the sink copies it. */
    void (*metrics)(void *ctx, json_t *metrics);
    /* Optional (may be NULL), before end: generation stopped on this stop
     * string, one of the job's params.stop (the end event names it, so that
     * the Anthropic dialect can say stop_reason "stop_sequence"). */
    void (*stop_sequence)(void *ctx, const char *seq);
    /* Optional (may be NULL), before end: the upstream is itself a pool and
     * said how it ran the request (its x_pool_meta object; borrowed, the
     * sink copies it). The end event carries it as upstream_meta, so that a
     * pool of pools shows both tiers (docs/protocol.md). */
    void (*upstream_meta)(void *ctx, json_t *meta);
    /* Terminal: finish_reason "stop" | "length" | "tool_calls"; token counts (-1 unknown). */
    void (*end)(void *ctx, const char *finish_reason, long long prompt_tokens,
                long long completion_tokens);
    /* Terminal: stable code and a message for people. */
    void (*error)(void *ctx, const char *code, const char *message);
    /* A piece of a tool call the model makes (OpenAI streaming style): the
     * first piece of call `index` carries id and name, later ones NULL and
     * only argument text. Called before the terminal event. Optional for a
     * backend to call (openai does) and may be NULL in a sink. */
    void (*tool_call)(void *ctx, int index, const char *id, const char *name, const char *args,
                      size_t args_len);
    /* Prefill progress before the first token: prompt tokens done of total.
     * Optional for a backend (gguf calls it; openai cannot know), may be
     * NULL in a sink. Rate-limited by the backend (the agent uploads every
     * call as a `progress` event). */
    void (*progress)(void *ctx, long long prompt_tokens_done, long long prompt_tokens_total);
    /* An embeddings job's vector for input `index` (dim floats), before the
     * terminal end (docs/protocol.md "Embeddings"). May be NULL in a sink. */
    void (*embedding)(void *ctx, int index, const float *v, int dim);
} agent_job_sink;

/* The agent's event loop, shared with a backend that binds to it
 * (agent_backend_ops.bind_loop). Two priorities: AGENT_PRI_NEW (new work:
 * the agent's requests to the server, a backend's wake-ups and the
 * transfers whose reply has not begun) runs ahead of AGENT_PRI_RELAY (the
 * streams already relaying). The openai backend keeps its relaying
 * sockets in one relay_set whose readiness is a single event at
 * AGENT_PRI_RELAY, serving at most AGENT_RELAY_BURST of them between two
 * looks at new work: at 1,000 paced streams a turn carries ~2,000 token
 * reads, and a new job must not wait behind all of them. */
#define AGENT_PRI_NEW 0
#define AGENT_PRI_RELAY 1
#define AGENT_RELAY_BURST 32

/* One wake for a whole turn (issue 24). Between agent_sink_hold() and
 * agent_sink_release() on one thread, sink callbacks queue their
 * events without waking the agent's uploader; the release wakes it once if
 * any came. A backend whose loop turn can deliver a whole reply (the openai
 * backend: a zero-delay upstream's headers, 64 tokens and end in one read)
 * brackets its turns with them, so that the reply travels in one upload
 * instead of a lone `started` first and the rest one round trip later.
 * Pairs nest; optional for a backend (unbracketed calls wake at once).
 * On the loop's thread (a backend bound to it) the outermost release may
 * run the agent's turn there and then, which may call this backend's ops
 * (job_start, job_cancel, slots, poll_facts, models) before it returns:
 * call it last in a callback, with no lock of the backend's held and its
 * state consistent. */
void agent_sink_hold(void);
void agent_sink_release(void);

typedef struct agent_backend agent_backend;

typedef struct agent_backend_ops {
    const char *name; /* "openai", "gguf" */
    /* Stop every job (terminal callbacks delivered), join threads, free. */
    void (*destroy)(agent_backend *b);
    /* (optional, may be NULL: the backend runs threads of its own) Run the
     * backend's jobs on the agent's loop (see AGENT_PRI_*): called once,
     * before the first job_start, on the thread that will run the loop.
     * From then on the backend's callbacks run on that thread while
     * agent_run dispatches; destroy, called after agent_run returned,
     * ends what still runs without the loop (its terminal callbacks
     * delivered on the caller's thread) and frees its events before the
     * agent frees the loop. 0, or -1 with err set. */
    int (*bind_loop)(agent_backend *b, struct event_base *evb, char *err, size_t errlen);
    /* Model facts for /agents/poll: a JSON array (new reference) of
     * {id, aliases[], quantization, context_length, bytes, vram_bytes,
     *  architecture, loaded}. Unknown facts may be null. Whole or NULL
     * (out of memory: the poll is not sent and tried again), never a
     * model or a fact left out. */
    json_t *(*models)(agent_backend *b);
    /* (optional, may be NULL) Add live figures to the poll body, e.g.
     * "kv_cache_utilization", "queue_depth". body is borrowed. 0, or -1
     * when memory ran out adding them (body may then hold some: the
     * caller does not send it, a later poll says the whole truth). */
    int (*poll_facts)(agent_backend *b, json_t *body);
    /* Start a job. job is borrowed; *sink is copied. Returns 0 (callbacks
     * will follow, ending with exactly one terminal) or, with err set and
     * no callback to come, -1 (the job is refused: INVALID_REQUEST) or
     * AGENT_JOB_START_NOMEM. */
    int (*job_start)(agent_backend *b, json_t *job, const agent_job_sink *sink, char *err,
                     size_t errlen);
    /* Ask a running job to stop (asynchronous, idempotent). */
    void (*job_cancel)(agent_backend *b, const char *job_id);
    /* (optional, may be NULL: --slots, auto = 1) The backend's slots:
     * *total all it has (>= 1, the poll's slots.total), *usable those it
     * offers now (0..total: the gguf backend stops offering the slots of a
     * GPU that failed until it is re-initialised). Thread-safe. */
    void (*slots)(agent_backend *b, int *total, int *usable);
    /* (optional, may be NULL: only the deploy backend takes deployments)
     * The poll reply's "deployments" array (borrowed), the server's whole
     * desired set for this agent: load what is listed, unload what is not
     * (asynchronously; poll_facts reports progress as "deploy"). */
    void (*deploy)(agent_backend *b, const json_t *deployments);
    /* The backend applies a job's `response_format` (json_object,
     * json_schema: docs/protocol.md). When false the agent fails such a
     * job (INVALID_REQUEST, a 400 for the client) rather than return text
     * the client did not ask for. */
    bool structured_output;
} agent_backend_ops;

/* Every backend embeds this as the FIRST member of its own struct. */
struct agent_backend {
    const agent_backend_ops *ops;
};

/* Constructors. Each returns a new backend, or NULL with a message in err.
 * Options are borrowed and outlive the backend. */
agent_backend *agent_backend_openai_create(const agent_options *o, char *err, size_t errlen);
/* Defined in backend_gguf.c (the embedded engine). */
agent_backend *agent_backend_gguf_create(const agent_options *o, char *err, size_t errlen);
/* The same, and *nomem says why a NULL came back: true when memory (or
 * threads: a decode thread's EAGAIN) ran out (a later try may load the
 * model: the agent exits 1 and is restarted, a deployment retries), false
 * for what a retry cannot fix (a damaged file, no usable GPU). */
agent_backend *agent_backend_gguf_create_status(const agent_options *o, bool *nomem, char *err,
                                                size_t errlen);
/* Defined in backend_deploy.c: neither --model nor --upstream; the server's
 * deployments choose the model (gguf backends inside). NULL with *nomem
 * true when memory or threads ran out (exit 1, restarted), false for what
 * a restart cannot fix. */
agent_backend *agent_backend_deploy_create(const agent_options *o, bool *nomem, char *err,
                                           size_t errlen);

#endif
