/*
 * backend_cuda: the engine's CUDA backend, callable from C (engine.c).
 *
 * A gpe_cuda_model is one model's weights plus one context's KV cache and
 * scratch, all in the VRAM of one device (cudaMalloc only: no managed
 * memory, no host fallback). It mirrors a gpe_ctx on the CPU: create it at
 * context creation time (n_ctx, n_seq and n_batch are the context's) and
 * run gpe_cuda_forward where the CPU path runs gpe_llama_forward.
 *
 * Lifecycle:
 *
 *   gpe_cuda_model *cm = NULL;
 *   st = gpe_cuda_model_upload(&model->llama, device, n_ctx, n_seq, n_batch, &cm, err, n);
 *   ...  gpe_cuda_forward(cm, tokens, pos, seq, want, n, logits, err, n);
 *   ...  gpe_cuda_seq_clear(cm, seq);
 *   gpe_cuda_model_free(cm);
 *
 * The upload copies the weights: the gpe_llama (and the file mapping it
 * points into) may be released afterwards. Sequence lengths stay with the
 * caller (gpe_kv.len), exactly as with the CPU forward: this backend only
 * stores K/V rows at the positions it is given.
 *
 * Threading: a gpe_cuda_model is used by one thread at a time. Several
 * models may live on one device (each has its own stream and cuBLAS handle).
 *
 * Placement: gpe_cuda_model_create takes a placement (backend.h): with
 * several entries the layers are split over them (forward.cu says how);
 * gpe_cuda_model_upload is the one-device, F32-KV shorthand.
 *
 * Built into the CUDA plugin (libgpupool-cuda.so, plugin.cu exports its
 * table), never into libgpupool-engine; test_cuda links these objects
 * directly for its host-side checks.
 */
#ifndef GPE_BACKEND_CUDA_H
#define GPE_BACKEND_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpupool/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "engine/backend.h"
#include "engine/model.h"

typedef struct gpe_cuda_model gpe_cuda_model;

/* Number of visible CUDA devices in *n. Returns true when at least one is
 * visible; false (and *n = 0) when none is, or the driver is missing. */
bool gpe_cuda_device_count(int *n);

/* What a model needs in VRAM (bytes). */
typedef struct gpe_cuda_budget {
    uint64_t weights;   /* every tensor, tied output stored once */
    uint64_t kv;        /* K and V caches (F32 here) */
    uint64_t scratch;   /* activations, logits, GEMM dequantization buffer */
    uint64_t reserve;   /* cuBLAS workspace and allocator slack */
    uint64_t total;
} gpe_cuda_budget;

/* Computes the budget without touching the GPU, after checking that the
 * backend supports the model (weight types, head size <= 256, n_rot <= 256,
 * row lengths) and the sizes (all > 0): GPE_ERR_UNSUPPORTED / GPE_ERR_ARG
 * otherwise. */
gpe_status gpe_cuda_model_bytes(const gpe_llama *m, int n_ctx, int n_seq, int n_batch,
                                gpe_cuda_budget *out, char *err, size_t errlen);

/* Per-stage needs of a placement, reading each device's free memory
 * (layers split by pl->split, or by free memory when all 0). */
gpe_status gpe_cuda_plan_devices(const gpe_llama *m, const gpe_bplace *pl, const gpe_bsizes *sz,
                           gpe_vram_need *out, int *n_out, char *err, size_t errlen);

/* Creates the model on its placement: preflight per device (the stages
 * on one device together), then upload. Errors name the device ("CUDA
 * device N: ..."); GPE_ERR_INSUFFICIENT_VRAM when it does not fit. */
gpe_status gpe_cuda_model_create(const gpe_llama *m, const gpe_bplace *pl, const gpe_bsizes *sz,
                                 gpe_cuda_model **out, char *err, size_t errlen);

/* Stages of a model: device, layers, planned bytes, free now. */
int gpe_cuda_model_devices(const gpe_cuda_model *cm, gpe_vram_need *out);

/* Device count with the reason when 0 ("no CUDA device is visible
 * (cudaGetDeviceCount: ...)"), and one device's description. */
int gpe_cuda_device_count_why(char *why, size_t whylen);
gpe_status gpe_cuda_device_info(int device, gpe_gpu_info *out, char *err, size_t errlen);

/* Uploads m to device `device`. Preflight first: the budget above is
 * compared with cudaMemGetInfo's free memory before anything is allocated;
 * when it does not fit: GPE_ERR_INSUFFICIENT_VRAM, the message giving both
 * numbers. Other CUDA failures: GPE_ERR_BACKEND (nothing left allocated).
 * On success *out is owned by the caller (gpe_cuda_model_free). */
gpe_status gpe_cuda_model_upload(const gpe_llama *m, int device, int n_ctx, int n_seq,
                                 int n_batch, gpe_cuda_model **out, char *err, size_t errlen);

/* Same contract as gpe_llama_forward (model.h): n <= n_batch tokens, K/V
 * rows stored at (seq[i], pos[i]), attention of token i over positions
 * 0..pos[i] of its sequence (earlier decodes and this batch), logits of the
 * entries with want[i] written in batch order as consecutive rows of
 * n_vocab floats at logits_host. Unlike the CPU function it checks its
 * arguments (ids, seq, pos in range: GPE_ERR_ARG) and reports device errors
 * (GPE_ERR_BACKEND; the cache may then hold partial rows at the batch's
 * positions, which the caller does not commit; the model is then unusable:
 * later calls fail, the message starting "CUDA device N: "). Returns after
 * the logits are on the host. */
gpe_status gpe_cuda_forward(gpe_cuda_model *cm, const int32_t *tokens, const int *pos,
                            const int *seq, const bool *want, int n, float *logits_host,
                            char *err, size_t errlen);

/* The same pass as gpe_cuda_forward (checks, cache rows, device errors)
 * but no logits: the output-normed hidden state of every token, n rows of
 * n_embd floats at hidden_host (gpe_llama_hidden's contract, model.h:
 * embeddings). */
gpe_status gpe_cuda_hidden(gpe_cuda_model *cm, const int32_t *tokens, const int *pos,
                           const int *seq, int n, float *hidden_host, char *err, size_t errlen);

/* Zeroes sequence seq's K/V rows (positions restart at 0; the caller resets
 * its length). Out-of-range seq is ignored. */
void gpe_cuda_seq_clear(gpe_cuda_model *cm, int seq);

/* Frees everything (NULL is a no-op). */
void gpe_cuda_model_free(gpe_cuda_model *cm);

/* Sizes the model was uploaded with. */
int gpe_cuda_model_n_batch(const gpe_cuda_model *cm);

/* Self-test (selftest.c): per-op checks of every kernel against CPU
 * references on random inputs, then whole random models of each supported
 * type (prefill + batched decode of 2 sequences) against gpe_llama_forward,
 * by NMSE. GPE_OK when all pass; err lists each check and its NMSE (as much
 * as fits). Without a device: GPE_ERR_BACKEND, "no CUDA device". */
gpe_status gpe_cuda_selftest_run(char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
