/*
 * A fake CUDA backend plugin for the agent's tests on machines without a
 * GPU (tests/integration/test_e2e_backend.py): loaded by the engine through
 * GPUPOOL_CUDA_PLUGIN, it shows FAKEGPU_COUNT devices (default 1) of
 * FAKEGPU_VRAM_MIB MiB (default 4096, 90 % free) and budgets a context as
 * FAKEGPU_WEIGHTS_MIB MiB of weights (default 8192, split over the devices
 * of a layer split) plus FAKEGPU_KV_BYTES (default 4096) of K/V per
 * position and slot. It computes
 * nothing: a context is refused (out of VRAM). So the agent's VRAM
 * planning, its refusal and its CPU fallback run for real on CI, where
 * the engine's real CUDA plugin cannot.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"

#define MIB (1024ull * 1024ull)

static unsigned long long env_mib(const char *name, unsigned long long dflt)
{
    const char *v = getenv(name);
    return (v && atoll(v) > 0 ? (unsigned long long)atoll(v) : dflt) * MIB;
}

/* K/V bytes per position and slot: FAKEGPU_KV_BYTES, default 4096. */
static unsigned long long kv_bytes(void)
{
    const char *v = getenv("FAKEGPU_KV_BYTES");
    return v && atoll(v) > 0 ? (unsigned long long)atoll(v) : 4096ull;
}

static int fg_count(char *why, size_t whylen)
{
    const char *v = getenv("FAKEGPU_COUNT");
    int n = v ? atoi(v) : 1;
    if (n <= 0)
        snprintf(why, whylen, "fake GPU plugin: FAKEGPU_COUNT is 0");
    return n > 0 ? n : 0;
}

static gpe_status fg_info(int device, gpe_gpu_info *out, char *err, size_t errlen)
{
    char why[64];
    if (device < 0 || device >= fg_count(why, sizeof why)) {
        snprintf(err, errlen, "fake GPU %d does not exist", device);
        return GPE_ERR_ARG;
    }
    memset(out, 0, sizeof *out);
    out->index = device;
    snprintf(out->name, sizeof out->name, "Fake GPU %d", device);
    snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "0000:%02X:00.0", 0x10 + device);
    out->cc_major = 9;
    out->total_bytes = env_mib("FAKEGPU_VRAM_MIB", 4096);
    out->free_bytes = out->total_bytes / 10 * 9;
    return GPE_OK;
}

static gpe_status fg_budget(const gpe_llama *m, const gpe_bplace *pl, const gpe_bsizes *sz,
                            gpe_vram_need *out, int *n_out, char *err, size_t errlen)
{
    (void)m;
    unsigned long long weights = env_mib("FAKEGPU_WEIGHTS_MIB", 8192);
    unsigned long long free_b = env_mib("FAKEGPU_VRAM_MIB", 4096) / 10 * 9;
    for (int i = 0; i < pl->n; i++) {
        gpe_vram_need *d = &out[i];
        memset(d, 0, sizeof *d);
        d->device = pl->device[i];
        d->weights = weights / (unsigned long long)pl->n;
        d->kv = kv_bytes() * (unsigned long long)sz->n_ctx * (unsigned long long)sz->n_seq /
                (unsigned long long)pl->n;
        d->scratch = 64 * MIB;
        d->reserve = 256 * MIB;
        d->total = d->weights + d->kv + d->scratch + d->reserve;
        d->free_bytes = free_b;
    }
    *n_out = pl->n;
    (void)err;
    (void)errlen;
    return GPE_OK;
}

static gpe_status fg_ctx_create(const gpe_llama *m, const gpe_bplace *pl, const gpe_bsizes *sz,
                                gpe_bctx **out, char *err, size_t errlen)
{
    (void)m;
    (void)pl;
    (void)sz;
    *out = NULL;
    snprintf(err, errlen, "CUDA device %d: the fake GPU plugin computes nothing", pl->device[0]);
    return GPE_ERR_INSUFFICIENT_VRAM;
}

static gpe_status fg_forward(gpe_bctx *c, const int32_t *tok, const int *pos, const int *seq,
                             const bool *want, int n, float *logits, char *err, size_t errlen)
{
    (void)c, (void)tok, (void)pos, (void)seq, (void)want, (void)n, (void)logits;
    snprintf(err, errlen, "fake GPU");
    return GPE_ERR_BACKEND;
}

static void fg_seq_clear(gpe_bctx *c, int seq)
{
    (void)c;
    (void)seq;
}

static int fg_devices(const gpe_bctx *c, gpe_vram_need *out)
{
    (void)c;
    (void)out;
    return 0;
}

static void fg_ctx_free(gpe_bctx *c)
{
    (void)c;
}

static const gpe_backend_ops fg_ops = {
    .abi = GPE_BACKEND_ABI,
    .llama_size = sizeof(gpe_llama),
    .name = "cuda",
    .gpu = true,
    .device_count = fg_count,
    .device_info = fg_info,
    .budget = fg_budget,
    .ctx_create = fg_ctx_create,
    .forward = fg_forward,
    .seq_clear = fg_seq_clear,
    .devices = fg_devices,
    .ctx_free = fg_ctx_free,
    .selftest = NULL,
};

const gpe_backend_ops *gpe_cuda_backend_entry(uint32_t abi);
const gpe_backend_ops *gpe_cuda_backend_entry(uint32_t abi)
{
    return abi == GPE_BACKEND_ABI ? &fg_ops : NULL;
}
