/*
 * attention: causal grouped-query attention over the device KV cache, for
 * the tokens of a batch (several sequences).
 *
 *   out[t][h] = softmax_i(cap(q[t][h] . K[s][i][h/group] * scale)) V[s][i][h/group]
 *   i in [i0, pos[t]],  s = seq[t],  cap(x) = softcap * tanh(x / softcap)
 *   (identity when softcap is 0), i0 = max(0, pos[t] - window + 1) with a
 *   sliding window, else 0
 *
 * The batch's own K/V rows are already in the cache (rope.cuh runs first),
 * as in model.c.
 *
 * Internal to src/engine/cuda/.
 */
#ifndef GPE_CUDA_ATTENTION_CUH
#define GPE_CUDA_ATTENTION_CUH

#include "engine/cuda/common.cuh"

#define GPE_CUDA_MAX_HEAD_DIM 256

/* Split decode (attention.cu): partial results of up to this many
 * (key split x token) pairs are kept in the caller's scratch. */
#define GPE_CUDA_ATTN_PART_CAP 256

typedef struct gpe_cuda_attn_args {
    const float *q;                   /* [n_tok][n_head*hd] */
    const void *k_cache, *v_cache;    /* this layer's [n_seq][n_ctx][kv_dim], float or __half */
    bool f16;                         /* __half caches; q is rounded to F16 for q.k, as the
                                         CPU's F16 path and llama.cpp's do */
    const int *pos, *seq;             /* device [n_tok] */
    float *out;                       /* [n_tok][n_head*hd] */
    int n_tok, n_head, n_head_kv, head_dim, n_ctx;
    float scale;                      /* query scale (1/sqrt(head_dim) usually) */
    float softcap;                    /* 0 = none (gemma2: attn_logit_softcapping) */
    int window;                       /* 0 = none, else keys pos-window+1 .. pos */
    float *part;                      /* scratch of gpe_cuda_attn_part_floats() floats for
                                         the key splits of a decode batch; NULL: no split */
    bool decode_rows;                 /* n_tok > 8: the tokens are mostly single rows of
                                         different sequences (a batched decode step), so
                                         the decode kernel suits them; else the prefill one */
} gpe_cuda_attn_args;

/* Floats of the split-decode scratch for a model's head shape. */
size_t gpe_cuda_attn_part_floats(int n_head, int head_dim);

/* Launches the attention on stream; the kernel chosen depends only on the
 * shapes (n_tok, heads, head_dim, n_ctx) and, past 8 tokens, decode_rows,
 * never on the positions, so a decode step stays valid in a CUDA graph.
 * GPUPOOL_CUDA_ATTN=legacy (read once per process) selects the first
 * kernel (one block per token and head) for every shape;
 * GPUPOOL_CUDA_ATTN=short the decode path with its short-context work
 * (empty key splits leave at once, a lone split writes the output, loads
 * several at a time): faster below ~256 positions, slower at 8k (more
 * registers), so not the default. */
void gpe_cuda_attention(const gpe_cuda_attn_args *a, cudaStream_t stream);

#endif
