/*
 * attn: causal self-attention of a batch of query rows over the KV cache
 * (CPU).
 *
 * For each token t (sequence seq[t], position pos[t]) and query head h, with
 * KV head g = h / (n_head / n_head_kv) and the keys i = lo..pos[t] of that
 * sequence (lo = 0, or pos[t] - window + 1 on a windowed layer):
 *
 *   q' = q, rounded to F16 when the cache is F16 (as llama.cpp converts q
 *        to the cache's type for q.k)
 *   s_i = scale * (q' . k_i)    the dot a chain of fmaf over d = 0..hd-1
 *   [s_i = cap * tanhf(s_i * (1 / cap)): softcap]
 *   e_i = exp(s_i - max s)      (attn_impl.h's polynomial)
 *   w_i = e_i * (float)(1 / sum e), rounded to F16 when the cache is F16
 *        (llama.cpp converts the weights to V's type)
 *   out = chain of fmaf over i ascending of w_i v_i, from 0
 *
 * Work is split into units of one sequence's run of consecutive tokens, one
 * KV head and some of the query heads that share it, so that each K and V
 * row is loaded (and converted from F16) once for up to 32 query rows; the
 * units are handed out dynamically, the most expensive (latest) first.
 * Every (token, head) is computed by the same operations whichever unit,
 * thread, batch or ISA (AVX-512, AVX2 or portable C) computes it: the prefix
 * cache extends KV computed in one batch with another, and the greedy output
 * must not notice.
 *
 * Internal to the engine.
 */
#ifndef GPE_ATTN_H
#define GPE_ATTN_H

#include <stddef.h>

#include "engine/kv.h"
#include "engine/threadpool.h"

typedef struct gpe_attn_args {
    const gpe_kv *kv;
    int layer;
    const float *q;      /* [n_tok][n_head * head_dim], after RoPE */
    float *out;          /* [n_tok][n_head * head_dim] */
    const int *pos;      /* [n_tok] */
    const int *seq;      /* [n_tok] */
    int n_tok;
    int n_head, n_head_kv, head_dim;
    float scale;         /* multiplies q.k */
    float softcap;       /* 0 = none */
    int window;          /* 0 = every earlier key; else the last `window` keys */
} gpe_attn_args;

/* Scratch for batches of up to n_batch tokens, contexts of up to n_ctx
 * positions, heads of head_dim and up to n_threads workers. */
typedef struct gpe_attn_ws {
    int n_batch, n_ctx, head_dim, n_threads;
    size_t per_thread;   /* floats of scratch per worker */
    float *scratch;      /* [n_threads][per_thread] */
    int *tiles;          /* [n_batch + 1] token runs of the current call */
} gpe_attn_ws;

/* Returns 0, or -1 when memory is short or sizes are bad (nothing held). */
int gpe_attn_ws_init(gpe_attn_ws *ws, int n_batch, int n_ctx, int head_dim, int n_threads);
void gpe_attn_ws_free(gpe_attn_ws *ws);

/* Writes a->out for every token and head, on workers 0..nth-1 of pool.
 * Every key position of every sequence up to the token's own must be in
 * the cache; n_tok, head_dim, positions and nth within ws's sizes. */
void gpe_attn_run(gpe_attn_ws *ws, gpe_pool *pool, int nth, const gpe_attn_args *a);

#endif
