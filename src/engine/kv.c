/* kv: KV cache storage (see kv.h). */
#include "kv.h"

#include <stdlib.h>
#include <string.h>

#include "engine/quant.h"

/* Positions allocated per sequence for K: n_ctx rounded up to whole blocks. */
static size_t k_positions(int n_ctx)
{
    return ((size_t)n_ctx + GPE_KV_KBLOCK - 1) / GPE_KV_KBLOCK * GPE_KV_KBLOCK;
}

int gpe_kv_init(gpe_kv *kv, int n_layer, int n_seq, int n_ctx, int kv_dim, bool f16)
{
    memset(kv, 0, sizeof *kv);
    if (n_layer <= 0 || n_seq <= 0 || n_ctx <= 0 || kv_dim <= 0)
        return -1;
    /* Overflow check on the element count (K's, the larger) before
     * multiplying into bytes. */
    uint64_t n = (uint64_t)n_layer * (uint64_t)n_seq;
    if (n > SIZE_MAX / k_positions(n_ctx))
        return -1;
    const uint64_t nk = n * k_positions(n_ctx);
    n *= (uint64_t)n_ctx;
    if (nk > SIZE_MAX / (uint64_t)kv_dim / sizeof(float))
        return -1;

    const size_t esz = f16 ? sizeof(uint16_t) : sizeof(float);
    kv->k = calloc((size_t)(nk * (uint64_t)kv_dim), esz);
    kv->v = calloc((size_t)(n * (uint64_t)kv_dim), esz);
    kv->len = calloc((size_t)n_seq, sizeof(int));
    if (!kv->k || !kv->v || !kv->len) {
        gpe_kv_free(kv);
        return -1;
    }
    kv->n_layer = n_layer;
    kv->n_seq = n_seq;
    kv->n_ctx = n_ctx;
    kv->kv_dim = kv_dim;
    kv->f16 = f16;
    return 0;
}

void gpe_kv_free(gpe_kv *kv)
{
    if (!kv)
        return;
    free(kv->k);
    free(kv->v);
    free(kv->len);
    memset(kv, 0, sizeof *kv);
}

uint64_t gpe_kv_bytes(const gpe_kv *kv)
{
    return (uint64_t)kv->n_layer * (uint64_t)kv->n_seq *
           ((uint64_t)k_positions(kv->n_ctx) + (uint64_t)kv->n_ctx) * (uint64_t)kv->kv_dim *
           gpe_kv_esize(kv);
}

void gpe_kv_put(gpe_kv *kv, int layer, int seq, int pos, const float *k, const float *v)
{
    const size_t kvd = (size_t)kv->kv_dim, lane = (size_t)(pos % GPE_KV_KBLOCK);
    void *kb = gpe_kv_kblock(kv, layer, seq, pos / GPE_KV_KBLOCK);
    void *vr = gpe_kv_v(kv, layer, seq, pos);
    if (kv->f16) {
        uint16_t *k16 = kb, *v16 = vr;
        for (size_t i = 0; i < kvd; i++) {
            k16[i * GPE_KV_KBLOCK + lane] = gpe_fp32_to_fp16(k[i]);
            v16[i] = gpe_fp32_to_fp16(v[i]);
        }
    } else {
        float *k32 = kb;
        for (size_t i = 0; i < kvd; i++)
            k32[i * GPE_KV_KBLOCK + lane] = k[i];
        memcpy(vr, v, kvd * sizeof(float));
    }
}

void gpe_kv_seq_clear(gpe_kv *kv, int seq)
{
    /* The rows need not be zeroed: attention only reads positions < len. */
    if (seq >= 0 && seq < kv->n_seq)
        kv->len[seq] = 0;
}

void gpe_kv_seq_truncate(gpe_kv *kv, int seq, int n)
{
    if (seq < 0 || seq >= kv->n_seq)
        return;
    if (n < 0)
        n = 0;
    if (n < kv->len[seq])
        kv->len[seq] = n;
}

int gpe_kv_seq_len(const gpe_kv *kv, int seq)
{
    return (seq >= 0 && seq < kv->n_seq) ? kv->len[seq] : 0;
}

double gpe_kv_utilization(const gpe_kv *kv)
{
    if (kv->n_seq <= 0 || kv->n_ctx <= 0)
        return 0.0;
    uint64_t used = 0;
    for (int s = 0; s < kv->n_seq; s++)
        used += (uint64_t)kv->len[s];
    return (double)used / ((double)kv->n_seq * (double)kv->n_ctx);
}
