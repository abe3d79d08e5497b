/*
 * optest: single-kernel entry points on host buffers, for the self-test
 * (selftest.c) only. Each allocates device memory, copies the inputs, runs
 * one kernel (the same launch code as the forward pass), copies the result
 * back and frees everything. GPE_ERR_BACKEND on a CUDA failure.
 *
 * Internal to src/engine/cuda/.
 */
#ifndef GPE_CUDA_OPTEST_H
#define GPE_CUDA_OPTEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpupool/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "engine/quant.h"

/* out[n_rows][n_cols] = dequantized w (rows of gpe_row_size(t, n_cols)). */
gpe_status gpe_cuda_test_dequant(gpe_type t, const void *w, int64_t n_rows, int64_t n_cols,
                                 float *out, char *err, size_t errlen);

/* y[n_tok][n_rows] = x[n_tok][n_cols] W^T; mat-vec when n_tok <= 8 and not
 * force_gemm, else the GEMM path. */
gpe_status gpe_cuda_test_matmul(gpe_type t, const void *w, int64_t n_rows, int64_t n_cols,
                                const float *x, int n_tok, bool force_gemm, float *y,
                                char *err, size_t errlen);

/* true when the small-batch GEMM path (9..64 tokens, not forced to GEMM)
 * of weights of type t is the int8 one (mmq_i8.cuh), which rounds the
 * activations as the dp4a mat-vec does: a type it takes, a device of
 * compute capability >= 8.0, not GPUPOOL_CUDA_MMQ_I8=0. */
bool gpe_cuda_test_mmq_i8(gpe_type t);

/* true when the mat-vec path (n_tok <= 8, not forced to GEMM) of weights
 * of type t rounds the activations to int8 blocks of 32 (mmvq.cuh): the
 * dp4a kernels, unless GPUPOOL_CUDA_MMV=legacy. */
bool gpe_cuda_test_matvec_q8(gpe_type t);

/* The fused decode steps (fused.cuh) on weights w [n_rows][n_cols] of type
 * t and n_tok activation rows, through the fused kernels (fuse) or the
 * separate sequence (!fuse); *fused tells whether the fused kernels ran.
 * y [n_tok][n_rows]:
 *   GPE_CUDA_TEST_FUSE_NORM:   y = (rmsnorm(x) * aux) W^T, aux [n_cols], W
 *                              three weights of n_rows / 3 rows each in one
 *                              group (their outputs side by side in y, as
 *                              Q/K/V's); n_rows % 3 == 0;
 *   GPE_CUDA_TEST_FUSE_ADD:    y = res + x W^T, res [n_tok][n_rows];
 *   GPE_CUDA_TEST_FUSE_SWIGLU: y = res + swiglu(x, aux) W^T, aux (up)
 *                              [n_tok][n_cols]. */
enum { GPE_CUDA_TEST_FUSE_NORM, GPE_CUDA_TEST_FUSE_ADD, GPE_CUDA_TEST_FUSE_SWIGLU };
gpe_status gpe_cuda_test_fused(int op, gpe_type t, const void *w, int64_t n_rows,
                               int64_t n_cols, const float *x, const float *aux,
                               const float *res, int n_tok, bool fuse, float *y, bool *fused,
                               char *err, size_t errlen);

/* out[t] = rmsnorm(x[t]) * w, t < n_rows. */
gpe_status gpe_cuda_test_rmsnorm(const float *x, const float *w, int n_rows, int n, float eps,
                                 float *out, char *err, size_t errlen);

/* RoPE + store for one sequence: q [n_tok][n_head*hd] rotated in place,
 * k_cache/v_cache [n_ctx][n_head_kv*hd] receive the rows at pos[t]
 * (other rows: zero). freqs: [n_rot/2] or NULL. */
gpe_status gpe_cuda_test_rope(float *q, const float *k, const float *v, const int *pos,
                              int n_tok, int n_head, int n_head_kv, int hd, int n_rot,
                              float base, float freq_scale, const float *freqs, int n_ctx,
                              float *k_cache, float *v_cache, char *err, size_t errlen);

/* out[n_tok][n_head*hd] = attention of q over caches [n_seq][n_ctx][kvd]
 * (F32), scale 1/sqrt(hd); softcap 0 and window 0: none. n_tok <= 8 or
 * decode_rows takes the decode kernel (with key splits when n_ctx > 256),
 * else the prefill kernel, as in a forward. */
