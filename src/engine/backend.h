/*
 * backend: the table of operations every compute backend of the engine
 * implements (in the manner of ggml's backend interface). engine.c holds
 * the public API (validation, sequence lengths, batching into n_batch
 * chunks, logits buffer, the fault hook) and reaches the backend only
 * through this table, so that it does not know which backends exist.
 *
 *   CPU   backend_cpu.c: gpe_llama_forward over a gpe_kv, a thread pool.
 *   CUDA  src/engine/cuda/: a run-time plugin (libgpupool-cuda.so) whose one
 *         exported function, GPE_CUDA_PLUGIN_ENTRY, returns its table;
 *         backend_load.c finds and dlopen()s it on first use. The engine
 *         library itself links no CUDA library.
 *
 * A backend context (gpe_bctx) is one model's weights where the backend
 * needs them, plus one context's KV cache and scratch. The model
 * (gpe_llama) outlives it. Sequence lengths stay with the caller: a
 * backend stores K/V rows at the positions it is given and attends over
 * positions 0..pos[i], so truncating a sequence needs no backend call.
 *
 * Errors: operations return gpe_status and write one line into err. After
 * forward fails with GPE_ERR_BACKEND or GPE_ERR_INSUFFICIENT_VRAM the
 * backend context may be unusable; the caller only frees it.
 *
 * Internal to the engine. The plugin is built from the same sources as the
 * engine: abi and llama_size guard against mixing builds.
 */
#ifndef GPE_BACKEND_H
#define GPE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpupool/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "engine/model.h"

/* Bump when gpe_backend_ops, gpe_bplace or what the backends read of
 * gpe_llama changes shape. */
#define GPE_BACKEND_ABI 3u

#define GPE_CUDA_PLUGIN_ENTRY "gpe_cuda_backend_entry"
#define GPE_CUDA_PLUGIN_NAME "libgpupool-cuda.so"

typedef struct gpe_bctx gpe_bctx;

/* Where a context goes: n devices in layer order (the same index may
 * repeat), and the share of layers of each (all 0 = by free memory). */
typedef struct gpe_bplace {
    int n;
    int device[GPE_MAX_DEVICES];
    float split[GPE_MAX_DEVICES];
} gpe_bplace;

/* Sizes of a context, as gpe_ctx_init validated them. */
typedef struct gpe_bsizes {
    int n_ctx, n_seq, n_batch, n_threads;
    bool kv_f16;
} gpe_bsizes;

typedef struct gpe_backend_ops {
    uint32_t abi;                /* GPE_BACKEND_ABI */
    uint32_t llama_size;         /* sizeof(gpe_llama) the backend was built with */
    const char *name;            /* "cpu", "cuda" */
    bool gpu;                    /* has devices (placement, VRAM) */

    /* Devices visible; 0 with a one-line reason in why when none. */
    int (*device_count)(char *why, size_t whylen);
    gpe_status (*device_info)(int device, gpe_gpu_info *out, char *err, size_t errlen);
    /* Per-device needs of a context (nothing allocated): out[0..*n_out). */
    gpe_status (*budget)(const gpe_llama *m, const gpe_bplace *pl, const gpe_bsizes *sz,
                         gpe_vram_need *out, int *n_out, char *err, size_t errlen);
    /* Creates the backend context (uploads weights, allocates K/V and
     * scratch; preflight first on GPUs). */
    gpe_status (*ctx_create)(const gpe_llama *m, const gpe_bplace *pl, const gpe_bsizes *sz,
                             gpe_bctx **out, char *err, size_t errlen);
    /* gpe_llama_forward's contract (model.h): n <= n_batch tokens, logits
     * of the entries with want[i] as consecutive rows at logits. */
    gpe_status (*forward)(gpe_bctx *c, const int32_t *tok, const int *pos, const int *seq,
                          const bool *want, int n, float *logits, char *err, size_t errlen);
    /* Forget sequence seq's rows (optional work: zeroing). */
    void (*seq_clear)(gpe_bctx *c, int seq);
    /* Devices and bytes held (GPU backends; CPU: 0). */
    int (*devices)(const gpe_bctx *c, gpe_vram_need *out);
    void (*ctx_free)(gpe_bctx *c);
    /* Backend self-test (kernels vs the CPU reference); NULL = none. */
    gpe_status (*selftest)(char *err, size_t errlen);
    /* gpe_llama_hidden's contract (model.h): n <= n_batch tokens, the
     * output-normed hidden state of every token as n rows of n_embd floats
     * at hidden (embeddings). NULL = the backend has no embeddings. */
    gpe_status (*hidden)(gpe_bctx *c, const int32_t *tok, const int *pos, const int *seq,
                         int n, float *hidden, char *err, size_t errlen);
} gpe_backend_ops;

/* The plugin's entry: returns its table when abi matches, else NULL. */
typedef const gpe_backend_ops *(*gpe_backend_entry_fn)(uint32_t abi);

/* The CPU backend (always present). */
const gpe_backend_ops *gpe_backend_cpu(void);

/* The CUDA backend: loads the plugin on first call (thread-safe, once).
 * NULL when it cannot be loaded, with the reason in why. A table returned
 * may still have 0 devices (its device_count says why). */
const gpe_backend_ops *gpe_backend_cuda(char *why, size_t whylen);
/* The file it was loaded from (NULL when not loaded). */
const char *gpe_backend_cuda_path(void);

#ifdef __cplusplus
}
#endif
#endif
