/*
 * backend_cpu: the CPU backend's table (backend.h) over the model's forward
 * pass (model.h), the KV cache (kv.h) and a thread pool per context.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/kv.h"
#include "engine/threadpool.h"

struct gpe_bctx {
    const gpe_llama *m;
    gpe_pool *pool;
    gpe_kv kv;
    gpe_fwd fwd;
};

static int cpu_device_count(char *why, size_t whylen)
{
    if (why && whylen > 0)
        snprintf(why, whylen, "the CPU backend has no devices");
    return 0;
}

static gpe_status cpu_device_info(int device, gpe_gpu_info *out, char *err, size_t errlen)
{
    if (err && errlen > 0)
        snprintf(err, errlen, "the CPU backend has no devices");
    return GPE_ERR_ARG;
}

static gpe_status cpu_budget(const gpe_llama *m, const gpe_bplace *pl, const gpe_bsizes *sz,
                             gpe_vram_need *out, int *n_out, char *err, size_t errlen)
{
    *n_out = 0;
    if (err && errlen > 0)
        snprintf(err, errlen, "the model runs on the CPU: no VRAM to estimate");
    return GPE_ERR_ARG;
}

static void cpu_ctx_free(gpe_bctx *c)
{
    if (!c)
        return;
    gpe_pool_destroy(c->pool);
    gpe_kv_free(&c->kv);
    gpe_fwd_free(&c->fwd);
    free(c);
}

/* The thread pool did not start (why: threadpool.h). Out of memory, or of
 * threads for now (pthread_create's EAGAIN: the process or user limit, or
 * the memory for a stack), is GPE_ERR_NOMEM: not the model's fault, a
 * later try may load it. Anything else is GPE_ERR_BACKEND, which a retry
 * would not fix. err names the system's error. */
static gpe_status pool_failed(gpe_bctx *c, int why, char *err, size_t errlen)
{
    gpe_status st = GPE_ERR_BACKEND;
    const char *what = "cannot start a compute thread";
    if (why == ENOMEM) {
        st = GPE_ERR_NOMEM;
        what = "out of memory: cannot start the compute threads";
    } else if (why == EAGAIN) {
        st = GPE_ERR_NOMEM;
        what = "out of memory or threads: cannot start a compute thread";
    }
    if (err && errlen > 0)
        snprintf(err, errlen, "%s (%s)", what, strerror(why));
    cpu_ctx_free(c);
    return st;
}

static gpe_status cpu_ctx_create(const gpe_llama *m, const gpe_bplace *pl, const gpe_bsizes *sz,
                                 gpe_bctx **out, char *err, size_t errlen)
{
    const gpe_hparams *hp = &m->hp;
    gpe_bctx *c = calloc(1, sizeof *c);
    *out = NULL;
    if (!c)
        goto nomem;
    c->m = m;
    int why = 0;
    c->pool = gpe_pool_create_status(sz->n_threads, &why);
    if (!c->pool)
        return pool_failed(c, why, err, errlen);
    if (gpe_kv_init(&c->kv, hp->n_layer, sz->n_seq, sz->n_ctx, hp->n_head_kv * hp->head_dim,
                    sz->kv_f16) != 0) {
        if (err && errlen > 0)
            snprintf(err, errlen, "cannot allocate the KV cache (%d sequences x %d positions)",
                     sz->n_seq, sz->n_ctx);
        cpu_ctx_free(c);
        return GPE_ERR_NOMEM;
    }
    if (gpe_fwd_init(&c->fwd, m, sz->n_batch, sz->n_ctx, gpe_pool_size(c->pool)) != 0)
        goto nomem;
    *out = c;
    return GPE_OK;

nomem:
    if (err && errlen > 0)
        snprintf(err, errlen, "out of memory");
    cpu_ctx_free(c);
    return GPE_ERR_NOMEM;
}

static gpe_status cpu_forward(gpe_bctx *c, const int32_t *tok, const int *pos, const int *seq,
                              const bool *want, int n, float *logits, char *err, size_t errlen)
{
    gpe_llama_forward(c->m, &c->fwd, &c->kv, c->pool, tok, pos, seq, want, n, logits);
    return GPE_OK;
}

static gpe_status cpu_hidden(gpe_bctx *c, const int32_t *tok, const int *pos, const int *seq,
                             int n, float *hidden, char *err, size_t errlen)
{
    gpe_llama_hidden(c->m, &c->fwd, &c->kv, c->pool, tok, pos, seq, n, hidden);
    return GPE_OK;
}

/* Rows past a sequence's length are never read (attention stops at pos),
 * so clearing needs no work; kept for the table's symmetry. */
static void cpu_seq_clear(gpe_bctx *c, int seq)
{
    gpe_kv_seq_clear(&c->kv, seq);
}

static int cpu_devices(const gpe_bctx *c, gpe_vram_need *out)
{
    return 0;
}

static const gpe_backend_ops cpu_ops = {
    .abi = GPE_BACKEND_ABI,
    .llama_size = sizeof(gpe_llama),
    .name = "cpu",
    .gpu = false,
    .device_count = cpu_device_count,
    .device_info = cpu_device_info,
    .budget = cpu_budget,
    .ctx_create = cpu_ctx_create,
    .forward = cpu_forward,
    .seq_clear = cpu_seq_clear,
    .devices = cpu_devices,
    .ctx_free = cpu_ctx_free,
    .selftest = NULL,
    .hidden = cpu_hidden,
};

const gpe_backend_ops *gpe_backend_cpu(void)
{
    return &cpu_ops;
}
