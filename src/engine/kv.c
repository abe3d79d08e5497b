/* kv: KV cache storage (see kv.h). */
#include "kv.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant.h"

float gpe_kv_f16_table[65536];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_build(void)
{
    for (uint32_t h = 0; h < 65536; h++)
        gpe_kv_f16_table[h] = gpe_fp16_to_fp32((uint16_t)h);
}

int gpe_kv_init(gpe_kv *kv, int n_layer, int n_seq, int n_ctx, int kv_dim, bool f16)
{
    memset(kv, 0, sizeof *kv);
    if (n_layer <= 0 || n_seq <= 0 || n_ctx <= 0 || kv_dim <= 0)
        return -1;
    /* Overflow check on the element count before multiplying into bytes. */
    uint64_t n = (uint64_t)n_layer * (uint64_t)n_seq;
    if (n > SIZE_MAX / (uint64_t)n_ctx)
        return -1;
    n *= (uint64_t)n_ctx;
    if (n > SIZE_MAX / (uint64_t)kv_dim / sizeof(float))
        return -1;
    n *= (uint64_t)kv_dim;

    const size_t esz = f16 ? sizeof(uint16_t) : sizeof(float);
    if (f16)
        pthread_once(&table_once, table_build);
    kv->k = calloc((size_t)n, esz);
    kv->v = calloc((size_t)n, esz);
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
    return 2ull * (uint64_t)kv->n_layer * (uint64_t)kv->n_seq * (uint64_t)kv->n_ctx *
           (uint64_t)kv->kv_dim * (kv->f16 ? 2u : 4u);
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
