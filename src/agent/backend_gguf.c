/*
 * backend_gguf: the agent's embedded-engine backend (--model FILE.gguf).
 *
 * Where the model runs is gguf_plan.h's choice (--backend, --devices,
 * --slots): one engine context on the CPU; on CUDA one per GPU (or one
 * split by layers over several). Each engine holds one KV sequence per
 * slot of its share of the agent's slots, and one decode thread per engine
 * owns its context and runs its jobs together: each step it builds one
 * batch with the prompt tokens of newly admitted jobs (prefill, at most
 * n_batch tokens per step so running jobs keep streaming) and the last
 * sampled token of every generating job (decode), so the weights are read
 * once per step for all its slots (continuous batching).
 *
 * Threads: the agent's main thread calls create/models/poll_facts/
 * job_start/job_cancel/slots/destroy; they only touch the shared queue and
 * flags under mu. Any decode thread may tokenize a pending job and reserve
 * a free slot for it on any engine (the best slot over all of them); the
 * slot's engine thread admits it, owns its sampler and stop matcher, and
 * calls its sinks (one thread per job from then on, so each job's
 * callbacks are in order). Jobs wait in `pending` until a slot is free.
 *
 * A device fault (GPE_ERR_BACKEND, GPE_ERR_INSUFFICIENT_VRAM from a
 * decode) fails that engine's jobs with DEVICE_ERROR / INSUFFICIENT_VRAM
 * (the server fails them over), takes its slots out of service, frees its
 * context and re-creates it with exponential backoff (engine_fault,
 * engine_reinit); the other engines go on.
 *
 * Job kinds: completion (prompt), chat (messages rendered with the model's
 * chat template, gpe_chat_apply_tools: OpenAI tools and tool messages go
 * into the prompt in the template's tools format when it has one; tool
 * calls in the output are not parsed, they stream as text), count_tokens
 * (tokenize, end at once).
 * `continuation` (failover) is appended to the prompt text: the model
 * continues after it and only new text is sent. When the job also carries
 * `continuation_ids` and `continuation_digest` equals this model file's
 * digest, the continuation is token-exact instead: the context is this
 * agent's tokenization of the prompt followed by those generated ids (the
 * text is never re-tokenized), the sampler gets the seed, the same accepted
 * tokens and its generator advanced by `sampler.n_sampled` draws, and the
 * stop matcher is primed with the text the lost agent had generated but
 * not sent; so the stream goes on exactly as if nothing had failed
 * (docs/architecture.md "Failover").
 *
 * Token events carry the ids of every token sampled since the previous
 * token event (`token_ids` when more than one: text held back by the stop
 * matcher or an incomplete UTF-8 character comes out with a later token),
 * so the server knows the exact ids behind the text it relayed.
 *
 * A prompt is fed n_batch tokens per step; between steps a job still in
 * prefill reports progress (job_progress) so that a long prompt is not
 * mistaken for a dead agent.
 *
 * Prompt-prefix cache (on unless --no-prefix-cache): a slot keeps its
 * sequence when its job ends, with the tokens it holds (slot_cache). A
 * pending job is tokenized first, then takes the free slot whose tokens
 * share the longest prefix with its own (ties and no match: the least
 * recently used slot); the sequence is cut to that prefix and only the rest
 * is prefilled (always at least the last prompt token, for its logits).
 * Token-exact continuations match like any prompt (their ids are part of
 * the tokens). Counters and, per slot, the prompt units held (gp_prefix.h)
 * go into the poll facts as "prefix_cache" (docs/protocol.md).
 */
#include "agent/backend.h"

#include <pthread.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/agent_facts.h"
#include "agent/gguf_plan.h"
#include "agent/gguf_tools.h"
#include "common/gp_prefix.h"
#include "common/gp_log.h"
#include "common/gp_util.h"
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
    int32_t last;              /* last sampled token (to decode next) */
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

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void job_free(gjob *j)
{
    if (!j)
        return;
    json_decref(j->emb_input);
    free(j->text);
    free(j->toks);
    free(j->cont_ids);
    free(j->cont_text);
    free(j->unsent);
    for (size_t i = 0; i < j->n_stops; i++)
        free(j->stops[i]);
    gpe_sampler_free(j->smp);
    gpe_stop_free(j->stop);
    gpe_grammar_free(j->gram);
    gguf_tools_free(&j->tools);
    free(j->lazy_buf);
    gp_prefix_chain_free(&j->chain);
    free(j);
}

/* ------------------------------------------------------ job JSON parsing */

/* Content of a message: a string, or an array of {type:"text", text} blocks
 * (concatenated). Returns a malloc'd string or NULL. */
static char *message_text(json_t *content)
{
    if (json_is_string(content))
        return strdup(json_string_value(content));
    if (!json_is_array(content))
        return NULL;
    size_t total = 1, i;
    json_t *blk;
    json_array_foreach(content, i, blk) {
        const char *t = json_string_value(json_object_get(blk, "text"));
        if (t)
            total += strlen(t);
    }
    char *out = malloc(total), *p = out;
    if (!out)
        return NULL;
    json_array_foreach(content, i, blk) {
        const char *t = json_string_value(json_object_get(blk, "text"));
        if (t) {
            size_t n = strlen(t);
            memcpy(p, t, n);
            p += n;
        }
    }
    *p = '\0';
    return out;
}

/* Strings render_chat allocates, freed together at the end. */
typedef struct strpool {
    char **v;
    size_t n, cap;
    bool oom;
} strpool;

static char *pool_keep(strpool *p, char *s)
{
    if (!s) {
        p->oom = true;
        return NULL;
    }
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 16;
        char **nv = realloc(p->v, nc * sizeof *nv);
        if (!nv) {
            free(s);
            p->oom = true;
            return NULL;
        }
        p->v = nv;
        p->cap = nc;
    }
    p->v[p->n++] = s;
    return s;
}

static void pool_free(strpool *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->v[i]);
    free(p->v);
}

/* JSON text of v for the chat template (which re-spaces it): strings as
 * they are (OpenAI sends arguments as a JSON string), anything else dumped. */
static const char *json_text(strpool *p, json_t *v)
{
    if (!v || json_is_null(v))
        return NULL;
    if (json_is_string(v))
        return pool_keep(p, strdup(json_string_value(v)));
    return pool_keep(p, json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY));
}

/* Render a job's messages (and its OpenAI `tools`) with the model's chat
 * template. Tools and tool messages (assistant `tool_calls`, role "tool"
 * with `tool_call_id`) go to gpe_chat_apply_tools: in the template's tool
 * format when the model's template supports tools, else tools are ignored
 * (the server only sends them to models reporting supports_tools) and tool
 * messages become plain text. tool_choice "none" leaves the tools out. */
static char *render_chat(gguf_backend *b, json_t *job, json_t *messages, char *err, size_t errlen)
{
    size_t n = json_array_size(messages);
    if (!json_is_array(messages) || n == 0) {
        snprintf(err, errlen, "chat job without messages");
        return NULL;
    }
    json_t *jtools = json_object_get(job, "tools");
    const char *choice = json_string_value(json_object_get(job, "tool_choice"));
    size_t nt = json_is_array(jtools) && !(choice && strcmp(choice, "none") == 0)
                    ? json_array_size(jtools) : 0;
    gpe_chat_msg *msgs = calloc(n, sizeof *msgs);
    gpe_chat_msg_tools *extra = calloc(n, sizeof *extra);
    gpe_chat_tool *tools = calloc(nt ? nt : 1, sizeof *tools);
    gpe_chat_tool_call **calls = calloc(n, sizeof *calls);
    strpool pool = {0};
    char *out = NULL;
    if (!msgs || !extra || !tools || !calls) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    for (size_t t = 0; t < nt; t++) {
        json_t *fn = json_object_get(json_array_get(jtools, t), "function");
        tools[t].name = json_string_value(json_object_get(fn, "name"));
        tools[t].description = json_string_value(json_object_get(fn, "description"));
        tools[t].parameters = json_text(&pool, json_object_get(fn, "parameters"));
        if (!tools[t].name || !*tools[t].name) {
            snprintf(err, errlen, "tool %zu needs a function name", t);
            goto done;
        }
    }
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(messages, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *content = json_object_get(m, "content");
        json_t *tc = json_object_get(m, "tool_calls");
        size_t nc = json_array_size(tc);
        msgs[i].role = role;
        char *txt = message_text(content);
        msgs[i].content = txt ? pool_keep(&pool, txt) : NULL;
        /* an assistant tool call may have null content */
        if (!msgs[i].content && nc > 0 && (!content || json_is_null(content)))
            msgs[i].content = "";
        if (!role || !msgs[i].content) {
            snprintf(err, errlen, "message %zu needs a string role and text content", i);
            goto done;
        }
        extra[i].tool_call_id = json_string_value(json_object_get(m, "tool_call_id"));
        if (nc == 0)
            continue;
        calls[i] = calloc(nc, sizeof *calls[i]);
        if (!calls[i]) {
            snprintf(err, errlen, "out of memory");
            goto done;
        }
        for (size_t c = 0; c < nc; c++) {
            json_t *call = json_array_get(tc, c);
            json_t *fn = json_object_get(call, "function");
            calls[i][c].id = json_string_value(json_object_get(call, "id"));
            calls[i][c].name = json_string_value(json_object_get(fn, "name"));
            calls[i][c].arguments = json_text(&pool, json_object_get(fn, "arguments"));
            if (!calls[i][c].name || !*calls[i][c].name) {
                snprintf(err, errlen, "message %zu: tool call %zu needs a function name", i, c);
                goto done;
            }
        }
        extra[i].tool_calls = calls[i];
        extra[i].n_tool_calls = nc;
    }
    if (pool.oom) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    out = gpe_chat_apply_tools(b->model, tools, nt, msgs, extra, n, true, err, errlen);
done:
    if (calls)
        for (size_t i = 0; i < n; i++)
            free(calls[i]);
    free(calls);
    free(tools);
    free(extra);
    free(msgs);
    pool_free(&pool);
    return out;
}

static double num_or(json_t *o, const char *k, double dflt)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

