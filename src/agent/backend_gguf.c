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
 *
 * The backend's files (what they share is in backend_gguf_priv.h):
 *   - backend_gguf.c (this file): the backend's operations, the model
 *     placed on its engines;
 *   - backend_gguf_job.c: the server's job JSON into a gjob;
 *   - backend_gguf_out.c: a job's output, and a job made ready for a slot;
 *   - backend_gguf_embed.c: embeddings jobs;
 *   - backend_gguf_engine.c: the decode threads.
 */
#include "agent/backend_gguf_priv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>

#include "agent/agent_facts.h"
#include "common/gp_log.h"

double gguf_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void gguf_job_free(gjob *j)
{
    if (!j)
        return;
    json_decref(j->emb_input);
    free(j->text);
    free(j->toks);
    free(j->cont_ids);
    free(j->cont_text);
    free(j->unsent);
    free(j->piece);
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
    for (int e = 0; e < b->n_eng; e++) {
        if (b->eng[e].thread_started)
            pthread_join(b->eng[e].thread, NULL);
        gguf_engine_scratch_free(&b->eng[e]);
    }
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
     * (gpe_chat_supports_tools); the server sends tools only then.
     * supports_embeddings: embeddings (gguf_job_embed) run on the CPU and
     * CUDA backends alike (on a GPU their contexts go on the first
     * engine's device(s)). embeddings_only: an encoder (bert, nomic-bert)
     * computes embeddings only, the server answers generation requests
     * for it with a 400 (docs/protocol.md). digest: agents with the same
     * file continue each other's jobs from token ids. One json_pack, so
     * that the facts are whole or NULL: a fact left out when memory ran
     * out would route wrongly (embeddings to a model that seems to have
     * none); NULL fails the heartbeat, which is tried again. The digest
     * is made first: json_pack's "s*" leaves out a string it could not
     * copy, and still succeeds. */
    json_t *digest = NULL;
    if (b->digest[0] && !(digest = json_string(b->digest)))
        return NULL;
    json_t *m = json_pack(
        "[{s:s, s:[], s:s, s:i, s:I, s:o, s:s, s:b, s:I, s:s, s:b, s:b, s:o*, s:o*}]", "id",
        b->alias, "aliases", "quantization", b->info.quant, "context_length", b->n_ctx, "bytes",
        (json_int_t)b->info.file_bytes, "vram_bytes",
        b->kind == GPE_BACKEND_CUDA ? json_integer((json_int_t)vram) : json_null(),
        "architecture", b->info.arch, "loaded", 1, "parameters", (json_int_t)b->info.n_params,
        "chat_format", b->info.chat_format, "supports_tools",
        (int)gpe_chat_supports_tools(b->model), "supports_embeddings", 1, "embeddings_only",
        gpe_model_embeddings_only(b->model) ? json_true() : NULL, "digest", digest);
    return m;
}
/* The prompt-prefix cache's poll facts (docs/protocol.md "Prompt-prefix
 * cache"): counters since start, and per slot how many positions it holds
 * and which prompt units they are (gp_prefix.h), so that the server can
 * route a conversation to the slot that holds it. New reference, whole or
 * NULL when memory ran out. */
static json_t *prefix_facts(gguf_backend *b)
{
    json_t *slots = json_array();
    pthread_mutex_lock(&b->mu);
    double t = gguf_now_s();
    for (int s = 0; slots && s < b->n_slots; s++) {
        const slot_cache *c = &b->cache[s];
        json_t *o = json_pack("{s:i,s:b,s:i,s:I,s:o*}", "slot", s, "busy", b->slots[s] != NULL,
                              "tokens", c->held, "idle_ms",
                              (json_int_t)(c->used_at > 0 ? (t - c->used_at) * 1e3 : -1),
                              "prefix", c->desc.kind[0] ? gp_prefix_desc_json(&c->desc) : NULL);
        if (o && c->desc.kind[0] && !json_object_get(o, "prefix")) { /* "o*" omitted it */
            json_decref(o);
            o = NULL;
        }
        if (json_array_append_new(slots, o) < 0) { /* NULL too */
            json_decref(slots);
            slots = NULL;
        }
    }
    json_t *pc = json_pack("{s:b,s:I,s:I,s:I,s:I,s:o}", "enabled", b->prefix_cache, "lookups",
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
 * service after a fault ("fault"). 0, or -1 when memory ran out. */
static int merge_gpus(gguf_backend *b, json_t *body)
{
    json_t *gpus = json_object_get(body, "gpus");
    if (!json_is_array(gpus)) {
        gpus = json_array();
        if (json_object_set_new(body, "gpus", gpus) < 0)
            return -1;
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
                if (json_array_append_new(gpus, o) < 0)
                    return -1;
            }
            if (json_object_set_new(o, "cuda_device", json_integer(g->devices[d])) < 0 ||
                json_object_set_new(o, "vram_model", json_integer((json_int_t)g->held[d])) < 0 ||
                json_object_set_new(o, "state", json_string(g->ready ? "ok" : "fault")) < 0)
                return -1;
        }
    }
    return 0;
}

/* Under mu: one entry per engine (docs/protocol.md "Backend and GPUs"),
 * whole or NULL (out of memory). */
static json_t *engines_facts(gguf_backend *b, long long *faults)
{
    json_t *arr = json_array();
    double t = gguf_now_s();
    *faults = 0;
    for (int e = 0; arr && e < b->n_eng; e++) {
        const gguf_engine *g = &b->eng[e];
        json_t *devs = json_array();
        for (int d = 0; devs && d < g->n_devices; d++)
            if (json_array_append_new(devs, json_integer(g->devices[d])) < 0) {
                json_decref(devs);
                devs = NULL;
            }
        /* Made first: json_pack's "s*" and "o*" leave out what they could
         * not make, and still succeed. */
        json_t *last = g->error[0] ? json_string(g->error) : NULL;
        json_t *retry = g->ready ? NULL
                                 : json_integer((json_int_t)(
                                       g->retry_at > t ? (g->retry_at - t) * 1e3 : 0));
        bool made = (!g->error[0] || last) && (g->ready || retry);
        if (!made) {
            json_decref(last);
            json_decref(retry);
            json_decref(devs);
            devs = NULL; /* the pack below fails on it */
        }
        json_t *o = json_pack(
            "{s:s,s:o,s:i,s:i,s:s,s:I,s:o*,s:o*}", "backend",
            b->kind == GPE_BACKEND_CUDA ? "cuda" : "cpu", "devices", devs, "first_slot",
            g->slot0, "slots", g->n_slots, "state", g->ready ? "ready" : "fault", "faults",
            (json_int_t)g->faults, "last_error", made ? last : NULL, "retry_in_ms",
            made ? retry : NULL);
        if (json_array_append_new(arr, o) < 0) {
            json_decref(arr);
            arr = NULL;
        }
        *faults += g->faults;
    }
    return arr;
}

static int gguf_poll_facts(agent_backend *base, json_t *body)
{
    gguf_backend *b = (gguf_backend *)base;
    if (json_object_set_new(body, "backend",
                            json_string(b->kind == GPE_BACKEND_CUDA ? "cuda" : "cpu")) < 0)
        return -1;
    if (b->refused) {
        if (json_object_set_new(body, "error",
                                json_pack("{s:s,s:s}", "code", "MODEL_DOES_NOT_FIT", "message",
                                          b->refusal)) < 0 ||
            json_object_set_new(body, "queue_depth", json_integer(0)) < 0)
            return -1;
        return 0;
    }
    long long faults = 0;
    pthread_mutex_lock(&b->mu);
    long used = 0;
    for (int e = 0; e < b->n_eng; e++)
        used += b->eng[e].kv_used;
    double util = (double)used / ((double)b->n_ctx * (double)b->n_slots);
    int depth = b->n_pending;
    json_t *eng = engines_facts(b, &faults);
    int rc = b->kind == GPE_BACKEND_CUDA ? merge_gpus(b, body) : 0;
    pthread_mutex_unlock(&b->mu);
    /* Each set takes its value, NULL included. */
    if (json_object_set_new(body, "kv_cache_utilization", json_real(util > 1 ? 1 : util)) < 0 ||
        json_object_set_new(body, "queue_depth", json_integer(depth)) < 0 ||
        json_object_set_new(body, "backend_faults", json_integer(faults)) < 0)
        rc = -1;
    if (json_object_set_new(body, "engines", eng) < 0)
        rc = -1;
    if (json_object_set_new(body, "prefix_cache", prefix_facts(b)) < 0)
        rc = -1;
    return rc;
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
    gjob *j = NULL;
    int rc = gguf_job_parse(b, job, &j, err, errlen);
    if (rc != 0)
        return rc; /* -1 or AGENT_JOB_START_NOMEM */
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
    double t0 = gguf_now_s();
    if (agent_model_digest(o->model, o->state_dir, b->digest, &cached, e, sizeof e) < 0) {
        b->digest[0] = '\0';
        gp_log_warn("model_digest_failed", "%s; failovers continue from text", e);
        return;
    }
    gp_log_info("model_digest", "%s sha256 %s (%s, %.2f s)", o->model, b->digest,
                cached ? "cached" : "hashed", gguf_now_s() - t0);
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
            gguf_engine_where(e, where, sizeof where);
            snprintf(err, errlen, "%s: %s (%s)", where, e2, gpe_status_name(st));
            return st;
        }
        e->ready = true;
        gguf_engine_note_held(e);
        char where[96];
        gguf_engine_where(e, where, sizeof where);
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
 * GPE_OK (b->refused may be set), or the failure's status with err
 * (GPE_ERR_NOMEM: memory ran out, a later try may load the model). */
static gpe_status place_model(gguf_backend *b, const agent_options *o, char *err,
                              size_t errlen)
{
    gguf_plan plan;
    gpe_status pst = gguf_plan_make(o, &plan, err, errlen);
    if (pst != GPE_OK)
        return pst;
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
                if ((pst = gguf_plan_cpu(o, &plan, why, err, errlen)) != GPE_OK)
                    return pst;
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
        return GPE_OK;
    }
    if (st != GPE_OK) {
        snprintf(err, errlen, "engine context: %s", e);
        return st;
    }
    /* One line: where the model runs and why (the CPU line of a fallback). */
    gp_log_info("backend_choice", "%s", plan.why);
    return GPE_OK;
}