gpe_status gpe_cuda_test_attention(const float *q, const float *k_cache, const float *v_cache,
                                   const int *pos, const int *seq, int n_tok, int n_seq,
                                   int n_ctx, int n_head, int n_head_kv, int hd,
                                   float softcap, int window, bool decode_rows, float *out,
                                   char *err, size_t errlen);


/* ---- host side of the self-test (selftest.c; no GPU needed) ---- */

#include "engine/model.h"

/* A small random llama model held in host memory: every 2-D weight of one
 * type, norms F32. Dimensions: n_embd 256, 4 heads of 64 (2 KV heads:
 * grouped-query), n_ff 512, 2 layers, vocabulary 300. */
typedef struct gpe_st_model {
    gpe_llama m;
    gpe_layer layers[2];
    void *bufs[40];      /* owned host buffers */
    int n_bufs;
} gpe_st_model;

/* Fills sm with random weights of type t (any supported type), from seed.
 * Returns false when memory is short (sm then holds nothing). */
bool gpe_st_model_build(gpe_st_model *sm, gpe_type t, uint64_t seed);
/* Turns a built model into one of the other families' feature sets, so
 * that the whole-model check covers their kernels: 1 qwen2 (Q/K/V biases,
 * NEOX RoPE), 2 qwen3 (per-head Q/K norms, NEOX), 3 gemma2 (embedding
 * scale, post-norms, GELU, attention and final soft-caps, a 3-position
 * window on even layers, NEOX), 4 gemma3 (gemma2 without soft-caps, with
 * Q/K norms and local/global RoPE bases, the global layer scaled).
 * Returns false when memory is short. */
#define GPE_ST_N_VARIANTS 5
bool gpe_st_model_variant(gpe_st_model *sm, int variant, uint64_t seed);
const char *gpe_st_variant_name(int variant);
/* The same model with every weight dequantized to F32 (same values). */
bool gpe_st_model_to_f32(gpe_st_model *dst, const gpe_st_model *src);
void gpe_st_model_free(gpe_st_model *sm);

/* The self-test's batch script (prefill of two sequences, batched decode
 * steps, a mixed batch) run on the CPU forward. *logits receives the
 * logits of every step (malloc'd, caller frees), step_rows[s] the rows of
 * step s (GPE_ST_STEPS entries). */
#define GPE_ST_STEPS 6
gpe_status gpe_st_run_cpu(const gpe_llama *m, float **logits, int step_rows[GPE_ST_STEPS],
                          char *err, size_t errlen);
/* Same on the CUDA backend (device 0). */
gpe_status gpe_st_run_cuda(const gpe_llama *m, float **logits, int step_rows[GPE_ST_STEPS],
                           char *err, size_t errlen);
/* The same two with an F16 KV cache when kv_f16, and on the CUDA backend
 * with the layers split over device 0 n_split times (1 = one device). */
gpe_status gpe_st_run_cpu_kv(const gpe_llama *m, bool kv_f16, float **logits,
                             int step_rows[GPE_ST_STEPS], char *err, size_t errlen);
gpe_status gpe_st_run_cuda_ex(const gpe_llama *m, int n_split, bool kv_f16, float **logits,
                              int step_rows[GPE_ST_STEPS], char *err, size_t errlen);
/* Allowance of the F16 KV whole-model check (GPU F16 KV vs CPU F16 KV), on
 * top of the type's threshold: the CPU's whole F16-vs-F32 KV effect on the
 * Q4_K random model is 7.4e-4 (test_cuda), the two F16 paths differ in part
 * of it (the CPU also rounds the softmax weights). */
#define GPE_ST_KV_F16_THRESHOLD 2e-3

/* Largest per-step NMSE of a against the reference ref. */
double gpe_st_max_nmse(const float *a, const float *ref, const int step_rows[GPE_ST_STEPS],
                       int n_vocab);
/* Normalized mean squared error sum((a-r)^2) / sum(r^2) (0 when both are 0). */
double gpe_st_nmse(const float *a, const float *ref, size_t n);
/* Whole-model NMSE threshold of the self-test for weight type t. */
double gpe_st_model_threshold(gpe_type t);

#ifdef __cplusplus
}
#endif
#endif
