/*
 * plugin: the CUDA backend's table of operations (backend.h), the one
 * symbol libgpupool-cuda.so exports (GPE_CUDA_PLUGIN_ENTRY). The engine
 * dlopen()s the plugin and calls the entry with its interface version.
 */
#include "engine/cuda/backend_cuda.h"

static int op_device_count(char *why, size_t whylen)
{
    return gpe_cuda_device_count_why(why, whylen);
}

static gpe_status op_ctx_create(const gpe_llama *m, const gpe_bplace *pl, const gpe_bsizes *sz,
                                gpe_bctx **out, char *err, size_t errlen)
{
    gpe_cuda_model *cm = NULL;
    gpe_status st = gpe_cuda_model_create(m, pl, sz, &cm, err, errlen);
    *out = reinterpret_cast<gpe_bctx *>(cm);
    return st;
}

static gpe_status op_forward(gpe_bctx *c, const int32_t *tok, const int *pos, const int *seq,
                             const bool *want, int n, float *logits, char *err, size_t errlen)
{
    return gpe_cuda_forward(reinterpret_cast<gpe_cuda_model *>(c), tok, pos, seq, want, n,
                            logits, err, errlen);
}

static gpe_status op_hidden(gpe_bctx *c, const int32_t *tok, const int *pos, const int *seq,
                            int n, float *hidden, char *err, size_t errlen)
{
    return gpe_cuda_hidden(reinterpret_cast<gpe_cuda_model *>(c), tok, pos, seq, n, hidden,
                           err, errlen);
}

static void op_seq_clear(gpe_bctx *c, int seq)
{
    gpe_cuda_seq_clear(reinterpret_cast<gpe_cuda_model *>(c), seq);
}

static int op_devices(const gpe_bctx *c, gpe_vram_need *out)
{
    return gpe_cuda_model_devices(reinterpret_cast<const gpe_cuda_model *>(c), out);
}

static void op_ctx_free(gpe_bctx *c)
{
    gpe_cuda_model_free(reinterpret_cast<gpe_cuda_model *>(c));
}

static gpe_backend_ops make_ops()
{
    gpe_backend_ops o = {};
    o.abi = GPE_BACKEND_ABI;
    o.llama_size = (uint32_t)sizeof(gpe_llama);
    o.name = "cuda";
    o.gpu = true;
    o.device_count = op_device_count;
    o.device_info = gpe_cuda_device_info;
    o.budget = gpe_cuda_plan_devices;
    o.ctx_create = op_ctx_create;
    o.forward = op_forward;
    o.hidden = op_hidden;
    o.seq_clear = op_seq_clear;
    o.devices = op_devices;
    o.ctx_free = op_ctx_free;
    o.selftest = gpe_cuda_selftest_run;
    return o;
}

static const gpe_backend_ops g_ops = make_ops();

extern "C" __attribute__((visibility("default"))) const gpe_backend_ops *
gpe_cuda_backend_entry(uint32_t abi)
{
    return abi == GPE_BACKEND_ABI ? &g_ops : nullptr;
}