/* Tools of a chat job (gguf_tools.h): the parser for the model's calls
 * and, for a forced call, its opener appended to the prompt and its
 * grammar (which then takes the place of a response_format). Not forced
 * on a continuation: the text so far decides what comes next. */
static int setup_tools(gguf_backend *b, json_t *job, gjob *j, char *err, size_t errlen)
{
    const char *cont = json_string_value(json_object_get(job, "continuation"));
    bool continuation = (cont && *cont) || json_object_get(job, "continuation_ids");
    if (gguf_tools_init(&j->tools, b->info.chat_format, gpe_chat_supports_tools(b->model),
                        b->gvocab, job, continuation, err, errlen) < 0)
        return -1;
    if (continuation && cont && j->tools.tp) {
        /* the client has this text already: the parser only learns from it */
        const char *emit;
        size_t elen;
        (void)gpe_toolparse_feed(j->tools.tp, cont, strlen(cont), &emit, &elen);
    }
    if (j->tools.lazy) {
        j->lazy_buf = malloc((size_t)gpe_model_n_vocab(b->model) * sizeof *j->lazy_buf);
        if (!j->lazy_buf) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
    if (!j->tools.gram)
        return 0;
    size_t a = strlen(j->text), c = strlen(j->tools.prefix);
    char *t = realloc(j->text, a + c + 1);
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memcpy(t + a, j->tools.prefix, c + 1);
    j->text = t;
    j->gram = j->tools.gram;
    j->tools.gram = NULL;
    return 0;
}

/* response_format (docs/protocol.md, OpenAI's chat form): json_object or
 * json_schema become a grammar that constrains every sampled token. The
 * text a continuation carries was written under the same schema: the
 * grammar starts after it. */
static int parse_response_format(gguf_backend *b, json_t *job, gjob *j, const char *cont,
                                 char *err, size_t errlen)
{
    json_t *rf = json_object_get(job, "response_format");
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!type || strcmp(type, "text") == 0 || j->gram)
        return 0;   /* (j->gram: a forced tool call, whose grammar comes first) */
    char *schema = NULL;
    if (strcmp(type, "json_schema") == 0) {
        json_t *sc = json_object_get(json_object_get(rf, "json_schema"), "schema");
        schema = json_dumps(sc ? sc : json_object(), JSON_COMPACT | JSON_ENCODE_ANY);
        if (!schema) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    } else if (strcmp(type, "json_object") != 0) {
        snprintf(err, errlen, "response_format type '%s' is not supported", type);
        return -1;
    }
    char why[256];
    gpe_status st = gpe_grammar_init_vocab(b->gvocab, schema, &j->gram, why, sizeof why);
    free(schema);
    if (st != GPE_OK) {
        snprintf(err, errlen, "response_format: %s", why);
        return -1;
    }
    if (cont && *cont && gpe_grammar_accept_text(j->gram, cont, strlen(cont)) != GPE_OK) {
        snprintf(err, errlen, "continuation does not match the response_format schema");
        return -1;
    }
    return 0;
}

/* Token-exact continuation fields of a job (see the top of this file).
 * Returns 1 when the job continues from token ids (j->cont_* set), 0 when
 * it does not (no ids, or a digest that is not ours: text continuation),
 * -1 with err set on malformed fields. */
static int parse_token_continuation(gguf_backend *b, json_t *job, gjob *j, char *err,
                                    size_t errlen)
{
    json_t *ids = json_object_get(job, "continuation_ids");
    const char *dg = json_string_value(json_object_get(job, "continuation_digest"));
    if (!json_is_array(ids) || json_array_size(ids) == 0)
        return 0;
    if (!b->digest[0] || !dg || strcmp(dg, b->digest) != 0) {
        /* another file (the server's facts were stale): the ids mean
         * other tokens here */
        gp_log_warn("continuation_digest_mismatch", "job %s: continuation ids for another "
                    "model file; continuing from the text", j->job_id);
        return 0;
    }
    size_t n = json_array_size(ids);
    json_t *ns = json_object_get(json_object_get(job, "sampler"), "n_sampled");
    const char *cont = json_string_value(json_object_get(job, "continuation"));
    /* One draw per sampled token, and every sampled token is an id here
     * (an end-of-generation token ends the job): n_sampled cannot exceed
     * the ids, which also bounds the generator's fast-forward. Too many
     * ids for the context: job_admit's CONTEXT_OVERFLOW. */
    if (!json_is_integer(ns) || json_integer_value(ns) < 0 ||
        (size_t)json_integer_value(ns) > n || !cont) {
        snprintf(err, errlen, "continuation_ids needs continuation and sampler.n_sampled "
                              "(0..number of ids)");
        return -1;
    }
    j->cont_ids = malloc(n * sizeof *j->cont_ids);
    j->cont_text = strdup(cont);
    if (!j->cont_ids || !j->cont_text) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int n_vocab = gpe_model_n_vocab(b->model);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= n_vocab) {
            snprintf(err, errlen, "continuation_ids[%zu]: not a token id of this model", i);
            return -1;
        }
        j->cont_ids[i] = (int32_t)json_integer_value(v);
    }
    j->n_cont = (int)n;
    j->n_sampled = (uint64_t)json_integer_value(ns);
    return 1;
}

static gjob *job_parse(gguf_backend *b, json_t *job, char *err, size_t errlen)
{
    gjob *j = calloc(1, sizeof *j);
    if (!j) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    const char *id = json_string_value(json_object_get(job, "job_id"));
    const char *kind = json_string_value(json_object_get(job, "kind"));
    if (!id || !kind) {
        snprintf(err, errlen, "job without job_id or kind");
        goto fail;
    }
    snprintf(j->job_id, sizeof j->job_id, "%s", id);
    if (strcmp(kind, "chat") == 0) {
        j->text = render_chat(b, job, json_object_get(job, "messages"), err, errlen);
        if (!j->text || setup_tools(b, job, j, err, errlen) < 0)
            goto fail;
    } else if (strcmp(kind, "completion") == 0 || strcmp(kind, "count_tokens") == 0) {
        json_t *msgs = json_object_get(job, "messages");
        const char *p = json_string_value(json_object_get(job, "prompt"));
        if (p)
            j->text = strdup(p);
        else if (json_is_array(msgs))
            j->text = render_chat(b, job, msgs, err, errlen);
        if (!j->text) {
            if (!p && !json_is_array(msgs))
                snprintf(err, errlen, "%s job without prompt", kind);
            goto fail;
        }
        j->count_only = strcmp(kind, "count_tokens") == 0;
    } else if (strcmp(kind, "embeddings") == 0) {
        json_t *in = json_object_get(job, "input");
        if (!json_is_array(in) || json_array_size(in) == 0) {
            snprintf(err, errlen, "embeddings job without input");
            goto fail;
        }
        j->emb_input = json_incref(in);
        j->text = strdup("");
        if (!j->text)
            goto fail;
    } else {
        snprintf(err, errlen, "unknown job kind '%s'", kind);
        goto fail;
    }
    const char *cont = json_string_value(json_object_get(job, "continuation"));
    int tc = parse_token_continuation(b, job, j, err, errlen);
    if (tc < 0)
        goto fail;
    if (tc == 0 && cont && *cont) {
        size_t a = strlen(j->text), c = strlen(cont);
        char *t = realloc(j->text, a + c + 1);
        if (!t) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        memcpy(t + a, cont, c + 1);
        j->text = t;
    }

    json_t *params = json_object_get(job, "params");
    j->sp = gpe_sampler_default_params();
    j->sp.temperature = (float)num_or(params, "temperature", 0.8);
    j->sp.top_p = (float)num_or(params, "top_p", 1.0);
    j->sp.top_k = (int)num_or(params, "top_k", 0);
    /* The client's seed, else the one the server chose for the job (the
     * same on every attempt: a token-exact continuation needs it), else
     * our own. */
    json_t *seed = json_object_get(params, "seed");
    json_t *sseed = json_object_get(json_object_get(job, "sampler"), "seed");
    j->sp.seed = json_is_integer(seed)    ? (uint64_t)json_integer_value(seed)
                 : json_is_integer(sseed) ? (uint64_t)json_integer_value(sseed)
                                          : (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)j;
    if (j->sp.temperature < 0 || j->sp.top_p < 0 || j->sp.top_p > 1 || j->sp.top_k < 0) {
        snprintf(err, errlen, "bad sampling parameters");
        goto fail;
    }
    j->max_tokens = (long)num_or(params, "max_tokens", (double)b->n_ctx);
    if (j->max_tokens <= 0)
        j->max_tokens = b->n_ctx;
    json_t *stop = json_object_get(params, "stop");
    if (json_is_string(stop)) {
        j->stops[j->n_stops++] = strdup(json_string_value(stop));
    } else if (json_is_array(stop)) {
        size_t i;
        json_t *s;
        json_array_foreach(stop, i, s) {
            if (json_is_string(s) && *json_string_value(s) && j->n_stops < MAX_STOPS)
                j->stops[j->n_stops++] = strdup(json_string_value(s));
        }
    }
    for (size_t i = 0; i < j->n_stops; i++)
        if (!j->stops[i]) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
    if (parse_response_format(b, job, j, cont, err, errlen) < 0)
        goto fail;
    /* Only what the server can compute too: no chain is fine (nothing
     * advertised for the slot). */
    gp_prefix_chain_of_job(job, &j->chain);
    /* Longer than the server ever sends: hashed down, still distinct. */
    const char *tenant = json_string_value(json_object_get(job, "tenant"));
    if (tenant && strlen(tenant) < sizeof j->tenant)
        snprintf(j->tenant, sizeof j->tenant, "%s", tenant);
    else if (tenant)
        gp_sha256_hex(tenant, strlen(tenant), j->tenant);
    j->slot = -1;
    j->t_start = now_s();
    return j;
fail:
    job_free(j);
    return NULL;
}

/* --------------------------------------------------------- decode thread */

/* Terminal helpers: call the sink, then the job is freed by the caller. */
static void job_error(gjob *j, const char *code, const char *msg)
{
    j->sink.error(j->sink.ctx, code, msg);
}

/* Send a token event with emit[0..n) and the ids sampled since the last
 * one (the backend's part of a token-exact failover: the server keeps the
 * ids behind the text it relayed). */
