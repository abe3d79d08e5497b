/*
 * backend_gguf_priv.h: what the files of the gguf backend share
 * (backend_gguf.c says what the backend does and which file holds what).
 * Private to those files: the agent sees backend.h only.
 */
#ifndef GPUPOOL_AGENT_BACKEND_GGUF_PRIV_H
#define GPUPOOL_AGENT_BACKEND_GGUF_PRIV_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agent/backend.h"
#include "agent/gguf_plan.h"
#include "agent/gguf_tools.h"
#include "common/gp_prefix.h"
#include "gpupool/engine.h"

#define MAX_STOPS 8

typedef enum { J_PENDING, J_PREFILL, J_GEN } job_state;

typedef struct gjob {
    struct gjob *next;         /* pending queue link */
    char job_id[128];
    agent_job_sink sink;
    bool count_only;
    json_t *emb_input;         /* embeddings job: its `input` array (owned), else NULL */
    char *text;                /* rendered prompt (+ continuation), owned */
    long max_tokens;
    gpe_sampler_params sp;
    char *stops[MAX_STOPS];
    size_t n_stops;
    bool cancel;               /* set under mu by job_cancel */
    /* token-exact continuation (failover); n_cont == 0: none */
    int32_t *cont_ids;         /* generated ids of the previous attempts */
    int n_cont;
    uint64_t n_sampled;        /* sampler draws the previous attempts took */
    char *cont_text;           /* text the client already has (for the stop matcher) */
    /* decode-thread state */
    job_state state;
    int slot;
    int32_t *toks;             /* prompt tokens */
    int n_toks, n_fed;         /* tokens to prefill (prompt + cont_ids), already decoded */
    int n_prompt;              /* of those, the prompt's own (usage, metrics) */
    int32_t *unsent;           /* ids sampled since the last token event */
    int n_unsent, cap_unsent;
    bool ids_lost;             /* an id could not be kept: token events go without ids
                                  from here on (the server's failover is then by text) */
    bool oom;                  /* memory ran out producing the output (a piece of text,
                                  a call, an event): nothing more is sent, and the job
                                  ends AGENT_OUT_OF_MEMORY (gguf_job_end) */
    int32_t last;              /* last sampled token (to decode next) */
    char *piece;               /* a token's text (gguf_piece), grown to the longest yet */
    size_t piece_cap;
    long n_gen;
    gpe_sampler *smp;
    gpe_stop *stop;
    gpe_grammar *gram;         /* response_format json_object/json_schema, or a forced
                                  tool call's (tools.gram moved here), else NULL */
    gguf_tools tools;          /* tool calls read out of the text; tool_choice */
    float *lazy_buf;           /* [n_vocab] logits of a schema-or-call step, else NULL */
    double t_start, t_first;
    int prog_fed;              /* n_fed at the last progress report */
    double t_prog;             /* time of the last progress report (or admission) */
    /* prompt-prefix cache */
    bool preparing;            /* under mu: a decode thread is tokenizing it */
    bool prepared;             /* tokenized (decode thread, while still pending) */
    bool finished;             /* ended while pending (count_tokens, errors): terminal sent */
    int reused;                /* prompt tokens whose K/V the slot already held */
    char tenant[65];           /* the server's tenant tag ("" = the shared tenant) */
    gp_prefix_chain chain;     /* the prompt's message/text chain (docs/protocol.md) */
} gjob;

/* What a slot's KV sequence holds once its job is over (prompt-prefix
 * cache). toks mirrors the sequence token for token: a token is recorded
 * when it goes into a batch and the record is cut back to gpe_seq_len after
 * each decode, so toks[0..n) are exactly the positions the sequence holds.
 * Owned by the decode thread, except desc/held/used_at (under mu, for
 * poll_facts). */
typedef struct slot_cache {
    int32_t *toks;             /* [n_ctx] */
    int n;
    uint64_t tick;             /* admission order: the smallest is least recently used */
    char tenant[65];           /* whose prompt the tokens are (gjob.tenant) */
    gp_prefix_desc desc;       /* under mu: the units of the last prompt held; kind "" = none */
    int held;                  /* under mu: n as of the last step */
    double used_at;            /* under mu: when its last job was admitted (0: never) */
} slot_cache;

typedef struct gguf_backend gguf_backend;

/* One engine context: on the CPU the only one; on CUDA one per GPU (or
 * one split over several). Its slots are b->slots[slot0 .. slot0 +
 * n_slots), sequence s - slot0 of ctx. Its decode thread owns ctx; after
 * a device fault ctx is freed and re-created with backoff (engine_fault,
 * engine_reinit) while the other engines go on. */
typedef struct gguf_engine {
    gguf_backend *b;
    int id;
    gpe_model *model;          /* owned */
    gpe_ctx *ctx;              /* decode thread; NULL while out of service */
    gpe_ctx_params cp;         /* how ctx is (re-)created */
    int slot0, n_slots;
    int n_devices;             /* 0 on the CPU */
    int devices[GPE_MAX_DEVICES];
    char pci[GPE_MAX_DEVICES][32]; /* PCI bus id of each device ("" unknown), for the facts */
    char gpu_name[GPE_MAX_DEVICES][96];
    uint64_t gpu_total[GPE_MAX_DEVICES];
    pthread_t thread;
    bool thread_started;
    /* the decode thread's scratch (gguf_engine_scratch), made before the
     * thread starts: one that could not make it would leave an engine
     * offering slots that nothing serves */
    gpe_batch *batch;
    int *entry;                /* [n_slots] slot -> batch index */
    bool *cancelled;           /* [n_slots] */
    gjob **mine;               /* [n_slots] */
    double backoff_s;          /* decode thread: the next re-init delay (0: none yet) */
    /* under b->mu */
    bool ready;                /* offers its slots */
    long long faults;          /* device faults since start */
    char error[320];           /* the last device error, "" none */
    double retry_at;           /* while not ready: when the next re-init is tried */
    uint64_t held[GPE_MAX_DEVICES]; /* bytes ctx holds per device (gpe_ctx_devices) */
    long kv_used;              /* positions held */
} gguf_engine;

