/*
 * kv: the key/value cache of a gpe_ctx, F32, holding several sequences.
 *
 * Each sequence (an agent slot) owns a fixed region of n_ctx positions per
 * layer, so sequences never move and never fragment:
 *
 *   k[layer][seq][pos][kv_dim]    kv_dim = n_head_kv * head_dim
 *   v[layer][seq][pos][kv_dim]
 *
 * K rows are stored after RoPE. len[seq] is the number of positions the
 * sequence holds; gpe_decode writes rows at len..len+n-1 and then commits
 * the new length only when the whole batch has been computed, so a failed
 * decode leaves the cache as it was.
 *
 * Why F32 and not F16: the engine is measured against llama.cpp with an F32
 * KV cache (see tests/data), and for the small models this engine targets
 * the cache is a small share of memory traffic.
 *
 * Internal to the engine.
 */
#ifndef GPE_KV_H
#define GPE_KV_H

#include <stddef.h>
#include <stdint.h>

typedef struct gpe_kv {
    int n_layer;
    int n_seq;
    int n_ctx;          /* positions per sequence */
    int kv_dim;         /* floats per cached row */
    float *k;           /* [n_layer][n_seq][n_ctx][kv_dim] */
    float *v;           /* same shape */
    int *len;           /* [n_seq] positions held */
} gpe_kv;

/* Allocates the cache (zeroed). Returns 0, or -1 when the sizes overflow or
 * memory is short (nothing allocated then). */
int gpe_kv_init(gpe_kv *kv, int n_layer, int n_seq, int n_ctx, int kv_dim);
void gpe_kv_free(gpe_kv *kv);
/* Bytes the cache holds (both K and V). */
uint64_t gpe_kv_bytes(const gpe_kv *kv);

/* Row of K (or V) for (layer, seq, pos); no bounds check (callers validate). */
static inline float *gpe_kv_k(const gpe_kv *kv, int layer, int seq, int pos)
{
    size_t row = ((size_t)layer * (size_t)kv->n_seq + (size_t)seq) * (size_t)kv->n_ctx + (size_t)pos;
    return kv->k + row * (size_t)kv->kv_dim;
}
static inline float *gpe_kv_v(const gpe_kv *kv, int layer, int seq, int pos)
{
    size_t row = ((size_t)layer * (size_t)kv->n_seq + (size_t)seq) * (size_t)kv->n_ctx + (size_t)pos;
    return kv->v + row * (size_t)kv->kv_dim;
}

/* Forget a sequence (positions restart at 0). Out-of-range seq is ignored. */
void gpe_kv_seq_clear(gpe_kv *kv, int seq);
/* Positions a sequence holds, 0 for an out-of-range seq. */
int gpe_kv_seq_len(const gpe_kv *kv, int seq);
/* Fraction of all positions in use (for the agent's kv_cache_utilization). */
double gpe_kv_utilization(const gpe_kv *kv);

#endif