static void send_text(gjob *j, const char *emit, size_t n)
{
    if (j->sink.token_ids && j->n_unsent > 0)
        j->sink.token_ids(j->sink.ctx, emit, n, j->unsent, (size_t)j->n_unsent);
    else
        j->sink.token(j->sink.ctx, emit, n, j->n_unsent > 0 ? j->unsent[j->n_unsent - 1] : -1);
    j->n_unsent = 0;
}

/* The calls the parser found since the last time, as tool_call events
 * (ids derived from the job id: the same on every attempt). */
static void send_calls(gjob *j)
{
    const char *name, *args;
    while (gpe_toolparse_call(j->tools.tp, j->tools.n_sent, &name, &args)) {
        if (j->sink.tool_call) {
            char seed[160], h[65], id[40];
            snprintf(seed, sizeof seed, "%s/%zu", j->job_id, j->tools.n_sent);
            gp_sha256_hex(seed, strlen(seed), h);
            snprintf(id, sizeof id, "call_%.24s", h);
            j->sink.tool_call(j->sink.ctx, (int)j->tools.n_sent, id, name, args, strlen(args));
        }
        j->tools.n_sent++;
        /* the ids behind a call are not text a continuation could resume */
        j->n_unsent = 0;
    }
}

/* Generated text on its way out: through the tool-call parser when the
 * job has tools (content goes on as token events, calls as tool_call). */
static void out_text(gjob *j, const char *s, size_t n)
{
    if (!j->tools.tp) {
        if (n > 0)
            send_text(j, s, n);
        return;
    }
    const char *emit;
    size_t elen;
    if (gpe_toolparse_feed(j->tools.tp, s, n, &emit, &elen) != GPE_OK)
        gp_log_warn("tool_parse_oom", "job %s: out of memory reading tool calls", j->job_id);
    if (elen > 0)
        send_text(j, emit, elen);
    send_calls(j);
}

static void job_end(gjob *j, const char *reason)
{
    if (j->stop) {
        const char *emit;
        size_t n;
        gpe_stop_flush(j->stop, &emit, &n);
        out_text(j, emit, n);
    }
    if (j->tools.tp) {
        const char *emit;
        size_t n;
        gpe_toolparse_finish(j->tools.tp, &emit, &n);
        if (n > 0)
            send_text(j, emit, n);
        send_calls(j);
        if (j->tools.n_sent > 0 && strcmp(reason, "stop") == 0)
            reason = "tool_calls";
    }
    if (j->sink.metrics && !j->count_only) {
        double t = now_s();
        double gen = j->t_first > 0 ? t - j->t_first : 0;
        json_t *m = json_pack("{s:i, s:i, s:I, s:f, s:f}", "prompt_tokens", j->n_prompt,
                              "prompt_tokens_cached", j->reused < j->n_prompt ? j->reused : j->n_prompt,
                              "completion_tokens", (json_int_t)j->n_gen, "time_to_first_token_ms",
                              j->t_first > 0 ? (j->t_first - j->t_start) * 1e3 : 0.0,
                              "tokens_per_sec", gen > 0 && j->n_gen > 1 ? (j->n_gen - 1) / gen : 0.0);
        if (m) {
            j->sink.metrics(j->sink.ctx, m);
            json_decref(m);
        }
    }
    j->sink.end(j->sink.ctx, reason, j->n_prompt, j->count_only ? 0 : j->n_gen);
}

static int32_t *tokenize(gguf_backend *b, const char *text, int *n_out)
{
    size_t len = strlen(text);
    int cap = (int)(len < 1u << 24 ? len : 1u << 24) + 8;
    int32_t *t = malloc((size_t)cap * sizeof *t);
    if (!t)
        return NULL;
    int n = gpe_tokenize(b->model, text, len, true, true, t, cap);
    if (n < 0 && n != INT32_MIN) {
        cap = -n;
        int32_t *bigger = realloc(t, (size_t)cap * sizeof *t);
        if (!bigger) {
            free(t);
            return NULL;
        }
        t = bigger;
        n = gpe_tokenize(b->model, text, len, true, true, t, cap);
    }
    if (n < 0) {
        free(t);
        return NULL;
    }
    *n_out = n;
    return t;
}

/* Token-exact continuation: the prompt's tokens followed by the generated
 * ids of the previous attempts (never the text re-tokenized). */
static bool append_cont_ids(gjob *j)
{
    if (j->n_cont == 0)
        return true;
    int32_t *t = realloc(j->toks, (size_t)(j->n_toks + j->n_cont) * sizeof *t);
    if (!t)
        return false;
    memcpy(t + j->n_toks, j->cont_ids, (size_t)j->n_cont * sizeof *t);
    j->toks = t;
    j->n_toks += j->n_cont;
    return true;
}

/* The stop matcher of the lost attempt had fed the pieces of every id it
 * sampled and emitted the continuation text; what it still held back is
 * the rest. Give it to ours, so its next feed behaves as that one's would
 * have (a stop string straddling the junction is still found). */
static void prime_stop(gguf_backend *b, gjob *j)
{
    gp_buf all = {0};
    char piece[256];
    for (int i = 0; i < j->n_cont; i++) {
        int n = gpe_token_to_piece(b->model, j->cont_ids[i], piece, sizeof piece, false);
        gp_buf_append(&all, piece, n > 0 ? (size_t)n : 0);
    }
    size_t sent = strlen(j->cont_text);
    if (all.len >= sent && (sent == 0 || memcmp(all.data, j->cont_text, sent) == 0))
        gpe_stop_prime(j->stop, all.data ? all.data + sent : "", all.len - sent);
    else
        gp_log_warn("continuation_mismatch", "job %s: the continuation ids do not render to the "
                    "continuation text; the stop matcher starts empty", j->job_id);
    gp_buf_free(&all);
}

/* While the job is still pending (its slot is chosen from its tokens):
 * tokenize, and end here the jobs that need no slot (count_tokens) or
 * cannot run. Sets prepared; sets finished when the terminal event was
 * sent (the job is then only unlinked and freed). */
static void job_embed(gguf_backend *b, gjob *j);

static void job_prepare(gguf_backend *b, gjob *j)
{
    j->prepared = true;
    j->finished = true;
    if (j->emb_input) {
        job_embed(b, j);
        return;
    }
    j->toks = tokenize(b, j->text, &j->n_toks);
    if (!j->toks) {
        job_error(j, "INTERNAL_ERROR", "tokenization failed");
        return;
    }
    j->n_prompt = j->n_toks;
    if (!append_cont_ids(j)) {
        job_error(j, "INTERNAL_ERROR", "out of memory");
        return;
    }
    if (j->sink.started)
        j->sink.started(j->sink.ctx);
    if (j->count_only) {
        job_end(j, "stop");
        return;
    }
    if (j->n_toks == 0) {
        job_error(j, "INVALID_REQUEST", "empty prompt");
        return;
    }
    if (j->n_toks >= b->n_ctx) {
        char msg[160];
        snprintf(msg, sizeof msg, "prompt has %d tokens; the context holds %d", j->n_toks,
                 b->n_ctx);
        job_error(j, "CONTEXT_OVERFLOW", msg);
        return;
    }
    j->finished = false;
}

/* ---------------------------------------------------------- embeddings */

#define EMBED_SEQS 8
#define EMBED_SHORT 512

/* Input i of an embeddings job as tokens: a string (tokenized with the
 * model's special tokens, as a prompt) or an array of token ids. Returns
 * a malloc'd array or NULL with msg set. */
static int32_t *embed_tokens(gguf_backend *b, json_t *v, size_t i, int *n, char *msg,
                             size_t msglen)
{
    int32_t *t = NULL;
    if (json_is_string(v)) {
        t = tokenize(b, json_string_value(v), n);
    } else if (json_is_array(v)) {
        *n = (int)json_array_size(v);
        t = malloc(((size_t)*n + 1) * sizeof *t);
        for (int k = 0; t && k < *n; k++) {
            json_t *x = json_array_get(v, (size_t)k);
            if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                json_integer_value(x) >= b->info.n_vocab) {
                snprintf(msg, msglen, "input[%zu][%d]: not a token id of this model", i, k);
                free(t);
                return NULL;
            }
            t[k] = (int32_t)json_integer_value(x);
        }
    }
    if (!t) {
        snprintf(msg, msglen, "input[%zu]: not a string or an array of token ids", i);
        return NULL;
    }
    if (*n < 1 || *n > b->n_ctx) {
        snprintf(msg, msglen, "input[%zu] has %d tokens; the context holds %d", i, *n,
                 b->n_ctx);
        free(t);
        return NULL;
    }
    return t;
}

/* Under emb_mu: embeddings context k (see gguf_backend), created on
 * first use. */
static gpe_ctx *embed_ctx(gguf_backend *b, int k, char *msg, size_t msglen)
{
    if (b->emb_ctx[k])
        return b->emb_ctx[k];
    gpe_ctx_params cp = b->eng[0].cp;
    cp.n_seq = k == 0 ? EMBED_SEQS : 1;
    cp.n_ctx = k == 0 && b->n_ctx > EMBED_SHORT ? EMBED_SHORT : b->n_ctx;
    gpe_ctx_init(b->model, &cp, &b->emb_ctx[k], msg, msglen);
    return b->emb_ctx[k];
}

/* Under emb_mu: the vectors of all inputs into out. Inputs that fit the
 * short context go through it together (gathered, then scattered back);
 * the others one by one on the long one. */
