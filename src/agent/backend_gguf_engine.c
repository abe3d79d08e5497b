/*
 * backend_gguf_engine.c: an engine's decode thread: the slot a pending job
 * takes (prompt-prefix cache), admission, one batch per step over every
 * running job (continuous batching), sampling, and device faults with the
 * engine re-created.
 */
#include "agent/backend_gguf_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <math.h>

#include "common/gp_log.h"
#include "common/gp_util.h"

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
    if (!j->smp || !j->stop || !gguf_prime_stop(b, j)) {
        gguf_job_nomem(j, "setting up sampling");
        return false;
    }
    for (int i = 0; i < j->n_toks; i++)
        gpe_sampler_accept(j->smp, j->toks[i]);
    if (j->n_cont > 0)
        gpe_sampler_advance(j->smp, j->n_sampled);
    j->slot = slot;
    j->state = J_PREFILL;
    j->t_prog = gguf_now_s();
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

/* The ids of the next token event. Out of memory the job goes on: its
 * text is whole and exact, only a later failover of it continues from the
 * text instead of the ids (ids_lost: send_text); ending it would throw
 * away a generation that is fine, for a cheaper path it may never need. */
static void unsent_push(gjob *j, int32_t tok)
{
    if (j->ids_lost)
        return;
    if (j->n_unsent == j->cap_unsent) {
        int nc = j->cap_unsent ? 2 * j->cap_unsent : 8;
        int32_t *u = realloc(j->unsent, (size_t)nc * sizeof *u);
        if (!u) {
            j->ids_lost = true;
            return;
        }
        j->unsent = u;
        j->cap_unsent = nc;
    }
    j->unsent[j->n_unsent++] = tok;
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
    double t = gguf_now_s();
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
    if (tok < 0) {
        /* (its scratch could not be made, or a token its penalties count
         * could not be kept: for a sampler and logits it has no other
         * failure) */
        j->oom = true;
        return GGUF_REASON_NOMEM;
    }
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
        j->t_first = gguf_now_s();
        /* The prompt's size is known once it is prefilled: the server has it
         * before the first token (an Anthropic message_start carries it, and
         * a reply the server ends early still reports it). */
        if (j->sink.metrics) {
            json_t *m = json_pack("{s:i}", "prompt_tokens", j->n_prompt);
            if (!m) {
                j->oom = true;
                return GGUF_REASON_NOMEM;
            }
            j->sink.metrics(j->sink.ctx, m);
            json_decref(m);
        }
    }
    if (gpe_token_is_eog(b->model, tok))   /* under a schema: only where the value may end,
                                              unless the schema could not go on at all */
        return j->gram && !gpe_grammar_complete(j->gram) ? "length" : "stop";
    j->n_gen++;
    unsent_push(j, tok);
    int n = gguf_piece(b, j, tok, false);
    if (n < 0) {
        /* the token's text could not be rendered whole: the output would go
         * on without it */
        j->oom = true;
        return GGUF_REASON_NOMEM;
    }
    const char *piece = j->piece;
    char op[64];   /* openers are a few bytes (gguf_tools_opener_tokens) */
    if (n == 0 && j->tools.tp && (n = opener_piece(b, tok, op, sizeof op)) > 0)
        piece = op;
    const char *emit;
    size_t elen;
    gpe_status sst;
    bool stopped = gpe_stop_feed_status(j->stop, piece, (size_t)n, &emit, &elen, &sst);
    if (sst != GPE_OK) {
        /* the matcher could not hold the piece: the text would go on
         * without it (its id goes with no event either) */
        j->oom = true;
        return GGUF_REASON_NOMEM;
    }
    gguf_out_text(j, emit, elen);
    if (j->oom)
        return GGUF_REASON_NOMEM;
    if (stopped) {
        int w = gpe_stop_which(j->stop);
        if (w >= 0 && (size_t)w < j->n_stops && j->sink.stop_sequence)
            j->sink.stop_sequence(j->sink.ctx, j->stops[w]);
        return "stop";
    }
    if (j->gram && gpe_grammar_done(j->gram))
        return "stop";   /* the value is closed (gguf_job_end flushes what is held) */
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
    double wait = until_mono - gguf_now_s();
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
        cond_wait_until(&b->cv, &b->mu, gguf_now_s() + 0.05);
    while (!engine_has_work(b, e, gguf_now_s())) {
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
        gguf_job_prepare(b, prep[i]);

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
        gguf_job_free(done);
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
void gguf_engine_note_held(gguf_engine *e)
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
void gguf_engine_where(const gguf_engine *e, char *buf, size_t len)
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
    gguf_engine_where(e, where, sizeof where);
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
            gguf_job_error(j, code, msg);
            gguf_job_free(j);
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
    e->retry_at = gguf_now_s() + e->backoff_s;
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
    gguf_engine_where(e, where, sizeof where);
    gpe_ctx *c = NULL;
    gpe_status st = gpe_ctx_init(e->model, &e->cp, &c, err, sizeof err);
    if (st != GPE_OK) {
        e->backoff_s = e->backoff_s * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : e->backoff_s * 2;
        gp_log_warn("engine_reinit_failed", "%s: %s (%s); next try in %.0f s", where, err,
                    gpe_status_name(st), e->backoff_s);
        pthread_mutex_lock(&b->mu);
        snprintf(e->error, sizeof e->error, "re-init: %.300s", err);
        e->retry_at = gguf_now_s() + e->backoff_s;
        pthread_mutex_unlock(&b->mu);
        return;
    }
    e->ctx = c;
    gguf_engine_note_held(e);
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
        if (st == GPE_ERR_NOMEM) {
            gguf_job_nomem(j, "decoding");   /* the context is fine: nothing was committed */
            reason = "";
        } else if (st != GPE_OK) {
            gguf_job_error(j, st == GPE_ERR_CTX_FULL ? "CONTEXT_OVERFLOW" : "INTERNAL_ERROR", err);
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
                gguf_job_end(j, reason);
        } else {
            job_progress(j);
        }
        if (reason) {
            mine[k] = NULL;
            slot_release(e, s, st == GPE_OK && b->prefix_cache);
            gguf_job_free(j);
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
            gguf_job_error(p, "CANCELLED", "agent stopping");
        gguf_job_free(p);
        pthread_mutex_lock(&b->mu);
    }
    b->pending = keep;
    pthread_mutex_unlock(&b->mu);
}