agent_backend *agent_backend_gguf_create(const agent_options *o, char *err, size_t errlen)
{
    bool nomem;
    return agent_backend_gguf_create_status(o, &nomem, err, errlen);
}

agent_backend *agent_backend_gguf_create_status(const agent_options *o, bool *nomem, char *err,
                                                size_t errlen)
{
    *nomem = true; /* until the model is placed: every failure before is an allocation's */
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
        *nomem = false;
        snprintf(err, errlen, "model: no .gguf file given");
        goto fail;
    }
    b->n_batch = 256;
    gpe_status st = place_model(b, o, err, errlen);
    if (st != GPE_OK) {
        *nomem = st == GPE_ERR_NOMEM;
        goto fail;
    }
    if (b->refused) {
        *nomem = false;
        return &b->base;
    }
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
        if (gguf_engine_scratch(&b->eng[e]) < 0) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        int rc = pthread_create(&b->eng[e].thread, NULL, gguf_decode_main, &b->eng[e]);
        if (rc != 0) {
            /* EAGAIN: threads or memory short for now, not the model's
             * fault: a later try may load it (*nomem: exit 1, a
             * deployment retries) */
            *nomem = rc == EAGAIN;
            snprintf(err, errlen, "cannot start a decode thread: %s", strerror(rc));
            goto fail;
        }
        b->eng[e].thread_started = true;
    }
    *nomem = false;
    return &b->base;
fail:
    gguf_destroy(&b->base);
    return NULL;
}