static gpe_status embed_all(gguf_backend *b, int32_t **toks, const int *nt, size_t n_in,
                            int dim, float *out, char *msg, size_t msglen)
{
    gpe_status st = GPE_OK;
    const int short_len = b->n_ctx > EMBED_SHORT ? EMBED_SHORT : b->n_ctx;
    const int32_t **st_toks = malloc(n_in * sizeof *st_toks);
    int *st_n = malloc(n_in * sizeof *st_n);
    size_t *st_at = malloc(n_in * sizeof *st_at), n_short = 0;
    float *st_out = malloc(n_in * (size_t)dim * sizeof *st_out);
    if (!st_toks || !st_n || !st_at || !st_out) {
        snprintf(msg, msglen, "out of memory");
        st = GPE_ERR_NOMEM;
        goto done;
    }
    for (size_t i = 0; i < n_in && st == GPE_OK; i++) {
        if (nt[i] <= short_len) {
            st_toks[n_short] = toks[i];
            st_n[n_short] = nt[i];
            st_at[n_short++] = i;
            continue;
        }
        gpe_ctx *c = embed_ctx(b, 1, msg, msglen);
        st = c ? gpe_embed(c, toks[i], nt[i], out + i * (size_t)dim, dim, msg, msglen)
               : GPE_ERR_UNSUPPORTED;
    }
    if (st == GPE_OK && n_short > 0) {
        gpe_ctx *c = embed_ctx(b, 0, msg, msglen);
        st = c ? gpe_embed_batch(c, st_toks, st_n, (int)n_short, st_out, dim, msg, msglen)
               : GPE_ERR_UNSUPPORTED;
        for (size_t k = 0; st == GPE_OK && k < n_short; k++)
            memcpy(out + st_at[k] * (size_t)dim, st_out + k * (size_t)dim,
                   (size_t)dim * sizeof *out);
    }
    /* A device fault leaves a context unusable: the next job makes new ones. */
    for (int k = 0; k < 2 && (st == GPE_ERR_BACKEND || st == GPE_ERR_INSUFFICIENT_VRAM); k++) {
        gpe_ctx_free(b->emb_ctx[k]);
        b->emb_ctx[k] = NULL;
    }
done:
    free(st_toks);
    free(st_n);
    free(st_at);
    free(st_out);
    return st;
}

/* An embeddings job, whole: every input pooled by the engine, one
 * embedding() each, then end. */