struct gguf_backend {
    agent_backend base;        /* first member (backend.h) */
    gpe_model *model;          /* engines[0]'s: tokenizer, chat template, facts */
    int32_t *op_ids;           /* tokens that write pieces of the call opener (gguf_tools) */
    uint64_t *op_at;           /* their offsets in the opener (gguf_tools_opener_tokens) */
    int n_op;
    gpe_grammar_vocab *gvocab; /* model's token bytes for response_format (owned; built
                                  with the engines, read-only after) */
    gguf_engine *eng;          /* [n_eng] */
    int n_eng;
    gpe_backend_kind kind;
    bool refused;              /* the model cannot run here: no engine, refusal says why */
    char refusal[1280];
    gpe_model_info info;
    char *alias;
    char digest[65];           /* sha256 of the model file; "" when unknown */
    char *test_gate;           /* GPUPOOL_TEST_TOKEN_GATE (tests only), or NULL */
    int n_slots, n_ctx, n_batch;
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* broadcast: several decode threads wait on it */
    /* Embeddings jobs run on contexts of their own (created on first use),
     * one job at a time, on the decode thread that prepares them: the
     * slots' sequences are left alone. emb_ctx[0]: EMBED_SEQS sequences of
     * EMBED_SHORT positions (short inputs share passes); emb_ctx[1]: one
     * sequence of n_ctx (longer inputs, one by one). Together at most two
     * slots' worth of K/V (EMBED_SEQS * EMBED_SHORT <= a slot of 4096). */
    pthread_mutex_t emb_mu;
    gpe_ctx *emb_ctx[2];       /* under emb_mu */
    bool stopping;             /* under mu */
    gjob *pending;             /* under mu: FIFO of jobs not yet admitted */
    gjob **slots;              /* [n_slots] under mu: a job reserved for the slot
                                  (state J_PENDING) or running in it; written by the
                                  slot's engine thread, and by any thread reserving a
                                  free slot */
    int n_pending;             /* under mu */
    bool prefix_cache;         /* --prefix-cache (default on) */
    slot_cache *cache;         /* [n_slots] */
    uint64_t tick;             /* under mu: admissions so far */
    /* under mu: prompt-prefix cache counters since start (poll facts) */
    long long pc_lookups, pc_hits, pc_saved, pc_computed;
};

/* the backend (backend_gguf.c) */
double gguf_now_s(void);
void gguf_job_free(gjob *j);

/* job JSON (backend_gguf_job.c) */
/* A job of the server's JSON (borrowed) into *out: 0; -1 with err set, the
 * job refused (INVALID_REQUEST); AGENT_JOB_START_NOMEM ("out of memory"),
 * the agent's own failure. */
int gguf_job_parse(gguf_backend *b, json_t *job, gjob **out, char *err, size_t errlen);

/* a job's output (backend_gguf_out.c) */
void gguf_job_error(gjob *j, const char *code, const char *msg);
/* The job's end for want of the agent's memory: AGENT_OUT_OF_MEMORY (the
 * server fails it over), what says so in msg. */
void gguf_job_nomem(gjob *j, const char *what);
void gguf_out_text(gjob *j, const char *s, size_t n);
/* The text of token tok into j->piece, however long (a vocabulary's token
 * may be any length): its length, or -1 when memory ran out. */
int gguf_piece(gguf_backend *b, gjob *j, int32_t tok, bool special);
/* The finish reason of a job whose output was cut short (j->oom), for
 * job_step: gguf_job_end then sends AGENT_OUT_OF_MEMORY, not an end. */
#define GGUF_REASON_NOMEM "out of memory"
/* The job's terminal event: the held text and the calls, the metrics, then
 * the end with reason; or AGENT_OUT_OF_MEMORY when memory ran out producing
 * any of it, here or before (j->oom). */
void gguf_job_end(gjob *j, const char *reason);
/* text's tokens (malloc'd, *n_out of them); NULL only when memory ran out:
 * given the model's own tokenizer and a text, the engine's fails for
 * nothing else short of 2^31 tokens, past any job's size (engine.h
 * gpe_tokenize's INT32_MIN). */
int32_t *gguf_tokenize(gguf_backend *b, const char *text, int *n_out);
/* At admission: the stop matcher primed with what a lost attempt's held
 * back (a token-exact continuation), its buffer made in any case. false:
 * memory ran out (the job's AGENT_OUT_OF_MEMORY). */
bool gguf_prime_stop(gguf_backend *b, gjob *j);
void gguf_job_prepare(gguf_backend *b, gjob *j);

/* embeddings (backend_gguf_embed.c) */
void gguf_job_embed(gguf_backend *b, gjob *j);

/* the decode thread (backend_gguf_engine.c) */
/* Make e's decode scratch: 0, or -1 when memory ran out. Freed by
 * gguf_engine_scratch_free (after the thread ended). */
int gguf_engine_scratch(gguf_engine *e);
void gguf_engine_scratch_free(gguf_engine *e);
void gguf_engine_note_held(gguf_engine *e);
void gguf_engine_where(const gguf_engine *e, char *buf, size_t len);
void *gguf_decode_main(void *arg);

#endif
