/*
 * rope: RoPE "normal" (adjacent pairs of the first n_rot dims of each head)
 * or NEOX (pairs x[i], x[i + n_rot/2]) on q in place and on k, which is
 * written rotated into the KV cache together with v. Angles as model.c: theta_i = pos * base^(-2i/n_rot) by
 * repeated float multiplication, divided by rope_freqs[i] when present,
 * times freq_scale. With an F16 cache the k and v rows are stored rounded
 * to F16 (nearest even, as the CPU's gpe_kv_put).
 *
 * Internal to src/engine/cuda/.
 */
#ifndef GPE_CUDA_ROPE_CUH
#define GPE_CUDA_ROPE_CUH

#include "engine/cuda/common.cuh"

#define GPE_CUDA_MAX_ROT 256   /* n_rot limit (shared cos/sin table) */

typedef struct gpe_cuda_rope_args {
    float *q;                  /* [n_tok][n_head*hd], rotated in place */
    const float *k, *v;        /* [n_tok][n_head_kv*hd] */
    const int *pos, *seq;      /* device [n_tok] */
    void *k_cache, *v_cache;   /* this layer's [n_seq][n_ctx][kv_dim], float or __half */
    bool f16;                  /* caches hold __half (rounded to nearest even) */
    int n_tok, n_head, n_head_kv, head_dim, n_rot, n_ctx;
    float theta_scale;         /* base^(-2/n_rot), computed on the host as model.c */
    float freq_scale;
    const float *freqs;        /* device [n_rot/2] or NULL */
    bool neox;                 /* NEOX pairs (qwen, phi3, gemma) */
} gpe_cuda_rope_args;

void gpe_cuda_rope_store(const gpe_cuda_rope_args *a, cudaStream_t stream);

#endif