static void job_embed(gguf_backend *b, gjob *j)
{
    size_t n_in = json_array_size(j->emb_input);
    const int dim = gpe_model_embedding_dim(b->model);
    int32_t **toks = calloc(n_in, sizeof *toks);
    int *nt = calloc(n_in, sizeof *nt);
    float *out = malloc(n_in * (size_t)dim * sizeof *out);
    char msg[320] = "";
    const char *code = "INVALID_REQUEST";
    long long total = 0;
    if (!toks || !nt || !out) {
        code = "INTERNAL_ERROR";
        snprintf(msg, sizeof msg, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n_in; i++) {
        toks[i] = embed_tokens(b, json_array_get(j->emb_input, i), i, &nt[i], msg, sizeof msg);
        if (!toks[i]) {
            if (nt[i] > b->n_ctx)
                code = "CONTEXT_OVERFLOW";
            goto done;
        }
        total += nt[i];
    }
    if (j->sink.started)
        j->sink.started(j->sink.ctx);
    pthread_mutex_lock(&b->emb_mu);
    gpe_status st = embed_all(b, toks, nt, n_in, dim, out, msg, sizeof msg);
    pthread_mutex_unlock(&b->emb_mu);
    if (st != GPE_OK) {
        code = st == GPE_ERR_CTX_FULL ? "CONTEXT_OVERFLOW" : "INTERNAL_ERROR";
        goto done;
    }
    for (size_t i = 0; i < n_in && j->sink.embedding; i++)
        j->sink.embedding(j->sink.ctx, (int)i, out + i * (size_t)dim, dim);
    j->n_prompt = (int)total;
    msg[0] = '\0';
done:
    if (msg[0])
        job_error(j, code, msg);
    else
        j->sink.end(j->sink.ctx, "stop", total, 0);
    for (size_t i = 0; toks && i < n_in; i++)
        free(toks[i]);
    free(toks);
    free(nt);
    free(out);
}

/* Prompt tokens a slot's cached sequence can give this job: the longest
 * common prefix, but never the last prompt token (its logits come only
 * from decoding it); none when another tenant's prompt is in the slot:
 * the cached count and the time to first token would tell this job's
 * client what the other one sent (the slot is then taken as a cold one). */
static int reusable(const slot_cache *c, const gjob *j)
{
    if (strcmp(c->tenant, j->tenant) != 0)
        return 0;
    int n = c->n < j->n_toks - 1 ? c->n : j->n_toks - 1, i = 0;
    while (i < n && c->toks[i] == j->toks[i])
        i++;
    return i;
}

/* A common prefix shorter than this (a BOS token, a chat template's first
 * few tokens) does not make a slot worth taking over another's: taking it
 * would throw away that slot's conversation for next to no saving. */
#define PREFIX_MIN_USEFUL 16

/* Under mu: the free slot for a prepared job, over every engine that is
 * in service (a conversation's slot may be on any GPU). With the prefix
 * cache, the one whose cached sequence gives the most tokens; ties, and
 * when no slot has a useful prefix (at least PREFIX_MIN_USEFUL tokens, or
 * all that the slot holds so nothing is lost), the least recently used:
 * its K/V is the least likely to be wanted again; among unused slots the
 * engine with the fewest busy slots first (jobs spread over the GPUs).
 * Without the cache, the first free slot of the least busy engine. */
static int choose_slot(gguf_backend *b, const gjob *j)
{
    int best = -1, best_reuse = -1, best_busy = 0;
    for (int e = 0; e < b->n_eng; e++) {
        gguf_engine *g = &b->eng[e];
        if (!g->ready)
            continue;
        int busy = 0;
        for (int s = g->slot0; s < g->slot0 + g->n_slots; s++)
            busy += b->slots[s] != NULL;
        for (int s = g->slot0; s < g->slot0 + g->n_slots; s++) {
            if (b->slots[s])
                continue;
            int r = b->prefix_cache ? reusable(&b->cache[s], j) : 0;
            if (r < PREFIX_MIN_USEFUL && r < b->cache[s].n)
                r = 0;
            bool better = r > best_reuse;
            if (!better && r == best_reuse) {
                /* equal reuse: prefer the less busy engine, then the LRU slot */
                better = busy < best_busy ||
                         (busy == best_busy && b->prefix_cache &&
                          b->cache[s].tick < b->cache[best].tick);
            }
            if (better) {
                best = s;
                best_reuse = r;
                best_busy = busy;
            }
            if (!b->prefix_cache)
                break; /* any free slot of this engine is as good */
        }
    }
    return best;
}

/* Admit a reserved job into its slot (decode thread of the slot's
 * engine): set up sampling, and keep the slot's cached prefix (prefill
 * starts after it) or clear the slot. */
static bool job_admit(gguf_engine *e, gjob *j, int slot)
{
    gguf_backend *b = e->b;
    j->smp = gpe_sampler_init(&j->sp);
    j->stop = gpe_stop_init((const char *const *)j->stops, j->n_stops);
    if (!j->smp || !j->stop) {
        job_error(j, "INTERNAL_ERROR", "out of memory");
        return false;
    }
    for (int i = 0; i < j->n_toks; i++)
        gpe_sampler_accept(j->smp, j->toks[i]);
    if (j->n_cont > 0) {
        gpe_sampler_advance(j->smp, j->n_sampled);
        prime_stop(b, j);
    }
    j->slot = slot;
    j->state = J_PREFILL;
    j->t_prog = now_s();
    slot_cache *c = &b->cache[slot];
    int reuse = b->prefix_cache ? reusable(c, j) : 0;
    /* The K/V rows of positions < reuse were computed from the same tokens
     * at the same positions: only the rest is decoded. */
    gpe_seq_truncate(e->ctx, slot - e->slot0, reuse);
    c->n = reuse;
    memcpy(c->tenant, j->tenant, sizeof c->tenant);
    j->reused = j->n_fed = j->prog_fed = reuse;
    pthread_mutex_lock(&b->mu);
    c->tick = ++b->tick;
    b->pc_lookups++;
    b->pc_hits += reuse >= PREFIX_MIN_USEFUL;   /* a BOS alone is no hit */
    b->pc_saved += reuse;
    b->pc_computed += j->n_toks - reuse;
    c->desc.kind[0] = '\0';   /* holds a part of the old prompt at most now */
    c->held = reuse;
    c->used_at = j->t_prog;
    pthread_mutex_unlock(&b->mu);
    return true;
}
/* Tests only (GPUPOOL_TEST_TOKEN_GATE=FILE): before sampling a job's
 * token number k (1-based, this attempt) wait until FILE holds a number
 * >= k, so a test can kill the agent at a chosen token without racing it.
 * Gives up when the backend stops or the job is cancelled. */
static void test_gate_wait(gguf_backend *b, gjob *j)
{
    for (;;) {
        char *txt = gp_read_file(b->test_gate, NULL, 64);
        long long allowed = txt ? atoll(txt) : 0;
        free(txt);
        if (allowed > j->n_gen)
            return;
        pthread_mutex_lock(&b->mu);
        bool quit = b->stopping || j->cancel;
        pthread_mutex_unlock(&b->mu);
        if (quit)
            return;
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
}

static bool unsent_push(gjob *j, int32_t tok)
{
    if (j->n_unsent == j->cap_unsent) {
        int nc = j->cap_unsent ? 2 * j->cap_unsent : 8;
        int32_t *u = realloc(j->unsent, (size_t)nc * sizeof *u);
        if (!u)
            return false;
        j->unsent = u;
        j->cap_unsent = nc;
    }
    j->unsent[j->n_unsent++] = tok;
    return true;
}

/* A long prefill sends nothing else: report progress so the server's stall
 * timer sees a live agent. At most every PROGRESS_TOKENS tokens and
 * PROGRESS_SEC seconds, whichever comes later (bounded event count). */
#define PROGRESS_TOKENS 256
#define PROGRESS_SEC 1.0
static void job_progress(gjob *j)
{
    if (!j->sink.progress || j->state != J_PREFILL || j->n_fed >= j->n_toks ||
        j->n_fed - j->prog_fed < PROGRESS_TOKENS)
        return;
    double t = now_s();
    if (t - j->t_prog < PROGRESS_SEC)
        return;
    j->prog_fed = j->n_fed;
    j->t_prog = t;
    j->sink.progress(j->sink.ctx, j->n_fed, j->n_toks);
}

/* A token that renders as nothing (a control token) but is the call opener
 * of the model's family (mistral's [TOOL_CALLS]): its text, for the tool
 * parser. 0 for any other. */
static int opener_piece(gguf_backend *b, int32_t tok, char *piece, size_t cap)
{
    const char *op = gpe_toolparse_opener(b->info.chat_format);
    int n = gpe_token_to_piece(b->model, tok, piece, cap, true);
    return op && *op && n > 0 && (size_t)n == strlen(op) && memcmp(piece, op, (size_t)n) == 0
               ? n : 0;
}

/* Sample from logits, stream the piece; returns a finish reason when the job
 * is done, else NULL. */
static const char *job_step(gguf_engine *e, gjob *j, const float *logits)
{
    gguf_backend *b = e->b;
    if (b->test_gate)
        test_gate_wait(b, j);
    int n_vocab = gpe_model_n_vocab(b->model);
    const float *raw = logits, *masked = NULL;
    if (j->gram) {
        /* tokens left: the budget, or the context if it ends first */
        long left = j->max_tokens - j->n_gen;
        long lc = (long)b->n_ctx - gpe_seq_len(e->ctx, j->slot - e->slot0);
        left = lc < left ? lc : left;
        logits = masked = gpe_grammar_mask(j->gram, logits, n_vocab, left > 1 ? (int)left : 1);
    }
    /* schema + tools: the schema's tokens or the call opener's (gguf_tools.h) */
    bool lazy = j->lazy_buf && (j->tools.lazy || j->tools.opener_at >= 0);
    if (lazy) {
        gguf_tools_lazy_mask(&j->tools, raw, masked, b->op_ids, b->op_at, b->n_op, j->lazy_buf,
                             n_vocab);
        logits = j->lazy_buf;
    }
    int32_t tok = gpe_sampler_sample(j->smp, logits, n_vocab);
    gpe_sampler_accept(j->smp, tok);
    gpe_grammar *install;
    if (lazy && gguf_tools_lazy_accept(&j->tools, b->model, tok,
                                       masked && masked[tok] != -INFINITY, &install)) {
        gpe_grammar_free(j->gram);   /* the opener is not the schema's */
        j->gram = install;           /* NULL until the opener is whole, then the call's */
    } else if (j->gram) {
        (void)gpe_grammar_accept(j->gram, tok);   /* masked: always allowed */
    }
    if (j->t_first == 0) {
        j->t_first = now_s();
        /* The prompt's size is known once it is prefilled: the server has it
         * before the first token (an Anthropic message_start carries it, and
         * a reply the server ends early still reports it). */
        json_t *m = j->sink.metrics ? json_pack("{s:i}", "prompt_tokens", j->n_prompt) : NULL;
        if (m)
            j->sink.metrics(j->sink.ctx, m);
        json_decref(m);
    }
    if (gpe_token_is_eog(b->model, tok))   /* under a schema: only where the value may end,
                                              unless the schema could not go on at all */
        return j->gram && !gpe_grammar_complete(j->gram) ? "length" : "stop";
    j->n_gen++;
    if (!unsent_push(j, tok))
        j->n_unsent = 0;   /* out of memory: the server then lacks ids (text failover) */
    char piece[256];
    int n = gpe_token_to_piece(b->model, tok, piece, sizeof piece, false);
    if (n == 0 && j->tools.tp)
        n = opener_piece(b, tok, piece, sizeof piece);
    const char *emit;
    size_t elen;
    bool stopped = gpe_stop_feed(j->stop, piece, n > 0 ? (size_t)n : 0, &emit, &elen);
    out_text(j, emit, elen);
    if (stopped) {
        int w = gpe_stop_which(j->stop);
        if (w >= 0 && (size_t)w < j->n_stops && j->sink.stop_sequence)
            j->sink.stop_sequence(j->sink.ctx, j->stops[w]);
        return "stop";
    }
    if (j->gram && gpe_grammar_done(j->gram))
        return "stop";   /* the value is closed (job_end flushes what is held) */
    if (j->n_gen >= j->max_tokens)
        return "length";
    if (gpe_seq_len(e->ctx, j->slot - e->slot0) >= b->n_ctx)
        return "length";
    j->last = tok;
    j->state = J_GEN;
    return NULL;
}

/* Record a token going into slot s's sequence (the cache mirrors it). */
static void cache_push(gguf_backend *b, int s, int32_t tok)
{
    slot_cache *c = &b->cache[s];
    if (c->n < b->n_ctx)
        c->toks[c->n++] = tok;
}

/* Under mu: whether engine e has something to do now (or must stop). */
static bool engine_has_work(gguf_backend *b, gguf_engine *e, double t)
{
    if (b->stopping)
        return true;
    if (!e->ready)
        return t >= e->retry_at;
    for (int s = e->slot0; s < e->slot0 + e->n_slots; s++)
        if (b->slots[s])
            return true;
    /* `preparing` first: while it is set, another thread writes the
     * job's other flags outside mu */
    for (gjob *j = b->pending; j; j = j->next)
        if (!j->preparing && (j->finished || !j->prepared))
            return true;
    /* prepared jobs wait for a free slot: one of ours if we have one */
    if (b->pending)
        for (int s = e->slot0; s < e->slot0 + e->n_slots; s++)
            if (!b->slots[s])
                return true;
    return false;
}

static void cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, double until_mono)
{
    /* the condition variable's clock is CLOCK_REALTIME: convert */
    double wait = until_mono - now_s();
    if (wait <= 0)
        return;
    if (wait > 3600)
        wait = 3600;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + wait;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    pthread_cond_timedwait(cv, mu, &ts);
}

/* Step 1 of the loop: wait for work, tokenize the pending jobs that free
 * slots can take (outside mu: they stay in `pending`, where job_cancel
 * finds them; `preparing` keeps two engines from taking the same one),
 * then reserve a slot for each in FIFO order, on whichever engine suits it
 * best (choose_slot): the slot's engine admits it. idle: the previous
 * round did nothing (wait a moment rather than spin). Fills mine[] (our
 * slots' jobs as of now) and cancelled[]; returns whether the backend is
 * stopping. */
static bool admit_step(gguf_engine *e, bool idle, gjob **mine, bool *cancelled)
{
    gguf_backend *b = e->b;
    pthread_mutex_lock(&b->mu);
    if (idle && !b->stopping)
        cond_wait_until(&b->cv, &b->mu, now_s() + 0.05);
    while (!engine_has_work(b, e, now_s())) {
        if (!e->ready)
            cond_wait_until(&b->cv, &b->mu, e->retry_at);
        else
            pthread_cond_wait(&b->cv, &b->mu);
    }
    gjob *prep[64];
    int n_prep = 0, n_free = 0;
    for (int g = 0; g < b->n_eng; g++)
        for (int s = b->eng[g].slot0; b->eng[g].ready && s < b->eng[g].slot0 + b->eng[g].n_slots;
             s++)
            n_free += b->slots[s] == NULL;
    for (gjob *j = b->pending; j && !b->stopping && n_prep < n_free && n_prep < 64; j = j->next)
        if (!j->prepared && !j->preparing) {
            j->preparing = true;
            prep[n_prep++] = j;
        }
    pthread_mutex_unlock(&b->mu);

    for (int i = 0; i < n_prep; i++)
        job_prepare(b, prep[i]);

    pthread_mutex_lock(&b->mu);
    for (int i = 0; i < n_prep; i++)
        prep[i]->preparing = false;
    bool stopping = b->stopping, reserved = false;
    gjob *done = NULL;
    int n_reserved = 0;
    for (gjob **pp = &b->pending; *pp;) {
        gjob *j = *pp;
        if (!j->preparing && j->finished) {   /* ended while pending: unlink, free below */
            *pp = j->next;
            b->n_pending--;
            j->next = done;
            done = j;
            continue;
        }
        if (stopping || j->preparing || !j->prepared || n_reserved == 64)
            break;   /* FIFO: the jobs behind it wait too */
        int s = choose_slot(b, j);
        if (s < 0)
            break;
        *pp = j->next;
        b->n_pending--;
        j->slot = s;
        j->state = J_PENDING;
        b->slots[s] = j;   /* reserved: its engine admits it (job_cancel sees it) */
        n_reserved++;
        reserved |= s < e->slot0 || s >= e->slot0 + e->n_slots;
    }
    for (int s = 0; s < e->n_slots; s++) {
        mine[s] = b->slots[e->slot0 + s];
        cancelled[s] = mine[s] && (mine[s]->cancel || stopping);
    }
    if (reserved || n_prep > 0)
        pthread_cond_broadcast(&b->cv);   /* another engine has a job, or jobs were prepared */
    pthread_mutex_unlock(&b->mu);
    while (done) {
        gjob *next = done->next;
        job_free(done);
        done = next;
    }
    return stopping;
}

/* Free slot s (global index) of engine e: the job leaves it; the
 * sequence stays for the prefix cache unless keep is false. */
static void slot_release(gguf_engine *e, int s, bool keep)
{
    gguf_backend *b = e->b;
    if (!keep && e->ctx)
        gpe_seq_clear(e->ctx, s - e->slot0);
    pthread_mutex_lock(&b->mu);
    b->slots[s] = NULL;
    if (!keep) {
        b->cache[s].desc.kind[0] = '\0';
        b->cache[s].n = 0;
        b->cache[s].held = 0;
    }
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* Record what e's new context holds on each device (poll facts). */
static void engine_note_held(gguf_engine *e)
{
    gpe_vram_need d[GPE_MAX_DEVICES];
    int n = e->ctx && e->n_devices > 0 ? gpe_ctx_devices(e->ctx, d) : 0;
    pthread_mutex_lock(&e->b->mu);
    for (int i = 0; i < GPE_MAX_DEVICES; i++)
        e->held[i] = i < n ? d[i].total : 0;
    pthread_mutex_unlock(&e->b->mu);
}

/* Which devices an engine runs on, for messages: "CUDA device 0", "CUDA
 * devices 0,1", "the CPU engine". */
static void engine_where(const gguf_engine *e, char *buf, size_t len)
{
    if (e->n_devices == 0) {
        snprintf(buf, len, "the CPU engine");
        return;
    }
    size_t u = (size_t)snprintf(buf, len, "CUDA device%s ", e->n_devices > 1 ? "s" : "");
    for (int i = 0; i < e->n_devices && u < len; i++)
        u += (size_t)snprintf(buf + u, len - u, "%s%d", i ? "," : "", e->devices[i]);
}

#define BACKOFF_FIRST_S 1.0
#define BACKOFF_MAX_S 60.0

/* The device failed during a decode (a CUDA error, a lost device, out of
 * VRAM because another process took it): fail the attempts running on
 * this engine with a clear error (the server fails them over), put back
 * the jobs only reserved here, stop offering its slots, free its context
 * and schedule a re-init with exponential backoff. The other engines go
 * on. */
static void engine_fault(gguf_engine *e, gjob **mine, gpe_status st, const char *err)
{
    gguf_backend *b = e->b;
    const char *code = st == GPE_ERR_INSUFFICIENT_VRAM ? "INSUFFICIENT_VRAM" : "DEVICE_ERROR";
    char where[96], msg[640];
    engine_where(e, where, sizeof where);
    e->backoff_s = e->backoff_s > 0 ? e->backoff_s * 2 : BACKOFF_FIRST_S;
    if (e->backoff_s > BACKOFF_MAX_S)
        e->backoff_s = BACKOFF_MAX_S;
    snprintf(msg, sizeof msg, "%s failed: %.400s (%s); the agent takes it out of service and "
             "re-initialises it in %.0f s", where, err, gpe_status_name(st), e->backoff_s);
    gp_log_error("engine_fault", "%s", msg);
    for (int k = 0; k < e->n_slots; k++) {
        gjob *j = mine[k];
        int s = e->slot0 + k;
        if (!j)
            continue;
        if (j->state == J_PENDING) {
            /* reserved, never admitted: another engine may take it */
            pthread_mutex_lock(&b->mu);
            b->slots[s] = NULL;
            j->slot = -1;
            j->next = b->pending;
            b->pending = j;
            b->n_pending++;
            pthread_mutex_unlock(&b->mu);
        } else {
            job_error(j, code, msg);
            job_free(j);
            pthread_mutex_lock(&b->mu);
            b->slots[s] = NULL;
            pthread_mutex_unlock(&b->mu);
        }
        mine[k] = NULL;
    }
    gpe_ctx_free(e->ctx);
    e->ctx = NULL;
    pthread_mutex_lock(&b->mu);
    for (int s = e->slot0; s < e->slot0 + e->n_slots; s++) {
        gjob *j = b->slots[s];
        if (j && j->state == J_PENDING) {   /* reserved since our last look */
            b->slots[s] = NULL;
            j->slot = -1;
            j->next = b->pending;
            b->pending = j;
            b->n_pending++;
        }
        b->cache[s].n = 0;
        b->cache[s].held = 0;
        b->cache[s].desc.kind[0] = '\0';
    }
    e->ready = false;
    e->faults++;
    snprintf(e->error, sizeof e->error, "%s: %.280s", code, err);
    e->retry_at = now_s() + e->backoff_s;
    e->kv_used = 0;
    memset(e->held, 0, sizeof e->held);
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* Out of service and its backoff is over: create the context again. */
static void engine_reinit(gguf_engine *e)
{
    gguf_backend *b = e->b;
    char err[384], where[96];
    engine_where(e, where, sizeof where);
    gpe_ctx *c = NULL;
    gpe_status st = gpe_ctx_init(e->model, &e->cp, &c, err, sizeof err);
    if (st != GPE_OK) {
        e->backoff_s = e->backoff_s * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : e->backoff_s * 2;
        gp_log_warn("engine_reinit_failed", "%s: %s (%s); next try in %.0f s", where, err,
                    gpe_status_name(st), e->backoff_s);
        pthread_mutex_lock(&b->mu);
        snprintf(e->error, sizeof e->error, "re-init: %.300s", err);
        e->retry_at = now_s() + e->backoff_s;
        pthread_mutex_unlock(&b->mu);
        return;
    }
    e->ctx = c;
    engine_note_held(e);
    pthread_mutex_lock(&b->mu);
    e->ready = true;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    gp_log_info("engine_recovered", "%s is back in service (%d slot(s))", where, e->n_slots);
}

/* Step 2: one batch of e's slots: the next token of every generating
 * job, then prompt chunks of prefilling ones up to n_batch tokens.
 * entry[k]: the batch index whose logits slot slot0+k samples from. */
static void build_batch(gguf_engine *e, gjob **mine, gpe_batch *batch, int *entry)
{
    gguf_backend *b = e->b;
    gpe_batch_clear(batch);
    int budget = b->n_batch;
    for (int k = 0; k < e->n_slots; k++) {
        entry[k] = -1;
        gjob *j = mine[k];
        if (j && j->state == J_GEN) {
            entry[k] = gpe_batch_add(batch, j->last, gpe_seq_len(e->ctx, k), k, true);
            cache_push(b, e->slot0 + k, j->last);
        }
    }
    for (int k = 0; k < e->n_slots && budget > 0; k++) {
        gjob *j = mine[k];
        if (!j || j->state != J_PREFILL)
            continue;
        int take = j->n_toks - j->n_fed;
        if (take > budget)
            take = budget;
        for (int i = 0; i < take; i++) {
            bool last = j->n_fed + i == j->n_toks - 1;
            int x = gpe_batch_add(batch, j->toks[j->n_fed + i], j->n_fed + i, k, last);
            cache_push(b, e->slot0 + k, j->toks[j->n_fed + i]);
            if (last)
                entry[k] = x;
        }
        j->n_fed += take;
        budget -= take;
    }
}

/* Step 3: sample for every slot that got logits; finish jobs. A job's
 * sequence stays in its slot for the next prompt (prefix cache), except
 * after an error or with the cache off. */
static void after_decode(gguf_engine *e, gjob **mine, const int *entry, gpe_status st,
                         const char *err)
{
    gguf_backend *b = e->b;
    long used = 0;
    for (int k = 0; k < e->n_slots; k++) {
        gjob *j = mine[k];
        int s = e->slot0 + k;
        slot_cache *c = &b->cache[s];
        if (!j || j->state == J_PENDING)
            continue;
        const char *reason = NULL;
        if (st != GPE_OK) {
            job_error(j, st == GPE_ERR_CTX_FULL ? "CONTEXT_OVERFLOW" : "INTERNAL_ERROR", err);
            reason = "";
        } else if (entry[k] >= 0) {
            if (j->state == J_PREFILL && j->chain.units > 0) {
                /* The whole prompt is in the sequence now: advertise it. */
                pthread_mutex_lock(&b->mu);
                gp_prefix_desc_of_chain(&j->chain, &c->desc);
                pthread_mutex_unlock(&b->mu);
            }
            reason = job_step(e, j, gpe_get_logits(e->ctx, entry[k]));
            if (reason)
                job_end(j, reason);
        } else {
            job_progress(j);
        }
        if (reason) {
            mine[k] = NULL;
            slot_release(e, s, st == GPE_OK && b->prefix_cache);
            job_free(j);
        } else {
            used += gpe_seq_len(e->ctx, k);
        }
    }
    pthread_mutex_lock(&b->mu);
    e->kv_used = used;
    for (int k = 0; k < e->n_slots; k++) {
        /* the record is exactly what the sequence holds (a failed
         * decode commits nothing) */
        int len = gpe_seq_len(e->ctx, k);
        slot_cache *c = &b->cache[e->slot0 + k];
        if (c->n > len)
            c->n = len;
        c->held = c->n;
    }
    pthread_mutex_unlock(&b->mu);
}

/* Stopping: pending jobs never started still get their terminal event
 * (those that ended while pending already had theirs). */
static void fail_pending(gguf_backend *b)
{
    pthread_mutex_lock(&b->mu);
    gjob *p = b->pending, *keep = NULL;
    b->pending = NULL;
    b->n_pending = 0;
    /* one being tokenized by another engine stays until it is done */
    for (gjob *n; p; p = n) {
        n = p->next;
        if (p->preparing) {
            p->next = keep;
            keep = p;
            b->n_pending++;
            continue;
        }
        pthread_mutex_unlock(&b->mu);
        if (!p->finished)
            job_error(p, "CANCELLED", "agent stopping");
        job_free(p);
        pthread_mutex_lock(&b->mu);
    }
    b->pending = keep;
    pthread_mutex_unlock(&b->mu);
}

static void *decode_main(void *arg)
{
    gguf_engine *e = arg;
    gguf_backend *b = e->b;
    gpe_batch *batch = gpe_batch_init(b->n_batch + e->n_slots);
    int *entry = malloc((size_t)e->n_slots * sizeof *entry);   /* slot -> batch index */
    bool *cancelled = malloc((size_t)e->n_slots * sizeof *cancelled);
    gjob **mine = malloc((size_t)e->n_slots * sizeof *mine);
    char err[384];
    bool idle = false;

    while (batch && entry && cancelled && mine) {
        /* 1. Reserve slots for pending jobs; collect cancels. */
        bool stopping = admit_step(e, idle, mine, cancelled);
        idle = true;
        for (int k = 0; k < e->n_slots; k++) {
            gjob *j = mine[k];
            if (!j)
                continue;
            if (cancelled[k]) {
                job_error(j, "CANCELLED", stopping ? "agent stopping" : "cancelled");
                job_free(j);
                mine[k] = NULL;
                slot_release(e, e->slot0 + k, e->ctx != NULL && b->prefix_cache);
                idle = false;
            } else if (j->state == J_PENDING && e->ctx) {
                if (!job_admit(e, j, e->slot0 + k)) {
                    job_free(j);
                    mine[k] = NULL;
                    slot_release(e, e->slot0 + k, false);
                }
                idle = false;
            }
        }
        if (stopping) {
            fail_pending(b);
            break;
        }
        if (!e->ctx) {
            engine_reinit(e);
            idle = false;
            continue;
        }

        /* 2. One batch, 3. decode and sample. */
        build_batch(e, mine, batch, entry);
        if (gpe_batch_size(batch) == 0)
            continue;
        idle = false;
        gpe_status st = gpe_decode(e->ctx, batch, err, sizeof err);
        if (st == GPE_ERR_BACKEND || st == GPE_ERR_INSUFFICIENT_VRAM) {
            engine_fault(e, mine, st, err);
            continue;
        }
        if (st == GPE_OK)
            e->backoff_s = 0;   /* it works again: the next fault starts the backoff over */
        after_decode(e, mine, entry, st, err);
    }
    free(mine);
    free(cancelled);
    free(entry);
    gpe_batch_free(batch);
    return NULL;
}

/* ------------------------------------------------------------------ ops */

static void gguf_destroy(agent_backend *base)
{
    gguf_backend *b = (gguf_backend *)base;
    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    b->stopping = true;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    for (int e = 0; e < b->n_eng; e++)
        if (b->eng[e].thread_started)
            pthread_join(b->eng[e].thread, NULL);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    gpe_ctx_free(b->emb_ctx[0]);
    gpe_ctx_free(b->emb_ctx[1]);
    pthread_mutex_destroy(&b->emb_mu);
    for (int s = 0; b->cache && s < b->n_slots; s++)
        free(b->cache[s].toks);
    free(b->cache);
    free(b->slots);
    free(b->alias);
    free(b->test_gate);
    gpe_grammar_vocab_free(b->gvocab);
    free(b->op_ids);
    free(b->op_at);
    for (int e = 0; e < b->n_eng; e++) {
        gpe_ctx_free(b->eng[e].ctx);
        gpe_model_free(b->eng[e].model);
    }
    free(b->eng);
    free(b);
}

static json_t *gguf_models(agent_backend *base)
{
    gguf_backend *b = (gguf_backend *)base;
    if (b->refused)
        return json_array();   /* never register a model it cannot run */
    uint64_t vram = 0;
    pthread_mutex_lock(&b->mu);
    for (int e = 0; e < b->n_eng; e++)
        for (int d = 0; d < b->eng[e].n_devices; d++)
            vram += b->eng[e].held[d];
    pthread_mutex_unlock(&b->mu);
    /* supports_tools: the model's chat template has a tools format
     * (gpe_chat_supports_tools); the server sends tools only then. */
    json_t *m = json_pack(
        "[{s:s, s:[], s:s, s:i, s:I, s:o, s:s, s:b, s:I, s:s, s:b}]", "id", b->alias, "aliases",
        "quantization", b->info.quant, "context_length", b->n_ctx, "bytes",
        (json_int_t)b->info.file_bytes, "vram_bytes",
        b->kind == GPE_BACKEND_CUDA ? json_integer((json_int_t)vram) : json_null(),
        "architecture", b->info.arch, "loaded", 1, "parameters", (json_int_t)b->info.n_params,
        "chat_format", b->info.chat_format, "supports_tools",
        (int)gpe_chat_supports_tools(b->model));
    /* Embeddings (job_embed) on the CPU and CUDA backends alike: on a GPU
     * their contexts go on the first engine's device(s). */
    if (m)
        json_object_set_new(json_array_get(m, 0), "supports_embeddings", json_true());
    /* An encoder (bert, nomic-bert) computes embeddings only: the server
     * answers generation requests for it with a 400 (docs/protocol.md). */
    if (m && gpe_model_embeddings_only(b->model))
        json_object_set_new(json_array_get(m, 0), "embeddings_only", json_true());
    /* digest: agents with the same file continue each other's jobs from
     * token ids (docs/protocol.md). */
    if (m && b->digest[0])
        json_object_set_new(json_array_get(m, 0), "digest", json_string(b->digest));
    return m;
}
/* The prompt-prefix cache's poll facts (docs/protocol.md "Prompt-prefix
 * cache"): counters since start, and per slot how many positions it holds
 * and which prompt units they are (gp_prefix.h), so that the server can
 * route a conversation to the slot that holds it. New reference. */
static json_t *prefix_facts(gguf_backend *b)
{
    json_t *slots = json_array();
    pthread_mutex_lock(&b->mu);
    double t = now_s();
    for (int s = 0; slots && s < b->n_slots; s++) {
        const slot_cache *c = &b->cache[s];
        json_t *o = json_pack("{s:i,s:b,s:i,s:I}", "slot", s, "busy", b->slots[s] != NULL,
                              "tokens", c->held, "idle_ms",
                              (json_int_t)(c->used_at > 0 ? (t - c->used_at) * 1e3 : -1));
        if (o && c->desc.kind[0])
            json_object_set_new(o, "prefix", gp_prefix_desc_json(&c->desc));
        json_array_append_new(slots, o);
    }
    json_t *pc = json_pack("{s:b,s:I,s:I,s:I,s:I,s:o*}", "enabled", b->prefix_cache, "lookups",
                           (json_int_t)b->pc_lookups, "hits", (json_int_t)b->pc_hits,
                           "tokens_saved", (json_int_t)b->pc_saved, "tokens_computed",
                           (json_int_t)b->pc_computed, "slots", slots);
    pthread_mutex_unlock(&b->mu);
    return pc;
}

/* "0000:3B:00.0" and "0000:3b:00.0" name the same device. */
static bool same_pci(const char *x, const char *y)
{
    unsigned a[4], c[4];
    return x && y && sscanf(x, "%x:%x:%x.%x", &a[0], &a[1], &a[2], &a[3]) == 4 &&
           sscanf(y, "%x:%x:%x.%x", &c[0], &c[1], &c[2], &c[3]) == 4 && a[0] == c[0] &&
           a[1] == c[1] && a[2] == c[2] && a[3] == c[3];
}

/* Under mu: what the engines know of their GPUs, merged into the poll's
 * "gpus" (NVML's list, found by PCI bus id; a GPU NVML does not list is
 * added from the engine's own figures): the CUDA device number, the bytes
 * the model holds on it, and whether it is in service ("ok") or out of
 * service after a fault ("fault"). */
static void merge_gpus(gguf_backend *b, json_t *body)
{
    json_t *gpus = json_object_get(body, "gpus");
    if (!json_is_array(gpus)) {
        gpus = json_array();
        json_object_set_new(body, "gpus", gpus);
    }
    for (int e = 0; e < b->n_eng; e++) {
        const gguf_engine *g = &b->eng[e];
        for (int d = 0; d < g->n_devices; d++) {
            json_t *o = NULL, *x;
            size_t i;
            json_array_foreach(gpus, i, x) {
                if (same_pci(json_string_value(json_object_get(x, "pci_bus_id")), g->pci[d]))
                    o = x;
            }
            if (!o) {
                o = json_pack("{s:s,s:i,s:s,s:I,s:s}", "vendor", "nvidia", "index",
                              g->devices[d], "name", g->gpu_name[d], "vram_total",
                              (json_int_t)g->gpu_total[d], "pci_bus_id", g->pci[d]);
                if (!o || json_array_append_new(gpus, o) < 0)
                    continue;
            }
            json_object_set_new(o, "cuda_device", json_integer(g->devices[d]));
            json_object_set_new(o, "vram_model", json_integer((json_int_t)g->held[d]));
            json_object_set_new(o, "state", json_string(g->ready ? "ok" : "fault"));
        }
    }
}

/* Under mu: one entry per engine (docs/protocol.md "Backend and GPUs"). */
static json_t *engines_facts(gguf_backend *b, long long *faults)
{
    json_t *arr = json_array();
    double t = now_s();
    *faults = 0;
    for (int e = 0; arr && e < b->n_eng; e++) {
        const gguf_engine *g = &b->eng[e];
        json_t *devs = json_array();
        for (int d = 0; devs && d < g->n_devices; d++)
            json_array_append_new(devs, json_integer(g->devices[d]));
        json_t *o = json_pack("{s:s,s:o*,s:i,s:i,s:s,s:I}", "backend",
                              b->kind == GPE_BACKEND_CUDA ? "cuda" : "cpu", "devices", devs,
                              "first_slot", g->slot0, "slots", g->n_slots, "state",
                              g->ready ? "ready" : "fault", "faults", (json_int_t)g->faults);
        if (o && g->error[0])
            json_object_set_new(o, "last_error", json_string(g->error));
        if (o && !g->ready)
            json_object_set_new(o, "retry_in_ms", json_integer((json_int_t)(
                                    g->retry_at > t ? (g->retry_at - t) * 1e3 : 0)));
        json_array_append_new(arr, o);
        *faults += g->faults;
    }
    return arr;
}

static void gguf_poll_facts(agent_backend *base, json_t *body)
{
    gguf_backend *b = (gguf_backend *)base;
    json_object_set_new(body, "backend",
                        json_string(b->kind == GPE_BACKEND_CUDA ? "cuda" : "cpu"));
    if (b->refused) {
        json_object_set_new(body, "error", json_pack("{s:s,s:s}", "code", "MODEL_DOES_NOT_FIT",
                                                     "message", b->refusal));
        json_object_set_new(body, "queue_depth", json_integer(0));
        return;
    }
    long long faults = 0;
    pthread_mutex_lock(&b->mu);
    long used = 0;
    for (int e = 0; e < b->n_eng; e++)
        used += b->eng[e].kv_used;
    double util = (double)used / ((double)b->n_ctx * (double)b->n_slots);
    int depth = b->n_pending;
    json_t *eng = engines_facts(b, &faults);
    if (b->kind == GPE_BACKEND_CUDA)
        merge_gpus(b, body);
    pthread_mutex_unlock(&b->mu);
    json_object_set_new(body, "kv_cache_utilization", json_real(util > 1 ? 1 : util));
    json_object_set_new(body, "queue_depth", json_integer(depth));
    json_object_set_new(body, "backend_faults", json_integer(faults));
    if (eng)
        json_object_set_new(body, "engines", eng);
    json_t *pc = prefix_facts(b);
    if (pc)
        json_object_set_new(body, "prefix_cache", pc);
}

static void gguf_slots(agent_backend *base, int *total, int *usable)
{
    gguf_backend *b = (gguf_backend *)base;
    if (b->refused) {
        *total = 1;
        *usable = 0;
        return;
    }
    int n = 0;
    pthread_mutex_lock(&b->mu);
    for (int e = 0; e < b->n_eng; e++)
        n += b->eng[e].ready ? b->eng[e].n_slots : 0;
    pthread_mutex_unlock(&b->mu);
    *total = b->n_slots;
    *usable = n;
}

static int gguf_job_start(agent_backend *base, json_t *job, const agent_job_sink *sink, char *err,
                          size_t errlen)
{
    gguf_backend *b = (gguf_backend *)base;
    if (b->refused) {
        snprintf(err, errlen, "the model is not loaded: %s", b->refusal);
        return -1;
    }
    gjob *j = job_parse(b, job, err, errlen);
    if (!j)
        return -1;
    j->sink = *sink;
    pthread_mutex_lock(&b->mu);
    gjob **tail = &b->pending;
    while (*tail)
        tail = &(*tail)->next;
    *tail = j;
    b->n_pending++;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return 0;
}

static void gguf_job_cancel(agent_backend *base, const char *job_id)
{
    gguf_backend *b = (gguf_backend *)base;
    if (b->refused)
        return;
    pthread_mutex_lock(&b->mu);
    for (gjob **pp = &b->pending; *pp; pp = &(*pp)->next)
        if (strcmp((*pp)->job_id, job_id) == 0) {
            (*pp)->cancel = true;
            /* move it into no slot: the decode thread reports it when admitted */
            break;
        }
    for (int s = 0; s < b->n_slots; s++)
        if (b->slots[s] && strcmp(b->slots[s]->job_id, job_id) == 0)
            b->slots[s]->cancel = true;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}


/* The model file's digest, before the model is registered (the first
 * poll reports it). Without one the agent still works: failovers of its
 * jobs continue from text. */
static void model_digest(gguf_backend *b, const agent_options *o)
{
    char e[512];
    bool cached = false;
    double t0 = now_s();
    if (agent_model_digest(o->model, o->state_dir, b->digest, &cached, e, sizeof e) < 0) {
        b->digest[0] = '\0';
        gp_log_warn("model_digest_failed", "%s; failovers continue from text", e);
        return;
    }
    gp_log_info("model_digest", "%s sha256 %s (%s, %.2f s)", o->model, b->digest,
                cached ? "cached" : "hashed", now_s() - t0);
}


static const agent_backend_ops gguf_ops = {
    .name = "gguf",
    .destroy = gguf_destroy,
    .models = gguf_models,
    .poll_facts = gguf_poll_facts,
    .job_start = gguf_job_start,
    .job_cancel = gguf_job_cancel,
    .slots = gguf_slots,
    .structured_output = true,
};

/* Create the engines of the plan (their contexts: on CUDA this uploads
 * the weights and allocates the KV cache, after the engine's own VRAM
 * preflight). The models move from the plan to the engines. Returns
 * GPE_OK, or the failing status with err set (engines made so far stay
 * for gguf_destroy or engines_drop). */
static gpe_status engines_start(gguf_backend *b, const agent_options *o, gguf_plan *plan,
                                char *err, size_t errlen)
{
    b->eng = calloc((size_t)plan->n_engines, sizeof *b->eng);
    if (!b->eng) {
        snprintf(err, errlen, "out of memory");
        return GPE_ERR_NOMEM;
    }
    b->n_eng = plan->n_engines;
    b->kind = plan->backend;
    int slot0 = 0;
    for (int i = 0; i < b->n_eng; i++) {
        gguf_engine *e = &b->eng[i];
        const gguf_plan_engine *pe = &plan->engines[i];
        e->b = b;
        e->id = i;
        e->model = pe->model;
        plan->engines[i].model = NULL;
        e->n_devices = pe->n_devices;
        memcpy(e->devices, pe->devices, sizeof e->devices);
        e->slot0 = slot0;
        e->n_slots = pe->n_seq;
        slot0 += pe->n_seq;
        e->cp = gguf_plan_ctx_params(o, plan, i, b->n_batch);
        for (int d = 0; d < e->n_devices; d++) {
            gpe_gpu_info gi;
            char ge[128];
            if (gpe_gpu_info_get(e->devices[d], &gi, ge, sizeof ge) == GPE_OK) {
                snprintf(e->pci[d], sizeof e->pci[d], "%s", gi.pci_bus_id);
                snprintf(e->gpu_name[d], sizeof e->gpu_name[d], "%s", gi.name);
                e->gpu_total[d] = gi.total_bytes;
            }
        }
        char e2[384];
        gpe_status st = gpe_ctx_init(e->model, &e->cp, &e->ctx, e2, sizeof e2);
        if (st != GPE_OK) {
            char where[96];
            engine_where(e, where, sizeof where);
            snprintf(err, errlen, "%s: %s (%s)", where, e2, gpe_status_name(st));
            return st;
        }
        e->ready = true;
        engine_note_held(e);
        char where[96];
        engine_where(e, where, sizeof where);
        gp_log_info("engine_ready", "engine %d on %s: slots %d..%d, %d positions each", i, where,
                    e->slot0, e->slot0 + e->n_slots - 1, gpe_ctx_n_ctx(e->ctx));
    }
    b->n_slots = slot0;
    b->model = b->eng[0].model;
    b->n_ctx = gpe_ctx_n_ctx(b->eng[0].ctx);
    /* Once per model, not per request: milliseconds on a 150k vocabulary. */
    gpe_status gs = gpe_grammar_vocab_init(b->model, &b->gvocab);
    if (gs != GPE_OK) {
        snprintf(err, errlen, "out of memory (grammar vocabulary)");
        return gs;
    }
    gpe_model_info mi;   /* (b->info is filled once the model is placed) */
    gpe_model_get_info(b->model, &mi);
    if (gpe_chat_supports_tools(b->model) &&
        gguf_tools_opener_tokens(b->model, mi.chat_format, &b->op_ids, &b->op_at,
                                 &b->n_op) < 0) {
        snprintf(err, errlen, "out of memory (tool-call opener tokens)");
        return GPE_ERR_NOMEM;
    }
    return GPE_OK;
}

/* Undo engines_start (before any thread runs). */
static void engines_drop(gguf_backend *b)
{
    gpe_grammar_vocab_free(b->gvocab);
    b->gvocab = NULL;
    free(b->op_ids);
    free(b->op_at);
    b->op_ids = NULL;
    b->op_at = NULL;
    for (int e = 0; e < b->n_eng; e++) {
        gpe_ctx_free(b->eng[e].ctx);
        gpe_model_free(b->eng[e].model);
    }
    free(b->eng);
    b->eng = NULL;
    b->n_eng = 0;
    b->model = NULL;
}

/* Choose where the model runs (gguf_plan.h) and start the engines there.
 * A CUDA context the engine refuses (its preflight: not enough VRAM) is
 * the CPU under --backend auto, a refusal under --backend cuda. Returns
 * 0 (b->refused may be set), or -1 with err: the agent exits. */
static int place_model(gguf_backend *b, const agent_options *o, char *err, size_t errlen)
{
    gguf_plan plan;
    if (gguf_plan_make(o, &plan, err, errlen) < 0)
        return -1;
    bool must_cuda = o->backend && strcmp(o->backend, "cuda") == 0;
    char e[512];
    gpe_status st = GPE_OK;
    if (!plan.refused) {
        gp_log_debug("backend_plan", "%s", plan.why);
        st = engines_start(b, o, &plan, e, sizeof e);
        if (st != GPE_OK && plan.backend == GPE_BACKEND_CUDA &&
            (st == GPE_ERR_INSUFFICIENT_VRAM || st == GPE_ERR_BACKEND)) {
            engines_drop(b);
            if (must_cuda) {
                plan.refused = true;
                snprintf(plan.why, sizeof plan.why, "%s", e);
            } else {
                char why[600];
                snprintf(why, sizeof why, "cpu: the CUDA context failed (%s)", e);
                if (gguf_plan_cpu(o, &plan, why, err, errlen) < 0)
                    return -1;
                st = engines_start(b, o, &plan, e, sizeof e);
            }
        }
    }
    gguf_plan_free(&plan);
    if (plan.refused) {
        b->refused = true;
        b->kind = GPE_BACKEND_CUDA;
        snprintf(b->refusal, sizeof b->refusal, "%s", plan.why);
        gp_log_error("model_refused", "%s: the agent serves no model and reports this to the "
                     "server", plan.why);
        fprintf(stderr, "gpupool-agent: model refused: %s\n", plan.why);
        return 0;
    }
    if (st != GPE_OK) {
        snprintf(err, errlen, "engine context: %s", e);
        return -1;
    }
    /* One line: where the model runs and why (the CPU line of a fallback). */
    gp_log_info("backend_choice", "%s", plan.why);
    return 0;
}

agent_backend *agent_backend_gguf_create(const agent_options *o, char *err, size_t errlen)
{
    gguf_backend *b = calloc(1, sizeof *b);
    if (!b) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    b->base.ops = &gguf_ops;
    pthread_mutex_init(&b->mu, NULL);
    pthread_mutex_init(&b->emb_mu, NULL);
    const char *gate = getenv("GPUPOOL_TEST_TOKEN_GATE");
    if (gate && *gate)
        b->test_gate = strdup(gate);
    pthread_cond_init(&b->cv, NULL);
    if (!o->model || !*o->model) {
        snprintf(err, errlen, "model: no .gguf file given");
        goto fail;
    }
    b->n_batch = 256;
    if (place_model(b, o, err, errlen) < 0)
        goto fail;
    if (b->refused)
        return &b->base;
    gpe_model_get_info(b->model, &b->info);
    model_digest(b, o);
    b->slots = calloc((size_t)b->n_slots, sizeof *b->slots);
    b->prefix_cache = o->prefix_cache;
    b->cache = calloc((size_t)b->n_slots, sizeof *b->cache);
    for (int s = 0; b->cache && s < b->n_slots; s++)
        if (!(b->cache[s].toks = malloc((size_t)b->n_ctx * sizeof *b->cache[s].toks))) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
    if (o->alias && *o->alias) {
        b->alias = strdup(o->alias);
    } else {
        /* file stem: "models/stories260K.gguf" -> "stories260K" */
        const char *base = strrchr(o->model, '/');
        base = base ? base + 1 : o->model;
        size_t n = strlen(base);
        if (n > 5 && strcmp(base + n - 5, ".gguf") == 0)
            n -= 5;
        b->alias = strndup(base, n);
    }
    if (!b->slots || !b->cache || !b->alias) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (int e = 0; e < b->n_eng; e++) {
        if (pthread_create(&b->eng[e].thread, NULL, decode_main, &b->eng[e]) != 0) {
            snprintf(err, errlen, "cannot start a decode thread");
            goto fail;
        }
        b->eng[e].thread_started = true;
    }
    return &b->base;
fail:
    gguf_destroy(&b->base);
    return NULL;
}
