/*
 * kv: the key/value cache of a gpe_ctx, F32, holding several sequences.
 *
 * Each sequence (an agent slot) owns a fixed region of n_ctx positions per
 * layer, so sequences never move and never fragment:
 *
 *   k[layer][seq][pos / 16][kv_dim][pos % 16]    kv_dim = n_head_kv * head_dim
 *   v[layer][seq][pos][kv_dim]
 *
 * K is stored in blocks of 16 positions, transposed: the attention computes
 * the scores of 16 keys at once, one per SIMD lane, and reads a block's
 * values for one dimension as one contiguous vector (attn.h). V keeps one
 * row per position (the attention sums rows of V). n_ctx is rounded up to
 * whole blocks for K.
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
 * F16 before they multiply V (attn.h).
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
    void *k;            /* [n_layer][n_seq][n_ctx / 16, rounded up][kv_dim][16] */
    void *v;            /* [n_layer][n_seq][n_ctx][kv_dim] */
    int *len;           /* [n_seq] positions held */
} gpe_kv;

/* Allocates the cache (zeroed). Returns 0, or -1 when the sizes overflow or
 * memory is short (nothing allocated then). */
int gpe_kv_init(gpe_kv *kv, int n_layer, int n_seq, int n_ctx, int kv_dim, bool f16);
void gpe_kv_free(gpe_kv *kv);
/* Bytes the cache holds (both K and V). */
uint64_t gpe_kv_bytes(const gpe_kv *kv);

/* Positions per K block. */
#define GPE_KV_KBLOCK 16

/* Bytes per element. */
static inline size_t gpe_kv_esize(const gpe_kv *kv)
{
    return kv->f16 ? 2u : 4u;
}
/* K block blk (positions 16 blk .. 16 blk + 15) of (layer, seq):
 * [kv_dim][16] elements, float or uint16_t as kv->f16 says; consecutive
 * blocks of a sequence are adjacent. No bounds check (callers validate). */
static inline void *gpe_kv_kblock(const gpe_kv *kv, int layer, int seq, int blk)
{
    const size_t nblk = (size_t)(kv->n_ctx + GPE_KV_KBLOCK - 1) / GPE_KV_KBLOCK;
    const size_t b = ((size_t)layer * (size_t)kv->n_seq + (size_t)seq) * nblk + (size_t)blk;
    return (char *)kv->k + b * (size_t)kv->kv_dim * GPE_KV_KBLOCK * gpe_kv_esize(kv);
}
/* Row of V for (layer, seq, pos): kv_dim elements. No bounds check. */
static inline void *gpe_kv_v(const gpe_kv *kv, int layer, int seq, int pos)
{
    size_t row = ((size_t)layer * (size_t)kv->n_seq + (size_t)seq) * (size_t)kv->n_ctx + (size_t)pos;
    return (char *)kv->v + row * (size_t)kv->kv_dim * gpe_kv_esize(kv);
}
/* Store the K and V rows (kv_dim floats each) of (layer, seq, pos),
 * converted to F16 (nearest even) in an F16 cache. No bounds check. */
void gpe_kv_put(gpe_kv *kv, int layer, int seq, int pos, const float *k, const float *v);

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