int gguf_engine_scratch(gguf_engine *e)
{
    e->batch = gpe_batch_init(e->b->n_batch + e->n_slots);
    e->entry = malloc((size_t)e->n_slots * sizeof *e->entry);
    e->cancelled = malloc((size_t)e->n_slots * sizeof *e->cancelled);
    e->mine = malloc((size_t)e->n_slots * sizeof *e->mine);
    return e->batch && e->entry && e->cancelled && e->mine ? 0 : -1;
}

void gguf_engine_scratch_free(gguf_engine *e)
{
    free(e->mine);
    free(e->cancelled);
    free(e->entry);
    gpe_batch_free(e->batch);
    e->mine = NULL;
    e->cancelled = NULL;
    e->entry = NULL;
    e->batch = NULL;
}

void *gguf_decode_main(void *arg)
{
    gguf_engine *e = arg;
    gguf_backend *b = e->b;
    gpe_batch *batch = e->batch;
    int *entry = e->entry;
    bool *cancelled = e->cancelled;
    gjob **mine = e->mine;
    char err[384];
    bool idle = false;

    for (;;) {
        /* 1. Reserve slots for pending jobs; collect cancels. */
        bool stopping = admit_step(e, idle, mine, cancelled);
        idle = true;
        for (int k = 0; k < e->n_slots; k++) {
            gjob *j = mine[k];
            if (!j)
                continue;
            if (cancelled[k]) {
                gguf_job_error(j, "CANCELLED", stopping ? "agent stopping" : "cancelled");
                gguf_job_free(j);
                mine[k] = NULL;
                slot_release(e, e->slot0 + k, e->ctx != NULL && b->prefix_cache);
                idle = false;
            } else if (j->state == J_PENDING && e->ctx) {
                if (!job_admit(e, j, e->slot0 + k)) {
                    gguf_job_free(j);
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
    return NULL;
}
