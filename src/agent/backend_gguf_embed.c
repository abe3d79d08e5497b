/*
 * backend_gguf_embed.c: embeddings jobs, run whole on the decode thread
 * that takes them, in batches of sequences of their own context.
 */
#include "agent/backend_gguf_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

/* ---------------------------------------------------------- embeddings */

#define EMBED_SEQS 8
#define EMBED_SHORT 512

/* Input i of an embeddings job as tokens: a string (tokenized with the
 * model's special tokens, as a prompt) or an array of token ids. Returns
 * a malloc'd array, or NULL with *code and msg set: the input refused
 * (INVALID_REQUEST, CONTEXT_OVERFLOW) or memory ran out
 * (AGENT_OUT_OF_MEMORY: not the input's fault). */
static int32_t *embed_tokens(gguf_backend *b, json_t *v, size_t i, int *n, const char **code,
                             char *msg, size_t msglen)
{
    int32_t *t = NULL;
    *code = "INVALID_REQUEST";
    if (json_is_string(v)) {
        t = gguf_tokenize(b, json_string_value(v), n);
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
    } else {
        snprintf(msg, msglen, "input[%zu]: not a string or an array of token ids", i);
        return NULL;
    }
    if (!t) {
        *code = "AGENT_OUT_OF_MEMORY";
        snprintf(msg, msglen, "the agent ran out of memory reading input[%zu]", i);
        return NULL;
    }
    if (*n < 1 || *n > b->n_ctx) {
        if (*n > b->n_ctx)
            *code = "CONTEXT_OVERFLOW";
        snprintf(msg, msglen, "input[%zu] has %d tokens; the context holds %d", i, *n,
                 b->n_ctx);
        free(t);
        return NULL;
    }
    return t;
}

/* Under emb_mu: embeddings context k (see gguf_backend) into *out,
 * created on first use; gpe_ctx_init's status (GPE_ERR_NOMEM: the job's
 * AGENT_OUT_OF_MEMORY). */
static gpe_status embed_ctx(gguf_backend *b, int k, gpe_ctx **out, char *msg, size_t msglen)
{
    gpe_status st = GPE_OK;
    if (!b->emb_ctx[k]) {
        gpe_ctx_params cp = b->eng[0].cp;
        cp.n_seq = k == 0 ? EMBED_SEQS : 1;
        cp.n_ctx = k == 0 && b->n_ctx > EMBED_SHORT ? EMBED_SHORT : b->n_ctx;
        st = gpe_ctx_init(b->model, &cp, &b->emb_ctx[k], msg, msglen);
    }
    *out = b->emb_ctx[k];
    return st;
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
        gpe_ctx *c;
        st = embed_ctx(b, 1, &c, msg, msglen);
        if (st == GPE_OK)
            st = gpe_embed(c, toks[i], nt[i], out + i * (size_t)dim, dim, msg, msglen);
    }
    if (st == GPE_OK && n_short > 0) {
        gpe_ctx *c;
        st = embed_ctx(b, 0, &c, msg, msglen);
        if (st == GPE_OK)
            st = gpe_embed_batch(c, st_toks, st_n, (int)n_short, st_out, dim, msg, msglen);
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
void gguf_job_embed(gguf_backend *b, gjob *j)
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
        code = "AGENT_OUT_OF_MEMORY";
        snprintf(msg, sizeof msg, "the agent ran out of memory reading the inputs");
        goto done;
    }
    for (size_t i = 0; i < n_in; i++) {
        toks[i] = embed_tokens(b, json_array_get(j->emb_input, i), i, &nt[i], &code, msg,
                               sizeof msg);
        if (!toks[i])
            goto done;
        total += nt[i];
    }
    if (j->sink.started)
        j->sink.started(j->sink.ctx);
    pthread_mutex_lock(&b->emb_mu);
    gpe_status st = embed_all(b, toks, nt, n_in, dim, out, msg, sizeof msg);
    pthread_mutex_unlock(&b->emb_mu);
    if (st == GPE_ERR_NOMEM) {
        code = "AGENT_OUT_OF_MEMORY";
        snprintf(msg, sizeof msg, "the agent ran out of memory computing the embeddings");
        goto done;
    }
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
        gguf_job_error(j, code, msg);
    else
        j->sink.end(j->sink.ctx, "stop", total, 0);
    for (size_t i = 0; toks && i < n_in; i++)
        free(toks[i]);
    free(toks);
    free(nt);
    free(out);
}
