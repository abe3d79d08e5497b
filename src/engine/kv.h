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
 * Element type: F32 by default (the engine is measured against llama.cpp
 * with an F32 KV cache), or F16 (half the memory; llama.cpp's default). In
 * F16 mode the attention rounds like llama.cpp's non-flash path with an F16
 * cache: q is rounded to F16 for q.k, and the softmax weights are rounded to
 * F16 before they multiply V (model.c). F16 values are read through a
 * 65536-entry table (gpe_kv_f16_table) built once.
 *
 * Internal to the engine.
 */
#ifndef GPE_KV_H
#define GPE_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gpe_kv {
    int n_layer;
    int n_seq;
    int n_ctx;          /* positions per sequence */
    int kv_dim;         /* elements per cached row */
    bool f16;           /* elements are F16 bit patterns (uint16_t), else float */
    void *k;            /* [n_layer][n_seq][n_ctx][kv_dim] */
    void *v;            /* same shape */
    int *len;           /* [n_seq] positions held */
} gpe_kv;

/* Allocates the cache (zeroed). Returns 0, or -1 when the sizes overflow or
 * memory is short (nothing allocated then). */
int gpe_kv_init(gpe_kv *kv, int n_layer, int n_seq, int n_ctx, int kv_dim, bool f16);
void gpe_kv_free(gpe_kv *kv);
/* Bytes the cache holds (both K and V). */
uint64_t gpe_kv_bytes(const gpe_kv *kv);

/* Row of K (or V) for (layer, seq, pos): float * or uint16_t * as kv->f16
 * says. No bounds check (callers validate). */
static inline void *gpe_kv_row(const gpe_kv *kv, void *base, int layer, int seq, int pos)
{
    size_t row = ((size_t)layer * (size_t)kv->n_seq + (size_t)seq) * (size_t)kv->n_ctx + (size_t)pos;
    return (char *)base + row * (size_t)kv->kv_dim * (kv->f16 ? 2u : 4u);
}
static inline void *gpe_kv_k(const gpe_kv *kv, int layer, int seq, int pos)
{
    return gpe_kv_row(kv, kv->k, layer, seq, pos);
}
static inline void *gpe_kv_v(const gpe_kv *kv, int layer, int seq, int pos)
{
    return gpe_kv_row(kv, kv->v, layer, seq, pos);
}

/* F16 bit pattern -> float, for every pattern (built by gpe_kv_init). */
extern float gpe_kv_f16_table[65536];

/* Forget a sequence (positions restart at 0). Out-of-range seq is ignored. */
void gpe_kv_seq_clear(gpe_kv *kv, int seq);
/* Keep the first n positions of a sequence (rows beyond stay in memory but
 * are never read again: attention reads positions < len only, and the next
 * decode overwrites them). n >= len or an out-of-range seq: no change. */
void gpe_kv_seq_truncate(gpe_kv *kv, int seq, int n);
/* Positions a sequence holds, 0 for an out-of-range seq. */
int gpe_kv_seq_len(const gpe_kv *kv, int seq);
/* Fraction of all positions in use (for the agent's kv_cache_utilization). */
double gpe_kv_utilization(const gpe_kv *kv);

#endif
